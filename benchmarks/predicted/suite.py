"""The benchmark suite's pieces: cells, the HLO of a cell, predictions, measurements, output.

A *cell* is one model under one sharding recipe on one mesh (``gpt2-124M dp+tp
data=2,model=4``). For every cell and hardware preset the suite predicts the step time
of each strategy from the HLO XLA compiled for that cell; where the backend has enough
devices it also times the compiled step, untuned and tuned. ``benchmarks/predicted/run.py`` is the
command line over these functions.

Each cell is compiled once per preset, by XLA's GPU pipeline for abstract GPUs of that
preset (``lagom_jax.program.gpu_compile``; the GPUs differ, so do the modules), in a child process
that keeps the run alive when XLA aborts on one cell.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

STRATEGIES = ("xla-default", "recipe", "autoccl", "lagom")
HARDWARE = ("h100-sxm-8", "a40-pcie-8", "v100-25g")


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    """One model/config under one recipe on one mesh, with the batch it trains on."""

    model: str
    config: str
    recipe: str
    mesh: str
    batch_size: int
    seq_len: int
    dtype: str = "bfloat16"

    @property
    def num_devices(self) -> int:
        return math.prod(int(f.partition("=")[2]) for f in self.mesh.split(","))

    @property
    def id(self) -> str:
        """The name ``--cells`` selects: ``model/recipe``, plus ``/N`` on N != 8 devices;
        ``model-config/...`` for a config other than the model's default."""
        from lagom_jax.models import DEFAULT_CONFIG

        model = self.model if DEFAULT_CONFIG[self.model] == self.config else f"{self.model}-{self.config}"
        base = f"{model}/{self.recipe}"
        return base if self.num_devices == 8 else f"{base}/{self.num_devices}"

    def label(self) -> str:
        return f"{self.model}-{self.config} {self.recipe} [{self.mesh}]"

    def tiny(self) -> Cell:
        """The same recipe and mesh on the ``tiny`` config: what CPU can run in seconds."""
        return dataclasses.replace(self, config="tiny", seq_len=16, batch_size=self.batch_size)


def _cells(model: str, config: str, seq: int, per_device_batch: int,
           layouts: Sequence[tuple[str, str]]) -> tuple[Cell, ...]:
    out = []
    for recipe, mesh in layouts:
        n = math.prod(int(f.partition("=")[2]) for f in mesh.split(","))
        out.append(Cell(model, config, recipe, mesh, per_device_batch * n, seq))
    return tuple(out)


# Meshes keep every axis a divisor of the configs' heads (12, or 8 for t5-small) and layers
# (12, or 6) and of the tiny config (4 heads, 2 layers), so that every cell can also be
# measured. Pure tensor and pipeline parallelism use the 4 and 2 GPUs of one node they fit.
_LAYOUTS_8 = (
    ("dp", "data=8"),
    ("fsdp", "fsdp=8"),
    ("tp", "model=4"),
    ("tp+sp", "model=4"),
    ("pp", "stage=2"),
    ("dp+pp", "data=4,stage=2"),
    ("dp+tp", "data=2,model=4"),
    ("fsdp+tp", "fsdp=2,model=4"),
    ("dp+pp+tp", "data=2,stage=2,model=2"),
)
_LAYOUTS_16 = (
    ("dp", "data=16"),
    ("fsdp", "fsdp=16"),
    ("dp+tp", "data=4,model=4"),
    ("dp+pp+tp", "data=4,stage=2,model=2"),
)


def full_matrix() -> tuple[Cell, ...]:
    """Every model x recipe on one 8-GPU node, and the data-parallel hybrids on two nodes."""
    cells: list[Cell] = []
    for model, config, seq, batch in (("gpt2", "124M", 1024, 2), ("bert", "base", 512, 4),
                                      ("t5", "small", 512, 4)):
        cells += _cells(model, config, seq, batch, _LAYOUTS_8)
        cells += _cells(model, config, seq, batch, _LAYOUTS_16)
    cells += _cells("gpt2", "355M", 1024, 2, (("dp+tp", "data=2,model=4"), ("fsdp", "fsdp=8")))
    return tuple(dict.fromkeys(cells))


QUICK_IDS = ("gpt2/dp", "gpt2/dp+tp", "gpt2/dp+pp+tp", "bert/fsdp", "t5/tp+sp/4", "gpt2/dp/16")


def quick_matrix() -> tuple[Cell, ...]:
    by_id = {c.id: c for c in full_matrix() if c.config != "355M"}
    return tuple(by_id[i] for i in QUICK_IDS)


