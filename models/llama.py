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

Model shapes: AI-Hypercomputer/maxtext ``src/maxtext/configs/models/*.yml`` (llama2-7b,
llama2-70b, llama3-8b, llama3-70b, llama3.1-405b, mixtral-8x7b), which follow the
published checkpoints' ``config.json`` on the Hugging Face hub (meta-llama/*,
mistralai/Mixtral-8x7B-v0.1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import attention
from .layers import (ModelConfig, Norm, block_layout, cross_entropy, next_token_batch, next_token_batch_shapes,
                     normal, stack_init, weight)
from .pipeline import Stack
from .sharding import HEADS, HIDDEN, LOGITS, RESID, Layout

_NO_LAYOUT = Layout()
# [experts, groups, capacity, d_model]: the tokens dispatched to the experts, first where
# their group lives (batch over every batch axis), then where their expert lives; the
# change between the two is one all-to-all over ``expert``.
GROUP_TOKENS = (None, "act_batch", None, None)
EXPERT_TOKENS = ("act_exp", "act_exp_batch", None, None)
EXPERT_HIDDEN = ("act_exp", "act_exp_batch", None, "act_mlp")


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of ``x`` [batch, seq, heads, head_dim] (Su et al., 2021,
    arXiv 2104.09864), rotating the two halves of each head as Llama's reference code does
    after its checkpoint conversion (Hugging Face ``rotate_half``)."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class LlamaAttention(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout

        def project(name: str, heads: int, axes: tuple[str, str, str]) -> jax.Array:
            w = weight(self, name, (c.d_model, heads, c.head_dim), axes, normal(0.02)).astype(dt)
            return lay.constrain(jnp.einsum("btd,dhk->bthk", x, w), HEADS)

        # Names for the remat policies (MaxText's: query_proj, key_proj, value_proj, context,
        # out_proj, mlpwi, mlpwo).
        q = checkpoint_name(rope(project("wq", c.heads, ("embed", "heads", "kv")), c.rope_theta),
                            "query_proj")
        k = checkpoint_name(rope(project("wk", c.kv, ("embed", "kv_heads", "kv")), c.rope_theta),
                            "key_proj")
        v = checkpoint_name(project("wv", c.kv, ("embed", "kv_heads", "kv")), "value_proj")
        o = attention.attend(q, k, v, causal=True, impl=lay.attention, layout=lay)
        o = checkpoint_name(lay.constrain(o, HEADS), "context")
        wo = weight(self, "wo", (c.heads, c.head_dim, c.d_model), ("heads", "kv", "embed"),
                    normal(0.02)).astype(dt)
        return checkpoint_name(lay.constrain(jnp.einsum("bqhk,hkd->bqd", o, wo), RESID), "out_proj")


def _swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, spec: str) -> jax.Array:
    g = jnp.einsum(spec, x, gate)
    u = jnp.einsum(spec, x, up)
    return checkpoint_name(jax.nn.silu(g) * u, "mlpwi")


class SwiGLU(nn.Module):
    """Llama's MLP: ``wo(silu(x wi_0) * (x wi_1))`` (Shazeer, 2020, arXiv 2002.05202)."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout
        wi = [weight(self, f"wi_{i}", (c.d_model, c.d_ff), ("embed", "mlp"), normal(0.02)).astype(dt)
              for i in (0, 1)]
        h = lay.constrain(_swiglu(x, *wi, "btd,df->btf"), HIDDEN)
        wo = weight(self, "wo", (c.d_ff, c.d_model), ("mlp", "embed"), normal(0.02)).astype(dt)
        return checkpoint_name(lay.constrain(h @ wo, RESID), "mlpwo")


def capacity(cfg: ModelConfig, tokens: int) -> int:
    """Slots per expert in a group of ``tokens`` tokens (GShard's expert capacity)."""
    return max(1, math.ceil(tokens * cfg.top_k / cfg.experts * cfg.capacity_factor))


def route(logits: jax.Array, top_k: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """Dispatch mask and combine weights [groups, tokens, experts, slots] of a router.

    Each token picks its ``top_k`` experts by router probability (the weights are the
    chosen probabilities renormalised to sum to one, as Mixtral does); assignments take an
    expert's slots in (choice rank, token) order, and those beyond ``slots`` are dropped.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_p, top_e = jax.lax.top_k(probs, top_k)  # [g, t, k]
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    experts = logits.shape[-1]
    choice = jax.nn.one_hot(top_e, experts, dtype=jnp.int32)  # [g, t, k, e]
    # Slot of each assignment: how many earlier assignments (all first choices before all
    # second choices, tokens in order) went to the same expert.
    by_rank = jnp.swapaxes(choice, 1, 2).reshape(choice.shape[0], -1, experts)  # [g, k*t, e]
    position = (jnp.cumsum(by_rank, axis=1) - by_rank)
    position = jnp.swapaxes(position.reshape(choice.shape[0], top_k, -1, experts), 1, 2)
    slot = jnp.sum(position * choice, axis=-1)  # [g, t, k]
    kept = (slot < slots).astype(jnp.float32)
    slot_hot = jax.nn.one_hot(slot, slots, dtype=jnp.float32)  # [g, t, k, c]; dropped -> 0
    expert_hot = choice.astype(jnp.float32) * kept[..., None]  # [g, t, k, e]
    dispatch = jnp.einsum("gtke,gtkc->gtec", expert_hot, slot_hot)
    combine = jnp.einsum("gtke,gtkc->gtec", expert_hot * top_p[..., None], slot_hot)
    return dispatch, combine


class MoE(nn.Module):
    """Top-k routed SwiGLU experts with fixed capacity (Mixtral's sparse MLP)."""

    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dt, lay = self.cfg, self.dtype, self.layout
        router = weight(self, "router", (c.d_model, c.experts), ("embed", None), normal(0.02))
        logits = lay.constrain(jnp.einsum("btd,de->bte", x.astype(jnp.float32), router),
                               ("act_batch", None, None))
        dispatch, combine = route(logits, c.top_k, capacity(c, x.shape[1]))
        tokens = lay.constrain(jnp.einsum("btd,btec->ebcd", x, dispatch.astype(dt)), GROUP_TOKENS)
        tokens = lay.constrain(tokens, EXPERT_TOKENS)  # the all-to-all to the experts
        wi = [weight(self, f"wi_{i}", (c.experts, c.d_model, c.d_ff), ("exp", "embed", "mlp"),
                     normal(0.02)).astype(dt) for i in (0, 1)]
        h = lay.constrain(_swiglu(tokens, *wi, "ebcd,edf->ebcf"), EXPERT_HIDDEN)
        wo = weight(self, "wo", (c.experts, c.d_ff, c.d_model), ("exp", "mlp", "embed"),
                    normal(0.02)).astype(dt)
        out = checkpoint_name(lay.constrain(jnp.einsum("ebcf,efd->ebcd", h, wo), EXPERT_TOKENS),
                              "mlpwo")
        out = lay.constrain(out, GROUP_TOKENS)  # the all-to-all back
        y = jnp.einsum("ebcd,btec->btd", out, combine.astype(dt))
        return lay.constrain(y, RESID)


class LlamaBlock(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout

    @nn.compact
    def __call__(self, x: jax.Array, enc: jax.Array | None = None,
                 bias: jax.Array | None = None) -> jax.Array:
        c, lay = self.cfg, self.layout

        def norm(name: str, h: jax.Array) -> jax.Array:
            return lay.constrain(Norm(True, c.norm_eps, self.dtype, name=name)(h), RESID)

        x = lay.constrain(x, RESID)
        x = x + LlamaAttention(c, self.dtype, lay, name="attn")(norm("ln_attn", x))
        mlp = MoE if c.experts else SwiGLU
        x = x + mlp(c, self.dtype, lay, name="mlp")(norm("ln_mlp", x))
        return lay.constrain(x, RESID)


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
        x = jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)
        return self.layout.constrain(x, RESID)

    def loss(self, x: jax.Array, targets: jax.Array) -> jax.Array:
        logits = jnp.einsum("btd,dv->btv", self.ln_f(x), self.head.astype(self.dtype))
        return cross_entropy(self.layout.constrain(logits, LOGITS), targets)

    def __call__(self, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return self.loss(self.embed(tokens), targets)


def _llama(**kw: Any) -> ModelConfig:
    return ModelConfig(**{"head_dim": 128, **kw})


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
        return {"outer": LlamaOuter(cfg, dtype, _NO_LAYOUT).init(r_outer, tok, tok)["params"],
                "blocks": stack_init(LlamaBlock(cfg, dtype, _NO_LAYOUT), r_blocks, cfg.layers, x)}

    def loss(self, cfg: ModelConfig, params: Any, batch: dict, layout: Layout, stack: Stack,
             dtype: Any) -> jax.Array:
        outer = LlamaOuter(cfg, dtype, layout)
        po = {"params": params["outer"]}
        block = LlamaBlock(cfg, dtype, block_layout(layout, stack))
        x = outer.apply(po, batch["inputs"], method="embed")
        x = stack(lambda p, h, enc, bias: block.apply({"params": p}, h), params["blocks"], x)
        return outer.apply(po, x, batch["targets"], method="loss")

    def batch_shapes(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        return next_token_batch_shapes(batch_size, seq_len)

    def batch(self, cfg: ModelConfig, rng: jax.Array, batch_size: int, seq_len: int) -> dict:
        return next_token_batch(cfg.vocab, rng, batch_size, seq_len)


@dataclasses.dataclass(frozen=True)
class Mixtral(Llama):
    configs: dict[str, ModelConfig] = dataclasses.field(default_factory=lambda: {
        "tiny": ModelConfig(vocab=128, d_model=32, heads=4, kv_heads=2, head_dim=8, d_ff=64,
                            layers=2, max_len=16, experts=4, top_k=2),
        "mixtral-8x7b": _llama(vocab=32000, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                               layers=32, max_len=32768, rope_theta=1e6, experts=8, top_k=2),
    })
