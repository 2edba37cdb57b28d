"""The chaos benchmark's Python side (tests/bench/chaos.sh). Standard library
only; run with /usr/bin/python3.

  schedule  the seeded fault schedule, as chaos.sh runs it (TSV on stdout)
  sample    polls every daemon's /metrics (run in the Prometheus namespace)
  rate      the job's steps/s in a calibration run's samples
  collect   reads what the report needs from Prometheus's HTTP API
  report    checks and figures: PREFIX.md, PREFIX.json, PREFIX.svg

How the figures are computed (report):
  round        the job's round at time t: the smaller of the two shards'
               pserver_server_step, each the last value sampled (every
               0.25 s, by `sample`); the high-water mark is the largest
               round seen so far. A shard restored from an older checkpoint
               lowers the round, not the mark.
  recovery     from the moment a fault is lifted (a kill: the kill itself,
               since the restart is the system's job; a SIGSTOP: the
               SIGCONT; a link: up again; a full disk: freed) until the
               round first passes the mark it had then: training
               progressing again.
  stall        the longest time without a new high-water round from the
               fault's start to its recovery (a SIGSTOPped worker stalls the
               rounds until its lease expires, however long it stays stopped).
  rounds lost  per shard restart: the shard's step just before the kill
               minus the step it restored (its log's "restored step N"; 0 when
               it started fresh). Those rounds' updates (each the mean of the
               workers' pushes in it) are lost on that shard: the workers'
               resume_step makes it skip to their step, it does not redo them.
  worker rounds missed
               from the start of a worker fault to its recovery, on a shard
               that did not restart in that time: 4 x rounds completed minus
               pushes applied (pserver_server_applied_pushes_total): the
               pushes that rounds went on without.
  alerts       for each fault, which rules should fire follows from what the
               sampler saw (see EXPECT): a condition that held at least the
               rule's `for:` plus SLACK seconds must fire (ALERTS in
               Prometheus, firing, between the fault's start and the
               condition's end plus SLACK); one that held less than its
               `for:` minus SLACK must not because of this fault (any firing
               is reported, not failed: faults overlap). A fired alert must
               clear (stop firing) before training ends, given the time its
               expression's longest range window needs.
Faults overlap (never two on one daemon at once); a figure belongs to the
fault it is listed under but may include the effect of another that
overlapped it (the timeline shows which).
"""

import argparse
import hashlib
import json
import math
import os
import random
import re
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request

CLASSES = [
    "shard_kill", "worker_kill", "shard_worker_kill", "worker_stop", "shard_stop",
    "link_down", "throttle", "disk_full", "ckpt_truncate",
]
SHARDS = ["s0", "s1"]
WORKERS = ["w0", "w1", "w2", "w3"]
NUM_WORKERS = 4
SLACK = 4.0  # seconds: scrape (1 s) + evaluation (1 s) + sampling and timing

# ---------------------------------------------------------------- schedule


