"""``CollectiveParams``: the per-collective NCCL choice that Lagom co-tunes.

Algorithm, protocol, number of channels (one CTA on one SM each), chunk size and threads
per CTA. It sits on the ground floor so that the cost model, the simulator, the passes,
the search and the Plan share one definition without depending on each other.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lagom_jax import hashing

NcclAlgorithm = Literal["ring", "tree", "nvls", "nvls_tree", "symmetric", "one_shot"]
NcclProtocol = Literal["LL", "LL128", "Simple"]
# NVLS: NVLink SHARP, the reduction done by the NVSwitch (Hopper and newer), Simple only.
# nvls_tree: NCCL's NVLSTree, NVLS inside each node and a tree between the nodes' heads
# (all-reduce across nodes only), Simple only.
# symmetric: NCCL 2.27's symmetric-memory kernels on buffers registered as symmetric
# windows (``cost.symmetric_pick``); protocol LL for its LL kernels, Simple for the others.
# one_shot: not NCCL's: XLA's own one-shot ragged all-to-all kernel (``cost.ONE_SHOT``), which
# no NCCL setting reaches; it stands where NCCL's choice would.
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "nvls", "nvls_tree", "symmetric", "one_shot")
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")

# Kinds a tuner config may name, as in lagom_jax.program.graph.COLLECTIVE_KINDS, with NCCL's ncclFunc_t
# value (src/include/nccl_common.h of NCCL 2.30-era; older releases may not number all-to-all). NCCL
# consults the tuner for the collective ones only: never for ``POINT_TO_POINT_KINDS``.
TUNER_KINDS: dict[str, int] = {
    "all-reduce": 4,
    "all-gather": 2,
    "reduce-scatter": 3,
    "all-to-all": 8,
    "broadcast": 0,
    "reduce": 1,
}
# Kinds XLA hands to NCCL's point-to-point path, where NCCL asks no tuner plugin and NCCL_ALGO /
# NCCL_PROTO do not reach: a collective-permute (grouped ncclSend/ncclRecv), a ragged all-to-all's
# NCCL fallback, and an all-to-all, which XLA runs as grouped sends and receives or, with NCCL 2.28+
# and contiguous buffers, as ncclAlltoAll, which NCCL 2.28-2.30 turn into one send and one receive
# per rank as they enqueue it (``taskAppend`` in src/enqueue.cc; openxla/xla
# ``NcclCommunicator::LaunchAllToAll``). Only NCCL's own choice runs them.
POINT_TO_POINT_KINDS: tuple[str, ...] = ("all-to-all", "collective-permute", "ragged-all-to-all")
# The kinds NCCL asks a tuner plugin about: the ones its choices (and a plan's rules) reach.
CONSULTED_KINDS: frozenset[str] = frozenset(TUNER_KINDS) - frozenset(POINT_TO_POINT_KINDS)
# NCCL clamps CTAs per communicator to [1, MAXCHANNELS = 64] (NVIDIA/nccl src/init.cc,
# src/include/device.h) and uses 64..640 threads per CTA (NCCL_NTHREADS, multiples of 64).
MAX_CHANNELS = 64
MIN_THREADS, MAX_THREADS = 64, 640


@dataclasses.dataclass(frozen=True, order=True)
class CollectiveParams:
    """One NCCL configuration for one collective call."""

    algorithm: NcclAlgorithm = "ring"
    protocol: NcclProtocol = "Simple"
    nchannels: int = 1
    chunk_bytes: int = 2 << 20
    nthreads: int = 512

    # The search looks params up in tables by the hundred thousand: hashed once, as the
    # hardware profile is (the same hash as the dataclass's own, kept out of pickles).
    __hash__ = hashing.hash_fields_once
    __getstate__ = hashing.state_without_hash

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r} (known: {', '.join(ALGORITHMS)})")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r} (known: {', '.join(PROTOCOLS)})")
        if self.algorithm == "symmetric" and self.protocol == "LL128":
            raise ValueError("NCCL's symmetric kernels are LL or load/store ('Simple'), not LL128")
        if self.algorithm in ("nvls", "nvls_tree") and self.protocol != "Simple":
            raise ValueError(f"NCCL runs {self.algorithm} with the Simple protocol only, got {self.protocol!r}")
        if not 1 <= self.nchannels <= MAX_CHANNELS:
            raise ValueError(f"nchannels must be in [1, {MAX_CHANNELS}], got {self.nchannels}")
        if self.chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {self.chunk_bytes}")
        if not (MIN_THREADS <= self.nthreads <= MAX_THREADS and self.nthreads % 64 == 0):
            raise ValueError(
                f"nthreads must be a multiple of 64 in [{MIN_THREADS}, {MAX_THREADS}], got {self.nthreads}"
            )

    def describe(self) -> str:
        if self.algorithm == "one_shot":
            return "XLA's one-shot kernel (no NCCL)"
        return (
            f"{self.algorithm}/{self.protocol} nc={self.nchannels} "
            f"chunk={self.chunk_bytes // 1024}KiB nt={self.nthreads}"
        )
