"""`build`: one call from (model, config, recipe, mesh) to a sharded, jitted train step.

The result carries abstract inputs (`jax.ShapeDtypeStruct` with shardings), so a caller can
``built.train_step.lower(*built.abstract_inputs).compile()`` for a 1.5B-parameter model
without allocating it, or call ``built.init(rng)`` and run the step for a tiny one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import attention as attention_lib
from . import fp8
from .families import FAMILIES, resolve_config
from .layers import ModelConfig, unstack_layers
from .pipeline import Pipeline, Stack, check_remat
from .sharding import (PART_AXIS, Layout, activation_rules, check_mesh, context_strategy, default_mesh_shape,
                       make_mesh, param_rules, parse_mesh, parse_recipe, to_mesh_spec)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


CPU_ANALYSIS_OPTIONS = {"xla_disable_hlo_passes": "all-reduce-promotion"}


@dataclasses.dataclass(frozen=True, eq=False)
class Built:
    """A model under a recipe on a mesh: everything needed to lower, compile or run a step.

    ``train_step(state, batch) -> (state, {"loss": scalar})`` is a `jax.jit` function with
    in/out shardings (the state argument is donated). ``abstract_inputs`` is
    ``(state, batch)`` as ShapeDtypeStructs carrying ``shardings``; ``init(rng)`` makes
    concrete ``(state, batch)`` placed on the mesh (a fixed synthetic batch).
    """

    model: str
    config: str
    recipe: str
    mesh: Mesh
    train_step: Any
    abstract_inputs: tuple[TrainState, dict[str, jax.ShapeDtypeStruct]]
    shardings: tuple[TrainState, dict[str, NamedSharding]]
    init: Callable[[jax.Array], tuple[TrainState, dict[str, jax.Array]]]
    num_params: int

    def lower(self) -> Any:
        return self.train_step.lower(*self.abstract_inputs)

    def compiled_text(self, compiler_options: Mapping[str, Any] | None = None) -> str:
        """The compiled step's HLO text, compiled from abstract inputs (nothing allocated).

        On abstract GPUs (a mesh of ``lagom_jax.program.gpu_compile.devices``) this is XLA's GPU
        pipeline. On CPU, XLA's all-reduce-promotion pass (a CPU-numerics pass the GPU
        pipeline does not run) is off: in jaxlib 0.10.2 it aborts the process on bf16
        GPipe steps ("Invalid binary instruction opcode copy").
        """
        options = dict(compiler_options or {})
        if self.mesh.devices.flat[0].platform == "cpu":
            options = {**CPU_ANALYSIS_OPTIONS, **options}
        return self.lower().compile(compiler_options=options).as_text()


@functools.cache
def _init_params(model: str, config: str, dtype: str, per_layer: bool = False) -> Callable[[jax.Array], Any]:
    """One compiled initialiser per (model, config, dtype, layout), shared by every recipe and mesh.

    Parameters are created unsharded and then placed with `device_put`; random values do
    not depend on the sharding, so every recipe starts from the same weights (per_layer: the
    same values, each layer stack split into its layers, ``layers.unstack_layers``).
    """
    family, cfg = FAMILIES[model], resolve_config(model, config)
    return jax.jit(lambda rng: nn.meta.unbox(_laid_out(family.init(cfg, rng, DTYPES[dtype]), per_layer)))


def _laid_out(boxed: Any, per_layer: bool) -> Any:
    return unstack_layers(boxed) if per_layer else boxed


def _divisor_near(n: int, want: int) -> int:
    """The divisor of ``n`` below ``n`` closest to ``want`` (a window that fits the sequence;
    one as long as the sequence is plain causal attention)."""
    return min((d for d in range(1, n) if n % d == 0), key=lambda d: (abs(d - want), -d), default=n)


def _known(kind: str, name: str, known: Sequence[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; known: {', '.join(known)}")


def _opt_state_shardings(opt_abstract: Any, param_shardings: Any, replicated: NamedSharding) -> Any:
    """Optimizer moments mirror the parameters: match each leaf by its parameter path suffix."""
    flat = jax.tree_util.tree_flatten_with_path(param_shardings)[0]
    by_path = {tuple(path): s for path, s in flat}

    def pick(path: tuple, leaf: Any) -> NamedSharding:
        for k in range(len(path)):
            if tuple(path[k:]) in by_path:
                return by_path[tuple(path[k:])]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, opt_abstract)


def _check_divisible(abstract: Any, specs: Any, mesh: Mesh, what: str) -> None:
    spec_leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    for (path, leaf), spec in zip(jax.tree_util.tree_flatten_with_path(abstract)[0], spec_leaves):
        for dim, axes in zip(leaf.shape, spec):
            if axes is None:
                continue
            n = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
            if dim % n:
                raise ValueError(
                    f"{what} {jax.tree_util.keystr(path)} of shape {leaf.shape} cannot be split "
                    f"{n} ways over mesh axes {axes} (dimension {dim}); choose a mesh whose "
                    "axis sizes divide it, or another config/recipe")


def _check_model_axes(model: str, cfg: ModelConfig, shape: Mapping[str, int]) -> None:
    """Heads over ``model`` and experts over ``expert`` must divide evenly: say which not."""
    t, e = shape.get("model", 1), shape.get("expert", 1)
    for what, n in (("heads", cfg.heads), ("kv heads", cfg.kv)):
        if n % t:
            raise ValueError(f"{model}: {what} {n} not divisible by the model axis {t}; choose "
                             f"model in {[d for d in range(1, n + 1) if n % d == 0]}")
    if e > 1 and (not cfg.experts or cfg.experts % e):
        raise ValueError(f"{model}: experts {cfg.experts} not divisible by the expert axis {e}")
    if getattr(cfg, "moe_dispatch", "") == "ring" and e <= 1:
        raise ValueError(f"{model}: moe_dispatch=ring needs an expert axis to exchange over (the mesh has none): "
                         "add expert=N (a recipe with ep), N dividing the experts")


def _check_context(model: str, cfg: ModelConfig, attention: str, seq_len: int, ways: int) -> None:
    """Context parallelism (recipe part ``cp``) is built for llama's causal attention."""
    if model != "llama" or cfg.experts:
        raise ValueError(f"context parallelism ('cp') is built for the llama family, not {model}")
    if cfg.window:
        raise ValueError("context parallelism ('cp') with sliding-window layers is not built; drop the window")
    if attention != "xla":
        raise ValueError(f"context parallelism ('cp') runs attention as einsum blocks: use attention='xla' "
                         f"(--attention xla), not {attention!r}")
    if seq_len % (2 * ways):
        raise ValueError(f"context parallelism over {ways} ranks cuts the sequence into {2 * ways} equal chunks "
                         f"(load-balanced): seq_len {seq_len} does not divide; use a multiple of {2 * ways}")


