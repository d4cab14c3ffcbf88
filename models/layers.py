"""Transformer building blocks shared by GPT-2, BERT and T5 (flax linen).

Why linen rather than nnx: a sharding recipe here is a *table* from logical axis names to
mesh axes. Linen keeps parameters as a plain nested dict that `jax.jit` in/out shardings,
`jax.shard_map` in_specs and optax states all consume directly, and its
`nn.with_logical_partitioning` attaches the logical names at the point each weight is
created. A recipe is then only a list of rules (`nn.logical_to_mesh_axes`); no module is
rewritten per recipe, and the pipeline recipe can call one block's `apply` on a slice of
the stacked parameters inside `shard_map` without splitting/merging module state.

Every weight is created in float32 ("master weights"); the forward pass casts to the
compute dtype (float32 or bfloat16). Normalisation and softmax run in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from . import attention
from .sharding import HEADS, HIDDEN, RESID, Layout


QUANTIZATIONS = ("", "fp8")  # "fp8": models/fp8.py
EMBED_LOOKUPS = ("gather", "matmul")  # ModelConfig.embed_lookup


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters of one named configuration (e.g. GPT-2 124M)."""

    vocab: int
    d_model: int
    heads: int
    head_dim: int
    d_ff: int
    layers: int  # decoder layers for GPT-2 and Llama, encoder layers for BERT and T5
    max_len: int
    dec_layers: int = 0  # T5 only
    kv_heads: int = 0  # grouped-query attention (Llama); 0: as many as ``heads``
    experts: int = 0  # routed experts per MoE layer (Mixtral); 0: a dense MLP
    top_k: int = 0  # experts each token is routed to
    capacity_factor: float = 1.25  # expert capacity over an even share; extra tokens drop
    rope_theta: float = 10000.0  # rotary position base (Llama)
    norm_eps: float = 1e-5
    # "fp8": the dense dots in fp8 with delayed scaling, as MaxText's ``quantization: fp8``
    # (models/fp8.py; Llama and Mixtral only); "": the compute dtype.
    quantization: str = ""
    # Sliding-window attention (Llama and Mixtral): ``window`` > 0 makes layers attend the last
    # ``window`` positions; with ``global_every`` k > 1 every k-th layer stays global (Gemma 2/3
    # style: k-1 windowed layers, then one global), else every layer is windowed (Mistral).
    # Layers past the last whole repeat are windowed, as Gemma 3 lists them (its 26-layer model
    # with a pattern of 6: four repeats, then two windowed layers).
    # ``global_kv_heads``: the global layers' KV heads where they differ (0: ``kv_heads``).
    window: int = 0
    global_every: int = 0
    global_kv_heads: int = 0
    # How the token embedding (and GPT's learned positions) is looked up: "gather" (a row per
    # token) or "matmul" (a one-hot of the ids times the table: MaxText's ``use_iota_embed``,
    # Praxis' ``lookup_style="matmul"``), which runs 2 x tokens x vocab x d_model FLOPs each way.
    embed_lookup: str = "gather"
    # Gradients clipped to this global norm before the update (MaxText's
    # ``gradient_clipping_threshold``, Pax's ``CLIP_GRADIENT_NORM_TO_VALUE``); 0: not clipped.
    grad_clip: float = 0.0

    def __post_init__(self) -> None:
        for f in ("vocab", "d_model", "heads", "head_dim", "d_ff", "layers", "max_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"model config: {f} must be >= 1, got {getattr(self, f)}")
        if self.kv_heads < 0 or self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"model config: heads {self.heads} must be a multiple of kv_heads "
                             f"{self.kv_heads}")
        if self.experts < 0 or self.experts and not 0 < self.top_k <= self.experts:
            raise ValueError(f"model config: top_k {self.top_k} must be in 1..experts "
                             f"({self.experts})")
        for f in ("window", "global_every", "global_kv_heads"):
            if getattr(self, f) < 0:
                raise ValueError(f"model config: {f} must be >= 0, got {getattr(self, f)}")
        if self.global_every and not self.window:
            raise ValueError(f"model config: global_every {self.global_every} needs a window (window=...): "
                             "without one every layer is global")
        if self.global_every == 1:
            raise ValueError("model config: global_every 1 makes every layer global; use window=0, or k > 1 "
                             "for k-1 windowed layers and one global")
        patterned = self.layers - getattr(self, "dense_layers", 0)  # dense first layers stay global
        if self.global_every and patterned < self.global_every:
            raise ValueError(f"model config: {patterned} layers hold no global layer of global_every "
                             f"{self.global_every} (its k-th layer is the first global one)")
        if self.global_kv_heads and (not self.global_every or self.heads % self.global_kv_heads):
            raise ValueError(f"model config: global_kv_heads {self.global_kv_heads} needs global layers "
                             f"(global_every) and must divide heads {self.heads}")
        if self.embed_lookup not in EMBED_LOOKUPS:
            raise ValueError(f"model config: embed_lookup must be one of {', '.join(EMBED_LOOKUPS)}, "
                             f"got {self.embed_lookup!r}")
        if not self.grad_clip >= 0:
            raise ValueError(f"model config: grad_clip must be >= 0 (0: no clipping), got {self.grad_clip}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"model config: quantization must be fp8 or empty, got {self.quantization!r}")
        if self.experts and not self.capacity_factor > 0:
            raise ValueError(f"model config: capacity_factor must be positive, got "
                             f"{self.capacity_factor}")

    @property
    def kv(self) -> int:
        """Key/value heads (``heads`` unless grouped-query attention)."""
        return self.kv_heads or self.heads


def weight(mod: nn.Module, name: str, shape: tuple[int, ...], axes: tuple[str | None, ...],
           init: Any) -> jax.Array:
    return mod.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def normal(std: float) -> Any:
    return nn.initializers.normal(stddev=std)


class Norm(nn.Module):
    """LayerNorm (GPT-2, BERT) or RMSNorm without bias or mean removal (T5)."""

    rms: bool
    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]
        x32 = x.astype(jnp.float32)
        scale = weight(self, "scale", (d,), ("norm",), nn.initializers.ones)
        if self.rms:
            y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
            return (y * scale).astype(self.dtype)
        mean = jnp.mean(x32, -1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), -1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        bias = weight(self, "bias", (d,), ("norm",), nn.initializers.zeros)
        return (y * scale + bias).astype(self.dtype)


