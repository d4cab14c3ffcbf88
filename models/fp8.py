"""fp8 training as MaxText runs it on NVIDIA GPUs (``quantization: "fp8"``).

MaxText's ``Fp8Quantization`` (AI-Hypercomputer/maxtext ``src/maxtext/layers/quantizations.py``)
runs every dense layer through flax's ``Fp8DirectDotGeneralOp`` and every MoE einsum through
``Fp8Einsum`` (dispatch and combine included in training); the output head is not quantized.
Both call ``flax.linen.fp8_ops.fp8_scaled_dot_general``: delayed scaling as Transformer
Engine does it. Each dot keeps three scales and three amax histories (1024 steps: the
inputs and the kernel in e4m3, the output's gradient in e5m2); the operands are scaled,
clipped and cast to fp8 with the scale the history gives, the dot runs on the fp8 operands
and its output is rescaled. XLA:GPU's GEMM rewriter turns that pattern into an fp8 GEMM
(a Triton GEMM fusion on fp8 operands, or cuBLASLt's ``__cublas$lt$matmul$f8``), which
``lagom_jax.program.custom_calls`` prices at the fp8 rate; the amax reductions, the casts
and the history updates are ordinary fusions in the module and are priced as such.

The scales and histories are not trained: their "gradient" is their new value (flax's
``OVERWRITE_WITH_GRADIENT`` collection). Here they are parameters named ``*_fp8`` and the
train step (``models.build``) writes the gradient over them instead of an optimizer update.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

HISTORY = 1024  # flax's Fp8DotGeneralBase.amax_history_length, MaxText's default
SUFFIX = "_fp8"
_SCALES = ("input_scale", "kernel_scale", "output_grad_scale")
_HISTORIES = ("input_amax_history", "kernel_amax_history", "output_grad_amax_history")


class Fp8Meta(nn.Module):
    """One fp8 dot's scales (ones) and amax histories (zeros), replicated."""

    @nn.compact
    def __call__(self) -> dict[str, jax.Array]:
        meta = {}
        for name, init, size in ([(s, nn.initializers.ones, 1) for s in _SCALES]
                                 + [(h, nn.initializers.zeros, HISTORY) for h in _HISTORIES]):
            meta[name] = self.param(name, nn.with_logical_partitioning(init, (None,)), (size,), jnp.float32)
        return meta


def einsum(mod: nn.Module, name: str, quantization: str, eqn: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """``jnp.einsum(eqn, x, w)``, in fp8 with delayed scaling when ``quantization`` is fp8.

    ``mod`` is the compact module the dot belongs to; its fp8 state is a submodule named
    ``name + "_fp8"``. The compute dtype is ``w``'s (flax's ``Fp8Einsum``: ``x`` is cast to it).
    """
    if not quantization:
        return jnp.einsum(eqn, x, w)
    meta = Fp8Meta(name=name + SUFFIX, parent=mod)()
    dot = functools.partial(
        fp8_ops.fp8_scaled_dot_general,
        lhs_scale=meta["input_scale"], rhs_scale=meta["kernel_scale"], grad_scale=meta["output_grad_scale"],
        lhs_amax_history=meta["input_amax_history"], rhs_amax_history=meta["kernel_amax_history"],
        grad_amax_history=meta["output_grad_amax_history"], quantize_compute_type=w.dtype)
    return jnp.einsum(eqn, x.astype(w.dtype), w, _dot_general=dot)


def is_meta(path: tuple) -> bool:
    """Whether a parameter tree path leads to an fp8 scale or amax history."""
    return any(str(getattr(k, "key", k)).endswith(SUFFIX) for k in path)


def labels(params: Any) -> Any:
    """``"fp8"`` for each fp8 state leaf of ``params``, ``"train"`` for the rest (optax labels)."""
    return jax.tree_util.tree_map_with_path(lambda p, _: "fp8" if is_meta(p) else "train", params)


def overwrite_with_gradient(params: Any, grads: Any) -> Any:
    """``params`` with every fp8 state leaf replaced by its gradient (its new value)."""
    return jax.tree_util.tree_map_with_path(lambda p, v, g: g if is_meta(p) else v, params, grads)
