"""pserver.launch's usage text: what --help prints (the launcher is
python/pserver/launch.py, its command line python/pserver/_launch_args.py)."""

USAGE = """Run a training script on a local pserver cluster, like torchrun.

    /usr/bin/python3 -m pserver.launch [--shards 2] [--workers 4]
        [launcher options] [pserver_server flags] script.py [script args]

Starts the shards (pserver_server on 127.0.0.1, a free port each, reported
through --port_file), waits until every one listens, then starts the workers:
`python3 script.py args` once per rank with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE and PSERVER_SERVERS set (what pserver.init() reads),
GROUP_RANK, MASTER_ADDR and MASTER_PORT as torchrun sets them (a script's
own torch.distributed.init_process_group() works unchanged), and
PYTHONPATH extended so the script imports this package (checked first: the
script's interpreter must import pserver._native), and OMP_NUM_THREADS=1
with more than one worker if unset (as torchrun). Rank 0's output goes
to the terminal; every other process writes to a log in the run folder
(printed in part when it fails).

It stops everything it started when the workers finish, when a worker or a
shard fails (the other ranks are stopped), and on Ctrl-C or SIGTERM; it exits
with the script's status: 0 when every rank exited 0, else the first failing
rank's code (128 + signal when a signal ended it; 130/143 when the launcher
itself was interrupted/terminated); 2 for bad arguments, or when the checks
before anything starts fail (no extension, another job's checkpoints).

Launcher options:
  --shards N          shards to start (default 2)
  --workers N         worker processes (default 4)
  --server-bin PATH   pserver_server to run (default: $PSERVER_SERVER_BIN, the
                      build tree's build/server/pserver_server, then PATH)
  --run-dir DIR       logs and the pid list (default: a new /tmp/pserver-run-*)
  --python PATH       interpreter for the script (default: this one)
  --start-timeout S   seconds a shard gets to listen (default 30)
  --checkpoint-dir D  (or --checkpoint_dir) checkpoints of shard i in
                      D/shard-<i> (pserver_server --checkpoint_dir; write
                      one every N rounds with --checkpoint-every N, default
                      100, and at the stop); the same command again resumes
                      every shard from its newest. D/job.json holds the
                      shard and worker counts: other counts are refused, as
                      are a D another running job uses, one with
                      ckpt-*.pserver files in it and one with a shard-<j>
                      folder for j >= --shards
  --recipe NAME[:F]   a measured compression recipe for language models
                      (pserver/recipes.py): lm-onebit or lm-topk, with 1-bit
                      Adam's variance frozen at round F (default 300 for
                      lm-onebit, 200 for lm-topk; freeze at two to three
                      times the learning rate's warmup), or lm-local (local
                      steps: the script runs 16 steps of its own optimizer
                      between pushes, DistributedOptimizer local_steps=16
                      with an inner_optimizer; another H with your
                      --local_steps=H). Writes its schedule, if it
                      has one, to <run dir>/recipe_NAME.txtpb, puts its
                      shard flags before yours (a flag you give again wins:
                      the daemon takes the last one) and gives the workers
                      PSERVER_CLIENT_OPTIONS, a JSON object of pserver.Client
                      options that DistributedOptimizer uses for those the
                      script does not pass. Not with --schedule, nor
                      with --freeze_step for lm-onebit and lm-topk (use
                      NAME:F).
  --nnodes N          machines in the job (default 1); with N > 1 run the
                      same command on each machine with its own
                      --node-rank I (0..N-1; node 0 prints the command).
                      MIN:MAX (elastic, torchrun's spelling): nodes
                      0..MIN-1 start the job and host its shards; nodes
                      MIN..MAX-1 may join it while it runs (the same
                      command, started later) and leave it: SIGTERM to
                      such a node's launcher (a spot notice) makes its
                      workers leave at their next round and exit 0 while
                      the others go on. WORLD_SIZE is MAX*G; the rounds'
                      mean is over the workers present (docs/launch.md).
                      SIGTERM to nodes 0..MIN-1, and Ctrl-C anywhere,
                      stop the job. Not with --push-per node.
  --node-rank I       this machine's place (auto: the next unclaimed one,
                      1..N-1, from node 0's store, then one whose machine
                      left the job on SIGTERM); its workers are ranks
                      I*G..I*G+G-1 (RANK, LOCAL_RANK, GROUP_RANK,
                      LOCAL_WORLD_SIZE, WORLD_SIZE, MASTER_ADDR and
                      MASTER_PORT set as torchrun sets them)
  --nproc-per-node G  workers on this machine (the same on each; one
                      machine: the same as --workers)
  --rdzv-endpoint H:P node 0's address and a free port, the same on every
                      machine: node 0 hosts torch's TCPStore there, where
                      the launchers publish their shards and learn the
                      others' (also --master-addr H --master-port P; the
                      environment's PET_NNODES, PET_NODE_RANK,
                      PET_NPROC_PER_NODE, PET_RDZV_ENDPOINT, PET_MASTER_ADDR
                      and PET_MASTER_PORT when an option is not given)
  --shards-per-node K shards on each machine beside its workers (default 1;
                      shard indices I*K..I*K+K-1)
  --node-addr A       the address the other machines reach this one's
                      shards at (default: the one this machine reaches the
                      endpoint from)
  --join-timeout S    seconds to wait for every machine's launcher and
                      shards (default 300); then every launcher exits 1
                      naming the missing ones. A failure on any machine
                      (a rank exiting non-zero, a shard, Ctrl-C) stops the
                      job on all of them, each naming where it started.
  --heartbeat-timeout S  a machine whose launcher has not been heard from
                      for S seconds (default 15: it died, or lost the
                      network) stops the job on the others, named
                      Not with --shards, --workers or --checkpoint-dir.
  --push-per P        worker (default: each pushes) or node: a machine's
                      workers average inside it (gloo over loopback) and
                      local rank 0 pushes once for them (pserver/_node.py)
  --                  ends the options; the script comes next
Every other option before the script is a pserver_server flag given to every
shard, as --name=value or --name value (dashes become underscores:
--pull-codec onebit is --pull_codec=onebit); boolean flags need =true/false.
The launcher sets --listen, --port_file, --shard_index, --num_shards and
--num_workers itself, and --metrics_listen= (off) and --drain_seconds=0
unless given. --metrics-listen HOST:PORT gives shard i the port PORT + i
(PORT 0: any free port each); the launcher prints each shard's metrics URL.
"""