class Attention(nn.Module):
    """Multi-head attention; Megatron tensor parallelism shards the heads dimension.

    q/k/v are column-parallel (heads on the model axis), the output projection is
    row-parallel, so under `tp` each attention costs one all-reduce of the residual.
    """

    cfg: ModelConfig
    dtype: Any
    layout: Layout
    use_bias: bool
    scaled: bool  # GPT-2/BERT divide logits by sqrt(head_dim); T5 folds it into the init
    std: float

    @nn.compact
    def __call__(self, x: jax.Array, kv: jax.Array, bias: jax.Array | None,
                 causal: bool) -> jax.Array:
        c, dt = self.cfg, self.dtype
        qkv_axes = ("embed", "heads", "kv")
        shape = (c.d_model, c.heads, c.head_dim)

        def project(name: str, inp: jax.Array) -> jax.Array:
            w = weight(self, name, shape, qkv_axes, normal(self.std)).astype(dt)
            y = jnp.einsum("btd,dhk->bthk", inp, w)
            if self.use_bias:
                b = weight(self, name + "_bias", shape[1:], ("heads", "kv"), nn.initializers.zeros)
                y = y + b.astype(dt)
            return self.layout.constrain(y, HEADS)

        q, k, v = project("wq", x), project("wk", kv), project("wv", kv)
        if self.layout.attention == "flash" and bias is None and self.scaled and kv is x:

            o = attention.attend(q, k, v, causal=causal, impl="flash", layout=self.layout)
            return self._out(self.layout.constrain(o, HEADS))
        logits = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32)
        if self.scaled:
            logits = logits / np.sqrt(c.head_dim)
        if bias is not None:
            logits = logits + bias[None].astype(jnp.float32)
        if causal:
            tq, ts = logits.shape[-2:]
            mask = jnp.tril(jnp.ones((tq, ts), bool))
            logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(dt)
        return self._out(self.layout.constrain(jnp.einsum("bhqs,bshk->bqhk", probs, v), HEADS))

    def _out(self, o: jax.Array) -> jax.Array:
        """The output projection (row-parallel under ``tp``)."""
        c, dt = self.cfg, self.dtype
        wo = weight(self, "wo", (c.heads, c.head_dim, c.d_model), ("heads", "kv", "embed"),
                    normal(self.std)).astype(dt)
        y = jnp.einsum("bqhk,hkd->bqd", o, wo)
        if self.use_bias:
            bo = weight(self, "wo_bias", (c.d_model,), ("norm",), nn.initializers.zeros)
            y = y + bo.astype(dt)
        return self.layout.constrain(y, RESID)


