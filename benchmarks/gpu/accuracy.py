"""Per-op accuracy of the cost model on one GPU: measured kernel times against predictions.

Run on a machine with one NVIDIA GPU, after ``lagom-jax profile`` wrote a hardware.json::

    python -m benchmarks.gpu.accuracy --profile benchmarks/results/gpu/hardware.json

One single-device train step (``lagom_jax.models.build`` on one device) is compiled and
run; after a warm-up, ``--repeats`` steps are each traced with ``jax.profiler.trace`` on
fresh batches (never zeros; the state carries over from step to step), and
``profile.per_op_times_us`` reads each trace's per-instruction device time. The measured
time of an op is its median over the traced steps. Each op is predicted from the
StepGraph tasks with the same name (summed over unrolled loop iterations, as the trace
sums its kernels) as the simulator times it alone (``simulate.alone_us``): "before" with the
preset, "after" with the measured profile. ``profile.accuracy`` gives the MAPE of each.

``--allow-cpu`` runs the same flow on the CPU (for tests): times are then thunk times
on the host, nothing is written to RESULTS.md, and the output files are named ``cpu_*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

from lagom_jax.cluster import hardware
from lagom_jax.costs import profile, simulate
from lagom_jax.program import graph as graph_lib, hlo


class GpuAccuracyError(RuntimeError):
    """The run cannot go on; says what was wrong and what to do."""


@dataclasses.dataclass(frozen=True)
class AccuracyReport:
    backend: str
    environment: dict[str, str]
    model: str
    config: str
    batch_size: int
    seq_len: int | None
    dtype: str
    steps_traced: int
    step_us: profile.Timing  # wall time per traced step (host clock around a synced step)
    measured_us: dict[str, float]  # op -> median device time per step
    spread_us: dict[str, float]  # op -> IQR over the traced steps
    before: profile.Accuracy
    before_hardware: str
    after: profile.Accuracy | None
    after_hardware: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "environment": self.environment, "model": self.model,
                "config": self.config, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "dtype": self.dtype, "steps_traced": self.steps_traced, "step": self.step_us.to_dict(),
                "measured_us": self.measured_us, "spread_us": self.spread_us,
                "before": {"hardware": self.before_hardware, **self.before.to_dict()},
                "after": ({"hardware": self.after_hardware, **self.after.to_dict()} if self.after else None)}


def predict(graph: graph_lib.StepGraph, hw: hardware.HardwareProfile) -> dict[str, float]:
    """Predicted time (us) per compute-op name, summed over the tasks carrying that name;
    each task timed as the simulator times it alone (``simulate.alone_us``)."""
    out: dict[str, float] = {}
    for t in graph.compute_tasks:
        out[t.name] = out.get(t.name, 0.0) + simulate.alone_us(t, hw)
    return out


def rescore(directory: str | pathlib.Path, hw_name: str | None = None,
            min_measured_us: float = 2.0) -> list[tuple[str, float, float]]:
    """Score the current cost model on recorded runs, without a GPU: for every
    ``gpu_accuracy_<tag>.json`` in ``directory`` that has its compiled module beside it
    (``gpu_accuracy_<tag>.hlo.txt``), (tag, MAPE recorded then, MAPE now) with the preset
    the run used (or ``hw_name``)."""
    rows = []
    for path in sorted(pathlib.Path(directory).glob("gpu_accuracy_*.json")):
        text = path.with_suffix(".hlo.txt")
        if not text.exists():
            continue
        rec = json.loads(path.read_text())
        hw = hardware.get(hw_name or rec["before"]["hardware"])
        graph = graph_lib.from_module(hlo.parse(text.read_text()))
        now = profile.accuracy(rec["measured_us"], predict(graph, hw), min_measured_us=min_measured_us)
        rows.append((path.stem.removeprefix("gpu_accuracy_"), rec["before"]["mape_percent"], now.mape))
    return rows


def median_per_op(samples: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Median and IQR per op over traced steps; an op missing from a step counts as 0 there."""
    ops = sorted({o for s in samples for o in s})
    med, iqr = {}, {}
    for o in ops:
        v = np.array([s.get(o, 0.0) for s in samples])
        med[o] = float(np.median(v))
        q1, q3 = np.percentile(v, [25, 75])
        iqr[o] = float(q3 - q1)
    return {o: m for o, m in med.items() if m > 0}, {o: iqr[o] for o in med if med[o] > 0}


