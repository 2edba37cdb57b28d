#!/usr/bin/python3
"""nanoGPT's own stop-and-resume through pserver (issue 47, A "Measured").

A training script nobody here wrote, karpathy/nanoGPT's train.py, changed
only as docs/python.md tells a user of torch.optim.AdamW + DDP, run under
`python3 -m pserver.launch --shards 2 --workers 2 --recipe lm-onebit:F`,
stopped and resumed with its own `--init_from=resume` (rank 0's ckpt.pt,
loaded by every rank, into fresh shards). Per seed:
  full    uninterrupted to --max-iters;
  after   stopped at --stop-after (> F, in 1-bit Adam's compression stage),
          then the same command with --init_from=resume to --max-iters;
  before  the same, stopped at --stop-before (< F, still in the warmup);
  adamw   unchanged nanoGPT in one process with torch.optim.AdamW and the
          same global batch (2 micro-batches of 12): a reference, not a
          criterion.
Each run's final loss is nanoGPT's estimate_loss() val loss at --max-iters
(a multiple of --eval-interval, so it evaluates there) and, the criterion,
the loss of the ckpt.pt saved there on the whole of val.bin (estimate_loss's
random batches differ by about 0.025 between two evaluations of the same
weights). A resume that fails is recorded and run again (--resume-retries)
from the stop's ckpt.pt, kept aside. Before the runs, short probes run the
script with one of the changes left out and record what a user sees (the
exception's last line); after them the start of a resume is repeated
(--race-trials) to count clean starts, refused ones and shards that skipped
ahead (rank 0's install racing rank 1's registration).

Nothing is fetched at run time. NANOGPT is a nanoGPT checkout or a bare git
dir of it: the `fetch` tool's mirror (github:karpathy/nanoGPT gives
/work/.mirror/karpathy+nanoGPT/repo) or `git clone
https://github.com/karpathy/nanoGPT` where the network allows. Its files are
copied into WORK and changed there (PATCHES below, each with its reason);
the data is nanoGPT's own data/shakespeare_char/prepare.py run unchanged on
a local input.txt (it downloads only when input.txt is missing): the *.py
files directly in /usr/lib/python3.11, sorted by name, the first 2,000,000
characters, char-level, train.bin / val.bin (uint16) and meta.pkl.

    /usr/bin/python3 tests/bench/nanogpt_resume.py /work/.mirror/karpathy+nanoGPT/repo
    NANOGPT=~/nanoGPT /usr/bin/python3 tests/bench/nanogpt_resume.py --seeds 1 --runs full
    /usr/bin/python3 tests/bench/nanogpt_resume.py --report tests/bench/results/nanogpt_resume.json

Writes OUT/nanogpt_resume.json (every run: command, exit status, evals,
saves, the lines pserver printed; the summary; the commit, the machine) and
OUT/nanogpt_resume.md; --report remakes the .md from a .json, with
--notes FILE adding a hand-written section (kept in the .json). The build
(BUILD/server/pserver_server, BUILD/python/pserver) is copied into WORK
first, so another engineer's rebuild cannot change it between runs; never
builds; --build may name such a copy (WORK/build, with its provenance.json)
to run on the same build again. Runs one launcher at a time, each under flock on
/tmp/pserver_bench.lock (taken here: do not wrap this in flock on that
file). Seeds: nanoGPT seeds torch with 1337 + rank; seed s here is
1337 + 1000 (s - 1) + rank (a `seed` config key, PATCHES).
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
LOCK = "/tmp/pserver_bench.lock"
DATASET = "pystdlib_char"

# Measurement only: what nanoGPT does not print (the save's cost, the bytes).
SAVE_TIMING = "measure"

# (key, file, old, new, why). Each `old` must occur exactly once. The
# probes leave out one key at a time (and every later one of the same file
# chain, see PROBES) to record what a user hits without it.
PATCHES = [
    ("seed", "train.py",
     "compile = True # use PyTorch 2.0 to compile the model to be faster\n",
     "compile = True # use PyTorch 2.0 to compile the model to be faster\n"
     "seed = 1337 # harness: the base seed, --seed=N\n",
     "harness, not a user change: a `seed` config key so each run picks its "
     "seed (nanoGPT hard-codes 1337 + rank); seed s is 1337 + 1000 (s - 1)"),
    ("seed_use", "train.py",
     "torch.manual_seed(1337 + seed_offset)\n",
     "torch.manual_seed(seed + seed_offset)\n",
     "harness: use that key (rank offsets stay nanoGPT's: + RANK)"),
    ("init_pg", "train.py",
     "    init_process_group(backend=backend)\n", "",
     "no torch.distributed: the launcher sets RANK, WORLD_SIZE, LOCAL_RANK "
     "(nanoGPT decides `ddp` from RANK) but no MASTER_ADDR, and nothing "
     "needs a process group"),
    ("cuda_device", "train.py",
     "    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "",
     "nanoGPT's ddp branch hard-codes cuda:LOCAL_RANK, whatever --device "
     "says; on this CPU-only torch set_device fails (a DDP-over-gloo CPU "
     "run needs the same change)"),
    ("ddp_wrap", "train.py",
     "if ddp:\n    model = DDP(model, device_ids=[ddp_local_rank])\n", "",
     "the DDP wrapper goes (docs/python.md): the optimizer averages through "
     "the shards"),
    ("raw_model", "train.py",
     "raw_model = model.module if ddp else model",
     "raw_model = model",
     "with no DDP wrapper there is no .module to unwrap"),
    ("destroy_pg", "train.py",
     "if ddp:\n    destroy_process_group()\n", "",
     "no process group to destroy"),
    (SAVE_TIMING, "train.py",
     "                checkpoint = {\n"
     "                    'model': raw_model.state_dict(),\n"
     "                    'optimizer': optimizer.state_dict(),\n",
     "                _t0 = time.time()\n"
     "                _opt_state = optimizer.state_dict()\n"
     "                _t1 = time.time()\n"
     "                checkpoint = {\n"
     "                    'model': raw_model.state_dict(),\n"
     "                    'optimizer': _opt_state,\n",
     "measurement only: time optimizer.state_dict() (with pserver it "
     "fetches the shards' state) apart from torch.save"),
    (SAVE_TIMING + "_print", "train.py",
     "                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))\n",
     "                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))\n"
     "                print(f\"harness: save iter {iter_num} bytes \"\n"
     "                      f\"{os.path.getsize(os.path.join(out_dir, 'ckpt.pt'))} \"\n"
     "                      f\"state_dict_s {_t1 - _t0:.4f} \"\n"
     "                      f\"torch_save_s {time.time() - _t1:.4f} \"\n"
     "                      f\"shards_bytes {sum(s['state'].numel() for s in _opt_state.get('pserver_shards', []))} \"\n"
     "                      f\"client_bytes {len(_opt_state.get('pserver_client_state', b''))}\", flush=True)\n"
     "                _opt_state = None\n",
     "measurement only: print the file's size, the two times and the "
     "optimizer state's parts"),
    (SAVE_TIMING + "_load", "train.py",
     "    optimizer.load_state_dict(checkpoint['optimizer'])\n",
     "    _t0 = time.time()\n"
     "    optimizer.load_state_dict(checkpoint['optimizer'])\n"
     "    print(f\"harness: load_state_dict_s {time.time() - _t0:.4f}\", flush=True)\n",
     "measurement only: time load_state_dict() (with pserver it installs "
     "the shards' state; the other ranks wait for it)"),
    (SAVE_TIMING + "_stats", "train.py",
     "    if iter_num > max_iters:\n        break\n",
     "    if iter_num > max_iters:\n"
     "        if master_process and hasattr(optimizer, 'stats'):\n"
     "            import json as _json\n"
     "            print('harness: stats', _json.dumps(optimizer.stats()), flush=True)\n"
     "        break\n",
     "measurement only: rank 0's client counters (bytes) at the end"),
    ("optimizer", "model.py",
     "        optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, "
     "betas=betas, **extra_args)\n",
     "        import pserver, pserver.torch\n"
     "        optimizer = pserver.torch.DistributedOptimizer(optim_groups, "
     "**pserver.init(), lr=learning_rate, betas=betas, module=self)\n",
     "the optimizer line, as docs/python.md gives it for a torch.optim.AdamW "
     "script: the same groups (decay 0.1 on matrices, 0 on the rest), lr "
     "and betas; module=self adds the model's persistent buffers (the "
     "causal masks)"),
]
REFERENCE_KEYS = {"seed", "seed_use", SAVE_TIMING, SAVE_TIMING + "_print",
                  SAVE_TIMING + "_load"}

# (name, keys left out, extra script args, launcher flags or None for the
# measured ones, what it shows). Each adds one change to the previous one.
PROBES = [
    ("only_optimizer_line", {"init_pg", "cuda_device", "ddp_wrap",
                             "raw_model", "destroy_pg"}, [], None,
     "the optimizer line alone, train.py as it is"),
    ("no_init_process_group", {"cuda_device", "ddp_wrap", "raw_model",
                               "destroy_pg"}, [], None,
     "+ init_process_group removed"),
    ("no_cuda_device", {"ddp_wrap", "raw_model", "destroy_pg"}, [], None,
     "+ the cuda device lines removed"),
    ("no_ddp_wrapper", {"raw_model", "destroy_pg"}, [], None,
     "+ the DDP wrapper removed"),
    ("no_raw_model_fix", {"destroy_pg"}, [], None,
     "+ raw_model = model (destroy_process_group left)"),
    ("beta2_not_on_launcher", set(), [], "no-beta2",
     "every change, the launcher without --beta2 (the script's betas are "
     "(0.9, 0.99): config/train_shakespeare_char.py's beta2)"),
    ("config_accumulation_1", set(), ["--gradient_accumulation_steps=1"],
     None, "every change, the char config's gradient_accumulation_steps=1 "
     "(nanoGPT's own DDP rule, not pserver's)"),
]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True,
                          **kw).stdout.strip()


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


@contextlib.contextmanager
def bench_lock():
    with open(LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"nanogpt_resume: waiting for {LOCK}", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def nanogpt_source(src, dest):
    """Copies a checkout or exports a bare git dir's HEAD into dest;
    returns the commit (or None)."""
    src = pathlib.Path(src)
    if (src / "train.py").is_file():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git"))
        try:
            return sh(["git", "-C", str(src), "rev-parse", "HEAD"])
        except (subprocess.CalledProcessError, FileNotFoundError):
            return None
    if (src / "HEAD").is_file() and (src / "objects").is_dir():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "--git-dir", str(src), "archive",
                                  "HEAD"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout,
                       check=True)
        return sh(["git", "--git-dir", str(src), "rev-parse", "HEAD"])
    sys.exit(f"nanogpt_resume: {src} holds neither train.py nor a bare git "
             "repository; expected a nanoGPT checkout or the fetch tool's "
             "mirror (see --help)")


def patched_copy(pristine, dest, keys):
    shutil.copytree(pristine, dest)
    for key, name, old, new, _ in PATCHES:
        if key not in keys:
            continue
        path = dest / name
        text = path.read_text()
        if text.count(old) != 1:
            sys.exit(f"nanogpt_resume: change '{key}': {name} holds its "
                     f"anchor {text.count(old)} times; expected once (another "
                     "nanoGPT version?)")
        path.write_text(text.replace(old, new))
    return dest


def build_data(copy):
    """nanoGPT's data/shakespeare_char/prepare.py, unchanged, on a local
    input.txt; returns what it printed."""
    folder = copy / "data" / DATASET
    folder.mkdir(parents=True)
    shutil.copy(copy / "data" / "shakespeare_char" / "prepare.py", folder)
    files = sorted(p for p in pathlib.Path("/usr/lib/python3.11").iterdir()
                   if p.suffix == ".py" and p.is_file())
    text = "".join(p.read_text(encoding="utf-8") for p in files)[:2_000_000]
    (folder / "input.txt").write_text(text, encoding="utf-8")
    out = sh([PYTHON, "prepare.py"], cwd=folder)
    return [line for line in out.splitlines()
            if not line.startswith("all the unique")]


def script_args(a, seed, max_iters, out_dir, resume=False):
    """nanoGPT's own char config, sized for 2 CPU cores. The lr schedule's
    length (lr_decay_iters) is the full run's in every run, so a stopped
    run's lr is the uninterrupted one's."""
    args = ["config/train_shakespeare_char.py", f"--dataset={DATASET}",
            "--device=cpu", "--compile=False", "--dtype=float32",
            "--n_layer=4", "--n_head=4", "--n_embd=128", "--block_size=64",
            "--batch_size=12", "--dropout=0.0",
            "--gradient_accumulation_steps=2",
            f"--max_iters={max_iters}", f"--lr_decay_iters={a.max_iters}",
            f"--warmup_iters={a.warmup}", f"--eval_interval={a.eval_interval}",
            f"--eval_iters={a.eval_iters}", f"--log_interval={a.eval_interval}",
            "--always_save_checkpoint=True", f"--out_dir={out_dir}",
            f"--seed={1337 + 1000 * (seed - 1)}"]
    return args + (["--init_from=resume"] if resume else [])


def launcher(a, run_dir, beta2=True):
    cmd = [PYTHON, "-m", "pserver.launch", "--shards", "2", "--workers", "2",
           "--server-bin", str(a.snapshot / "server" / "pserver_server"),
           "--run-dir", str(run_dir), "--recipe", f"lm-onebit:{a.freeze}"]
    # The script's betas are (0.9, 0.99); the shards' default beta2 is
    # 0.999 and they refuse a script's other value (see the probe).
    return cmd + (["--beta2=0.99"] if beta2 else [])


def parse(log_text):
    evals, saves, stats, load = [], [], None, None
    for line in log_text.splitlines():
        m = re.match(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)",
                     line)
        if m:
            evals.append([int(m[1]), float(m[2]), float(m[3])])
        m = re.match(r"harness: save iter (\d+) bytes (\d+) state_dict_s "
                     r"([\d.]+) torch_save_s ([\d.]+) shards_bytes (\d+) "
                     r"client_bytes (\d+)", line)
        if m:
            saves.append({"iter": int(m[1]), "bytes": int(m[2]),
                          "state_dict_seconds": float(m[3]),
                          "torch_save_seconds": float(m[4]),
                          "shards_state_bytes": int(m[5]),
                          "client_state_bytes": int(m[6])})
        m = re.match(r"harness: load_state_dict_s ([\d.]+)", line)
        if m:
            load = float(m[1])
        if line.startswith("harness: stats "):
            stats = json.loads(line[len("harness: stats "):])
    return evals, saves, stats, load


def last_error(text):
    """The exception line of the last traceback in text (a bare
    AssertionError with the assert's source line), or None."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback"):
            source = None
            for line in lines[i + 1:]:
                if line.startswith("    ") and line.strip()[0] not in "^~":
                    source = line.strip()
                elif line and not line.startswith((" ", "launch:")):
                    return (f"{line} at: {source}"
                            if line == "AssertionError" and source else line)
    return None


def run(a, name, cwd, cmd, timeout):
    folder = a.work / "runs" / name
    folder.mkdir(parents=True)
    log = folder / "rank0.log"
    load_before = os.getloadavg()[0]
    with bench_lock():
        print(f"nanogpt_resume: {name}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        env = dict(os.environ, PYTHONPATH=str(a.snapshot / "python"))
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f,
                                    stderr=subprocess.STDOUT,
                                    timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        seconds = time.time() - t0
    text = log.read_text()
    evals, saves, stats, load = parse(text)
    pserver_lines = {}
    for path in sorted([log] + list((folder / "launch").glob("worker*.log"))
                       + list((folder / "launch").glob("shard*.log"))):
        found = [line for line in path.read_text().splitlines()
                 if line.startswith(("pserver:", "pserver worker", "launch:"))
                 and "diagnostic: straggler" not in line]
        if found:
            pserver_lines[path.name] = found
    out = {"name": name, "command": cmd, "cwd": str(cwd), "exit": rc,
           "seconds": round(seconds, 1),
           "load_average_before": load_before,
           "load_average_after": os.getloadavg()[0],
           "evals": evals, "saves": saves, "stats": stats,
           "load_state_dict_seconds": load,
           "printed": pserver_lines, "error": last_error(text)}
    for path in sorted((folder / "launch").glob("worker*.log")):
        text = path.read_text()
        err = last_error(text)
        if err:
            out.setdefault("worker_errors", {})[path.name] = err
        load = parse(text)[3]
        if load is not None:
            out.setdefault("load_state_dict_seconds_others", {})[
                path.name] = load
    print(f"nanogpt_resume: {name}: exit {rc}, {seconds:.0f} s, last eval "
          f"{evals[-1] if evals else None}"
          + (f", error: {out['error']}" if out["error"] else ""), flush=True)
    return out


def final_loss(r, at, metric):
    """nanoGPT's estimate_loss() val loss at iter `at` ("estimate"), or the
    final weights' loss on the whole of val.bin ("heldout")."""
    if not r or r["exit"] != 0:
        return None
    if metric == "heldout":
        h = r.get("heldout")
        return h["val_loss"] if h and h["iter"] == at else None
    return next((v for it, _, v in r["evals"] if it == at), None)


def spread(finals, full=None):
    got = [x for x in finals.values() if x is not None]
    s = {"final_val_loss": finals, "runs": len(got),
         "mean": statistics.mean(got) if got else None,
         "std": statistics.stdev(got) if len(got) > 1 else None,
         "min": min(got) if got else None, "max": max(got) if got else None}
    if full and full["min"] is not None and got:
        s["mean_within_full_range"] = full["min"] <= s["mean"] <= full["max"]
        s["seeds_within_full_range"] = sum(full["min"] <= x <= full["max"]
                                           for x in got)
        s["mean_rel_to_full"] = s["mean"] / full["mean"] - 1
        s["per_seed_rel_to_full"] = {
            k: x / full["final_val_loss"][k] - 1 for k, x in finals.items()
            if x is not None and full["final_val_loss"].get(k) is not None}
    return s


def summarize(st, runs):
    """The finals per variant and the checkpoints' cost, from the runs and
    the settings (st); --report recomputes it. A resumed variant's final is
    its first attempt that exited 0; the failed attempts are counted."""
    prefix = {"full": "full", "after": "resume_after",
              "before": "resume_before", "adamw": "adamw"}
    variants = {}
    for metric in ("estimate", "heldout"):
        out = {}
        for v in ["full"] + [x for x in st["runs"] if x != "full"]:
            if v not in st["runs"]:
                continue
            finals, failed = {}, 0
            for seed in st["seeds"]:
                attempts = [r for r in runs
                            if re.fullmatch(rf"{prefix[v]}_s{seed}(_retry\d+)?",
                                            r["name"])]
                failed += sum(r["exit"] != 0 for r in attempts)
                ok = next((r for r in attempts if r["exit"] == 0), None)
                finals[str(seed)] = final_loss(ok, st["max_iters"], metric)
            out[v] = spread(finals, out.get("full"))
            out[v]["failed_attempts"] = failed
        variants[metric] = out
    noise = []
    for v, stop in (("after", st["stop_after"]), ("before", st["stop_before"])):
        for seed in st["seeds"]:
            stopped = next((r for r in runs if r["name"] == f"stop_{v}_s{seed}"
                            and r["exit"] == 0), None)
            resumed = next((r for r in runs if re.fullmatch(
                rf"resume_{v}_s{seed}(_retry\d+)?", r["name"])
                and r["exit"] == 0), None)
            a = final_loss(stopped, stop, "estimate")
            b = next((x for it, _, x in resumed["evals"] if it == stop),
                     None) if resumed else None
            if a is not None and b is not None:
                noise.append({"variant": v, "seed": seed, "iter": stop,
                              "stopped": a, "resumed": b})

    def cost(ss, loads, others):
        if not ss:
            return None
        late = max(ss, key=lambda x: (x["iter"], x["bytes"]))
        med = lambda k: statistics.median(x[k] for x in ss)  # noqa: E731
        return {"saves": len(ss),
                "bytes_min": min(x["bytes"] for x in ss),
                "bytes_max": max(x["bytes"] for x in ss),
                "last_save": late,
                "client_state_bytes_min": min(x["client_state_bytes"]
                                              for x in ss),
                "state_dict_seconds_median": med("state_dict_seconds"),
                "state_dict_seconds_max": max(x["state_dict_seconds"]
                                              for x in ss),
                "torch_save_seconds_median": med("torch_save_seconds"),
                "torch_save_seconds_max": max(x["torch_save_seconds"]
                                              for x in ss),
                "load_state_dict_seconds": sorted(loads),
                "load_state_dict_seconds_others": sorted(others)}

    def pick(prefixes):
        chosen = [r for r in runs if r["name"].startswith(prefixes)]
        return ([x for r in chosen for x in r["saves"]],
                [r["load_state_dict_seconds"] for r in chosen
                 if r["load_state_dict_seconds"] is not None],
                [x for r in chosen for x in
                 r.get("load_state_dict_seconds_others", {}).values()])

    return {"variants": variants, "estimate_noise": noise,
            "checkpoint_pserver": cost(*pick(("full", "stop", "resume"))),
            "checkpoint_adamw_reference": cost(*pick(("adamw",)))}


def provenance(a):
    """The machine, the repository now, and the build: where it was copied
    from and the repository's state then (a copy's own provenance.json when
    --build is such a copy)."""
    cpu = next((line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo")
                if line.startswith("model name")), None)
    return {"commit": repo_state()["commit"],
            "repository_at_run": repo_state(),
            "build_copied": json.loads(
                (a.snapshot / "provenance.json").read_text()),
            "nproc": int(sh(["nproc"])), "cpu": cpu,
            "python": PYTHON,
            "torch": sh([PYTHON, "-c", "import torch; print(torch.__version__)"])}


def repo_state(package=None):
    def git(*args):
        return sh(["git", "-C", str(ROOT), *args])
    out = {"commit": git("describe", "--always", "--dirty"),
           "head": git("rev-parse", "HEAD"),
           "dirty_paths": [line for line in
                           git("status", "--porcelain").splitlines() if line]}
    if package is not None:
        same = {}
        for f in sorted(package.glob("*.py")):
            try:
                head = git("show", f"HEAD:python/pserver/{f.name}")
                same[f.name] = head == f.read_text().strip()
            except subprocess.CalledProcessError:
                same[f.name] = None
        out["python_equals_head"] = same
    return out


def snapshot_build(a):
    """Copies BUILD's pserver_server and Python package into WORK/build (the
    same layout), with provenance.json: the sources' state at the copy. A
    BUILD that is such a copy is copied with its own provenance.json."""
    server = a.build / "server" / "pserver_server"
    package = a.build / "python" / "pserver"
    if not server.is_file() or not list(package.glob("_native*.so")):
        sys.exit(f"nanogpt_resume: no {server} or no extension in {package}: "
                 "build first (tests/run.sh)")
    (a.snapshot / "server").mkdir(parents=True)
    shutil.copy2(server, a.snapshot / "server" / "pserver_server")
    shutil.copytree(package, a.snapshot / "python" / "pserver",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if (a.build / "provenance.json").is_file():
        shutil.copy2(a.build / "provenance.json", a.snapshot)
        return
    copied = {"from": str(a.build), "at": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server_sha256": sha256(server),
        "native_sha256": {p.name: sha256(p)
                          for p in package.glob("_native*.so")},
        **repo_state(package)}
    (a.snapshot / "provenance.json").write_text(json.dumps(copied, indent=1))


HELDOUT = """
import sys, numpy as np, torch
from model import GPT, GPTConfig
torch.set_num_threads(1)
c = torch.load(sys.argv[1], map_location="cpu")
m = GPT(GPTConfig(**c["model_args"]))
m.load_state_dict(c["model"])
m.eval()
data = np.memmap(sys.argv[2], dtype=np.uint16, mode="r")
t = c["model_args"]["block_size"]
n = (len(data) - 1) // t
ids = torch.from_numpy(data[:n * t + 1].astype(np.int64))
x, y = ids[:-1].view(n, t), ids[1:].view(n, t)
total = 0.0
with torch.no_grad():
    for i in range(0, n, 256):
        total += m(x[i:i + 256], y[i:i + 256])[1].item() * len(x[i:i + 256])
print(c["iter_num"], total / n)
"""


def heldout_loss(a, copy, r, out_dir):
    """The run's final weights (its ckpt.pt, saved at the eval at
    --max-iters) on the whole of val.bin in consecutive block_size
    windows: the same windows for every run, so no estimate_loss noise
    (its 40 random batches)."""
    ckpt = out_dir / "ckpt.pt"
    if r["exit"] != 0 or not ckpt.is_file():
        return
    with bench_lock():
        got = sh([PYTHON, "-c", HELDOUT, str(ckpt),
                  str(copy / "data" / DATASET / "val.bin")], cwd=copy)
    it, loss = got.split()[-2:]
    r["heldout"] = {"iter": int(it), "val_loss": float(loss)}
    print(f"nanogpt_resume: {r['name']}: whole val.bin at iter {it}: "
          f"{float(loss):.4f}", flush=True)


SKIP = ("skips from step", "asking it to skip")


def race_probe(a, ps):
    """The start of a resume, repeated: --init_from=resume from the first
    seed's stop before the freeze, fresh shards each time, on to the next
    eval (estimate_loss() draws the same batches in every trial, so equal
    training gives an equal value). Counts the starts that fail, those
    where a shard skipped ahead (its log and rank 1's say so) and the
    distinct values reached."""
    src = a.work / "out" / f"before_s{a.seeds[0]}" / "ckpt_stop.pt"
    if not src.is_file():
        return None
    until = a.stop_before + a.eval_interval
    trials = []
    for i in range(a.race_trials):
        out_dir = a.work / "out" / f"race_{i}"
        out_dir.mkdir(parents=True)
        shutil.copy2(src, out_dir / "ckpt.pt")
        r = run(a, f"race_{i}", ps, launcher(
            a, a.work / "runs" / f"race_{i}" / "launch") + ["train.py"]
            + script_args(a, a.seeds[0], until, out_dir, True)
            + ["--eval_iters=5"], 600)
        lines = [x for v in r["printed"].values() for x in v]
        trials.append({"exit": r["exit"], "error": r["error"],
                       "worker_errors": r.get("worker_errors"),
                       "skip_lines": [x for x in lines
                                      if any(k in x for k in SKIP)],
                       "val_loss": final_loss(r, until, "estimate")})
    failed = [t for t in trials if t["exit"] != 0]
    skipped = [t for t in trials if t["exit"] == 0 and t["skip_lines"]]
    clean = [t for t in trials if t["exit"] == 0 and not t["skip_lines"]]
    return {"trials": len(trials), "until": until, "failed": len(failed),
            "errors": sorted({e for t in failed for e in
                              [t["error"], *(t["worker_errors"] or {})
                               .values()] if e}),
            "skipped": len(skipped),
            "skip_lines": sorted({x for t in skipped
                                  for x in t["skip_lines"]}),
            "val_loss_clean": sorted({t["val_loss"] for t in clean}),
            "val_loss_skipped": sorted({t["val_loss"] for t in skipped}),
            "runs": trials}


def measure(a):
    a.work.mkdir(parents=True, exist_ok=True)
    a.snapshot = a.work / "build"
    snapshot_build(a)
    prov = provenance(a)
    pristine = a.work / "nanogpt"
    nanogpt_commit = nanogpt_source(a.nanogpt, pristine)
    data_log = build_data(pristine)
    all_keys = {p[0] for p in PATCHES}
    ps = patched_copy(pristine, a.work / "nanogpt_pserver", all_keys)
    ref = patched_copy(pristine, a.work / "nanogpt_reference", REFERENCE_KEYS)
    probes, runs = [], []
    if a.probes:
        for name, leave_out, extra, flags, what in PROBES:
            copy = patched_copy(pristine, a.work / "probes" / name,
                                all_keys - leave_out)
            out_dir = a.work / "out" / f"probe_{name}"
            cmd = (launcher(a, a.work / "runs" / f"probe_{name}" / "launch",
                            beta2=flags != "no-beta2")
                   + ["train.py"] + script_args(a, 1, 0, out_dir) + extra
                   + ["--eval_iters=1"])
            r = run(a, f"probe_{name}", copy, cmd, 600)
            r["what"] = what
            probes.append(r)
    for seed in a.seeds:
        out = lambda name: a.work / "out" / f"{name}_s{seed}"  # noqa: E731
        if "adamw" in a.runs:
            runs.append(run(a, f"adamw_s{seed}", ref,
                            [PYTHON, "train.py"] + script_args(
                                a, seed, a.max_iters, out("adamw")),
                            a.timeout))
            heldout_loss(a, ref, runs[-1], out("adamw"))
        if "full" in a.runs:
            name = f"full_s{seed}"
            runs.append(run(a, name, ps, launcher(
                a, a.work / "runs" / name / "launch") + ["train.py"]
                + script_args(a, seed, a.max_iters, out("full")), a.timeout))
            heldout_loss(a, ps, runs[-1], out("full"))
        for v, stop in (("after", a.stop_after), ("before", a.stop_before)):
            if v not in a.runs:
                continue
            name = f"stop_{v}_s{seed}"
            runs.append(run(a, name, ps, launcher(
                a, a.work / "runs" / name / "launch") + ["train.py"]
                + script_args(a, seed, stop, out(v)), a.timeout))
            # The stop's ckpt.pt, kept: a failed resume may have begun to
            # overwrite it (rank 0 saves at its first eval), and every
            # retry and the race probe start from it.
            ckpt = out(v) / "ckpt.pt"
            if ckpt.is_file():
                shutil.copy2(ckpt, out(v) / "ckpt_stop.pt")
            for attempt in range(1 + a.resume_retries
                                 if ckpt.is_file() else 1):
                name = f"resume_{v}_s{seed}" + (f"_retry{attempt}"
                                                 if attempt else "")
                if attempt:
                    shutil.copy2(out(v) / "ckpt_stop.pt", ckpt)
                runs.append(run(a, name, ps, launcher(
                    a, a.work / "runs" / name / "launch") + ["train.py"]
                    + script_args(a, seed, a.max_iters, out(v), True),
                    a.timeout))
                runs[-1]["attempt"] = attempt
                if runs[-1]["exit"] == 0:
                    heldout_loss(a, ps, runs[-1], out(v))
                    break
    race = race_probe(a, ps) if a.race_trials else None
    settings = {k: getattr(a, k) for k in (
        "seeds", "runs", "max_iters", "stop_after", "stop_before", "freeze",
        "warmup", "eval_interval", "eval_iters", "resume_retries",
        "race_trials")}
    return {"issue": 47, "argv": [PYTHON, "tests/bench/nanogpt_resume.py",
                                  *sys.argv[1:]],
            "what": "nanoGPT train.py's own stop and resume "
            "through pserver.launch, lm-onebit recipe, against uninterrupted "
            "runs",
            "settings": settings,
            "work": str(a.work), "nanogpt_source": str(a.nanogpt),
            "nanogpt_commit": nanogpt_commit, "data": data_log,
            "provenance": prov,
            "patches": [{"key": k, "file": f, "why": w}
                        for k, f, _, _, w in PATCHES],
            "reference_patches": sorted(REFERENCE_KEYS),
            "probes": probes, "runs": runs, "race_probe": race,
            "summary": summarize(settings, runs)}


def fmt(x, digits=4):
    return "-" if x is None else f"{x:.{digits}f}"


def report(res):
    st, su = res["settings"], res["summary"]
    out = ["# nanoGPT's own stop and resume through pserver (issue 47)", ""]
    out += [f"karpathy/nanoGPT `{(res['nanogpt_commit'] or '?')[:12]}` "
            "`train.py`, changed as `docs/python.md` tells a "
            "torch.optim.AdamW + DDP user, on 2 workers and 2 shards: "
            f"`pserver.launch --shards 2 --workers 2 --recipe "
            f"lm-onebit:{st['freeze']} --beta2=0.99`. Char-level data from "
            "the Python standard library's sources (2,000,000 characters, "
            "nanoGPT's own `prepare.py`); nanoGPT's "
            "`config/train_shakespeare_char.py` with n_layer 4, n_head 4, "
            "n_embd 128, block_size 64, batch_size 12 per worker, dropout 0, "
            f"lr 1e-3 warmup {st['warmup']} then cosine to 1e-4 at "
            f"{st['max_iters']}, eval every {st['eval_interval']} "
            f"({st['eval_iters']} batches), a checkpoint at every eval. "
            f"Stops at {st['stop_after']} (after the freeze at "
            f"{st['freeze']}) and {st['stop_before']} (before it), resumed "
            "with the same command plus `--init_from=resume` (fresh "
            "shards). Commit `" + res["provenance"]["commit"] + "`, "
            f"{res['provenance']['nproc']} cores "
            f"({res['provenance']['cpu']}), torch "
            f"{res['provenance']['torch']}.", ""]
    default = (st["runs"] == ["full", "after", "before", "adamw"]
               and st["seeds"] == [1, 2, 3])
    command = (" ".join(res["argv"]) if res.get("argv") else
               "/usr/bin/python3 tests/bench/nanogpt_resume.py "
               "/work/.mirror/karpathy+nanoGPT/repo" if default else None)
    out += [(f"Command: `{command}`" if command else
             "Command: in the notes below")
            + " ([nanogpt_resume.json](nanogpt_resume.json) holds every run).",
            ""]
    names = {"full": "uninterrupted", "after":
             f"stopped at {st['stop_after']} (after the freeze), resumed",
             "before": f"stopped at {st['stop_before']} (before the freeze), "
             "resumed", "adamw": "reference: unchanged nanoGPT, "
             "torch.optim.AdamW, 1 process"}
    titles = {"heldout": "Final weights (ckpt.pt at iter "
              f"{st['max_iters']}) on the whole of val.bin (3,124 windows of "
              "64, the same for every run):",
              "estimate": "nanoGPT's own final estimate_loss() val loss at "
              f"iter {st['max_iters']} ({st['eval_iters']} random batches "
              "of 12):"}
    for metric in ("heldout", "estimate"):
        rows = su["variants"][metric]
        out += [titles[metric], "",
                "| variant | seeds | mean ± std | range | vs uninterrupted "
                "mean | within the uninterrupted range | failed attempts |",
                "|---|---|---|---|---|---|---|"]
        for v, x in rows.items():
            within = x.get("mean_within_full_range")
            out.append(
                f"| {names[v]} | {x['runs']} | {fmt(x['mean'])} ± "
                f"{fmt(x['std'])} | {fmt(x['min'])} - {fmt(x['max'])} | "
                + ("-" if x.get("mean_rel_to_full") is None
                   else f"{100 * x['mean_rel_to_full']:+.2f}%")
                + " | " + ("-" if within is None else
                           f"{'yes' if within else 'no'} (mean; "
                           f"{x['seeds_within_full_range']} of {x['runs']} "
                           "seeds)") + f" | {x['failed_attempts']} |")
        out.append("")
        seeds = sorted({k for x in rows.values() for k in x["final_val_loss"]})
        out += ["| seed | " + " | ".join(rows) + " |",
                "|---|" + "---|" * len(rows)]
        for seed in seeds:
            out.append(f"| {seed} | " + " | ".join(
                fmt(x["final_val_loss"].get(seed)) for x in rows.values())
                + " |")
        out.append("")
    noise = su.get("estimate_noise")
    if noise:
        out += ["estimate_loss()'s own noise: the same weights (the stop's "
                "ckpt.pt) evaluated by the stopped run and again by its "
                "resume at the same iter: "
                + ", ".join(f"{n['stopped']:.4f} / {n['resumed']:.4f}"
                            for n in noise)
                + f" (mean absolute difference "
                f"{statistics.mean(abs(n['stopped'] - n['resumed']) for n in noise):.4f}).",
                ""]
    race = res.get("race_probe")
    if race:
        groups = {}
        for t in race["runs"]:
            lines = t.get("skip_lines") or []
            kind = ("refused at rank 1's construction" if t["exit"] != 0
                    else "a shard skipped ahead (its log: `pserver: shard N "
                    "skips from step 0 to ...`)"
                    if any("skips from step" in x for x in lines)
                    else "rank 1 asked a shard to skip ahead (`pserver worker "
                    "1: shard N ... is at step 0 and the others at ...; "
                    "asking it to skip to step ...`), the shard's log says "
                    "nothing more" if lines else "clean")
            groups.setdefault(kind, []).append(t)
        out += [f"The start of a resume, repeated {race['trials']} times "
                f"(rank 0's ckpt.pt from the stop at {st['stop_before']}, "
                "fresh shards each time, on to the eval at iter "
                f"{race.get('until')}, where every trial's estimate_loss() "
                "draws the same batches):", ""]
        for kind, ts in groups.items():
            vals = sorted({t["val_loss"] for t in ts
                           if t["val_loss"] is not None})
            errs = sorted({t["error"] for t in ts if t["error"]})
            out.append(f"- {len(ts)} {kind}"
                       + (": val loss " + ", ".join(fmt(x) for x in vals)
                          if vals else "")
                       + (": " + "; ".join(f"`{e}`" for e in errs)
                          if errs else ""))
        out.append("")
    copied = res["provenance"].get("build_copied")
    if copied:
        out += [f"The build: a copy of `{copied['from']}` taken at "
                f"{copied['at']}, when the repository was `{copied['commit']}`"
                f" ({len(copied['dirty_paths'])} uncommitted paths, "
                "listed in the JSON with the binaries' sha256); the harness "
                f"ran at `{res['provenance']['commit']}`.", ""]
    ck, ref = su["checkpoint_pserver"], su["checkpoint_adamw_reference"]
    if ck:
        last = ck["last_save"]
        out += [f"ckpt.pt through pserver: {ck['bytes_min']:,} to "
                f"{ck['bytes_max']:,} bytes over {ck['saves']} saves (rank "
                "0's own record grows from "
                f"{ck['client_state_bytes_min']:,} bytes at the first save "
                "as the codecs' residuals start); the last, at iter "
                f"{last['iter']}: "
                f"{last['bytes']:,} bytes, of which the shards' state "
                f"{last['shards_state_bytes']:,} and rank 0's own record "
                f"(error-feedback residuals) {last['client_state_bytes']:,}. "
                "`optimizer.state_dict()` (fetches both shards' state): "
                f"median {ck['state_dict_seconds_median']:.3f} s, max "
                f"{ck['state_dict_seconds_max']:.3f} s; `torch.save`: median "
                f"{ck['torch_save_seconds_median']:.3f} s, max "
                f"{ck['torch_save_seconds_max']:.3f} s; "
                "`optimizer.load_state_dict()` at a resume: rank 0 (installs) "
                + ", ".join(f"{x:.2f}" for x in ck["load_state_dict_seconds"])
                + " s, rank 1 (waits for it) "
                + ", ".join(f"{x:.2f}" for x in
                            ck["load_state_dict_seconds_others"]) + " s."]
    if ref:
        out += [f"The same file with torch.optim.AdamW (the reference): "
                f"{ref['bytes_min']:,} to {ref['bytes_max']:,} bytes, "
                f"`torch.save` median {ref['torch_save_seconds_median']:.3f} "
                "s."]
    out.append("")
    out += ["## The changes to nanoGPT", ""]
    for p in res["patches"]:
        out.append(f"- `{p['file']}` `{p['key']}`: {p['why']}")
    out += ["", "Launcher and config (no code): `--beta2=0.99` on the "
            "launcher (the script's beta2; the shards' default is 0.999); "
            "`--device=cpu --compile=False --dtype=float32` (torch 1.13 has "
            "no torch.compile; the CPU has no fp16 autocast, so the "
            "GradScaler stays off as in any fp32 run); "
            "`--gradient_accumulation_steps=2` (nanoGPT divides it by the "
            "world size); `--always_save_checkpoint=True` (the char config "
            "saves only when the val loss improves). The causal mask is a "
            "persistent buffer (`self.flash` is False: torch 1.13 has no "
            "scaled_dot_product_attention) and, through `module=self`, is "
            "in the layout.", ""]
    out += ["## What a user hits", ""]
    for p in res["probes"]:
        msg = p["error"] or next(iter(p.get("worker_errors", {}).values()),
                                 None)
        out.append(f"- {p['what']}: exit {p['exit']}"
                   + (f", `{msg}`" if msg else ", no error"))
    for r in res["runs"]:
        if r["exit"] != 0:
            out.append(f"- run {r['name']} FAILED: exit {r['exit']}, "
                       f"`{r['error'] or r.get('worker_errors')}`")
    said = {}
    for r in res["runs"]:
        if r["name"].startswith("resume") and r["exit"] == 0:
            for where, lines in r["printed"].items():
                for line in lines:
                    if line.startswith("pserver"):
                        said.setdefault((where, line), []).append(r["name"])
    for (where, line), names in sorted(said.items()):
        out.append(f"- {len(names)} of the resumes that ran printed "
                   f"({where}): `{line}`")
    out += [""] + res.get("notes", [])
    return "\n".join(out).rstrip() + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("nanogpt", nargs="?", default=os.environ.get("NANOGPT"),
                    help="nanoGPT checkout or bare git dir (or $NANOGPT)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--runs", nargs="+", default=["full", "after", "before",
                                                  "adamw"],
                    choices=["full", "after", "before", "adamw"])
    ap.add_argument("--max-iters", type=int, default=600)
    ap.add_argument("--stop-after", type=int, default=300)
    ap.add_argument("--stop-before", type=int, default=100)
    ap.add_argument("--freeze", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-interval", type=int, default=50)
    ap.add_argument("--eval-iters", type=int, default=40)
    ap.add_argument("--no-probes", dest="probes", action="store_false")
    ap.add_argument("--resume-retries", type=int, default=2,
                    help="runs of a failed resume again, from the stop's "
                    "ckpt.pt (each attempt is recorded)")
    ap.add_argument("--race-trials", type=int, default=30,
                    help="starts of a resume repeated to count failures")
    ap.add_argument("--timeout", type=int, default=1800,
                    help="seconds per run")
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--work", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path,
                    default=ROOT / "tests" / "bench" / "results")
    ap.add_argument("--notes", type=pathlib.Path,
                    help="a Markdown file appended to the report")
    ap.add_argument("--report", type=pathlib.Path,
                    help="remake the .md beside this .json; no runs")
    a = ap.parse_args()
    if a.report:
        res = json.loads(a.report.read_text())
        res["summary"] = summarize(res["settings"], res["runs"])
        if a.notes:
            res["notes"] = a.notes.read_text().splitlines()
        a.report.write_text(json.dumps(res, indent=1) + "\n")
        a.report.with_suffix(".md").write_text(report(res))
        return
    if not a.nanogpt:
        ap.error("give the nanoGPT checkout or bare git dir (or $NANOGPT)")
    for name in ("max_iters", "stop_after", "stop_before"):
        if getattr(a, name) % a.eval_interval:
            ap.error(f"--{name.replace('_', '-')} is {getattr(a, name)}; "
                     f"expected a multiple of --eval-interval "
                     f"{a.eval_interval} (nanoGPT evaluates and saves there)")
    if not a.stop_before < a.freeze < a.stop_after < a.max_iters:
        ap.error("expected --stop-before < --freeze < --stop-after < "
                 "--max-iters")
    a.work = a.work or pathlib.Path(
        tempfile.mkdtemp(prefix="pserver-nanogpt-resume."))
    print(f"nanogpt_resume: work folder {a.work}", flush=True)
    res = measure(a)
    if a.notes:
        res["notes"] = a.notes.read_text().splitlines()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "nanogpt_resume.json").write_text(json.dumps(res, indent=1)
                                               + "\n")
    (a.out / "nanogpt_resume.md").write_text(report(res))
    print(f"nanogpt_resume: wrote {a.out}/nanogpt_resume.json and .md",
          flush=True)


if __name__ == "__main__":
    main()
