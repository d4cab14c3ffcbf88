"""Real XLA:GPU HLO for 8 GPUs, compiled on one GPU: fixtures, combine check, LHS-profile check.

Run on a machine with one NVIDIA GPU::

    python -m benchmarks.gpu.hlo --out tests/fixtures/hlo/gpu

The flow (issue 9, part 2), one straight line:

1. ``jax_mock_gpu_topology`` is set before the backend starts, so the CUDA client reports
   8 devices backed by mock NCCL (jax ``jax/_src/xla_bridge.py``, ``enable_mock_nccl``).
   Nothing is executed; programs are only compiled. JAX's own test uses
   ``"<slices>x<hosts>x1"`` with one visible GPU (``jax/tests/mock_gpu_topology_test.py``:
   ``2x4x1`` gives 8 devices): the mock client copies the real local devices once per mock
   host, so the default here is ``1x8x1``. The script checks the device count and names
   ``--mock-topology`` if it is off.
2. Small configs of gpt2/bert/t5 under dp, fsdp, tp and dp+tp are built with
   ``lagom_jax.models.build`` and compiled with XLA's default options; each
   ``compiled.as_text()`` is stored as ``gpu_<model>_<recipe>.hlo`` and read back with
   ``hlo.parse`` and ``graph.from_module``.
3. Combine check: one config is compiled with every ``xla_gpu_*_combine_threshold_bytes``
   set to 0 (XLA's combiners do nothing at 0), giving the uncombined StepGraph; then once
   per threshold. The collectives XLA really emitted (count and NCCL-convention bytes, per
   kind) are compared with ``passes.combine.combine(uncombined, thresholds)``.
4. LHS-profile check: the uncombined compile (latency-hiding scheduler on) is the
   baseline; ``api.make_plan`` on its StepGraph gives ``plan.lhs_profile()``, passed back
   as ``fdo_profile`` with every other option unchanged (so the pre-LHS fingerprint and the
   instruction names stay valid: openxla/xla ``xla/service/gpu/gpu_hlo_schedule.cc``
   fingerprints the module just before LHS and matches profile costs by instruction name).
   The schedules are diffed: which async collectives moved, and how much compute XLA put
   under each. A third compile multiplies the cost of the collective with the least compute
   under it by ``--boost`` (0 skips it): if XLA reads the profile, that collective gets more
   compute under it.

``--allow-cpu`` runs the same flow on 8 CPU devices (for tests). The CPU pipeline has no
async collectives, no GPU combiners and no LHS, so its results only show the code runs;
every file and report is then named ``cpu_*`` and nothing goes to RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from lagom_jax.program import graph as graph_lib, hlo

DEFAULT_MODELS = ("gpt2", "bert", "t5")
DEFAULT_RECIPES = ("dp", "fsdp", "tp", "dp+tp")
# Mesh of each recipe on 8 devices; dp+tp splits 4 data x 2 model.
MESHES = {"dp": "data=8", "fsdp": "fsdp=8", "tp": "model=8", "dp+tp": "data=4,model=2"}
MIB = 1 << 20
DEFAULT_THRESHOLDS = (1 * MIB, 32 * MIB, 1024 * MIB)
DEFAULT_MOCK_TOPOLOGY = "1x8x1"
NUM_DEVICES = 8


class GpuHloError(RuntimeError):
    """The run cannot go on; says what was wrong and what to do."""


# --- Comparing the real combiner with ours ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class KindAgreement:
    """Real (XLA) against predicted (``passes.combine``) collectives of one kind."""

    kind: str
    threshold: int
    real_sizes: tuple[int, ...]  # NCCL-convention bytes of each collective, sorted
    predicted_sizes: tuple[int, ...]

    @property
    def real_count(self) -> int:
        return len(self.real_sizes)

    @property
    def predicted_count(self) -> int:
        return len(self.predicted_sizes)

    @property
    def count_match(self) -> bool:
        return self.real_count == self.predicted_count

    @property
    def sizes_match(self) -> bool:
        return self.real_sizes == self.predicted_sizes

    @property
    def size_overlap(self) -> float:
        """Share of collectives (of the larger side) whose exact size appears on both sides."""
        common = sum((collections.Counter(self.real_sizes) & collections.Counter(self.predicted_sizes)).values())
        return common / max(self.real_count, self.predicted_count, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "threshold": self.threshold, "real_count": self.real_count,
                "predicted_count": self.predicted_count, "count_match": self.count_match,
                "sizes_match": self.sizes_match, "size_overlap": self.size_overlap,
                "real_bytes": sum(self.real_sizes), "predicted_bytes": sum(self.predicted_sizes),
                "real_sizes": list(self.real_sizes), "predicted_sizes": list(self.predicted_sizes)}


def collective_sizes(graph: graph_lib.StepGraph) -> dict[str, tuple[int, ...]]:
    """Sorted byte sizes of the collectives of each kind (one entry per issued call)."""
    out: dict[str, list[int]] = collections.defaultdict(list)
    for t in graph.collectives:
        out[t.kind].append(int(t.bytes))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def compare_combine(real: graph_lib.StepGraph, predicted: graph_lib.StepGraph,
                    threshold: int) -> tuple[KindAgreement, ...]:
    """Per kind present on either side: the real and predicted collective sizes."""
    r, p = collective_sizes(real), collective_sizes(predicted)
    return tuple(KindAgreement(k, threshold, r.get(k, ()), p.get(k, ())) for k in sorted(set(r) | set(p)))


# --- Comparing two schedules -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CollectiveWindow:
    """One async collective in a schedule: where it started, and the compute under it."""

    key: tuple[str, int, int]  # (name, iteration, occurrence): names repeat across unrolled loops
    kind: str
    start: int  # position among the schedule's collectives
    compute_under: int  # compute tasks between its start and the point the schedule waited
    flops_under: float


def windows(graph: graph_lib.StepGraph) -> dict[tuple[str, int, int], CollectiveWindow]:
    """Every collective's window; a collective never waited on covers everything after it."""
    seen: collections.Counter[tuple[str, int]] = collections.Counter()
    out = {}
    for pos, t in enumerate(graph.collectives):
        base = (t.name, t.iteration)
        key = (*base, seen[base])
        seen[base] += 1
        end = t.done_before if t.done_before is not None else len(graph.tasks)
        under = [u for u in graph.tasks[t.id + 1:end] if not u.is_collective]
        out[key] = CollectiveWindow(key, t.kind, pos, len(under), sum(u.flops for u in under))
    return out


