"""GPT-2, BERT and T5: configurations, parameters, losses and synthetic batches.

Each family is a frozen value with the same four methods, so `build` treats them alike:
``init(cfg, rng, dtype)`` (boxed parameters carrying logical axis names),
``loss(cfg, params, batch, layout, stack, dtype)``, ``batch(cfg, rng, batch_size, seq_len)``
and ``batch_shapes(batch_size, seq_len)``. Parameters are a dict with an ``outer`` part
(embeddings, final norms, heads) and stacked layer parts (``blocks``; T5: ``enc_blocks``
and ``dec_blocks``) whose leading dimension has logical name ``layers``.

Training is deterministic (no dropout): the tests compare sharded and single-device runs.
Vocabularies are padded to a multiple of 128, as Megatron-LM does, so that every
tensor-parallel degree up to 128 divides them (GPT-2 50257 -> 50304, BERT 30522 -> 30592).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .llama import Llama, Mixtral
from .layers import (Block, BlockStyle, Embed, ModelConfig, Norm, block_layout, lookup,
                     cross_entropy, next_token_batch, next_token_batch_shapes, normal, stack_init,
                     weight)
from .pipeline import Stack
from .sharding import LOGITS, RESID, Layout

_NO_LAYOUT = Layout()


def _tiny(**kw: int) -> ModelConfig:
    base = dict(vocab=128, d_model=32, heads=4, head_dim=8, d_ff=128, layers=2, max_len=16)
    return ModelConfig(**{**base, **kw})


def _layer_fn(block: Block):
    return lambda p, h, enc, bias: block.apply({"params": p}, h, enc, bias)


# ----------------------------------------------------------------------------- GPT-2

GPT2_STYLE = BlockStyle(pre_norm=True, rms=False, eps=1e-5, use_bias=True, scaled=True,
                        activation="gelu_tanh", causal=True, cross=False)


class GPT2Outer(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout

    def setup(self) -> None:
        c = self.cfg
        self.wte = Embed(c.vocab, c.d_model, self.dtype, style=c.embed_lookup)
        self.wpe = weight(self, "wpe", (c.max_len, c.d_model), ("pos", "embed"), normal(0.01))
        self.ln_f = Norm(False, 1e-5, self.dtype)

    def embed(self, tokens: jax.Array) -> jax.Array:
        s = tokens.shape[1]
        pos = (lookup(self.wpe, jnp.arange(s), self.dtype, "matmul") if self.cfg.embed_lookup == "matmul"
               else self.wpe[:s].astype(self.dtype))
        x = self.wte(tokens) + pos
        return self.layout.constrain(x, RESID)

    def loss(self, x: jax.Array, targets: jax.Array) -> jax.Array:
        logits = self.layout.constrain(self.wte.attend(self.ln_f(x)), LOGITS)
        return cross_entropy(logits, targets)

    def __call__(self, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return self.loss(self.embed(tokens), targets)


@dataclasses.dataclass(frozen=True)
class GPT2:
    """Decoder-only LM (Radford et al., 2019): pre-LN, learned positions, tied output."""

    configs = {
        "tiny": _tiny(),
        "124M": ModelConfig(50304, 768, 12, 64, 3072, 12, 1024),
        "355M": ModelConfig(50304, 1024, 16, 64, 4096, 24, 1024),
        "774M": ModelConfig(50304, 1280, 20, 64, 5120, 36, 1024),
        "1.5B": ModelConfig(50304, 1600, 25, 64, 6400, 48, 1024),
    }

    def init(self, cfg: ModelConfig, rng: jax.Array, dtype: Any) -> Any:
        r_outer, r_blocks = jax.random.split(rng)
        tok = jnp.zeros((1, cfg.max_len), jnp.int32)
        block = Block(cfg, GPT2_STYLE, dtype, _NO_LAYOUT)
        x = jnp.zeros((1, cfg.max_len, cfg.d_model), dtype)
        return {"outer": GPT2Outer(cfg, dtype, _NO_LAYOUT).init(r_outer, tok, tok)["params"],
                "blocks": stack_init(block, r_blocks, cfg.layers, x)}

    def loss(self, cfg: ModelConfig, params: Any, batch: dict, layout: Layout, stack: Stack,
             dtype: Any) -> jax.Array:
        outer = GPT2Outer(cfg, dtype, layout)
        po = {"params": params["outer"]}
        block = Block(cfg, GPT2_STYLE, dtype, block_layout(layout, stack))
        x = outer.apply(po, batch["inputs"], method="embed")
        x = stack(_layer_fn(block), params["blocks"], x)
        return outer.apply(po, x, batch["targets"], method="loss")

    def batch_shapes(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        return next_token_batch_shapes(batch_size, seq_len)

    def batch(self, cfg: ModelConfig, rng: jax.Array, batch_size: int, seq_len: int) -> dict:
        return next_token_batch(cfg.vocab, rng, batch_size, seq_len)


# ------------------------------------------------------------------------------ BERT

BERT_STYLE = BlockStyle(pre_norm=False, rms=False, eps=1e-12, use_bias=True, scaled=True,
                        activation="gelu", causal=False, cross=False)
MASK_ID = 0  # synthetic batches draw real tokens from 1..vocab-1


class BERTOuter(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout

    def setup(self) -> None:
        c, dt = self.cfg, self.dtype
        self.wte = Embed(c.vocab, c.d_model, dt, style=c.embed_lookup)
        self.wpe = weight(self, "wpe", (c.max_len, c.d_model), ("pos", "embed"), normal(0.02))
        self.wtt = weight(self, "wtt", (2, c.d_model), (None, "embed"), normal(0.02))
        self.ln_emb = Norm(False, 1e-12, dt)
        self.mlm_dense = weight(self, "mlm_dense", (c.d_model, c.d_model), ("embed", None),
                                normal(0.02))
        self.mlm_bias = weight(self, "mlm_bias", (c.d_model,), ("norm",), nn.initializers.zeros)
        self.mlm_ln = Norm(False, 1e-12, dt)
        self.out_bias = weight(self, "out_bias", (c.vocab,), ("vocab",), nn.initializers.zeros)

    def embed(self, tokens: jax.Array) -> jax.Array:
        dt = self.dtype
        # Single-segment inputs: every token has token type 0.
        x = self.wte(tokens) + self.wpe[: tokens.shape[1]].astype(dt) + self.wtt[0].astype(dt)
        return self.layout.constrain(self.ln_emb(x), RESID)

    def loss(self, x: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
        dt = self.dtype
        h = jax.nn.gelu(x @ self.mlm_dense.astype(dt) + self.mlm_bias.astype(dt), approximate=False)
        logits = self.wte.attend(self.mlm_ln(h)) + self.out_bias.astype(dt)
        return cross_entropy(self.layout.constrain(logits, LOGITS), targets, weights)

    def __call__(self, tokens: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
        return self.loss(self.embed(tokens), targets, weights)


@dataclasses.dataclass(frozen=True)
class BERT:
    """Bidirectional encoder (Devlin et al., 2019), post-LN, masked-LM loss."""

    configs = {
        "tiny": _tiny(),
        "base": ModelConfig(30592, 768, 12, 64, 3072, 12, 512),
        "large": ModelConfig(30592, 1024, 16, 64, 4096, 24, 512),
    }

    def init(self, cfg: ModelConfig, rng: jax.Array, dtype: Any) -> Any:
        r_outer, r_blocks = jax.random.split(rng)
        tok = jnp.zeros((1, cfg.max_len), jnp.int32)
        w = jnp.zeros((1, cfg.max_len), jnp.float32)
        block = Block(cfg, BERT_STYLE, dtype, _NO_LAYOUT)
        x = jnp.zeros((1, cfg.max_len, cfg.d_model), dtype)
        return {"outer": BERTOuter(cfg, dtype, _NO_LAYOUT).init(r_outer, tok, tok, w)["params"],
                "blocks": stack_init(block, r_blocks, cfg.layers, x)}

    def loss(self, cfg: ModelConfig, params: Any, batch: dict, layout: Layout, stack: Stack,
             dtype: Any) -> jax.Array:
        outer = BERTOuter(cfg, dtype, layout)
        po = {"params": params["outer"]}
        block = Block(cfg, BERT_STYLE, dtype, block_layout(layout, stack))
        x = outer.apply(po, batch["inputs"], method="embed")
        x = stack(_layer_fn(block), params["blocks"], x)
        return outer.apply(po, x, batch["targets"], batch["weights"], method="loss")

    def batch_shapes(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        s = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
        return {"inputs": s, "targets": s,
                "weights": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.float32)}

    def batch(self, cfg: ModelConfig, rng: jax.Array, batch_size: int, seq_len: int) -> dict:
        r_tok, r_mask = jax.random.split(rng)
        tokens = jax.random.randint(r_tok, (batch_size, seq_len), 1, cfg.vocab, jnp.int32)
        masked = jax.random.uniform(r_mask, (batch_size, seq_len)) < 0.15
        return {"inputs": jnp.where(masked, MASK_ID, tokens), "targets": tokens,
                "weights": masked.astype(jnp.float32)}


# -------------------------------------------------------------------------------- T5

T5_ENC_STYLE = BlockStyle(pre_norm=True, rms=True, eps=1e-6, use_bias=False, scaled=False,
                          activation="relu", causal=False, cross=False)
T5_DEC_STYLE = dataclasses.replace(T5_ENC_STYLE, causal=True, cross=True)


def relative_position_bucket(rel: jax.Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
    """T5's bucketing of key-minus-query offsets (Raffel et al., 2020, sec. 2.1).

    Half the buckets (per direction) hold exact small offsets; the rest cover offsets
    logarithmically up to max_distance, beyond which all offsets share the last bucket.
    """
    n = -rel
    offset = jnp.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        offset = jnp.where(n < 0, num_buckets, 0)
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / exact) / np.log(
        max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).astype(rel.dtype)
    far = jnp.minimum(far, num_buckets - 1)
    return offset + jnp.where(n < exact, n, far)


class RelativePositionBias(nn.Module):
    """Per-head learned bias on attention logits, shared by all layers of a stack."""

    heads: int
    bidirectional: bool
    num_buckets: int = 32
    max_distance: int = 128

    @nn.compact
    def __call__(self, q_len: int, k_len: int) -> jax.Array:
        table = weight(self, "table", (self.num_buckets, self.heads), (None, "heads"), normal(0.1))
        rel = jnp.arange(k_len)[None, :] - jnp.arange(q_len)[:, None]
        bucket = relative_position_bucket(rel, self.bidirectional, self.num_buckets,
                                          self.max_distance)
        return jnp.transpose(table[bucket], (2, 0, 1))  # [heads, q_len, k_len]


class T5Outer(nn.Module):
    cfg: ModelConfig
    dtype: Any
    layout: Layout

    def setup(self) -> None:
        c, dt = self.cfg, self.dtype
        self.shared = Embed(c.vocab, c.d_model, dt, std=1.0, style=c.embed_lookup)
        self.enc_bias = RelativePositionBias(c.heads, bidirectional=True)
        self.dec_bias = RelativePositionBias(c.heads, bidirectional=False)
        self.enc_ln = Norm(True, 1e-6, dt)
        self.dec_ln = Norm(True, 1e-6, dt)

    def embed(self, tokens: jax.Array) -> jax.Array:
        return self.layout.constrain(self.shared(tokens), RESID)

    def biases(self, enc_len: int, dec_len: int) -> tuple[jax.Array, jax.Array]:
        return self.enc_bias(enc_len, enc_len), self.dec_bias(dec_len, dec_len)

    def enc_final(self, x: jax.Array) -> jax.Array:
        return self.layout.constrain(self.enc_ln(x), RESID)

    def loss(self, y: jax.Array, targets: jax.Array) -> jax.Array:
        # Tied embeddings: T5 rescales the decoder output by d_model**-0.5 first.
        y = self.dec_ln(y) * (self.cfg.d_model ** -0.5)
        return cross_entropy(self.layout.constrain(self.shared.attend(y), LOGITS), targets)

    def __call__(self, enc_tokens: jax.Array, targets: jax.Array) -> jax.Array:
        self.biases(enc_tokens.shape[1], targets.shape[1])
        return self.loss(self.enc_final(self.embed(enc_tokens)), targets)


@dataclasses.dataclass(frozen=True)
class T5:
    """Encoder-decoder (Raffel et al., 2020): pre-RMSNorm, relative position bias, ReLU."""

    configs = {
        "tiny": _tiny(dec_layers=2),
        "small": ModelConfig(32128, 512, 8, 64, 2048, 6, 512, dec_layers=6),
        "base": ModelConfig(32128, 768, 12, 64, 3072, 12, 512, dec_layers=12),
    }

    def init(self, cfg: ModelConfig, rng: jax.Array, dtype: Any) -> Any:
        r_outer, r_enc, r_dec = jax.random.split(rng, 3)
        tok = jnp.zeros((1, cfg.max_len), jnp.int32)
        x = jnp.zeros((1, cfg.max_len, cfg.d_model), dtype)
        bias = jnp.zeros((cfg.heads, cfg.max_len, cfg.max_len), jnp.float32)
        std = cfg.d_model ** -0.5  # T5 scales weights instead of the attention logits
        enc = Block(cfg, T5_ENC_STYLE, dtype, _NO_LAYOUT, std=std)
        dec = Block(cfg, T5_DEC_STYLE, dtype, _NO_LAYOUT, std=std)
        return {"outer": T5Outer(cfg, dtype, _NO_LAYOUT).init(r_outer, tok, tok)["params"],
                "enc_blocks": stack_init(enc, r_enc, cfg.layers, x, None, bias),
                "dec_blocks": stack_init(dec, r_dec, cfg.dec_layers, x, x, bias)}

    def loss(self, cfg: ModelConfig, params: Any, batch: dict, layout: Layout, stack: Stack,
             dtype: Any) -> jax.Array:
        outer = T5Outer(cfg, dtype, layout)
        po = {"params": params["outer"]}
        blay = block_layout(layout, stack)
        std = cfg.d_model ** -0.5
        enc = Block(cfg, T5_ENC_STYLE, dtype, blay, std=std)
        dec = Block(cfg, T5_DEC_STYLE, dtype, blay, std=std)
        enc_in, dec_in = batch["enc_inputs"], batch["dec_inputs"]
        enc_bias, dec_bias = outer.apply(po, enc_in.shape[1], dec_in.shape[1], method="biases")
        h = stack(_layer_fn(enc), params["enc_blocks"], outer.apply(po, enc_in, method="embed"),
                  None, enc_bias)
        h = outer.apply(po, h, method="enc_final")
        y = stack(_layer_fn(dec), params["dec_blocks"], outer.apply(po, dec_in, method="embed"),
                  h, dec_bias)
        return outer.apply(po, y, batch["targets"], method="loss")

    def batch_shapes(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        s = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
        return {"enc_inputs": s, "dec_inputs": s, "targets": s}

    def batch(self, cfg: ModelConfig, rng: jax.Array, batch_size: int, seq_len: int) -> dict:
        r_enc, r_tgt = jax.random.split(rng)
        targets = jax.random.randint(r_tgt, (batch_size, seq_len), 1, cfg.vocab, jnp.int32)
        # Teacher forcing: the decoder sees the targets shifted right behind a start token 0.
        dec_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
        return {"enc_inputs": jax.random.randint(r_enc, (batch_size, seq_len), 1, cfg.vocab,
                                                 jnp.int32),
                "dec_inputs": dec_inputs, "targets": targets}


FAMILIES: dict[str, Any] = {"gpt2": GPT2(), "bert": BERT(), "t5": T5(), "llama": Llama(),
                            "mixtral": Mixtral()}

# The smallest real size of each model: what tools use when no size is given.
DEFAULT_CONFIG: dict[str, str] = {"gpt2": "124M", "bert": "base", "t5": "small",
                                  "llama": "llama2-7b", "mixtral": "mixtral-8x7b"}


def resolve_config(model: str, config: str) -> ModelConfig:
    """A named configuration of ``model``, or custom dimensions ``"layers=80,d_model=8192,..."``
    (the fields of ModelConfig; those not given come from the model's default config)."""
    if model not in FAMILIES:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(sorted(FAMILIES))}")
    configs = FAMILIES[model].configs
    if "=" not in config:
        if config not in configs:
            raise ValueError(f"unknown {model} config {config!r}; known: {', '.join(configs)}, "
                             "or dimensions such as 'layers=80,d_model=8192,heads=64'")
        return configs[config]
    base = configs[DEFAULT_CONFIG[model]]
    fields = {f.name: f.type for f in dataclasses.fields(type(base))}
    values: dict[str, Any] = {}
    for item in config.split(","):
        key, _, value = (part.strip() for part in item.partition("="))
        key = {"ffn": "d_ff"}.get(key, key)
        if key not in fields:
            raise ValueError(f"bad {model} config {config!r}: unknown field {key!r} (known: "
                             f"{', '.join(fields)}, ffn for d_ff)")
        if fields[key] == "str":
            values[key] = value
            continue
        try:
            values[key] = float(value) if fields[key] == "float" else int(value)
        except ValueError:
            raise ValueError(f"bad {model} config {config!r}: {key}={value!r} is not a number") from None
    if "heads" in values and "head_dim" not in values and "d_model" in values:
        values["head_dim"] = values["d_model"] // values["heads"]
    return dataclasses.replace(base, **values)
