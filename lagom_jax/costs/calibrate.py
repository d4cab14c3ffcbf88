"""Calibrate the cost model from a profiler trace of the user's own step.

``calibrate(trace_dir, hlo_text, hardware)`` reads a JAX profiler trace of a few steps
(the ``*.xplane.pb`` that ``jax.profiler.trace`` writes), matches each traced op to the
module's instructions by name (XLA tags every kernel or thunk with its ``hlo_op``), and
fits one factor per class of work, measured over predicted time:

* ``gemm``: kernels that run a matmul (timed by shape, `kernels.gemm_time_us`);
* ``memory``: the other compute kernels (memory-bound fusions, copies);
* one class per collective kind and size band (< 1 MiB, 1-64 MiB, >= 64 MiB).

The calibrated ``HardwareProfile`` divides the HBM bandwidth, the matmul rate and the link
bandwidths each by the factor that makes its class's median predicted/measured ratio 1
(found by bisection: fixed launch costs make a plain ratio of times wrong); the spread of
the per-op ratios around it (interquartile range) is the factor's uncertainty. Then
`--hardware profile.json` predicts this machine. A trace that does
not match the module (too few of its ops found) is refused with the numbers.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics
from collections import defaultdict

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import cost
from lagom_jax.costs.profile import _kernel_lines
from lagom_jax.program import graph as graph_lib, hlo

# Below this a traced time is mostly timer resolution and launch jitter.
MIN_MEASURED_US = 1.0
# A trace matches a module when it times at least this share of the module's compute ops.
MIN_MATCHED_SHARE = 0.5
SCALE_RANGE = (1e-6, 1e6)
BANDS = ((1 << 20, "< 1 MiB"), (64 << 20, "1-64 MiB"), (math.inf, ">= 64 MiB"))


@dataclasses.dataclass(frozen=True)
class ClassFit:
    """One class of work: its factor (measured / predicted) and the error it removes."""

    name: str
    ops: int
    factor: float  # what the class's resource was divided by
    low: float  # the factor times the 25th percentile of the calibrated per-op ratios
    high: float  # the same at the 75th percentile
    error_before: float  # median absolute error of the per-op predictions, fraction
    error_after: float


@dataclasses.dataclass(frozen=True)
class Calibration:
    profile: HardwareProfile
    classes: tuple[ClassFit, ...]
    matched: int  # module ops found in the trace
    steps: int  # executions of the module the trace holds (one per device on XLA:CPU)
    # Groups no factor in SCALE_RANGE fits (their fixed costs alone miss the measurement, as
    # a GPU's launch cost does on XLA:CPU's kernels): left as they were.
    unfitted: tuple[str, ...] = ()

    def table(self) -> str:
        rows = ["| class | ops | factor (resource divided by) | IQR | error before | error after |",
                "|---|---:|---:|---|---:|---:|"]
        for c in self.classes:
            rows.append(f"| {c.name} | {c.ops} | {c.factor:.3g} | {c.low:.3g}-{c.high:.3g} "
                        f"| {c.error_before:.0%} | {c.error_after:.0%} |")
        if self.unfitted:
            rows += ["", f"Not fitted (no factor in {SCALE_RANGE[0]:g}-{SCALE_RANGE[1]:g} brings their median "
                     f"predicted/measured ratio to 1; the profile keeps them): {', '.join(self.unfitted)}."]
        return "\n".join(rows)


def trace_file(trace_dir: str | pathlib.Path) -> pathlib.Path:
    """The newest ``*.xplane.pb`` under ``trace_dir``."""
    root = pathlib.Path(trace_dir)
    if not root.exists():
        raise ValueError(f"trace directory {str(root)!r} does not exist")
    files = sorted(root.rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise ValueError(f"no *.xplane.pb under {str(root)!r}: record one with "
                         "jax.profiler.trace(DIR) around a few steps")
    return files[-1]


def traced_ops(path: pathlib.Path, module: str) -> tuple[dict[str, float], int]:
    """(op -> time per execution of the module in us, executions) from one trace.

    Ops are summed over their events; the executions are the most common event count per
    op (most instructions run once per step). Events of ``module`` only; a trace whose
    events name other modules only is refused (ValueError), and one whose events name no
    module at all is read whole."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(path))
    planes = list(data.planes)
    gpu = [pl for pl in planes if pl.name.startswith("/device:GPU")]
    events: list[tuple[str, str, float]] = []
    for plane in gpu or [pl for pl in planes if pl.name.startswith("/host:")]:
        for line in _kernel_lines(plane):
            for ev in line.events:
                stats = dict(ev.stats)
                if stats.get("hlo_op"):
                    events.append((str(stats.get("hlo_module", "")), str(stats["hlo_op"]), ev.duration_ns / 1e3))
    named = {e[0] for e in events if e[0]}
    if named and module not in named:
        raise ValueError(f"the trace does not match module {module!r}: it ran {', '.join(sorted(named)[:5])}"
                         f"{' ...' if len(named) > 5 else ''}")
    mine = [e for e in events if e[0] == module] or events
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for _, op, us in mine:
        total[op] += us
        count[op] += 1
    if not total:
        raise ValueError(f"trace {str(path)!r} holds no XLA ops (no hlo_op stats)")
    steps = statistics.mode(count.values())
    return {op: t / steps for op, t in total.items()}, steps


def _class(task: graph_lib.Task) -> str:
    if task.is_collective:
        band = next(name for limit, name in BANDS if task.bytes < limit)
        return f"{task.kind} {band}"
    return "gemm" if task.gemm else "memory"