@dataclasses.dataclass(frozen=True)
class ScheduleDiff:
    """How a second compile's schedule differs from the first's, collective by collective."""

    collectives: int
    moved: tuple[tuple[str, int, int], ...]  # keys whose start position or window changed
    only_in_one: int  # collectives present in only one of the two schedules
    before: tuple[CollectiveWindow, ...]
    after: tuple[CollectiveWindow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"collectives": self.collectives, "moved": len(self.moved), "only_in_one": self.only_in_one,
                "moved_keys": [list(k) for k in self.moved],
                "before": [dataclasses.asdict(w) for w in self.before],
                "after": [dataclasses.asdict(w) for w in self.after]}


def diff_schedules(before: graph_lib.StepGraph, after: graph_lib.StepGraph) -> ScheduleDiff:
    """Collectives whose position among collectives or compute-under count changed."""
    a, b = windows(before), windows(after)
    both = [k for k in a if k in b]
    moved = tuple(k for k in both if (a[k].start, a[k].compute_under) != (b[k].start, b[k].compute_under))
    return ScheduleDiff(len(both), moved, len(set(a) ^ set(b)), tuple(a[k] for k in both), tuple(b[k] for k in both))


def rank_agreement(costs: Mapping[str, float], diff: ScheduleDiff) -> float | None:
    """Spearman correlation between each collective's profiled cost and the compute XLA
    scheduled under it after the profile (None with fewer than 3 costed collectives).
    Positive: costlier collectives got more compute to hide behind, as intended."""
    import numpy as np

    pairs = [(costs[w.key[0]], w.compute_under) for w in diff.after if w.key[0] in costs]
    if len(pairs) < 3:
        return None
    x, y = (np.argsort(np.argsort(np.asarray(v, dtype=float))) for v in zip(*pairs))
    if x.std() == 0 or y.std() == 0:
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def boosted_profile(costs: Mapping[str, float], name: str, factor: float) -> str:
    """The profile text with one instruction's cost multiplied by ``factor``."""
    if name not in costs:
        raise GpuHloError(f"cannot boost {name!r}: it has no cost in the profile")
    return "".join(f'costs {{ name: "{n}" cost_us: {c * (factor if n == name else 1.0):.3f} }}\n'
                   for n, c in costs.items())


