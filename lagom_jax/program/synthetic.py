"""Synthetic StepGraphs for tests and benchmarks of the passes and the search.

Real step graphs come from HLO; these are seeded stand-ins whose shape follows the
training steps the search is meant for: a chain of compute tasks (one compute stream),
each collective produced by one compute task and consumed a few tasks later, so that it
can overlap the compute in between. ``intensity`` sets how much compute sits beside each
byte of communication: below 1 the step is communication-bound, above 1 compute-bound,
around 1 the two contend.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from .graph import COLLECTIVE_KINDS, StepGraph, Task

# ~400 dense bf16 TFLOP/s of compute against ~200 GB/s of collective bus bandwidth on an
# 8-GPU NVLink host (orders of magnitude from NVIDIA's A100/H100 datasheets and published
# nccl-tests all-reduce busBw): one byte of communication takes about as long as 2000 FLOPs.
FLOPS_PER_COMM_BYTE = 2000.0
# Arithmetic intensities (FLOP per HBM byte) of the compute tasks: memory-bound
# elementwise, attention-like, GEMM-like.
_ARITHMETIC_INTENSITIES = (20.0, 120.0, 400.0)


def random_graph(
    n_collectives: int,
    *,
    seed: int = 0,
    intensity: float = 1.0,
    kinds: Sequence[str] = COLLECTIVE_KINDS,
    min_bytes: float = 64 * 1024,
    max_bytes: float = 256 * 1024 * 1024,
    max_gap: int = 3,
    num_devices: int = 8,
    name: str | None = None,
) -> StepGraph:
    """A seeded chain of compute tasks with ``n_collectives`` collectives overlapping it.

    Collective sizes are log-uniform in [min_bytes, max_bytes]; each waits for one compute
    task and is consumed 1..max_gap compute tasks later.
    """
    if n_collectives < 0 or max_gap < 1 or intensity <= 0 or not 0 < min_bytes <= max_bytes:
        raise ValueError(
            f"random_graph: need n_collectives >= 0, max_gap >= 1, intensity > 0 and "
            f"0 < min_bytes <= max_bytes (got {n_collectives}, {max_gap}, {intensity}, {min_bytes}, {max_bytes})"
        )
    unknown = sorted(set(kinds) - set(COLLECTIVE_KINDS))
    if unknown or not kinds:
        raise ValueError(f"random_graph: unknown kinds {unknown} (known: {', '.join(COLLECTIVE_KINDS)})")
    rng = random.Random(seed)
    group = (tuple(range(num_devices)),)
    ring = tuple((d, (d + 1) % num_devices) for d in range(num_devices))
    n_compute = n_collectives + max_gap + 1
    sizes = [
        math.exp(rng.uniform(math.log(min_bytes), math.log(max_bytes))) for _ in range(n_collectives)
    ]
    mean_bytes = sum(sizes) / len(sizes) if sizes else min_bytes
    # Producer of collective i is compute task i; its consumer is i + gap.
    coll_kind = [rng.choice(list(kinds)) for _ in range(n_collectives)]
    gaps = [rng.randint(1, max_gap) for _ in range(n_collectives)]

    tasks: list[Task] = []
    compute_id: list[int] = []
    waiting_on: dict[int, list[int]] = {}  # compute index -> collective task ids it consumes
    for j in range(n_compute):
        flops = mean_bytes * FLOPS_PER_COMM_BYTE * intensity * rng.uniform(0.5, 1.5)
        deps = ([compute_id[-1]] if compute_id else []) + waiting_on.pop(j, [])
        tid = len(tasks)
        tasks.append(
            Task(
                id=tid,
                name=f"fusion.{j}",
                kind="compute",
                flops=flops,
                bytes=flops / rng.choice(_ARITHMETIC_INTENSITIES),
                dtype="bf16",
                opcode="fusion",
                deps=tuple(sorted(deps)),
            )
        )
        compute_id.append(tid)
        if j < n_collectives:
            kind = coll_kind[j]
            cid = len(tasks)
            tasks.append(
                Task(
                    id=cid,
                    name=f"{kind}.{j}",
                    kind=kind,  # type: ignore[arg-type]
                    bytes=float(int(sizes[j])),
                    dtype="bf16",
                    opcode=kind,
                    deps=(tid,),
                    groups=() if kind == "collective-permute" else group,
                    pairs=ring if kind == "collective-permute" else (),
                    is_async=True,
                )
            )
            waiting_on.setdefault(min(j + gaps[j], n_compute - 1), []).append(cid)
    return StepGraph(
        name=name or f"random-n{n_collectives}-s{seed}-i{intensity:g}",
        tasks=tuple(tasks),
        num_devices=num_devices,
    )


def benchmark_graphs(n_collectives: int = 24, *, seed: int = 0) -> dict[str, StepGraph]:
    """The named graphs the search is compared on, from communication- to compute-bound.

    * ``comm-bound``: little compute beside large collectives;
    * ``contended``: compute and communication of similar length, where the channels a
      collective takes slow the compute it overlaps;
    * ``compute-bound``: plenty of compute to hide communication behind;
    * ``many-small``: many small all-reduces (data-parallel gradients), where combining
      matters more than per-call tuning;
    * ``fsdp``: all-gathers and reduce-scatters of similar size at balanced intensity.
    """
    specs = {
        "comm-bound": dict(intensity=0.3),
        "contended": dict(intensity=1.0),
        "compute-bound": dict(intensity=4.0),
        "many-small": dict(intensity=1.0, kinds=("all-reduce",), min_bytes=16 * 1024, max_bytes=1024 * 1024),
        "fsdp": dict(intensity=1.5, kinds=("all-gather", "reduce-scatter"), min_bytes=8 << 20, max_bytes=64 << 20),
    }
    return {
        name: random_graph(n_collectives, seed=seed + i, name=name, **spec)  # type: ignore[arg-type]
        for i, (name, spec) in enumerate(specs.items())
    }
