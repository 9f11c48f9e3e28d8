"""`core_context.distributed`: who this rank is, and Determined's object collectives.

Determined moves pickled objects between ranks over ZMQ sockets of its own. Here they move
over torch.distributed's object collectives (`all_gather_object`, `gather_object`,
`broadcast_object_list`) on gloo groups made for them, so they work beside NCCL training and
need no port: a job of more than one rank initialises torch.distributed's default process
group first (`dist.init_process_group`, as Determined's PyTorch tutorial does), then makes
its `DistributedContext`, on every rank in step (making it is a collective). A job of one
rank needs no torch at all.

The rank, size and node numbers come from torchrun's variables, which muster sets for each
rank of a distributed trial (`muster.jobenv.Distributed`): RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE (the Ray launcher's nodes; 0 of 1 on one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from muster.jobenv import (
    GROUP_RANK,
    GROUP_WORLD_SIZE,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    RANK,
    WORLD_SIZE,
)

from .._unprovided import unprovided

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# Determined's defaults for its ZMQ ports: accepted, and unused here.
_PUB_PORT = 12360
_PULL_PORT = 12365


class Topology(TypedDict):
    """Where a rank is: `DistributedContext`'s numbers."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


class DistributedContext:
    """This rank's place in the job, and collectives of picklable objects between ranks.

    The collectives are not a replacement for the training framework's own; every rank
    (of the node, for the `_local` ones) calls each one in step. `chief_ip`, `pub_port`,
    `pull_port`, `port_offset` and `force_tcp` configure Determined's sockets and are
    ignored: torch.distributed's rendezvous already connects the ranks.

    Raises:
        ValueError: the numbers do not describe a job (a rank outside its size...), or do
            not match torch.distributed's default process group.
        RuntimeError: more than one rank, and torch.distributed is not initialised.
    """

    def __init__(self, *, rank: int, size: int, local_rank: int, local_size: int,
                 cross_rank: int, cross_size: int, chief_ip: str | None = None,
                 pub_port: int = _PUB_PORT, pull_port: int = _PULL_PORT,
                 port_offset: int = 0, force_tcp: bool = False) -> None:
        check_topology(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                       cross_rank=cross_rank, cross_size=cross_size)
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size
        self._world: _Channel | None = None
        self._local: _Channel | None = None
        self._closed = False
        if size > 1:
            self._world, self._local = _open_channels(self)

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """This rank as torchrun's variables describe it (muster sets them for each rank).

        Raises:
            ValueError: RANK or WORLD_SIZE is missing, a variable is malformed, or the
                ranks span nodes and GROUP_WORLD_SIZE does not say how many.
        """
        return cls(**topology_from_environ(os.environ))

    @classmethod
    def from_deepspeed(cls, chief_ip: str | None = None) -> DistributedContext:
        """As `from_torch_distributed`: a DeepSpeed script's ranks get torchrun's
        variables from muster, not Determined's DeepSpeed launcher's."""
        return cls.from_torch_distributed(chief_ip)

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: str | None = None) -> DistributedContext:
        raise unprovided("DistributedContext.from_horovod", "Horovod is not supported; "
                         "train with torch.distributed and use from_torch_distributed()")

    @classmethod
    def from_tf_config(cls) -> tuple[DistributedContext, Any]:
        raise unprovided("DistributedContext.from_tf_config",
                         "TensorFlow's multi-worker training is not supported")

    def get_rank(self) -> int:
        return self.rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_size(self) -> int:
        return self.size

    def get_num_agents(self) -> int:
        """How many nodes the job spans."""
        return self.cross_size

    def allgather(self, stuff: Any) -> list[Any]:
        """Every rank's `stuff`, by rank, on every rank."""
        return self._channel(self._world).allgather(stuff) if self.size > 1 else [stuff]

    def gather(self, stuff: Any) -> list[Any] | None:
        """Every rank's `stuff`, by rank, on the chief (rank 0); None on the others."""
        return self._channel(self._world).gather(stuff) if self.size > 1 else [stuff]

    def broadcast(self, stuff: Any) -> Any:
        """The chief's `stuff` on every rank (what the others pass is ignored)."""
        return self._channel(self._world).broadcast(stuff) if self.size > 1 else stuff

    def allgather_local(self, stuff: Any) -> list[Any]:
        """As `allgather`, among the ranks of this node, by local rank."""
        return self._channel(self._local).allgather(stuff) if self.local_size > 1 else [stuff]

    def gather_local(self, stuff: Any) -> list[Any] | None:
        """As `gather`, to this node's chief (local rank 0)."""
        return self._channel(self._local).gather(stuff) if self.local_size > 1 else [stuff]

    def broadcast_local(self, stuff: Any = None) -> Any:
        """As `broadcast`, from this node's chief (local rank 0)."""
        return self._channel(self._local).broadcast(stuff) if self.local_size > 1 else stuff

    def close(self) -> None:
        """Let go of the gloo groups made for the collectives (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for channel in (self._local, self._world):
            if channel is not None:
                channel.close()

    def _channel(self, channel: _Channel | None) -> _Channel:
        if self._closed or channel is None:
            raise RuntimeError("this DistributedContext is closed (its core.init() block "
                               "has ended); its collectives cannot be used any more")
        return channel


class DummyDistributedContext(DistributedContext):
    """A job of one rank."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                         cross_size=1)


