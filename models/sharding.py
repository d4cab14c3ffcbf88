"""Sharding recipes: named meshes and the rules from logical axis names to mesh axes.

A recipe is a `+`-joined set of parts, each owning one mesh axis:

==========  =========  ==========================================================
part        mesh axis  what it shards
==========  =========  ==========================================================
``dp``      ``data``   the batch; parameters replicated (gradients all-reduced)
``fsdp``    ``fsdp``   the batch, and every weight along its ``embed`` dimension
                       (ZeRO-3: weights all-gathered before use, grads reduced)
``tp``      ``model``  Megatron: attention heads, MLP hidden and vocab dimensions
``sp``      ``model``  with ``tp``: the residual stream along the sequence, so
                       layer norms run on sequence shards (all-gather before and
                       reduce-scatter after each tensor-parallel sublayer)
``ep``      ``expert`` the experts of MoE layers (Mixtral), and the batch outside
                       them: tokens reach their experts by all-to-all
``pp``      ``stage``  the stacked layer dimension; GPipe schedule (pipeline.py)
``cf``      ``model``  with ``tp+sp``: the MLP's all-gather + matmul and matmul +
                       reduce-scatter run as CommFuse rings of point-to-point
                       steps beside partial matmuls (`lagom_jax.ops`)
``cp``      ``context`` context parallelism (llama): every activation along the
                       sequence, load-balanced, and every weight along its
                       ``embed`` dimension as under ``fsdp`` (MaxText shards
                       ``embed`` over its ``context`` axis too); attention
                       all-gathers the keys and values (MaxText's default
                       ``context_parallel_strategy: all_gather``)
``ring``    ``context`` with ``cp``: attention passes the key/value chunks around a
                       ring of point-to-point steps instead (Transformer
                       Engine's ring attention, MaxText's strategy ``ring``)
==========  =========  ==========================================================

Combinations follow from the mesh, e.g. recipe ``dp+tp`` on ``data=2,model=4`` or
``dp+pp+tp`` on ``data=2,stage=2,model=2``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from lagom_jax import ops

PART_AXIS: dict[str, str] = {"dp": "data", "fsdp": "fsdp", "tp": "model", "sp": "model",
                             "pp": "stage", "cf": "model", "ep": "expert", "cp": "context", "ring": "context"}

# Logical names of activation dimensions; a recipe maps them to mesh axes (below).
RESID = ("act_batch", "act_res_len", "act_embed")  # the residual stream between sublayers
HEADS = ("act_batch", "act_len", "act_heads", None)  # q/k/v: [batch, length, heads, head_dim]
HIDDEN = ("act_batch", "act_len", "act_mlp")  # MLP hidden: [batch, length, d_ff]
LOGITS = ("act_batch", "act_len", "act_vocab")  # output logits: [batch, length, vocab]

BATCH_AXES = ("data", "fsdp", "expert")
# The order of mesh axes, slowest-varying first: with devices numbered host by host, the
# last axes (``model``, ``expert``) stay inside a node and ``data``/``fsdp`` span nodes, the
# split MaxText makes between its DCN and ICI meshes.
AXIS_ORDER = ("data", "stage", "fsdp", "context", "model", "expert")

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def parse_recipe(recipe: str) -> frozenset[str]:
    """``"dp+tp"`` -> {"dp", "tp"}; ``tp+sp`` is the only part that needs another."""
    parts = frozenset(p.strip() for p in recipe.split("+") if p.strip())
    unknown = sorted(parts - PART_AXIS.keys())
    if unknown or not parts:
        raise ValueError(f"unknown recipe {recipe!r} (parts {unknown}); known parts: "
                         f"{sorted(PART_AXIS)}, joined with '+', e.g. 'dp+tp', 'tp+sp', 'dp+pp+tp'")
    if "sp" in parts and "tp" not in parts:
        raise ValueError(f"recipe {recipe!r}: 'sp' shards along the tensor-parallel axis; "
                         "use it as 'tp+sp'")
    if "cf" in parts and not {"tp", "sp"} <= parts:
        raise ValueError(f"recipe {recipe!r}: 'cf' decomposes the all-gather and reduce-scatter "
                         "of sequence parallelism; use it as 'tp+sp+cf'")
    if "ring" in parts and "cp" not in parts:
        raise ValueError(f"recipe {recipe!r}: 'ring' is a context-parallel attention strategy; use it as "
                         "'cp+ring'")
    if "cp" in parts and parts & {"sp", "pp", "ep"}:
        raise ValueError(f"recipe {recipe!r}: context parallelism ('cp') is built beside dp, fsdp and tp "
                         f"only, not {sorted(parts & {'sp', 'pp', 'ep'})}")
    if {"sp", "pp"} <= parts:
        raise ValueError(f"recipe {recipe!r}: inside the pipeline activations follow the "
                         "weights' shardings, so 'sp' cannot be combined with 'pp'; use "
                         "'pp+tp' or 'tp+sp'")
    return parts


def parse_mesh(spec: str | Mapping[str, int]) -> dict[str, int]:
    """``"data=2,model=4"`` -> {"data": 2, "model": 4} (order kept: it is the mesh order)."""
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        items = []
        for field in spec.split(","):
            name, sep, size = field.partition("=")
            if not sep or not name.strip() or not size.strip().isdigit():
                raise ValueError(f"bad mesh spec {spec!r}: expected 'axis=size,...', "
                                 "e.g. 'data=2,model=4'")
            items.append((name.strip(), int(size)))
    known = set(PART_AXIS.values())
    shape: dict[str, int] = {}
    for name, size in items:
        if name not in known:
            raise ValueError(f"unknown mesh axis {name!r} in {spec!r}; known: {sorted(known)}")
        if name in shape or int(size) < 1:
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} repeated or size < 1")
        shape[name] = int(size)
    return shape


def default_mesh_shape(parts: frozenset[str], num_devices: int) -> dict[str, int]:
    axes = sorted({PART_AXIS[p] for p in parts})
    if len(axes) != 1:
        raise ValueError(f"recipe {'+'.join(sorted(parts))!r} uses axes {axes}: pass mesh_shape, "
                         f"e.g. {','.join(f'{a}=2' for a in axes)!r}")
    return {axes[0]: num_devices}


def check_mesh(parts: frozenset[str], shape: Mapping[str, int]) -> None:
    need = {PART_AXIS[p] for p in parts}
    missing, extra = sorted(need - shape.keys()), sorted(shape.keys() - need)
    if missing or extra:
        raise ValueError(f"recipe {'+'.join(sorted(parts))!r} needs mesh axes {sorted(need)}; "
                         f"mesh {dict(shape)} lacks {missing} and has unused {extra}")


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with Auto axes (GSPMD propagation) on the first prod(shape) devices."""
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(shape.values())
    if n > len(devices):
        raise ValueError(f"mesh {dict(shape)} needs {n} devices, only {len(devices)} present "
                         "(tests: jax_num_cpu_devices; benchmarks run a subprocess per count)")
    grid = np.array(devices[:n], dtype=object).reshape(tuple(shape.values()))
    return Mesh(grid, tuple(shape), axis_types=(AxisType.Auto,) * len(shape))


