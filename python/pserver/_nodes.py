"""pserver.launch on several machines (--nnodes N): the launchers meet
through torch's own TCPStore on the rendezvous endpoint (node 0 hosts it,
as torchrun's c10d rendezvous does), publish the shards they started and
learn everyone else's, and tell each other when something fails or when
their workers are done. Keys, all under "pserver/":
  node/<r>    the hostname of node r (it joined)
  shard/<i>   shard i's address, HOST:PORT
  failed/<r>  why node r stopped the job (one line)
  done/<r>    node r's workers all exited 0 (or, elastic, left the job)
  left/<r>    node r saw every node done and stops (node 0, hosting the
              store, stops after them), or left the job (elastic)
  departed/<r> a counter: how many times node r left the job (elastic)
  reclaimed/<r> "G:TOKEN": the launcher that took rank r again after its
              G-th departure (compare_set makes the claim atomic)
  beat/<r>    a counter node r adds 1 to every 0.2 s from a thread of its
              own (with its own connection to the store), whatever the
              launcher is doing (starting shards may take longer than the
              timeout): one that stops moving for --heartbeat-timeout
              seconds is a machine that died without a word, and stops the
              job on the others
"""

import datetime
import os
import shlex
import socket
import sys
import threading
import time

_POLL = 0.2
_CLOSE_TIMEOUT = 5.0  # seconds close() waits for the heartbeat thread


class Elsewhere(RuntimeError):
    """Another node stopped the job."""


def command_for_others(argv):
    """The launcher's command line for the other machines: this one's with
    --node-rank I in place of its own."""
    out, i = [], 0
    while i < len(argv) and argv[i].startswith("--") and argv[i] != "--":
        a = argv[i]
        take = 1 if "=" in a else 2
        if a.split("=", 1)[0].replace("_", "-") != "--node-rank":
            out += argv[i:i + take]
        i += take
    return (f"{shlex.join([sys.executable, '-m', 'pserver.launch'])} "
            f"--node-rank <I> {shlex.join([*out, *argv[i:]])}")


