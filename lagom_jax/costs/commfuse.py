"""The price of CommFuse's rings: whether a ring collective matmul beats the plain collective.

The rings themselves (``allgather_matmul``, ``matmul_reducescatter``: all-gather + matmul
and matmul + reduce-scatter as ``t`` ppermute steps beside partial matmuls, arXiv
2604.24013) are operations a user calls inside ``jax.shard_map``: ``lagom_jax.ops``.
`choose` predicts, for one matmul shape on one cluster, whether the ring beats the plain
collective (the models' recipe part ``cf`` applies the ring; ``lagom-jax tune --model``
reports the choice).
"""

from __future__ import annotations

import dataclasses

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import cost, kernels


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
