"""Measured collective times inside one node, and the ratio that anchors the model to them.

NCCL's own cost model (which ``cost`` follows) is optimistic for small and mid-size
collectives: against XLA's measured tables for 8 H100 and 8 B200 and the nccl-tests logs
of 8 A100 it predicts 10-60% too little below 64 MiB (``benchmarks/collective_fidelity``).
XLA itself does not use a formula there: its collective interpolator
(openxla/xla ``xla/service/gpu/model/collective_interpolator.cc``) reads the time from a
table measured per GPU. This module does the same for the default parameters and keeps
the model for what the table cannot say (other algorithms, protocols, channel counts):

    time(params) = model(params) x measured(default) / model(default)

so the search still ranks the candidates of one collective by the model, and the time of
NCCL's own choice is the measurement. ``ratio`` is that last factor, interpolated in log
size between the measured sizes and held at the largest one above them; below the
smallest measured size a collective is pure latency and takes the smallest one's time.

The tables (``data/collective_times.csv``, sources in its header): NCCL all-reduce on 2/4/8
A100 SXM (nccl-tests); XLA's all-reduce, all-gather, reduce-scatter and all-to-all on
groups of 2/4/8 of 8 H100 and of 8 B200. What transfers and what does not:

* a group size without rows takes the nearest measured group (log distance);
* a collective-permute takes the ratio of the all-to-all whose message to each peer is the
  permute's (``ranks`` times its size) where the table has it: NCCL has no all-to-all kernel,
  XLA runs one as a group of sends and receives (one pair a peer, NCCL's point-to-point
  documentation), and a permute is one such pair, so the all-to-all rows measure the
  point-to-point machinery a permute runs on (openxla/xla PR #11182's 25.2 MB permute over 8
  H100, 445 us measured: 491 us so, 760 us at the all-reduce's ratio);
* any other kind without rows on that GPU (on A100: everything but all-reduce) takes the
  all-reduce ratio at the size with the same bus bytes (half the size);
* groups spanning nodes are not corrected: the only multi-node measurements (A100 over
  Azure's InfiniBand, 127 GB/s bus bandwidth at most) describe that network, not another
  cluster's, and the cross-node times follow the preset's measured network bandwidth.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import pathlib
from collections import defaultdict

DATA = pathlib.Path(__file__).parent.parent / "data" / "collective_times.csv"
KINDS_WITH_BUS_EQUIVALENT = ("all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# Kinds run on the same NCCL machinery as another kind's rows: a permute is one send/recv pair of
# the grouped sends and receives an all-to-all is.
SAME_MACHINERY = {"collective-permute": "all-to-all"}


@functools.lru_cache(maxsize=1)
def _rows() -> dict[str, dict[str, dict[int, tuple[tuple[int, float], ...]]]]:
    """table -> kind -> ranks -> ((bytes, us), ...) sorted by bytes."""
    out: dict[str, dict[str, dict[int, list[tuple[int, float]]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#") or line.startswith("table,"):
            continue
        table, kind, ranks, nbytes, us = line.split(",")
        out[table][kind][int(ranks)].append((int(nbytes), float(us)))
    return {t: {k: {n: _monotone(v) for n, v in by_n.items()} for k, by_n in by_k.items()}
            for t, by_k in out.items()}


def _monotone(points: list[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """Sorted by size, each time at least the one before: a larger collective never takes
    less time, so a measured dip (XLA's 16 KiB-1 MiB all-gathers on 8 H100 run 30-33 us
    in no order) is timing noise and takes the level below it."""
    out, level = [], 0.0
    for b, us in sorted(points):
        level = max(level, us)
        out.append((b, level))
    return tuple(out)


def tables() -> tuple[str, ...]:
    """The names a ``HardwareProfile.collective_table`` may take."""
    return tuple(sorted(_rows()))


def measured(table: str, kind: str, ranks: int) -> tuple[int, tuple[tuple[int, float], ...]]:
    """The group size measured nearest to ``ranks`` (log distance) and its (bytes, us)
    points for ``kind``; (0, ()) when the table has no rows for the kind."""
    by_n = _rows().get(table, {}).get(kind)
    if not by_n:
        return 0, ()
    n = min(by_n, key=lambda m: (abs(math.log(m) - math.log(max(ranks, 1))), m))
    return n, by_n[n]


def interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise linear in ``points`` (sorted by x), held at the ends."""
    xs = [p[0] for p in points]
    j = bisect.bisect_left(xs, x)
    if j == 0:
        return points[0][1]
    if j == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[j - 1], points[j]
    return y0 + (x - x0) / (x1 - x0) * (y1 - y0)