def local_address(host, port):
    """The address this machine reaches HOST:PORT from: what the other
    machines can reach its shards at (127.0.0.1 for a loopback endpoint)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # UDP: nothing is sent
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


class Node:
    """This machine's part in a job of `nnodes` machines. Raises
    RuntimeError with one line naming what is missing or what failed."""

    def __init__(self, nnodes, rank, host, port, join_timeout,
                 heartbeat_timeout=15.0, min_nodes=None):
        # Imported here: a one-machine launch needs no torch.
        import torch.distributed as dist
        self.nnodes, self.rank = nnodes, rank
        # Elastic (--nnodes MIN:MAX): nodes 0..MIN-1 start the job; the
        # others may join it later, and leave it.
        self.min_nodes = nnodes if min_nodes is None else min_nodes
        self.endpoint = f"{host}:{port}"
        self.join_timeout = join_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self._heard = {}  # node -> (its beat, when it last moved, here)
        self._gone = set()  # elastic nodes that went silent
        self._host, self._port = host, port
        self._beating = None  # the heartbeat thread, once joined
        self._quiet = threading.Event()  # set by close()
        try:
            self.store = dist.TCPStore(
                host, port, None, rank == 0,
                datetime.timedelta(seconds=join_timeout),
                wait_for_workers=False)
        except RuntimeError as e:
            what = ("could not host the store" if rank == 0 else
                    f"could not reach node 0's store within "
                    f"{join_timeout:g} s (is node 0 started?)")
            raise RuntimeError(f"node {rank}: {what} at {self.endpoint}: "
                               f"{str(e).splitlines()[0]}") from None

    # torch 1.13's TCPStore has no check(): a counter beside each key says
    # it is there (add of 0 reads it without waiting).
    def _has(self, key):
        return self.store.add(f"pserver/set/{key}", 0) > 0

    def _get(self, key):
        return self.store.get(f"pserver/{key}").decode()

    def _set(self, key, value):
        self.store.set(f"pserver/{key}", value)
        self.store.add(f"pserver/set/{key}", 1)

    def _await(self, keys, what, alive=None):
        """Until every key in `keys` (a dict key -> name) exists; a failure
        elsewhere or the join deadline raises, naming what is missing."""
        deadline = time.monotonic() + self.join_timeout
        while True:
            missing = [name for key, name in keys.items() if not self._has(key)]
            if not missing:
                return
            self.check_others()
            if alive is not None:
                alive()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"node {self.rank}: {what} missing after "
                    f"{self.join_timeout:g} s (--join-timeout): "
                    f"{', '.join(missing)} ({self.nnodes} nodes; the store "
                    f"at {self.endpoint})")
            time.sleep(_POLL)

    def join(self, claimed=False):
        """Joins the job. An elastic rank whose machine left the job is
        taken again (unless claim_rank already took it: `claimed`); the
        others then wait for it at the end again."""
        again = (self.rank >= self.min_nodes and
                 self._has(f"left/{self.rank}"))
        if not again and self._has(f"node/{self.rank}"):
            if self._beating_elsewhere():
                raise RuntimeError(
                    f"node {self.rank}: another launcher holds rank "
                    f"{self.rank} in this job (it joined from "
                    f"{self._get(f'node/{self.rank}')}); expected each "
                    "machine its own --node-rank")
            print(f"launch: node {self.rank} joins the job again (its "
                  "machine stopped answering)", file=sys.stderr, flush=True)
        if again and not claimed and not reclaim(self.store, self.rank):
            raise RuntimeError(
                f"node {self.rank}: another machine took rank {self.rank} "
                "again after it left the job; expected one launcher per "
                "rank (or --node-rank auto)")
        self._beating = threading.Thread(target=self._beat, daemon=True)
        self._beating.start()
        if again:
            # A beat first: the others must not take the old silence for
            # this machine's once the rank counts as present again.
            self.store.add(f"pserver/beat/{self.rank}", 1)
            for key in (f"done/{self.rank}", f"left/{self.rank}"):
                self.store.delete_key(f"pserver/set/{key}")
            print(f"launch: node {self.rank} joins the job again (its "
                  "machine left it before)", file=sys.stderr, flush=True)
        self._set(f"node/{self.rank}", socket.gethostname())
        starting = sorted({*range(self.min_nodes), self.rank})
        self._await({f"node/{r}": f"node {r}" for r in starting}, "launchers")

    def _beating_elsewhere(self):
        """Whether a launcher of this rank still beats (its counter moves
        within heartbeat_timeout): a second launcher of a live rank, not a
        machine that vanished and is started again."""
        key = f"pserver/beat/{self.rank}"
        seen = self.store.add(key, 0)
        deadline = time.monotonic() + self.heartbeat_timeout
        while time.monotonic() < deadline:
            time.sleep(_POLL)
            if self.store.add(key, 0) != seen:
                return True
        return False

    def _beat(self):
        # A connection of its own: TCPStore's client is not for two threads.
        import torch.distributed as dist
        try:
            store = dist.TCPStore(self._host, self._port, None, False,
                                  datetime.timedelta(seconds=30))
            while not self._quiet.is_set():
                store.add(f"pserver/beat/{self.rank}", 1)
                self._quiet.wait(_POLL)
        except RuntimeError:
            return  # the store is gone: the main thread says so

    def close(self):
        """Stops the heartbeat and waits for its thread. Called before the
        launcher exits: a daemon thread still inside a TCPStore call when
        the interpreter shuts down is torn down by pthread_exit through
        C++ frames, which aborts the process."""
        self._quiet.set()
        if self._beating is not None:
            self._beating.join(timeout=_CLOSE_TIMEOUT)

    def shards(self, first, addrs, total, per_node, alive):
        """Publishes this node's shards (indices first, first + 1, ...) and
        returns every shard's address in index order."""
        for k, a in enumerate(addrs):
            self._set(f"shard/{first + k}", a)
        self._await({f"shard/{i}": f"shard {i} (node {i // per_node})"
                     for i in range(total)}, "shards", alive)
        return [self._get(f"shard/{i}") for i in range(total)]

    def check_others(self):
        """Raises Elsewhere when another node stopped the job,
        went silent for heartbeat_timeout seconds (before it was done), or
        node 0's store is gone."""
        try:
            for r in range(self.nnodes):
                if r == self.rank:
                    continue
                if self._has(f"failed/{r}"):
                    raise Elsewhere(f"node {r} stopped the job: "
                                    f"{self._get(f'failed/{r}')}")
                self._listen(r)
        except Elsewhere:
            raise
        except RuntimeError as e:
            if self.rank == 0:
                raise
            raise Elsewhere(
                f"node 0's store at {self.endpoint} stopped answering (node "
                f"0 died or is unreachable): {str(e).splitlines()[0]}"
            ) from None

    def _listen(self, r):
        beat, now = self.store.add(f"pserver/beat/{r}", 0), time.monotonic()
        last = self._heard.get(r)
        if last is None or beat != last[0]:
            self._heard[r] = (beat, now)
            if r in self._gone and last is not None:
                self._gone.discard(r)  # started again (Node.join)
                print(f"launch: node {r} answers again: it is in the job",
                      file=sys.stderr, flush=True)
        elif (now - last[1] > self.heartbeat_timeout and beat > 0
              and not self._has(f"left/{r}") and r not in self._gone):
            if r >= self.min_nodes:
                # Elastic: it hosts no shards; its workers are dropped when
                # their leases run out, and the others go on.
                self._gone.add(r)
                print(f"launch: node {r} stopped answering for "
                      f"{self.heartbeat_timeout:g} s (--heartbeat-timeout); "
                      "it holds no shards: the others go on without it",
                      file=sys.stderr, flush=True)
                return
            raise Elsewhere(
                f"node {r} stopped answering: its launcher has not been "
                f"heard from for {self.heartbeat_timeout:g} s "
                "(--heartbeat-timeout; the machine died or lost the "
                "network)")

    def fail(self, why):
        """Tells every node this one stops the job (best effort: the store
        may be gone)."""
        try:
            self._set(f"failed/{self.rank}", why.splitlines()[0])
        except RuntimeError:
            pass

    def finish(self, alive):
        """This node's workers are done: waits until every node's are (its
        shards serve them meanwhile), then leaves; node 0, hosting the
        store, leaves last."""
        self._set(f"done/{self.rank}", "1")
        while not all(self._has(f"done/{r}") for r in self._members()):
            self.check_others()
            alive()
            time.sleep(_POLL)
        self._set(f"left/{self.rank}", "1")
        if self.rank != 0:
            return
        deadline = time.monotonic() + 10
        while (time.monotonic() < deadline and
               not all(self._has(f"left/{r}") for r in self._members())):
            time.sleep(_POLL)

    def _members(self):
        """The nodes that joined (all of them, unless elastic)."""
        return [r for r in range(self.nnodes)
                if r < self.min_nodes or (self._has(f"node/{r}") and
                                          r not in self._gone)]

    def depart(self):
        """Elastic: this node's workers left the job; the others go on
        without it, and do not wait for it at the end."""
        try:
            self._set(f"done/{self.rank}", "1")
            self._set(f"left/{self.rank}", "1")
            # Last: a claimer that sees the departure sees it left.
            self.store.add(f"pserver/departed/{self.rank}", 1)
        except RuntimeError:
            pass


