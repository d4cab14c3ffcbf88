"""Llama and Mixtral: the decoder families MaxText trains on GPUs.

Llama (Touvron et al., 2023, arXiv 2302.13971 and 2307.09288; Llama 3, arXiv 2407.21783):
pre-RMSNorm, rotary positions, grouped-query attention (``kv_heads`` key/value heads shared
by groups of query heads), a SwiGLU MLP, untied input embedding and output head, no biases.
Mixtral (Jiang et al., 2024, arXiv 2401.04088): the same trunk with every MLP replaced by
``experts`` SwiGLU experts, each token routed to its ``top_k`` best by a softmax router.

Routing follows GShard's dispatch with a fixed capacity (Lepikhin et al., 2020, arXiv
2006.16668; MaxText's "dropping" MoE): each group (one sequence) gives every expert
``capacity = ceil(tokens * top_k / experts * capacity_factor)`` slots, filled in token
order, and the assignments beyond it are dropped (the token keeps its residual). Dispatch
and combine are einsums with one-hot masks, so the program has static shapes; under the
``ep`` recipe part the experts live on the ``expert`` mesh axis while the tokens are split
over it as batch, and GSPMD moves tokens to their experts and back by all-to-all.

Dropless routing (``moe="dropless"``; MaxText's ``base.yml`` default, ``sparse_matmul: true``
with ``capacity_factor: -1``, ``src/maxtext/layers/moe.py`` ``sparse_matmul``/``permute``/
``unpermute``): each device sorts its tokens' assignments by
expert, runs the experts as grouped GEMMs (`jax.lax.ragged_dot`) and combines by the
inverse permutation; no token is dropped. With an ``expert`` axis the sorted rows travel to
the experts' devices and back by `jax.lax.ragged_all_to_all` (MaxText's expert-parallel
exchange), which XLA:GPU compiles; XLA:CPU has none, so on the CPU test devices the same
exchange runs as all-to-all of worst-case buffers (``ragged_all_to_all``). Shared experts (DeepSeek-MoE, arXiv 2401.06066) are one dense SwiGLU of
``shared_experts * expert_ffn`` beside the routed ones; ``dense_layers`` first layers have a
dense MLP of ``d_ff`` (DeepSeek-V3: 3).

Model shapes: AI-Hypercomputer/maxtext ``src/maxtext/configs/models/*.yml`` (llama2-7b,
llama2-70b, llama3-8b, llama3-70b, llama3.1-405b, mixtral-8x7b), which follow the
published checkpoints' ``config.json`` on the Hugging Face hub (meta-llama/*,
mistralai/Mixtral-8x7B-v0.1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import attention, fp8, grouped_gemm
from .layers import (ModelConfig, Norm, block_layout, cross_entropy, lookup, next_token_batch,
                     next_token_batch_shapes, normal, stack_init, weight)
from .pipeline import Stack
from .sharding import HEADS, HIDDEN, LOGITS, RESID, Layout

_NO_LAYOUT = Layout()
# [experts, groups, capacity, d_model]: the tokens dispatched to the experts, first where
# their group lives (batch over every batch axis), then where their expert lives; the
# change between the two is one all-to-all over ``expert``.
GROUP_TOKENS = (None, "act_batch", None, None)
EXPERT_TOKENS = ("act_exp", "act_exp_batch", None, None)
EXPERT_HIDDEN = ("act_exp", "act_exp_batch", None, "act_mlp")


MOE_MODES = ("dropless", "dropping", "grouped")
# How the sorted layers ("dropless", "grouped") move tokens over an expert axis: XLA's
# ``ragged_all_to_all`` of the routed rows (MaxText's); a ring: every device's tokens and
# their routing all-gathered over the axis, each shard running its experts on at most
# ``capacity`` of the assignments routed to them (the rest drop), the weighted partial outputs
# summed back by a reduce-scatter (marin's ring dispatch; no ragged collective);
# or an all-to-all of fixed-capacity buffers: the sorted rows scattered into a buffer of
# ``capacity`` slots per expert (rows past it dropped, as GShard drops them), one
# ``jax.lax.all_to_all`` each way over the expert axis, the experts' GEMMs between (what users
# pick where XLA's ragged all-to-all is slow: docs/moe.md).
MOE_DISPATCHES = ("ragged-all-to-all", "ring", "all-to-all")


@dataclasses.dataclass(frozen=True)
class MoEConfig(ModelConfig):
    """A Mixtral-family configuration: ModelConfig plus the MoE layer's own options."""

    # "dropping" (GShard capacity), the default: MaxText's dense path (``sparse_matmul=false``),
    # as its GPU end-to-end test of Mixtral 8x7B runs it (capacity_factor 1.25). Its sparse
    # path on GPUs is ``jax.lax.ragged_dot`` (megablox is a TPU Pallas kernel), which XLA:GPU
    # (jaxlib 0.10.2, and jax 0.11 as measured on an H100) compiles to one dense dot over
    # every expert, ``experts`` times the useful FLOPs; MaxText's GPU model config for
    # Mixtral 8x7B leaves ``sparse_matmul`` true and runs it. "dropless": sorted tokens,
    # grouped GEMMs (``ragged_dot``). "grouped": the same layer with its grouped GEMMs on JAX's
    # Pallas grouped-GEMM kernels (``models.grouped_gemm``; Hopper), as users run MoE on GPUs.
    moe: str = "dropping"
    shared_experts: int = 0  # always-on experts beside the routed ones (DeepSeek)
    expert_ffn: int = 0  # each expert's FFN width; 0: d_ff
    dense_layers: int = 0  # the first layers with a dense MLP of d_ff instead of experts
    # The busiest expert's share of the routed tokens over the mean (>= 1): a property of the
    # data, not of the program (nothing here reads it). The cost model prices the dropless
    # exchange at the busiest device's load (``lagom_jax.program.graph.busiest_device_load``).
    expert_imbalance: float = 1.0
    # The sorted layers' exchange over an expert axis (``MOE_DISPATCHES``).
    moe_dispatch: str = "ragged-all-to-all"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1.0 <= self.expert_imbalance <= max(1, self.experts):
            raise ValueError(f"model config: expert_imbalance {self.expert_imbalance} must be in 1..experts "
                             f"({self.experts}): the busiest expert's load over the mean")
        if self.moe not in MOE_MODES:
            raise ValueError(f"model config: moe must be one of {', '.join(MOE_MODES)}, got {self.moe!r}")
        if self.moe_dispatch not in MOE_DISPATCHES:
            raise ValueError(f"model config: moe_dispatch must be one of {', '.join(MOE_DISPATCHES)}, "
                             f"got {self.moe_dispatch!r}")
        if self.moe_dispatch != "ragged-all-to-all" and self.moe == "dropping":
            raise ValueError(f"model config: moe_dispatch={self.moe_dispatch} exchanges sorted tokens: it needs "
                             "moe=dropless or moe=grouped (moe=dropping exchanges GShard's capacity buffers)")
        if self.moe == "grouped" and self.experts:
            grouped_gemm.check_dims(self.d_model, self.ffn_e)
        if self.quantization and self.moe in ("dropless", "grouped"):
            raise ValueError("model config: quantization=fp8 with moe=dropless: MaxText's sparse path has no fp8 "
                             "grouped GEMM on GPUs (ragged_dot refuses a quantized kernel); use moe=dropping")
        for f in ("shared_experts", "expert_ffn", "dense_layers"):
            if getattr(self, f) < 0:
                raise ValueError(f"model config: {f} must be >= 0, got {getattr(self, f)}")
        if self.dense_layers >= self.layers:
            raise ValueError(f"model config: dense_layers {self.dense_layers} must be below layers "
                             f"{self.layers}")

    @property
    def ffn_e(self) -> int:
        """The FFN width of one expert."""
        return self.expert_ffn or self.d_ff


