"""The unified cost model: compute, collectives, and the contention between them.

Split the way XLA splits its latency-hiding scheduler (``latency_hiding_scheduler.h``):

* ``CostConfig`` — one struct with every constant of the model: NCCL's latency and
  protocol tables (transcribed from NVIDIA/nccl ``src/graph/tuning.cc`` v2.30.7) and the
  few contention constants, each with its source.
* the estimator — ``collective_time_us`` and ``compute_time_us``: small documented
  formulas, pure functions of (what, how much, params, hardware);
* ``ResourceTracker`` — the SMs and HBM bandwidth that running collectives hold, and what
  compute gets from what is left;
* the driver lives one floor up (``simulate``).

Collective time (running alone)::

    t = launch + latency(algorithm, protocol, link, steps)
        + max(wire_bytes / busbw(nchannels, protocol, nthreads, link),
              the busiest channel's share at one channel's rate + the idle CTAs)
        + chunks_per_channel * per_chunk_overhead + one chunk at one channel's rate

``wire_bytes`` are nccl-tests *bus* bytes (all-reduce 2(n-1)/n x nBytes on a ring,
2 x nBytes on a tree), so ``busbw`` is directly comparable with published busBw. Bus
bandwidth grows by one channel's rate per channel until the link saturates. Small chunks
pay a synchronisation per chunk; big chunks pay pipeline fill. Every term grows with the
bytes, so a larger collective never takes less time (``working_channels``).

Contention: a collective with ``nc`` channels holds ``nc`` SMs (one CTA each) and HBM
bandwidth in proportion to the bytes it moves; overlapping compute runs at the rate the
remaining SMs and bandwidth allow (roofline).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math

import numpy as np

from lagom_jax import hashing
from lagom_jax.cluster import collective_tables
from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.cluster.nccl_env import NcclEnv
from lagom_jax.cluster.params import POINT_TO_POINT_KINDS, CollectiveParams, MAX_CHANNELS
from lagom_jax.costs import kernels
from lagom_jax.program import custom_calls
from lagom_jax.program.graph import RAGGED_ALL_TO_ALL as RAGGED

PROTOCOL_INDEX = {"LL": 0, "LL128": 1, "Simple": 2}


@dataclasses.dataclass(frozen=True)
class CostConfig:
    """Every constant of the cost model, with its source.

    Latency tables are NCCL's ``baseLat`` / ``hwLat`` (us), indexed [LL, LL128, Simple]
    (NVIDIA/nccl ``src/graph/tuning.cc`` v2.30.7).
    """

    base_lat_ring: tuple[float, float, float] = (6.6, 14.0, 8.4)
    base_lat_tree: tuple[float, float, float] = (6.8, 14.0, 8.4)
    hop_lat_ring: tuple[tuple[str, tuple[float, float, float]], ...] = (
        ("nvlink", (0.6, 1.9, 3.4)),
        ("pcie", (1.0, 2.5, 5.7)),
        ("net", (2.7, 4.0, 14.0)),
    )
    hop_lat_tree: tuple[tuple[str, tuple[float, float, float]], ...] = (
        ("nvlink", (0.6, 1.25, 4.0)),
        ("pcie", (1.0, 1.9, 4.0)),
        ("net", (5.0, 8.5, 14.0)),
    )
    # Multi-node ring: per-step network overhead 1 us (Intel host), x3 for Simple; Ring/
    # Simple all-reduce latency x1.4 (x1.9 before Ampere) once nBytes/(nc*n) >= 64.
    net_overhead_us: float = 1.0
    multinode_simple_lat_factor: tuple[tuple[str, float], ...] = (
        ("volta", 1.9), ("ampere", 1.4), ("hopper", 1.4), ("blackwell", 1.4))
    # Protocol efficiency on the wire: LL carries 8 B data per 16 B line (x0.5), LL128
    # 120 of 128 B (NCCL applies x0.92); Simple is the measured peak (the busBw caps of
    # HardwareProfile are Simple measurements).
    ll_factor: float = 0.5
    ll128_factor: float = 0.92
    tree_factor: float = 0.92
    tree_ll_factor: float = 1 / 3.8
    tree_ll128_factor_1node: float = 7 / 9
    tree_ll128_factor_multinode: float = 120 / 128
    # llMaxBw (GB/s): one node by GPU arch; multi-node (Intel host) 2 nodes / more.
    ll_max_gbps: tuple[tuple[str, float], ...] = (
        ("volta", 39.0), ("ampere", 87.7), ("hopper", 141.0), ("blackwell", 2 * 141.0))
    ll_max_multinode_gbps: tuple[float, float] = (39.0, 20.4)
    # Per *search* channel caps (GB/s), columns 1 node / 2 nodes / >2 nodes; NCCL runs
    # two CTAs per search channel, so the per-CTA cap is half.
    per_ch_ring_ll128: tuple[tuple[str, float], ...] = (
        ("volta", 20.0), ("ampere", 20.0), ("hopper", 36.7), ("blackwell", 40.0))
    per_ch_tree: tuple[tuple[str, tuple[float, float, float]], ...] = (
        ("volta", (26.5, 18.5, 10.0)), ("ampere", (24.0, 23.6, 17.8)), ("hopper", (38.7, 41.4, 36.0)),
        ("blackwell", (70.0, 42.8, 24.0)))
    per_ch_tree_ll128: tuple[tuple[str, tuple[float, float, float]], ...] = (
        ("volta", (20.0, 20.0, 20.0)), ("ampere", (20.0, 20.0, 20.0)), ("hopper", (36.7, 36.7, 29.0)),
        ("blackwell", (55.6, 31.67, 20.0)))
    ctas_per_search_channel: int = 2
    # Threads per CTA at which one channel reaches its full rate: NCCL's defaults
    # (512 for LL and Simple, 640 for LL128). Fewer threads move proportionally less.
    full_rate_threads: tuple[int, int, int] = (512, 640, 512)
    # Part of a step's hop latency paid again for every chunk a channel moves: the
    # flag/FIFO handshake per chunk. NCCL keeps 8 steps in flight (NCCL_STEPS), so one
    # in 8 handshakes is exposed. No published chunk sweep was found to calibrate it.
    chunk_sync_fraction: float = 1 / 8
    # Local HBM traffic per bus byte of a ring collective: the peer's write into the
    # receive buffer plus the read that forwards or reduces it (assumption; calibrated so
    # that memory-bound compute overlapped with a saturated all-reduce slows by ~40%,
    # the worst case of ISPASS'25, arXiv 2507.03114).
    hbm_bytes_per_bus_byte: float = 2.0
    # NVLS: the switch reduces, so each GPU's HBM only serves its input once and takes the
    # result once, 2 N bytes per 2(n-1)/n N bus bytes = n/(n-1) (8 GPUs; assumption from
    # the data path of multimem load-reduce / store, not measured).
    nvls_hbm_bytes_per_bus_byte: float = 8 / 7
    # Bytes a protocol writes and reads per byte of data, [LL, LL128, Simple]: LL carries 8
    # data bytes and 8 flag bytes per 16-byte line, LL128 120 data bytes per 128-byte line
    # (NVIDIA/nccl src/include/device.h), so their HBM traffic is that much above the data's.
    protocol_wire_bytes: tuple[float, float, float] = (2.0, 128 / 120, 1.0)
    # A compute-bound kernel beside traffic that takes a share p of HBM bandwidth still slows,
    # by (1 - p) ** -exponent: its operand loads queue behind the other traffic in L2 and
    # HBM (the H100 probe: a cuBLAS GEMM ran 1.23x slower beside a copy of 702 GB/s on 8
    # CTAs, 2.2x beside 1,859 GB/s on 32; copy engines moving 2.6 TB/s with no CTA: 1.46x).
    # With the launch-order rules (whole SMs from GEMMs that start beside resident CTAs,
    # ``HardwareProfile.resident_sm_share``) the exponent no longer stands in for the SMs:
    # 0.5 is the value of {0.2, 0.3, ..., 0.8} whose worst per-source median error over every
    # source of ``benchmarks/measured/contention.py`` is smallest (9.3%, ISPASS'25; 0.8 gave 14.4%,
    # 0.2 gave 14.3%), not a fit to one source. 0 turns the term off.
    hbm_pressure_exponent: float = 0.5
    # Compute keeps at least this share of HBM bandwidth however much comm wants.
    min_hbm_share: float = 0.1
    # Waves a matmul of several waves that loses whole SMs (``HardwareProfile.resident_sm_share``
    # 1: Hopper, Blackwell) runs at least, beyond its waves on every SM: the library sized its
    # kernel for every SM, and the tiles of a missing SM finish a wave late. Measured, not
    # fitted: the H100 order probe's 16-wave 8192^3 GEMM lost 6.4-7.1% to one held SM of 132
    # (1/132 of the SMs predicts 0.8%; one more wave of 16, 6.25%), and 4 CTAs packed on one
    # SM at a kernel boundary cost the same as one. A one-wave matmul has no tail to lose (its
    # tiles either fit the SMs left or need a second wave, which the waves model counts).
    # 0 turns it off.
    held_sm_tail_waves: float = 1.0
    # Anchor a collective inside one node to the measured time of NCCL's own choice
    # (``collective_tables``: XLA's tables for H100/B200, nccl-tests for A100); False is
    # NCCL's model alone.
    measured_tables: bool = True
    # What one channel beyond those that get work costs (us): NCCL never splits a
    # collective below nthreads x bytes-per-thread per channel (``topoGetAlgoInfo``: 32 KiB
    # for Simple), so a channel forced on a smaller share has no data, adds no bandwidth,
    # and still launches a CTA that joins the kernel's end (``working_channels``: how the
    # channels take data as the size grows). The value is what NCCL's own
    # rule implies: it stops adding channels where one more CTA saves 32 KiB / (24
    # channels x 10-15 GB/s) = 0.09-0.14 us (A100/H100), so a CTA costs about that. No
    # published channel sweep measures it.
    idle_channel_us: float = 0.1
    # NCCL's own choice never takes less time for more bytes (``_monotone_floor_us``); False:
    # the model and its anchor as they fall.
    monotone_default: bool = True
    # Sends and receives (all-to-all, collective-permute) inside a node on buffers registered
    # with NCCL (XLA's user buffers register both, openxla/xla PR #8874; NCCL 2.23+ then copies
    # straight into the peer's buffer, no staging through its FIFO, on the same CTAs): their
    # rate over the unregistered one, measured once: alltoall_perf of 4 GiB over 8 H800 of one
    # machine, NCCL 2.27.0, algbw 160 -> 176 GB/s with local registration (NVIDIA/nccl issue
    # #1722; no gain across two nodes, where the network's copies stay).
    registered_p2p_rate: float = 176.0 / 160.0
    # NVLS all-reduce latency (us): NCCL's hwLat[NVLINK][NVLS] with base 0, one node
    # (src/graph/tuning.cc); its time has no per-hop or per-chunk term in NCCL's model.
    nvls_lat_us: float = 25.0
    # Pipeline steps of an NVLS all-reduce that fill before data flows: a reduce through
    # the switch (multimem load-reduce) and a broadcast back (multimem store).
    nvls_steps: int = 2
    # NVLSTree (NVLS inside each node, a tree between the nodes' NVLS heads; all-reduce
    # across nodes, Simple only; NVIDIA/nccl src/graph/tuning.cc v2.30.7): latency
    # hwLat[NVLINK][NVLSTree] + 2 log2(nodes) x (hwLat[NET][NVLSTree] + the net device's
    # latency), base 0; and the most one head moves across nodes (perChMaxNVLSTreeBw, GB/s),
    # columns 2 nodes / more, by architecture.
    nvls_tree_intra_lat_us: float = 25.0
    nvls_tree_net_lat_us: float = 20.9
    per_head_nvls_tree: tuple[tuple[str, tuple[float, float]], ...] = (
        ("hopper", (57.7, 45.5)), ("blackwell", (96.0, 80.0)))
    # NCCL's correction of a tree's all-reduce bandwidth at medium sizes, "trees are not
    # perfectly sticking to the model" (``treeCorrectionFactor``, src/graph/tuning.cc, the same
    # since NCCL 2.7): by protocol [LL, LL128, Simple], one factor per power of two of nBytes/64
    # from 64 B. NCCL applies it to its pick's estimate, a step at each power of two: for Tree
    # up to 256 MiB, for NVLSTree up to 512 MiB and only on Blackwell with x86 hosts. The model
    # applies it to both trees' time on every architecture (``tree_correction``), joining the
    # steps linearly in log size so that a larger all-reduce never takes less time: it is
    # NCCL's account of what trees measure, and the H100 sweeps across 2-32 nodes show
    # NVLSTree's medium sizes that much slower than its model on Hopper too
    # (``collective_fidelity``: the all-reduces of NVIDIA/nccl-tests #309 and AWS p5).
    tree_correction: tuple[tuple[float, ...], ...] = (
        (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
        (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
        (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9))

    # Hashed on every cached cost lookup: once per instance (lagom_jax.hashing).
    __hash__ = hashing.hash_fields_once
    __getstate__ = hashing.state_without_hash

    def lookup(self, table: tuple[tuple[str, object], ...], key: str):  # noqa: ANN201 - generic row
        for k, v in table:
            if k == key:
                return v
        raise KeyError(f"no entry {key!r} in cost table (known: {[k for k, _ in table]})")


DEFAULT_COSTS = CostConfig()


def _link_kind(hw: HardwareProfile, nodes: int) -> str:
    return "net" if nodes > 1 else hw.intra_link


def _link_caps(hw: HardwareProfile, nodes: int, share: float = 1.0) -> tuple[float, float]:
    """(busBw at saturation, busBw of one channel) for a group spanning ``nodes`` nodes
    that has ``share`` of each node's network (``net_share``)."""
    if nodes > 1:
        # A channel of a ring across nodes runs at its NIC's share (``net_channel_gbps``,
        # NCCL's bwInter), not at the NVLink search's speed inside one node.
        return min(hw.intra_busbw_gbps, hw.net_busbw_gbps * share), hw.net_channel_gbps
    return hw.intra_busbw_gbps, hw.intra_channel_gbps


