"""One pipeline from a step to a verified Plan, whatever the step's source.

``run(source, hardware, strategy=...)`` is the tuning pipeline of every face: the CLI's
``tune``, the prediction contract (``lagom_jax.advise.predict``), ``advise`` and the benchmark
suite. Its steps, in order:

1. **compile** the source for the cluster: a built-in model (:class:`ModelSource`) is built
   on abstract GPUs of the cluster and compiled by XLA's GPU pipeline (deviceless), with
   XLA:CPU as the stated fallback; a jitted step and its arguments (:class:`StepSource`,
   the decorator's) is the executable XLA made on GPUs, or else compiled deviceless for
   the cluster; an HLO text (:class:`HloSource`) is read as it is;
2. **read** the module into a StepGraph;
3. **plan**: the strategy and the baselines (``planning.plan``); with ``structures``, also
   the flags that restructure a scanned program (the collective pipeliner, while-loop
   double buffering, combine-by-dim), each priced by compiling the step with it
   (``lagom_jax.plan.structures``);
4. **validate** every flag and option with the installed XLA (``flags.validate``);
5. **verify** by recompiling with the Plan's options where the source can be compiled
   again (``verify.verify_plan``); otherwise the Plan says why not.

The result, a :class:`Job`, holds the Plan and everything behind it, and writes the
artifacts (``Job.write``). Progress goes to ``log`` (the CLI passes stderr); nothing else is
printed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from lagom_jax import models, search
from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.costs import commfuse, kernels, launch
from lagom_jax.plan import artifacts, nccl_settings, planning, verify as verify_lib
from lagom_jax.plan import structures as structures_lib
from lagom_jax.plan.schema import Plan
from lagom_jax.program import (custom_calls, flags as flags_lib, gpu_compile, graph as graph_lib, hlo,
                               hlo_compile, step as step_lib)

__all__ = ["Compiled", "HloSource", "Job", "ModelSource", "STEP_HLO", "StepSource", "compile_source", "mesh_cluster",
           "plan_compiled", "run", "silent"]

Log = Callable[[str], None]
_AXIS_PART = {"data": "dp", "fsdp": "fsdp", "model": "tp", "stage": "pp", "expert": "ep", "context": "cp"}


def silent(_: str) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A built-in model's train step (``lagom_jax.models.build``) on a mesh.

    ``recipe`` defaults to one part per mesh axis (data: dp, fsdp: fsdp, model: tp,
    stage: pp, expert: ep, context: cp). ``commfuse`` (auto|off|on) applies to tp+sp recipes: whether
    the MLP runs CommFuse rings (``commfuse.choose_mlp`` decides under auto).
    """
    model: str
    config: str
    mesh: str | Mapping[str, int] = "data=2,model=4"
    recipe: str | None = None
    batch_size: int = 8
    seq_len: int | None = None
    dtype: str = "bfloat16"
    remat: str = "none"
    scan: bool = True
    attention: str = "xla"
    commfuse: str = "off"
    compiler_options: tuple[tuple[str, Any], ...] = ()
    microbatches: int | None = None  # a pipeline's (a stage axis); default two per stage

    def shape(self) -> dict[str, int]:
        return models.parse_mesh(self.mesh)

    def resolved_recipe(self) -> str:
        return self.recipe or "+".join(_AXIS_PART[a] for a in self.shape() if a in _AXIS_PART)

    def describe(self) -> str:
        mesh = ",".join(f"{a}={n}" for a, n in self.shape().items())
        return f"{self.model} {self.config}, {self.resolved_recipe()}, mesh {mesh}"


