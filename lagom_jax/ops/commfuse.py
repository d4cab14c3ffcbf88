"""CommFuse: all-gather + matmul and matmul + reduce-scatter as rings of point-to-point steps.

Inside `jax.shard_map` over a tensor-parallel axis of size ``t``:

* ``allgather_matmul(x, w, axis_name)`` = ``all_gather(x, axis_name, axis=-2, tiled=True)
  @ w``: every device holds ``x``'s rows ``[..., r, k]`` (its sequence shard) and the full
  contraction; the result has all ``t * r`` rows.
* ``matmul_reducescatter(x, w, axis_name)`` = ``psum_scatter(x @ w, axis_name,
  scatter_dimension=-2, tiled=True)``: every device holds all rows and its share of the
  contraction; the result is its ``1/t`` of the rows, summed over devices.

Both run as ``t`` steps. Each step multiplies one block of rows while a `jax.lax.ppermute`
moves the next block to the neighbouring device, so XLA can run each transfer beside the
previous step's matmul (``collective-permute-start`` ... gemm ... ``-done``). Following
CommFuse (arXiv 2604.24013): the all-gather side multiplies the block it already holds
first, and the reduce-scatter side adds the partial sum of the block that stays on the
device last, so no transfer is left without a matmul to hide behind (no exposed tail).
With ``bidirectional=True`` the all-gather side sends blocks both ways round the ring at
once, which halves the number of steps and uses both links of each device.

The backward pass is JAX's transpose of the ring (a ring of ppermutes the other way with
the transposed matmuls), so it is decomposed too. Results equal the plain collectives up
to the order of floating-point additions. Whether a ring beats the plain collective on a
cluster is the cost model's call: ``lagom_jax.costs.commfuse.choose``.

This module is on the ground floor: it imports nothing from the project.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["allgather_matmul", "matmul_reducescatter"]


def _axis(axis_name: str) -> tuple[int, jax.Array]:
    return jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)


def _check(x: jax.Array, w: jax.Array, what: str) -> None:
    if x.ndim < 2 or w.ndim != 2:
        raise ValueError(f"{what}: x must be [..., rows, k] and w [k, n], got x{tuple(x.shape)} "
                         f"w{tuple(w.shape)}")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"{what}: x's last dimension {x.shape[-1]} does not match w's first "
                         f"{w.shape[0]}")


def _barrier(*values: jax.Array):
    """Values XLA may not compute across (``optimization_barrier``): it pins one ring step's
    transfer beside its matmul, where XLA's scheduler would otherwise hoist every transfer
    to the front and its dot merger would fuse the steps' matmuls into one."""
    return jax.lax.optimization_barrier(values)


def _shift(v: jax.Array, axis_name: str, t: int, step: int) -> jax.Array:
    """Send ``v`` ``step`` places round the ring (device i to i + step)."""
    return jax.lax.ppermute(v, axis_name, [(i, (i + step) % t) for i in range(t)])


def allgather_matmul(x: jax.Array, w: jax.Array, axis_name: str, *,
                     bidirectional: bool = False) -> jax.Array:
    """``all_gather(x) @ w`` along the row dimension (-2), as a ring of matmul steps."""
    _check(x, w, "allgather_matmul")
    t, i = _axis(axis_name)
    r = x.shape[-2]
    dtype = jnp.result_type(x, w)
    # products[s] is the block of rows owned by device (i - s) mod t (unidirectional ring).
    products: list[jax.Array] = []
    if not bidirectional or t < 3:
        block = x
        for s in range(t):
            products.append((block @ w).astype(dtype))
            if s < t - 1:
                # The next block travels while this one is multiplied; the barrier keeps XLA
                # from hoisting every transfer ahead and merging the matmuls into one.
                products[-1], block = _barrier(products[-1], _shift(block, axis_name, t, 1))
        return _in_owner_order(products, i, t, r)
    # Two rings: blocks from the left and from the right arrive at once; each device
    # multiplies its own block, then one new block from each side per step.
    by_offset: dict[int, jax.Array] = {0: (x @ w).astype(dtype)}
    left = right = x
    previous = [0]  # the offsets multiplied in the last step: the next transfers run beside them
    for s in range(1, t // 2 + 1):
        last = 2 * s == t  # with t even, the last step's block from the left is the only one left
        left_next = _shift(left, axis_name, t, 1)
        right_next = right if last else _shift(right, axis_name, t, -1)
        *tied, left, right = _barrier(*(by_offset[j] for j in previous), left_next, right_next)
        by_offset.update(zip(previous, tied))
        by_offset[s] = (left @ w).astype(dtype)  # owner i - s
        previous = [s]
        if not last:
            by_offset[t - s] = (right @ w).astype(dtype)  # owner i + s = i - (t - s)
            previous.append(t - s)
    return _in_owner_order([by_offset[s] for s in range(t)], i, t, r)


def _in_owner_order(products: list[jax.Array], i: jax.Array, t: int, r: int) -> jax.Array:
    """Rows in device order from ``products[s]`` = the block of device ``(i - s) mod t``:
    reversed, they run from device ``i + 1`` round to ``i``; one roll puts device 0 first."""
    rotated = jnp.concatenate(products[::-1], axis=-2)
    return jnp.roll(rotated, ((i + 1) % t) * r, axis=-2)


def matmul_reducescatter(x: jax.Array, w: jax.Array, axis_name: str) -> jax.Array:
    """``psum_scatter(x @ w)`` over the row dimension (-2), as a ring of matmul steps whose
    last step adds the block that stays on this device."""
    _check(x, w, "matmul_reducescatter")
    t, i = _axis(axis_name)
    rows = x.shape[-2]
    if rows % t:
        raise ValueError(f"matmul_reducescatter: {t} devices do not divide the {rows} rows of x")
    r = rows // t

    def partial(block: jax.Array) -> jax.Array:
        return jax.lax.dynamic_slice_in_dim(x, block * r, r, axis=-2) @ w  # x: the latest barrier's

    # Step s computes the partial sum of block (i - s - 1) mod t and adds the running sum
    # received from device i - 1, which worked on the same block one step earlier; the
    # last step (s = t - 1) is this device's own block.
    acc = partial((i - 1) % t)
    for s in range(1, t):
        # The running sum travels while the next block's partial product is computed.
        received, mine, x = _barrier(_shift(acc, axis_name, t, 1), partial((i - s - 1) % t), x)
        acc = received + mine
    return acc