def net_share(hw: HardwareProfile, group_size: int, nodes: int) -> float:
    """The share of each node's network one group spanning ``nodes`` nodes gets.

    In an SPMD step every device runs the same collective at the same time, so a group
    with ``group_size / nodes`` GPUs on a node runs beside the groups of the node's other
    GPUs, and each GPU drives its own NIC (rail-optimised nodes: one NIC per GPU, or a
    NIC shared by a fixed pair of GPUs). The group gets its GPUs' part of the node's
    network: a data-parallel all-reduce with one GPU per node gets 1/8 of an 8-GPU node's
    bandwidth, the other seven GPUs' groups the rest.
    """
    if nodes <= 1:
        return 1.0
    return min(1.0, group_size / nodes / hw.gpus_per_node)


def _check_args(kind: str, nbytes: float, group_size: int, nodes: int, params: CollectiveParams,
                hw: HardwareProfile) -> None:
    if nbytes < 0:
        raise ValueError(f"{kind}: nbytes must be >= 0, got {nbytes}")
    if group_size < 1 or nodes < 1 or nodes > group_size:
        raise ValueError(f"{kind}: need 1 <= nodes <= group_size, got nodes={nodes}, group_size={group_size}")
    if params.algorithm == "one_shot":
        if not one_shot_applies(kind, group_size, nodes, hw):
            raise ValueError(f"{kind} over {group_size} GPUs on {nodes} node(s): XLA's one-shot kernel runs only a "
                             f"ragged all-to-all of 2-{ONE_SHOT_MAX_PEERS} GPUs of one host, with the flag on and a "
                             "measured rate (one_shot_applies)")
        return
    if params.algorithm == "symmetric":
        if kind not in SYMMETRIC_KINDS or nodes > 1:
            raise ValueError(f"{kind} over {nodes} node(s): NCCL's symmetric kernels run "
                             f"{', '.join(SYMMETRIC_KINDS)} inside one NVLink domain only")
    elif params.algorithm == "nvls" and kind != "all-reduce" and not nvls_shape(kind, group_size, nodes):
        raise ValueError(f"{kind} over {group_size} GPUs: NCCL runs NVLS for all-reduce, and for all-gather and "
                         f"reduce-scatter over at most {NVLS_MAX_ARITY} GPUs; use algorithm='ring'")
    elif params.algorithm not in ("ring", "nvls") and kind != "all-reduce":
        raise ValueError(f"{kind}: NCCL's {params.algorithm} algorithm is modelled only for all-reduce; "
                         "use algorithm='ring'")
    if params.algorithm == "nvls" and nodes > 1:
        raise ValueError(f"{kind}: NVLS is modelled inside one NVLink domain only (NCCL runs it across "
                         "nodes only with CollNet; across nodes it runs NVLSTree, algorithm='nvls_tree'), "
                         f"got nodes={nodes}")
    if params.algorithm == "nvls_tree" and not nvls_tree_shape(kind, group_size, nodes):
        raise ValueError(f"{kind} over {group_size} GPUs on {nodes} node(s): NCCL runs NVLSTree for all-reduces "
                         "across nodes with at least 2 GPUs on each; use algorithm='ring'")


def bus_factor(kind: str, algorithm: str, n: int) -> float:
    """Bus bytes per nBytes (nccl-tests busBw convention; tree all-reduce algBw = busBw/2)."""
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2.0 if algorithm == "tree" else 2.0 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter", "all-to-all", RAGGED):
        return (n - 1) / n
    if kind == "collective-permute":
        return 1.0
    raise ValueError(f"unknown collective kind {kind!r} (known: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute)")


def ring_steps(kind: str, n: int) -> int:
    """Pipelined ring steps: 2(n-1) for all-reduce, n-1 for the others, 1 for a permute."""
    if kind == "all-reduce":
        return 2 * (n - 1)
    if kind == "collective-permute":
        return 1
    return n - 1


def latency_us(kind: str, nbytes: float, n: int, nodes: int, params: CollectiveParams,
               hw: HardwareProfile, cfg: CostConfig = DEFAULT_COSTS) -> float:
    """NCCL's latency composition (``ncclTopoGetAlgoTime``), without launch overhead."""
    lat, factor = _latency_parts(kind, n, nodes, params, hw, cfg)
    if factor is not None and nbytes / (params.nchannels * n) >= 64:
        lat *= factor
    return lat