def _expert_ffn(c: ModelConfig) -> int:
    return getattr(c, "ffn_e", c.d_ff)


def rope(x: jax.Array, theta: float, positions: Any = None) -> jax.Array:
    """Rotary position embedding of ``x`` [batch, seq, heads, head_dim] (Su et al., 2021,
    arXiv 2104.09864), rotating the two halves of each head as Llama's reference code does
    after its checkpoint conversion (Hugging Face ``rotate_half``). ``positions`` [seq]: the
    position of each slot (default ``0..seq-1``; context parallelism holds them reordered)."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    pos = jnp.arange(x.shape[1]) if positions is None else jnp.asarray(positions)
    angle = pos.astype(jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class LlamaAttention(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout
    local: bool = False  # a sliding-window layer (the config's window), else global

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout
        window = c.window if self.local else 0
        kv = c.kv if self.local or not c.global_kv_heads else c.global_kv_heads

        def project(name: str, heads: int, axes: tuple[str, str, str]) -> jax.Array:
            w = weight(self, name, (c.d_model, heads, c.head_dim), axes, normal(0.02)).astype(dt)
            return lay.constrain(fp8.einsum(self, name, c.quantization, "btd,dhk->bthk", x, w), HEADS)

        # Names for the remat policies (MaxText's: query_proj, key_proj, value_proj, context,
        # out_proj, mlpwi, mlpwo).
        positions = attention.balanced_order(x.shape[1], lay.context_ways) if lay.context else None
        q = checkpoint_name(rope(project("wq", c.heads, ("embed", "heads", "kv")), c.rope_theta, positions),
                            "query_proj")
        k = checkpoint_name(rope(project("wk", kv, ("embed", "kv_heads", "kv")), c.rope_theta, positions),
                            "key_proj")
        v = checkpoint_name(project("wv", kv, ("embed", "kv_heads", "kv")), "value_proj")
        o = attention.attend(q, k, v, causal=True, impl=lay.attention, layout=lay, window=window)
        o = checkpoint_name(lay.constrain(o, HEADS), "context")
        wo = weight(self, "wo", (c.heads, c.head_dim, c.d_model), ("heads", "kv", "embed"),
                    normal(0.02)).astype(dt)
        return checkpoint_name(lay.constrain(fp8.einsum(self, "wo", c.quantization, "bqhk,hkd->bqd", o, wo), RESID),
                               "out_proj")


def _swiglu(mod: nn.Module, quantization: str, x: jax.Array, gate: jax.Array, up: jax.Array,
            spec: str) -> jax.Array:
    g = checkpoint_name(fp8.einsum(mod, "wi_0", quantization, spec, x, gate), "mlpwi_0")
    u = checkpoint_name(fp8.einsum(mod, "wi_1", quantization, spec, x, up), "mlpwi_1")
    return checkpoint_name(jax.nn.silu(g) * u, "mlpwi")


class SwiGLU(nn.Module):
    """Llama's MLP: ``wo(silu(x wi_0) * (x wi_1))`` (Shazeer, 2020, arXiv 2002.05202)."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout
    width: int = 0  # 0: the config's d_ff

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout
        f = self.width or c.d_ff
        wi = [weight(self, f"wi_{i}", (c.d_model, f), ("embed", "mlp"), normal(0.02)).astype(dt)
              for i in (0, 1)]
        h = lay.constrain(_swiglu(self, c.quantization, x, *wi, "btd,df->btf"), HIDDEN)
        wo = weight(self, "wo", (f, c.d_model), ("mlp", "embed"), normal(0.02)).astype(dt)
        return checkpoint_name(lay.constrain(fp8.einsum(self, "wo", c.quantization, "btf,fd->btd", h, wo), RESID),
                               "mlpwo")