def reclaim(store, rank):
    """Takes elastic rank `rank` again after its machine's last departure:
    True for exactly one caller per departure (compare_set on
    reclaimed/<rank>, whose value names the departure and the taker)."""
    left = store.add(f"pserver/departed/{rank}", 0)
    if left == 0:
        return False
    key = f"pserver/reclaimed/{rank}"
    absent = "?"  # compare_set answers the expected value for a missing key
    now = store.compare_set(key, absent, absent).decode()
    if now != absent and int(now.split(":", 1)[0]) >= left:
        return False  # someone took it after this departure
    mine = f"{left}:{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
    return store.compare_set(key, "" if now == absent else now,
                             mine).decode() == mine


def claim_rank(host, port, nnodes, join_timeout):
    """--node-rank auto: the next unclaimed rank 1..nnodes-1, an atomic
    counter in node 0's store, for machines that cannot tell their index (a
    scaled Compose service); once every rank was claimed, a rank whose
    machine left the job (elastic, SIGTERM) is claimed again. Returns
    (rank, whether it is taken again). Raises RuntimeError with one
    line."""
    import torch.distributed as dist
    try:
        store = dist.TCPStore(host, port, None, False,
                              datetime.timedelta(seconds=join_timeout))
        rank = store.add("pserver/claimed", 1)
        if rank >= nnodes:
            for r in range(1, nnodes):
                if reclaim(store, r):
                    return r, True
    except RuntimeError as e:
        raise RuntimeError(f"--node-rank auto: could not reach node 0's store "
                           f"at {host}:{port} within {join_timeout:g} s (is "
                           f"node 0 started?): {str(e).splitlines()[0]}") \
            from None
    if rank >= nnodes:
        raise RuntimeError(f"--node-rank auto: ranks 1..{nnodes - 1} are all "
                           f"claimed and none has left the job (this machine "
                           f"asked for claim {rank}); expected at most "
                           f"{nnodes - 1} --node-rank auto machines in the "
                           "job at once (a rank is given out again once its "
                           "machine leaves on SIGTERM)")
    return rank, False


def torchrun_env(node, node_opts):
    """torchrun's GROUP_RANK, MASTER_ADDR and MASTER_PORT, for a script's
    own torch.distributed.init_process_group() (env://), which a DDP
    script keeps. One machine (node None): a free local port, where the
    script's rank 0 hosts the store. Several: node 0's store, which every
    rank joins as torchrun's workers join its agent's
    (TORCHELASTIC_USE_AGENT_STORE; the script's keys go under
    /worker/attempt_0, apart from the launchers' pserver/)."""
    if node is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return dict(GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port))
    return dict(GROUP_RANK=str(node.rank), MASTER_ADDR=node_opts["host"],
                MASTER_PORT=str(node_opts["port"]),
                TORCHELASTIC_USE_AGENT_STORE="True",
                TORCHELASTIC_RESTART_COUNT="0")


def local_store():
    """A TCPStore on loopback, any free port (its .port): where a machine's
    workers form their group with one push per machine."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
