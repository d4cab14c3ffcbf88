"""The prediction contract: the step time of a built-in family's training step on a cluster.

``predict_train_step_ms`` is the one call used to compare predictions with measured runs
(``benchmarks/measured/workloads.py``): it builds the family at the given dimensions on a mesh,
compiles the train step with XLA's GPU pipeline for abstract GPUs of the cluster
(deviceless: nothing runs), and predicts the step with the cost model, as XLA compiles it
(``strategy="xla-default"``) or as lagom-jax would tune it (``"lagom"``). It is the
pipeline of every other face (``lagom_jax.job.run``) with a model source.

What the step is, so that it matches how MaxText/Paxml run these models on GPUs: bf16
compute with float32 master weights and AdamW, layers under ``scan``, the fused
flash-attention kernel (the score matrix is never materialised), a remat policy by
MaxText's name, batch over ``data``/``fsdp``/``expert``, weights over ``fsdp`` (ZeRO-3),
heads/MLP/vocab over ``model`` and experts over ``expert``; axes laid out data, fsdp, model,
expert with the last varying fastest, so ``model`` and ``expert`` stay inside a node.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

from lagom_jax import job as job_lib
from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.cluster import nccl_env as nccl_env_lib
from lagom_jax.cluster.nccl_env import NcclEnv
from lagom_jax.plan.nccl_settings import SYMMETRIC_BUFFERS, XLA_FIELDS
from lagom_jax.models import attention as attention_lib
from lagom_jax.models.layers import QUANTIZATIONS
from lagom_jax.costs import launch
from lagom_jax.program import custom_calls, flags as flags_lib, gpu_compile, hlo_compile, windowed_einsum

__all__ = ["AssumedNetworkWarning", "COMPILE_PRICED_FLAGS", "RUNTIME_PRICED_FLAGS", "PricingWarning", "hlo_step_job", "predict_hlo_step_ms", "predict_train_step_ms", "repredict_ms",
           "train_step_job", "train_step_source", "warn_unpriced"]

FAMILY_MODELS = {"llama": "llama", "mixtral": "mixtral", "gpt": "gpt2"}
# The contract's mesh axes, outermost first (the last varies fastest): a stage axis runs
# `models.build`'s GPipe pipeline.
MESH_AXES = ("data", "fsdp", "stage", "context", "model", "expert")
CONTEXT_STRATEGIES = ("all-gather", "ring")
# Flags that change how NCCL runs the program, not the program: priced through the
# cluster's NCCL settings (``NcclEnv``). Symmetric buffers: XLA puts collective buffers in
# collective memory and registers them as NCCL symmetric windows, where NCCL runs its
# symmetric kernels (``cost.symmetric_pick``) and, with ``NCCL_CTA_POLICY=2`` (which XLA
# never sets itself, ``nccl_env``), all-gathers and all-to-alls inside a node on the copy
# engines, holding no SM. User buffers: ``ncclCommRegister``, where NCCL runs NVLS on fewer
# CTAs (``cost.nvls_registered_ctas``). XLA's one-shot ragged all-to-all: off, the exchange
# runs through NCCL (``cost.one_shot_applies``).
# Command buffers: the thunks XLA captures in CUDA graphs, which no compiled module shows
# (``costs/launch.py``: the host's launches and captured collectives' overlap).
RUNTIME_PRICED_FLAGS = frozenset({flag for _, flag in XLA_FIELDS} | {launch.FLAG})
# Flags that change the program XLA compiles, so compiling with them prices them: the
# module the cost model reads is the one they make. The NCCL channel cap changes no
# program; it caps the cost model's NCCL channels instead.
COMPILE_PRICED_FLAGS = frozenset(
    name for name, spec in flags_lib.KNOWN_FLAGS.items()
    if spec.per_compile and not spec.runtime and name != "xla_gpu_pgle_accuracy_checker"
) | {"xla_gpu_enable_triton_gemm", "xla_disable_hlo_passes",
     # Compile-time only: stands in for custom calls without a handler here, which the
     # cost model prices from the calls themselves (``custom_calls``); it never reaches a
     # Plan. ``predict_hlo_step_ms`` turns it on by itself where a module needs it.
     "xla_gpu_mock_custom_calls"}
MODEL_PRICED_FLAGS = frozenset({"xla_gpu_nccl_collective_max_nchannels"})


def _split_flags(xla_flags: Mapping[str, Any] | None) -> tuple[dict[str, Any], int | None, dict[str, Any]]:
    """(compile options, NCCL channel cap, runtime flags by name) of ``xla_flags``;
    ValueError on a flag the cost model cannot price (it would be silently ignored
    otherwise), FlagError (a ValueError) on one the installed XLA lacks."""
    options: dict[str, Any] = {}
    cap = None
    runtime: dict[str, Any] = {}
    for name, value in (xla_flags or {}).items():
        name = name.removeprefix("--")
        if name in MODEL_PRICED_FLAGS:
            cap = int(value)
        elif name == launch.FLAG:
            runtime[name] = launch.parse(value)
        elif name in RUNTIME_PRICED_FLAGS:
            runtime[name] = value.strip().lower() in ("true", "1") if isinstance(value, str) else bool(value)
        elif name in COMPILE_PRICED_FLAGS:
            options[name] = value
        else:
            raise ValueError(
                f"xla flag {name!r} cannot be priced: the cost model sees a flag only through the "
                f"program XLA compiles with it ({', '.join(sorted(COMPILE_PRICED_FLAGS))}), as "
                f"the NCCL channel cap ({', '.join(sorted(MODEL_PRICED_FLAGS))}) or through NCCL's "
                f"settings ({', '.join(sorted(RUNTIME_PRICED_FLAGS))})")
    why = windowed_einsum.why_not() if windowed_einsum.asks_for_windowing(options) else ""
    if why:  # compiled without it, planned with the pass that decomposes what XLA would window
        warnings.warn(f"xla flag {windowed_einsum.FLAG}={options.pop(windowed_einsum.FLAG)} is not compiled in: "
                      f"{why}. Priced instead by the model's windowed-einsum pass ({windowed_einsum.WHAT_IF})",
                      PricingWarning, stacklevel=3)
        runtime[windowed_einsum.FLAG] = True
    # Spelled for the installed XLA: a user's xla_gpu_enable_pipelined_* compiles as jaxlib
    # 0.11's xla_gpu_pipeline_* there, and a flag it has neither way is refused by name.
    return (flags_lib.installed_options(options) if options else options), cap, runtime


def _compile(source: Any, hw: hardware_lib.HardwareProfile, runtime: Mapping[str, Any]) -> job_lib.Compiled:
    """``source`` compiled for ``hw``, marked for the windowed-einsum pass where ``_split_flags``
    took that flag out of the compile."""
    return dataclasses.replace(job_lib.compile_source(source, hw),
                               windowed_by_flag=bool(runtime.get(windowed_einsum.FLAG)))


def _check_strategy(strategy: str) -> None:
    if strategy not in ("xla-default", "lagom"):
        raise ValueError(f"strategy must be 'xla-default' or 'lagom', got {strategy!r}")


def _with_nccl_settings(hw: hardware_lib.HardwareProfile, cap: int | None,
                        nccl_env: Mapping[str, str] | None,
                        runtime: Mapping[str, Any] | None = None) -> hardware_lib.HardwareProfile:
    """``hw`` running with the NCCL channel cap, NCCL environment and runtime XLA flags of a
    prediction; a warning says where a setting the user gave changes nothing priced."""
    runtime = runtime or {}
    xla = {field: runtime.get(flag, getattr(hw.nccl_env, field)) for field, flag in XLA_FIELDS}
    env = NcclEnv.from_environ(nccl_env, **xla) if nccl_env else dataclasses.replace(hw.nccl_env, **xla)
    for line in nccl_env_lib.unpriced(nccl_env or {}):
        warnings.warn(line, PricingWarning, stacklevel=3)
    if cap is not None:
        if cap < 1:
            raise ValueError(f"xla_gpu_nccl_collective_max_nchannels must be >= 1 to price, got {cap}")
        if env.max_ctas:
            warnings.warn(f"xla_gpu_nccl_collective_max_nchannels={cap} changes nothing beside "
                          f"NCCL_MAX_CTAS={env.max_ctas}: NCCL's variable overrides the maxCTAs XLA passes "
                          "in its communicator config", PricingWarning, stacklevel=3)
        env = dataclasses.replace(env, config_max_ctas=min(cap, 64))
    hw = dataclasses.replace(hw, nccl_env=env, command_buffer=runtime.get(launch.FLAG, hw.command_buffer))
    if env.zero_cta and not env.symmetric_buffers:
        warnings.warn(f"NCCL_CTA_POLICY=2 without {SYMMETRIC_BUFFERS}=true moves no collective to the copy "
                      "engines (NCCL runs zero-CTA only on buffers registered as symmetric windows, which "
                      "XLA registers only under that flag): priced as NCCL's default kernels",
                      PricingWarning, stacklevel=3)
    return hw


class PricingWarning(UserWarning):
    """A setting the user gave is priced as changing nothing, and why."""


class AssumedNetworkWarning(UserWarning):
    """A prediction across nodes of a preset whose network numbers are an assumption, not a
    measurement of that system (``HardwareProfile.network_assumption``)."""


def train_step_source(family: str, *, layers: int, d_model: int, heads: int, kv_heads: int, ffn: int,
                      vocab: int, seq_len: int, global_batch: int, mesh: Mapping[str, int],
                      dtype: str = "bfloat16", remat: str = "full", experts: int = 0, top_k: int = 0,
                      attention: str = "flash", scan: bool = True, moe: str = "dropping",
                      shared_experts: int = 0, expert_ffn: int = 0, dense_layers: int = 0,
                      capacity_factor: float | None = None, expert_imbalance: float = 1.0,
                      quantization: str = "", window: int = 0, global_every: int = 0, global_kv_heads: int = 0,
                      compiler_options: Mapping[str, Any] | None = None, microbatches: int | None = None,
                      context_parallel: str = "all-gather", moe_dispatch: str = "ragged-all-to-all",
                      embed_lookup: str = "gather", grad_clip: float = 0.0, sequence_parallel: bool = False):
    """The contract's step as a ``job.ModelSource``; ValueError names what does not fit."""
    if family not in FAMILY_MODELS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILY_MODELS)}")
    if sequence_parallel and "model" not in mesh:
        raise ValueError(f"sequence_parallel shards the residual over the tensor-parallel axis: mesh {dict(mesh)} "
                         "has no 'model' axis")

    if attention not in attention_lib.IMPLS:
        raise ValueError(f"unknown attention {attention!r}; known: {', '.join(attention_lib.IMPLS)}")
    unknown = sorted(set(mesh) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown}; known: {', '.join(MESH_AXES)}")
    if any(int(n) < 1 for n in mesh.values()):
        raise ValueError(f"mesh {dict(mesh)}: every axis needs size >= 1")
    for name, value in (("layers", layers), ("d_model", d_model), ("heads", heads), ("ffn", ffn),
                        ("vocab", vocab), ("seq_len", seq_len), ("global_batch", global_batch)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if d_model % heads:
        raise ValueError(f"d_model {d_model} not divisible by heads {heads}")
    if (family == "mixtral") != (experts > 0):
        raise ValueError(f"family {family!r} with experts={experts}: mixtral needs experts >= 1 "
                         "and top_k >= 1; llama and gpt have none")
    if experts:
        check_moe(experts=experts, top_k=top_k, expert_ways=int(mesh.get("expert", 1)), moe=moe,
                  expert_imbalance=expert_imbalance, shared_experts=shared_experts, expert_ffn=expert_ffn,
                  dense_layers=dense_layers, layers=layers, moe_dispatch=moe_dispatch)
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be 'fp8' or '' (the compute dtype), got {quantization!r}")
    if quantization and family == "gpt":
        raise ValueError("quantization=fp8 is MaxText's fp8 path, built for llama and mixtral, not gpt")
    if quantization and moe in ("dropless", "grouped") and experts:
        raise ValueError(f"quantization=fp8 with moe={moe}: MaxText's sparse path has no fp8 grouped GEMM "
                         "on GPUs; use moe='dropping'")
    if family == "gpt" and kv_heads not in (0, heads):
        raise ValueError(f"family 'gpt' has no grouped-query attention: kv_heads must equal heads {heads}")
    if context_parallel not in CONTEXT_STRATEGIES:
        raise ValueError(f"context_parallel must be one of {', '.join(CONTEXT_STRATEGIES)}, got {context_parallel!r}")
    shape = {a: int(mesh[a]) for a in MESH_AXES if mesh.get(a, 1) > 1} or {"data": 1}
    ways = math.prod(shape.get(a, 1) for a in ("data", "fsdp", "expert"))
    if global_batch % ways:
        raise ValueError(f"global batch {global_batch} not divisible by data x fsdp x expert = {ways}")
    stages = shape.get("stage", 1)
    if stages > 1 and global_batch % (ways * (microbatches or 2 * stages)):
        raise ValueError(f"global batch {global_batch} not divisible by data x fsdp x expert = {ways} times the "
                         f"pipeline's {microbatches or 2 * stages} micro-batches")
    if stages > 1 and layers % stages:
        raise ValueError(f"layers {layers} not divisible by the stage axis {stages}")
    dims = dict(layers=layers, d_model=d_model, heads=heads, head_dim=d_model // heads, d_ff=ffn,
                vocab=vocab, max_len=seq_len)
    if family != "gpt":
        dims.update(kv_heads=kv_heads, experts=experts, top_k=top_k)
    if family == "mixtral":
        dims.update(moe=moe, shared_experts=shared_experts, expert_ffn=expert_ffn, dense_layers=dense_layers)
        if capacity_factor is not None:
            dims["capacity_factor"] = capacity_factor
        if expert_imbalance != 1.0:
            dims["expert_imbalance"] = expert_imbalance
        if moe_dispatch != "ragged-all-to-all":
            dims["moe_dispatch"] = moe_dispatch
    if quantization:
        dims["quantization"] = quantization
    # The config and ``models.build`` check the layout (a window that divides the sequence), the
    # lookup and the clip.
    dims.update({k: v for k, v in dict(window=window, global_every=global_every, global_kv_heads=global_kv_heads,
                                       grad_clip=grad_clip).items() if v})
    if embed_lookup != "gather":
        dims["embed_lookup"] = embed_lookup
    config = ",".join(f"{k}={v}" for k, v in dims.items())
    source = job_lib.ModelSource(FAMILY_MODELS[family], config, shape, None, global_batch, seq_len, dtype,
                                 remat, scan, attention, "off", tuple(sorted((compiler_options or {}).items())),
                                 microbatches)
    if "context" in shape and context_parallel == "ring":
        source = dataclasses.replace(source, recipe=source.resolved_recipe() + "+ring")
    if sequence_parallel:
        source = dataclasses.replace(source, recipe=source.resolved_recipe() + "+sp")
    return source


def config_dims(family: str, config: str) -> dict[str, Any]:
    """The contract's keywords (``predict_train_step_ms``) of a built-in family's named config
    (or ``"layers=..."`` dimensions): shape, and the MoE and attention-layout fields it sets."""
    from lagom_jax.models.families import resolve_config

    if family not in FAMILY_MODELS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILY_MODELS)}")
    cfg = resolve_config(FAMILY_MODELS[family], config)
    dims: dict[str, Any] = dict(layers=cfg.layers, d_model=cfg.d_model, heads=cfg.heads, kv_heads=cfg.kv,
                                ffn=cfg.d_ff, vocab=cfg.vocab)
    if cfg.experts:
        dims.update(experts=cfg.experts, top_k=cfg.top_k, moe=cfg.moe, shared_experts=cfg.shared_experts,
                    expert_ffn=cfg.expert_ffn, dense_layers=cfg.dense_layers, capacity_factor=cfg.capacity_factor,
                    expert_imbalance=cfg.expert_imbalance, moe_dispatch=cfg.moe_dispatch)
    for name in ("quantization", "window", "global_every", "global_kv_heads", "grad_clip"):
        if getattr(cfg, name):
            dims[name] = getattr(cfg, name)
    if cfg.embed_lookup != "gather":
        dims["embed_lookup"] = cfg.embed_lookup
    return dims


