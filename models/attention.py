"""Attention cores: plain XLA attention and JAX's Pallas (Triton) flash attention.

``attend(q, k, v, causal=..., impl=..., layout=...)`` is what the model families call
between their q/k/v projections and the output projection. Both implementations compute
``softmax(q k^T * head_dim**-0.5) v`` with the softmax in float32 and grouped-query
attention (``heads`` query heads share ``kv_heads`` key/value heads, ``heads % kv_heads
== 0``).

``impl="xla"``
    Einsums with the scores materialised (``[batch, kv_heads, group, seq, seq]`` in
    float32). GQA groups the query heads (``q`` reshaped to ``[.., kv_heads, group, ..]``)
    so k/v are never copied. Under a mesh GSPMD partitions it like any other einsum.

``impl="flash"``
    JAX's Pallas GPU flash attention, ``jax.experimental.pallas.ops.gpu.attention.mha``
    (jax 0.10.2: layout ``[batch, seq, heads, head_dim]``, causal masking, an optional
    segment-ids mask, a ``custom_vjp`` whose backward runs two Pallas kernels:
    ``mha_preprocess_backward`` (``delta = rowsum(o * do)``) and ``mha_backward`` (dK/dV
    and dQ recomputing the probabilities from the saved log-sum-exp), FlashAttention-2,
    arXiv 2307.08691). The kernel has no GQA: k/v heads must equal q heads, so each kv head
    is repeated ``group`` times on the device before the call (its gradient sums the
    group back). The kernel lowers to a Triton custom call (``__gpu$xla.gpu.triton``) on
    CUDA only; where the step is lowered for the CPU (tests), the same kernels run in
    Pallas interpret mode. The choice is ``jax.lax.platform_dependent`` on the platform
    being *lowered for*, not where the arrays live: a step traced on CPU devices and
    lowered with ``lowering_platforms=("cuda",)`` (lagom-jax's deviceless compile) gets
    the Triton kernels. Only CPU and CUDA are supported; lowering for another platform
    fails with ``platform_dependent``'s error.

    A ``pallas_call`` cannot be partitioned by GSPMD (XLA would replicate its operands),
    so under a mesh the kernel runs inside ``jax.shard_map`` over the mesh, q/k/v split as
    the recipe splits ``HEADS`` (``act_batch`` -> batch axes, ``act_heads`` -> the
    tensor-parallel axis): each device attends its own batch rows and heads and no
    collective touches q/k/v. When ``kv_heads`` does not divide over the heads axis, k/v
    enter replicated along it and each device slices the kv heads its query heads use
    (their gradient is then all-reduced over that axis). With no mesh in the layout but
    inside a shard_map that is manual over some axes (the GPipe pipeline's ``stage``), the
    kernel gets a nested shard_map over the remaining automatic axes, batch over the
    batch axes and heads over ``model``; at top level with no mesh it is called as is.

    The kernels' HLO does not show the causal mask, so the call runs under the named scope
    ``flash_attention_causal`` (or ``flash_attention``); `lagom_jax.program.graph` reads it from the
    kernels' op_name to price them (``graph.flash_attention_flops``).

Context parallelism (recipe part ``cp``, ``Layout.context``): q/k/v arrive split along the
sequence over the ``context`` axis, *load-balanced*: with ``n`` context ranks the sequence is
cut into ``2n`` chunks and rank ``i`` holds chunks ``i`` and ``2n-1-i`` (`balanced_order`;
MaxText's ``reorder_causal_load_balanced``, Transformer Engine's load-balanced causal ring),
so every rank has the same share of the causal triangle. Inside a shard_map over the mesh:

``"all-gather"`` (MaxText's default strategy)
    the keys and values are all-gathered over ``context`` (their gradient reduce-scattered
    back) and each rank attends its own queries to every key, masked by the positions the
    load-balanced order gives both.
``"ring"`` (``cp+ring``)
    the key/value chunks travel around the ring of ranks, ``n-1`` collective-permutes forward
    (and their transposes backward); at each step a rank attends to what it holds and merges
    the partial result by its log-sum-exp. Under load balancing a step with another rank's
    chunks is exactly two unmasked ``c x c`` blocks (``c = seq / 2n``): the late queries
    against the early keys, and the early queries against the early keys (the source rank
    comes earlier) or the late queries against the late keys (it comes later); the first
    step is the causal ``2c x 2c`` block of the rank's own chunks.

The blocks are einsums with their scores materialised (``impl`` must be "xla"): jax's Pallas
kernel returns no log-sum-exp to merge partial results by, and MaxText's cuDNN kernel does
not compile here. Each block runs under a named scope (``FUSED_BLOCK_SCOPE``, or
``FUSED_CAUSAL_BLOCK_SCOPE`` where masked) that the cost model prices as the fused kernel the
block stands in for, not as the einsums and score traffic XLA compiles it to. Sliding
windows are not combined with it.

Restrictions of ``flash``: q and k/v have the same sequence length (self-attention), a
multiple of 16 (Triton blocks are powers of two of at least 16), and ``head_dim >= 16``.

Sliding-window layers (``window`` w > 0, causal: query ``i`` sees keys ``i - w < j <= i``;
Mistral, Gemma 2/3 local layers, MaxText's ``sliding_window_size``) run blocked, with either
``impl``: the sequence is cut into blocks of w queries, each attending the keys of its own
block and the one before under the band mask, so the scores are ``[w, 2w]`` per block and
the dots do ``2w/s`` of full attention's work. jax's Pallas kernel has no window (MaxText on
GPUs calls cuDNN's flash attention with its window instead); the blocked einsums stand in,
with the same FLOPs a window-skipping kernel does plus the masked half block.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from .sharding import BATCH_AXES, HEADS, PART_AXIS, Layout, to_mesh_spec

IMPLS = ("xla", "flash")

# Tiles for H100 (and A100) with head_dim 128: FlashAttention-2's own choice on those GPUs
# (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h and
# flash_bwd_launch_template.h, ``run_mha_fwd_hdim128``: 128 query x 64 key rows;
# ``run_mha_bwd_hdim128``: 64 query x 128 kv rows). Here: forward block_q=128, block_k=64;
# backward dK/dV scan 64 query rows against 128 kv rows, dQ scan 128 query rows against 64
# kv rows (the kernel needs s_q/block_q_dq == s_k/block_kv_dkv); that backward set is one
# jax's own GPU tests run (tests/pallas/gpu_ops_test.py, test_fused_attention_bwd). Warps:
# mha's defaults (8 in the forward for head_dim > 64, 4 in the backward for these tiles).
# Each block is cut to the largest power of two dividing the sequence length. Not timed on
# a GPU here (no autotuning without one).
_BLOCKS = dict(block_q=128, block_k=64, block_q_dkv=64, block_kv_dkv=128, block_q_dq=128,
               block_kv_dq=64)
_MIN_BLOCK = 16
# Named scopes around the kernel call; `lagom_jax.program.graph` (FLASH_CAUSAL_SCOPE) matches the
# first to price causal kernels at about half the work of full ones.
CAUSAL_SCOPE = "flash_attention_causal"
FULL_SCOPE = "flash_attention"
# The named scopes of one block of context-parallel attention (``_partial``; the second where
# it is masked causally): its einsums and softmax stand in for one fused kernel (cuDNN's, which
# MaxText's context parallelism runs through Transformer Engine), so `lagom_jax.program.graph`
# (FUSED_BLOCK_SCOPES) prices what runs under them as that kernel: its matmuls at the GPU's
# fused-attention rate (half of a causal block's, which the kernel skips), the scores it
# materialises and the softmax between them not at all.
FUSED_BLOCK_SCOPE = "fused_attention_block"
FUSED_CAUSAL_BLOCK_SCOPE = "fused_attention_block_causal"


def attend(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, impl: str,
           layout: Layout, window: int = 0) -> jax.Array:
    """q: [batch, seq, heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim] with heads % kv_heads == 0 (grouped-query attention).
    Returns [batch, seq, heads, head_dim] in q.dtype. Softmax in float32, logits scaled by head_dim**-0.5.
    ``window`` > 0: causal sliding-window attention over the last ``window`` positions (see the module)."""
    _check(q, k, v, impl)
    if layout.context:
        if window and window < q.shape[1]:
            raise ValueError("sliding-window attention with context parallelism is not built; use a recipe "
                             "without 'cp'")
        if impl != "xla" or not causal:
            raise ValueError(f"context parallelism runs causal attention as einsum blocks (attention='xla'); "
                             f"got attention={impl!r}, causal={causal} (see models/attention.py)")
        return _context_parallel(q, k, v, layout)
    if window and window < q.shape[1]:  # a window as long as the sequence is causal attention
        s = q.shape[1]
        if not causal or s % window:
            raise ValueError(f"sliding window {window} on sequence {s}: the window must be causal and divide "
                             "the sequence")
        return _windowed_attention(q, k, v, window)
    if impl == "xla":
        return _xla_attention(q, k, v, causal)
    return _flash(q, k, v, causal, layout)


def _check(q: jax.Array, k: jax.Array, v: jax.Array, impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r} (known: {', '.join(IMPLS)})")
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(f"attention wants q [batch, seq, heads, head_dim] and k, v of one "
                         f"shape [batch, seq, kv_heads, head_dim]; got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    b, s, h, d = q.shape
    if k.shape[0] != b or k.shape[1] != s or k.shape[3] != d:
        raise ValueError(f"k/v {k.shape} do not match q {q.shape} in batch, seq or head_dim")
    if h % k.shape[2]:
        raise ValueError(f"heads {h} must be a multiple of kv_heads {k.shape[2]}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if impl == "flash" and (s % _MIN_BLOCK or d < _MIN_BLOCK):
        raise ValueError(f"flash attention needs seq a multiple of {_MIN_BLOCK} and head_dim >= "
                         f"{_MIN_BLOCK} (Triton tiles); got seq {s}, head_dim {d}; use XLA attention (attention='xla', --attention xla)")


# ------------------------------------------------------------------------------- xla


def _xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    b, s, h, d = q.shape
    kvh = k.shape[2]
    qg = q.reshape(b, s, kvh, h // kvh, d)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32)
    logits = logits * (d ** -0.5)
    if causal:
        mask = jnp.tril(jnp.ones((s, s), bool))
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgqs,bskd->bqkgd", probs, v, preferred_element_type=jnp.float32)
    return o.reshape(b, s, h, d).astype(q.dtype)


def _windowed_attention(q: jax.Array, k: jax.Array, v: jax.Array, w: int) -> jax.Array:
    """Causal sliding-window attention, blocked: block c's queries against blocks c-1 and c."""
    b, s, h, d = q.shape
    kvh, n = k.shape[2], s // w
    qb = q.reshape(b, n, w, kvh, h // kvh, d)

    def with_previous(x: jax.Array) -> jax.Array:  # [b, n, 2w, kvh, d]: block c-1 then block c
        x = x.reshape(b, n, w, kvh, d)
        prev = jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
        return jnp.concatenate([prev, x], axis=2)

    kb, vb = with_previous(k), with_previous(v)
    logits = jnp.einsum("bnqkgd,bnskd->bnkgqs", qb, kb, preferred_element_type=jnp.float32) * (d ** -0.5)
    i = jnp.arange(w)[:, None]  # query row in its block
    j = jnp.arange(2 * w)[None, :]  # key column: the previous block, then this one
    band = (j > i) & (j <= i + w)  # 0 <= query - key < w
    first = jnp.arange(n)[:, None, None] > 0  # block 0 has no previous block
    mask = band[None] & (first | (j >= w)[None])
    logits = jnp.where(mask[None, :, None, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    o = jnp.einsum("bnkgqs,bnskd->bnqkgd", probs, vb, preferred_element_type=jnp.float32)
    return o.reshape(b, s, h, d).astype(q.dtype)


# ----------------------------------------------------------------------------- flash


def _block(target: int, n: int) -> int:
    """The largest power of two <= target dividing n (n is a multiple of 16)."""
    return math.gcd(target, n & -n)


def _mha(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, interpret: bool) -> jax.Array:
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    s, d = q.shape[1], q.shape[3]
    blocks = pallas_attention.BlockSizes(**{n: _block(t, s) for n, t in _BLOCKS.items()})
    return pallas_attention.mha(q, k, v, None, sm_scale=d ** -0.5, causal=causal,
                                block_sizes=blocks, interpret=interpret)


def _kernel(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    """The Pallas kernel on equal q and k/v heads: Triton on CUDA, interpret mode on CPU.

    The kernels' HLO carries no sign of the causal mask (it is baked into the Triton IR),
    so the call runs under a named scope that lands in their ``metadata.op_name``, forward
    and backward: the cost model (`lagom_jax.program.graph`) reads causal-ness from it.
    """
    with jax.named_scope(CAUSAL_SCOPE if causal else FULL_SCOPE):
        return jax.lax.platform_dependent(
            q, k, v,
            cpu=functools.partial(_mha, causal=causal, interpret=True),
            cuda=functools.partial(_mha, causal=causal, interpret=False))


def _repeat_kv(x: jax.Array, heads: int) -> jax.Array:
    g = heads // x.shape[2]
    return x if g == 1 else jnp.repeat(x, g, axis=2)


def _flash(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, layout: Layout) -> jax.Array:
    h = q.shape[2]
    if layout.mesh is not None:
        spec = to_mesh_spec(HEADS, layout.rules)
        return _sharded(q, k, v, causal, layout.mesh, spec, frozenset())
    ctx = jax.sharding.get_abstract_mesh()
    if ctx.empty or not ctx.manual_axes:
        return _kernel(q, _repeat_kv(k, h), _repeat_kv(v, h), causal)
    # Inside a shard_map manual over some axes (the pipeline's, over ``stage``), with no
    # layout: the other axes are GSPMD's, which would replicate the kernel's operands, and
    # jax's mha cannot be traced under check_vma=True (its lse out_shape carries no vma).
    # A nested shard_map over the automatic axes with the recipes' usual split of HEADS
    # (batch over the batch axes, heads over the tensor-parallel axis) does both.
    auto = tuple(a for a in ctx.axis_names if a not in ctx.manual_axes)
    if not auto:
        raise NotImplementedError(
            "flash attention inside a shard_map that is manual over every mesh axis: jax's "
            "Pallas mha cannot be traced there under check_vma=True (its out_shape has no "
            "vma); use check_vma=False on that shard_map, or impl='xla'")
    # Axes whose split does not divide (a micro-batch smaller than the batch axes) stay
    # replicated.
    batch = tuple(a for a in BATCH_AXES if a in auto)
    if q.shape[0] % math.prod(ctx.shape[a] for a in batch):
        batch = ()
    heads = PART_AXIS["tp"] if PART_AXIS["tp"] in auto else None
    if heads is not None and h % ctx.shape[heads]:
        heads = None
    spec = PartitionSpec(batch or None, None, heads, None)
    return _sharded(q, k, v, causal, ctx, spec, frozenset(auto))


def _sharded(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, mesh, spec: PartitionSpec,
             axis_names: frozenset[str]) -> jax.Array:
    """The kernel in a shard_map over ``mesh`` (all axes, or ``axis_names``), q split by
    ``spec`` ([batch, seq, heads, head_dim]) and k/v too when their heads divide."""
    h, kvh = q.shape[2], k.shape[2]
    batch_axes, heads_axes = _axes(spec[0]), _axes(spec[2])
    n_batch = math.prod(mesh.shape[a] for a in batch_axes)
    n_heads = math.prod(mesh.shape[a] for a in heads_axes)
    if q.shape[0] % n_batch or h % n_heads:
        raise ValueError(f"flash attention: batch {q.shape[0]} / heads {h} do not divide over "
                         f"the mesh axes {batch_axes} ({n_batch}) / {heads_axes} ({n_heads})")
    local_h = h // n_heads
    group = h // kvh
    kv_split = kvh % n_heads == 0
    kv_spec = spec if kv_split else PartitionSpec(spec[0], None, None, None)

    def local(q, k, v):
        if kv_split:
            return _kernel(q, _repeat_kv(k, local_h), _repeat_kv(v, local_h), causal)
        # k/v are whole along heads: take the kv heads of this device's query heads.
        first = _heads_index(heads_axes, mesh) * local_h
        if local_h % group == 0 or group % local_h == 0:
            n = max(local_h // group, 1)
            k, v = (jax.lax.dynamic_slice_in_dim(x, first // group, n, axis=2) for x in (k, v))
            return _kernel(q, _repeat_kv(k, local_h), _repeat_kv(v, local_h), causal)
        idx = (first + jnp.arange(local_h)) // group
        return _kernel(q, jnp.take(k, idx, axis=2), jnp.take(v, idx, axis=2), causal)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, kv_spec, kv_spec), out_specs=spec,
                         axis_names=axis_names, check_vma=False)(q, k, v)


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _heads_index(axes: tuple[str, ...], mesh) -> jax.Array:
    """This device's position along the (possibly several) mesh axes that split heads."""
    idx = jnp.int32(0)
    for a in axes:
        idx = idx * mesh.shape[a] + jax.lax.axis_index(a)
    return idx


# ------------------------------------------------------------------ context parallelism


def balanced_order(seq: int, ways: int) -> np.ndarray:
    """The positions held in slot order when ``ways`` context ranks share a causal sequence
    load-balanced: ``2 * ways`` chunks, rank ``i`` holding chunks ``i`` and ``2*ways-1-i``
    (slots ``[2ic, 2(i+1)c)``, ``c = seq / (2 * ways)``)."""
    if ways < 1 or seq % (2 * ways):
        raise ValueError(f"context parallelism over {ways} ranks cuts the sequence into {2 * ways} equal chunks; "
                         f"sequence {seq} does not divide")
    c = seq // (2 * ways)
    chunks = [ch for i in range(ways) for ch in (i, 2 * ways - 1 - i)]
    return np.concatenate([np.arange(ch * c, (ch + 1) * c) for ch in chunks])


def _context_parallel(q: jax.Array, k: jax.Array, v: jax.Array, layout: Layout) -> jax.Array:
    axis, ways = PART_AXIS["cp"], layout.context_ways
    spec = to_mesh_spec(HEADS, layout.rules)
    n_heads = math.prod(layout.mesh.shape[a] for a in _axes(spec[2]))
    if k.shape[2] % n_heads:
        raise ValueError(f"context parallelism: kv heads {k.shape[2]} do not divide over the tensor-parallel "
                         f"axis ({n_heads})")
    order = balanced_order(q.shape[1], ways)
    if layout.context == "ring":
        local = functools.partial(_ring, axis=axis, ways=ways)
    else:
        local = functools.partial(_gathered, axis=axis, order=order)
    return jax.shard_map(local, mesh=layout.mesh, in_specs=(spec, spec, spec), out_specs=spec,
                         check_vma=False)(q, k, v)


def _partial(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Attention of q [b, r, kv_heads, group, d] to k/v [b, s, kv_heads, d] under ``mask``
    [r, s] (None: every key visible): (output [b, r, kv_heads, group, d] float32, normalised
    over these keys; log-sum-exp [b, kv_heads, group, r] float32)."""
    with jax.named_scope(FUSED_BLOCK_SCOPE if mask is None else FUSED_CAUSAL_BLOCK_SCOPE):
        logits = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        lse = jax.nn.logsumexp(logits, axis=-1)
        probs = jnp.exp(logits - lse[..., None]).astype(v.dtype)
        return jnp.einsum("bkgqs,bskd->bqkgd", probs, v, preferred_element_type=jnp.float32), lse


def _merge(o1: jax.Array, l1: jax.Array, o2: jax.Array, l2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two partial attentions of the same queries over disjoint keys, merged by log-sum-exp."""
    lse = jnp.logaddexp(l1, l2)

    def weight(l: jax.Array) -> jax.Array:  # [b, kvh, g, r] -> [b, r, kvh, g, 1]
        return jnp.moveaxis(jnp.exp(l - lse), -1, 1)[..., None]

    return o1 * weight(l1) + o2 * weight(l2), lse


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    b, r, h, d = q.shape
    return q.reshape(b, r, kv_heads, h // kv_heads, d)


def _gathered(q: jax.Array, k: jax.Array, v: jax.Array, *, axis: str, order: np.ndarray) -> jax.Array:
    """One rank's queries against every key, gathered over ``axis``, masked by position."""
    r = q.shape[1]
    kv = jax.lax.all_gather(jnp.stack([k, v]), axis, axis=2, tiled=True)  # [2, b, seq, kvh, d]
    positions = jnp.asarray(order)
    mine = jax.lax.dynamic_slice_in_dim(positions, jax.lax.axis_index(axis) * r, r)
    o, _ = _partial(_grouped(q, k.shape[2]), kv[0], kv[1], mine[:, None] >= positions[None, :])
    return o.reshape(q.shape).astype(q.dtype)


def _ring(q: jax.Array, k: jax.Array, v: jax.Array, *, axis: str, ways: int) -> jax.Array:
    """Load-balanced ring attention on one rank's chunks (see the module)."""
    r = q.shape[1]
    c = r // 2
    qg = _grouped(q, k.shape[2])
    me = jax.lax.axis_index(axis)
    o, lse = _partial(qg, k, v, jnp.tril(jnp.ones((r, r), bool)))
    kv = jnp.stack([k, v])
    for step in range(1, ways):
        kv = jax.lax.ppermute(kv, axis, [(j, (j + 1) % ways) for j in range(ways)])
        kk, vv = kv[0], kv[1]
        # The late queries see the source's early chunk whichever rank it is.
        ox, lx = _partial(qg[:, c:], kk[:, :c], vv[:, :c], None)
        late_o, late_l = _merge(o[:, c:], lse[..., c:], ox, lx)
        o, lse = o.at[:, c:].set(late_o), lse.at[..., c:].set(late_l)
        # Early queries on early keys where the source rank comes earlier, else late on late.
        at = jnp.where((me - step) % ways < me, 0, c)
        oy, ly = _partial(*(jax.lax.dynamic_slice_in_dim(x, at, c, axis=1) for x in (qg, kk, vv)), None)
        at_o, at_l = _merge(jax.lax.dynamic_slice_in_dim(o, at, c, axis=1),
                            jax.lax.dynamic_slice_in_dim(lse, at, c, axis=3), oy, ly)
        o = jax.lax.dynamic_update_slice_in_dim(o, at_o, at, axis=1)
        lse = jax.lax.dynamic_update_slice_in_dim(lse, at_l, at, axis=3)
    return o.reshape(q.shape).astype(q.dtype)