@dataclasses.dataclass(frozen=True)
class Anchor:
    """What one (table, kind, group) says: ``points`` = ((log bytes, measured / modelled),
    ...) over the measured sizes; ``scale`` turns the caller's bytes into the table's (0.5
    where a kind takes the all-reduce rows at the same bus bytes, the group size where a permute
    takes the all-to-all's); ``kind`` and ``ranks``
    are the rows used, ``smallest`` = (bytes, us) of the smallest measured size."""

    points: tuple[tuple[float, float], ...]
    scale: float
    kind: str
    ranks: int
    smallest: tuple[int, float]


def anchor(table: str, kind: str, ranks: int, model_us) -> Anchor | None:  # noqa: ANN001 - callable
    """The measured over modelled time of NCCL's own choice at every measured size for
    ``kind`` on ``ranks`` GPUs; None where the table has nothing to say.

    ``model_us(kind, nbytes, ranks)`` is the uncorrected model under NCCL's own choice.
    """
    if not table or ranks <= 1:
        return None
    scale = 1.0
    n, points = measured(table, kind, ranks)
    if not points and kind in SAME_MACHINERY:
        n, points = measured(table, SAME_MACHINERY[kind], ranks)
        if points:  # the all-to-all whose message to each peer is the permute's
            kind, scale = SAME_MACHINERY[kind], float(n)
    if not points and kind in KINDS_WITH_BUS_EQUIVALENT:
        kind, scale = "all-reduce", 0.5
        n, points = measured(table, kind, ranks)
    if not points:
        return None
    return Anchor(tuple((math.log(b), us / model_us(kind, b, n)) for b, us in points), scale, kind, n, points[0])


# How far the (anchored) cost model is off on one collective's time: its median absolute error against
# measured times it was not fitted to, by size band and span (benchmarks/measured/collective_fidelity.py,
# RESULTS.md "collective_fidelity", the by-size-band table). Inside one node: sizes held out of XLA's
# H100/B200 tables and Echo's A100 nccl-tests logs, and published bus bandwidths. Across nodes:
# Echo's logs of 2-16 Azure ND A100 v4 VMs predicted on their own preset (``nd-a100-v4``), whose
# network rate is read from one of those 94 points, the only cross-node sweeps here run under
# NCCL's own choices: the model is 2% off from 64 MiB, 16% at 1-64 MiB and 32% below (optimistic:
# latency across nodes; 25% and 41% before NCCL's tree correction joined the model). The other
# sweeps ran someone's picks (AWS's tuner plugin on p5: 8% and 14%; 32 channels forced on Azure
# ND H100 v5: 17%; TCPX's ring: 11% and 6%), so they do not set the floor.
MEASURED_ERROR_ONE_NODE: tuple[tuple[float, float], ...] = ((1 << 20, 0.20), (64 << 20, 0.08), (math.inf, 0.02))
MEASURED_ERROR_ACROSS_NODES: tuple[tuple[float, float], ...] = ((1 << 20, 0.32), (64 << 20, 0.16), (math.inf, 0.02))


def measured_error(nbytes: float, nodes: int) -> float:
    """The cost model's measured error on the time of a collective of ``nbytes`` spanning
    ``nodes`` nodes (a fraction of that time)."""
    bands = MEASURED_ERROR_ACROSS_NODES if nodes > 1 else MEASURED_ERROR_ONE_NODE
    return next(err for limit, err in bands if nbytes < limit)


def describe_measured_error() -> str:
    """``measured_error`` in words, for reports."""
    def bands(table: tuple[tuple[float, float], ...]) -> str:
        out, lower = [], 0.0
        for limit, err in table:
            size = (f"below {_mib(limit)}" if not lower else f"from {_mib(lower)}" if math.isinf(limit)
                    else f"at {_mib(lower)}-{_mib(limit)}")
            out.append(f"{err:.0%} {size}")
            lower = limit
        return ", ".join(out)
    return f"{bands(MEASURED_ERROR_ONE_NODE)} inside a node; {bands(MEASURED_ERROR_ACROSS_NODES)} across nodes"


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):g} MiB"