def check_moe(*, experts: int, top_k: int, expert_ways: int = 1, moe: str = "dropping",
              expert_imbalance: float = 1.0, shared_experts: int = 0, expert_ffn: int = 0,
              dense_layers: int = 0, layers: int | None = None, moe_dispatch: str = "ragged-all-to-all") -> None:
    """ValueError, one line naming the numbers, for MoE options that do not fit."""
    from lagom_jax.models.llama import MOE_DISPATCHES, MOE_MODES

    if moe not in MOE_MODES:
        raise ValueError(f"moe must be one of {', '.join(MOE_MODES)}, got {moe!r}")
    if moe_dispatch not in MOE_DISPATCHES:
        raise ValueError(f"moe_dispatch must be one of {', '.join(MOE_DISPATCHES)}, got {moe_dispatch!r}")
    if moe_dispatch != "ragged-all-to-all" and moe == "dropping":
        raise ValueError(f"moe_dispatch={moe_dispatch} exchanges sorted tokens: it needs moe=dropless or moe=grouped "
                         "(moe=dropping exchanges GShard's capacity buffers)")
    if moe_dispatch != "ragged-all-to-all" and expert_ways <= 1:
        raise ValueError(f"moe_dispatch={moe_dispatch} needs an expert axis to exchange over (the mesh has none): "
                         "add expert=N to the mesh, N dividing the experts")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k {top_k} must be in 1..experts ({experts})")
    if expert_ways > 1 and experts % expert_ways:
        raise ValueError(f"experts {experts} not divisible by the expert axis {expert_ways}")
    if not expert_imbalance >= 1.0:
        raise ValueError(f"expert imbalance {expert_imbalance} must be >= 1 (the busiest expert's load "
                         "over the mean)")
    if expert_imbalance > experts:
        raise ValueError(f"expert imbalance {expert_imbalance} above {experts}: the busiest of {experts} "
                         "experts holds at most all the tokens")
    for name, v in (("shared_experts", shared_experts), ("expert_ffn", expert_ffn), ("dense_layers", dense_layers)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if layers is not None and dense_layers >= layers:
        raise ValueError(f"dense_layers {dense_layers} must be below layers {layers}")


def _cluster(hardware: str | hardware_lib.HardwareProfile, gpus: int) -> hardware_lib.HardwareProfile:
    hw = hardware_lib.resolve_cluster(hardware).hardware
    if gpus <= hw.gpus_per_node:
        return hw.with_nodes(1)
    if gpus % hw.gpus_per_node:
        raise ValueError(f"{gpus} GPUs are not whole nodes of {hw.name} ({hw.gpus_per_node} GPUs each); a job "
                         f"that runs fewer GPUs of each node says how many: '{hw.name}:gpus_per_node=G'")
    return hw.with_nodes(gpus // hw.gpus_per_node)


def predict_train_step_ms(
    family: str, *, layers: int, d_model: int, heads: int, kv_heads: int, ffn: int, vocab: int,
    seq_len: int, global_batch: int, mesh: Mapping[str, int], hardware: str | hardware_lib.HardwareProfile = "h100-sxm-8",
    dtype: str = "bfloat16", remat: str = "full", experts: int = 0, top_k: int = 0,
    xla_flags: Mapping[str, Any] | None = None, strategy: str = "xla-default", scan: bool = True,
    nccl_env: Mapping[str, str] | None = None, attention: str = "flash", moe: str = "dropping",
    shared_experts: int = 0, expert_ffn: int = 0, dense_layers: int = 0, capacity_factor: float | None = None,
    expert_imbalance: float = 1.0, quantization: str = "", window: int = 0, global_every: int = 0,
    global_kv_heads: int = 0, context_parallel: str = "all-gather", moe_dispatch: str = "ragged-all-to-all",
    embed_lookup: str = "gather", grad_clip: float = 0.0, sequence_parallel: bool = False,
) -> float:
    """Predicted milliseconds per training step of ``family`` on ``mesh`` (see the module).

    family: "llama" | "mixtral" | "gpt" (GPT-2's layer: LayerNorm, GeLU, learned positions,
    tied embedding); mesh: {"data": D, "fsdp": F, "context": C, "model": T, "expert": E}, whose
    product is the number of GPUs; hardware: a preset (``nodes = GPUs / GPUs per node``); xla_flags:
    applied to the compile (and the NCCL channel cap to the cost model); a flag the cost
    model cannot price is a ValueError naming it. nccl_env: NCCL's process-wide settings
    the run uses (``nccl_env.PRICED_VARIABLES``: algorithms, protocols, NVLS, the CTA policy
    and pins, threads, buffer size; ``nccl_env.NcclEnv``),
    which restrict NCCL's choice for every collective. strategy "xla-default": the program as XLA
    compiles it with ``xla_flags`` and NCCL's own choices; "lagom": as lagom-jax tunes it.
    scan (beyond the issue's contract, default as MaxText): layers under ``scan``, else
    unrolled (MaxText's ``scan_layers=False``). attention (beyond the contract): "flash", the
    fused kernel, or "xla", the score matrix materialised (runs that used no fused attention).
    MoE (family "mixtral"; docs/moe.md): moe "dropping" (GShard capacity, ``capacity_factor``,
    default 1.25; MaxText's dense path, the default) or "dropless" (sorted tokens, grouped
    GEMMs as ``jax.lax.ragged_dot``, which XLA:GPU compiles to a dense dot over every expert) or "grouped"
    (the same layer on JAX's Pallas grouped-GEMM kernels, Hopper presets only, priced by their group
    shapes); shared_experts (dense experts every token runs, of width
    ``shared_experts * expert_ffn``); expert_ffn (each expert's FFN width, default ``ffn``);
    dense_layers (the first layers dense, of width ``ffn``); expert_imbalance (the busiest expert's
    load over the mean, >= 1; checked, but XLA compiles ``ragged_dot`` into a dense dot over every
    expert whose time does not depend on the group sizes, so it changes no prediction of a
    compiled step: see ``kernels.grouped_gemm_time_us`` for a true grouped-GEMM kernel).
    quantization "fp8" (llama, mixtral's dropping path): the dense dots in fp8 with delayed scaling
    as MaxText's ``quantization: fp8`` runs them (``lagom_jax.models.fp8``); XLA rewrites them into
    fp8 GEMMs, priced at the fp8 rate. window / global_every / global_kv_heads (llama, mixtral):
    sliding-window layers of ``window`` positions, every ``global_every``-th layer global with
    ``global_kv_heads`` KV heads (Gemma/Grug style; ``models.layers.ModelConfig``).
    context_parallel (llama with a ``context`` mesh axis; ``models/attention.py``): "all-gather"
    (MaxText's default strategy: keys and values gathered over the axis) or "ring" (passed
    around a ring of point-to-point steps); the sequence is held load-balanced either way and
    attention must be "xla". moe_dispatch (mixtral's "dropless" and "grouped" layers with an
    ``expert`` mesh axis): "ragged-all-to-all" (XLA's ragged collective, MaxText's) or "ring"
    (the rows all-gathered over the axis, the outputs reduce-scattered back). embed_lookup:
    "gather" or "matmul" (the token ids' one-hot times the table, as MaxText's
    ``use_iota_embed`` and Praxis' matmul lookup run it). grad_clip: the global norm the
    gradients are clipped to before the update (MaxText's ``gradient_clipping_threshold``);
    0, the default, clips nothing. sequence_parallel (a ``model`` mesh axis): the residual stream
    sharded over that axis between the tensor-parallel sublayers, all-gathered before them and
    reduce-scattered after (Megatron's sequence parallelism; MaxText's tensor parallelism runs
    the same collectives, its ``activation_embed`` being sharded over its ``tensor`` axis);
    default False, Megatron's all-reduce after each sublayer.

    Raises ValueError for a configuration that does not fit (naming the numbers) and
    ``gpu_compile.DevicelessUnavailable`` where this machine cannot compile for GPUs.
    """
    _check_strategy(strategy)
    job = train_step_job(family, layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ffn=ffn,
                         vocab=vocab, seq_len=seq_len, global_batch=global_batch, mesh=mesh,
                         hardware=hardware, dtype=dtype, remat=remat, experts=experts, top_k=top_k,
                         xla_flags=xla_flags, strategy=strategy, scan=scan, nccl_env=nccl_env,
                         attention=attention, moe=moe, shared_experts=shared_experts, expert_ffn=expert_ffn,
                         dense_layers=dense_layers, capacity_factor=capacity_factor,
                         expert_imbalance=expert_imbalance, quantization=quantization, window=window,
                         global_every=global_every, global_kv_heads=global_kv_heads,
                         context_parallel=context_parallel, moe_dispatch=moe_dispatch,
                         embed_lookup=embed_lookup, grad_clip=grad_clip, sequence_parallel=sequence_parallel)
    warn_unpriced(job, family)
    return job.predicted_ms(strategy)


def train_step_job(family: str, *, hardware: str | hardware_lib.HardwareProfile = "h100-sxm-8",
                   xla_flags: Mapping[str, Any] | None = None, strategy: str = "lagom",
                   nccl_env: Mapping[str, str] | None = None, **dims: Any):
    """The contract's step through the pipeline: a ``job.Job`` whose Plan holds the
    predicted step of ``strategy`` and of ``xla-default`` (``Job.predicted_ms``), and the
    compile and search behind them. ``dims``: the contract's other keywords."""
    options, cap, runtime = _split_flags(xla_flags)
    source = train_step_source(family, **dims, compiler_options=options)
    hw = _with_nccl_settings(_cluster(hardware, math.prod(source.shape().values())), cap, nccl_env, runtime)
    compiled = _compile(source, hw, runtime)
    if compiled.warnings:
        raise gpu_compile.DevicelessUnavailable(
            f"{source.describe()} was not compiled for GPUs ({'; '.join(compiled.warnings)}); "
            "a prediction from XLA:CPU's module would not be a GPU prediction")
    return job_lib.plan_compiled(compiled, strategy=strategy, baselines=("xla-default",), verify=False)


def repredict_ms(job: Any, *, nccl_env: Mapping[str, str] | None = None,
                 xla_flags: Mapping[str, Any] | None = None, strategy: str = "xla-default") -> float:
    """The step of ``job`` (``train_step_job``, ``job.run``) predicted again under the NCCL
    settings ``nccl_env`` (replacing the cluster's) and the XLA flags that change no program
    (``RUNTIME_PRICED_FLAGS``, e.g. symmetric buffers): the module compiled once is planned
    again and nothing is compiled. What ``predict_train_step_ms`` with them gives, at the
    cost of one search. ValueError for a flag that would change the program."""
    _check_strategy(strategy)
    program = sorted(n for n in (xla_flags or {}) if n.removeprefix("--") not in RUNTIME_PRICED_FLAGS)
    if program:
        raise ValueError(f"{', '.join(program)} would change the compiled program: predict it with "
                         "predict_train_step_ms(xla_flags=...), which compiles it in")
    _, _, runtime = _split_flags(xla_flags)
    compiled = job.compiled
    base = dataclasses.replace(compiled.hardware, nccl_env=dataclasses.replace(
        NcclEnv(), **{field: getattr(compiled.hardware.nccl_env, field) for field, _ in XLA_FIELDS}))
    hw = _with_nccl_settings(base, None, nccl_env, runtime)
    again = job_lib.plan_compiled(dataclasses.replace(compiled, hardware=hw), strategy=strategy,
                                  baselines=("xla-default",), verify=False)
    return again.predicted_ms(strategy)


def predict_hlo_step_ms(path: str | os.PathLike[str], *, hardware: str | hardware_lib.HardwareProfile = "h100-sxm-8",
                        nodes: int | None = None, xla_flags: Mapping[str, Any] | None = None,
                        strategy: str = "xla-default", nccl_env: Mapping[str, str] | None = None) -> float:
    """Predicted milliseconds per step of the HLO module in ``path``.

    A module XLA has compiled is predicted as it is (``xla_flags`` must then be empty: they
    cannot change a compiled program; ``nccl_env`` can). A module before optimization (XLA's benchmark
    modules, a dump's ``*.before_optimizations.txt``) is compiled deviceless for its device
    count on ``hardware`` (``nodes`` = that count / GPUs per node unless given) with
    ``xla_flags``, and the compiled module is predicted. strategy as for
    :func:`predict_train_step_ms`. Custom calls the installed XLA has no handler for
    (Transformer Engine's fused attention) are mocked for that compile only and priced from
    their operands and backend config (``lagom_jax.program.custom_calls``); a custom call no model
    prices is named in a ``custom_calls.UnpricedWarning``. Raises ValueError for a flag the model cannot price, a
    module that does not fit the cluster, or one XLA will not compile (one line with XLA's
    message), and ``HloParseError`` for text that is not HLO.
    """
    done = hlo_step_job(path, hardware=hardware, nodes=nodes, xla_flags=xla_flags, strategy=strategy,
                        nccl_env=nccl_env)
    warn_unpriced(done, os.fspath(path))
    return done.predicted_ms(strategy)


def hlo_step_job(path: str | os.PathLike[str], *, hardware: str | hardware_lib.HardwareProfile = "h100-sxm-8",
                 nodes: int | None = None, xla_flags: Mapping[str, Any] | None = None,
                 strategy: str = "xla-default", nccl_env: Mapping[str, str] | None = None) -> Any:
    """:func:`predict_hlo_step_ms`'s module through the pipeline: a ``job.Job`` whose Plan
    holds the predicted step of ``strategy`` and of ``xla-default`` (``repredict_ms`` prices
    it again under other NCCL settings without compiling)."""
    _check_strategy(strategy)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    options, cap, runtime = _split_flags(xla_flags)
    unoptimized, why = hlo_compile.classify(text) if options else (True, "")
    if not unoptimized:
        raise ValueError(f"{os.fspath(path)} is already compiled ({why}); flags that change the "
                         f"program ({', '.join(sorted(options))}) cannot apply to it")
    # A module before optimization grows a one-node cluster to its device count (job.HloSource).
    hw = _with_nccl_settings(hardware_lib.resolve_cluster(hardware, nodes=nodes).hardware, cap, nccl_env, runtime)
    source = job_lib.HloSource(text, os.fspath(path), compiler_options=tuple(sorted(options.items())))
    return job_lib.plan_compiled(_compile(source, hw, runtime), strategy=strategy, baselines=("xla-default",),
                                 verify=False)


def warn_unpriced(done: Any, where: str) -> None:
    """Name the custom calls a prediction could not price (``custom_calls.UnpricedWarning``) and
    an assumed network it stands on (``AssumedNetworkWarning``)."""
    import warnings

    for key, why in done.plan.decisions:
        if key == "unpriced custom calls":
            warnings.warn(f"{where}: unpriced custom calls in the prediction: {why}",
                          custom_calls.UnpricedWarning, stacklevel=3)
        if key == job_lib.NETWORK_DECISION:
            warnings.warn(f"{where}: {why}", AssumedNetworkWarning, stacklevel=3)

