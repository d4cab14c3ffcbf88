"""What a search returns: a frozen SearchResult, with an Explanation per collective."""

from __future__ import annotations

import dataclasses

from lagom_jax.cluster.params import CollectiveParams
from lagom_jax.costs.simulate import Timeline
from lagom_jax.program.graph import StepGraph

from .space import Structure


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why one collective got its parameters: the winner against the alternatives.

    ``task_id`` is the collective's id in ``SearchResult.graph``; ``ranks`` and ``nodes``
    size it as the cost model did, and ``default_params`` is NCCL's own choice for it.
    """

    task_id: int
    name: str
    kind: str
    nbytes: float
    ranks: int
    nodes: int
    params: CollectiveParams
    default_params: CollectiveParams
    chunks: int
    time_us: float  # the collective alone, per piece when chunked
    exposed_us: float
    reason: str


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """A strategy's choices for one step and the predicted timeline under them.

    ``graph`` is the step after the passes (combined, chunked, scheduled); ``params`` is
    keyed by its collective ids. ``structure`` holds the flag-level choices a Plan renders.
    """

    strategy: str
    hardware: str
    graph_fingerprint: str
    graph: StepGraph
    timeline: Timeline
    params: tuple[tuple[int, CollectiveParams], ...]
    structure: Structure
    evaluations: int
    search_time_s: float
    explanations: tuple[Explanation, ...]
    notes: tuple[str, ...] = ()

    @property
    def makespan_us(self) -> float:
        return self.timeline.makespan_us

    @property
    def bound_us(self) -> float:
        return self.timeline.bound_us

    @property
    def thresholds(self) -> dict[str, int]:
        return self.structure.threshold_map

    @property
    def overlap_limit(self) -> int:
        return self.structure.overlap_limit

    @property
    def param_map(self) -> dict[int, CollectiveParams]:
        return dict(self.params)


def fingerprint(graph: StepGraph) -> str:
    """Content hash of a step graph (names included: they appear in explanations)."""
    return graph.content_hash[:16]