def param_rules(parts: frozenset[str]) -> Rules:
    """Logical parameter axes -> mesh axes (first applicable rule wins, per flax)."""
    rules: list[tuple[str, str]] = []
    if "pp" in parts:
        rules.append(("layers", "stage"))
    if "ep" in parts:
        rules.append(("exp", "expert"))
    if "tp" in parts:
        rules += [("heads", "model"), ("kv_heads", "model"), ("mlp", "model"), ("vocab", "model")]
    # Weights along ``embed`` over ``fsdp`` and ``context`` (MaxText's rule for ``embed``
    # lists both): context ranks hold different tokens, so they shard the weights as FSDP
    # ranks do.
    embed = tuple(PART_AXIS[p] for p in ("fsdp", "cp") if p in parts)
    if embed:
        rules.append(("embed", embed if len(embed) > 1 else embed[0]))
    return tuple(rules)


def activation_rules(parts: frozenset[str], mesh_axes: Sequence[str], *, batch_over_stage: bool = False) -> Rules:
    """Logical activation axes -> mesh axes. ``batch_over_stage``: outside a pipeline the batch
    is split over ``stage`` too, so the embedding, the head and the loss run on a stage's share
    of the batch instead of all of it on every stage (the pipeline gathers it at its entry)."""
    batch = tuple(a for a in BATCH_AXES if a in mesh_axes)
    if batch_over_stage and "stage" in mesh_axes:
        # Last: within each data rank's rows, so a rank's stages hold its micro-batches and
        # the pipeline's entry gathers them over ``stage`` alone.
        batch = (*batch, "stage")
    rules: list[tuple[str, str | tuple[str, ...] | None]] = [("act_batch", batch or None)]
    if "ep" in parts:
        # Tokens dispatched to experts: [experts, groups, capacity, d_model], the experts
        # over ``expert`` and the groups over the other batch axes (the all-to-all's output).
        rules += [("act_exp", "expert"),
                  ("act_exp_batch", tuple(a for a in batch if a != "expert") or None)]
    else:
        # No expert axis: every device runs every expert on the groups of its own tokens
        # (without this rule the dispatched tokens would be gathered onto every device).
        rules.append(("act_exp_batch", batch or None))
    if "tp" in parts:
        rules += [("act_heads", "model"), ("act_mlp", "model"), ("act_vocab", "model")]
    if "sp" in parts:
        rules.append(("act_res_len", "model"))
    if "cp" in parts:
        rules += [("act_res_len", "context"), ("act_len", "context")]
    return tuple(rules)