@functools.lru_cache(maxsize=1 << 12)
def _latency_parts(kind: str, n: int, nodes: int, params: CollectiveParams,
                   hw: HardwareProfile, cfg: CostConfig) -> tuple[float, float | None]:
    """The latency without its one size-dependent term, and that term: the factor NCCL
    applies to multi-node Ring/Simple all-reduce once nBytes/(nc*n) >= 64 (None when it
    cannot apply). Split so that the latency is tabulated once per (shape, params)."""
    p = PROTOCOL_INDEX[params.protocol]
    if n <= 1:
        return 0.0, None
    intra_kind = hw.intra_link
    if params.algorithm == "nvls":
        return cfg.nvls_lat_us, None
    if params.algorithm == "nvls_tree":
        hops = 2 * int(math.log2(nodes))  # NCCL's log2i: the floor
        return cfg.nvls_tree_intra_lat_us + hops * (cfg.nvls_tree_net_lat_us + _net_latency(hw, params.protocol)), None
    if params.algorithm == "tree":
        base = cfg.base_lat_tree[p]
        intra = cfg.lookup(cfg.hop_lat_tree, intra_kind)[p]
        inter = cfg.lookup(cfg.hop_lat_tree, "net")[p] + _net_latency(hw, params.protocol)
        per_node = max(n // nodes, 1)
        return base + 2 * ((per_node - 1) * intra + math.log2(nodes) * inter), None
    base = cfg.base_lat_ring[p]
    intra = cfg.lookup(cfg.hop_lat_ring, intra_kind)[p]
    steps = ring_steps(kind, n)
    if nodes <= 1:
        return base + steps * intra, None
    n_inter = 2 * (nodes - 1) if kind == "all-reduce" else nodes - 1
    n_inter = min(n_inter, steps)
    net_ovh = cfg.net_overhead_us * (3 if params.protocol == "Simple" else 1)
    # One GPU per node: every hop crosses the network, NCCL uses the tree's net latency.
    inter_table = cfg.hop_lat_tree if n == nodes else cfg.hop_lat_ring
    inter = cfg.lookup(inter_table, "net")[p] + _net_latency(hw, params.protocol)
    lat = base + (steps - n_inter) * max(intra, net_ovh) + n_inter * inter
    if kind == "all-reduce" and params.protocol == "Simple":
        return lat, cfg.lookup(cfg.multinode_simple_lat_factor, hw.arch)
    return lat, None


def _net_latency(hw: HardwareProfile, protocol: str) -> float:
    """What the network device adds to one inter-node hop: its latency (NCCL's
    ``latencyInter``), twice for Simple, whose flush NCCL also charges it for."""
    return hw.net_latency_us * (2 if protocol == "Simple" else 1)


def busbw_gbps(params: CollectiveParams, hw: HardwareProfile, nodes: int = 1,
               cfg: CostConfig = DEFAULT_COSTS, share: float = 1.0, kind: str = "all-reduce", n: int = 0) -> float:
    """Bus bandwidth of one ``kind`` collective over ``n`` GPUs (default: a node's) with
    ``params`` on the link its group spans, with ``share`` of each node's network
    (``net_share``) when it spans nodes.

    Grows by one channel's rate per channel (scaled by threads per CTA) until the link
    saturates, then the protocol's efficiency and NCCL's per-protocol caps apply.
    """
    return _busbw(params.algorithm, params.protocol, params.nchannels, params.nthreads, hw, nodes, cfg, share,
                  *_nvls_key(params.algorithm, kind, n))


def _nvls_key(algorithm: str, kind: str, n: int) -> tuple[str, int]:
    """The (kind, ranks) ``_busbw`` depends on: NVLS's alone (so the cache keeps one entry per
    ring or tree rate whatever collective asks)."""
    return (kind, n) if algorithm in ("nvls", "nvls_tree") else ("all-reduce", 0)


def nvls_rate(kind: str, n: int) -> float:
    """An NVLS collective's bus bandwidth over the NVLS all-reduce's, as NCCL models it
    (NVIDIA/nccl ``src/graph/tuning.cc``, ``ncclTopoTuneModel``): the all-reduce's busBw is
    the NVLS graph's per-channel rate times 2 (it pipelines the reduce and the broadcast),
    an all-gather's or reduce-scatter's the same rate times ``(ppn - 1) / ppn``."""
    return 1.0 if kind == "all-reduce" else (n - 1) / (2 * n)


@functools.lru_cache(maxsize=1 << 12)
def _busbw(algorithm: str, protocol: str, nc: int, nthreads: int, hw: HardwareProfile, nodes: int,
           cfg: CostConfig, share: float = 1.0, kind: str = "all-reduce", n: int = 0) -> float:
    """``busbw_gbps`` by fields, so one channel's rate needs no new CollectiveParams."""
    cap, per_ch = _link_caps(hw, nodes, share)
    p = PROTOCOL_INDEX[protocol]
    per_ch *= min(1.0, nthreads / cfg.full_rate_threads[p])
    col = 0 if nodes <= 1 else 1 if nodes == 2 else 2
    cta = cfg.ctas_per_search_channel
    ll_max = (cfg.lookup(cfg.ll_max_gbps, hw.arch) if nodes <= 1
              else cfg.ll_max_multinode_gbps[0 if nodes == 2 else 1])
    if algorithm == "nvls":
        if not hw.nvls_channels:
            raise ValueError(f"{hw.name} has no NVLS (no NVSwitch of Hopper or newer)")
        # Registered buffers reach the NVLS bandwidth on the fewer CTAs NCCL gives them.
        full = nvls_registered_ctas(hw, kind) if hw.nccl_env.user_buffers else hw.nvls_channels
        peak = hw.nvls_busbw_gbps * nvls_rate(kind, n or hw.gpus_per_node)
        per_nvls = peak / full * min(1.0, nthreads / cfg.full_rate_threads[p])
        return min(nc * per_nvls, peak)
    if algorithm == "nvls_tree":
        peak = nvls_tree_busbw_gbps(hw, n // nodes if n else hw.gpus_per_node, nodes, share, cfg)
        # Registered buffers reach it on the fewer CTAs NCCL gives them, as for NVLS.
        return min(nc * peak / nvls_tree_ctas(hw, nodes), peak) * min(1.0, nthreads / cfg.full_rate_threads[p])
    if algorithm == "tree":
        tree_ch = cfg.lookup(cfg.per_ch_tree, hw.arch)[col] / cta
        bw = min(nc * min(per_ch, tree_ch), cap) * cfg.tree_factor
        if protocol == "LL":
            return min(bw * cfg.tree_ll_factor, ll_max)
        if protocol == "LL128":
            f = cfg.tree_ll128_factor_1node if nodes <= 1 else cfg.tree_ll128_factor_multinode
            return min(bw * f, nc * cfg.lookup(cfg.per_ch_tree_ll128, hw.arch)[col] / cta)
        return bw
    if protocol == "LL":
        return min(min(nc * per_ch, cap) * cfg.ll_factor, ll_max)
    if protocol == "LL128":
        ll128_ch = cfg.lookup(cfg.per_ch_ring_ll128, hw.arch) / cta
        return min(nc * min(per_ch, ll128_ch), cap) * cfg.ll128_factor
    return min(nc * per_ch, cap)


@functools.lru_cache(maxsize=1 << 16)
def collective_time_us(kind: str, nbytes: float, group_size: int, nodes: int,
                       params: CollectiveParams, hw: HardwareProfile,
                       cfg: CostConfig = DEFAULT_COSTS) -> float:
    """Time of one collective running alone (us). ``nodes`` = nodes the group spans."""
    _check_args(kind, nbytes, group_size, nodes, params, hw)
    if group_size <= 1:
        return hw.launch_us
    if kind == RAGGED:
        if params.algorithm == "one_shot":
            return one_shot_time_us(nbytes, group_size, hw)
        return collective_time_us("all-to-all", nbytes, group_size, nodes, params, hw, cfg)
    if params.algorithm == "symmetric":
        return hw.launch_us + min(t for _k, _c, t in _symmetric_times(kind, nbytes, group_size, hw, params.protocol,
                                                                   params.nchannels))
    return _time_from_terms(nbytes, group_size, params, _size_free_terms(kind, group_size, nodes, params, hw, cfg),
                            hw, cfg) * measured_ratio(kind, nbytes, group_size, nodes, hw, cfg)


def measured_ratio(kind: str, nbytes: float, group_size: int, nodes: int, hw: HardwareProfile,
                   cfg: CostConfig = DEFAULT_COSTS) -> float:
    """The factor every candidate's time for this collective is scaled by: measured over
    modelled time of NCCL's own choice (``_table_ratio``), raised where NCCL's own choice
    would otherwise take less time than at a smaller size (``_monotone_floor_us``)."""
    ratio = _table_ratio(kind, nbytes, group_size, nodes, hw, cfg)
    if not cfg.monotone_default or group_size <= 1 or symmetric_applies(kind, group_size, nodes, hw):
        return ratio
    own = _default_model_us(kind, nbytes, group_size, nodes, hw, cfg) * ratio
    k = int(_GRID_STEPS * math.log2(nbytes)) if nbytes >= 1 else -1
    floor = _monotone_floor_us(kind, k, group_size, nodes, hw, cfg)
    return ratio * floor / own if floor > own else ratio


# Sizes 2^(k/8) at which NCCL's own choice is timed for the monotone floor, after 0 B (k = -1).
_GRID_STEPS = 8


def _default_model_us(kind: str, nbytes: float, n: int, nodes: int, hw: HardwareProfile, cfg: CostConfig) -> float:
    p = nccl_default_params(kind, nbytes, n, nodes, hw, cfg)
    return _time_from_terms(nbytes, n, p, _size_free_terms(kind, n, nodes, p, hw, cfg), hw, cfg)


# (kind, ranks, nodes, hw, cfg) -> the running maximum of ``_monotone_floor_us`` from 0 B
# (entry 0) by grid index (entry k + 1), grown as larger sizes are asked for.
_FLOORS: dict[tuple, list[float]] = {}


def _monotone_floor_us(kind: str, k: int, n: int, nodes: int, hw: HardwareProfile, cfg: CostConfig) -> float:
    """The longest time of NCCL's own choice (anchored) at 0 B or any size 2^(j/8) <= 2^(k/8)
    (k = -1: below one byte, 0 B alone).

    NCCL's choice changes with the size (algorithm, protocol, channels and threads cut for
    small messages), and at such a switch the model, anchored or not, can time a larger
    collective below a smaller one: 2 A100 gathered 1 KiB in 8.70 us and 4 KiB in 8.10 us
    (the ring/LL pick doubling its threads, anchored at all-reduce rows of half the size),
    and 306 such falls showed on a grid of every preset, kind and group. A time that falls
    misleads the combiner and the search (a combined collective priced below its parts), and
    the measured tables hold none beyond their noise (``collective_tables._monotone``), so a
    collective takes at least what a smaller one took (``CostConfig.monotone_default``):
    monotone on this grid, within 1/8 of an octave between its points. Its cost where the
    model peaks between measured sizes: against Echo's A100 nccl-tests logs the anchored
    median error went 3.2% -> 4.3% (worst +16% -> +24%), XLA's H100 table 6.9% -> 7.6%.

    The grid starts at 0 B: anchored on the tables' 8-GPU rows, the model can time 0 B above
    1 B on a larger group (an all-reduce over the 72 GPUs of ``gb200-nvl72``: 79.18 us against
    78.83 us, the model's own 0-byte terms scaled by the smallest measured time), and 1 B then
    takes the 0-byte time as any larger size takes a smaller one's."""
    floors = _FLOORS.setdefault((kind, n, nodes, hw, cfg), [])
    while len(floors) <= k + 1:
        size = 2.0 ** ((len(floors) - 1) / _GRID_STEPS) if floors else 0.0
        here = _default_model_us(kind, size, n, nodes, hw, cfg) * _table_ratio(kind, size, n, nodes, hw, cfg)
        floors.append(max(here, floors[-1]) if floors else here)
    return floors[k + 1]


def _table_ratio(kind: str, nbytes: float, group_size: int, nodes: int, hw: HardwareProfile,
                 cfg: CostConfig = DEFAULT_COSTS) -> float:
    """Measured over modelled time of NCCL's own choice for this collective
    (``collective_tables``); 1 for groups spanning nodes, without a table, or with
    ``measured_tables`` off. Zero bytes take the smallest measured size's time like any size
    below it (not the model's: 0 B cost more than 1 B)."""
    if not cfg.measured_tables or nodes > 1 or group_size <= 1 or not hw.collective_table:
        return 1.0
    if kind == "collective-permute":  # the rows of its communicator's ranks
        group_size = p2p_communicator(group_size, hw)
    a = _anchor(kind, group_size, hw, cfg)
    if a is None:
        return 1.0
    size = nbytes * a.scale
    if size < a.smallest[0]:
        return a.smallest[1] / _raw_default_us(a.kind, size, a.ranks, hw, cfg)
    return collective_tables.interpolate(a.points, math.log(size))


def _raw_default_us(kind: str, nbytes: float, n: int, hw: HardwareProfile, cfg: CostConfig) -> float:
    """The model alone under NCCL's own choice, inside one node, with NCCL's default settings:
    what the tables measured. A user's settings (a protocol, a CTA cap, symmetric buffers)
    then move a collective's time by what the model says they change, from the measurement."""
    measured_as, unanchored = _as_measured(hw, cfg)
    return default_time_us(kind, nbytes, n, 1, measured_as, unanchored)


@functools.lru_cache(maxsize=1 << 6)
def _as_measured(hw: HardwareProfile, cfg: CostConfig) -> tuple[HardwareProfile, CostConfig]:
    """The cluster as the tables measured it (one node, NCCL's default settings) and the model
    without the tables: made once, so that the cost model's tables keyed by them are found
    again rather than hashed anew from a fresh copy per call."""
    return dataclasses.replace(hw.with_nodes(1), nccl_env=NcclEnv()), dataclasses.replace(cfg, measured_tables=False)


@functools.lru_cache(maxsize=1 << 10)
def _anchor(kind: str, group_size: int, hw: HardwareProfile, cfg: CostConfig) -> collective_tables.Anchor | None:
    return collective_tables.anchor(hw.collective_table, kind, group_size,
                                    lambda k, b, n: _raw_default_us(k, b, n, hw, cfg))


_Terms = tuple[float, float, float, float, int, float, "float | None"]


@functools.lru_cache(maxsize=1 << 12)
def _size_free_terms(kind: str, n: int, nodes: int, params: CollectiveParams, hw: HardwareProfile,
                     cfg: CostConfig) -> _Terms:
    """The terms of ``collective_time_us`` that do not depend on the size: bus bytes per
    nBytes, busBw and one channel's busBw (bytes/us), per-chunk hop latency, pipeline
    steps, and the latency with its size-dependent factor (``_latency_parts``). The
    search times every candidate of every collective size, so these are tabulated once
    per (kind, group, params) instead of once per size."""
    share = net_share(hw, n, nodes)
    bw = busbw_gbps(params, hw, nodes, cfg, share, kind, n) * 1e3  # bytes per us
    one_ch = _busbw(params.algorithm, params.protocol, 1, params.nthreads, hw, nodes, cfg, share,
                    *_nvls_key(params.algorithm, kind, n)) * 1e3
    if registered_p2p(kind, nodes, params, hw):
        bw, one_ch = bw * cfg.registered_p2p_rate, one_ch * cfg.registered_p2p_rate
    p = PROTOCOL_INDEX[params.protocol]
    hop_table = cfg.hop_lat_tree if params.algorithm == "tree" else cfg.hop_lat_ring
    multicast = params.algorithm in ("nvls", "nvls_tree")
    hop = 0.0 if multicast else cfg.lookup(hop_table, _link_kind(hw, nodes))[p]
    steps = (ring_steps(kind, n) if params.algorithm == "ring" else cfg.nvls_steps if params.algorithm == "nvls"
             else cfg.nvls_steps + 2 * math.ceil(math.log2(nodes)) if params.algorithm == "nvls_tree"
             else 2 * max(n // nodes, 1))
    return (bus_factor(kind, params.algorithm, n), bw, one_ch, hop, steps,
            *_latency_parts(kind, n, nodes, params, hw, cfg))


def registered_p2p(kind: str, nodes: int, params: CollectiveParams, hw: HardwareProfile) -> bool:
    """Whether this collective runs NCCL's sends and receives on registered buffers inside a
    node (``CostConfig.registered_p2p_rate``): XLA's user buffers, an all-to-all or a
    collective-permute, one node, the Simple protocol (NCCL registers no LL buffer)."""
    return (hw.nccl_env.user_buffers and kind in ("all-to-all", "collective-permute", RAGGED) and nodes <= 1
            and params.protocol == "Simple" and params.algorithm != "one_shot")


def tree_correction(algorithm: str, protocol: str, nbytes: float, cfg: CostConfig = DEFAULT_COSTS) -> float:
    """The factor on a tree's all-reduce bandwidth at this size (``CostConfig.tree_correction``,
    joined linearly in log2 size; 1 for other algorithms, below 64 B and from 512 MiB (Tree)
    or 1 GiB (NVLSTree)). Only all-reduce runs a tree."""
    if algorithm not in _CORRECTED or nbytes < 64:
        return 1.0
    i, frac = _correction_point(nbytes, cfg)
    row = _correction_row(algorithm, protocol, cfg)
    return row[i] * (1 - frac) + row[i + 1] * frac


# Points of NCCL's correction table each tree takes (``ncclTopoGetAlgoTime``: logSize < 23 for
# Tree, < 24 for NVLSTree).
_CORRECTED = {"tree": 23, "nvls_tree": 24}


def _correction_point(nbytes: float, cfg: CostConfig) -> tuple[int, float]:
    """(index, fraction) of ``nbytes`` (>= 64) between the correction table's points."""
    x = math.log2(nbytes / 64)
    i = min(int(x), len(cfg.tree_correction[0]) - 1)
    return i, min(x - i, 1.0)


def _correction_row(algorithm: str, protocol: str, cfg: CostConfig) -> tuple[float, ...]:
    """``algorithm``'s factors by table point, 1 past its last (one point past the table)."""
    row = cfg.tree_correction[PROTOCOL_INDEX[protocol]]
    n = _CORRECTED.get(algorithm, 0)
    return (*row[:n], *(1.0,) * (len(row) + 1 - n))


def _pick_correction(algorithm: str, protocol: str, nbytes: float, hw: HardwareProfile, cfg: CostConfig) -> float:
    """The correction NCCL itself applies when it picks: Tree's everywhere, NVLSTree's on
    Blackwell (NCCL also asks for an x86 host, which the presets do not record)."""
    if algorithm == "nvls_tree" and hw.arch != "blackwell":
        return 1.0
    return tree_correction(algorithm, protocol, nbytes, cfg)


def _time_from_terms(nbytes: float, n: int, params: CollectiveParams, terms: _Terms,
                     hw: HardwareProfile, cfg: CostConfig) -> float:
    """The collective-time formula of the module docstring, for a group of n > 1 ranks.

    The channels' transfer is the longest of the link moving every bus byte and the busiest
    channel moving its share, idle CTAs included (``working_channels``: one channel until
    ``first`` bus bytes, then a channel joins as its saving pays for the idle CTA it
    replaces, then the even split). Chunks and fill count NCCL's cell split: ``first`` per
    channel until every channel has it, then the even split. Every term grows with the
    bytes: a larger collective never takes less time."""
    bus, bw, one_ch, hop, steps, lat, lat_factor = terms
    if lat_factor is not None and nbytes / (params.nchannels * n) >= 64:
        lat *= lat_factor
    wire = nbytes * bus
    first, idle = _first_share(n, params, bus, cfg)
    nc = params.nchannels
    share = max(min(wire, first), wire / nc)
    chunks = math.ceil(share / params.chunk_bytes)
    fill = min(params.chunk_bytes, share / steps) / one_ch
    f = tree_correction(params.algorithm, params.protocol, nbytes, cfg)  # the rates, not the idle CTAs
    transfer = max(wire / (bw * f), min(wire, first) / one_ch + idle, wire / (nc * one_ch * f))
    return hw.launch_us + lat + transfer + chunks * hop * cfg.chunk_sync_fraction + fill


def _first_share(n: int, params: CollectiveParams, bus: float, cfg: CostConfig) -> tuple[float, float]:
    """(bus bytes one channel takes before a second gets data, the idle CTAs' cost then, us).

    The first: NCCL's minimum per channel, nthreads x bytes-per-thread (``_BYTES_PER_THREAD``;
    ring LL x ranks), the rule by which it cuts its own channel count for small messages
    (``nccl_default_params``). NVLS and NVLSTree always run all their CTAs: (0, 0)."""
    if params.algorithm in ("nvls", "nvls_tree"):
        return 0.0, 0.0
    return params.nthreads * _per_thread(params, n) * bus, (params.nchannels - 1) * cfg.idle_channel_us


def _per_thread(params: CollectiveParams, n: int) -> int:
    return _BYTES_PER_THREAD[params.protocol] * (n if params.protocol == "LL" and params.algorithm == "ring" else 1)


def working_channels(kind: str, nbytes: float, n: int, nodes: int, params: CollectiveParams, hw: HardwareProfile,
                     cfg: CostConfig = DEFAULT_COSTS) -> int:
    """Channels that get data: the most ``k <= nchannels`` for which each would carry
    ``u + (k - 1) c r`` bus bytes (1 at least; NVLS and NVLSTree: all).

    ``u`` is NCCL's minimum per channel (``_first_share``), ``c r`` what one channel moves
    (``r``) in the time an idle CTA costs (``idle_channel_us``). NCCL's own rule, a channel
    every ``u`` bytes, makes the time *fall* at each step (the shares shrink to ``u`` and one
    idle CTA less is paid: 1024 B of tree/LL on 64 threads took 1.65 us less than 700 B).
    A channel that joins only once its saving pays for the idle CTA it replaces keeps the
    time flat through the steps, never lower; ``_time_from_terms`` is its closed form.
    """
    _check_args(kind, nbytes, n, nodes, params, hw)
    if params.algorithm in ("nvls", "nvls_tree", "symmetric", "one_shot") or n <= 1:
        return params.nchannels
    bus, _bw, one_ch, *_ = _size_free_terms(kind, n, nodes, params, hw, cfg)
    first, _idle = _first_share(n, params, bus, cfg)
    cr = cfg.idle_channel_us * one_ch
    return max([1] + [k for k in range(1, params.nchannels + 1) if nbytes * bus >= k * (first + (k - 1) * cr)])


# NCCL's per-protocol defaults (NVIDIA/nccl v2.30.7: threads in src/graph/tuning.cc and
# src/include/device.h, bytes per thread in src/include/comm.h, chunks in src/enqueue.cc
# calcCollChunking from the buffer sizes in src/init.cc).
_DEFAULT_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
_BYTES_PER_THREAD = {"LL": 8, "LL128": 8, "Simple": 64}  # ring LL: x nRanks
_LL_CHUNK = 32 << 10
_LL128_CHUNK = 576_000  # 4,915,200 B buffer / 8 steps x 120/128
_SIMPLE_RING_CHUNK = 2 << 20  # 4 MiB buffer / 8 steps x 4 chunk steps
_SIMPLE_OTHER_CHUNK = 512 << 10
_NVLS_CHUNK = 128 << 10


def _protocols(hw: HardwareProfile, algorithm: str) -> tuple[str, ...]:
    """The protocols NCCL runs ``algorithm`` with here, under the cluster's NCCL_PROTO."""
    own = ("Simple",) if algorithm in ("nvls", "nvls_tree") else ("LL", "LL128", "Simple") if hw.ll128_enabled else ("LL", "Simple")
    return tuple(p for p in own if hw.nccl_env.allows_protocol(p))


# NCCL runs NVLS all-gathers and reduce-scatters over at most this many GPUs of a node
# (NCCL_MAX_NVLS_ARITY; ``updateCollCostTable`` in NVIDIA/nccl src/enqueue.cc).
NVLS_MAX_ARITY = 32


def nvls_shape(kind: str, n: int, nodes: int) -> bool:
    """Whether NCCL can run NVLS for this collective where the system has NVLS: inside one
    NVLink domain, all-reduces over more than one GPU, all-gathers and reduce-scatters over
    2 to ``NVLS_MAX_ARITY`` (NVIDIA/nccl src/enqueue.cc; across nodes NVLS needs CollNet,
    which the model does not have). NCCL's own model prices an NVLS all-gather or
    reduce-scatter at under half the all-reduce's rate (``nvls_rate``), below a ring's on
    every preset, so NCCL picks it only where told to (``NCCL_ALGO``, a tuner plugin, the
    efficiency CTA policy on registered buffers): what it offers is its CTAs."""
    if nodes > 1 or n <= 1:
        return False
    return kind == "all-reduce" or (kind in ("all-gather", "reduce-scatter") and n <= NVLS_MAX_ARITY)


def nvls_tree_shape(kind: str, n: int, nodes: int) -> bool:
    """Whether NCCL can run NVLSTree for this collective where the system has NVLS: an
    all-reduce across nodes with at least 2 of its GPUs on each node (NCCL disables NVLSTree
    on one node, and NVLS needs 2 GPUs of the node: ``ncclNvlsInit``, src/transport/nvls.cc)."""
    return kind == "all-reduce" and nodes > 1 and n // nodes >= 2


def nvls_tree_ctas(hw: HardwareProfile, nodes: int) -> int:
    """CTAs of an NVLSTree collective (NVIDIA/nccl ``ncclNvlsTuning``, src/transport/nvls.cc,
    2.30): 16 on Hopper; on Blackwell 32 over 2 nodes and 24 over more (its tuning for NICs of
    48-96 GB/s, the 400 Gb/s every Blackwell preset has); NCCL_NVLS_NCHANNELS where pinned, then
    NCCL_MIN_CTAS / NCCL_MAX_CTAS; on buffers registered with NCCL (XLA's user buffers) fewer,
    ``nvls_registered_ctas`` across nodes (``ncclRegisterCollNvlsBuffers`` applies it to
    NVLSTree as to NVLS)."""
    env = hw.nccl_env
    own = env.nvls_ctas or (16 if hw.arch != "blackwell" else 32 if nodes <= 2 else 24)
    own = max(1, min(max(own, env.min_ctas), env.channel_cap, hw.sm_count))
    return min(nvls_registered_ctas(hw, "all-reduce", nodes), own) if env.user_buffers else own


def nvls_tree_busbw_gbps(hw: HardwareProfile, ppn: int, nodes: int, share: float = 1.0,
                         cfg: CostConfig = DEFAULT_COSTS) -> float:
    """NVLSTree's bus bandwidth (nccl-tests convention) with ``ppn`` GPUs on each node, as
    NCCL's model composes it (``ncclTopoTuneModel``): one NVLS head per GPU of the group on a
    node (at most ``NVLS_MAX_ARITY``), each moving the least of its NVLS share inside the node
    (NCCL's ``2 x efficiency x bwIntra x (h - 1) / h`` a head, which is the measured NVLS
    all-reduce of 8 GPUs, ``nvls_busbw_gbps``, over 7: the rate is measured on 8-GPU nodes and
    a head's does not fall in a larger NVLink domain), its share of the node's network
    (``net_busbw_gbps``, the network's measured ring rate: NCCL gives the ring and the heads the
    same ``bwInter`` per NIC), doubled over 2 nodes where each node's tree sends and receives its
    half at once, and NCCL's per-head cap (``per_head_nvls_tree``)."""
    heads = min(ppn, NVLS_MAX_ARITY)
    intra = hw.nvls_busbw_gbps * (heads - 1) / (min(hw.gpus_per_node, 8) - 1)
    net = hw.net_busbw_gbps * share * (2.0 if nodes <= 2 else 1.0)
    cap = heads * cfg.lookup(cfg.per_head_nvls_tree, hw.arch)[0 if nodes <= 2 else 1]
    return min(intra, net, cap)


def _algorithms(kind: str, n: int, nodes: int, hw: HardwareProfile) -> tuple[str, ...]:
    """The (algorithm, protocol) pairs NCCL may pick for this collective, in its scan
    order (Tree, Ring, NVLS, NVLSTree), under the cluster's NCCL settings; ValueError where
    those settings leave none (NCCL fails such a call: "no algorithm/protocol available")."""
    own = ["ring"]
    if kind == "all-reduce" and n > 2:
        own.insert(0, "tree")
    if hw.has_nvls and nvls_shape(kind, n, nodes):
        own.append("nvls")
    if hw.nvls_channels and nvls_tree_shape(kind, n, nodes):
        own.append("nvls_tree")
    pairs = tuple((a, p) for a in own if hw.nccl_env.allows_algorithm(a) for p in _protocols(hw, a))
    if not pairs:
        raise ValueError(f"{kind} over {n} GPUs: the NCCL settings {hw.nccl_env.describe()} leave it no "
                         f"algorithm and protocol NCCL can run ({', '.join(own)})")
    return pairs


def _default_threads(algorithm: str, protocol: str, hw: HardwareProfile) -> int:
    """NCCL's threads per CTA: 640 for tree, else the protocol's (NCCL_NTHREADS where pinned)."""
    return 640 if algorithm == "tree" else hw.nccl_env.threads(protocol, _DEFAULT_THREADS[protocol])


def _default_chunk(kind: str, algorithm: str, protocol: str, hw: HardwareProfile) -> int:
    if algorithm in ("nvls", "nvls_tree"):
        return _NVLS_CHUNK
    if protocol == "LL":
        return _LL_CHUNK
    if protocol == "LL128":
        return _LL128_CHUNK
    if algorithm == "ring" and kind in ("all-reduce", "all-gather", "reduce-scatter"):
        return hw.nccl_env.simple_chunk(_SIMPLE_RING_CHUNK, ring=True)
    if kind in ("all-to-all", "collective-permute") and hw.intra_link == "pcie":
        return 128 << 10  # NCCL_P2P_PCI_CHUNKSIZE
    return hw.nccl_env.simple_chunk(_SIMPLE_OTHER_CHUNK, ring=False)


@functools.lru_cache(maxsize=1 << 14)
def nccl_default_params(kind: str, nbytes: float, group_size: int, nodes: int,
                        hw: HardwareProfile, cfg: CostConfig = DEFAULT_COSTS, *, p2p_ranks: int = 0
                        ) -> CollectiveParams:
    """What NCCL itself would run: its symmetric kernel where the buffers are symmetric
    windows (``symmetric_pick``: NCCL 2.27-2.30 take it whenever one applies, before any
    algorithm is chosen); else algorithm/protocol by its minimum predicted time
    (scan order Tree, Ring x LL, LL128, Simple; strict <, so ties keep the earlier), then
    its channel count, reduced for small messages (``while nBytes < nc*nt*thr: nc--``,
    then threads halved; NCCL_MIN_CTAS does not stop it), and its default chunk size. A
    collective-permute inside a node is NCCL's point-to-point schedule (``p2p_ctas``) on
    the communicator it runs on (``p2p_communicator``). A ragged all-to-all runs XLA's
    one-shot kernel where it applies, else NCCL's all-to-all (``RAGGED``)."""
    if kind == RAGGED:
        if one_shot_applies(kind, group_size, nodes, hw):
            return one_shot_params(group_size)
        return nccl_default_params("all-to-all", nbytes, group_size, nodes, hw, cfg)
    if symmetric_applies(kind, group_size, nodes, hw):
        return symmetric_pick(kind, nbytes, group_size, hw)
    if kind == "collective-permute" and nodes == 1:
        return CollectiveParams("ring", "Simple", p2p_ctas(nbytes, p2p_communicator(group_size, hw, p2p_ranks), hw),
                                _default_chunk(kind, "ring", "Simple", hw), _default_threads("ring", "Simple", hw))
    if registered_nvls_applies(kind, group_size, nodes, hw):
        return CollectiveParams("nvls", "Simple", _init_channels("nvls", hw, kind), _NVLS_CHUNK,
                                _default_threads("nvls", "Simple", hw))
    best: tuple[float, CollectiveParams] | None = None
    for p, bus, bw, lat, factor in _pick_terms(kind, group_size, nodes, hw, cfg):
        # NCCL's own prediction ``lat + nBytes / algBw`` (no chunk terms), which it picks by.
        wire = nbytes * bus
        if factor is not None and nbytes / (p.nchannels * group_size) >= 64:
            lat *= factor
        t = lat + wire / (bw * _pick_correction(p.algorithm, p.protocol, nbytes, hw, cfg) * 1e3)
        if best is None or t < best[0]:
            best = (t, p)
    assert best is not None
    p = best[1]
    if p.algorithm in ("nvls", "nvls_tree"):
        return p
    thr = _per_thread(p, group_size)
    nc, nt = p.nchannels, p.nthreads
    while nbytes < nc * nt * thr:
        if nc > 1:
            nc -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    return dataclasses.replace(p, nchannels=nc, nthreads=nt)


@functools.lru_cache(maxsize=1 << 10)
def _pick_terms(kind: str, n: int, nodes: int, hw: HardwareProfile, cfg: CostConfig
                ) -> tuple[tuple[CollectiveParams, float, float, float, float | None], ...]:
    """The (algorithm, protocol) pairs NCCL scans for this collective (``_algorithms``, in its
    order) at its initial channels, with the terms of NCCL's own prediction that do not depend
    on the size: (params, bus bytes per nBytes, busBw, latency, its size-dependent factor).
    NCCL's pick is asked for at every collective size the search meets."""
    out = []
    for algo, proto in _algorithms(kind, n, nodes, hw):
        p = CollectiveParams(algo, proto, _init_channels(algo, hw, kind, nodes), _default_chunk(kind, algo, proto, hw),
                             _default_threads(algo, proto, hw))
        out.append((p, bus_factor(kind, algo, n), busbw_gbps(p, hw, nodes, cfg, net_share(hw, n, nodes), kind, n),
                    *_latency_parts(kind, n, nodes, p, hw, cfg)))
    return tuple(out)


def default_time_us(kind: str, nbytes: float, group_size: int, nodes: int, hw: HardwareProfile,
                    cfg: CostConfig = DEFAULT_COSTS, *, p2p_ranks: int = 0) -> float:
    """A collective's time alone under NCCL's own choice of parameters (``p2p_ranks``: the
    communicator a collective-permute runs on, ``nccl_default_params``)."""
    params = nccl_default_params(kind, nbytes, group_size, nodes, hw, cfg, p2p_ranks=p2p_ranks)
    return collective_time_us(kind, nbytes, group_size, nodes, params, hw, cfg)


# NCCL's point-to-point schedule (send/recv: XLA's collective-permute), NVIDIA/nccl
# src/enqueue.cc ``scheduleP2pTasksToPlan``, 2.22-2.30: each part of a send at least 64 KiB,
# and a part of more than 32 x NCCL_P2P_NVL_CHUNKSIZE (512 KiB) doubles the channels.
_P2P_MIN_PART = 64 << 10
_P2P_MAX_PART = 16 << 20


def p2p_communicator(group_size: int, hw: HardwareProfile, p2p_ranks: int = 0) -> int:
    """Ranks of the NCCL communicator a collective-permute's sends run on: ``p2p_ranks`` where
    the caller knows it (PyTorch's batched sends: their group's), else the one XLA builds, every
    partition of the step (``hw.num_gpus``), not the pair (``GetNcclP2PConfigForCollectivePermute``:
    "all execution instances together form one replica group", openxla/xla
    xla/service/gpu/runtime/nccl_collective_permute_thunk.cc)."""
    return max(group_size, p2p_ranks or hw.num_gpus)


def p2p_ctas(nbytes: float, ranks: int, hw: HardwareProfile) -> int:
    """CTAs NCCL runs one send/recv on inside a node: the communicator's point-to-point
    channels (its ring channels rounded up to a power of two, ``ncclTopoComputeP2pChannels``
    in src/graph/paths.cc: 32 on 8 H100 or B200) halved until they times the communicator's
    ranks fit in them, no more than the 64 KiB parts of the message, then doubled while a part
    would exceed 16 MiB. A ring shift over 8 GPUs runs 4 CTAs up to 64 MiB: openxla/xla PR
    #11182 measured a 25.2 MB collective-permute through NCCL at 445 us (57 GB/s, 4 CTAs of
    ~14 GB/s), where a copy-engine memcpy took 100 us. NCCL asks no tuner plugin about
    point-to-point, and NCCL_MIN/MAX_CTAS bound collectives, not these."""
    pool = 1 << max(hw.channels(1) - 1, 0).bit_length()
    nc = pool
    while nc > 1 and nc * ranks > pool:
        nc //= 2
    nc = max(1, min(nc, math.ceil(nbytes / _P2P_MIN_PART)))
    while nbytes / nc > _P2P_MAX_PART and nc < pool:
        nc *= 2
    return nc


def registered_nvls_applies(kind: str, n: int, nodes: int, hw: HardwareProfile) -> bool:
    """NCCL's efficiency CTA policy (``NCCL_CTA_POLICY=1``) on registered buffers (XLA's user
    buffers, which put both of a collective's buffers in its collective memory): all-gathers
    and reduce-scatters inside one node go to NVLS on its registered CTAs whatever its model
    says, unless NCCL_ALGO or NCCL_PROTO is set (NVIDIA/nccl src/enqueue.cc,
    ``ncclGetAlgoInfo``, NCCL 2.28-2.30)."""
    env = hw.nccl_env
    return (env.efficiency and env.user_buffers and not env.algorithms and not env.protocols
            and kind in ("all-gather", "reduce-scatter") and hw.has_nvls and nvls_shape(kind, n, nodes))


def _init_channels(algorithm: str, hw: HardwareProfile, kind: str = "all-reduce", nodes: int = 1) -> int:
    """CTAs NCCL's communicator over ``nodes`` gives ``algorithm``: nvlsCTAs for NVLS
    (NCCL_NVLS_NCHANNELS where pinned; fewer on registered buffers, ``nvls_registered_ctas``)
    and NVLSTree (``nvls_tree_ctas``), else the
    communicator's channels (``hw.channels(nodes)``: its NICs' across nodes), both
    inside the user's CTA pins and XLA's maxCTAs (``NcclEnv.ctas``)."""
    if algorithm == "nvls_tree":
        return nvls_tree_ctas(hw, nodes)
    env = hw.nccl_env
    ctas = min(env.ctas(hw.channels(nodes)), hw.sm_count)
    if algorithm != "nvls":
        return ctas
    if env.user_buffers:
        return min(nvls_registered_ctas(hw, kind), ctas)
    # NCCL_MIN_CTAS raises NVLS's CTAs as it raises the communicator's (ncclNvlsTuning).
    return min(max(env.nvls_ctas or hw.nvls_channels, env.min_ctas), ctas)


def nvls_registered_ctas(hw: HardwareProfile, kind: str = "all-reduce", nodes: int = 1) -> int:
    """CTAs of an NVLS collective on buffers registered with NCCL (XLA's
    ``--xla_gpu_enable_nccl_user_buffers``: ``ncclCommRegister``): with no copy through
    NCCL's own buffers it needs fewer, ``ceil(factor / heads)`` with one head per GPU of the
    node (NVIDIA/nccl ``src/transport/nvls.cc``, ``ncclNvlsRegResourcesQuery``, 2.27-2.30). In
    one node factor 32 (all-reduce on Hopper, all-gather), 64 (all-reduce on Blackwell), 40 and
    48 (reduce-scatter on Hopper and Blackwell): an all-reduce 4 and 8 on 8 GPUs, where
    unregistered NVLS runs 16 and 24. Across nodes (NVLSTree's all-reduce) 48 on Hopper and 56
    on Blackwell: 6 and 7 on 8 GPUs. It reaches the same bandwidth on them (the copies are what
    it drops)."""
    blackwell = hw.arch == "blackwell"
    if nodes > 1:
        factor = 56 if blackwell else 48
    else:
        factor = {"all-reduce": 64 if blackwell else 32, "all-gather": 32,
                  "reduce-scatter": 48 if blackwell else 40}.get(kind, 32)
    heads = min(hw.gpus_per_node, NVLS_MAX_ARITY)
    return max(1, min(math.ceil(factor / heads), hw.nvls_channels))


# NCCL's symmetric-memory kernels (NCCL 2.27+; NVIDIA/nccl ``src/symmetric.cc`` in 2.27,
# ``src/sym_kernels.cc`` from 2.28, the same constants through 2.30.7). They run where XLA
# registers a collective's buffers as symmetric windows
# (``--xla_gpu_experimental_enable_nccl_symmetric_buffers``: ``ncclCommWindowRegister`` with
# NCCL_WIN_COLL_SYMMETRIC on its collective memory), inside one NVLink domain of direct
# NVLink peers, for all-gather and for sum all-reduce/reduce-scatter on floats; NCCL 2.27-2.30
# then take them whenever one applies, consulting no tuner (the source: "just always use
# symmetric if available"). NCCL's own model of them (``queryModel``):
#     bw = softmin(CTAs x smBw x busMul, peakBw, smBw);  t = baseLat + softplus(busBytes / bw - 1)
# with ``softmin(x, c, s) = c - s log1p((e^(c/s) - 1) e^(-x/s))``, ``softplus(x) = log1p(e^x)``;
# CTAs: the fewest within 2.5% of the time at the kernel's cap, and among kernels the least
# ``t (1 + 0.025 CTAs)`` (``ncclSymPickKernel``'s SM penalty). Multicast ("MC") kernels need
# NVLS and more than 2 GPUs and are capped at ceil(16 / n) CTAs on Hopper, ceil(32 / n) on
# Blackwell: 2 and 4 on 8 GPUs, where a ring holds 24 and NVLS 16-24. That is what they
# change for the compute beside them: a handful of SMs held instead of tens.
# NCCL picks the kernel and CTAs by that model; the time priced is the model's, but never a
# transfer faster than NCCL's regular kernels measured at that size on the same NVLink (the
# transfer part of the anchored default, ``_measured_transfer_us``): no measurement of
# these kernels was found, and NCCL's 480 GiB/s multicast all-reduce peak would be 1.7x
# the measured NVLS all-reduce. So they win where NCCL's model says they win by latency
# (up to ~9x below 1 MiB, NCCL 2.27's release notes and NVIDIA's blog) and by the SMs they
# leave to compute, not by a bandwidth nobody measured.
SYMMETRIC_KINDS = ("all-reduce", "all-gather", "reduce-scatter")
_GIB_PER_US = (1 << 30) / 1e6  # NCCL's "GBps" unit in bytes per us
# (kind, NCCL's kernel name, an LL kernel, a multicast kernel): their bus bytes, busMul and
# latency follow in ``_symmetric_times``.
_SYMMETRIC_KERNELS = (
    ("all-reduce", "AGxLL_R", True, False), ("all-reduce", "AGxLLMC_R", True, True),
    ("all-reduce", "RSxLD_AGxST", False, False), ("all-reduce", "RSxLDMC_AGxSTMC", False, True),
    ("all-gather", "LL", True, False), ("all-gather", "LLMC", True, True),
    ("all-gather", "ST", False, False), ("all-gather", "STMC", False, True),
    ("reduce-scatter", "LL", True, False), ("reduce-scatter", "LLMC", True, True),
    ("reduce-scatter", "LD", False, False), ("reduce-scatter", "LDMC", False, True),
)
_SYM_MAX_CTAS = 64  # ncclSymMaxBlocks
_LL_BUS_FACTOR = 9  # LL_BusFactor: an LL line carries 8 data bytes in 16, read back by every rank


def symmetric_applies(kind: str, n: int, nodes: int, hw: HardwareProfile) -> bool:
    """Whether NCCL runs this collective with a symmetric kernel: XLA's symmetric buffers,
    one of its kinds, more than one GPU, inside one NVLink domain of Hopper or newer (NCCL's
    ``symmetricSupport``: all direct NVLink peers, one node, CUDA VMM memory), unless the
    zero-CTA policy gives it to the copy engines (priced at NCCL's regular time, no SM)."""
    return (hw.nccl_env.symmetric_buffers and kind in SYMMETRIC_KINDS and n > 1 and nodes <= 1
            and hw.intra_link == "nvlink" and hw.arch in ("hopper", "blackwell")
            and not hw.nccl_env.copy_engine(kind, nodes))  # the zero-CTA policy's copy engines instead


def _multicast(hw: HardwareProfile) -> bool:
    return hw.nvls_channels > 0 and hw.nccl_env.nvls


def _symmetric_cap_gbps(kind: str, hw: HardwareProfile) -> float:
    """The busBw (nccl-tests convention) a symmetric kernel reaches at most on ``hw``."""
    return hw.nvls_busbw_gbps if kind == "all-reduce" and _multicast(hw) else hw.intra_busbw_gbps


@functools.lru_cache(maxsize=1 << 14)
def _symmetric_times(kind: str, nbytes: float, n: int, hw: HardwareProfile, protocol: str = "",
                     ctas: int = 0) -> tuple[tuple[str, int, float], ...]:
    """(kernel, CTAs, time us without launch) of every symmetric kernel NCCL may pick for
    this collective (``protocol`` "LL"/"Simple": only that family; ``ctas``: at that count,
    each kernel's cap applied), at NCCL's CTA choice otherwise."""
    blackwell = hw.arch == "blackwell"
    per_rank = nbytes if kind == "all-reduce" else nbytes / n  # NCCL's nBytes of the call
    bus_bytes = nbytes if kind == "all-reduce" else n * per_rank
    sm_bw = 55.0 if blackwell else (65.0 if kind == "all-reduce" else 44.0)
    measured = _measured_transfer_us(kind, nbytes, n, hw)
    nmax_user = hw.nccl_env.channel_cap
    out = []
    for k, name, ll, mc in _SYMMETRIC_KERNELS:
        if k != kind or (protocol and (protocol == "LL") != ll):
            continue
        if mc and not (_multicast(hw) and n > 2):
            continue
        if ll and bus_bytes >= 2 << 30:  # NCCL drops LL kernels from 2 GiB of bus bytes
            continue
        if ll:
            moved, mul = n * per_rank * _LL_BUS_FACTOR, 1.1 if mc else 1.0
            lat = (8.5 if kind == "all-gather" else 11.0) if blackwell else 4.5
        else:
            if kind == "all-reduce":
                moved = nbytes / n + nbytes if mc else 2 * nbytes * (n - 1) / n
            else:
                moved = (n - 1) * per_rank
            mul = (n if kind == "all-reduce" else 0.55 * n) if mc else 1.0
            lat = (19.5 if kind == "all-reduce" else 13.0) if blackwell else 7.8
        peak = (1000.0 if blackwell else 480.0) if (mc and not ll and kind == "all-reduce") else (
            600.0 if blackwell else 320.0)
        cap = math.ceil((32 if blackwell else 16) / n) if mc else _SYM_MAX_CTAS
        nmax = max(1, min(cap, nmax_user))

        def model(c: int) -> float:  # NCCL's queryModel
            return lat + _softplus(moved / (_softmin(c * sm_bw * mul, peak, sm_bw) * _GIB_PER_US) - 1.0)

        if ctas:
            c = min(ctas, nmax)
        else:
            best = model(nmax)
            c = next((c for c in range(max(1, hw.nccl_env.min_ctas), nmax) if model(c) <= 1.025 * best), nmax)
        out.append((name, c, max(model(c), lat + measured)))
    return tuple(out)


def _measured_transfer_us(kind: str, nbytes: float, n: int, hw: HardwareProfile,
                          cfg: CostConfig = DEFAULT_COSTS) -> float:
    """The transfer part (no launch, no latency) of NCCL's regular default for this
    collective inside one node, anchored to the measured tables as its time is."""
    regular = dataclasses.replace(hw, nccl_env=dataclasses.replace(hw.nccl_env, symmetric_buffers=False,
                                                                   zero_cta=False))
    p = nccl_default_params(kind, nbytes, n, 1, regular, cfg)
    transfer = (_default_model_us(kind, nbytes, n, 1, regular, cfg) - regular.launch_us
                - latency_us(kind, nbytes, n, 1, p, regular, cfg))
    return max(transfer, 0.0) * measured_ratio(kind, nbytes, n, 1, regular, cfg)


def _softmin(x: float, c: float, s: float) -> float:
    return c - s * math.log1p((math.exp(min(c / s, 700.0)) - 1.0) * math.exp(-x / s))


def _softplus(x: float) -> float:
    return x if x >= 100.0 else math.log1p(math.exp(x))


@functools.lru_cache(maxsize=1 << 14)
def symmetric_pick(kind: str, nbytes: float, n: int, hw: HardwareProfile) -> CollectiveParams:
    """The symmetric kernel and CTAs NCCL runs for this collective (``ncclSymPickKernel``:
    the least time x (1 + 0.025 CTAs)), as CollectiveParams (protocol LL for its LL kernels)."""
    times = _symmetric_times(kind, nbytes, n, hw)
    if not times:
        raise ValueError(f"{kind} of {nbytes:.0f} B over {n} GPUs: no symmetric kernel applies")
    name, ctas, _t = min(times, key=lambda x: x[2] * (1 + 0.025 * x[1]))
    ll = any(k == kind and nm == name and isll for k, nm, isll, _mc in _SYMMETRIC_KERNELS)
    return CollectiveParams("symmetric", "LL" if ll else "Simple", ctas, _NVLS_CHUNK, 512)


# XLA's ragged all-to-all (a dropless MoE's exchange, ``jax.lax.ragged_all_to_all``), whose
# shape carries this kind (``graph.collective_shape``). XLA runs it one of two ways (openxla/xla
# xla/backends/gpu/runtime/ragged_all_to_all_thunk.cc, ``RaggedAllToAllStartThunk::RunCollective``):
# * its one-shot kernel, where ``--xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel`` is
#   on (the default), every GPU of the group is local to one process (``is_local``), the peers
#   reach each other's memory and there are at most 8 (``kMaxNumRaggedAllToAllOutputPtrs``): a
#   rendezvous, one kernel that writes each peer's rows straight into its output buffer, and
#   another rendezvous; no NCCL call. The kernel (``RunRaggedAllToAllKernel``, ragged_all_to_all.cc)
#   runs a grid of one 128-thread block per peer for JAX's exchange (one update per peer), so each
#   peer's block moves at one CTA's store rate, every peer at once: ``ragged_one_shot_gbps``,
#   measured; a call takes the time of one peer's block (its bytes over the group).
# * otherwise NCCL's grouped sends and receives: priced as NCCL's all-to-all of those bytes at
#   NCCL's own choice, a point-to-point call no tuner plugin is asked about.
ONE_SHOT_MAX_PEERS = 8
# Rendezvous before and after the kernel: each priced as one launch (no measurement of them alone).
_ONE_SHOT_LAUNCHES = 3


def one_shot_applies(kind: str, n: int, nodes: int, hw: HardwareProfile) -> bool:
    """Whether XLA runs this collective with its one-shot ragged all-to-all kernel, as the
    model prices it: a ragged all-to-all of 2-8 GPUs of one host (taken as the group's GPUs
    sitting on one host when it fits one), the flag on, and a measured rate for this GPU
    (none: priced as NCCL's all-to-all, the gap docs/moe.md names)."""
    return (kind == RAGGED and hw.nccl_env.ragged_one_shot and hw.ragged_one_shot_gbps > 0
            and nodes <= 1 and 1 < n <= min(ONE_SHOT_MAX_PEERS, hw.gpus_per_host))


def one_shot_params(n: int) -> CollectiveParams:
    """XLA's one-shot kernel as CollectiveParams: one 128-thread CTA a peer."""
    return CollectiveParams("one_shot", "Simple", n, _NVLS_CHUNK, 128)


def one_shot_time_us(nbytes: float, n: int, hw: HardwareProfile) -> float:
    """One call of XLA's one-shot ragged all-to-all moving ``nbytes`` from each GPU to its ``n``
    peers, balanced: each peer's block (``nbytes / n``) at ``ragged_one_shot_gbps``, all at once."""
    return _ONE_SHOT_LAUNCHES * hw.launch_us + nbytes / n / (hw.ragged_one_shot_gbps * 1e3)


_CHANNEL_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def candidate_params(kind: str, nbytes: float, group_size: int, nodes: int,
                     hw: HardwareProfile, cfg: CostConfig = DEFAULT_COSTS) -> tuple[CollectiveParams, ...]:
    """The search space for one collective, sorted: every (algorithm, protocol) NCCL
    allows here x a channel ladder (plus NCCL's count) up to the SMs available; for
    Simple also a quarter-size chunk and half the threads. Always includes NCCL's pick.
    """
    default = nccl_default_params(kind, nbytes, group_size, nodes, hw, cfg)
    # NCCL asks no tuner about its symmetric kernels or about point-to-point (an all-to-all, a
    # permute, a ragged all-to-all's grouped sends, or XLA's own kernel): its pick is the only choice.
    if default.algorithm == "symmetric" or kind in POINT_TO_POINT_KINDS:
        return (default,)
    fixed = _size_free_candidates(kind, group_size, nodes, hw)
    i = bisect.bisect_left(fixed, default)
    if i < len(fixed) and fixed[i] == default:
        return fixed
    return fixed[:i] + (default,) + fixed[i:]


@functools.lru_cache(maxsize=1 << 10)
def _size_free_candidates(kind: str, group_size: int, nodes: int, hw: HardwareProfile
                          ) -> tuple[CollectiveParams, ...]:
    """``candidate_params`` without NCCL's pick, the only member that depends on the size
    (sorting ~60 ordered dataclasses per collective size cost more than timing them).
    NVLS and NVLSTree run their communicator's CTAs whatever a call asks (NCCL), so each has
    one member."""
    # At most the communicator's CTAs: NCCL caps a tuner plugin's channels at them
    # (``nChannels <= comm->nChannels``), so more need NCCL_MIN_CTAS (``nccl_settings``); and,
    # where NCCL_NTHREADS is pinned, at its threads (no plugin sets threads per call).
    max_nc = min(MAX_CHANNELS, hw.sm_count - 1, _init_channels("ring", hw, kind, nodes))
    ladder = sorted({c for c in _CHANNEL_LADDER if c <= max_nc} | {max_nc})
    out = set()
    for algo, proto in _algorithms(kind, group_size, nodes, hw):
        chunk = _default_chunk(kind, algo, proto, hw)
        nt = _default_threads(algo, proto, hw)
        if algo in ("nvls", "nvls_tree"):
            out.add(CollectiveParams(algo, proto, _init_channels(algo, hw, kind, nodes), chunk, nt))
            continue
        for nc in ladder:
            out.add(CollectiveParams(algo, proto, nc, chunk, nt))
            if proto == "Simple":
                out.add(CollectiveParams(algo, proto, nc, chunk // 4, nt))
                if not hw.nccl_env.nthreads:
                    out.add(CollectiveParams(algo, proto, nc, chunk, nt // 2 // 64 * 64))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=1 << 12)
def candidate_times(kind: str, nbytes: float, group_size: int, nodes: int, hw: HardwareProfile,
                    cfg: CostConfig = DEFAULT_COSTS) -> tuple[tuple[CollectiveParams, float], ...]:
    """Every ``candidate_params`` entry with its ``collective_time_us``, in the same order:
    the one tabulation per collective size that the overlap bound and the search share."""
    cands = candidate_params(kind, nbytes, group_size, nodes, hw, cfg)
    if group_size <= 1 or len(cands) == 1:  # NCCL's (or XLA's) own kernel only: symmetric or point-to-point
        return tuple((p, collective_time_us(kind, nbytes, group_size, nodes, p, hw, cfg)) for p in cands)
    # The size-free candidates are timed from their tabulated terms (no cache lookup per
    # candidate); NCCL's pick, when it is not one of them, through collective_time_us.
    ratio = measured_ratio(kind, nbytes, group_size, nodes, hw, cfg)
    fixed, columns = _size_free_columns(kind, group_size, nodes, hw, cfg)
    _check_args(kind, nbytes, group_size, nodes, fixed[0], hw)  # the size's checks; the params are valid here
    out = list(zip(fixed, (_times_from_columns(nbytes, group_size, columns, hw, cfg) * ratio).tolist()))
    if len(out) < len(cands):
        i = next((i for i, (p, _) in enumerate(out) if p != cands[i]), len(out))
        out.insert(i, (cands[i], collective_time_us(kind, nbytes, group_size, nodes, cands[i], hw, cfg)))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 10)
def _size_free_columns(kind: str, group_size: int, nodes: int, hw: HardwareProfile, cfg: CostConfig
                       ) -> tuple[tuple[CollectiveParams, ...], dict[str, np.ndarray]]:
    """The size-free candidates of one (kind, group) and their ``_size_free_terms`` as
    columns, one entry per candidate, for ``_times_from_columns``."""
    fixed = _size_free_candidates(kind, group_size, nodes, hw)
    terms = [_size_free_terms(kind, group_size, nodes, p, hw, cfg) for p in fixed]
    bus, bw, one_ch, hop, steps, lat, factor = (np.array(c, dtype=float) for c in zip(
        *((*t[:6], math.nan if t[6] is None else t[6]) for t in terms)))
    first, idle = (np.array(c, dtype=float) for c in zip(
        *(_first_share(group_size, p, t[0], cfg) for p, t in zip(fixed, terms))))
    return fixed, dict(bus=bus, bw=bw, one_ch=one_ch, hop=hop, steps=steps, lat=lat, factor=factor,
                       nc=np.array([p.nchannels for p in fixed], dtype=float),
                       chunk=np.array([p.chunk_bytes for p in fixed], dtype=float),
                       first=first, idle=idle,
                       tree=np.array([p.algorithm in _CORRECTED for p in fixed]),
                       correction=np.array([_correction_row(p.algorithm, p.protocol, cfg) for p in fixed], dtype=float))


def _times_from_columns(nbytes: float, n: int, c: dict[str, np.ndarray], hw: HardwareProfile, cfg: CostConfig
                        ) -> np.ndarray:
    """``_time_from_terms`` of every size-free candidate at once, in the same operations
    and order (so the same floats): a search tabulates thousands of collective sizes."""
    nc = c["nc"]
    lat = np.where(~np.isnan(c["factor"]) & (nbytes / (nc * n) >= 64), c["lat"] * c["factor"], c["lat"])
    wire = nbytes * c["bus"]
    one_ch = c["one_ch"]
    share = np.maximum(np.minimum(wire, c["first"]), wire / nc)
    chunks = np.ceil(share / c["chunk"])
    fill = np.minimum(c["chunk"], share / c["steps"]) / one_ch
    f = 1.0
    if nbytes >= 64 and c["tree"].any():
        i, frac = _correction_point(nbytes, cfg)
        f = np.where(c["tree"], c["correction"][:, i] * (1 - frac) + c["correction"][:, i + 1] * frac, 1.0)
    transfer = np.maximum(np.maximum(wire / (c["bw"] * f), np.minimum(wire, c["first"]) / one_ch + c["idle"]),
                          wire / (nc * one_ch * f))
    return hw.launch_us + lat + transfer + chunks * c["hop"] * cfg.chunk_sync_fraction + fill


@functools.lru_cache(maxsize=1 << 14)
def fastest_time_us(kind: str, nbytes: float, group_size: int, nodes: int, hw: HardwareProfile,
                    cfg: CostConfig = DEFAULT_COSTS) -> float:
    """The collective's time alone at its fastest candidate (for the overlap bound)."""
    return min(t for _, t in candidate_times(kind, nbytes, group_size, nodes, hw, cfg))


def compute_time_us(flops: float, nbytes: float, hw: HardwareProfile, *,
                    sms_taken: float = 0.0, hbm_gbps_taken: float = 0.0,
                    gemm: tuple[int, ...] = (), itemsize: int = 2, attention: bool = False,
                    kernel: str = "", cfg: CostConfig = DEFAULT_COSTS) -> float:
    """Time of one compute kernel on the SMs and HBM bandwidth left over.

    A kernel that runs a matmul (``gemm`` = (batch, m, n, k)) is timed by its shape
    (`kernels.gemm_time_us`: waves of tiles on the SMs left), and by its bytes where its
    other operands make it memory-bound; any other kernel by the roofline of its FLOPs
    and bytes. Matmul throughput scales with the SMs left (a channel's CTA holds its SM
    for the collective's whole duration); bandwidth is what the collectives leave, but
    never below ``min_hbm_share`` of the achieved rate. A library kernel with its own
    measured rate (``kernel``: cuDNN attention, fp8 matmuls; `kernels.kernel_tflops`) runs
    at that rate instead of the BF16 matmul rate. A matmul of several waves that loses whole
    SMs runs at least ``cfg.held_sm_tail_waves`` waves more than on every SM.
    """
    if flops < 0 or nbytes < 0:
        raise ValueError(f"flops and bytes must be >= 0, got flops={flops}, bytes={nbytes}")
    if kernel == custom_calls.FUSED_PART:
        return 0.0  # done inside a fused kernel timed by its matmuls
    sm_left = max(hw.sm_count - sms_taken, 1.0) / hw.sm_count
    hbm = max(hw.achieved_hbm_gbps - hbm_gbps_taken, cfg.min_hbm_share * hw.achieved_hbm_gbps)
    memory = hw.launch_us + nbytes / (hbm * 1e3)
    pressure = 1.0
    if hbm_gbps_taken > 0 and cfg.hbm_pressure_exponent:
        pressure = (hbm / hw.achieved_hbm_gbps) ** -cfg.hbm_pressure_exponent
    own_rate = kernels.kernel_tflops(kernel, hw) if kernel else None
    if kernel == custom_calls.GROUPED_GEMM and len(gemm) == 4:
        # (groups, rows of the busiest group, N, K); the rest of the rows share the others.
        groups, busiest, n, k = gemm
        total = max(int(round(flops / (2.0 * n * k))), 1)
        imbalance = min(float(groups), max(1.0, busiest * groups / total))
        rows = kernels.balanced_groups(total, groups, imbalance)
        # The grouped kernel this GPU runs (models.grouped_gemm): its measured rate.
        own = kernels.grouped_gemm_time_us(rows, n, k, hw, itemsize=itemsize,
                                           efficiency=kernels.grouped_efficiency(rows, hw)) / sm_left * pressure
        return max(own, memory)
    if gemm:
        batch, m, n, k = gemm
        shape = dict(batch=batch, itemsize=itemsize, sm_fraction=sm_left, tflops=own_rate)
        own = kernels.gemm_time_us(m, n, k, hw, **shape, hbm_gbps=hbm)
        if sms_taken > 0 and cfg.held_sm_tail_waves and hw.resident_sm_share(True) >= 1.0:
            # At least ``held_sm_tail_waves`` more than on every SM, whatever the SMs left.
            waves = kernels.gemm_waves(m, n, k, hw, batch=batch)
            if waves > 1:
                full = kernels.gemm_time_us(m, n, k, hw, **{**shape, "sm_fraction": 1.0}, hbm_gbps=hbm)
                own = max(own, full * (1.0 + cfg.held_sm_tail_waves / waves))
        if pressure == 1.0:
            return max(own, memory)
        return max(kernels.gemm_time_us(m, n, k, hw, **shape) * pressure, own, memory)
    rate = own_rate or (hw.attention_tflops if attention and hw.attention_tflops else hw.achieved_tflops)
    return max(hw.launch_us + flops / (rate * 1e6 * sm_left) * pressure, memory)


def cta_waves(gemm: tuple[int, ...], hw: HardwareProfile) -> int:
    """Waves of CTAs a compute kernel runs on all SMs, for the rule that a high-priority
    collective takes its SMs at the next wave (``simulate``). A matmul on Hopper or
    Blackwell is one wave: cuBLAS's sm90+ GEMMs are persistent, one CTA per SM looping over
    tiles (the H100 order probe's 8192^3 GEMM held every SM for the whole kernel). Another
    matmul runs ``ceil(tiles / SMs)`` waves of its best tile (``kernels.DEFAULT_GEMM``). 0:
    a kernel of many short CTAs, whose SMs free continuously (elementwise, reductions)."""
    if not gemm:
        return 0
    if hw.arch in ("hopper", "blackwell"):
        return 1
    batch, m, n, _k = gemm
    tm, tn, _rate = kernels.DEFAULT_GEMM.tiles[0]
    return max(1, math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn) / hw.sm_count))


def comm_resource_use(params: CollectiveParams, hw: HardwareProfile, *, nodes: int = 1,
                      cfg: CostConfig = DEFAULT_COSTS, kind: str = "", bus_gbps: float | None = None
                      ) -> tuple[float, float]:
    """(SMs, HBM GB/s) a running ``kind`` collective takes from compute.

    SMs: the hardware's ``sm_share_per_channel`` per channel, none where the cluster's NCCL
    settings hand the collective to the copy engines (``NcclEnv.copy_engine``). HBM:
    ``hbm_bytes_per_bus_byte`` (NVLS: ``nvls_hbm_bytes_per_bus_byte``) per bus byte, times
    the protocol's wire bytes per data byte (``protocol_wire_bytes``), at
    ``bus_gbps``, the rate its bus bytes move (default: the bus bandwidth of ``params``,
    what a bandwidth-bound collective moves; ``collective_resource_use`` gives the rate of
    one collective), wherever it runs.
    """
    sms, peak, per_bus_byte = _resource_terms(params, hw, nodes, cfg, kind)
    return sms, (peak if bus_gbps is None else min(bus_gbps, peak)) * per_bus_byte


@functools.lru_cache(maxsize=1 << 12)
def _resource_terms(params: CollectiveParams, hw: HardwareProfile, nodes: int, cfg: CostConfig, kind: str
                    ) -> tuple[float, float, float]:
    """(SMs held, peak bus GB/s, HBM bytes per bus byte) of ``comm_resource_use``: the same
    few params come back for every collective size the search prices."""
    sms = 0.0 if hw.nccl_env.copy_engine(kind, nodes) else params.nchannels * hw.sm_share_per_channel
    if params.algorithm == "one_shot":  # one CTA a peer, each moving its block at the measured rate
        return sms, params.nchannels * hw.ragged_one_shot_gbps, cfg.hbm_bytes_per_bus_byte
    multicast = params.algorithm in ("nvls", "nvls_tree") or (params.algorithm == "symmetric" and _multicast(hw))
    per_bus_byte = cfg.nvls_hbm_bytes_per_bus_byte if multicast else cfg.hbm_bytes_per_bus_byte
    per_bus_byte *= cfg.protocol_wire_bytes[PROTOCOL_INDEX[params.protocol]]
    if params.algorithm == "symmetric":
        return sms, _symmetric_cap_gbps(kind, hw), per_bus_byte
    return sms, busbw_gbps(params, hw, nodes, cfg, kind=kind or "all-reduce"), per_bus_byte


def collective_resource_use(kind: str, nbytes: float, group_size: int, nodes: int, params: CollectiveParams,
                            hw: HardwareProfile, cfg: CostConfig = DEFAULT_COSTS,
                            time_us: float | None = None) -> tuple[float, float]:
    """(SMs, HBM GB/s) one collective takes from compute while it runs: its CTAs for its
    whole duration, and HBM at the rate its bus bytes really move over that duration
    (bus bytes / its time, ``time_us`` when the caller has it), not the link's peak: a
    latency-bound collective holds its CTAs but moves few bytes."""
    if time_us is None:
        time_us = collective_time_us(kind, nbytes, group_size, nodes, params, hw, cfg)
    if kind == RAGGED and params.algorithm != "one_shot":
        kind = "all-to-all"  # NCCL's sends and receives
    rate = nbytes * bus_factor(kind, params.algorithm, group_size) / max(time_us, 1e-9) / 1e3
    return comm_resource_use(params, hw, nodes=nodes, cfg=cfg, kind=kind, bus_gbps=rate)


@functools.lru_cache(maxsize=1 << 12)
def candidate_resources(kind: str, nbytes: float, group_size: int, nodes: int, hw: HardwareProfile,
                        cfg: CostConfig = DEFAULT_COSTS) -> tuple[tuple[CollectiveParams, float, float, float], ...]:
    """Every ``candidate_times`` entry with the resources it holds: (params, time alone us,
    SMs, HBM GB/s), as ``collective_time_us`` and ``collective_resource_use`` give them (the
    same floats), in one pass: the search's Pareto front is cut from this table, and the
    simulator reads the candidates it replays from it, once per collective size."""
    cands = candidate_times(kind, nbytes, group_size, nodes, hw, cfg)
    priced_as = "all-to-all" if kind == RAGGED and cands[0][0].algorithm != "one_shot" else kind

    def row(p: CollectiveParams, time_us: float) -> tuple[CollectiveParams, float, float, float]:
        sms, peak, per_bus_byte = _resource_terms(p, hw, nodes, cfg, priced_as)
        rate = nbytes * bus_factor(priced_as, p.algorithm, group_size) / max(time_us, 1e-9) / 1e3
        return p, time_us, sms, min(rate, peak) * per_bus_byte

    if group_size <= 1 or len(cands) == 1:  # NCCL's own kernel only: symmetric or point-to-point
        return tuple(row(p, t) for p, t in cands)
    # The size-free candidates as columns, in ``row``'s operations; NCCL's pick, where it is
    # not one of them, by ``row``.
    fixed, (sms, peak, per_bus_byte, bus) = _size_free_resources(kind, group_size, nodes, hw, cfg)
    extra = len(cands) > len(fixed)
    i = next((i for i, (p, _) in enumerate(cands[:len(fixed)]) if p != fixed[i]), len(fixed)) if extra else 0
    times = np.array([t for j, (_, t) in enumerate(cands) if not (extra and j == i)], dtype=float)
    rate = nbytes * bus / np.maximum(times, 1e-9) / 1e3
    out = list(zip(fixed, times.tolist(), sms.tolist(), (np.minimum(rate, peak) * per_bus_byte).tolist()))
    if extra:
        out.insert(i, row(*cands[i]))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 10)
def _size_free_resources(kind: str, group_size: int, nodes: int, hw: HardwareProfile, cfg: CostConfig
                         ) -> tuple[tuple[CollectiveParams, ...], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The size-free candidates and, as columns, their ``_resource_terms`` (SMs, peak bus GB/s,
    HBM bytes per bus byte) and bus bytes per nBytes."""
    fixed = _size_free_candidates(kind, group_size, nodes, hw)
    terms = [(*_resource_terms(p, hw, nodes, cfg, kind), bus_factor(kind, p.algorithm, group_size)) for p in fixed]
    return fixed, tuple(np.array(c, dtype=float) for c in zip(*terms))  # type: ignore[return-value]


class ResourceTracker:
    """SMs and HBM bandwidth held by the collectives running now.

    The simulator acquires a collective's use when it starts and releases it when it
    ends; compute asks for its slowdown factor under the current holdings.
    """

    __slots__ = ("hw", "sms", "hbm")

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw
        self.sms = 0.0
        self.hbm = 0.0

    def acquire(self, use: tuple[float, float]) -> None:
        self.sms += use[0]
        self.hbm += use[1]

    def release(self, use: tuple[float, float]) -> None:
        sms, hbm = self.sms - use[0], self.hbm - use[1]  # never below zero (float rounding)
        self.sms = sms if sms > 0.0 else 0.0
        self.hbm = hbm if hbm > 0.0 else 0.0

    @property
    def idle(self) -> bool:
        return self.sms <= 0.0 and self.hbm <= 0.0

    def compute_time_us(self, flops: float, nbytes: float, gemm: tuple[int, ...] = (),
                        itemsize: int = 2, attention: bool = False, kernel: str = "") -> float:
        return compute_time_us(flops, nbytes, self.hw, sms_taken=self.sms, hbm_gbps_taken=self.hbm,
                               gemm=gemm, itemsize=itemsize, attention=attention, kernel=kernel)


def clear_caches() -> None:
    """Forget every table this module cached (its ``lru_cache`` functions): a search timed
    after this pays for tabulating its collectives, as a first search in a process does."""
    for value in list(globals().values()):
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()
    _FLOORS.clear()