def _batch_ways(shape: Mapping[str, int]) -> int:
    """Data-parallel ranks of a mesh: its ``data`` and ``fsdp`` axes."""
    return math.prod(shape.get(a, 1) for a in ("data", "fsdp"))


def _default_microbatches(shape: Mapping[str, int]) -> int:
    """A pipeline's micro-batches unless given: two per stage."""
    return 2 * shape["stage"]


def default_batch(shape: Mapping[str, int]) -> int:
    """The smallest global batch ``build`` takes on ``shape``: one sequence per data-parallel
    rank, times the micro-batches of a pipeline (a ``stage`` axis)."""
    stages = shape.get("stage", 1) > 1
    return _batch_ways(shape) * (_default_microbatches(shape) if stages else 1)


def build(model: str, config: str, recipe: str, mesh_shape: str | Mapping[str, int] | None = None,
          *, batch_size: int = 8, seq_len: int | None = None, dtype: str = "float32",
          learning_rate: float = 1e-3, microbatches: int | None = None,
          devices: Sequence[jax.Device] | None = None, remat: str = "none", scan: bool = True,
          attention: str = "xla") -> Built:
    """Build a sharded AdamW train step for ``model``/``config`` under ``recipe`` on a mesh.

    model: ``gpt2`` | ``bert`` | ``t5`` | ``llama`` | ``mixtral``; config: a name (e.g.
    ``tiny``, ``124M``, ``llama3-8b``, ``mixtral-8x7b``) or dimensions
    ``"layers=80,d_model=8192,..."`` (families.resolve_config); recipe: parts
    ``dp fsdp tp sp ep pp cp`` joined by ``+`` (see sharding.py); mesh_shape:
    ``"data=2,model=4"`` or a dict (default: all devices on the recipe's one axis); seq_len
    defaults to the config's maximum length; dtype is the compute dtype (weights and
    optimizer state stay float32); microbatches (``pp`` only) defaults to twice the number
    of stages; remat: a policy of ``pipeline.REMAT_POLICIES`` (MaxText's names); scan:
    layers under `lax.scan` (else unrolled); attention: ``xla`` or ``flash``
    (models/attention.py).
    """
    family = FAMILIES.get(model)
    if family is None:
        raise _known("model", model, sorted(FAMILIES))
    cfg = resolve_config(model, config)
    if cfg.quantization and model not in ("llama", "mixtral"):
        raise ValueError(f"quantization={cfg.quantization} is built for llama and mixtral only (MaxText's "
                         f"fp8 path), not {model}")
    if dtype not in DTYPES:
        raise _known("dtype", dtype, list(DTYPES))
    check_remat(remat)
    if attention not in attention_lib.IMPLS:
        raise _known("attention", attention, list(attention_lib.IMPLS))
    cdt = DTYPES[dtype]
    seq_len = cfg.max_len if seq_len is None else seq_len
    if not 0 < seq_len <= cfg.max_len:
        raise ValueError(f"seq_len {seq_len} outside 1..{cfg.max_len} for {model} {config}")
    if cfg.window and (cfg.window > seq_len or seq_len % cfg.window):
        raise ValueError(f"sliding window {cfg.window} does not fit seq_len {seq_len}: the window must divide the "
                         f"sequence (the layer runs in blocks of the window), e.g. window={_divisor_near(seq_len, cfg.window)}")
    if cfg.window and model not in ("llama", "mixtral"):
        raise ValueError(f"sliding-window attention is built for llama and mixtral, not {model}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")

    parts = parse_recipe(recipe)
    devices = list(jax.devices() if devices is None else devices)
    if mesh_shape is None:
        shape = default_mesh_shape(parts, len(devices))
    else:
        shape = parse_mesh(mesh_shape)
    check_mesh(parts, shape)
    _check_model_axes(model, cfg, shape)
    context = context_strategy(parts)
    if context:
        _check_context(model, cfg, attention, seq_len, shape[PART_AXIS["cp"]])
    mesh = make_mesh(shape, devices)
    replicated = NamedSharding(mesh, PartitionSpec())

    batch_ways = _batch_ways(shape)
    pipeline = None
    if "pp" in parts:
        microbatches = microbatches or _default_microbatches(shape)
        if batch_size % (microbatches * batch_ways):
            raise ValueError(f"batch_size {batch_size} must be a multiple of microbatches "
                             f"({microbatches}) x data-parallel ways ({batch_ways})")
        pipeline = Pipeline(mesh, microbatches)
    elif batch_size % batch_ways:
        raise ValueError(f"batch size {batch_size} is not a multiple of the {batch_ways} data-parallel "
                         f"ranks (data x fsdp) of mesh {shape}: use e.g. "
                         f"{batch_ways * max(1, round(batch_size / batch_ways))}")

    # Parameters: logical names from the boxed abstract init, mapped by the recipe's rules.
    # Unrolled layers (no scan, no pipeline) keep one array per layer and weight, as MaxText's.
    per_layer = not scan and pipeline is None
    boxed = jax.eval_shape(lambda r: _laid_out(family.init(cfg, r, cdt), per_layer), jax.random.key(0))
    prules = param_rules(parts)
    pspecs = jax.tree.map(lambda s: to_mesh_spec(s, prules), nn.get_partition_spec(boxed),
                          is_leaf=lambda s: isinstance(s, PartitionSpec))
    abstract_params = nn.meta.unbox(boxed)
    _check_divisible(abstract_params, pspecs, mesh, f"{model} {config} parameter")
    param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), pspecs,
                            is_leaf=lambda s: isinstance(s, PartitionSpec))

    tx = optax.adamw(learning_rate, b1=0.9, b2=0.95, weight_decay=0.01)
    if cfg.grad_clip:  # the global norm needs every gradient before any update
        tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx)
    if cfg.quantization:  # fp8 scales and amax histories take their gradient as their new value
        tx = optax.multi_transform({"train": tx, "fp8": optax.set_to_zero()}, fp8.labels)

    def init_state(rng: jax.Array) -> TrainState:
        params = nn.meta.unbox(_laid_out(family.init(cfg, rng, cdt), per_layer))
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

    abstract_state = jax.eval_shape(init_state, jax.random.key(0))
    state_sh = TrainState(replicated, param_sh,
                          _opt_state_shardings(abstract_state.opt_state, param_sh, replicated))

    # Where a stage's share of the batch is whole, the parts outside the pipeline run on it.
    over_stage = pipeline is not None and (batch_size // batch_ways) % shape["stage"] == 0
    arules = activation_rules(parts, tuple(shape), batch_over_stage=over_stage)
    batch_sh_one = NamedSharding(mesh, to_mesh_spec(("act_batch", None), arules))
    batch_shapes = family.batch_shapes(batch_size, seq_len)
    batch_sh = {k: batch_sh_one for k in batch_shapes}
    layout = Layout(mesh, arules, commfuse="cf" in parts, attention=attention, context=context)
    stack = Stack(pipeline, remat=remat, scan=scan)

    def loss_fn(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        return family.loss(cfg, params, batch, layout, stack, cdt)

    def step(state: TrainState, batch: dict[str, jax.Array]):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if cfg.quantization:
            params = fp8.overwrite_with_gradient(params, grads)
        new = TrainState(state.step + 1, params, opt_state)
        return new, {"loss": loss}

    train_step = jax.jit(step, in_shardings=(state_sh, batch_sh),
                         out_shardings=(state_sh, {"loss": replicated}), donate_argnums=0)

    def with_sharding(a: jax.ShapeDtypeStruct, s: NamedSharding) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)

    abstract_inputs = (jax.tree.map(with_sharding, abstract_state, state_sh),
                       {k: with_sharding(v, batch_sh[k]) for k, v in batch_shapes.items()})
    def init(rng: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        params = _init_params(model, config, dtype, per_layer)(rng)
        state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
        batch = family.batch(cfg, jax.random.fold_in(rng, 1), batch_size, seq_len)
        return jax.device_put(state, state_sh), jax.device_put(batch, batch_sh)

    num_params = sum(math.prod(a.shape) for a in jax.tree.leaves(abstract_params))
    return Built(model, config, recipe, mesh, train_step, abstract_inputs, (state_sh, batch_sh),
                 init, num_params)