def select(cells: Sequence[Cell], ids: Sequence[str] | None) -> tuple[Cell, ...]:
    """The cells of the full matrix named in ``ids``, or all of ``cells`` when none are named."""
    if not ids:
        return tuple(cells)
    known = {c.id: c for c in full_matrix()}
    bad = [i for i in ids if i not in known]
    if bad:
        raise ValueError(f"unknown cell(s) {bad}; known: {', '.join(sorted(known))}")
    return tuple(known[i] for i in ids)


def check_names(kind: str, names: Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown {kind} {bad}; known: {', '.join(known)}")
    return tuple(names)


# -- the HLO of a cell -----------------------------------------------------------------------
class CompileError(RuntimeError):
    """Compiling a cell failed; the message says how."""


def compile_hlo(cell: Cell, hw: Any, timeout_s: float = 1800.0) -> Any:
    """The cell's step compiled for the cluster ``hw`` in a child process, from abstract inputs.

    XLA's GPU pipeline for abstract GPUs of the preset (XLA:CPU on fake CPU devices where
    the CUDA plugin is missing): ``lagom_jax.models.compiled.compile_builtin_isolated``, which
    returns the text and says which compiler made it.
    """
    from lagom_jax.models import compiled

    try:
        return compiled.compile_builtin_isolated(
            hw, cell.model, cell.config, cell.recipe, cell.mesh, timeout_s=timeout_s,
            batch_size=cell.batch_size, seq_len=cell.seq_len, dtype=cell.dtype)
    except (ValueError, compiled.CompileCrash) as err:
        raise CompileError(f"compiling {cell.label()} for {hw.name} x{hw.nodes} failed: {err}") from err


# -- predictions -----------------------------------------------------------------------------
def predict(text: str, hw: Any, strategies: Sequence[str]) -> dict[str, dict[str, float]]:
    """Every strategy on one compiled step and preset, through the tuning pipeline
    (`lagom_jax.job.run`): step time, speedups, efficiency, search cost."""
    from lagom_jax import job

    done = job.run(job.HloSource(text), hw, strategy=strategies[0], baselines=tuple(strategies[1:]), verify=False)
    results = done.planned.results
    # The process-wide NCCL setting the plan took (nccl_settings.choose), if any.
    taken = [name for name, why in done.plan.decisions if "; taken;" in why]
    out: dict[str, dict[str, float]] = {}
    for name in strategies:
        r = results[name]
        row = {
            "makespan_us": r.makespan_us,
            "bound_us": r.bound_us,
            "efficiency": r.bound_us / r.makespan_us,
            "exposed_comm_us": r.timeline.exposed_comm_us,
            "evaluations": r.evaluations,
            "search_time_s": r.search_time_s,
        }
        for ref in ("xla-default", "autoccl"):
            if ref in results:
                row[f"speedup_vs_{ref}"] = results[ref].makespan_us / r.makespan_us
        if name == strategies[0]:
            row["nccl_setting"] = "; ".join(taken)
        out[name] = row
    return out


# -- measurements ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Timing:
    """Step times of one executable after warm-up: median and spread, milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    steps: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Timing:
        ms = [1e3 * s for s in seconds]
        return cls(statistics.median(ms), min(ms), max(ms), len(ms))


def _time_interleaved(steps_by_name: Mapping[str, tuple[Any, Any]], batch: Any, warmup: int,
                      steps: int) -> dict[str, Timing]:
    """Time several executables step by step in turn, each on its own (donated) state.

    Taking turns exposes each to the same drift in machine load (2 shared cores here),
    so their ratio is fairer than that of two runs one after the other.
    """
    import jax

    states = {name: state for name, (_, state) in steps_by_name.items()}
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for i in range(warmup + steps):
        for name, (step, _) in steps_by_name.items():
            t0 = time.perf_counter()
            states[name], metrics = step(states[name], batch)
            jax.block_until_ready((states[name], metrics))
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: Timing.of(ts) for name, ts in times.items()}


def measure(cell: Cell, hardware: str, *, warmup: int = 2,
            steps: int = 5) -> dict[str, Any]:
    """Time the cell's compiled step on this process's devices, untuned and tuned.

    On CPU the ``tiny`` config runs in float32 (the real sizes would take minutes a step,
    and XLA:CPU aborts on bf16 pipelined steps, see ``Built.compiled_text``; ``tune``
    compiles with XLA's defaults); on GPUs the cell's own config. The tuned step is
    ``lagom_jax.tune`` of the same jitted step, predicting for ``hardware``; both start
    from the same initial state, and their steps alternate (warm-up, then ``steps`` each).
    """
    import jax

    import lagom_jax
    from lagom_jax.models import build

    devices = jax.devices()
    platform = devices[0].platform
    run_cell = dataclasses.replace(cell.tiny(), dtype="float32") if platform == "cpu" else cell
    base = {"cell": cell.id, "config": run_cell.config, "dtype": run_cell.dtype, "seq_len": run_cell.seq_len,
            "batch_size": run_cell.batch_size, "mesh": cell.mesh, "platform": platform,
            "devices": len(devices), "hardware_for_plan": hardware}
    if cell.num_devices > len(devices):
        return {**base, "skipped": f"mesh needs {cell.num_devices} devices, {len(devices)} present"}
    if jax.process_count() > 1 and cell.num_devices != len(devices):
        # A mesh on the first N devices would leave some processes out of the step.
        return {**base, "skipped": f"multi-process runs measure only meshes of all {len(devices)} devices"}
    try:
        built = build(run_cell.model, run_cell.config, run_cell.recipe, run_cell.mesh,
                      batch_size=run_cell.batch_size, seq_len=run_cell.seq_len, dtype=run_cell.dtype)
    except ValueError as err:
        return {**base, "skipped": str(err).split(";")[0]}
    rng = jax.random.key(0)
    state, batch = built.init(rng)
    tuned_fn = lagom_jax.tune(built.train_step, hardware=hardware, use_cache=False)
    tuned_state, _ = built.init(rng)
    plan = tuned_fn.plan(tuned_state, batch)
    timings = _time_interleaved({"untuned": (built.train_step, state), "tuned": (tuned_fn, tuned_state)},
                                batch, warmup, steps)
    untuned, tuned = timings["untuned"], timings["tuned"]
    return {**base, "untuned": dataclasses.asdict(untuned), "tuned": dataclasses.asdict(tuned),
            "tuned_over_untuned": untuned.median_ms / tuned.median_ms,
            "plan": None if plan is None else {"strategy": plan.strategy,
                                                "flags": plan.xla_flags(),
                                                "collectives": len(plan.collectives)}}


# -- output ----------------------------------------------------------------------------------
def _fmt_ms(us: float) -> str:
    return f"{us / 1e3:.2f}"


def _compiled_by(rows: Sequence[Mapping[str, Any]]) -> str:
    """How the rows' steps were compiled, in words (older reports: XLA:CPU)."""
    wheres = [r.get("compiled_by", "XLA:CPU") for r in rows if "strategies" in r]
    if wheres and all(w.startswith("XLA:GPU deviceless") for w in wheres):
        return ("by XLA's GPU pipeline for abstract GPUs of the row's preset (deviceless, "
                "`lagom_jax.program.gpu_compile`)")
    if wheres and all(w.startswith("XLA:CPU") for w in wheres):
        return "by XLA:CPU on as many fake devices as the mesh has"
    return "by XLA's GPU pipeline (deviceless) where the row's `compiled_by` says so, else XLA:CPU"


def markdown(report: Mapping[str, Any], machine_line: str) -> str:
    """The results as Markdown: one row per cell and hardware, one column per strategy."""
    strategies = report["strategies"]
    mode = report["selection"]
    lines = [
        f"## {report['name']} (predicted from compiled HLO; {mode})",
        "",
        f"Machine: {machine_line}",
        "",
        f"Run: `{report['command']}`; {len(report['rows'])} rows in {report['wall_s']:.0f} s. "
        "Each cell's train step (AdamW, bf16 compute) was lowered from abstract inputs and "
        f"compiled {_compiled_by(report['rows'])}, parsed into a StepGraph and "
        "searched by every strategy under the hardware preset (nodes = mesh size / 8). "
        "Entries: *predicted* step time in ms (speedup over xla-default). "
        "`eff` = overlap bound / lagom step time; `vs autoccl` = autoccl / lagom.",
        "",
        "| cell | batch x seq | hardware | " + " | ".join(strategies)
        + " | bound ms | lagom eff | lagom vs autoccl | lagom evals | lagom search s | NCCL setting taken |",
        "|---|---|---|" + "---:|" * (len(strategies) + 5) + "---|",
    ]
    worse = []
    for row in report["rows"]:
        spec = row.get("spec", {})
        head = (f"| {row['label']} | {spec.get('batch_size', '?')} x {spec.get('seq_len', '?')} | "
                f"{row['hardware']} x{row['nodes']} |")
        if "error" in row:
            lines.append(head + f" failed: {row['error'][:120]} |" + " |" * (len(strategies) + 5))
            continue
        pred = row["strategies"]
        setting = (pred.get("lagom") or {}).get("nccl_setting") or "-"
        cols = []
        for s in strategies:
            sp = pred[s].get("speedup_vs_xla-default")
            cols.append(_fmt_ms(pred[s]["makespan_us"]) + (f" ({sp:.3f}x)" if sp else ""))
        lag = pred.get("lagom")
        bound = _fmt_ms((lag or next(iter(pred.values())))["bound_us"])
        tail = ["-", "-", "-", "-"]
        if lag:
            vs = lag.get("speedup_vs_autoccl")
            tail = [f"{lag['efficiency']:.3f}", f"{vs:.3f}x" if vs else "-",
                    str(lag["evaluations"]), f"{lag['search_time_s']:.2f}"]
            if "speedup_vs_xla-default" in lag and lag["speedup_vs_xla-default"] < 1 - 1e-9:
                worse.append(row["label"])
        lines.append(head + " " + " | ".join(cols + [bound] + tail + [setting]) + " |")
    ok = [r for r in report["rows"] if "error" not in r and "lagom" in r["strategies"]]
    if ok:
        lines.append("")
        for ref in ("xla-default", "autoccl"):
            sps = [r["strategies"]["lagom"].get(f"speedup_vs_{ref}") for r in ok]
            sps = [s for s in sps if s]
            if sps:
                lines += [f"lagom over {ref}: geometric mean "
                          f"{math.exp(statistics.fmean(math.log(s) for s in sps)):.3f}x, "
                          f"range {min(sps):.3f}x-{max(sps):.3f}x over {len(sps)} rows.", ""]
        lines.append("lagom never slower than xla-default: "
                     + ("yes" if not worse else "NO (" + ", ".join(worse) + ")") + ".")
        behind = [r["strategies"]["lagom"]["speedup_vs_autoccl"] for r in ok
                  if r["strategies"]["lagom"].get("speedup_vs_autoccl", 1.0) < 1 - 1e-9]
        if behind:
            lines += ["", f"lagom behind autoccl on {len(behind)} of {len(ok)} rows, by at most "
                      f"{100 * (1 - min(behind)):.1f}% ({', '.join(f'{b:.3f}x' for b in sorted(behind))}): the gain "
                      "the floor holds back. autoccl takes every gain it predicts; lagom changes a collective's "
                      "parameters only where the predicted gain exceeds the cost model's measured error on a "
                      "collective of its size (`Space.min_gain`), so where autoccl is ahead its margin is inside "
                      "that error (suite_min_gain compares the search with and without the floor)."]
    measured = report.get("measured", [])
    if measured:
        platform = measured[0]["platform"]
        lines += [
            "",
            f"### measured ({platform.upper()}, {measured[0]['devices']} "
            + ("fake devices)" if platform == "cpu" else "devices)"),
            "",
        ]
        if platform == "cpu":
            lines += ["These are wall-clock times of the *tiny* configs (float32) on fake CPU devices: XLA:CPU runs "
                      "collectives as memory copies with no NCCL, channels or overlap, so they do not "
                      "reflect GPU overlap and are not comparable with the predictions above. They show "
                      "that the tuned executable compiles and runs with the plan's options.", ""]
        lines += ["| cell | config | mesh | untuned ms (min-max) | tuned ms (min-max) | untuned / tuned |",
                  "|---|---|---|---:|---:|---:|"]
        for m in measured:
            if "skipped" in m:
                lines.append(f"| {m['cell']} | {m['config']} | {m['mesh']} | skipped: {m['skipped']} | | |")
                continue
            u, t = m["untuned"], m["tuned"]
            lines.append(
                f"| {m['cell']} | {m['config']} {m['dtype']} seq {m['seq_len']} batch {m['batch_size']} | {m['mesh']} | "
                f"{u['median_ms']:.2f} ({u['min_ms']:.2f}-{u['max_ms']:.2f}) | "
                f"{t['median_ms']:.2f} ({t['min_ms']:.2f}-{t['max_ms']:.2f}) | {m['tuned_over_untuned']:.3f}x |")
    return "\n".join(lines)


def chart(report: Mapping[str, Any], path: pathlib.Path) -> pathlib.Path | None:
    """Grouped bars: predicted speedup over xla-default per row and strategy (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("benchmarks: matplotlib is not installed; no chart (pip install matplotlib)",
              file=sys.stderr)
        return None
    rows = [r for r in report["rows"] if "error" not in r]
    strategies = [s for s in report["strategies"] if s != "xla-default"]
    if not rows or not strategies:
        return None
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.5))
    for k, s in enumerate(strategies):
        ys = [r["strategies"][s].get("speedup_vs_xla-default", 1.0) for r in rows]
        ax.bar([i + k * width for i in range(len(rows))], ys, width, label=s)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"{r['cell']} {r['hardware'].split('-')[0]} x{r['nodes']}" for r in rows],
                       rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("predicted speedup over xla-default")
    lo = min(min(r["strategies"][s].get("speedup_vs_xla-default", 1.0) for s in strategies) for r in rows)
    ax.set_ylim(min(0.95, lo - 0.02), None)
    ax.legend(fontsize=8)
    ax.set_title(f"{report['name']}: predicted speedup per cell")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

