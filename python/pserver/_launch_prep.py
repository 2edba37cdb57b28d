"""What pserver.launch checks and prepares before it starts any process: the
pserver_server binary, the extension in the script's interpreter, the
workers' environment, the recipe's flags and schedule, and the job's
checkpoint folders. Each check raises UsageError (one line; the launcher
exits 2) with nothing started."""

import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess

from pserver import _BUILD_NATIVE, recipes

JOB_FILE = "job.json"
_SHARD_FOLDER = re.compile(r"shard-(\d+)")


class UsageError(Exception):
    pass


def find_server(explicit):
    """The pserver_server binary to run; raises UsageError when none."""
    candidates = [explicit] if explicit else [
        os.environ.get("PSERVER_SERVER_BIN"),
        # build/python/pserver/ -> build/server/pserver_server
        str(pathlib.Path(__file__).resolve().parents[2] / "server" /
            "pserver_server"),
        shutil.which("pserver_server")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise UsageError(f"no pserver_server at {explicit}" if explicit else
                     "no pserver_server found; build it (ninja -C build "
                     "pserver_server_bin), pass --server-bin or set "
                     "PSERVER_SERVER_BIN")


def worker_env(workers):
    """The environment every worker starts from (each adds its rank): this
    package on PYTHONPATH, and OMP_NUM_THREADS=1 as torchrun sets it when
    more than one process shares the machine and the caller set none (each
    would otherwise start a thread per core). Returns (env, notice or
    None)."""
    package_root = str(pathlib.Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in path if p and p != package_root]))
    if workers > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"
        return env, (f"OMP_NUM_THREADS=1 for each of the {workers} workers "
                     "(unset, as torchrun sets it; set it to choose another "
                     "value)")
    return env, None


def check_native(python, env, script):
    """Raises UsageError unless `python` imports the extension
    pserver._native with `env` (the workers' PYTHONPATH): a build of the
    daemons alone (deploy/local.sh) has none, and every rank would die.
    `-c` puts the current folder first on sys.path where a script puts
    its own folder: the check puts the script's folder there, so that a
    pserver package in the launcher's cwd does not pass for one the
    workers see."""
    folder = os.path.dirname(os.path.abspath(script))
    probe = f"import sys; sys.path[0] = {folder!r}; import pserver._native"
    try:
        p = subprocess.run([python, "-c", probe], env=env,
                           stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=120)
    except OSError as e:
        raise UsageError(f"--python {python}: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{python} -c 'import pserver._native' did not "
                         "finish in 120 s") from None
    if p.returncode == 0:
        return
    lines = p.stderr.decode(errors="replace").strip().splitlines()
    why = lines[-1] if lines else f"exit status {p.returncode}"
    raise UsageError(
        f"{python} cannot import pserver._native, the extension the workers "
        f"need ({why}; PYTHONPATH={env.get('PYTHONPATH', '')}); build it "
        f"from the repository's root: {_BUILD_NATIVE}, then run with "
        "PYTHONPATH=build/python")


def check_recipe_flags(chosen, server_flags):
    """The recipe's schedule switches codecs at its freeze: a --schedule or
    --freeze_step of the user's would break that agreement (a recipe
    without a schedule sets the codecs: a --schedule would change them)."""
    recipe, _ = chosen
    for f in server_flags:
        flag, _, value = f.partition("=")
        if flag == "--schedule":
            what = ("writes its own schedule" if recipe.freezes else
                    "sets the codecs, a schedule would change them")
            raise UsageError(
                f"{f} with --recipe {recipe.name}: the recipe {what}; drop "
                "--schedule, or drop --recipe and give the shards and "
                "workers your schedule")
        if flag == "--freeze_step" and recipe.freezes:
            raise UsageError(
                f"{f} with --recipe {recipe.name}: the recipe's schedule "
                "switches codecs at its freeze; use --recipe "
                f"{recipe.name}:{value if value.isdigit() else 'F'} "
                "instead")


def apply_recipe(opts, run_dir):
    """Writes the recipe's schedule into run_dir, puts its shard flags
    before the user's (pserver_server, an absl binary, takes the last of a
    repeated flag, so the user's win) and sets opts["client_options"].
    Returns the line to print."""
    recipe, freeze = opts["recipe"]
    path = None
    if recipe.freezes:
        path = (pathlib.Path(run_dir) /
                f"recipe_{recipe.name}.txtpb").resolve()
        path.write_text(recipe.schedule_text(freeze))
    flags = recipe.shard_flags(freeze, path)
    opts["server_flags"] = flags + opts["server_flags"]
    opts["client_options"] = recipe.client_options(path)
    if not recipe.freezes:
        return f"recipe {recipe.name}: {' '.join(flags)}"
    return f"recipe {recipe.name} (freeze {freeze}): {' '.join(flags)}"


