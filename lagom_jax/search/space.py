"""What a search may choose: the Space, the flag-level Structure, and XLA's and the recipe's.

The graph-level choices (combine thresholds, the latency-hiding scheduler, collectives in
flight, pipelined collectives, windowed einsum) are what XLA flags decide; a
``Structure`` holds one set of them and the passes turn it into a step to simulate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lagom_jax.cluster.collective_tables import measured_error
from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.passes import COMBINABLE_KINDS, DEFAULT_COMBINE_THRESHOLD_BYTES

# Threshold values lagom tries per kind: off, powers of 4 from 1 MiB, XLA's default,
# and the recipe's values.
THRESHOLD_CANDIDATES = (0, 1 << 20, 4 << 20, 16 << 20, DEFAULT_COMBINE_THRESHOLD_BYTES, 128 << 20, 1 << 30)
CHUNK_CANDIDATES = (2, 4)
# A piece below this is latency-bound on every preset (NCCL's LL/LL128 range), so
# pipelining it cannot pay for the extra launches.
MIN_CHUNK_PIECE_BYTES = 1 << 20
OVERLAP_CANDIDATES = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class Space:
    """What a strategy may choose.

    ``max_candidates`` caps the per-collective candidates (evenly over the Pareto front,
    plus NCCL's own choice) so that ``exhaustive`` stays feasible. With
    ``tune_structure=False`` every strategy keeps the recipe's structure (its combine
    thresholds, latency-hiding scheduler, one collective in flight, no pipelining) and
    only the per-collective parameters are searched.
    """

    max_candidates: int | None = None
    tune_structure: bool = True
    # Splitting one collective into pipelined pieces (passes.chunk) has no XLA flag that
    # applies it to a compiled step, so a Plan could not carry it out: off unless asked
    # for, as a what-if.
    split_collectives: bool = False
    # XLA's windowed einsum (collective matmul) as one more structure choice of lagom and
    # exhaustive; only graphs with all-gather/reduce-scatter + matmul pairs are affected.
    # Off unless asked for, as a what-if: jaxlib 0.10.2's XLA caps windowed-einsum loops
    # at the fast-interconnect slice size (dot_handler.cc, GetWindowedEinsumConfiguration),
    # which a deviceless compile leaves at 0 (GpuCompiler::CompileAheadOfTime; fixed by
    # openxla/xla 75d31665) and a real client sets to its local GPUs, so no compile here
    # can confirm that the flag applies and a step over more GPUs than one host refuses it.
    windowed_einsum: bool = False
    # The step's own flags ask for windowed einsum (threshold 0) where the compile could not
    # window (above): every structure then runs the decomposition (``passes.decompose``, XLA's
    # loop order), so the flag is priced by the same pass the search prices it with.
    windowed_by_flag: bool = False
    # lagom changes a collective's NCCL parameters only when the predicted step (or the
    # window the collective affects) gets shorter by more than this fraction of the
    # collective's own predicted time under its previous parameters: a smaller gain is
    # within the model's error on that time and could as well be a loss. None: the model's
    # measured error for a collective of that size and span (``measured_error``); 0 takes
    # any gain (what ``exhaustive`` optimises, so compare the two at 0).
    min_gain: float | None = None
    # Kinds whose combine threshold stays XLA's default in every strategy: the combine pass
    # cannot say how XLA combines them in this module (collectives the pipeliner moved get
    # combiner keys and thresholds of their own in GpuAllGatherCombiner and friends), so a
    # threshold chosen for them could compile to another module than the one predicted.
    default_combine_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_candidates is not None and self.max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1 or None, got {self.max_candidates}")
        unknown = sorted(set(self.default_combine_kinds) - set(COMBINABLE_KINDS))
        if unknown:
            raise ValueError(f"default_combine_kinds: {unknown} have no combine threshold "
                             f"(combinable: {', '.join(COMBINABLE_KINDS)})")
        if self.min_gain is not None and not 0 <= self.min_gain < 1:
            raise ValueError(f"min_gain is a fraction of a collective's time in [0, 1) or None (the "
                             f"measured error by size), got {self.min_gain}")

    def floor(self, nbytes: float, nodes: int) -> float:
        """The fraction of a collective's time a change must gain (``min_gain``)."""
        return measured_error(nbytes, nodes) if self.min_gain is None else self.min_gain


@dataclasses.dataclass(frozen=True)
class Structure:
    """The graph-level choices: what XLA flags decide."""

    thresholds: tuple[tuple[str, int], ...]
    latency_hiding: bool
    overlap_limit: int = 1
    # (collective id in the combined graph, pieces) for pipelined collectives.
    chunks: tuple[tuple[int, int], ...] = ()
    # XLA's collective matmul (``xla_gpu_threshold_for_windowed_einsum_mib``): True = 0,
    # every all-gather+matmul and matmul+reduce-scatter runs as a ring of
    # collective-permutes and partial matmuls (passes.decompose, XLA's order); False =
    # XLA's default 100000 MiB, off in practice.
    windowed_einsum: bool = False

    @property
    def threshold_map(self) -> dict[str, int]:
        return dict(self.thresholds)


def thresholds_of(values: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((k, int(values.get(k, DEFAULT_COMBINE_THRESHOLD_BYTES))) for k in COMBINABLE_KINDS)


def xla_default_structure(hw: HardwareProfile) -> Structure:
    """What XLA does with no flags: default thresholds; the latency-hiding scheduler where
    XLA runs it unasked (Hopper, ``HardwareProfile.xla_schedules_by_default``)."""
    return Structure(thresholds_of({}), latency_hiding=hw.xla_schedules_by_default)


# The published JAX-Toolbox MaxText recipe ("recommended XLA flags for MaxText" on 8xH100,
# NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md), as far as the model reads it: the
# latency-hiding scheduler on, all-reduce and all-gather combined up to 1 GiB and
# reduce-scatter up to 128 MiB. Its other flags (command buffers off, pipelined
# collectives, while-loop double buffering, combine-by-dim off, rematerialization off)
# change nothing the cost model sees.
RECIPE_STRUCTURE = Structure(
    thresholds_of({"all-reduce": 1 << 30, "all-gather": 1 << 30, "reduce-scatter": 128 << 20}),
    latency_hiding=True,
)