def check_topology(*, rank: int, size: int, local_rank: int, local_size: int,
                   cross_rank: int, cross_size: int) -> None:
    """Refuse numbers that cannot describe one rank of a job.

    Raises:
        TypeError: one is not an int.
        ValueError: one is out of range, or one node's ranks are not the whole job.
    """
    given = {"rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size,
             "cross_rank": cross_rank, "cross_size": cross_size}
    for name, value in given.items():
        if type(value) is not int:
            raise TypeError(f"DistributedContext: {name} must be an int, got {value!r}")
    for index, count, what in (("rank", "size", "the job"),
                               ("local_rank", "local_size", "the node"),
                               ("cross_rank", "cross_size", "the nodes")):
        if not 0 <= given[index] < given[count] <= size:
            raise ValueError(f"DistributedContext: {index} must be in [0, {count}) and {count} "
                             f"at most size, for {what}, but got {index}={given[index]}, "
                             f"{count}={given[count]}, size={size}")
    if cross_size == 1 and local_size != size:
        raise ValueError(f"DistributedContext: on one node (cross_size=1) local_size must "
                         f"equal size, but got local_size={local_size}, size={size}")


def topology_from_environ(environ: Mapping[str, str]) -> Topology:
    """`DistributedContext`'s numbers from torchrun's variables.

    LOCAL_RANK and LOCAL_WORLD_SIZE default to RANK and WORLD_SIZE, GROUP_RANK to 0; the
    number of nodes is GROUP_WORLD_SIZE, or 1 where the node holds every rank.

    Raises:
        ValueError: RANK or WORLD_SIZE is missing, a value is not an integer, or the ranks
            span nodes and GROUP_WORLD_SIZE is not set.
    """
    rank = _integer(environ, RANK, None)
    size = _integer(environ, WORLD_SIZE, None)
    local_size = _integer(environ, LOCAL_WORLD_SIZE, size)
    cross_size = _integer(environ, GROUP_WORLD_SIZE, 1 if local_size == size else None)
    return Topology(rank=rank, size=size, local_rank=_integer(environ, LOCAL_RANK, rank),
                    local_size=local_size, cross_rank=_integer(environ, GROUP_RANK, 0),
                    cross_size=cross_size)


def node_ranks(everyone: Sequence[tuple[int, int]], cross_size: int) -> dict[int, list[int]]:
    """Each node's ranks in local-rank order, from every rank's (cross_rank, local_rank).

    Raises:
        ValueError: the nodes are not 0..cross_size-1, or a node's local ranks are not
            0..n-1, once each.
    """
    nodes: dict[int, dict[int, int]] = {}
    for rank, (cross_rank, local_rank) in enumerate(everyone):
        node = nodes.setdefault(cross_rank, {})
        if local_rank in node:
            raise ValueError(f"DistributedContext: ranks {node[local_rank]} and {rank} are "
                             f"both local rank {local_rank} of node {cross_rank}")
        node[local_rank] = rank
    if sorted(nodes) != list(range(cross_size)):
        raise ValueError(f"DistributedContext: the ranks name nodes {sorted(nodes)}, but "
                         f"cross_size is {cross_size}")
    for number, node in nodes.items():
        if sorted(node) != list(range(len(node))):
            raise ValueError(f"DistributedContext: node {number}'s local ranks are "
                             f"{sorted(node)}; they must be 0..n-1")
    return {number: [node[i] for i in sorted(node)] for number, node in sorted(nodes.items())}