# --- Running ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fixture:
    path: str
    model: str
    recipe: str
    tasks: int
    collectives: dict[str, int]  # kind -> count
    async_collectives: int


@dataclasses.dataclass(frozen=True)
class HloReport:
    backend: str
    environment: dict[str, str]
    fixtures: tuple[Fixture, ...]
    check_config: str
    combine: tuple[KindAgreement, ...]
    fdo: ScheduleDiff | None
    fdo_rank_agreement: float | None
    boost: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "environment": self.environment,
                "fixtures": [dataclasses.asdict(f) for f in self.fixtures], "check_config": self.check_config,
                "combine": [a.to_dict() for a in self.combine],
                "fdo": self.fdo.to_dict() if self.fdo else None,
                "fdo_rank_agreement": self.fdo_rank_agreement, "boost": self.boost}


def start_backend(*, allow_cpu: bool, mock_topology: str) -> str:
    """Start JAX's backend with 8 (mock) GPUs, or 8 CPU devices under ``allow_cpu``.

    Returns the platform. The mock topology is set only for a GPU run: it is a CUDA-client
    option and must be in place before the backend starts.
    """
    import jax

    from lagom_jax.program import jax_internals

    if jax_internals.backends_started():
        platform = jax.default_backend()
        if platform != "gpu" and not allow_cpu:
            raise GpuHloError(f"the JAX backend already started as {platform!r}: this script needs a GPU "
                              "(or --allow-cpu to run the flow on CPU devices, for tests)")
    elif allow_cpu:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", NUM_DEVICES)
    else:
        jax.config.update("jax_mock_gpu_topology", mock_topology)
    platform = jax.default_backend()
    if platform != "gpu" and not allow_cpu:
        raise GpuHloError(f"no GPU: the default JAX backend is {platform!r}. Run this on a GPU machine "
                          "(or pass --allow-cpu to run the flow on CPU devices, for tests)")
    if jax.device_count() != NUM_DEVICES:
        raise GpuHloError(f"{jax.device_count()} {platform} devices, need {NUM_DEVICES}: on a GPU, pass "
                          f"--mock-topology so that slices x hosts x (local GPUs) = {NUM_DEVICES} "
                          f"(now {mock_topology!r}; one GPU: '1x8x1')")
    return platform


def threshold_options(threshold: int) -> dict[str, object]:
    """Every combinable kind's ``xla_gpu_*_combine_threshold_bytes`` set to ``threshold``."""
    from lagom_jax.passes.combine import THRESHOLD_FLAGS

    return {flag: int(threshold) for flag in THRESHOLD_FLAGS.values()}


def _graph_of(text: str) -> graph_lib.StepGraph:
    return graph_lib.from_module(hlo.parse(text))


