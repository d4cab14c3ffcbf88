"""StepGraph: the tasks of one training step, in schedule order.

A StepGraph is what every later stage works on: the passes rewrite it, the simulator
replays it on a HardwareProfile, the search evaluates candidates on it. It is built from
the entry computation of an HLO module (``from_module``) and holds only what the cost
model needs: FLOPs and bytes of compute, kind / bytes / groups of collectives, and the
data dependencies between them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
CollectiveKind = Literal[
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"
]
TaskKind = Literal[
    "compute", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"
]


@dataclasses.dataclass(frozen=True)
class Task:
    """One unit of work on one device.

    ``bytes`` follows NCCL's ``nBytes`` convention for collectives: the buffer size for
    all-reduce, all-to-all and collective-permute; the *total* (gathered) size for
    all-gather and the total (unscattered) input size for reduce-scatter. For compute
    tasks it is the bytes read plus written.
    """

    id: int
    name: str
    kind: TaskKind
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = ""
    opcode: str = ""
    deps: tuple[int, ...] = ()
    # Product of the known trip counts of the enclosing while loops (1 at top level).
    # When loops are unrolled each copy keeps this number and gets its ``iteration``.
    trip_count: int = 1
    iteration: int = 0
    # Collectives only.
    groups: tuple[tuple[int, ...], ...] = ()
    # collective-permute: (source, target) pairs.
    pairs: tuple[tuple[int, int], ...] = ()
    # Where the compiled schedule waited for this collective: the id of the first task
    # after its ``-done`` (async pairs), or None when the HLO gives no such point.
    done_before: int | None = None
    # Whether XLA emitted it as an async pair (``*-start``/``*-done`` or ``async-start``).
    is_async: bool = False

    @property
    def is_collective(self) -> bool:
        return self.kind != "compute"

    @property
    def group_size(self) -> int:
        if self.groups:
            return len(self.groups[0])
        if self.pairs:
            return 2
        return 1

    def crosses_nodes(self, gpus_per_node: int) -> bool:
        """Whether any group (or permute pair) spans devices on different nodes."""
        if gpus_per_node <= 0:
            raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node}")
        sets = list(self.groups) + [tuple(p) for p in self.pairs]
        return any(len({d // gpus_per_node for d in g}) > 1 for g in sets)

    def nodes_spanned(self, gpus_per_node: int) -> int:
        """The largest number of distinct nodes any one group touches (1 if none)."""
        if gpus_per_node <= 0:
            raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node}")
        sets = list(self.groups) + [tuple(p) for p in self.pairs]
        return max((len({d // gpus_per_node for d in g}) for g in sets), default=1)


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """Tasks in schedule order; ``tasks[i].id == i`` and deps point backwards."""

    name: str
    tasks: tuple[Task, ...]
    num_devices: int = 1

    def __post_init__(self) -> None:
        for i, t in enumerate(self.tasks):
            if t.id != i:
                raise ValueError(f"task {t.name!r} has id {t.id}, expected {i}")
            bad = [d for d in t.deps if not 0 <= d < i]
            if bad:
                raise ValueError(f"task {t.name!r} (id {i}) depends on later/unknown tasks {bad}")

    @property
    def collectives(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.is_collective)

    @property
    def compute_tasks(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if not t.is_collective)

    @property
    def total_flops(self) -> float:
        return sum(t.flops for t in self.tasks)

    @functools.cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """``consumers[i]``: ids of the tasks that depend on task i, ascending."""
        out: list[list[int]] = [[] for _ in self.tasks]
        for t in self.tasks:
            for d in t.deps:
                out[d].append(t.id)
        return tuple(tuple(c) for c in out)