def plan(seed, duration, lease, short):
    """The faults: (start, seconds, class, targets, detail), sorted by start.

    A worker_stop lasts the lease plus 5-20 s ("short") or plus 70-90 s
    ("long", always in the short mode: the alerts' 1-minute `for:`). A
    shard_stop lasts 2-8 s, but the first of a full run 70-90 s ("long":
    PserverShardDown's 1-minute `for:`).
    Each class `per_class` times, then random extra faults; each placed at a
    random start with random targets, retried until it does not overlap
    another fault on the same daemon (or the same shard's disk) with a
    10 s gap after it (a restart, a re-registration). A fault that finds no
    place is left out."""
    rng = random.Random(seed)
    per_class = 1 if short else max(2, int(duration // 150))
    extra = 0 if short else int(duration // 60)
    classes = [c for c in CLASSES for _ in range(per_class)]
    classes += [rng.choice(CLASSES) for _ in range(extra)]
    rng.shuffle(classes)
    busy = {}  # target key -> [(start, end)]
    drawn = {"long_shard_stop": False}

    def draw(cls):
        if cls in ("shard_kill", "ckpt_truncate"):
            return 0.0, [rng.choice(SHARDS)], "-"
        if cls == "worker_kill":
            return 0.0, [rng.choice(WORKERS)], "-"
        if cls == "shard_worker_kill":
            return 0.0, [rng.choice(SHARDS), rng.choice(WORKERS)], "-"
        if cls == "worker_stop":
            # Past the lease; a long one also outlasts the `for:` (1 min)
            # of PserverWorkerDown and PserverWorkerDropped.
            if short or rng.random() < 0.5:
                return round(lease + rng.uniform(70, 90), 1), [rng.choice(WORKERS)], "long"
            return round(lease + rng.uniform(5, 20), 1), [rng.choice(WORKERS)], "short"
        if cls == "shard_stop":
            # The first of a full run outlasts PserverShardDown's 1-minute
            # `for:` (the workers wait for it: --retry_budget is 300 s).
            if not short and not drawn["long_shard_stop"]:
                return round(rng.uniform(70, 90), 1), [rng.choice(SHARDS)], "long"
            return round(rng.uniform(2, 8), 1), [rng.choice(SHARDS)], "-"
        if cls == "link_down":
            return (round(rng.uniform(2, 30), 1), [rng.choice(SHARDS + WORKERS)],
                    rng.choice(["host", "hub"]))
        if cls == "throttle":
            return 30.0, [rng.choice(SHARDS + WORKERS)], "-"
        if cls == "disk_full":
            return round(rng.uniform(20, 60), 1), [rng.choice(SHARDS) + "-disk"], "-"
        raise ValueError(cls)

    faults = []
    for cls in classes:
        for _ in range(200):
            dur, targets, detail = draw(cls)
            # Instant faults keep their daemon busy while it restarts.
            hold = max(dur, 10.0) + 10.0
            latest = duration - max(dur, 5.0)
            if latest <= 5:
                continue
            start = round(rng.uniform(5, latest), 1)
            keys = [t for t in targets]
            if all(not (start < e and s < start + hold) for k in keys for s, e in busy.get(k, [])):
                for k in keys:
                    busy.setdefault(k, []).append((start, start + hold))
                faults.append((start, dur, cls, targets, detail))
                if cls == "shard_stop" and detail == "long":
                    drawn["long_shard_stop"] = True
                break
    faults.sort()
    return faults


def cmd_schedule(a):
    faults = plan(a.seed, a.duration, a.lease, a.short)
    print(f"# chaos schedule: seed {a.seed}, {a.duration} s window, lease {a.lease} s, "
          f"{len(faults)} faults")
    print("# id start_s seconds class targets detail")
    for i, (start, dur, cls, targets, detail) in enumerate(faults):
        print(f"{i} {start} {dur} {cls} {','.join(targets)} {detail}")


# ------------------------------------------------------------------ sample

METRICS = {
    "pserver_server_step": "step",
    "pserver_server_workers_live": "live",
    "pserver_server_workers_registered": "registered",
    "pserver_server_applied_pushes_total": "applied",
    "pserver_server_checkpoint_failures_total": "ckfail",
    "pserver_worker_step": "step",
    # The speed alerts' inputs (see speed_alert_checks).
    "pserver_worker_communication_seconds_total": "comm",
    "pserver_worker_compute_seconds_total": "compute",
    "pserver_server_straggler_last_share": "slast",
    "pserver_server_straggler_wait_share": "swait",
}


def scrape(url, timeout):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except Exception:
        return None
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = METRICS.get(name)
        if key is not None:
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def cmd_sample(a):
    targets = [("s%d" % i, t) for i, t in enumerate(a.shards.split(","))]
    targets += [("w%d" % i, t) for i, t in enumerate(a.workers.split(",")) if t]
    lock = threading.Lock()
    out = open(a.out, "a", buffering=1)

    def poll(name, addr):
        url = f"http://{addr}/metrics"
        while not os.path.exists(a.stop):
            t0 = time.time()
            m = scrape(url, 0.5)
            if m is None:
                line = f"{t0:.3f}\t{name}\tdown\n"
            else:
                line = f"{t0:.3f}\t{name}\tup\t" + "\t".join(
                    f"{k}={v:.10g}" for k, v in sorted(m.items())) + "\n"
            with lock:
                out.write(line)
            time.sleep(max(0.0, a.interval - (time.time() - t0)))

    threads = [threading.Thread(target=poll, args=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_samples(path):
    """{target: [(t, None | {key: value})]} in time order."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            t, name = float(parts[0]), parts[1]
            vals = None
            if parts[2] == "up":
                vals = {}
                for kv in parts[3:]:
                    k, v = kv.split("=")
                    vals[k] = float(v)
            out.setdefault(name, []).append((t, vals))
    for v in out.values():
        v.sort(key=lambda x: x[0])
    return out


def round_series(samples):
    """[(t, round)]: min over shards of each shard's last sampled step."""
    events = []
    for s in SHARDS:
        for t, v in samples.get(s, []):
            if v is not None and "step" in v:
                events.append((t, s, v["step"]))
    events.sort()
    last, out = {}, []
    for t, s, step in events:
        last[s] = step
        if len(last) == len(SHARDS):
            out.append((t, min(last.values())))
    return out


def cmd_rate(a):
    r = round_series(read_samples(a.samples))
    if len(r) < 4:
        print("0")
        return
    t_end = r[-1][0]
    t_from = r[0][0] + (t_end - r[0][0]) / 3
    first = next(x for x in r if x[0] >= t_from)
    rate = (r[-1][1] - first[1]) / max(1e-9, t_end - first[0])
    print(f"{rate:.2f}")


# ----------------------------------------------------------------- collect


def prom_get(base, path, params):
    url = base + path + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def machine():
    """This machine's CPU model and core count (the timings depend on them;
    the report is made where the benchmark ran)."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def read_time(run, name):
    with open(os.path.join(run, name)) as f:
        return float(f.read().split()[0])


def cmd_collect(a):
    start = read_time(a.run, "started") - 5
    end = read_time(a.run, "finished") + 2
    out = {"start": start, "end": end, "range": {}}
    # Prometheus answers at most 11,000 points per series: 1 s steps up to ~3 h.
    step = max(1, math.ceil((end - start) / 10000))
    for name, expr in [("alerts", "ALERTS"), ("up", "up"), ("step", "pserver_server_step")]:
        out["range"][name] = prom_get(a.prom, "/api/v1/query_range",
                                      {"query": expr, "start": start, "end": end,
                                       "step": step})["result"]
    out["step_seconds"] = step
    out["rules"] = prom_get(a.prom, "/api/v1/rules", {})["groups"]
    with open(os.path.join(a.run, "prom.json"), "w") as f:
        json.dump(out, f)
    n = sum(len(g["rules"]) for g in out["rules"])
    print(f"collect: {n} rules, {len(out['range']['alerts'])} alert series")


# ------------------------------------------------------------------ report


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l.rstrip("\n") for l in f if l.strip()]


def parse_faults(run):
    """{id: {...}} from schedule.tsv and faults.log."""
    faults = {}
    for line in read_lines(os.path.join(run, "schedule.tsv")):
        if line.startswith("#"):
            continue
        i, start, dur, cls, targets, detail = line.split()
        faults[int(i)] = {"id": int(i), "class": cls, "targets": targets.split(","),
                          "planned_start": float(start), "planned_seconds": float(dur),
                          "detail": detail, "state": "planned"}
    for line in read_lines(os.path.join(run, "faults.log")):
        parts = line.split()
        t, i, phase = float(parts[0]), int(parts[1]), parts[2]
        f = faults[i]
        kv = dict(p.split("=", 1) for p in parts[5:] if "=" in p)
        if phase == "start":
            f["start"], f["state"] = t, "injected"
            f.update(kv)
        elif phase == "end":
            f["end"] = t
            f.update(kv)
        elif phase == "skip":
            f["state"] = "skipped: " + " ".join(parts[5:])
    return faults


def parse_events(run):
    """[(t, daemon, what, run_index, value)] from the supervisors' log."""
    out = []
    for line in read_lines(os.path.join(run, "events.log")):
        t, name, what, idx, val = line.split()
        out.append((float(t), name, what, int(idx), int(val)))
    return out


def shard_log_facts(run, name, idx):
    path = os.path.join(run, "logs", f"{name}.{idx}.log")
    facts = {"restored": None, "refused": [], "fresh": False, "skips": []}
    for line in read_lines(path):
        m = re.search(r"restored step (\d+)", line)
        if m:
            facts["restored"] = int(m.group(1))
        if "refused checkpoint" in line:
            facts["refused"].append(line.split("refused checkpoint ", 1)[1][:200])
        if "no usable checkpoint" in line:
            facts["fresh"] = True
        m = re.search(r"skips from step (\d+) to (\d+)", line)
        if m:
            facts["skips"].append((int(m.group(1)), int(m.group(2))))
    return facts


def hwm_progress(rounds, t):
    """(mark at t, first time after t the round passes it, or None)."""
    mark = -1
    i = 0
    while i < len(rounds) and rounds[i][0] <= t:
        mark = max(mark, rounds[i][1])
        i += 1
    for tt, r in rounds[i:]:
        if r > mark:
            return mark, tt
    return mark, None


def longest_stall(rounds, t0, t1):
    mark, last_new, longest = -1, t0, 0.0
    for t, r in rounds:
        if t <= t0:
            mark = max(mark, r)
            continue
        if t > t1:
            break
        if r > mark:
            longest = max(longest, t - last_new)
            mark, last_new = r, t
    return max(longest, min(t1, rounds[-1][0] if rounds else t1) - last_new)


def rule_table(prom):
    """{alert name: {"for": s, "window": longest range in its expr, "expr": ...}}"""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    rules = {}
    for g in prom.get("rules", []):
        for r in g["rules"]:
            if r.get("type") != "alerting":
                continue
            windows = [float(n) * units[u] for n, u in
                       re.findall(r"\[(\d+)(ms|s|m|h|d)\]", r["query"])]
            offsets = [float(n) * units[u] for n, u in
                       re.findall(r"offset (\d+)(ms|s|m|h|d)", r["query"])]
            rules[r["name"]] = {"for": float(r.get("duration", 0)),
                                "window": max(windows + [0]) + max(offsets + [0]),
                                "expr": r["query"]}
    return rules


def alert_intervals(prom):
    """{alert name: [(from, to, labels)]} of firing ALERTS."""
    out = {}
    step = prom.get("step_seconds", 1)
    for series in prom["range"]["alerts"]:
        m = series["metric"]
        if m.get("alertstate") != "firing":
            continue
        ts = [float(t) for t, _ in series["values"]]
        begin = prev = None
        for t in ts:
            if begin is None:
                begin = prev = t
            elif t - prev > step * 1.5:
                out.setdefault(m["alertname"], []).append((begin, prev, m))
                begin = prev = t
            else:
                prev = t
        if begin is not None:
            out.setdefault(m["alertname"], []).append((begin, prev, m))
    return out


# The conditions of the availability rules (deploy/prometheus/alerts.yml),
# as the sampler saw them: per alert, a function of the samples returning
# [(label, [(t, state)])], one series per shard or worker, state True while
# the rule's expression holds, False while it does not, None where a scrape
# failed and Prometheus would have no sample (which resets a rule's `for:`).
# The training-quality rules are not modelled: any firing of them is listed.


def series_of(samples, target):
    return samples.get(target, [])


def any_live(samples):
    """[(t, bool)]: some shard's last sample shows a live lease. A shard
    whose last scrape failed counts for none, as in Prometheus, where a
    failed scrape marks the target's series stale at once: max() over
    pserver_server_workers_live is then the other shards' (during a shard's
    link-down the other may drop every stalled worker, and an alert's
    `for:` starts again)."""
    events = []
    for s in SHARDS:
        for t, v in samples.get(s, []):
            events.append((t, s, None if v is None else v.get("live", 0)))
    events.sort()
    last, out = {}, []
    for t, s, live in events:
        last[s] = 0 if live is None else live
        out.append((t, any(x > 0 for x in last.values())))
    return out


def at(points, t):
    """The value of the last point at or before t (None before the first)."""
    lo, hi = 0, len(points)
    while lo < hi:
        mid = (lo + hi) // 2
        if points[mid][0] <= t:
            lo = mid + 1
        else:
            hi = mid
    return points[lo - 1][1] if lo else None


def model_shard_down(samples, ctx):
    return [(s, [(t, v is None) for t, v in samples.get(s, [])]) for s in SHARDS]


def model_worker_down(samples, ctx):
    live = ctx["any_live"]
    return [(w, [(t, v is None and bool(at(live, t))) for t, v in samples.get(w, [])])
            for w in WORKERS]


def model_worker_dropped(samples, ctx):
    out = []
    for s in SHARDS:
        out.append((s, [(t, None if v is None else 0 < v.get("live", 0) < v.get("registered", 0))
                        for t, v in samples.get(s, [])]))
    return out


def model_no_progress(samples, ctx):
    out = []
    for s in SHARDS:
        pts = [(t, v) for t, v in samples.get(s, [])]
        series, changed = [], []  # changed: times the step changed
        prev = None
        for t, v in pts:
            if v is None:
                series.append((t, None))
                continue
            if prev is not None and v.get("step") != prev:
                changed.append(t)
            prev = v.get("step")
            first_up = next(tt for tt, vv in pts if vv is not None)
            quiet = (t - first_up >= 60) and not (changed and changed[-1] > t - 60)
            series.append((t, v.get("live", 0) > 0 and quiet))
        out.append((s, series))
    return out


def model_checkpoint_failing(samples, ctx):
    """True from a failure for 2 minutes (increase(...[2m]) > 0). A range
    function keeps its samples while the target is down, so a missed scrape
    does not reset it."""
    out = []
    for s in SHARDS:
        fails, prev = [], None
        for t, v in samples.get(s, []):
            if v is None:
                continue
            c = v.get("ckfail", 0)
            if prev is not None and c > prev:
                fails.append(t)
            prev = c
        series = [(t, any(f <= t < f + 120 for f in fails)) for t, _ in samples.get(s, [])]
        out.append((s, series))
    return out


# alert -> (model, which targets a fault must touch for the condition to be
# its doing: "own" = the fault's targets of that kind, "any" = any series)
# Alerts on speed, not on the model (see cmd_report).
SPEED_ALERTS = {"PserverCommunicationBound", "PserverStraggler"}

MODELS = {
    "PserverShardDown": (model_shard_down, "own"),
    "PserverWorkerDown": (model_worker_down, "own"),
    "PserverWorkerDropped": (model_worker_dropped, "any"),
    "PserverNoProgress": (model_no_progress, "any"),
    "PserverCheckpointFailing": (model_checkpoint_failing, "own"),
}


# The workers' metrics addresses, as chaos.sh gives them (WORKER_IP).
WORKER_IPS = {f"198.18.3.{20 + i}": f"w{i}" for i in range(NUM_WORKERS)}


def communication_share(samples, w, window=300.0):
    """[(t, share)]: worker w's communication seconds over communication
    plus compute seconds in the trailing `window` (PserverCommunicationBound's
    rate(...[5m]) ratio), from the sampled counters; a restart (a counter
    going down) starts the window afresh."""
    pts = [(t, v["comm"], v["compute"]) for t, v in samples.get(w, [])
           if v is not None and "comm" in v and "compute" in v]
    out, j = [], 0
    for i, (t, c, k) in enumerate(pts):
        if i and (c < pts[i - 1][1] or k < pts[i - 1][2]):
            j = i
        while pts[j][0] < t - window:
            j += 1
        t0, c0, k0 = pts[j]
        if t - t0 >= 0.9 * window and (c - c0) + (k - k0) > 0:
            out.append((t, (c - c0) / ((c - c0) + (k - k0))))
    return out


def speed_alert_checks(res, rules):
    """[(alert, from, to, label, held, detail)] for each firing of a speed
    alert: whether the sampled counters show its rule's condition through
    the `for:` before it fired (held: True / False). A storm of faults makes
    the job wait (a stall is waiting), so these alerts may fire truthfully;
    one whose condition the counters do not show is a wrong alert."""
    out = []
    samples = res["samples"]
    shares = {}  # worker -> its communication_share series, computed once
    for name, ivs in sorted(res["fired"].items()):
        if name not in SPEED_ALERTS:
            continue
        need = rules.get(name, {}).get("for", 0)
        for a_, b_, m in ivs:
            lo, hi = a_ - need + SLACK, a_ - SLACK
            if name == "PserverCommunicationBound":
                w = WORKER_IPS.get(m.get("instance", "").rsplit(":", 1)[0])
                if w and w not in shares:
                    shares[w] = communication_share(samples, w)
                pts = [x for t, x in shares.get(w, []) if lo <= t <= hi]
                held = bool(pts) and min(pts) > 0.5 - 0.02
                detail = (f"{w}: communication share {min(pts):.2f}-{max(pts):.2f} over the "
                          f"{need:g} s before it fired (threshold 0.5)" if pts else
                          f"{w or m.get('instance')}: no samples")
            else:
                sh = "s" + str(m.get("shard", ""))
                pts = [(v.get("slast", 0), v.get("swait", 0)) for t, v in samples.get(sh, [])
                       if v is not None and lo <= t <= hi]
                held = bool(pts) and all(x >= 0.6 - 0.02 and y >= 0.1 - 0.02 for x, y in pts)
                detail = (f"{sh}: last-pusher share >= {min(x for x, _ in pts):.2f}, wait share "
                          f">= {min(y for _, y in pts):.2f} over the {need:g} s before it fired "
                          "(thresholds 0.6, 0.1)" if pts else f"{sh}: no samples")
            out.append((name, a_, b_, held, detail))
    return out


def true_runs(series):
    """[(from, to)] of consecutive True states (None and False end a run)."""
    out, begin, last = [], None, None
    for t, st in series:
        if st:
            if begin is None:
                begin = t
            last = t
        elif begin is not None:
            out.append((begin, last))
            begin = None
    if begin is not None:
        out.append((begin, last))
    return out


def fault_touches(fault, label):
    tg = [t.replace("-disk", "") for t in fault["targets"]]
    return label in tg


def condition_runs(name, fault, ctx):
    """The condition's runs (label, from, to) this fault may have caused."""
    model, scope = MODELS[name]
    lo, hi = fault["start"] - 1, (fault.get("progress_at") or fault["lift"]) + 5
    if name == "PserverCheckpointFailing":
        hi = fault["lift"] + 5  # the runs start at a failure during the fault
    out = []
    for label, series in ctx["models"][name]:
        if scope == "own" and not fault_touches(fault, label):
            continue
        for a, b in true_runs(series):
            if name == "PserverCheckpointFailing":
                if lo <= a <= hi:
                    out.append((label, a, b))
            elif scope == "any":
                if ctx["owner"].get((name, label, a)) == fault["id"]:
                    out.append((label, a, b))
            elif a <= hi and b >= lo:
                out.append((label, a, b))
    return out


def dropped_workers(run, events, samples, shard, t):
    """Worker ids the shard's log says it dropped at about its step at t (its
    "worker N dropped at step S" lines, in the incarnation running at t)."""
    name = "shard" + shard[1:]
    idx = None
    for te, n, what, i, _ in events:
        if n == name and what == "start" and te <= t:
            idx = i
    step = at([(tt, v["step"]) for tt, v in samples.get(shard, []) if v is not None], t)
    if idx is None or step is None:
        return set()
    out = set()
    for line in read_lines(os.path.join(run, "logs", f"{name}.{idx}.log")):
        m = re.search(r"worker (\d+) dropped at step (\d+)", line)
        if m and abs(int(m.group(2)) - step) <= 2:
            out.add("w" + m.group(1))
    return out


def assign_owners(faults, ctx):
    """{(alert, label, run start): fault id} for the rules whose condition any
    fault may cause (scope "any"): each run goes to one fault, among those
    that started before it and whose effect may still have been on (up to a
    lease after it was lifted and training progressed again): for
    PserverWorkerDropped, the one that targets a worker the shard dropped then
    (its log), nearest to a lease before the run; otherwise the latest to
    start."""
    owner = {}
    injected = [f for f in faults.values() if f["state"] == "injected"]
    for name, (_, scope) in MODELS.items():
        if scope != "any":
            continue
        for label, series in ctx["models"][name]:
            for a, _ in true_runs(series):
                cands = [f for f in injected if f["start"] - 1 <= a <=
                         max(f["lift"], f.get("progress_at") or f["lift"]) + 5 + ctx["lease"]]
                if not cands:
                    continue
                best = max(cands, key=lambda f: f["start"])
                if name == "PserverWorkerDropped":
                    gone = dropped_workers(ctx["run"], ctx["events"], ctx["samples"], label, a)
                    hit = [f for f in cands if gone & set(f["targets"])]
                    if hit:
                        best = min(hit, key=lambda f: abs(f["start"] + ctx["lease"] - a))
                owner[(name, label, a)] = best["id"]
    return owner


def analyse_chaos(run, meta):
    faults = parse_faults(run)
    events = parse_events(run)
    samples = read_samples(os.path.join(run, "samples.tsv"))
    rounds = round_series(samples)
    t0 = read_time(run, "window_start")
    finished = read_time(run, "finished")
    prom = json.load(open(os.path.join(run, "prom.json")))
    rules = rule_table(prom)
    fired = alert_intervals(prom)
    ctx = {"samples": samples, "rounds": rounds, "finished": finished,
           "any_live": any_live(samples), "lease": float(meta["lease_seconds"]),
           "run": run, "events": events}
    ctx["models"] = {name: model(samples, ctx) for name, (model, _) in MODELS.items()}
    claimed = {}  # alert -> firing intervals a fault's condition explains

    # Restarts: each daemon's exits and the run that followed.
    starts = {}
    for t, name, what, idx, val in events:
        if what == "start":
            starts.setdefault(name, []).append((t, idx))

    def next_start(name, t):
        for ts, idx in starts.get(name, []):
            if ts >= t - 0.5:
                return ts, idx
        return None, None

    for f in faults.values():
        if f["state"] != "injected":
            continue
        f["lift"] = f.get("end", f["start"])
        mark, at = hwm_progress(rounds, f["lift"])
        f["progress_at"] = at
        f["recovery_s"] = None if at is None else round(at - f["lift"], 2)
        f["stall_s"] = round(longest_stall(rounds, f["start"], at or finished), 2)
        # Shard restarts this fault caused: rounds thrown away.
        f["restarts"] = []
        if f["class"] in ("shard_kill", "shard_worker_kill", "ckpt_truncate"):
            s = f["targets"][0]
            name = "shard" + s[1:]
            ts, idx = next_start(name, f["start"])
            facts = shard_log_facts(run, name, idx) if idx is not None else {}
            pre = f.get("step", "?")
            if pre in ("?", ""):
                prior = [v["step"] for t, v in samples.get(s, [])
                         if v is not None and t < f["start"] and "step" in v]
                pre = prior[-1] if prior else None
            else:
                pre = int(pre)
            restored = facts.get("restored")
            if restored is None and facts.get("fresh"):
                restored = 0
            f["restarts"].append({
                "shard": s, "restarted_after_s": None if ts is None else round(ts - f["start"], 2),
                "step_before": pre, "restored": restored, "refused": facts.get("refused", []),
                "skips": facts.get("skips", []),
                "lost": None if pre is None or restored is None else int(pre - restored)})
        f["rounds_lost"] = sum(r["lost"] or 0 for r in f["restarts"])
        # Worker rounds missed, on a shard that did not restart meanwhile.
        f["worker_rounds_missed"] = None
        if any(t.startswith("w") for t in f["targets"]) or f["class"] == "worker_stop":
            t_to = at or finished
            for s in SHARDS:
                pts = [(t, v) for t, v in samples.get(s, []) if v is not None
                       and f["start"] - 1 <= t <= t_to]
                if len(pts) < 2:
                    continue
                steps = [v["step"] for _, v in pts]
                if any(b < a for a, b in zip(steps, steps[1:])):
                    continue  # restarted
                v0, v1 = pts[0][1], pts[-1][1]
                f["worker_rounds_missed"] = int(NUM_WORKERS * (v1["step"] - v0["step"])
                                                - (v1["applied"] - v0["applied"]))
                break
    ctx["owner"] = assign_owners(faults, ctx)
    for f in faults.values():
        if f["state"] != "injected":
            continue
        # Alerts: expected from the conditions the sampler saw.
        f["alerts"] = {}
        for name in MODELS:
            if name not in rules:
                continue
            r = rules[name]
            runs = condition_runs(name, f, ctx)
            held = max((b - a for _, a, b in runs), default=0.0)
            if held >= r["for"] + SLACK:
                verdict = "expected"
            elif not runs or held < max(0.0, r["for"] - SLACK):
                verdict = "not expected"
            else:
                verdict = "borderline"
            if verdict == "not expected":
                continue
            cond_end = max(b for _, _, b in runs)
            cond_start = min(a for _, a, _ in runs)
            hit = [iv for iv in fired.get(name, [])
                   if iv[1] >= cond_start + r["for"] - SLACK and iv[0] <= cond_end + SLACK + 2]
            for iv in hit:
                claimed.setdefault(name, set()).add(iv[:2])
            entry = {"verdict": verdict, "condition_s": round(held, 1), "fired": bool(hit)}
            if hit:
                last_end = max(iv[1] for iv in hit)
                entry["fired_after_s"] = round(min(iv[0] for iv in hit) - f["start"], 1)
                # ALERTS is read at 1 s steps: a series whose last sample is
                # before the end of training had stopped firing.
                entry["cleared"] = last_end < finished - 1.5
                entry["cleared_after_s"] = (round(last_end - cond_end, 1)
                                            if entry["cleared"] else None)
            # Whether clearing could be seen: the condition must have ended
            # (plus the rule's own memory, e.g. increase(...[2m])) before
            # training did.
            entry["clear_observable"] = cond_end + SLACK < finished - 1.5
            f["alerts"][name] = entry

    # Unplanned exits: non-zero exits not explained by a kill of ours.
    kills = {}
    for f in faults.values():
        if f["state"] == "injected" and f["class"] in (
                "shard_kill", "worker_kill", "shard_worker_kill", "ckpt_truncate"):
            for t in f["targets"]:
                name = ("shard" if t.startswith("s") else "worker") + t[1:]
                kills.setdefault(name, []).append(f["start"])
    unplanned = []
    done = read_time(run, "finished")
    for t, name, what, idx, val in events:
        if what != "exit" or val == 0:
            continue
        if val == 137 and any(abs(t - k) < 5 for k in kills.get(name, [])):
            continue
        if t > done:
            # After training: the shards' SIGTERM must give 0; workers still
            # running then (a job that did not finish) were killed by us.
            if name.startswith("shard"):
                unplanned.append({"daemon": name, "run": idx, "code": val,
                                  "t": round(t - t0, 1), "note": "on SIGTERM after training"})
            continue
        lines = read_lines(os.path.join(run, "logs", f"{name}.{idx}.log"))
        # The daemon's last word is its "pserver_worker: ..." line on stderr;
        # buffered stdout may land after it in the file.
        fatal = [l for l in lines if re.match(r"pserver_(worker|server): ", l)]
        unplanned.append({"daemon": name, "run": idx, "code": val, "t": round(t - t0, 1),
                          "log": lines[-3:] + fatal[-1:]})
    last_exit = {}
    for t, name, what, idx, val in events:
        if what == "exit":
            last_exit[name] = val
    # Firings of the modelled (availability) rules that no fault explains:
    # a daemon that did not come back, rounds stuck, or a rule that is wrong.
    unexplained = []
    for name in MODELS:
        for a_, b_, m in fired.get(name, []):
            if (a_, b_) not in claimed.get(name, set()):
                unexplained.append({"alert": name, "from": round(a_ - t0, 1),
                                    "to": round(b_ - t0, 1),
                                    "labels": {k: v for k, v in m.items()
                                               if k in ("instance", "shard")}})
    return {"faults": faults, "rules": rules, "fired": fired, "rounds": rounds, "t0": t0,
            "unexplained": unexplained,
            "finished": finished, "unplanned": unplanned, "last_exit": last_exit,
            "events": events, "samples": samples}


# The job's quality per workload: the key in a worker's summary JSON, its
# name in the report, and whether higher is better. The language model's
# summary is rank 0's (train_gpt.py --json): the only worker that evaluates.
QUALITY = {"mlp": ("test_accuracy", "test accuracy", True),
           "lm": ("final_val_loss", "validation loss (nats per byte)", False)}


def accuracy(run, w=0, workload="mlp"):
    """Worker w's quality figure (QUALITY), or None."""
    p = os.path.join(run, f"w{w}.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f).get(QUALITY[workload][0])


def weights_digest(run, w, workload):
    """SHA-256 of worker w's final parameters (mlp: of its --save_weights
    file; lm: what train_gpt.py --weights-sha256 wrote), or None."""
    if workload == "mlp":
        p = os.path.join(run, f"w{w}.weights")
        if not os.path.exists(p):
            return None
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    p = os.path.join(run, f"w{w}.sha256")
    return open(p).read().strip() if os.path.exists(p) else None


def verify_rows(run):
    rows = []
    for line in read_lines(os.path.join(run, "verify.tsv")):
        s, name, step, restored, msg = (line.split("\t") + [""] * 5)[:5]
        rows.append({"shard": int(s), "file": name, "step": int(step) if step else None,
                     "restored": int(restored) if restored else None, "log": msg})
    return rows


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def med_max(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.median(xs), max(xs)


def svg(res, meta):
    W, H = 1000, 520
    L, R = 110, 20
    t0 = res["t0"]
    t_end = res["finished"] - t0 + 5
    t_begin = min(-10.0, (res["rounds"][0][0] - t0) if res["rounds"] else -10.0)
    x = lambda t: L + (t - t_begin) / (t_end - t_begin) * (W - L - R)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         'font-family="sans-serif" font-size="11">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{L}" y="16" font-size="13">Chaos run: seed {meta["seed"]}, '
         f'{meta["duration"]} s fault window, {meta["steps"]} steps; '
         'new rounds per second (5 s mean) and the faults</text>']
    # New rounds per second: the high-water mark's rise over 5 s (a shard
    # that restarts behind and skips forward adds nothing).
    marks, mark = [], -1
    for t, r in res["rounds"]:
        mark = max(mark, r)
        marks.append((t, mark))
    rate_pts = []
    j = 0
    for t, r in marks:
        while marks[j][0] < t - 5:
            j += 1
        if t - marks[j][0] >= 2:
            rate_pts.append((t - t0, (r - marks[j][1]) / (t - marks[j][0])))
    top, bottom = 40, 200
    ymax = max([v for _, v in rate_pts] + [1])
    ymax = 10 ** math.ceil(math.log10(ymax)) / (2 if ymax < 10 ** math.ceil(math.log10(ymax)) / 2 else 1)
    y = lambda v: bottom - v / ymax * (bottom - top)
    s.append(f'<line x1="{L}" y1="{bottom}" x2="{W - R}" y2="{bottom}" stroke="#888"/>')
    for k in range(5):
        v = ymax * k / 4
        s.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        s.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#eee"/>')
    s.append(f'<text x="14" y="{(top + bottom) / 2}" transform="rotate(-90 14 {(top + bottom) / 2})" '
             'text-anchor="middle">rounds/s</text>')
    if rate_pts:
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in rate_pts[::max(1, len(rate_pts) // 2000)])
        s.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1"/>')
    # Fault lanes.
    colors = {"shard_kill": "#d62728", "worker_kill": "#ff7f0e", "shard_worker_kill": "#8c564b",
              "worker_stop": "#9467bd", "shard_stop": "#e377c2", "link_down": "#7f7f7f",
              "throttle": "#bcbd22", "disk_full": "#17becf", "ckpt_truncate": "#000000"}
    lanes = SHARDS + [t + "-disk" for t in SHARDS] + WORKERS
    lane_y = {ln: 225 + i * 20 for i, ln in enumerate(lanes)}
    for ln, ly in lane_y.items():
        s.append(f'<text x="{L - 6}" y="{ly + 12}" text-anchor="end">{ln}</text>')
        s.append(f'<line x1="{L}" y1="{ly + 16}" x2="{W - R}" y2="{ly + 16}" stroke="#eee"/>')
    for f in res["faults"].values():
        if f["state"] != "injected":
            continue
        a, b = f["start"] - t0, f.get("end", f["start"]) - t0
        for tg in f["targets"]:
            ly = lane_y[tg]
            wdt = max(3.0, x(b) - x(a))
            s.append(f'<rect x="{x(a):.1f}" y="{ly + 2}" width="{wdt:.1f}" height="13" '
                     f'fill="{colors[f["class"]]}"><title>#{f["id"]} {f["class"]} {tg} '
                     f'{a:.1f}-{b:.1f} s</title></rect>')
            if f.get("progress_at"):
                s.append(f'<line x1="{x(b):.1f}" y1="{ly + 8}" x2="{x(f["progress_at"] - t0):.1f}" '
                         f'y2="{ly + 8}" stroke="{colors[f["class"]]}" stroke-dasharray="2,2"/>')
    # Alerts.
    ay = 225 + len(lanes) * 20 + 10
    names = sorted(res["fired"])
    for i, name in enumerate(names):
        ly = ay + i * 18
        s.append(f'<text x="{L - 6}" y="{ly + 11}" text-anchor="end" font-size="9">'
                 f'{name.replace("Pserver", "")}</text>')
        for a, b, _ in res["fired"][name]:
            s.append(f'<rect x="{x(a - t0):.1f}" y="{ly + 2}" width="{max(2.0, x(b - t0) - x(a - t0)):.1f}" '
                     'height="11" fill="#f4a582" stroke="#b2182b" stroke-width="0.5"/>')
    axis_y = ay + len(names) * 18 + 8
    for k in range(0, int(t_end) + 1, 60 if t_end > 300 else 15):
        if k < t_begin:
            continue
        s.append(f'<line x1="{x(k):.1f}" y1="{top}" x2="{x(k):.1f}" y2="{axis_y}" stroke="#f3f3f3"/>')
        s.append(f'<text x="{x(k):.1f}" y="{axis_y + 14}" text-anchor="middle">{k}</text>')
    s.append(f'<text x="{(L + W - R) / 2}" y="{axis_y + 30}" text-anchor="middle">seconds since '
             'the fault window opened (dashes: a fault\'s lift to the next new round; '
             'orange: alerts firing)</text>')
    # Legend.
    lx = L
    for cls in CLASSES:
        s.append(f'<rect x="{lx}" y="{axis_y + 40}" width="10" height="10" fill="{colors[cls]}"/>')
        s.append(f'<text x="{lx + 13}" y="{axis_y + 49}">{cls}</text>')
        lx += 13 + 7 * len(cls) + 12
    s.append("</svg>")
    total_h = axis_y + 60
    s[0] = s[0].replace(f'height="{H}"', f'height="{total_h}"')
    return "\n".join(s)


def cmd_report(a):
    work = a.work
    meta = json.load(open(os.path.join(work, "meta.json")))
    chaos = os.path.join(work, "chaos")
    with open(os.path.join(chaos, "meta")) as f:
        kv = dict(l.strip().split("=", 1) for l in f if "=" in l)
    meta["steps"] = int(kv["steps"])
    meta.setdefault("machine", machine())
    prov = os.path.join(work, "provenance.json")
    if os.path.exists(prov):  # tests/bench/provenance.py, at the start
        with open(prov) as f:
            meta["provenance"] = json.load(f)
        meta["commit"] = meta["provenance"]["commit"] + (
            " (dirty tree)" if meta["provenance"].get("dirty") else "")
    workload = meta.get("workload", "mlp")
    quality = QUALITY[workload][1]
    # Workers that write a summary with the quality figure.
    judged = range(NUM_WORKERS) if workload == "mlp" else range(1)
    everyone = range(NUM_WORKERS)
    res = analyse_chaos(chaos, meta)
    faults = [f for f in sorted(res["faults"].values(), key=lambda f: f["id"])]
    injected = [f for f in faults if f["state"] == "injected"]

    clean = []
    i = 0
    while os.path.isdir(os.path.join(work, f"clean{i}")):
        d = os.path.join(work, f"clean{i}")
        with open(os.path.join(d, "meta")) as f:
            ckv = dict(l.strip().split("=", 1) for l in f if "=" in l)
        clean.append({"seed": int(ckv["seed"]), "accuracy": accuracy(d, 0, workload),
                      "workers_agree": len({weights_digest(d, w, workload)
                                            for w in everyone} - {None}) == 1,
                      "seconds": round(read_time(d, "finished") - read_time(d, "started"), 1),
                      "leftovers": read_lines(os.path.join(d, "leftovers.txt"))})
        i += 1
    accs = [c["accuracy"] for c in clean if c["accuracy"] is not None]
    acc = accuracy(chaos, 0, workload)
    chaos_accs = [accuracy(chaos, w, workload) for w in judged]
    digests = [weights_digest(chaos, w, workload) for w in everyone]
    # The quality check: against the clean run of the same seed (the job is
    # deterministic), within the clean runs' spread over seeds; with fewer
    # than two clean runs (the short mode) the one clean run +- acc_margin.
    same = next((c["accuracy"] for c in clean if c["seed"] == meta["seed"]
                 and c["accuracy"] is not None), None)
    band = (max(accs) - min(accs)) if len(accs) >= 2 else meta["acc_margin"]
    band_how = ("the clean runs' spread over seeds (max - min)" if len(accs) >= 2
                else f"acc_margin (fewer than two clean runs)")
    lo = same - band if same is not None else None
    hi = same + band if same is not None else None

    ckpts = verify_rows(chaos)
    bad_ckpts = [r for r in ckpts if r["restored"] is None or r["restored"] != r["step"]]
    leftovers = read_lines(os.path.join(chaos, "leftovers.txt")) + [
        l for c in clean for l in c["leftovers"]]

    per_class = {}
    for cls in CLASSES:
        fs = [f for f in injected if f["class"] == cls]
        rec = med_max([f["recovery_s"] for f in fs])
        stall = med_max([f["stall_s"] for f in fs])
        lost = [f["rounds_lost"] for f in fs if f["restarts"]]
        missed = [f["worker_rounds_missed"] for f in fs if f["worker_rounds_missed"] is not None]
        alerts = {}
        for f in fs:
            for name, e in f["alerts"].items():
                d = alerts.setdefault(name, {"expected": 0, "fired": 0, "cleared": 0,
                                             "borderline": 0, "fired_after_s": [],
                                             "cleared_after_s": []})
                if e["verdict"] == "expected":
                    d["expected"] += 1
                    d["fired"] += e["fired"]
                    d["cleared"] += bool(e.get("cleared"))
                    if e.get("fired_after_s") is not None:
                        d["fired_after_s"].append(e["fired_after_s"])
                    if e.get("cleared_after_s") is not None:
                        d["cleared_after_s"].append(e["cleared_after_s"])
                else:
                    d["borderline"] += 1
        per_class[cls] = {
            "planned": sum(1 for f in faults if f["class"] == cls),
            "injected": len(fs),
            "recovery_median_s": rec[0], "recovery_max_s": rec[1],
            "stall_median_s": stall[0], "stall_max_s": stall[1],
            "rounds_lost_total": sum(lost) if lost else None,
            "rounds_lost_max": max(lost) if lost else None,
            "worker_rounds_missed_total": sum(missed) if missed else None,
            "alerts": alerts,
        }

    missing_alerts = [(f["id"], f["class"], n) for f in injected for n, e in f["alerts"].items()
                      if e["verdict"] == "expected" and not e["fired"]]
    uncleared = [(f["id"], f["class"], n) for f in injected for n, e in f["alerts"].items()
                 if e["verdict"] == "expected" and e["fired"] and not e.get("cleared")
                 and e["clear_observable"]]
    # Speed alerts watch the share of step time spent waiting: a storm of
    # faults, whose stalls are waiting, may raise them truthfully. Each
    # firing must be borne out by the sampled counters (speed_alert_checks);
    # the training-quality ones (loss, update norm, error feedback) fail the
    # run whenever they fire.
    speed_alerts = sorted(n for n in res["fired"] if n in SPEED_ALERTS)
    speed_checks = speed_alert_checks(res, res["rules"])
    training_alerts = sorted(n for n in res["fired"]
                             if n not in MODELS and n not in SPEED_ALERTS)
    still_firing = sorted({n for n, ivs in res["fired"].items()
                           for a_, b_, _ in ivs if b_ >= res["finished"] - 1.5})
    unfinished = " ".join(read_lines(os.path.join(chaos, "unfinished")))
    shard_stop_codes = {n: c for n, c in res["last_exit"].items() if n.startswith("shard")}
    worker_codes = {n: c for n, c in res["last_exit"].items() if n.startswith("worker")}
    checks = [
        ("every fault class injected",
         all(p["injected"] > 0 for p in per_class.values() if p["planned"] > 0)
         and (bool(meta.get("schedule_file")) or all(p["planned"] > 0 for p in per_class.values())),
         ", ".join(f"{c} {per_class[c]['injected']}/{per_class[c]['planned']}" for c in CLASSES)),
        ("the job finished: every worker's last run exited 0",
         not unfinished and len(worker_codes) == NUM_WORKERS
         and all(c == 0 for c in worker_codes.values()),
         (f"NOT FINISHED: {unfinished}; " if unfinished else "") + str(worker_codes)),
        ("the shards exited 0 on SIGTERM at the end",
         len(shard_stop_codes) == 2 and all(c == 0 for c in shard_stop_codes.values()),
         str(shard_stop_codes)),
        ("no unplanned exits (every non-zero exit was a SIGKILL of ours)",
         not res["unplanned"],
         f"{len(res['unplanned'])} exits: " + "; ".join(sorted({
             re.sub(r"\d+", "N", (u.get("log") or [u.get("note", "")])[-1])[:90]
             for u in res["unplanned"]})) + " (see below)" if res["unplanned"] else ""),
        ("every worker ended with one model (equal SHA-256 of its final weights)",
         None not in digests and len(set(digests)) == 1,
         ", ".join(f"w{w} {d[:12] if d else 'none'}" for w, d in zip(everyone, digests))),
        (f"{quality} within {band_how} of the same seed's clean run",
         acc is not None and same is not None and lo <= acc <= hi,
         f"{fmt(acc, 4)} against {fmt(same, 4)} +- {fmt(band, 4)} (clean "
         f"{', '.join(fmt(x, 4) for x in accs)})"
         if same is not None else f"{fmt(acc, 4)}; not compared: no clean run of seed "
         f"{meta['seed']} (--clean-runs 0)"),
        ("every checkpoint written loads", not bad_ckpts and bool(ckpts),
         f"{len(ckpts)} loaded, {len(bad_ckpts)} failed" +
         (": " + "; ".join(f"shard {r['shard']} {r['file']}: {r['log'][:120]}" for r in bad_ckpts[:5])
          if bad_ckpts else "")),
        ("no process left running", not leftovers, "; ".join(leftovers)[:400]),
        ("every expected alert fired", not missing_alerts,
         "; ".join(f"#{i} {c}: {n}" for i, c, n in missing_alerts)),
        ("every fired alert cleared before training ended (where its condition ended in time)",
         not uncleared, "; ".join(f"#{i} {c}: {n}" for i, c, n in uncleared)),
        ("no availability alert fired that no fault explains", not res["unexplained"],
         "; ".join(f"{u['alert']} {u['from']}-{u['to']} s {u['labels']}"
                   for u in res["unexplained"])[:600]),
        ("every speed alert that fired held its rule's condition in the sampled counters",
         all(h for _, _, _, h, _ in speed_checks),
         "; ".join(f"{n.replace('Pserver', '')} {a_ - res['t0']:.0f}-{b_ - res['t0']:.0f} s: "
                   f"{'yes' if h else 'NO'}, {d}" for n, a_, b_, h, d in speed_checks)[:900]
         or "none fired"),
        ("no training-quality alert fired (loss, update norm, error feedback)",
         not training_alerts,
         "; ".join(f"{n} " + ", ".join(f"{a_ - res['t0']:.0f}-{b_ - res['t0']:.0f} s"
                                      for a_, b_, _ in res["fired"][n][:6])
                   for n in training_alerts)),
    ]
    ok = all(c[1] for c in checks)

    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    t0 = res["t0"]
    out_faults = []
    for f in faults:
        g = {k: v for k, v in f.items() if k not in ("lift",)}
        for k in ("start", "end", "progress_at"):
            if g.get(k) is not None:
                g[k] = round(g[k] - t0, 2)
        out_faults.append(g)
    doc = {
        "meta": meta, "ok": ok,
        "checks": [{"check": n, "ok": bool(o), "detail": d} for n, o, d in checks],
        "accuracy": {"chaos": acc, "chaos_workers": chaos_accs, "clean": clean and [
            {k: v for k, v in c.items() if k != "leftovers"} for c in clean],
            "same_seed_clean": same, "band": band, "band_from": band_how,
            "range": [lo, hi]},
        "weights_sha256": {f"w{w}": d for w, d in zip(everyone, digests)},
        "classes": per_class,
        "faults": out_faults,
        "alerts_fired": {n: [[round(a_ - t0, 1), round(b_ - t0, 1), m.get("instance", m.get("shard", ""))]
                             for a_, b_, m in ivs] for n, ivs in res["fired"].items()},
        "alerts_firing_at_end": still_firing,
        "speed_alerts": speed_alerts,
        "speed_alert_checks": [{"alert": n, "from": round(a_ - t0, 1), "to": round(b_ - t0, 1),
                                "held": h, "detail": d} for n, a_, b_, h, d in speed_checks],
        "rules": res["rules"],
        "checkpoints_loaded": len(ckpts),
        "training_seconds": round(res["finished"] - t0, 1),
        "unplanned_exits": res["unplanned"],
        "unfinished": unfinished,
        # From the work folder's first file to the last checkpoint loaded.
        "benchmark_minutes": round((os.path.getmtime(os.path.join(chaos, "verify.tsv"))
                                    - os.path.getmtime(os.path.join(work, "meta.json"))) / 60),
    }
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    with open(a.out + ".svg", "w") as f:
        f.write(svg(res, meta))

    md = []
    md.append(f"# Chaos benchmark: seed {meta['seed']}, {meta['duration']} s of faults")
    md.append("")
    cmd = "sudo " + meta.get("command", "tests/bench/chaos.sh").strip()
    job = ("the MLP on Fashion-MNIST, {steps} steps, 1-bit Adam as deploy/local.sh runs "
           "it; the workers sleep {delay} ms per step in the chaos run (not in the clean "
           "runs: the result is the same bit for bit); "
           if workload == "mlp" else
           "python/examples/train_gpt.py --pserver (the small GPT, AdamW's groups, warmup "
           "and cosine, clipping), {steps} steps, lm_fidelity.sh's ps_onebit recipe; "
           ).format(steps=meta["steps"], delay=meta["compute_delay_ms"])
    cal = meta.get("provenance", {}).get("calibration_seconds")
    md.append(f"Command: `{cmd}` (commit {meta['commit']}, {meta['date']}, load average "
              f"{meta['load_start']} at the start; {meta['machine']}, every process on "
              f"them" + (f"; calibration {cal:.3f} s (tests/bench/provenance.py)" if cal else "")
              + f"). The job: 2 shards, 4 workers, {job}"
              f"shards "
              f"checkpoint every {meta['checkpoint_every']} rounds, lease "
              f"{meta['lease_seconds']} s; supervisors restart a daemon {meta['restart_delay']} s "
              f"after a failure exit. Training took {doc['training_seconds']} s from the window's "
              f"start; the whole benchmark (calibration, clean runs, chaos run, loading every "
              f"checkpoint) {doc['benchmark_minutes']} min. "
              f"Timeline: [{os.path.basename(a.out)}.svg]({os.path.basename(a.out)}.svg).")
    md.append("")
    md.append("| check | result | detail |")
    md.append("|---|---|---|")
    for n, o, d in checks:
        md.append(f"| {n} | {'pass' if o else '**FAIL**'} | {d.replace('|', '/')} |")
    md.append("")
    md.append("## Per fault class")
    md.append("")
    md.append("| class | injected | recovery median / max (s) | longest stall median / max (s) "
              "| rounds lost on a restarted shard (total, max) | worker rounds missed | alerts: expected/fired/"
              "cleared |")
    md.append("|---|---|---|---|---|---|---|")
    for cls in CLASSES:
        p = per_class[cls]
        al = []
        for name, d in sorted(p["alerts"].items()):
            short = name.replace("Pserver", "")
            if d["expected"]:
                al.append(f"{short} {d['expected']}/{d['fired']}/{d['cleared']}")
            if d["borderline"]:
                al.append(f"{short} ({d['borderline']} borderline)")
        lost = "-" if p["rounds_lost_total"] is None else \
            f"{p['rounds_lost_total']}, {p['rounds_lost_max']}"
        missed = "-" if p["worker_rounds_missed_total"] is None else str(p["worker_rounds_missed_total"])
        md.append(f"| {cls} | {p['injected']} | {fmt(p['recovery_median_s'])} / {fmt(p['recovery_max_s'])} "
                  f"| {fmt(p['stall_median_s'])} / {fmt(p['stall_max_s'])} | {lost} | {missed} "
                  f"| {'; '.join(al) or 'none'} |")
    md.append("")
    md.append("## Alert rules")
    md.append("")
    md.append("| alert | for (s) | fired (times, from the window's start) |")
    md.append("|---|---|---|")
    for name in sorted(res["rules"]):
        ivs = res["fired"].get(name, [])
        times = ", ".join(f"{a_ - t0:.0f}-{b_ - t0:.0f}" for a_, b_, _ in ivs[:12])
        if len(ivs) > 12:
            times += f", ... ({len(ivs)} in all)"
        md.append(f"| {name} | {res['rules'][name]['for']:g} | {times or 'never'} |")
    md.append("")
    md.append("## Faults")
    md.append("")
    md.append("| # | class | targets | start (s) | seconds | recovery (s) | stall (s) | rounds lost "
              "| worker rounds missed | alerts (fired after s) | detail |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for f in out_faults:
        if f["state"] != "injected":
            md.append(f"| {f['id']} | {f['class']} | {','.join(f['targets'])} | "
                      f"{f['planned_start']:.1f} | {f['planned_seconds']:g} | | | | | | {f['state']} |")
            continue
        al = []
        for n, e in sorted(f["alerts"].items()):
            mark = {"expected": "", "borderline": "?"}[e["verdict"]]
            al.append(f"{mark}{n.replace('Pserver', '')} " +
                      (f"{e.get('fired_after_s')}" if e["fired"] else "MISSING" if not mark else "no"))
        det = []
        for r in f["restarts"]:
            det.append(f"{r['shard']}: step {r['step_before']} -> restored {r['restored']}"
                       + (f", refused {len(r['refused'])}" if r["refused"] else "")
                       + (f", skipped {r['skips']}" if r["skips"] else ""))
        if f["class"] == "link_down":
            det.append(f"side {f.get('side', f['detail'])}")
        if f["class"] == "disk_full":
            det.append(f"filled {f.get('filled', '?')} B")
        dur = (f.get("end", f["start"]) - f["start"])
        md.append(f"| {f['id']} | {f['class']} | {','.join(f['targets'])} | {f['start']:.1f} | {dur:.1f} "
                  f"| {fmt(f['recovery_s'])} | {fmt(f['stall_s'])} | {f['rounds_lost'] if f['restarts'] else '-'} "
                  f"| {'-' if f['worker_rounds_missed'] is None else f['worker_rounds_missed']} "
                  f"| {'; '.join(al)} | {'; '.join(det)} |")
    md.append("")
    md.append("Alerts per fault: the rules whose condition this fault brought about for longer "
              "than their `for:` (the seconds after the fault's start at which each fired, or "
              "MISSING); `?` borderline (the condition held about the `for:`: not checked). "
              "Firings that no fault explains are a check above. How each figure is computed: "
              "tests/bench/chaos_report.py's header.")
    md.append("")
    if res["unplanned"]:
        md.append("## Exits no fault explains")
        md.append("")
        md.append("Non-zero exits other than our SIGKILLs (the supervisor restarted each):")
        md.append("")
        md.append("| daemon | run | at (s) | code | its last line |")
        md.append("|---|---|---|---|---|")
        for u in res["unplanned"]:
            last = (u.get("log") or [u.get("note", "")])[-1].replace("|", "/")
            md.append(f"| {u['daemon']} | {u['run']} | {u['t']} | {u['code']} | {last[:200]} |")
        md.append("")
    if speed_alerts:
        md.append("## Speed alerts")
        md.append("")
        spent = res["finished"] - read_time(chaos, "started")
        delay = meta["compute_delay_ms"] * meta["steps"] / 1000
        md.append("PserverCommunicationBound is `rate(communication seconds[5m]) / (that + "
                  "rate(compute seconds[5m])) > 0.5 for 10m`: a worker spent more than half of "
                  "its step time pushing, pulling and waiting for ten minutes. The faults' "
                  "stalls are waiting, so a dense storm makes that true; the check above "
                  "recomputes the ratio from the sampled counters over the `for:` before each "
                  "firing, so an alert the counters do not bear out fails the run. Fired ("
                  + "; ".join(f"{n} " + ", ".join(f"{a_ - t0:.0f}-{b_ - t0:.0f} s on "
                                                 f"{m.get('instance', '?')}"
                                                 for a_, b_, m in res["fired"][n][:6])
                              for n in speed_alerts)
                  + f"). The chaos job took {spent:.0f} s for {meta['steps']} steps"
                  + (f", of which the workers' compute delay is {delay:.0f} s" if delay else "")
                  + ".")
        md.append("")
    md.append("## Clean runs")
    md.append("")
    md.append(f"| run | {quality} | wall seconds (workers started to done) |")
    md.append("|---|---|---|")
    for c in clean:
        md.append(f"| clean, seed {c['seed']} | {fmt(c['accuracy'], 4)} | {c['seconds']} |")
    md.append(f"| chaos, seed {meta['seed']} | {fmt(acc, 4)} | "
              f"{res['finished'] - read_time(chaos, 'started'):.1f} |")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"\nchaos: {'PASS' if ok else 'FAIL'}; {a.out}.{{md,json,svg}}")
    sys.exit(0 if ok else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("schedule")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--lease", type=float, required=True)
    s.add_argument("--short", action="store_true")
    s = sub.add_parser("sample")
    s.add_argument("--out", required=True)
    s.add_argument("--shards", required=True)
    s.add_argument("--workers", default="")
    s.add_argument("--stop", required=True)
    s.add_argument("--interval", type=float, default=0.25)
    s = sub.add_parser("rate")
    s.add_argument("samples")
    s = sub.add_parser("collect")
    s.add_argument("--prom", required=True)
    s.add_argument("--run", required=True)
    s = sub.add_parser("report")
    s.add_argument("--work", required=True)
    s.add_argument("--out", required=True)
    a = p.parse_args()
    {"schedule": cmd_schedule, "sample": cmd_sample, "rate": cmd_rate,
     "collect": cmd_collect, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