def run(out: str | pathlib.Path, *, allow_cpu: bool = False, models: Sequence[str] = DEFAULT_MODELS,
        recipes: Sequence[str] = DEFAULT_RECIPES, config: str = "tiny", check: str = "gpt2:dp+tp",
        thresholds: Sequence[int] = DEFAULT_THRESHOLDS, boost: float = 20.0,
        mock_topology: str = DEFAULT_MOCK_TOPOLOGY, hardware: str = "h100-sxm-8",
        progress: Any = print) -> HloReport:
    """The whole flow (module docstring); writes fixtures and ``<prefix>_hlo_report.json``."""
    from lagom_jax import api
    from lagom_jax.cluster import hardware as hardware_lib
    from lagom_jax.costs import profile
    from lagom_jax.models import build
    from lagom_jax.passes.combine import COMBINABLE_KINDS, combine

    platform = start_backend(allow_cpu=allow_cpu, mock_topology=mock_topology)
    prefix = "gpu" if platform == "gpu" else "cpu"
    dtype = "bfloat16" if platform == "gpu" else "float32"  # XLA:CPU aborts on some bf16 steps
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check_model, _, check_recipe = check.partition(":")
    if check_recipe not in MESHES:
        raise GpuHloError(f"--check {check!r}: recipe must be one of {', '.join(MESHES)}")

    def lowered(model: str, recipe: str) -> Any:
        return build(model, config, recipe, MESHES[recipe], batch_size=8, dtype=dtype).lower()

    fixtures = []
    for model in models:
        for recipe in recipes:
            if recipe not in MESHES:
                raise GpuHloError(f"recipe {recipe!r}: known {', '.join(MESHES)}")
            text = lowered(model, recipe).compile().as_text()
            path = out / f"{prefix}_{model}_{recipe.replace('+', '_')}.hlo"
            path.write_text(text)
            g = _graph_of(text)
            kinds = collections.Counter(t.kind for t in g.collectives)
            fixtures.append(Fixture(str(path), model, recipe, len(g.tasks), dict(sorted(kinds.items())),
                                    sum(t.is_async for t in g.collectives)))
            progress(f"{path.name}: {len(g.tasks)} tasks, collectives {dict(kinds)}, "
                     f"{fixtures[-1].async_collectives} async")

    low = lowered(check_model, check_recipe)
    base_opts: dict[str, object] = {**threshold_options(0), "xla_gpu_enable_latency_hiding_scheduler": True}
    uncombined_text = low.compile(compiler_options=base_opts).as_text()
    uncombined = _graph_of(uncombined_text)
    agreements: list[KindAgreement] = []
    for th in thresholds:
        real = _graph_of(low.compile(compiler_options={**base_opts, **threshold_options(th)}).as_text())
        predicted = combine(uncombined, {k: int(th) for k in COMBINABLE_KINDS})
        for a in compare_combine(real, predicted, th):
            agreements.append(a)
            progress(f"combine {th / MIB:g} MiB {a.kind}: XLA {a.real_count} ({sum(a.real_sizes)} B), "
                     f"ours {a.predicted_count} ({sum(a.predicted_sizes)} B), sizes "
                     f"{'match' if a.sizes_match else f'{a.size_overlap:.0%} equal'}")

    hw = hardware_lib.resolve(hardware)
    plan = api.make_plan(uncombined, hw)
    names = {i.name for c in hlo.parse(uncombined_text).computations for i in c.instructions}
    # A loop body's instructions appear once per unrolled iteration; the profile holds one
    # cost per name (the last entry wins in XLA), so give each name its mean.
    per_name: dict[str, list[float]] = collections.defaultdict(list)
    for n, c in plan.costs:
        per_name[n].append(c)
    costs = {n: sum(v) / len(v) for n, v in per_name.items() if n in names}
    profile_text = "".join(f'costs {{ name: "{n}" cost_us: {c:.3f} }}\n' for n, c in costs.items())
    profiled = _graph_of(low.compile(compiler_options={**base_opts, "fdo_profile": profile_text.encode()}).as_text())
    fdo = diff_schedules(uncombined, profiled)
    agreement = rank_agreement(costs, fdo)
    progress(f"fdo_profile ({len(costs)} costs, {len(per_name) - len(costs)} plan names not in the module): "
             f"{len(fdo.moved)} of {fdo.collectives} collectives moved; rank agreement cost vs compute "
             f"under: {agreement}")
    boost_result = None
    costed = [w for w in fdo.after if w.key[0] in costs]
    if costed and boost > 0:
        target = min(costed, key=lambda w: (w.compute_under, -costs[w.key[0]]))
        boosted = _graph_of(low.compile(compiler_options={
            **base_opts, "fdo_profile": boosted_profile(costs, target.key[0], boost).encode()}).as_text())
        after = windows(boosted).get(target.key)
        boost_result = {"collective": target.key[0], "factor": boost, "cost_us": costs[target.key[0]],
                        "compute_under_before": target.compute_under,
                        "compute_under_after": after.compute_under if after else None,
                        "more_compute_under": bool(after and after.compute_under > target.compute_under)}
        progress(f"boost x{boost:g} of {target.key[0]}: compute under it {target.compute_under} -> "
                 f"{boost_result['compute_under_after']}")

    report = HloReport(platform, profile.environment_info(), tuple(fixtures), check, tuple(agreements),
                       fdo, agreement, boost_result)
    (out / f"{prefix}_hlo_report.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n")
    return report


