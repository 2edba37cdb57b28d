"""Leaving a running job when told to stop. A spot or preemptible machine
gets SIGTERM with its notice (30 s to 2 min). With leave_on_sigterm (on by
default under `pserver.launch --nnodes MIN:MAX`, which sets
PSERVER_ELASTIC=1), the signal only sets a flag; the optimizer's next round
boundary (the end of step(), or of synchronize() with local steps) takes
the worker out of the rounds on every shard (Client.leave: the shards go on
without it at once and do not count it as dropped) and raises
SystemExit(0), so the script's `finally:` blocks and atexit handlers run.
Without it SIGTERM ends the process as usual, and the shards drop the
worker when its lease runs out."""

import os
import signal
import sys
import threading

ELASTIC_ENV = "PSERVER_ELASTIC"


class Leaver:
    def __init__(self, enabled, node_group):
        if enabled is None:
            enabled = os.environ.get(ELASTIC_ENV, "") == "1"
        if enabled not in (True, False):
            raise ValueError(f"leave_on_sigterm is {enabled!r}; expected "
                             "True, False or None (the launcher's choice)")
        self.enabled = enabled
        self.asked = None  # the signal's name, once one came
        if not enabled:
            return
        if node_group is not None:
            raise ValueError(
                "leave_on_sigterm with one push per machine (node_group): a "
                "machine's workers cannot leave a running job yet; expected "
                "leave_on_sigterm=False, or one push per worker")
        if threading.current_thread() is not threading.main_thread():
            raise ValueError(
                "leave_on_sigterm needs the optimizer made on the main "
                "thread (Python sets signal handlers there); expected "
                "leave_on_sigterm=False on other threads")
        signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum, _frame):
        self.asked = signal.Signals(signum).name
        # A second SIGTERM ends the process as usual (no step() may come).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def at_boundary(self, opt):
        """Leaves and exits 0 if a signal came; else nothing."""
        if self.asked is None:
            return
        step = opt.client.leave()
        print(f"pserver: worker {opt._where['worker_id']} left the job at "
              f"step {step} ({self.asked}); the shards go on without it",
              file=sys.stderr, flush=True)
        raise SystemExit(0)
