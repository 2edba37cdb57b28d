# Sourced by tests/e2e/compose_test.sh for PSERVER_TEST_LAYOUT=machines, with
# its COMPOSE, DOCKER, SRC, DIR, log, fail and cid: builds the machine image,
# starts machine0 and two replicas of `machine`, stops one replica once both
# joined, and checks the leave and the end of training.
machines_checks() {
  (cd "$SRC/deploy" && "${COMPOSE[@]}" build machine0) >"$DIR/build.log" 2>&1 ||
    fail "image build failed: $(tail -5 "$DIR/build.log")"
  log "machine image built"
  (cd "$SRC/deploy" && "${COMPOSE[@]}" up -d --no-build --scale machine=2 machine0 machine) \
    >"$DIR/up.log" 2>&1 || fail "compose up failed: $(tail -5 "$DIR/up.log")"
  local m0 replicas shard_log joins=0 exited code
  m0=$(cid machine0)
  mapfile -t replicas < <("${COMPOSE[@]}" ps -q machine)
  [[ ${#replicas[@]} == 2 ]] || fail "expected 2 replicas of machine, found ${#replicas[@]}"
  log "machine0 and 2 replicas of machine up"
  shard_log() { $DOCKER exec "$m0" cat /var/lib/pserver/run/shard0.log 2>/dev/null || true; }
  for _ in $(seq 300); do
    joins=$(shard_log | grep -c "joins at step" || true)
    [[ $joins -ge 2 ]] && break
    [[ $($DOCKER inspect -f '{{.State.Status}}' "$m0") == running ]] ||
      fail "machine0 ended before both replicas joined: $($DOCKER logs --tail=5 "$m0" 2>&1)"
    sleep 1
  done
  [[ $joins -ge 2 ]] || fail "the replicas did not join within 300 s: $($DOCKER logs --tail=5 "${replicas[0]}" 2>&1)"
  log "both replicas joined: $(shard_log | grep 'joins at step' | tr '\n' ';')"
  $DOCKER stop -t 150 "${replicas[1]}" >/dev/null
  code=$($DOCKER inspect -f '{{.State.ExitCode}}' "${replicas[1]}")
  $DOCKER logs "${replicas[1]}" >"$DIR/leaver.log" 2>&1
  [[ $code == 0 ]] || fail "the stopped replica exited $code: $(tail -5 "$DIR/leaver.log")"
  grep -q "leave the job at their next round" "$DIR/leaver.log" ||
    fail "the stopped replica's launcher did not leave: $(tail -5 "$DIR/leaver.log")"
  grep -q "left the job at step" "$DIR/leaver.log" ||
    fail "the stopped replica's worker did not leave: $(tail -5 "$DIR/leaver.log")"
  log "one replica stopped: it left and exited 0"
  for c in "$m0" "${replicas[0]}"; do
    for _ in $(seq 600); do
      [[ $($DOCKER inspect -f '{{.State.Status}}' "$c") == exited ]] && break
      sleep 1
    done
    exited=$($DOCKER inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$c")
    [[ $exited == "exited 0" ]] || fail "container $c: $exited, expected exited 0: $($DOCKER logs --tail=5 "$c" 2>&1)"
  done
  $DOCKER logs "$m0" >"$DIR/machine0.log" 2>&1
  $DOCKER cp "$m0:/var/lib/pserver/run/shard0.log" "$DIR/shard0.log"
  local acc
  acc=$(sed -n 's/.*worker 0 done: .*test accuracy \([0-9.]*\).*/\1/p' "$DIR/machine0.log" | tail -1)
  [[ -n "$acc" ]] || fail "rank 0 printed no final line: $(tail -3 "$DIR/machine0.log")"
  awk -v a="$acc" 'BEGIN{exit !(a > 0.6)}' || fail "rank 0: test accuracy $acc is not well above chance"
  [[ $(grep -c "left at step" "$DIR/shard0.log") == 1 ]] ||
    fail "the shard logged $(grep -c 'left at step' "$DIR/shard0.log") leaves, expected 1"
  ! grep -q "dropped" "$DIR/shard0.log" || fail "the shard dropped a worker: $(grep dropped "$DIR/shard0.log")"
  echo "PASS: Compose machines (launcher in each container): 2 replicas claimed ranks and joined a" \
    "running job, one left on SIGTERM (exit 0), the others trained to step $PSERVER_TEST_STEPS" \
    "(rank 0 test accuracy $acc)"
}