@dataclasses.dataclass(frozen=True)
class HloSource:
    """An HLO module's text (``compiled.as_text()`` or an XLA dump), and where it came from.

    A module XLA has already compiled is read as it is. A module *before* optimization
    (``hlo_compile.classify``: XLA's benchmark modules, a dump's
    ``*.before_optimizations.txt``) is first compiled deviceless with XLA's GPU pipeline
    for ``partitions`` GPUs of the cluster (default: the count its replica groups imply),
    with ``compiler_options``.
    """
    text: str
    where: str = "HLO module"
    partitions: int | None = None
    compiler_options: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class StepSource:
    """A jitted step of any wrapper (``jax.jit``, ``eqx.filter_jit``, ``nnx.jit``, haliax's
    ``named_jit``: ``program.step``) with its arguments."""
    jitted: Any
    args: tuple
    kwargs: Mapping[str, Any]
    # The wrapper's own lowering of the step for this host, where the caller has one already.
    lowered: Any = dataclasses.field(default=None, compare=False, repr=False)

    def lowered_here(self) -> Any:
        """The wrapper's lowering of the step for the devices its arguments live on."""
        return self.lowered if self.lowered is not None else step_lib.lower(self.jitted, self.args, self.kwargs)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A source compiled for a cluster: its module, who made it, and how to remake it."""
    text: str
    where: str
    hardware: hardware_lib.HardwareProfile
    warnings: tuple[str, ...] = ()
    decisions: tuple[tuple[str, str], ...] = ()
    # options -> HLO text of the same step compiled with them; None: cannot compile again.
    recompile: Callable[[Mapping[str, Any]], str] | None = None
    # ``text`` already parsed, where compiling needed to read it (no second parse to plan).
    module: hlo.Module | None = dataclasses.field(default=None, compare=False, repr=False)
    # The busiest device's share of a dropless MoE exchange over the balanced one
    # (``graph.busiest_device_load``): the routing's skew, which no compiled module shows.
    exchange_load: float = 1.0
    # The busiest expert's rows over the mean in every grouped GEMM (``moe="grouped"``).
    group_load: float = 1.0
    # The step's flags asked for windowed einsum, which this compile could not apply
    # (``windowed_einsum.why_not``): planned with the decomposition pass instead
    # (``search.Space.windowed_by_flag``).
    windowed_by_flag: bool = False
    # The step before XLA's optimizations, as HLO text (a jitted step's lowering for the
    # cluster's GPUs): what ``lagom-jax tune`` compiles to make the same plan (``Job.write``).
    before_optimization: Callable[[], str] | None = dataclasses.field(default=None, compare=False, repr=False)

    def graph(self) -> graph_lib.StepGraph:
        step = graph_lib.from_module(self.module) if self.module is not None else graph_lib.from_hlo_text(self.text)
        return graph_lib.with_group_load(graph_lib.with_exchange_load(step, self.exchange_load), self.group_load)


@dataclasses.dataclass(frozen=True)
class Job:
    """A tuned step: the Plan (validated, verified where possible) and what it came from
    (``planned`` is None for a Plan read back from a cache: no search ran)."""
    plan: Plan
    planned: planning.Planned | None
    compiled: Compiled

    @property
    def where(self) -> str:
        return self.compiled.where

    def predicted_ms(self, strategy: str) -> float:
        return dict(self.plan.predicted_us)[strategy] / 1e3

    def write(self, out: str | pathlib.Path, log: Log = silent) -> pathlib.Path:
        """Every artifact of the Plan in ``out``, and the step before optimization as
        ``step.hlo`` where the source has one; returns the path of ``launch.sh``."""
        if self.compiled.before_optimization is not None:
            pathlib.Path(out).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(out) / STEP_HLO).write_text(self.compiled.before_optimization())
        chosen = self.planned.chosen if self.planned is not None else None
        return artifacts.write(pathlib.Path(out), self.plan, chosen, log)


# The step before XLA's optimizations in a plan's folder: ``lagom-jax tune DIR/step.hlo``.
STEP_HLO = "step.hlo"


def mesh_cluster(hw: hardware_lib.HardwareProfile, n: int, *, grow: bool) -> hardware_lib.HardwareProfile:
    """The cluster a mesh of ``n`` devices runs on; ``grow``: fill ``n / gpus_per_node``
    nodes when the mesh is larger than ``hw``. Raises ValueError when they disagree."""
    if grow and hw.nodes == 1 and n > hw.gpus_per_node and n % hw.gpus_per_node == 0:
        hw = hw.with_nodes(n // hw.gpus_per_node)
    if not (n == hw.num_gpus or (hw.nodes == 1 and n < hw.gpus_per_node)):
        g = hw.gpus_per_node
        if n > g and n % g:
            raise ValueError(f"a mesh of {n} GPUs is not a whole number of {hw.name} nodes ({g} GPUs "
                             f"each): use a mesh of {g * (n // g)} or {g * (n // g + 1)} GPUs")
        need = f"part of one {hw.name} node" if n < g else f"{n // g} {hw.name} nodes"
        raise ValueError(f"a mesh of {n} GPUs needs {need}, but the cluster has {hw.nodes} "
                         f"({hw.num_gpus} GPUs): use --nodes {max(1, n // g)} or a mesh of "
                         f"{hw.num_gpus} GPUs")
    return hw


def _compile_model(src: ModelSource, hw: hardware_lib.HardwareProfile, log: Log) -> Compiled:
    gpu_compile.prepare()  # before anything starts JAX's backends
    shape = src.shape()
    n = math.prod(shape.values())
    cfg = models.families.resolve_config(src.model, src.config)
    grouped_ffi = getattr(cfg, "moe", "") == "grouped" and hw.arch != "hopper"
    if grouped_ffi and not hw.grouped_gemm_tflops:
        raise ValueError(f"moe='grouped' runs JAX's Hopper grouped-GEMM kernels (pallas ops.gpu.ragged_dot_mgpu, "
                         f"wgmma), or on Blackwell a CuTe kernel through FFI at its measured rate; {hw.gpu} is "
                         f"{hw.arch} with no measured grouped-GEMM rate: use moe='dropless' (XLA's ragged_dot)")
    target = gpu_compile.step_devices(hw, n)
    warnings = (target.warning,) if target.warning else ()
    recipe, decisions = _with_commfuse(src, hw, log)
    seq_len = src.seq_len
    if seq_len is None:
        seq_len = min(512, models.families.resolve_config(src.model, src.config).max_len)
    built = models.build(src.model, src.config, recipe, shape, batch_size=src.batch_size,
                         seq_len=seq_len, dtype=src.dtype, devices=target.devices,
                         remat=src.remat, scan=src.scan, attention=src.attention,
                         microbatches=src.microbatches)
    by = f" by {gpu_compile.compiler()}" if target.deviceless else ""
    log(f"{target.where}{by} ({dataclasses.replace(src, recipe=recipe).describe()}) ...")
    base = dict(src.compiler_options)
    if grouped_ffi:  # the FFI grouped GEMMs have no handler here: XLA stands in for them
        base.setdefault(custom_calls.MOCK_OPTION, True)
        decisions += (("grouped GEMMs", (
            f"on {hw.gpu} the expert GEMMs are typed-FFI calls standing in for a Blackwell CuTe grouped GEMM "
            f"(QuACK/SonicMoE, as users run them), compiled as stand-ins and priced by their group shapes at "
            f"{hw.grouped_gemm_tflops:g} TFLOP/s (measured; docs/moe.md)")),)
    text = built.compiled_text(base)
    recompile = (lambda options: built.compiled_text({**base, **options})) if target.deviceless else None
    load, group_load, said = _expert_loads(cfg, shape.get("expert", 1))
    return Compiled(text, target.where, hw, warnings, decisions + said, recompile, exchange_load=load,
                    group_load=group_load)


def _expert_loads(cfg: Any, ways: int) -> tuple[float, float, tuple[tuple[str, str], ...]]:
    """How the routing's skew (a MoE config's ``expert_imbalance``) reaches the price: the
    busiest device's exchange load, the busiest group of every grouped GEMM, and the
    decision line that says so."""
    imbalance = float(getattr(cfg, "expert_imbalance", 1.0))
    if imbalance == 1.0:
        return 1.0, 1.0, ()
    grouped = getattr(cfg, "moe", "") == "grouped"
    group_load = imbalance if grouped else 1.0
    gemms = (f"every grouped GEMM's busiest group (expert) holds {imbalance:g}x the mean rows" if grouped else
             "the expert GEMMs (one dense dot over every expert, as XLA compiles ragged_dot) do not change")
    if grouped and ways <= 1:
        return 1.0, group_load, (("expert imbalance", f"{imbalance:g}: {gemms}; no expert axis, so no exchange"),)
    if getattr(cfg, "moe", "") not in ("dropless", "grouped"):
        return 1.0, 1.0, (("expert imbalance", (
            f"{imbalance:g} changes nothing priced: GShard's capacity buffers fix the all-to-all's bytes and "
            "the expert GEMMs' shapes whatever the routing (tokens over capacity are dropped)")),)
    if ways <= 1:
        return 1.0, 1.0, (("expert imbalance", (
            f"{imbalance:g} changes nothing priced: no expert axis, so no exchange, and XLA runs ragged_dot "
            "as one dense dot over every expert whatever the group sizes")),)
    load = graph_lib.busiest_device_load(cfg.experts, ways, imbalance)
    return load, group_load, (("expert imbalance", (
        f"the busiest of {cfg.experts} experts takes {imbalance:g}x the mean: the device holding it receives "
        f"and sends back {load:.2f}x a balanced share, so every dropless exchange (ragged all-to-all over "
        f"{ways} devices) is priced at that load; {gemms}")),)


def _with_commfuse(src: ModelSource, hw: hardware_lib.HardwareProfile, log: Log
                   ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The recipe with CommFuse rings (part ``cf``) where ``src.commfuse`` and the cost
    model say so, and the decision with its reason."""
    recipe = src.resolved_recipe()
    parts = models.parse_recipe(recipe)
    if src.commfuse not in ("auto", "off", "on"):
        raise ValueError(f"commfuse must be auto, off or on, got {src.commfuse!r}")
    tp_sp = {"tp", "sp"} <= parts
    if src.commfuse == "on" and not tp_sp:
        raise ValueError(f"commfuse on needs a tp+sp recipe, got {recipe!r}")
    if src.commfuse == "off" or "cf" in parts or not tp_sp:
        return recipe, ()
    if src.commfuse == "on":
        log("CommFuse: the MLP runs rings (commfuse on)")
        return recipe + "+cf", (("commfuse", "the MLP runs rings (commfuse on)"),)
    cfg = models.families.resolve_config(src.model, src.config)
    t = src.shape().get("model", 1)
    tokens = src.batch_size * (src.seq_len or min(512, cfg.max_len))
    if t < 2 or cfg.d_ff % t or tokens % t:
        return recipe, ()
    nodes = max(1, min(hw.nodes, -(-t // hw.gpus_per_node)))
    ring, why = commfuse.choose_mlp(tokens=tokens, d_model=cfg.d_model, d_ff=cfg.d_ff, t=t, hw=hw,
                                    nodes=nodes, itemsize=2 if src.dtype == "bfloat16" else 4)
    log(why)
    return (recipe + "+cf" if ring else recipe), (("commfuse", why.removeprefix("CommFuse: ")),)


def _compile_step(src: StepSource, hw: hardware_lib.HardwareProfile, log: Log) -> Compiled:
    """The module a GPU cluster runs for a jitted step: the executable itself on a GPU host;
    elsewhere XLA's GPU pipeline compiles the step's CUDA lowering for abstract GPUs of ``hw``
    (``gpu_compile.lower_for_cluster``); where that fails, XLA:CPU's module stands in
    and a warning says what that costs."""
    platform = step_lib.platform_of(src.args, src.kwargs)
    if platform in ("gpu", "cuda", "rocm"):
        lowered = src.lowered_here()

        def recompile_here(options: Mapping[str, Any]) -> str:
            return step_lib.jax_compiled(lowered.compile(compiler_options=dict(options))).as_text()

        return Compiled(recompile_here({}), f"XLA:GPU executable ({platform})", hw, recompile=recompile_here,
                        before_optimization=lambda: step_lib.jax_lowered(lowered).as_text(dialect="hlo"))
    try:
        lowered = gpu_compile.lower_for_cluster(src.jitted, src.args, src.kwargs, hw)
        text = gpu_compile.compile_lowered(lowered, hw)
    except Exception as err:  # noqa: BLE001 - any failure: the CPU module stands in
        cpu = step_lib.jax_compiled(src.lowered_here().compile()).as_text()
        return Compiled(cpu, "XLA:CPU module", hw,
                        (f"could not compile the step for {hw.gpu} GPUs without a GPU "
                         f"({type(err).__name__}: {err}); tuning XLA:CPU's module instead: "
                         f"{gpu_compile.CPU_FALLBACK_LOSS}",))
    log(f"tuning XLA:GPU's module, compiled deviceless for {hw.gpu} by {gpu_compile.compiler()}")
    return Compiled(text, f"XLA:GPU deviceless compile for {hw.gpu}", hw,
                    recompile=lambda options: gpu_compile.compile_lowered(lowered, hw, options),
                    before_optimization=lambda: lowered.as_text(dialect="hlo"))


def _compile_hlo(src: HloSource, hw: hardware_lib.HardwareProfile, log: Log) -> Compiled:
    """An HLO text: read as it is when XLA compiled it; compiled for the cluster first when
    it is a module before optimization (the cluster grows to the module's device count
    when it is larger than one node of ``hw`` and ``hw`` names one node)."""
    module = hlo.parse(src.text)
    unoptimized, why = hlo_compile.classify(module)
    if not unoptimized:
        on_cpu = hlo_compile.cpu_compiled(module)
        if on_cpu:
            raise ValueError(
                f"{src.where} is a module XLA:CPU compiled ({on_cpu}): its fusions, layouts and collectives "
                "are the CPU backend's, not what a GPU runs. On a host without a GPU give the step's CUDA "
                f"lowering, which is compiled here for the cluster's GPUs: {hlo_compile.CUDA_LOWERING_HOWTO}")
        return Compiled(src.text, src.where, hw, module=module)
    lowered_on_cpu = hlo_compile.cpu_lowered(module)
    if lowered_on_cpu:
        raise ValueError(
            f"{src.where} was lowered by JAX for the CPU ({lowered_on_cpu}), where its rules differ from "
            f"CUDA's, so it is not the program a GPU runs. Dump the CUDA lowering: {hlo_compile.CUDA_LOWERING_HOWTO}")
    n = hlo_compile.partitions(module, src.partitions)
    hw = mesh_cluster(hw, n, grow=True)
    base = dict(src.compiler_options)
    log(f"{src.where} is HLO before optimization ({why}); compiling it for {n}x {hw.gpu} "
        f"with XLA's GPU pipeline (deviceless, {gpu_compile.compiler()}) ...")

    def recompile(options: Mapping[str, Any]) -> str:
        return hlo_compile.compile_unoptimized(src.text, hw, partitions=n, options={**base, **options})

    _, stood_in = hlo_compile.compile_options(module, base)
    decisions = (("custom calls", custom_calls.describe_stand_ins(stood_in)),) if stood_in else ()
    return Compiled(recompile({}), f"XLA:GPU deviceless compile of {src.where} for {n}x {hw.gpu}", hw,
                    decisions=decisions, recompile=recompile)


def _as_compiled_for(hw: hardware_lib.HardwareProfile, options: Mapping[str, Any]) -> hardware_lib.HardwareProfile:
    """``hw`` with what the user's flags (compile option, else XLA_FLAGS) make of this
    compile's collectives: the stream priority XLA gives them
    (``xla_gpu_enable_highest_priority_async_stream``, default true; read in openxla/xla
    ``GpuExecutable::ExecuteThunksImpl``) and whether XLA registers their buffers as NCCL
    symmetric windows (``xla_gpu_experimental_enable_nccl_symmetric_buffers``, default false;
    NCCL's symmetric kernels and copy engines need it, ``NcclEnv``) or with ``ncclCommRegister``
    (``xla_gpu_enable_nccl_user_buffers``, default false: NVLS on fewer CTAs), whether a ragged
    all-to-all runs XLA's one-shot kernel (``nccl_settings.RAGGED_ONE_SHOT``), and what XLA
    captures in command buffers (``xla_gpu_enable_command_buffer``, ``costs/launch.py``)."""
    high = flags_lib.bool_setting("xla_gpu_enable_highest_priority_async_stream", options)
    if high is not None and high != hw.comm_high_priority:
        hw = dataclasses.replace(hw, comm_high_priority=high)
    registered = {field: value for field, flag in nccl_settings.XLA_FIELDS
                  if (value := flags_lib.bool_setting(flag, options)) is not None}
    if registered:
        hw = dataclasses.replace(hw, nccl_env=dataclasses.replace(hw.nccl_env, **registered))
    captured = flags_lib.text_setting(launch.FLAG, options)
    if captured is not None:
        hw = dataclasses.replace(hw, command_buffer=launch.parse(captured))
    return hw


NETWORK_DECISION = "assumed network"


def network_note(hw: hardware_lib.HardwareProfile) -> str:
    """What a prediction across ``hw``'s nodes says of its network numbers when they are not a
    measurement of that system (``HardwareProfile.network_assumption``)."""
    return (f"{hw.name}'s network numbers ({hw.net_busbw_gbps:g} GB/s all-reduce bus bandwidth across nodes) are "
            f"an assumption, not a measurement: {hw.network_assumption}")


def compile_source(source: ModelSource | StepSource | HloSource, hw: hardware_lib.HardwareProfile,
                   log: Log = silent) -> Compiled:
    """Step 1 of the pipeline: the module of ``source`` for the cluster ``hw``, whose
    collectives run at the stream priority the compile gives them (:func:`_as_compiled_for`)."""
    hw = _as_compiled_for(hw, dict(getattr(source, "compiler_options", ())))
    if isinstance(source, HloSource):
        return _compile_hlo(source, hw, log)
    if isinstance(source, ModelSource):
        return _compile_model(source, hw, log)
    if isinstance(source, StepSource):
        return _compile_step(source, hw, log)
    raise TypeError(f"unknown source {type(source).__name__} (ModelSource, StepSource or HloSource)")


def _with_structure(compiled: Compiled, planned: planning.Planned, hw: hardware_lib.HardwareProfile,
                    strategy: str, baselines: tuple[str, ...], log: Log, space: search.Space
                    ) -> tuple[planning.Planned, tuple[tuple[str, str], ...], graph_lib.StepGraph | None,
                               search.Space | None]:
    """Step 3b: the structure flags compile-in-the-loop takes (``structures.search``), in
    the Plan beside the search's own; the baselines stay those of the module XLA makes
    with no flags, so the predicted gain counts the structure too. Also the step and space
    of the module taken (``None`` where the search kept the module it started from)."""
    log("structure: the pipeliner, double buffering and combine-by-dim, each compiled and "
        "predicted where it can hide exposed communication ...")
    outcome = structures_lib.search(compiled.text, planned, hw, compiled.recompile, strategy=strategy,
                                baselines=baselines, log=log, space=space)
    best = outcome.planned.plan
    predicted = dict(planned.plan.predicted_us)
    predicted[strategy] = best.makespan_us
    plan = dataclasses.replace(best, flags=tuple(outcome.flags) + best.flags,
                               predicted_us=tuple(predicted.items()))
    return dataclasses.replace(outcome.planned, plan=plan), outcome.decisions, outcome.graph, outcome.space


def run(source: ModelSource | StepSource | HloSource, hardware: hardware_lib.HardwareProfile, *,
        strategy: str = "lagom", baselines: tuple[str, ...] = planning.BASELINES,
        verify: bool = True, structures: bool = False, log: Log = silent,
        space: search.Space = search.Space()) -> Job:
    """The pipeline (module docstring): compile, read, plan (with ``structures``: also the
    loop structure, compile-in-the-loop), validate, verify. ``space`` is what the search may
    choose (e.g. ``Space(min_gain=0)`` takes every predicted gain).

    Raises ValueError for bad input (a model, mesh or config that cannot be built, an
    unknown strategy, a step ``exhaustive`` refuses, ``hlo_compile.HloCompileError`` for a
    module before optimization XLA will not compile) and ``HloParseError`` for HLO it
    cannot read; ``flags.FlagError`` when the installed XLA rejects a planned flag.
    """
    return plan_compiled(compile_source(source, hardware, log), strategy=strategy, baselines=baselines,
                         verify=verify, structures=structures, log=log, space=space)


def plan_compiled(compiled: Compiled, *, strategy: str = "lagom",
                  baselines: tuple[str, ...] = planning.BASELINES, verify: bool = True,
                  structures: bool = False, log: Log = silent, space: search.Space = search.Space(),
                  nccl_settings_search: bool = True) -> Job:
    """Steps 2-5 of the pipeline on a module already compiled (``compile_source``).
    ``nccl_settings_search`` False: lagom leaves NCCL's process-wide settings as the cluster
    has them (the bench's ``--search`` measures the plan without them)."""
    step = compiled.graph()
    hw = compiled.hardware
    if compiled.windowed_by_flag:
        space = dataclasses.replace(space, windowed_by_flag=True)
    log(f"hardware: {hw.name}; {len(step.collectives)} collectives, {len(step.tasks)} tasks; searching ...")
    space, kept = planning.module_space(step, space)
    # What lagom's floor held back is said once, of the plan kept (after the NCCL settings
    # and the structure search have each planned their candidates).
    planned = planning.plan(step, hw, strategy=strategy, baselines=baselines,
                            fingerprint=hashlib.sha256(compiled.text.encode()).hexdigest(), space=space,
                            floor_note=False)
    kept_graph, kept_space = step, space
    decisions = compiled.decisions + kept
    missing = custom_calls.unpriced(step.tasks)
    if missing:
        decisions += (("unpriced custom calls", custom_calls.describe_unpriced(missing)),)
    if hw.nodes > 1 and hw.network_assumption:
        decisions += ((NETWORK_DECISION, network_note(hw)),)
    transfers, moved = graph_lib.host_transfers(step.tasks)
    if transfers:
        decisions += (("host offloading", (
            f"{transfers} async transfers between HBM and host memory ({moved / 1e9:.2f} GB, "
            f"{kernels.host_transfer_us(moved, hw) / 1e3:.1f} ms over the host link at its datasheet rate); XLA "
            "runs them beside compute (fusion-start/-done) and they are taken as hidden: only their HBM "
            "side is priced, the host link is not a modelled resource yet")),)
    # One compile per set of options for the structure search and the verification, the
    # search's trials and the plan's own module options started now, one after another,
    # beside the NCCL settings' planning (the settings and the structure may change the plan).
    recompile = structures_lib.Recompiler(compiled.recompile) if compiled.recompile is not None else None
    if recompile is not None and strategy == "lagom":
        ahead = structures_lib.trials(compiled.text, planned) if structures else []
        own = verify_lib.module_options(planned.plan)
        recompile.start(*ahead, *([own] if own and verify else []))
    setting = None
    if strategy == "lagom" and nccl_settings_search:
        settled = nccl_settings.choose(step, planned, hw, strategy=strategy, fingerprint=planned.plan.fingerprint,
                                       log=log, space=space)
        planned, hw, setting = settled.planned, settled.hardware, settled.setting
        decisions += settled.decisions
    if structures and recompile is not None:
        planned, structure_decisions, taken_graph, taken_space = _with_structure(
            dataclasses.replace(compiled, recompile=recompile), planned, hw, strategy, baselines, log, space)
        decisions += structure_decisions
        if taken_graph is not None and taken_space is not None:
            kept_graph, kept_space = taken_graph, taken_space
        if setting is not None:  # the structure's plan was made under the setting: say so
            planned = dataclasses.replace(planned, plan=nccl_settings.with_setting(planned.plan, setting,
                                                                                   compiled.hardware))
    elif structures:
        decisions += (("structure search", f"not run: {compiled.where} cannot be compiled again here"),)
    planned = planning.note_floor(planned, kept_graph, hw, kept_space)
    plan = nccl_settings.carrying_cluster_settings(dataclasses.replace(planned.plan, decisions=decisions),
                                                   compiled.hardware)
    flags_lib.validate(plan.xla_flags(), plan.compiler_options())
    if verify and recompile is not None:
        if plan.compiler_options():
            log(f"verifying: recompiling with the plan's {len(plan.compiler_options())} option(s) (each left out "
                "once only where that module is not the predicted one) ...")
        plan, _ = verify_lib.verify_plan(plan, planned.chosen.graph, compiled.text, recompile)
    else:
        why = ("verification not asked for" if not verify else
               f"not recompiled: {compiled.where} cannot be compiled again here")
        plan = dataclasses.replace(plan, verification=(("plan", f"{why}; its options passed the "
                                                        "installed XLA's flag parser"),))
    return Job(plan, dataclasses.replace(planned, plan=plan), compiled)