def markdown(report: HloReport) -> str:
    """The RESULTS.md section: measured facts about the compiled HLO on this GPU."""
    from benchmarks.common import machine_line

    env = report.environment
    what = "XLA:GPU compiles, 8 mock GPUs" if report.backend == "gpu" else "CPU run, NOT GPU HLO"
    lines = [f"## gpu_hlo (measured: {what})", "",
             f"Machine: {machine_line()}; GPU {env['device_kind']}, driver {env['driver']}.", "",
             "| fixture | tasks | collectives | async |", "|---|---|---|---|"]
    lines += [f"| {pathlib.Path(f.path).name} | {f.tasks} | "
              f"{', '.join(f'{k} {n}' for k, n in f.collectives.items())} | {f.async_collectives} |"
              for f in report.fixtures]
    lines += ["", f"Combine check on {report.check_config}: XLA's combiners against `passes.combine` "
              "(from the compile with every threshold 0).", "",
              "| threshold | kind | XLA count | ours | XLA bytes | ours bytes | sizes equal |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {a.threshold / MIB:g} MiB | {a.kind} | {a.real_count} | {a.predicted_count} | "
              f"{sum(a.real_sizes)} | {sum(a.predicted_sizes)} | {a.size_overlap:.0%} |" for a in report.combine]
    if report.fdo is not None:
        lines += ["", f"LHS profile (`fdo_profile` from `api.make_plan`): {len(report.fdo.moved)} of "
                  f"{report.fdo.collectives} collectives moved; Spearman(cost, compute under) = "
                  f"{report.fdo_rank_agreement}."]
    if report.boost:
        b = report.boost
        lines.append(f"Boosting `{b['collective']}` x{b['factor']:g}: compute under it "
                     f"{b['compute_under_before']} -> {b['compute_under_after']}.")
    return "\n".join(lines)


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": MIB, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes or e.g. 1MiB, 32MiB, 1GiB") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hlo/gpu", help="directory for the .hlo fixtures and the report")
    ap.add_argument("--allow-cpu", action="store_true", help="run on 8 CPU devices when there is no GPU (tests)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--recipes", default=",".join(DEFAULT_RECIPES))
    ap.add_argument("--config", default="tiny", help="model config for every build (default tiny)")
    ap.add_argument("--check", default="gpt2:dp+tp", help="model:recipe of the combine and fdo checks")
    ap.add_argument("--thresholds", default="1MiB,32MiB,1GiB", help="combine thresholds to compare")
    ap.add_argument("--boost", type=float, default=20.0, help="cost factor of the boosted-profile compile (0: skip that compile)")
    ap.add_argument("--mock-topology", default=DEFAULT_MOCK_TOPOLOGY,
                    help="jax_mock_gpu_topology, <slices>x<hosts per slice>x<GPUs per host>")
    ap.add_argument("--hardware", default="h100-sxm-8", help="preset or hardware.json for make_plan")
    args = ap.parse_args(argv)
    try:
        report = run(args.out, allow_cpu=args.allow_cpu, models=args.models.split(","),
                     recipes=args.recipes.split(","), config=args.config, check=args.check,
                     thresholds=[_bytes(t) for t in args.thresholds.split(",")], boost=args.boost,
                     mock_topology=args.mock_topology, hardware=args.hardware)
    except GpuHloError as e:
        print(f"gpu_hlo: {e}", file=sys.stderr)
        return 2
    from benchmarks.common import record_gpu_section

    record_gpu_section("gpu_hlo", markdown(report), report.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
