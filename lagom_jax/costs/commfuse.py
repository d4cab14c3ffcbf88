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

`choose` predicts, for one matmul shape on one cluster, whether the ring beats the plain
collective (the models' recipe part ``cf`` applies the ring; ``lagom-jax tune --model``
reports the choice).

The backward pass is JAX's transpose of the ring (a ring of ppermutes the other way with
the transposed matmuls), so it is decomposed too. Results equal the plain collectives up
to the order of floating-point additions.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import cost, kernels


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


# --------------------------------------------------------------------------- the choice

@dataclasses.dataclass(frozen=True)
class Choice:
    """Plain collective + matmul against the CommFuse ring for one matmul, predicted (us).

    ``plain_us``: the collective, then the whole matmul (they depend on each other).
    ``ring_us``: ``t`` matmul steps, each of the ``t - 1`` transfers running beside a step
    whose matmul is slowed, while the transfer lasts, by the SMs and HBM bandwidth it holds
    (the cost model's contention), plus the reduce-scatter side's additions. ``exposed_plain_us`` /
    ``exposed_ring_us``: communication not hidden behind a matmul.
    """

    kind: str
    ring: bool
    plain_us: float
    ring_us: float
    exposed_plain_us: float
    exposed_ring_us: float
    why: str


def choose(kind: str, *, rows: int, k: int, n: int, t: int, hw: HardwareProfile, nodes: int = 1,
           itemsize: int = 2, batch: int = 1) -> Choice:
    """Whether the ring beats the plain collective for ``kind`` ("allgather": ``all_gather(x)
    @ w`` with ``x`` [batch, rows / t, k] per device and ``w`` [k, n]; "reducescatter":
    ``psum_scatter(x @ w)`` with ``x`` [batch, rows, k] and ``w`` [k, n]) on ``t`` devices
    spanning ``nodes`` nodes of ``hw``."""
    if kind not in ("allgather", "reducescatter"):
        raise ValueError(f"unknown kind {kind!r} (known: allgather, reducescatter)")
    if t < 2 or rows % t:
        raise ValueError(f"need t >= 2 devices dividing the {rows} rows, got t={t}")
    r = rows // t
    block = batch * r * (k if kind == "allgather" else n) * itemsize  # one ring step's transfer
    whole = kernels.gemm_time_us(batch * rows, n, k, hw, itemsize=itemsize)
    coll = "all-gather" if kind == "allgather" else "reduce-scatter"
    nbytes = block * t
    plain_comm = cost.default_time_us(coll, nbytes, t, nodes, hw)
    # One ring step: a permute of one block to the neighbour (across nodes where the ring
    # leaves one: the slowest link paces the ring).
    hop_nodes = min(nodes, 2)
    params = cost.nccl_default_params("collective-permute", block, 2, hop_nodes, hw)
    send = cost.collective_time_us("collective-permute", block, 2, hop_nodes, params, hw)
    sms, hbm = cost.collective_resource_use("collective-permute", block, 2, hop_nodes, params, hw, time_us=send)
    shape = dict(gemm=(1, batch * r, n, k), itemsize=itemsize)
    step = cost.compute_time_us(2.0 * batch * r * n * k, 0.0, hw, **shape)
    slowed = cost.compute_time_us(2.0 * batch * r * n * k, 0.0, hw, **shape, sms_taken=sms, hbm_gbps_taken=hbm)
    # The matmul runs slowed while the transfer holds its SMs and bandwidth, then at full
    # speed; a transfer longer than the slowed matmul is exposed for the rest.
    beside = send if send >= slowed else send + step * (1 - send / slowed)
    overlapped = (t - 1) * beside
    exposed = (t - 1) * max(0.0, send - slowed)
    adds = (t - 1) * kernels.memory_time_us(3 * block, hw) if kind == "reducescatter" else 0.0
    ring_us = step + overlapped + adds
    plain_us = plain_comm + whole
    ring = ring_us < plain_us
    verdict = "ring" if ring else "plain"
    why = (f"{verdict}: ring {ring_us:.1f} us ({t} steps of {step:.1f} us matmul, {t - 1} sends of "
           f"{send:.1f} us beside matmuls slowed to {slowed:.1f} us) vs plain {plain_us:.1f} us "
           f"({coll} {plain_comm:.1f} + matmul {whole:.1f})")
    return Choice(kind, ring, plain_us, ring_us, plain_comm, exposed, why)


def choose_mlp(*, tokens: int, d_model: int, d_ff: int, t: int, hw: HardwareProfile, nodes: int = 1,
               itemsize: int = 2) -> tuple[bool, str]:
    """Whether a sequence-parallel MLP (all-gather + FC1, FC2 + reduce-scatter over ``t``
    devices, ``tokens`` rows) should run as rings, and why: the ring is taken when the two
    sides together are predicted faster."""
    sides = (choose("allgather", rows=tokens, k=d_model, n=d_ff // t, t=t, hw=hw, nodes=nodes, itemsize=itemsize),
             choose("reducescatter", rows=tokens, k=d_ff // t, n=d_model, t=t, hw=hw, nodes=nodes, itemsize=itemsize))
    plain, ring = sum(c.plain_us for c in sides), sum(c.ring_us for c in sides)
    verdict = "rings" if ring < plain else "plain collectives"
    return ring < plain, (f"CommFuse: the MLP runs {verdict}: predicted {ring:.0f} us as rings against "
                          f"{plain:.0f} us plain per layer forward ({sides[0].why}; {sides[1].why})")