class _Channel:
    """Object collectives over one gloo group. `order` lists the group's ranks in the order
    results are given (by rank, or by local rank), its first the chief, who gathers and
    sends."""

    def __init__(self, group: ProcessGroup, order: list[int], owned: bool) -> None:
        self._group = group
        self._order = order
        self._owned = owned  # made here (not torch's default group): let go at close

    def allgather(self, stuff: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * len(self._order)
        dist.all_gather_object(out, stuff, group=self._group)
        return [out[i] for i in self._order]

    def gather(self, stuff: Any) -> list[Any] | None:
        import torch.distributed as dist

        chief = dist.get_rank(self._group) == self._order[0]
        out: list[Any] | None = [None] * len(self._order) if chief else None
        dist.gather_object(stuff, out, group=self._group, group_dst=self._order[0])
        return None if out is None else [out[i] for i in self._order]

    def broadcast(self, stuff: Any) -> Any:
        import torch.distributed as dist

        box = [stuff]
        dist.broadcast_object_list(box, group=self._group, group_src=self._order[0])
        return box[0]

    def close(self) -> None:
        import torch.distributed as dist

        if self._owned and dist.is_initialized():
            dist.destroy_process_group(self._group)


def _open_channels(context: DistributedContext) -> tuple[_Channel, _Channel | None]:
    """The job's channel and the node's (None for a node of one rank), on gloo groups.

    A collective of every rank: each makes the same groups in the same order.
    """
    import torch.distributed as dist

    _check_initialised(context)
    if dist.get_backend() == "gloo":
        world, owned = dist.group.WORLD, False
    else:
        world, owned = dist.new_group(backend="gloo"), True
    assert world is not None  # every rank is in it
    job = _Channel(world, list(range(context.size)), owned)
    nodes = node_ranks(job.allgather((context.cross_rank, context.local_rank)),
                       context.cross_size)
    mine = nodes[context.cross_rank]
    if len(mine) != context.local_size:
        raise ValueError(f"DistributedContext: local_size is {context.local_size}, but node "
                         f"{context.cross_rank} runs ranks {mine}")
    if context.cross_size == 1:
        return job, _Channel(world, mine, owned=False) if len(mine) > 1 else None
    local: _Channel | None = None
    for number, ranks in nodes.items():
        group = dist.new_group(ranks=ranks, backend="gloo")  # every rank makes every group
        if number == context.cross_rank and len(ranks) > 1:
            assert group is not None  # this rank is in it
            # A group numbers its ranks in the order of their global ranks.
            local = _Channel(group, [sorted(ranks).index(r) for r in ranks], owned=True)
    return job, local


def _check_initialised(context: DistributedContext) -> None:
    """Refuse a job of several ranks without torch.distributed's default group, or whose
    numbers are not that group's."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"a DistributedContext of {context.size} ranks needs torch.distributed's default "
            "process group: call torch.distributed.init_process_group() on every rank first "
            "(muster's collectives use torch.distributed, not Determined's sockets)")
    if (dist.get_rank(), dist.get_world_size()) != (context.rank, context.size):
        raise ValueError(
            f"DistributedContext: rank {context.rank} of {context.size} does not match "
            f"torch.distributed's rank {dist.get_rank()} of {dist.get_world_size()}")


def _integer(environ: Mapping[str, str], name: str, default: int | None) -> int:
    raw = environ.get(name)
    if not raw:
        if default is None:
            raise ValueError(_missing(name))
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _missing(name: str) -> str:
    if name == GROUP_WORLD_SIZE:
        return (f"{GROUP_WORLD_SIZE} is not set, and the ranks span nodes (LOCAL_WORLD_SIZE < "
                "WORLD_SIZE): set it to the number of nodes, or make the DistributedContext "
                "with cross_size yourself")
    return (f"{name} is not set: muster sets torchrun's variables for each rank of a "
            "distributed trial (resources.replicas > 1, resources.distributed_env)")
