"""The command line of train_gpt.py: its flags, their defaults and help,
and the checks that refuse contradictory ones. train_gpt.parse_args calls
parse_args here with the script's description."""

import argparse

POWERSGD_RANK = 4  # --ddp powersgd: matrix_approximation_rank


def parse_args(argv=None, description=None):
    """argv's flags (default sys.argv[1:]) as an argparse.Namespace; flags
    that contradict each other exit with argparse's usage error."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--pserver", action="store_true",
                   help="train through pserver.torch.DistributedOptimizer "
                   "(run under python3 -m pserver.launch)")
    p.add_argument("--ddp", choices=("fp32", "fp16", "powersgd"), default="",
                   help="train with torch DistributedDataParallel over gloo "
                   "(run under torchrun, or with RANK, WORLD_SIZE, "
                   "MASTER_ADDR and MASTER_PORT set), the gradients averaged "
                   "by this comm hook: fp32 default_hooks.allreduce_hook, "
                   "fp16 default_hooks.fp16_compress_hook, powersgd "
                   f"powerSGD_hook of rank {POWERSGD_RANK} from step "
                   "--warmup (one bucket)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16,
                   help="global batch (windows per step, over all workers)")
    p.add_argument("--size", choices=("default", "bench", "small"),
                   default="default",
                   help="gpt.GPTConfig() (1.85M parameters), "
                   "GPTConfig.bench() (1.03M) or GPTConfig.small() (121K)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--clip", type=float, default=1.0,
                   help="max gradient norm (0: no clipping)")
    p.add_argument("--clip-scope", choices=("worker", "mean"),
                   default="worker",
                   help="with --pserver: clip each worker's gradient "
                   "(clip_grad_norm_ in the script) or the round's mean on "
                   "the shards, as DDP (clip_scope='mean')")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--corpus-dir", default="/usr/lib/python3.11")
    p.add_argument("--max-bytes", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=0,
                   help="rank 0 also evaluates every N steps (the other "
                   "workers wait meanwhile)")
    p.add_argument("--eval-batches", type=int, default=20,
                   help="validation batches of 32 windows")
    p.add_argument("--stop-at-loss", type=float, default=0.0, metavar="X",
                   help="end the run at the first evaluation (--eval-every, "
                   "or the final one) whose validation loss is <= X: rank 0 "
                   "writes --json (reached: true, with the step and "
                   "train_seconds) and exits 0 at once. With --ddp every "
                   "rank stops there too (rank 0 broadcasts its decision "
                   "after each evaluation). With --pserver the other "
                   "workers cannot be told: they wait for rank 0's next "
                   "push until the shards' lease drops it, then train on "
                   "without it, so whoever started them should stop them "
                   "when rank 0 exits (tests/bench/time_to_loss.sh does). "
                   "0: off")
    p.add_argument("--max-seconds", type=float, default=0.0, metavar="S",
                   help="end the run, as --stop-at-loss does but with "
                   "reached: false, at the first evaluation after S seconds "
                   "of training (train_seconds: rank 0's evaluations not "
                   "counted). 0: off")
    p.add_argument("--json", default="", help="rank 0 writes the run here")
    p.add_argument("--weights-sha256", default="", metavar="FILE",
                   help="every rank writes the SHA-256 of its final "
                   "parameters here (hex; each rank its own FILE): equal "
                   "files mean the ranks ended with one model")
    ps = p.add_argument_group("with --pserver")
    ps.add_argument("--push-codec", default="",
                    help="the workers' push codec (fp32, bf16, quantize, "
                    "onebit, topk, ...; default: a pserver.launch recipe's, "
                    "else fp32)")
    ps.add_argument("--warmup-codec", default="",
                    help="push codec before 1-bit Adam's freeze (default: "
                    "the client's)")
    ps.add_argument("--k-fraction", type=float, default=0.0,
                    help="topk: the fraction kept (default: the client's)")
    ps.add_argument("--bits", type=int, default=0,
                    help="quantize: bits per value (default: the client's)")
    ps.add_argument("--local-steps", type=int, default=1,
                    help="H > 1: DiLoCo, H steps of the script's AdamW on "
                    "each worker (the inner optimizer, with the schedule and "
                    "clipping), then the weight change is pushed and the "
                    "shards' optimizer (the outer one, e.g. --optimizer sgd "
                    "--nesterov=true --lr 0.7) steps")
    ps.add_argument("--outer-momentum", type=float, default=None,
                    metavar="BETA",
                    help="with --local-steps: each worker keeps the outer "
                    "(Nesterov) momentum and pushes its step, compressed "
                    "with error feedback; run the shards with plain SGD "
                    "(--optimizer sgd --momentum 0)")
    ps.add_argument("--state-file", default="", metavar="PATH",
                    help="a restartable worker: its optimizer.state_dict() "
                    "(error-feedback residuals) is written here every "
                    "--state-every steps and loaded at start when present. "
                    "Whether or not it is given, a worker that (re)starts "
                    "while the shards are at step N resumes there, its "
                    "schedule and batches at step N")
    ps.add_argument("--state-every", type=int, default=50, metavar="N")
    ps.add_argument("--client-option", action="append", default=[],
                    metavar="KEY=VALUE",
                    help="another pserver.Client option (e.g. block_size=64, "
                    "ef_decay=0.9), repeatable")
    args = p.parse_args(argv)
    if args.pserver and args.ddp:
        p.error(f"--ddp {args.ddp} and --pserver exclude each other: the "
                "gradients go either to DDP's allreduce or to pserver's "
                "shards; give one")
    if not args.pserver and (args.local_steps != 1 or args.client_option or
                             args.state_file):
        p.error("--local-steps, --client-option and --state-file need "
                "--pserver")
    if args.outer_momentum is not None and not (args.pserver and
                                                args.local_steps > 1):
        p.error("--outer-momentum needs --pserver and --local-steps > 1")
    if args.state_every < 1:
        p.error(f"--state-every is {args.state_every}; expected >= 1")
    if args.stop_at_loss < 0 or args.max_seconds < 0:
        p.error("--stop-at-loss and --max-seconds must be >= 0 (0: off)")
    if (args.stop_at_loss or args.max_seconds) and args.eval_every <= 0:
        p.error("--stop-at-loss and --max-seconds are checked at each "
                "evaluation; give --eval-every N too")
    return args