def run(out: str | pathlib.Path, *, allow_cpu: bool = False, model: str = "gpt2", config: str = "124M",
        batch_size: int = 8, seq_len: int | None = None, dtype: str | None = None,
        hw_profile: str | None = None, preset: str | None = None, warmup: int = 3, repeats: int = 10,
        min_measured_us: float = 2.0, attention: str = "xla", tag: str = "",
        progress: Any = print) -> AccuracyReport:
    """Trace ``repeats`` steps after ``warmup`` and score the cost model (module docstring);
    writes ``<backend>_accuracy[_<tag>].json`` to ``out``."""
    import jax

    from lagom_jax.models import build

    platform = jax.default_backend()
    if platform != "gpu" and not allow_cpu:
        raise GpuAccuracyError(f"no GPU: the default JAX backend is {platform!r}. Run this on a GPU machine "
                               "(or pass --allow-cpu to run the flow on the CPU, for tests)")
    if warmup < 1 or repeats < 1:
        raise GpuAccuracyError(f"need warmup >= 1 and repeats >= 1, got {warmup}, {repeats}")
    dtype = dtype or ("bfloat16" if platform == "gpu" else "float32")
    device = jax.devices()[0]
    env = profile.environment_info()
    preset = preset or (profile.base_preset_for(device.device_kind) if platform == "gpu" else "h100-sxm-8")
    hw_before = hardware.get(preset)
    hw_after = hardware.HardwareProfile.load(hw_profile) if hw_profile else None

    built = build(model, config, "dp", {"data": 1}, batch_size=batch_size, seq_len=seq_len, dtype=dtype,
                  devices=[device], attention=attention)
    compiled = built.lower().compile()
    text = compiled.as_text()
    graph = graph_lib.from_module(hlo.parse(text))
    progress(f"{model} {config} on {device.device_kind}: {len(graph.compute_tasks)} compute tasks, "
             f"{graph.total_flops / 1e9:.2f} GFLOP per step")

    # Fresh batches for every step (a reused batch stays in cache); one state, carried from step to step
    # (the step donates it).
    state, _ = built.init(jax.random.key(0))
    batches = [built.init(jax.random.key(i + 1))[1] for i in range(warmup + repeats)]
    for b in batches[:warmup]:
        state, metrics = compiled(state, b)
    jax.block_until_ready((state, metrics))
    samples, walls = [], []
    for b in batches[warmup:]:
        d = tempfile.mkdtemp(prefix="lagom_accuracy_")
        try:
            with jax.profiler.trace(d):
                t0 = time.perf_counter()
                state, metrics = compiled(state, b)
                jax.block_until_ready((state, metrics))
                walls.append((time.perf_counter() - t0) * 1e6)
            files = sorted(pathlib.Path(d).rglob("*.xplane.pb"))
            if not files:
                raise GpuAccuracyError(f"the JAX profiler wrote no trace under {d}")
            per_op = profile.per_op_times_us(files[-1], module=graph.name)
            if not per_op:
                # The trace holds only this step, so unfiltered ops are its ops even if
                # the profiler names the module differently from the HLO text.
                per_op = profile.per_op_times_us(files[-1])
                if per_op:
                    progress(f"note: no event tagged hlo_module={graph.name!r}; using all ops of the trace")
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if not per_op:
            raise GpuAccuracyError(f"the trace has no op of module {graph.name!r} (is CUPTI available on "
                                   "this machine? on a GPU, kernels come from the device plane)")
        samples.append(per_op)
    measured, spread = median_per_op(samples)
    loss = float(metrics["loss"])
    if not np.isfinite(loss):
        raise GpuAccuracyError(f"the traced step's loss is {loss}: the step is broken, its times mean nothing")

    before = profile.accuracy(measured, predict(graph, hw_before), min_measured_us=min_measured_us)
    after = (profile.accuracy(measured, predict(graph, hw_after), min_measured_us=min_measured_us)
             if hw_after else None)
    report = AccuracyReport(platform, env, model, config, batch_size, seq_len, dtype, repeats,
                            profile.Timing(tuple(walls)), measured, spread, before, hw_before.name,
                            after, hw_after.name if hw_after else None)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prefix = "gpu" if platform == "gpu" else "cpu"
    stem = f"{prefix}_accuracy{'_' + tag if tag else ''}"
    (out / f"{stem}.hlo.txt").write_text(text)  # to score later cost models on this run (`rescore`)
    (out / f"{stem}.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n")
    return report