class Mlp(nn.Module):
    """Position-wise MLP: column-parallel `wi`, row-parallel `wo` under `tp`."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout
    use_bias: bool
    activation: str  # "gelu_tanh" (GPT-2), "gelu" (BERT), "relu" (T5)
    std: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt = self.cfg, self.dtype
        wi = weight(self, "wi", (c.d_model, c.d_ff), ("embed", "mlp"), normal(self.std)).astype(dt)
        ring = self.layout.commfuse and self.layout.mesh is not None
        h = self.layout.ring_matmul("allgather", x, wi) if ring else x @ wi
        if self.use_bias:
            h = h + weight(self, "wi_bias", (c.d_ff,), ("mlp",), nn.initializers.zeros).astype(dt)
        if self.activation == "relu":
            h = jax.nn.relu(h)
        else:
            h = jax.nn.gelu(h, approximate=self.activation == "gelu_tanh")
        h = self.layout.constrain(h, HIDDEN)
        wo = weight(self, "wo", (c.d_ff, c.d_model), ("mlp", "embed"), normal(self.std)).astype(dt)
        y = self.layout.ring_matmul("reducescatter", h, wo) if ring else h @ wo
        if self.use_bias:
            bo = weight(self, "wo_bias", (c.d_model,), ("norm",), nn.initializers.zeros)
            y = y + bo.astype(dt)
        return self.layout.constrain(y, RESID)


@dataclasses.dataclass(frozen=True)
class BlockStyle:
    """What distinguishes the three families' layers."""

    pre_norm: bool  # GPT-2 and T5 normalise before each sublayer; BERT after the residual add
    rms: bool
    eps: float
    use_bias: bool
    scaled: bool
    activation: str
    causal: bool
    cross: bool  # T5 decoder: cross-attention to the encoder output


class Block(nn.Module):
    """One transformer layer; the stacks scan (or pipeline) it over stacked parameters."""

    cfg: ModelConfig
    style: BlockStyle
    dtype: Any
    layout: Layout
    std: float = 0.02

    @nn.compact
    def __call__(self, x: jax.Array, enc: jax.Array | None = None,
                 bias: jax.Array | None = None) -> jax.Array:
        s, lay = self.style, self.layout
        kw = dict(cfg=self.cfg, dtype=self.dtype, layout=lay, use_bias=s.use_bias, std=self.std)

        def norm(name: str, h: jax.Array) -> jax.Array:
            # Sequence parallelism: the norm runs on the length-sharded residual stream.
            return lay.constrain(Norm(s.rms, s.eps, self.dtype, name=name)(h), RESID)

        attn = Attention(scaled=s.scaled, name="attn", **kw)
        mlp = Mlp(activation=s.activation, name="mlp", **kw)
        x = lay.constrain(x, RESID)
        if s.pre_norm:
            h = norm("ln_attn", x)
            x = x + attn(h, h, bias, s.causal)
            if s.cross:
                h = norm("ln_cross", x)
                x = x + Attention(scaled=s.scaled, name="cross", **kw)(h, enc, None, False)
            x = x + mlp(norm("ln_mlp", x))
        else:
            x = norm("ln_attn", x + attn(x, x, bias, s.causal))
            x = norm("ln_mlp", x + mlp(x))
        return lay.constrain(x, RESID)