def shard_folder(root, i):
    """Shard i's --checkpoint_dir under the launcher's --checkpoint-dir."""
    return os.path.join(root, f"shard-{i}")


def prepare_checkpoints(root, shards, workers):
    """Checks that the folder `root` is this job's (or new), then creates
    root/shard-<i> for every shard and, on the first start, root/job.json
    with the shard and worker counts. Returns (root as an absolute path, a
    descriptor holding an exclusive flock on the folder: whoever holds a
    copy of it, the launcher or a shard given it, keeps a second job out).
    Raises UsageError, having changed nothing but creating an absent root,
    for a folder in use by a running job, one that holds checkpoint files
    itself (one folder for every shard: each shard refuses the others'
    files on restart), another job's shard folders, or a job.json of other
    counts (every shard's checkpoint would be refused)."""
    root = os.path.abspath(root)
    job_path = os.path.join(root, JOB_FILE)
    if os.path.exists(root) and not os.path.isdir(root):
        raise UsageError(f"--checkpoint-dir {root} is not a folder")
    os.makedirs(root, exist_ok=True)
    lock = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise UsageError(
            f"--checkpoint-dir {root} is in use by a running job (its "
            "launcher or its shards); stop it first, or give another "
            "folder") from None
    try:
        _check_folder(root, job_path, shards, workers)
    except BaseException:
        os.close(lock)
        raise
    for i in range(shards):
        os.makedirs(shard_folder(root, i), exist_ok=True)
    if not os.path.exists(job_path):
        tmp = job_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"shards": shards, "workers": workers}, f)
            f.write("\n")
        os.replace(tmp, job_path)
    return root, lock


def _check_folder(root, job_path, shards, workers):
    names = sorted(os.listdir(root))
    loose = [n for n in names
             if n.startswith("ckpt-") and n.endswith(".pserver")]
    if loose:
        raise UsageError(
            f"--checkpoint-dir {root} holds checkpoint files itself "
            f"({loose[-1]}): a shard's own folder, or one every shard wrote "
            "into; the launcher keeps shard i's in <folder>/shard-<i>: give "
            "it a new folder (a shard's own files may move to shard-<i> of "
            "a new folder)")
    job = _read_job(job_path) if JOB_FILE in names else None
    if job is not None and job != {"shards": shards, "workers": workers}:
        raise UsageError(
            f"{job_path}: the job in this folder has {job['shards']} shards "
            f"and {job['workers']} workers, this one {shards} shards and "
            f"{workers} workers; resume it with --shards {job['shards']} "
            f"--workers {job['workers']}, or give another --checkpoint-dir")
    for n in names:
        m = _SHARD_FOLDER.fullmatch(n)
        if m and int(m.group(1)) >= shards:
            raise UsageError(
                f"--checkpoint-dir {root} holds {n}/, a folder of a job with "
                f"more than {shards} shards (this one has shard-0.."
                f"shard-{shards - 1}); give this job another folder")


def _read_job(path):
    try:
        job = json.loads(pathlib.Path(path).read_text())
        ok = (isinstance(job, dict) and set(job) == {"shards", "workers"} and
              all(type(v) is int and v >= 1 for v in job.values()))
    except (OSError, ValueError) as e:
        ok, job = False, e
    if not ok:
        raise UsageError(f"{path} is not a pserver.launch job file ({job}); "
                         'expected {"shards": N, "workers": N}')
    return job


def describe_restore(root, logs):
    """One line on what each shard found in its folder, from the lines the
    daemon logs before it listens ("restored step N from ...", "no usable
    checkpoint in ..."; "refused checkpoint ..." for each file it passed
    over)."""
    parts = []
    for i, log in enumerate(logs):
        try:
            text = pathlib.Path(log).read_text(errors="replace")
        except OSError:
            text = ""
        m = re.search(r"restored step (\d+) from", text)
        what = f"step {m.group(1)}" if m else "fresh"
        refused = text.count("refused checkpoint ")
        if refused:
            what += f" ({refused} files refused: {log})"
        parts.append(f"shard {i} {what}")
    return (f"checkpoints in {shard_folder(root, '<i>')} for shard i; "
            + ", ".join(parts))