def markdown(report: AccuracyReport, *, top: int = 12) -> str:
    """The RESULTS.md section: MAPE before/after and the ops that take the most time."""
    from benchmarks.common import machine_line

    env = report.environment
    what = "measured" if report.backend == "gpu" else "CPU run, NOT a GPU"
    matched = report.before.per_op
    covered = sum(m for _, m, _ in matched) / max(sum(report.measured_us.values()), 1e-9)
    after = dict((o, p) for o, _, p in report.after.per_op) if report.after else {}
    lines = [f"## gpu_accuracy ({what})", "",
             f"Machine: {machine_line()}; GPU {env['device_kind']}, driver {env['driver']}.",
             f"{report.model} {report.config}, batch {report.batch_size}, {report.dtype}, one device; "
             f"{report.steps_traced} traced steps after warm-up, fresh batches; step wall time median "
             f"{report.step_us.median_us:.0f} us (IQR {report.step_us.iqr_us:.0f}).",
             f"{len(matched)} ops matched by name (measured >= the floor), covering {covered:.0%} of the "
             f"measured op time; {len(report.before.unmatched)} measured ops without a StepGraph task.", "",
             "| hardware | MAPE |", "|---|---|",
             f"| {report.before_hardware} (preset, before) | {report.before.mape:.1f}% |"]
    if report.after:
        lines.append(f"| {report.after_hardware} (measured profile, after) | {report.after.mape:.1f}% |")
    lines += ["", "| op | measured us (IQR) | predicted before | predicted after |", "|---|---|---|---|"]
    for o, m, p in sorted(matched, key=lambda r: -r[1])[:top]:
        a = f"{after[o]:.1f}" if o in after else "-"
        lines.append(f"| {o} | {m:.1f} ({report.spread_us.get(o, 0.0):.1f}) | {p:.1f} | {a} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gpu", help="directory for <backend>_accuracy.json")
    ap.add_argument("--profile", default=None, help="measured hardware.json from `lagom-jax profile` (after)")
    ap.add_argument("--preset", default=None, help="preset for 'before' (default: the GPU's own preset)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (tests)")
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--config", default="124M")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="compute dtype (default bfloat16 on GPU, float32 on CPU)")
    ap.add_argument("--attention", default="xla", help="attention implementation: xla or flash")
    ap.add_argument("--tag", default="", help="suffix of the output file (several configurations in one directory)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="traced steps")
    ap.add_argument("--min-us", type=float, default=2.0, help="leave out ops measured under this (timer noise)")
    args = ap.parse_args(argv)
    # XLA:GPU replays runs of kernels as CUDA graphs ("command buffers"); the profiler
    # then names one graph launch, not the ops in it (seen with jax 0.11.2 on an H100:
    # every measured op was "command_buffer_N"). Per-op times need them off; XLA reads
    # XLA_FLAGS when its backend starts, which has not happened yet in this process.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()
    try:
        report = run(args.out, allow_cpu=args.allow_cpu, model=args.model, config=args.config,
                     batch_size=args.batch_size, seq_len=args.seq_len, dtype=args.dtype, hw_profile=args.profile,
                     preset=args.preset, warmup=args.warmup, repeats=args.repeats, min_measured_us=args.min_us,
                     attention=args.attention, tag=args.tag)
    except (GpuAccuracyError, profile.ProfileError) as e:
        print(f"gpu_accuracy: {e}", file=sys.stderr)
        return 2
    from benchmarks.common import record_gpu_section

    print(markdown(report))
    record_gpu_section("gpu_accuracy", markdown(report), report.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