def _predicted(graph: graph_lib.StepGraph, hw: HardwareProfile) -> dict[str, tuple[str, float]]:
    """op name -> (class, predicted us per step, summed over its loop iterations)."""
    out: dict[str, tuple[str, float]] = {}
    for t in graph.tasks:
        if t.is_collective:
            shape = graph.shape(t, hw.gpus_per_node)
            us = cost.default_time_us(shape.kind, shape.bytes, shape.ranks, shape.nodes, hw)
        else:
            us = cost.compute_time_us(t.flops, t.bytes, hw, gemm=t.gemm, itemsize=t.itemsize,
                                      attention=t.fused_attention)
        cls, prev = out.get(t.name, (_class(t), 0.0))
        out[t.name] = (cls, prev + us)
    return out


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def calibrate(trace_dir: str | pathlib.Path, hlo_text: str, hardware: HardwareProfile) -> Calibration:
    """Fit ``hardware`` to a trace of the module ``hlo_text`` (see the module docstring)."""
    graph = graph_lib.from_hlo_text(hlo_text)
    measured, steps = traced_ops(trace_file(trace_dir), graph.name)
    predicted = _predicted(graph, hardware)
    compute_ops = {t.name for t in graph.tasks if not t.is_collective and (t.flops or t.bytes)}
    found = compute_ops & measured.keys()
    if not compute_ops or len(found) < MIN_MATCHED_SHARE * len(compute_ops):
        raise ValueError(
            f"the trace does not match module {graph.name!r}: {len(found)} of its "
            f"{len(compute_ops)} compute ops are in the trace (need {MIN_MATCHED_SHARE:.0%}); "
            "trace the step compiled from this HLO, or pass that step's HLO")
    ops: dict[str, list[str]] = defaultdict(list)
    for op, us in measured.items():
        if op in predicted and us >= MIN_MEASURED_US and predicted[op][1] > 0:
            ops[predicted[op][0]].append(op)
    # One scale per resource, each found by bisection so that the class's median
    # predicted/measured ratio is 1 (the fixed launch costs make a plain ratio wrong).
    groups = (("memory", ("achieved_hbm_gbps",), lambda c: c == "memory"),
              ("gemm", ("achieved_tflops",), lambda c: c == "gemm"),
              ("collectives", ("intra_busbw_gbps", "intra_channel_gbps", "net_busbw_gbps", "net_channel_gbps"),
               lambda c: c not in ("gemm", "memory")))
    profile = dataclasses.replace(hardware, name=f"{hardware.name}-calibrated")
    scales: dict[str, float] = {}
    unfitted: list[str] = []
    for group, fields, member in groups:
        names = [op for cls, members in ops.items() if member(cls) for op in members]
        if not names:
            continue
        scale = _fit_scale(graph, profile, fields, names, measured)
        if scale is None:
            unfitted.append(group)
            continue
        scales[group] = scale
        profile = dataclasses.replace(profile, **{f: getattr(profile, f) / scale for f in fields})
    before, after = predicted, _predicted(graph, profile)
    classes = []
    for cls, names in sorted(ops.items()):
        low, mid, high = _quartiles([measured[op] / after[op][1] for op in names])
        group = "gemm" if cls == "gemm" else "memory" if cls == "memory" else "collectives"
        f = scales.get(group, 1.0)
        classes.append(ClassFit(cls, len(names), f, f * low, f * high,
                                statistics.median(abs(before[op][1] / measured[op] - 1) for op in names),
                                statistics.median(abs(after[op][1] / measured[op] - 1) for op in names)))
    return Calibration(profile, tuple(classes), len(found), steps, tuple(unfitted))


def _fit_scale(graph: graph_lib.StepGraph, hw: HardwareProfile, fields: tuple[str, ...], ops: list[str],
               measured: dict[str, float]) -> float | None:
    """The factor dividing ``fields`` of ``hw`` that makes the median predicted/measured
    ratio of ``ops`` 1 (bisection in log space over SCALE_RANGE); None when none in it does."""
    def log_ratio(scale: float) -> float:
        scaled = dataclasses.replace(hw, **{f: getattr(hw, f) / scale for f in fields})
        pred = _predicted(graph, scaled)
        return statistics.median(math.log(pred[op][1] / measured[op]) for op in ops)

    lo, hi = (math.log(b) for b in SCALE_RANGE)
    if log_ratio(math.exp(lo)) >= 0 or log_ratio(math.exp(hi)) <= 0:
        return None
    for _ in range(50):
        mid = (lo + hi) / 2
        if log_ratio(math.exp(mid)) < 0:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def scaled(hw: HardwareProfile, factor: float, *, name: str | None = None) -> HardwareProfile:
    """``hw`` running everything ``factor`` times slower: compute rates and link bandwidths
    divided, launch cost multiplied (what one measured step time says)."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be positive and finite, got {factor}")
    fields = ("achieved_tflops", "achieved_hbm_gbps", "intra_busbw_gbps", "intra_channel_gbps",
              "net_busbw_gbps", "net_channel_gbps")
    return dataclasses.replace(hw, name=name or hw.name, launch_us=hw.launch_us * factor,
                               **{f: getattr(hw, f) / factor for f in fields})


def module_text(path: str | pathlib.Path) -> str:
    """The HLO text of ``path``, checked to parse."""
    text = pathlib.Path(path).read_text()
    hlo.parse(text)
    return text