def capacity(cfg: ModelConfig, tokens: int) -> int:
    """Slots per expert in a group of ``tokens`` tokens (GShard's expert capacity), as MaxText
    computes it: the even share rounded up, times the capacity factor, truncated
    (``int(max(ceil(tokens * top_k / experts) * capacity_factor, capacity_factor))``,
    AI-Hypercomputer/maxtext ``layers/moe.py`` ``generate_masks``)."""
    return max(1, int(max(math.ceil(tokens * cfg.top_k / cfg.experts) * cfg.capacity_factor, cfg.capacity_factor)))


def route(logits: jax.Array, top_k: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """Dispatch mask and combine weights [groups, tokens, experts, slots] of a router.

    Each token picks its ``top_k`` experts by router probability (the weights are the
    chosen probabilities renormalised to sum to one, as Mixtral does: MaxText's softmax over
    the top-k logits is the same); assignments take an expert's slots in token order, a
    token's choices in rank order (MaxText's ``generate_masks``: a cumulative count over
    the sequence's ``tokens x top_k`` assignments), and those beyond ``slots`` are dropped.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_p, top_e = jax.lax.top_k(probs, top_k)  # [g, t, k]
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    experts = logits.shape[-1]
    choice = jax.nn.one_hot(top_e, experts, dtype=jnp.int32)  # [g, t, k, e]
    # Slot of each assignment: how many earlier assignments (tokens in order, a token's
    # choices in rank order) went to the same expert.
    flat = choice.reshape(choice.shape[0], -1, experts)  # [g, t*k, e]
    position = (jnp.cumsum(flat, axis=1) - flat).reshape(choice.shape)
    # Per expert (a token picks an expert at most once): its slot and its weight, zero
    # where the token did not pick it or its slot is past capacity. The masks are built
    # elementwise, as MaxText builds them (no einsum: the layer's dots are MaxText's).
    picked = jnp.sum(choice, axis=2)  # [g, t, e]
    slot = jnp.sum(position * choice, axis=2)  # [g, t, e]
    kept = picked * (slot < slots)
    weight = jnp.sum(top_p[..., None] * choice, axis=2) * kept  # [g, t, e]
    slot_hot = jax.nn.one_hot(slot, slots, dtype=jnp.float32)  # [g, t, e, c]
    dispatch = kept[..., None].astype(jnp.float32) * slot_hot
    combine = weight[..., None] * slot_hot
    return dispatch, combine


def _expert_weights(mod: nn.Module, c: ModelConfig, dt: Any) -> tuple[list[jax.Array], jax.Array]:
    """The routed experts' stacked SwiGLU weights: ([wi_0, wi_1] [E, d, f], wo [E, f, d])."""
    f = _expert_ffn(c)
    wi = [weight(mod, f"wi_{i}", (c.experts, c.d_model, f), ("exp", "embed", "mlp"),
                 normal(0.02)).astype(dt) for i in (0, 1)]
    wo = weight(mod, "wo", (c.experts, f, c.d_model), ("exp", "mlp", "embed"), normal(0.02)).astype(dt)
    return wi, wo


def top_k_routing(logits: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """(weights, experts) [..., top_k] of a softmax router, weights renormalised (Mixtral)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_p, top_e = jax.lax.top_k(probs, top_k)
    return top_p / jnp.sum(top_p, axis=-1, keepdims=True), top_e


def _grouped_swiglu(rows: jax.Array, wi0: jax.Array, wi1: jax.Array, wo: jax.Array,
                    sizes: jax.Array, kernel: str = "", routed: int = 0) -> jax.Array:
    """The experts on rows sorted by expert: three grouped GEMMs (`jax.lax.ragged_dot`, or with
    ``kernel`` the GPU's grouped-GEMM kernels, `models.grouped_gemm`); rows beyond ``sum(sizes)``
    (buffer padding) come out zero. ``routed``: the rows the groups hold under balanced routing,
    where ``rows`` is a buffer with padding (the kernels run the groups' rows only)."""
    dot = functools.partial(grouped_gemm.grouped_matmul, kernel=kernel, rows=routed) if kernel else jax.lax.ragged_dot
    g = checkpoint_name(dot(rows, wi0, sizes), "mlpwi_0")
    u = checkpoint_name(dot(rows, wi1, sizes), "mlpwi_1")
    h = checkpoint_name(jax.nn.silu(g) * u, "mlpwi")
    return checkpoint_name(dot(h, wo, sizes), "mlpwo")


def counting_sort(keys: jax.Array, classes: int) -> tuple[jax.Array, jax.Array]:
    """(order, sizes): the stable permutation sorting ``keys`` in 0..classes-1 and the count
    of each. By counting, not by a sort: XLA:GPU turns a large sort into CUB's radix sort,
    which a deviceless compile cannot size (it needs the CUDA runtime)."""
    hot = (keys[:, None] == jnp.arange(classes)[None, :]).astype(jnp.int32)  # [m, classes]
    rank = jnp.sum((jnp.cumsum(hot, axis=0) - hot) * hot, axis=1)
    sizes = jnp.sum(hot, axis=0)
    start = jnp.cumsum(sizes) - sizes
    pos = jnp.take(start, keys) + rank
    order = jnp.zeros_like(keys).at[pos].set(jnp.arange(keys.shape[0], dtype=keys.dtype))
    return order, sizes.astype(jnp.int32)


def dropless_local(x: jax.Array, router: jax.Array, wi0: jax.Array, wi1: jax.Array, wo: jax.Array,
                   *, top_k: int, experts: int, expert_axis: str | None = None, expert_ways: int = 1,
                   model_axis: str | None = None, kernel: str = "", dispatch: str = "ragged-all-to-all",
                   slots: int = 0) -> jax.Array:
    """Dropless routed experts on one device's tokens ``x`` [b, t, d] (see the module).

    Inside a shard_map: ``expert_axis`` holds ``expert_ways`` shards of the experts (the
    weights passed are the local ones) and ``model_axis`` splits the expert FFN (partial
    outputs summed over it). ``kernel``: the grouped GEMMs on the GPU's kernels (``moe="grouped"``;
    ``grouped_gemm.KERNELS``);
    ``dispatch``: the exchange over ``expert_axis`` (``MOE_DISPATCHES``), with ``slots`` rows of
    each expert's buffer from this device for "all-to-all"."""
    b, t, d = x.shape
    n = b * t
    xf = x.reshape(n, d)
    weights, chosen = top_k_routing(jnp.einsum("nd,de->ne", xf.astype(jnp.float32), router), top_k)
    if expert_ways > 1 and dispatch == "ring":
        y = _expert_ring(xf, weights, chosen, wi0, wi1, wo, expert_axis, experts * slots, kernel)
        if model_axis is not None:
            y = jax.lax.psum(y, model_axis)
        return y.astype(x.dtype).reshape(b, t, d)
    flat = chosen.reshape(-1)  # [n*k], assignment a = token a // k
    order, sizes = counting_sort(flat.astype(jnp.int32), experts)
    rows = jnp.take(xf, order // top_k, axis=0)  # sorted by expert
    if expert_ways == 1:
        y = _grouped_swiglu(rows, wi0, wi1, wo, sizes, kernel)
    elif dispatch == "all-to-all":
        y = _expert_buffers(rows, sizes, wi0, wi1, wo, expert_axis, expert_ways, slots, kernel)
    else:
        y = _expert_exchange(rows, sizes, wi0, wi1, wo, expert_axis, expert_ways, kernel)
    if model_axis is not None:
        y = jax.lax.psum(y, model_axis)
    back = jnp.zeros_like(y).at[order].set(y)  # the inverse permutation: assignment order
    out = jnp.einsum("nkd,nk->nd", back.reshape(n, top_k, d).astype(jnp.float32), weights)
    return out.astype(x.dtype).reshape(b, t, d)


def ragged_all_to_all(operand: jax.Array, output: jax.Array, input_offsets: jax.Array, send_sizes: jax.Array,
                      output_offsets: jax.Array, recv_sizes: jax.Array, axis: str) -> jax.Array:
    """`jax.lax.ragged_all_to_all` over ``axis`` where the backend has it (XLA:GPU compiles it,
    deviceless too); on the CPU, where XLA has none (``UNIMPLEMENTED: ragged-all-to-all``),
    the same exchange through `jax.lax.all_to_all` of worst-case buffers, so that the test
    devices run the very index arithmetic the GPUs get. Row ``p`` of the block sent to peer
    ``j`` (``operand[input_offsets[j] + p]``, ``p < send_sizes[j]``) lands in ``j``'s
    ``output`` at ``output_offsets[j] + p``; ``recv_sizes[j]`` rows come from ``j``."""

    def real(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
        return jax.lax.ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                                         axis_name=axis)

    def emulated(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
        ways, m = send_sizes.shape[0], operand.shape[0]
        pos = jnp.arange(m)
        rows = jnp.take(operand, jnp.clip(input_offsets[:, None] + pos[None, :], 0, m - 1), axis=0)
        buf = jnp.where((pos[None, :] < send_sizes[:, None]).reshape(ways, m, *[1] * (operand.ndim - 1)), rows, 0)
        got = jax.lax.all_to_all(buf, axis, 0, 0, tiled=True)  # [ways (source), m, ...]
        at = jax.lax.all_to_all(output_offsets, axis, 0, 0, tiled=True)  # each source's offset here
        dest = jnp.where(pos[None, :] < recv_sizes[:, None], at[:, None] + pos[None, :], output.shape[0])
        return output.at[dest.reshape(-1)].set(got.reshape(ways * m, *operand.shape[1:]), mode="drop")

    return jax.lax.platform_dependent(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                                      cpu=emulated, default=real)


def _expert_exchange(rows: jax.Array, sizes: jax.Array, wi0: jax.Array, wi1: jax.Array, wo: jax.Array,
                     axis: str, ways: int, kernel: str = "") -> jax.Array:
    """Sorted rows to their experts' shards by ragged all-to-all, the local experts, and back.

    Every device learns every device's per-expert counts (one small all-gather), so each
    computes where its blocks land without another exchange. A shard receives at most
    ``ways * m`` rows (all of every device's rows), the buffer it provides; only the rows
    routed to it travel."""
    m, d = rows.shape
    local = sizes.shape[0] // ways
    me = jax.lax.axis_index(axis)
    counts = jax.lax.all_gather(sizes, axis).reshape(ways, ways, local)  # [src, dst shard, local expert]
    flow = counts.sum(axis=2)  # [src, dst] rows
    send, mine = flow[me], counts[:, me]  # rows I send each shard; [src, local] rows I get
    recv = mine.sum(axis=1)
    start = jnp.cumsum(send) - send  # my block for shard j in my sorted rows
    at = jnp.cumsum(recv) - recv  # source s's block in my buffer
    lands = (jnp.cumsum(flow, axis=0) - flow)[me]  # my block's offset in shard j's buffer
    cap = ways * m
    got = ragged_all_to_all(rows, jnp.zeros((cap, d), rows.dtype), start, send, lands, recv, axis)
    # The buffer is packed by source, each block sorted by local expert: regroup by expert.
    r = jnp.arange(cap)
    src = jnp.clip(jnp.sum(r[:, None] >= jnp.cumsum(recv)[None, :], axis=1), 0, ways - 1)
    ids = jnp.sum((r - at[src])[:, None] >= jnp.cumsum(mine, axis=1)[src], axis=1)
    ids = jnp.where(r < recv.sum(), ids, local)  # ``local``: buffer padding
    order, _ = counting_sort(ids.astype(jnp.int32), local + 1)
    # Balanced, a shard receives ``m`` rows: 1 / ways of every source's.
    y = _grouped_swiglu(jnp.take(got, order, axis=0), wi0, wi1, wo, mine.sum(axis=0).astype(jnp.int32), kernel,
                        routed=m)
    y = jnp.zeros_like(y).at[order].set(y)  # packed by source again
    home = (jnp.cumsum(flow, axis=1) - flow)[:, me]  # source s's block for me in its sorted rows
    return ragged_all_to_all(y, jnp.zeros_like(rows), at, recv, home, send, axis)


def _expert_ring(tokens: jax.Array, weights: jax.Array, chosen: jax.Array, wi0: jax.Array, wi1: jax.Array,
                 wo: jax.Array, axis: str, cap: int, kernel: str = "") -> jax.Array:
    """Tokens to every shard by all-gather, the local experts on the assignments routed to them,
    and the weighted outputs back by reduce-scatter: marin's ring (levanter's grug MoE kernels,
    ``_moe_mlp_ep_ring_local``), a token-sharded all-gather, then ``psum_scatter``.

    Each shard gathers every device's tokens with their routing, takes at most ``cap`` of the
    assignments routed to its ``experts / ways`` experts (the capacity factor times the even
    share; the rest drop, as marin's ring drops them), runs its experts on them and
    scatter-adds the weighted outputs into the gathered tokens' order; every device sends its
    ``n`` tokens out and receives ``ways * n`` partial outputs' worth of reduce-scatter
    traffic, whatever the routing."""
    n, d = tokens.shape
    top_k, local = chosen.shape[1], wi0.shape[0]
    me = jax.lax.axis_index(axis)
    gathered = jax.lax.all_gather(tokens, axis, tiled=True)  # [ways * n, d], source-major
    ids = jax.lax.all_gather(chosen, axis, tiled=True).reshape(-1) - me * local  # [ways * n * k]
    ids = jnp.where((ids >= 0) & (ids < local), ids, local)  # ``local``: another shard's expert
    order, sizes = counting_sort(ids.astype(jnp.int32), local + 1)
    cap = min(cap, order.shape[0])
    sel = order[:cap]  # this shard's assignments first, by expert; past its count: padding
    valid = jnp.arange(cap) < jnp.sum(sizes[:local])
    kept = jnp.diff(jnp.minimum(jnp.cumsum(sizes[:local]), cap), prepend=0)  # groups cut at the capacity
    rows = jnp.where(valid[:, None], jnp.take(gathered, sel // top_k, axis=0), 0)
    # Balanced, ``n * k`` of the gathered assignments are this shard's.
    y = _grouped_swiglu(rows, wi0, wi1, wo, kept.astype(jnp.int32), kernel, routed=min(cap, n * top_k))
    w = jnp.where(valid, jnp.take(jax.lax.all_gather(weights, axis, tiled=True).reshape(-1), sel), 0.0)
    out = jnp.zeros((gathered.shape[0], d), jnp.float32).at[sel // top_k].add(y.astype(jnp.float32) * w[:, None])
    return jax.lax.psum_scatter(out.astype(tokens.dtype), axis, scatter_dimension=0, tiled=True)


def _expert_buffers(rows: jax.Array, sizes: jax.Array, wi0: jax.Array, wi1: jax.Array, wo: jax.Array,
                    axis: str, ways: int, slots: int, kernel: str = "") -> jax.Array:
    """Sorted rows into ``slots`` rows per expert (rows past them dropped: zero out), one
    all-to-all to the experts' shards, the local experts on every source's slots, one
    all-to-all back, and each row's output read from its slot."""
    m, d = rows.shape
    experts = sizes.shape[0]
    local = experts // ways
    start = jnp.cumsum(sizes) - sizes
    expert = jnp.sum(jnp.arange(m)[:, None] >= jnp.cumsum(sizes)[None, :], axis=1)  # each row's expert
    slot = jnp.arange(m) - jnp.take(start, jnp.clip(expert, 0, experts - 1))
    kept = (expert < experts) & (slot < slots)
    at = jnp.where(kept, expert * slots + slot, experts * slots)  # past the end: dropped
    buf = jnp.zeros((experts * slots, d), rows.dtype).at[at].set(rows, mode="drop")
    # [ways (destination shard), local, slots, d] -> [ways (source), local, slots, d]
    got = jax.lax.all_to_all(buf.reshape(ways, local * slots, d), axis, 0, 0, tiled=True)
    by_expert = got.reshape(ways, local, slots, d).transpose(1, 0, 2, 3).reshape(local * ways * slots, d)
    full = jnp.full((local,), ways * slots, jnp.int32)  # every slot runs, filled or not
    y = _grouped_swiglu(by_expert, wi0, wi1, wo, full, kernel)
    y = y.reshape(local, ways, slots, d).transpose(1, 0, 2, 3).reshape(ways, local * slots, d)
    back = jax.lax.all_to_all(y, axis, 0, 0, tiled=True).reshape(experts * slots, d)
    return jnp.where(kept[:, None], jnp.take(back, jnp.minimum(at, experts * slots - 1), axis=0), 0)


class DroplessMoE(nn.Module):
    """Top-k routed SwiGLU experts, dropless: sort, grouped GEMMs, inverse permutation.

    Under a mesh the layer is a shard_map manual over every mesh axis: tokens split over
    the batch axes, experts over ``expert``, each expert's FFN over ``model`` (Megatron's
    split, the partial outputs summed); weights split over ``fsdp`` are gathered on entry
    (ZeRO-3)."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout
        router = weight(self, "router", (c.d_model, c.experts), ("embed", None), normal(0.02))
        (wi0, wi1), wo = _expert_weights(self, c, dt)
        # The kernels have no batching rule: the parameter init (vmapped over the layers, with
        # no layout) runs the same contract as ragged_dot, which gives the same parameters.
        grouped = getattr(c, "moe", "") == "grouped" and lay is not _NO_LAYOUT
        kernel = grouped_gemm.kernel_for(lay.mesh.devices.flat[0] if lay.mesh is not None else None) if grouped else ""
        if lay.mesh is None:
            return dropless_local(x, router, wi0, wi1, wo, top_k=c.top_k, experts=c.experts, kernel=kernel)
        from jax.sharding import PartitionSpec as P

        axes = dict(lay.mesh.shape)
        batch = tuple(a for a in ("data", "fsdp", "expert") if axes.get(a, 1) > 1) or None
        ep = axes.get("expert", 1) if _rule(lay, "act_exp") == "expert" else 1
        tp = "model" if axes.get("model", 1) > 1 and _rule(lay, "act_mlp") == "model" else None
        e_ax = "expert" if ep > 1 else None
        tokens = x.shape[0] * x.shape[1] // math.prod(axes[a] for a in batch or ())  # this device's
        fn = functools.partial(dropless_local, top_k=c.top_k, experts=c.experts, expert_axis=e_ax,
                               expert_ways=ep, model_axis=tp, kernel=kernel,
                               dispatch=getattr(c, "moe_dispatch", "ragged-all-to-all"), slots=capacity(c, tokens))
        run = jax.shard_map(fn, mesh=lay.mesh,
                            in_specs=(P(batch), P(), P(e_ax, None, tp), P(e_ax, None, tp), P(e_ax, tp, None)),
                            out_specs=P(batch), axis_names=frozenset(axes), check_vma=False)
        y = run(lay.constrain(x, ("act_batch", None, None)), router, wi0, wi1, wo)
        return lay.constrain(y, RESID)


def _rule(lay: Layout, name: str) -> Any:
    return dict(lay.rules).get(name)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts with fixed capacity (Mixtral's sparse MLP)."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout
        router = weight(self, "router", (c.d_model, c.experts), ("embed", None), normal(0.02))
        q = c.quantization  # MaxText's Fp8Einsum: every einsum of the layer, dispatch and combine too
        logits = lay.constrain(fp8.einsum(self, "router", q, "btd,de->bte", x.astype(jnp.float32), router),
                               ("act_batch", None, None))
        dispatch, combine = route(logits, c.top_k, capacity(c, x.shape[1]))
        tokens = lay.constrain(fp8.einsum(self, "dispatch", q, "btd,btec->ebcd", x, dispatch.astype(dt)),
                               GROUP_TOKENS)
        tokens = lay.constrain(tokens, EXPERT_TOKENS)  # the all-to-all to the experts
        wi, wo = _expert_weights(self, c, dt)
        h = lay.constrain(_swiglu(self, q, tokens, *wi, "ebcd,edf->ebcf"), EXPERT_HIDDEN)
        out = checkpoint_name(lay.constrain(fp8.einsum(self, "wo", q, "ebcf,efd->ebcd", h, wo), EXPERT_TOKENS),
                              "mlpwo")
        out = lay.constrain(out, GROUP_TOKENS)  # the all-to-all back
        y = fp8.einsum(self, "combine", q, "ebcd,btec->btd", out, combine.astype(dt))
        return lay.constrain(y, RESID)


class LlamaBlock(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout
    dense: bool = False  # a dense MLP even in an MoE config (DeepSeek's first layers)
    local: bool = False  # sliding-window attention (LlamaAttention.local)

    @nn.compact
    def __call__(self, x: jax.Array, enc: jax.Array | None = None,
                 bias: jax.Array | None = None) -> jax.Array:
        c, lay = self.cfg, self.layout

        def norm(name: str, h: jax.Array) -> jax.Array:
            return lay.constrain(Norm(True, c.norm_eps, self.dtype, name=name)(h), RESID)

        x = lay.constrain(x, RESID)
        x = x + LlamaAttention(c, self.dtype, lay, local=self.local, name="attn")(norm("ln_attn", x))
        h = norm("ln_mlp", x)
        if not c.experts or self.dense:
            return lay.constrain(x + SwiGLU(c, self.dtype, lay, name="mlp")(h), RESID)
        routed = DroplessMoE if getattr(c, "moe", "dropping") in ("dropless", "grouped") else MoE
        y = routed(c, self.dtype, lay, name="mlp")(h)
        shared = getattr(c, "shared_experts", 0)
        if shared:
            y = y + SwiGLU(c, self.dtype, lay, width=shared * _expert_ffn(c), name="shared")(h)
        return lay.constrain(x + y, RESID)


class LlamaPattern(nn.Module):
    """One repeat of a windowed/global layer pattern (``global_every`` k): k-1 sliding-window
    layers, then a global one. The layer stack scans over these (their weights differ in
    shape where the global layers have their own KV heads), as MaxText scans Gemma 3's
    repeating block."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array, enc: jax.Array | None = None,
                 bias: jax.Array | None = None) -> jax.Array:
        k = self.cfg.global_every
        for i in range(k):
            x = LlamaBlock(self.cfg, self.dtype, self.layout, local=i < k - 1, name=f"layer_{i}")(x)
        return x


def _unit(cfg: ModelConfig, dtype: Any, layout: Layout) -> nn.Module:
    """What the layer stack repeats: a block, or a windowed/global pattern of blocks."""
    if cfg.global_every:
        return LlamaPattern(cfg, dtype, layout)
    return LlamaBlock(cfg, dtype, layout, local=bool(cfg.window))


class LlamaOuter(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout

    def setup(self) -> None:
        c = self.cfg
        self.embedding = weight(self, "embedding", (c.vocab, c.d_model), ("vocab", "embed"),
                                normal(1.0))
        self.ln_f = Norm(True, c.norm_eps, self.dtype)
        self.head = weight(self, "head", (c.d_model, c.vocab), ("embed", "vocab"), normal(0.02))

    def embed(self, tokens: jax.Array) -> jax.Array:
        x = lookup(self.embedding, tokens, self.dtype, self.cfg.embed_lookup)
        return self.layout.constrain(x, RESID)

    def loss(self, x: jax.Array, targets: jax.Array) -> jax.Array:
        logits = jnp.einsum("btd,dv->btv", self.ln_f(x), self.head.astype(self.dtype))
        return cross_entropy(self.layout.constrain(logits, LOGITS), targets)

    def __call__(self, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return self.loss(self.embed(tokens), targets)


def _llama(**kw: Any) -> ModelConfig:
    return ModelConfig(**{"head_dim": 128, **kw})


def _moe(**kw: Any) -> MoEConfig:
    return MoEConfig(**{"head_dim": 128, **kw})


@dataclasses.dataclass(frozen=True)
class Llama:
    """Llama 2/3 decoders; Mixtral when the config has experts (see the module docstring)."""

    configs: dict[str, ModelConfig] = dataclasses.field(default_factory=lambda: {
        "tiny": ModelConfig(vocab=128, d_model=32, heads=4, kv_heads=2, head_dim=8, d_ff=64,
                            layers=2, max_len=16),
        "llama2-7b": _llama(vocab=32000, d_model=4096, heads=32, kv_heads=32, d_ff=11008,
                            layers=32, max_len=4096),
        "llama2-70b": _llama(vocab=32000, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                             layers=80, max_len=4096),
        "llama3-8b": _llama(vocab=128256, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                            layers=32, max_len=8192, rope_theta=500000.0),
        "llama3-70b": _llama(vocab=128256, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                             layers=80, max_len=8192, rope_theta=500000.0),
        "llama3.1-405b": _llama(vocab=128256, d_model=16384, heads=128, kv_heads=8, d_ff=53248,
                                layers=126, max_len=131072, rope_theta=500000.0),
    })

    def init(self, cfg: ModelConfig, rng: jax.Array, dtype: Any) -> Any:
        r_outer, r_blocks = jax.random.split(rng)
        tok = jnp.zeros((1, 8), jnp.int32)
        x = jnp.zeros((1, 8, cfg.d_model), dtype)
        dense = getattr(cfg, "dense_layers", 0)
        repeats, tail = divmod(cfg.layers - dense, max(cfg.global_every, 1))
        params = {"outer": LlamaOuter(cfg, dtype, _NO_LAYOUT).init(r_outer, tok, tok)["params"],
                  "blocks": stack_init(_unit(cfg, dtype, _NO_LAYOUT), r_blocks, repeats, x)}
        if tail:  # the windowed layers past the pattern's last whole repeat
            params["tail_blocks"] = stack_init(LlamaBlock(cfg, dtype, _NO_LAYOUT, local=True),
                                               jax.random.fold_in(r_blocks, 2), tail, x)
        if dense:
            params["dense_blocks"] = stack_init(LlamaBlock(cfg, dtype, _NO_LAYOUT, dense=True),
                                                jax.random.fold_in(r_blocks, 1), dense, x)
        return params

    def loss(self, cfg: ModelConfig, params: Any, batch: dict, layout: Layout, stack: Stack,
             dtype: Any) -> jax.Array:
        outer = LlamaOuter(cfg, dtype, layout)
        po = {"params": params["outer"]}
        block = _unit(cfg, dtype, block_layout(layout, stack))
        inputs, targets = batch["inputs"], batch["targets"]
        if layout.context:
            # Context parallelism holds the sequence load-balanced (MaxText reorders the batch in
            # its step the same way): the tokens and their targets in the order the ranks hold.
            order = attention.balanced_order(inputs.shape[1], layout.context_ways)
            inputs, targets = inputs[:, order], targets[:, order]
        x = outer.apply(po, inputs, method="embed")
        if "dense_blocks" in params:
            dense = LlamaBlock(cfg, dtype, block_layout(layout, stack), dense=True)
            x = stack(lambda p, h, enc, bias: dense.apply({"params": p}, h), params["dense_blocks"], x)
        x = stack(lambda p, h, enc, bias: block.apply({"params": p}, h), params["blocks"], x)
        if "tail_blocks" in params:
            tail = LlamaBlock(cfg, dtype, block_layout(layout, stack), local=True)
            x = stack(lambda p, h, enc, bias: tail.apply({"params": p}, h), params["tail_blocks"], x)
        return outer.apply(po, x, targets, method="loss")

    def batch_shapes(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        return next_token_batch_shapes(batch_size, seq_len)

    def batch(self, cfg: ModelConfig, rng: jax.Array, batch_size: int, seq_len: int) -> dict:
        return next_token_batch(cfg.vocab, rng, batch_size, seq_len)


@dataclasses.dataclass(frozen=True)
class Mixtral(Llama):
    configs: dict[str, ModelConfig] = dataclasses.field(default_factory=lambda: {
        "tiny": MoEConfig(vocab=128, d_model=32, heads=4, kv_heads=2, head_dim=8, d_ff=64,
                          layers=2, max_len=16, experts=4, top_k=2),
        # Fine-grained and shared experts and a dense first layer, at the tiny scale.
        "tiny-deepseek": MoEConfig(vocab=128, d_model=32, heads=4, kv_heads=4, head_dim=8, d_ff=64,
                                   layers=3, max_len=16, experts=8, top_k=3, shared_experts=1,
                                   expert_ffn=16, dense_layers=1),
        "mixtral-8x7b": _moe(vocab=32000, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                             layers=32, max_len=32768, rope_theta=1e6, experts=8, top_k=2),
        # mistralai/Mixtral-8x22B-v0.1 config.json: hidden 6144, 56 layers, 48 heads, 8 kv
        # heads, intermediate 16384, vocab 32768, 8 experts, top-2, rope theta 1e6.
        "mixtral-8x22b": _moe(vocab=32768, d_model=6144, heads=48, kv_heads=8, d_ff=16384,
                              layers=56, max_len=65536, rope_theta=1e6, experts=8, top_k=2),
        # marin-community/marin's FSDP MoE "hero" (experiments/grug/moe_hero_fsdp, issue #8054): hidden
        # 6144, 48 layers, 48 heads of 128; windowed layers of 512 positions with 12 KV heads, every
        # 6th layer global with 6; 128 routed experts of width 3072, top-4, and 2 shared experts of
        # 3072; capacity an even share (per expert chunk there; factor 1), vocab 128256, sequence
        # 4096. Stand-ins (docs/moe.md): GShard's one-hot dispatch for marin's sorted grouped GEMMs
        # (SonicMoE), blocked einsums for FA4's windowed kernel; no short convolutions (SConv), XSA,
        # head gates, gated norms or QK-norm; RoPE on every head dim of every layer.
        "marin-moe": _moe(vocab=128256, d_model=6144, heads=48, kv_heads=12, d_ff=3072, layers=48,
                          max_len=4096, experts=128, top_k=4, shared_experts=2, capacity_factor=1.0,
                          window=512, global_every=6, global_kv_heads=6),
        # DeepSeek-V3 shaped (arXiv 2412.19437 sec. 4.2; deepseek-ai/DeepSeek-V3 config.json):
        # hidden 7168, 61 layers, the first 3 dense (intermediate 18432), then 256 routed
        # experts of width 2048, top-8, and 1 shared expert; vocab 129280, 128 heads. MLA is
        # not modelled: standard multi-head attention with 128 heads of dim 128 (q/k/v/o
        # 7168 -> 16384) stands in; it has more attention weights than MLA's low-rank
        # projections (q_lora 1536, kv_lora 512), and no multi-token prediction module.
        "deepseek-v3": _moe(vocab=129280, d_model=7168, heads=128, kv_heads=128, d_ff=18432,
                            layers=61, max_len=4096, rope_theta=10000.0, experts=256, top_k=8,
                            shared_experts=1, expert_ffn=2048, dense_layers=3),
    })
