"""The chaos soak's training script (benchmarks/soak.py copies it into its context).

Every process writes numbered records that `soak_checks.py` reads back from its log:

    @@soak <token> <n> <length> <payload>\\n      record n of this process (0, 1, 2, ...)
    @@soak <token> end <count>\\n                 its work is done: records 0..count-1 came first

`<token>` is `<pid>.<start ticks>`, the process's identity as muster records it (the shim's
`child_pid`/`child_start_ticks`), so a fault the soak sent to a process names its records.
A payload is `<token>:<n>|` repeated to `<length>` bytes: a record cut short shows. Most
records go to stdout, every fifth to stderr (one pipe: the log keeps their order); some are
long (2 KB; 8 KB in plain runs, which no other thread writes into, so a SIGKILL can cut one
mid-write).

It trains for `--epochs` epochs of `--steps` steps, one record per step and a pause between
steps, and says what it saw per epoch: through the harness (`--harness`: samples, training
and validation `loss`, a checkpoint a epoch on rank 0, resuming after the latest one) or,
plain, as an `epoch E rank R samples=N` line that `verify.samples_from_log` reads. The
ranks of a multi-rank run meet after each epoch, as DDP's collectives make them (marks in
their shared working directory, records written while they wait), and rank 0 waits at the
end until every other rank has finished, so its exit 0 stands for the whole attempt.

A process whose pipe breaks (its shim was SIGKILLed) leaves `soak-wrote-<token>` in its
working directory: how many records it wrote (the pipe may have held the last of them).

Faults built in: `--drop F` reports a fraction F fewer samples than it trained (the silent
loss that verification must catch), `--exit N` exits N after its last epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

PREFIX = b"@@soak "
WROTE = "soak-wrote-"  # + token: the records a process wrote before its pipe broke
BARRIER_S = 120.0  # rank 0 gives up on the other ranks after this long (exit 5)


def own_token() -> str:
    stat = Path("/proc/self/stat").read_text()
    start_ticks = stat.rpartition(")")[2].split()[19]
    return f"{os.getpid()}.{start_ticks}"


def payload(token: str, number: int, length: int) -> bytes:
    """Record `number`'s payload of process `token`: `<token>:<number>|` over and over."""
    unit = f"{token}:{number}|".encode()
    return (unit * (length // len(unit) + 1))[:length]


def record(token: str, number: int, long_bytes: int) -> bytes:
    """Record `number` of process `token`, its newline included; every 41st is long."""
    length = long_bytes if number % 41 == 40 else 24 + (number * 7) % 48
    return PREFIX + b"%s %d %d %s\n" % (token.encode(), number, length,
                                          payload(token, number, length))


def end_record(token: str, count: int) -> bytes:
    return PREFIX + b"%s end %d\n" % (token.encode(), count)


class Records:
    """This process's numbered records, written straight to fds 1 and 2."""

    def __init__(self, token: str, long_bytes: int) -> None:
        self.token = token
        self.long_bytes = long_bytes
        self.count = 0

    def write(self) -> None:
        n = self.count
        self._write(2 if n % 5 == 4 else 1, record(self.token, n, self.long_bytes))
        self.count += 1

    def say(self, text: str) -> None:
        """A line of its own, not a record (what `verify.samples_from_log` reads)."""
        self._write(1, f"{text}\n".encode())

    def end(self) -> None:
        self._write(1, end_record(self.token, self.count))

    def _write(self, fd: int, data: bytes) -> None:
        """Write all of `data`. When the pipe has no reader any more (the shim was
        SIGKILLed), say in the working directory how many records were written, and go."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except BrokenPipeError:
            with contextlib.suppress(OSError):
                Path(f"{WROTE}{self.token}").write_text(str(self.count))
            os._exit(3)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4, help="samples a rank sees a step")
    parser.add_argument("--pause", type=float, default=0.1)
    parser.add_argument("--harness", action="store_true")
    parser.add_argument("--drop", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    return parser.parse_args()


def rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("MUSTER_RANK", "0")), int(os.environ.get("MUSTER_WORLD_SIZE", "1"))


def scale() -> float:
    """The search's hyperparameter (1.0 outside a search)."""
    path = os.environ.get("MUSTER_HPARAMS")
    hparams = json.loads(Path(path).read_text()) if path else {}
    return float(hparams.get("scale", 1.0))


def seen(args: argparse.Namespace) -> int:
    """Samples this rank says it saw in a step (fewer than it trained with `--drop`)."""
    return args.batch - round(args.batch * args.drop)


def train_plain(args: argparse.Namespace, records: Records) -> None:
    rank, _ = rank_and_world()
    for epoch in range(1, args.epochs + 1):
        for _ in range(args.steps):
            records.write()
            time.sleep(args.pause)
        records.say(f"epoch {epoch} rank {rank} samples={seen(args) * args.steps}")
        meet(f"epoch-{epoch}", args, records)


def train_harness(args: argparse.Namespace, records: Records) -> None:
    import muster.harness as mh

    rank, _ = rank_and_world()
    with mh.init() as ctx:
        ctx.plan(epochs=args.epochs)
        latest = ctx.checkpoint.restore()
        first = 1 if latest is None else int(latest.metadata.get("epoch", 0)) + 1
        for epoch in range(first, args.epochs + 1):
            step = (epoch - 1) * args.steps
            for _ in range(args.steps):
                records.write()
                ctx.samples.seen(seen(args), epoch=epoch)
                if rank == 0:
                    ctx.report_training(step, {"loss": scale() / (step + 1)})
                step += 1
                time.sleep(args.pause)
            # Every rank's counts on disk before rank 0's checkpoint says the epoch is done
            # (as muster.harness.torch.save does): a rank killed just after it would leave
            # the epoch short for good (docs/how-to/ddp.md).
            try:
                ctx.samples.flush()
            except OSError as exc:  # a full disk: the harness's thread tries again
                records.say(f"samples not flushed yet: {exc}")
            meet(f"epoch-{epoch}", args, records)
            if rank == 0:
                ctx.report_validation(step - 1, {"loss": scale() / step})
                with ctx.checkpoint.save(step - 1, metadata={"epoch": epoch}) as path:
                    (path / "state.json").write_text(json.dumps({"epoch": epoch}))
            if ctx.should_stop():
                return


def mark(name: str, rank: int) -> Path:
    """The mark `name` of rank `rank` of this attempt, in the shared working directory."""
    return Path(f"soak-{name}-attempt-{os.environ.get('MUSTER_ATTEMPT', '1')}-rank-{rank}")


def wait_for(name: str, ranks: range, args: argparse.Namespace, records: Records) -> None:
    """Wait, writing, until every rank of `ranks` has left mark `name` (exit 5 after
    BARRIER_S: a peer that never comes)."""
    deadline = time.monotonic() + BARRIER_S
    while not all(mark(name, r).exists() for r in ranks):
        if time.monotonic() > deadline:
            sys.exit(5)
        records.write()
        time.sleep(args.pause)


def meet(name: str, args: argparse.Namespace, records: Records) -> None:
    """Every rank waits for all the others here (a DDP step's collective): no rank runs an
    epoch ahead, and a checkpoint rank 0 saves after it holds every rank's epoch."""
    rank, world = rank_and_world()
    if world > 1:
        leave_mark(name, rank, args, records)
        wait_for(name, range(world), args, records)


def leave_mark(name: str, rank: int, args: argparse.Namespace,
               records: Records | None) -> None:
    """Leave the mark, trying again while the disk is full (writing records meanwhile, if
    given): DDP's collectives need no disk, and a run that stopped here would be the
    soak's doing, not muster's."""
    deadline = time.monotonic() + BARRIER_S
    while True:
        try:
            mark(name, rank).touch()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            if records is not None:
                records.write()
            time.sleep(args.pause)


def main() -> None:
    args = parse_args()
    records = Records(own_token(), 2048 if args.harness else 8192)
    (train_harness if args.harness else train_plain)(args, records)
    rank, world = rank_and_world()
    if rank:  # its end record first: a rank hit before it never let rank 0 pass
        records.end()
        leave_mark("done", rank, args, None)
    else:
        wait_for("done", range(1, world), args, records)
        records.end()
    sys.exit(args.exit)


if __name__ == "__main__":
    main()
