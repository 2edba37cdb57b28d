#!/bin/bash
# pserver_worker from the outside: --help lists its flags (absl's own --help
# printed "No flags matched" for main.cc), and every bad flag, enum values
# first, exits 2 at once with one line naming the flag (and, for an enum, the
# accepted values) before any connection is tried.
#
#   worker_cli_test.sh /path/to/pserver_worker
set -u

BIN=${1:?usage: worker_cli_test.sh /path/to/pserver_worker}
# shellcheck source=../test_util/cli_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../test_util/cli_checks.sh"

check_help "$BIN" servers worker_id num_workers model hidden epochs steps \
  batch_size push_codec warmup_codec block_size onebit_scale k_fraction \
  topk_selection value_format bits rounding quantize_range schedule metrics_listen \
  progress state_file tls_ca tls_cert tls_key auth_token_file

# Nothing listens on port 1: a flag error must come before any connection
# (the worker would otherwise retry for --retry_budget).
bad() { check_invalid_exit 2 "$BIN" "$@" --servers=127.0.0.1:1 --retry_budget=30; }
codecs='expected fp32, fp16, bf16, onebit, topk, randomk, quantize, topk_quantize or block_topk$'
bad --push_codec "$codecs" --push_codec=zip
bad --warmup_codec "$codecs" --warmup_codec=gzip
bad --onebit_scale "'max'; expected mean_abs or l2$" --onebit_scale=max
bad --topk_selection "expected sampled or exact$" --topk_selection=best
bad --value_format "expected fp32 or fp16$" --value_format=int8
bad --rounding "expected nearest or stochastic$" --rounding=up
bad --quantize_range "expected linear or adaptive$" --quantize_range=log
# --block_size's default (256, onebit's) is out of block_topk's range.
bad --block_size "; expected 4..64 with block_topk" --push_codec=block_topk
bad --block_size "is 65; expected 4..64 with block_topk" --push_codec=onebit \
  --warmup_codec=block_topk --block_size=65
bad --model "'cnn'; expected mlp or synthetic$" --model=cnn
printf '{"phases": [{"begin_step": 4}]}' >"$WORK/late.json"
bad --schedule "cannot read the schedule file" --schedule="$WORK/none.json"
bad --compute_delay_ms "is -1; expected 0..60000$" --compute_delay_ms=-1
bad --schedule "expected the first phase to begin at step 0" \
  --schedule="$WORK/late.json"
bad --init "'xavier'; expected pytorch or he_normal$" --init=xavier
bad --progress "expected auto, bar or lines$" --progress=fancy
# Other checks of the same shape.
bad --worker_id "expected 0..num_workers-1" --worker_id=4 --num_workers=4
bad --hidden "expected positive integers" --hidden=256,x
bad --blas_threads "expected >= 1" --blas_threads=0
bad --tls_key "expected the certificate's private key" --tls_cert=/nonexistent.pem
bad --metrics_listen "cannot listen" --metrics_listen=bogus
bad "'extra'" "unexpected argument" extra
# Gradient capture (issue 13).
check_help "$BIN" capture_gradients capture_steps
bad --capture_steps "has '5-2', a range that ends before it starts" \
  --capture_gradients=/tmp/unused.grad --capture_steps=5-2
bad --capture_steps "has 'x'; expected increasing steps" \
  --capture_gradients=/tmp/unused.grad --capture_steps=0-3,x
bad --capture_steps "expected both or neither" --capture_steps=0-3
bad --capture_gradients "expected both or neither" \
  --capture_gradients=/tmp/unused.grad
check_help "$BIN" capture_deltas
bad --capture_deltas "expected both or neither" --capture_deltas=/tmp/unused.grad
bad --capture_deltas "expected --local_steps=1" \
  --capture_deltas=/tmp/unused.grad --capture_steps=0-3 --local_steps=2
# absl's own errors: one line, exit 1.
check_invalid_exit 1 "$BIN" no_such_flag "Unknown command line flag" --no_such_flag=1
check_invalid_exit 1 "$BIN" num_workers "Illegal value" --num_workers=abc
# Spelled in another case, an enum value is still accepted: the run gets past
# the flags and fails on the connection instead.
check_invalid_exit 2 "$BIN" "shard 0" "to shard 0 \\(127.0.0.1:1\\)" \
  --servers=127.0.0.1:1 --retry_budget=1 --rpc_timeout=1 --model=SYNTHETIC \
  --synthetic_params=64 --steps=1 --push_codec=FP32 --progress=LINES

cli_finish worker_cli_test