def context_strategy(parts: frozenset[str]) -> str:
    """How attention runs under context parallelism: "" (none), "all-gather" or "ring"."""
    if "cp" not in parts:
        return ""
    return "ring" if "ring" in parts else "all-gather"


def to_mesh_spec(logical: Sequence[str | None], rules: Rules) -> PartitionSpec:
    return nn.logical_to_mesh_axes(tuple(logical), list(rules))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where activations live: `constrain` pins a tensor to its recipe sharding.

    ``mesh=None`` means "no constraints" (single device, or inside the pipeline's
    shard_map, where propagation from the weights decides).
    """
    mesh: Mesh | None = None
    rules: Rules = ()
    # Recipe part ``cf``: the MLP's sequence-parallel collectives run as CommFuse rings.
    commfuse: bool = False
    # How attention runs (models/attention.py): "xla" materialises the scores, "flash" runs
    # the fused flash-attention kernel.
    attention: str = "xla"
    # Context parallelism (recipe part ``cp``): "" none, "all-gather" or "ring"; the sequence
    # is then held load-balanced over ``context`` (attention.balanced_order).
    context: str = ""

    @property
    def context_ways(self) -> int:
        return self.mesh.shape[PART_AXIS["cp"]] if self.context and self.mesh is not None else 1

    def constrain(self, x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
        if self.mesh is None:
            return x
        spec = to_mesh_spec(logical, self.rules)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def ring_matmul(self, kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
        """``x @ w`` with the sequence-parallel collective around it decomposed into a ring
        over the ``model`` axis (`lagom_jax.ops`): ``kind`` "allgather" takes ``x``
        sharded along its length and ``w`` along its columns; "reducescatter" takes ``x``
        sharded along its last dimension and ``w`` along its rows and returns the result
        sharded along the length. Other mesh axes stay with GSPMD."""
        if kind == "allgather":
            fn, in_specs, out_spec = (lambda a, b: ops.allgather_matmul(a, b, "model"),
                                      (PartitionSpec(None, "model", None), PartitionSpec(None, "model")),
                                      PartitionSpec(None, None, "model"))
        else:
            fn, in_specs, out_spec = (lambda a, b: ops.matmul_reducescatter(a, b, "model"),
                                      (PartitionSpec(None, None, "model"), PartitionSpec("model", None)),
                                      PartitionSpec(None, "model", None))
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_spec,
                             axis_names=frozenset({"model"}))(x, w)