def lookup(table: jax.Array, ids: jax.Array, dtype: Any, style: str = "gather") -> jax.Array:
    """Rows ``ids`` of ``table`` in ``dtype``: gathered, or (``"matmul"``) as the product of the
    ids' one-hot and the table, as MaxText's ``use_iota_embed`` and Praxis' matmul lookup run it."""
    if style == "matmul":
        one_hot = (ids[..., None] == jnp.arange(table.shape[0], dtype=ids.dtype)).astype(dtype)
        return jnp.einsum("...v,vd->...d", one_hot, table.astype(dtype))
    return jnp.take(table, ids, axis=0).astype(dtype)


class Embed(nn.Module):
    """Token embedding, vocab-parallel under `tp`; `attend` is the tied output projection."""

    vocab: int
    d_model: int
    dtype: Any
    std: float = 0.02
    style: str = "gather"  # ModelConfig.embed_lookup

    def setup(self) -> None:
        self.embedding = weight(self, "embedding", (self.vocab, self.d_model), ("vocab", "embed"),
                                normal(self.std))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return lookup(self.embedding, tokens, self.dtype, self.style)

    def attend(self, x: jax.Array) -> jax.Array:
        return jnp.einsum("btd,vd->btv", x, self.embedding.astype(self.dtype))


def cross_entropy(logits: jax.Array, targets: jax.Array,
                  weights: jax.Array | None = None) -> jax.Array:
    """Mean token cross-entropy in float32 (weighted mean when weights are given)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    if weights is None:
        return jnp.mean(nll)
    w = weights.astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


# ---------------------------------------------------------------- shared by the families

def stack_init(block: nn.Module, rng: jax.Array, n: int, *args: Any) -> Any:
    """Initialise n layers at once; the stacked dimension gets the logical name 'layers'."""
    boxed = jax.vmap(lambda r: block.init(r, *args)["params"])(jax.random.split(rng, n))
    return jax.tree.map(lambda p: p.replace(names=("layers", *p.names)), boxed,
                        is_leaf=lambda p: isinstance(p, nn.Partitioned))


def unstack_layers(boxed: Any) -> Any:
    """Each layer stack of ``boxed`` (a top-level entry whose every weight leads with the
    'layers' axis, ``stack_init``) as a tuple of per-layer trees: the parameters of unrolled
    layers, as MaxText keeps them without ``scan_layers`` (one array per layer and weight, so
    no layer slices a stacked array forward nor pads its gradient back into one). Call it
    where the values are arrays or tracers (inside the init, not on ``eval_shape``'s result)."""
    boxed_leaf = lambda p: isinstance(p, nn.Partitioned)  # noqa: E731

    def split(sub: Any) -> Any:
        leaves = jax.tree.leaves(sub, is_leaf=boxed_leaf)
        if not leaves or not all(boxed_leaf(p) and p.names[:1] == ("layers",) for p in leaves):
            return sub
        return tuple(jax.tree.map(lambda p: p.replace(value=p.value[i], names=p.names[1:]), sub, is_leaf=boxed_leaf)
                     for i in range(leaves[0].value.shape[0]))

    return {k: split(v) for k, v in boxed.items()} if isinstance(boxed, Mapping) else boxed


def block_layout(layout: Layout, stack: Any) -> Layout:
    """The layout inside a layer stack. Inside the pipeline's shard_map the stage axis is
    manual; there the activations follow the weights' shardings by propagation instead of
    explicit constraints, and only the choice of attention carries over."""
    if stack.pipeline is None:
        return layout
    return dataclasses.replace(Layout(), attention=layout.attention)


def next_token_batch_shapes(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """A decoder's batch: input tokens and the next tokens as targets."""
    s = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
    return {"inputs": s, "targets": s}


def next_token_batch(vocab: int, rng: jax.Array, batch_size: int, seq_len: int) -> dict[str, jax.Array]:
    """A synthetic decoder batch: random tokens, the targets shifted by one."""
    tokens = jax.random.randint(rng, (batch_size, seq_len + 1), 0, vocab, jnp.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

