"""What muster knows of torchrun: which trials get its variables (`resources.distributed_env`),
which entrypoints start it, and a free port for an attempt's rendezvous (MASTER_PORT).

The variables themselves are `muster.jobenv.Distributed`.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from pathlib import PurePath

from muster.states import DistributedEnv

__all__ = ["free_port", "launches_torchrun", "python_module", "wants_distributed_env"]

# The modules `python -m` runs as torchrun (`launch` is its deprecated older name).
TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_PYTHON = re.compile(r"python[0-9.]*")


def wants_distributed_env(setting: DistributedEnv, replicas: int,
                          entrypoint: Sequence[str]) -> bool:
    """Whether a trial's replicas get torchrun's variables (`resources.distributed_env`).

    `auto`: only a distributed trial, one of several replicas or one whose entrypoint is
    torchrun. Code like nanoGPT's takes its DDP path whenever RANK is set (and fails on a
    CPU without NCCL), and Hugging Face's Trainer wraps a model in a world-size-1 DDP.
    """
    if setting is DistributedEnv.AUTO:
        return replicas > 1 or launches_torchrun(entrypoint)
    return setting is DistributedEnv.ALWAYS


def launches_torchrun(argv: Sequence[str]) -> bool:
    """Whether `argv` starts torchrun: `torchrun ...`, or `python -m torch.distributed.run`
    (or `.launch`) with any python (`python3`, `python3.11`, an absolute path)."""
    if not argv:
        return False
    program = PurePath(argv[0]).name
    if program == "torchrun":
        return True
    return _PYTHON.fullmatch(program) is not None and python_module(argv[1:]) in TORCHRUN_MODULES


def python_module(args: Sequence[str]) -> str | None:
    """The module `python ARGS` runs with `-m` (after options, `-u -m`, `-Bm`, `-mNAME`);
    None for a script, `-c` or stdin."""
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--check-hash-based-pycs":  # python's one long option with a value
            rest = rest[1:]
            continue
        if not arg.startswith("-") or arg in ("-", "--"):
            return None
        if arg.startswith("--"):
            continue
        for at, letter in enumerate(arg[1:], start=2):
            if letter in "mcWX":  # the options that take a value: here, or the next word
                value = arg[at:] or (rest.pop(0) if rest else "")
                if letter == "m":
                    return value or None
                if letter == "c":
                    return None
                break
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now, for MASTER_PORT (one per attempt)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
