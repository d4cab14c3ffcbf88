"""Hardware profiles: the numbers the cost model needs about one GPU cluster.

A ``HardwareProfile`` is a frozen value: the GPU (SMs, achieved matmul rate, achieved
HBM bandwidth), the link inside a node (NVLink or PCIe) and the network between nodes,
each expressed the way the cost model uses it (ring bus bandwidth at saturation, bus
bandwidth one NCCL channel can drive), plus NCCL's default channel count on that box.

Every number in ``PRESETS`` cites its public source: NCCL's tuning model (NVIDIA/nccl
``src/graph/tuning.cc``, ``search.cc``, ``connect.cc``), published nccl-tests results
(issues of NVIDIA/nccl and NVIDIA/nccl-tests, Azure/AI-benchmarking-guide), NVIDIA
datasheets, and the Lagom (arXiv 2602.20656) and AutoCCL (NSDI'25) papers.
Where no measurement was published the derivation is stated. Besides the single-node
DGX/HGX boxes there are the Google Cloud nodes Llama/Mixtral-class JAX jobs run on (``a3``,
``a3-mega``, ``a3-ultra``, ``a4``): the same GPUs and NVSwitch, with the cloud's network.

This module is on the ground floor: it imports nothing from the project.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Literal

from lagom_jax import hashing
from lagom_jax.cluster import collective_tables
from lagom_jax.cluster.nccl_env import NcclEnv

Arch = Literal["volta", "ampere", "hopper", "blackwell"]
LinkKind = Literal["nvlink", "pcie"]
# In NCCL's order of compute capabilities (src/graph/tuning.cc: Volta, Ampere, Hopper,
# Blackwell; sm_100 and newer is Blackwell).
ARCHS: tuple[str, ...] = ("volta", "ampere", "hopper", "blackwell")
# XLA's command types (DebugOptions.CommandBufferCmdType) and the set it captures by default
# (``DefaultDebugOptionsIgnoringFlags``, openxla/xla xla/debug_options_flags.cc).
COMMAND_TYPES: tuple[str, ...] = ("FUSION", "CUBLAS", "CUBLASLT", "CUDNN", "CUSTOM_CALL", "COLLECTIVES", "CONDITIONAL",
                                  "WHILE", "DYNAMIC_SLICE_FUSION", "DYNAMIC_SLICE_COPY_FUSION")
DEFAULT_COMMAND_BUFFER: tuple[str, ...] = ("CUBLAS", "CUBLASLT", "CUDNN", "CUSTOM_CALL", "DYNAMIC_SLICE_FUSION", "FUSION")


@dataclasses.dataclass(frozen=True, order=True)
class HardwareProfile:
    """One cluster: ``nodes`` nodes of ``gpus_per_node`` identical GPUs.

    Bandwidths are GB/s (1e9 B/s). ``*_busbw_gbps`` are nccl-tests *bus* bandwidths
    (all-reduce busBw = algBw x 2(n-1)/n), the unit in which NCCL's own model and the
    published results are stated, so the cost model can be checked against them directly.
    """

    name: str
    gpu: str
    arch: Arch
    gpus_per_node: int
    nodes: int
    sm_count: int
    # Dense BF16/FP16 tensor-core TFLOP/s: datasheet peak and best achieved matmul rate.
    peak_tflops: float
    achieved_tflops: float
    # HBM/GDDR bandwidth: datasheet and achieved (GB/s).
    hbm_gbps: float
    achieved_hbm_gbps: float
    # Inside a node.
    intra_link: LinkKind
    intra_busbw_gbps: float  # ring Simple busBw once the link saturates
    intra_channel_gbps: float  # busBw one channel (one CTA) can drive
    # Between nodes (per node, all NICs together, as ring busBw).
    net_busbw_gbps: float
    net_channel_gbps: float
    # NCCL's defaults on this box.
    nccl_channels: int  # CTAs per communicator chosen at init
    ll128_enabled: bool  # NCCL enables LL128 only on NVLink paths
    # Fixed cost of one kernel launch plus host overhead (us).
    launch_us: float
    # SMs' worth of compute throughput one NCCL channel (one CTA) takes from kernels it
    # overlaps. A NCCL CTA holds its SM but leaves registers, shared memory and warp slots
    # that co-resident compute CTAs use, so the share is well below 1. Fitted jointly with
    # ``CostConfig.hbm_pressure_exponent`` to every published measurement of compute beside
    # communication (``benchmarks/measured/contention.py``: the H100 copy-kernel probe, Echo-slowdown's
    # A100 kernels, ISPASS'25 (arXiv 2507.03114), PyTorch's all-gather + GEMM
    # microbenchmark), not to one of them; `lagom-jax profile` measures it on a GPU.
    sm_share_per_channel: float = 0.2
    # Contention that knows launch order (the simulator, ``costs/simulate.py``; issue 35).
    # SMs one resident NCCL CTA takes from a matmul kernel that starts after it. NCCL's
    # kernels are built ``__launch_bounds__(NCCL_MAX_NTHREADS, 1)`` (NVIDIA/nccl
    # ``src/device/``), one CTA per SM, and cuBLAS's Hopper/Blackwell GEMMs run one CTA per
    # SM with most of its shared memory, so no GEMM CTA fits beside a resident NCCL CTA: a
    # whole SM (the H100 order probe, ``benchmarks/results/gpu/wave_2026-11-25/
    # gpu_order_run1.json``: 1.22x at 16 CTAs resident first, 1.31x at 32, 1.80x at 64 of
    # 132 SMs). None: 1.0 on Hopper and Blackwell; elsewhere ``sm_share_per_channel`` (the
    # A100's SIMT and Ampere tensor-core GEMMs run several CTAs per SM and share the SM with
    # the NCCL CTA: Echo-slowdown's A100 GEMMs ran 1.00x beside DDP's all-reduce).
    matmul_sm_share_per_channel: float | None = None
    # The launch-order rules (``simulate``): a collective that needs SMs and becomes ready
    # while a compute kernel holds them waits for that kernel to end, and one made ready at
    # a compute boundary loses the race to the compute kernel already queued. False: the
    # order-blind model (every running collective takes ``sm_share_per_channel`` per channel
    # from whatever runs beside it, from the moment it is ready).
    contention_order: bool = True
    # Whether collectives run on a stream of the highest priority: XLA's default
    # (``xla_gpu_enable_highest_priority_async_stream``, true).
    comm_high_priority: bool = True
    # Whether a high-priority collective takes its SMs at the next wave of the compute
    # kernel running (the CUDA programming guide, "Stream Priorities": pending work of a
    # higher-priority stream is scheduled before that of lower-priority streams, at CTA
    # granularity: no running CTA is preempted). Off by default: on the H100 the probe saw
    # priority change nothing (every high-priority row equals the normal one within
    # 0.01-0.04), as cuBLAS's Hopper GEMMs are one wave of persistent CTAs; a multi-wave
    # kernel was not measured.
    priority_takes_sms_at_wave: bool = False
    # XLA's description of this GPU (lagom_jax/data/gpu_targets/<name>.txtpb, taken from
    # openxla/xla xla/backends/gpu/target_config/specs): what a deviceless GPU compile
    # targets. Empty: no description, the step can only be compiled on real GPUs.
    xla_target: str = ""
    # Dense BF16 TFLOP/s a fused (flash) attention kernel sustains, forward and backward:
    # its softmax, masking and rescaling run on the SMs between the matmuls, so it stays
    # far below the matmul rate. Measured with FlashAttention-2's benchmark (causal, batch
    # 2, sequence 8192) where published. 0: unknown, timed at ``achieved_tflops``.
    attention_tflops: float = 0.0
    # Dense BF16 TFLOP/s the grouped-GEMM kernel users run for MoE experts sustains on this GPU
    # at large groups (``moe="grouped"``); 0: JAX's Pallas kernels' measured efficiency over
    # ``achieved_tflops`` (Hopper, ``kernels.pallas_grouped_efficiency``).
    grouped_gemm_tflops: float = 0.0
    # XLA's one-shot ragged all-to-all kernel (a dropless MoE's exchange inside one host,
    # ``cost.one_shot_applies``): the rate at which each peer's block moves, all peers at once
    # (GB/s), measured; 0: not measured on this GPU, so the exchange is priced as NCCL's.
    ragged_one_shot_gbps: float = 0.0
    # GPUs one host (one process) drives; 0: ``gpus_per_node``. XLA's one-shot kernel runs only
    # on a group whose GPUs are all local to one process (``RaggedAllToAllStartThunk::is_local``).
    host_gpus: int = 0
    # What stands in for this system's network numbers (``net_busbw_gbps``,
    # ``net_channel_gbps``) where no measurement of the system itself was published; "" when
    # they are measured. Every prediction across nodes says it (``job``'s "network" decision,
    # the CLI's note, ``predict``'s ``AssumedNetworkWarning``).
    network_assumption: str = ""
    # Measured collective times inside one node of this kind of system
    # (``collective_tables``, a table of ``data/collective_times.csv``) that anchor the
    # collective model; empty: the model alone.
    collective_table: str = ""
    # NVLS (NVLink SHARP: the NVSwitch does the all-reduce's reduction, Hopper and newer):
    # all-reduce busBw once saturated, and the CTAs NCCL gives it (``nvlsCTAs``, the same
    # for every size). 0: the box has no NVLS.
    nvls_busbw_gbps: float = 0.0
    nvls_channels: int = 0
    # The process-wide NCCL settings the cluster runs with (NCCL_ALGO, NCCL_PROTO,
    # NCCL_NVLS_ENABLE, NCCL_CTA_POLICY); NCCL's defaults unless a user's run sets them.
    nccl_env: NcclEnv = NcclEnv()
    # The thunk types XLA captures in command buffers (``--xla_gpu_enable_command_buffer``,
    # sorted; empty: off), which ``costs/launch.py`` prices: XLA's default set unless a
    # user's run sets the flag.
    command_buffer: tuple[str, ...] = DEFAULT_COMMAND_BUFFER
    # Measured one-way rate of the link between HBM and host memory (GB/s); 0: the arch's
    # datasheet PCIe rate (``kernels.HOST_LINK_GBPS``).
    host_link_gbps: float = 0.0
    # Latency the network device adds to every inter-node hop of a ring or tree (us), on top of
    # NCCL's ``hwLat[NET]`` (``CostConfig.hop_lat_ring``/``hop_lat_tree``): NCCL's own
    # ``latencyInter``, which a net plugin reports as its device's latency and NCCL adds to a
    # hop once, and once more for the Simple protocol's flush (NVIDIA/nccl src/graph/tuning.cc,
    # ``ncclTopoTuneModel``). 0: InfiniBand through NCCL's own transport.
    # A fabric that moves data through the hosts' TCP stacks (GPUDirect-TCPX) pays far more:
    # fitted on a published small-message floor of the fabric, cited in its preset.
    net_latency_us: float = 0.0
    # CTAs per collective of a communicator whose ranks span nodes; 0: ``nccl_channels``.
    # NCCL searches the rings of such a communicator through the NICs, not NVLink alone:
    # each search channel leaves the node through one NIC at that NIC's speed
    # (NVIDIA/nccl src/graph/search.cc, ``ncclTopoCompute``: 8 NICs of 400 Gb/s give 8 channels
    # at 48 GB/s), and ``ncclTopoPostset`` (src/graph/connect.cc) runs two CTAs per search
    # channel, so the count follows the NICs; ``net_channel_gbps`` is one CTA's share. Trees
    # run the rings' channels (the tree search is held to their count).
    net_nccl_channels: int = 0

    # Hashed on every cached cost lookup: once per instance (lagom_jax.hashing).
    __hash__ = hashing.hash_fields_once
    __getstate__ = hashing.state_without_hash

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"hardware {self.name!r}: unknown arch {self.arch!r} (known: {', '.join(ARCHS)})")
        if self.intra_link not in ("nvlink", "pcie"):
            raise ValueError(f"hardware {self.name!r}: unknown intra_link {self.intra_link!r} (known: nvlink, pcie)")
        for f in ("gpus_per_node", "nodes", "sm_count", "nccl_channels"):
            if getattr(self, f) < 1:
                raise ValueError(f"hardware {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")
        for f in (
            "peak_tflops", "achieved_tflops", "hbm_gbps", "achieved_hbm_gbps", "intra_busbw_gbps",
            "intra_channel_gbps", "net_busbw_gbps", "net_channel_gbps",
        ):
            if not getattr(self, f) > 0:
                raise ValueError(f"hardware {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        for f in ("grouped_gemm_tflops", "ragged_one_shot_gbps", "host_gpus"):
            if getattr(self, f) < 0:
                raise ValueError(f"hardware {self.name!r}: {f} must be >= 0, got {getattr(self, f)}")
        if self.attention_tflops < 0:
            raise ValueError(f"hardware {self.name!r}: attention_tflops must be >= 0, got {self.attention_tflops}")
        if not 0 < self.sm_share_per_channel <= 1:
            raise ValueError(f"hardware {self.name!r}: sm_share_per_channel must be in (0, 1], "
                             f"got {self.sm_share_per_channel}")
        if self.matmul_sm_share_per_channel is not None and not 0 < self.matmul_sm_share_per_channel <= 1:
            raise ValueError(f"hardware {self.name!r}: matmul_sm_share_per_channel must be in (0, 1] or None, "
                             f"got {self.matmul_sm_share_per_channel}")
        if self.net_latency_us < 0:
            raise ValueError(f"hardware {self.name!r}: net_latency_us must be >= 0, got {self.net_latency_us}")
        if self.launch_us < 0:
            raise ValueError(f"hardware {self.name!r}: launch_us must be >= 0, got {self.launch_us}")
        if self.collective_table and self.collective_table not in collective_tables.tables():
            raise ValueError(f"hardware {self.name!r}: unknown collective_table {self.collective_table!r} "
                             f"(known: {', '.join(collective_tables.tables())})")
        bad = sorted(set(self.command_buffer) - set(COMMAND_TYPES))
        if bad or tuple(sorted(set(self.command_buffer))) != tuple(self.command_buffer):
            raise ValueError(f"hardware {self.name!r}: command_buffer must be XLA's command types, sorted, once "
                             f"each (known: {', '.join(COMMAND_TYPES)}), got {list(self.command_buffer)}")
        if not isinstance(self.nccl_env, NcclEnv):
            raise ValueError(f"hardware {self.name!r}: nccl_env must be an NcclEnv, got {type(self.nccl_env).__name__}")
        if self.nvls_busbw_gbps < 0 or (self.nvls_busbw_gbps > 0) != (self.nvls_channels > 0):
            raise ValueError(f"hardware {self.name!r}: NVLS needs both nvls_busbw_gbps > 0 and nvls_channels "
                             f">= 1 (or both 0), got {self.nvls_busbw_gbps} and {self.nvls_channels}")
        if self.nvls_channels and (self.arch not in ("hopper", "blackwell") or self.intra_link != "nvlink"
                                   or self.nvls_channels > self.sm_count):
            raise ValueError(f"hardware {self.name!r}: NVLS exists only on NVSwitch systems of Hopper or "
                             f"newer with at most sm_count CTAs (arch {self.arch}, link {self.intra_link}, "
                             f"{self.nvls_channels} channels)")
        for f in ("nccl_channels", "net_nccl_channels"):
            if not 0 <= getattr(self, f) <= self.sm_count:
                raise ValueError(f"hardware {self.name!r}: {f} must be in 0..sm_count {self.sm_count}, "
                                 f"got {getattr(self, f)}")

    def channels(self, nodes: int = 1) -> int:
        """CTAs per collective NCCL gives a communicator whose ranks span ``nodes`` nodes
        (before any NCCL setting or XLA cap: ``NcclEnv.ctas``)."""
        return (self.net_nccl_channels or self.nccl_channels) if nodes > 1 else self.nccl_channels

    @property
    def gpus_per_host(self) -> int:
        """GPUs one host drives (``host_gpus``), at most a node's."""
        return min(self.host_gpus or self.gpus_per_node, self.gpus_per_node)

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def xla_schedules_by_default(self) -> bool:
        """Whether XLA:GPU runs its latency-hiding scheduler on this GPU unasked.

        ``IsLHSEnabled`` (openxla/xla xla/service/gpu/gpu_hlo_schedule.cc) also turns the
        scheduler on when the speed-of-light latency estimator supports the module
        (``xla_gpu_enable_analytical_sol_latency_estimator``, on by default), which it does
        on Hopper and Blackwell (``SolLatencyEstimator::IsSupportedForModule``:
        ``IsHopper() || IsBlackwell()``) unless the module holds ragged all-to-all,
        collective-broadcast or host-offloaded ops. Older GPUs get XLA's memory-minimizing
        schedule unless the scheduler flag is set. (Checked for Blackwell with the installed
        jaxlib by compiling for ``b200`` with and without the estimator: the modules differ,
        ``tests/test_hardware.py``.)
        """
        return self.arch in ("hopper", "blackwell")

    def resident_sm_share(self, matmul: bool) -> float:
        """SMs one resident collective CTA takes from a kernel that starts after it:
        ``matmul_sm_share_per_channel`` for matmuls, ``sm_share_per_channel`` otherwise."""
        if not matmul:
            return self.sm_share_per_channel
        if self.matmul_sm_share_per_channel is not None:
            return self.matmul_sm_share_per_channel
        return 1.0 if self.arch in ("hopper", "blackwell") else self.sm_share_per_channel

    def with_nodes(self, nodes: int) -> HardwareProfile:
        """The same cluster with ``nodes`` nodes."""
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        return dataclasses.replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HardwareProfile:
        fields = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING}
        unknown = sorted(set(d) - fields)
        missing = sorted(required - set(d))
        if unknown or missing:
            raise ValueError(
                f"hardware profile fields do not match: unknown {unknown}, missing {missing} "
                f"(start from `HardwareProfile.to_json()` of a preset)"
            )
        if isinstance(d.get("nccl_env"), dict):
            env = d["nccl_env"]
            d = {**d, "nccl_env": NcclEnv(**{k: tuple(v) if isinstance(v, list) else v for k, v in env.items()})}
        if isinstance(d.get("command_buffer"), list):
            d = {**d, "command_buffer": tuple(d["command_buffer"])}
        return cls(**d)

    @property
    def has_nvls(self) -> bool:
        """Whether NCCL can run NVLS here under the cluster's settings (one NVLink domain)."""
        return self.nvls_channels > 0 and self.nccl_env.allows_algorithm("nvls")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HardwareProfile:
        with open(path, encoding="utf-8") as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"hardware file {os.fspath(path)!r} is not valid JSON: {e}") from e
        if not isinstance(d, dict):
            raise ValueError(f"hardware file {os.fspath(path)!r} must hold a JSON object")
        return cls.from_dict(d)


# --- Shared derivations (NCCL's tuning model, published nccl-tests) ------------------
# A100: nccl-tests 8xA100 AR busBw 230.8-231.6 GB/s (nccl #527, Azure ND A100 v4) against
# NCCL's model of 12 links x 20 GB/s = 240: the ring reaches 0.96 of the nominal link.
_RING_EFFICIENCY = 231.0 / 240.0
# 2xA100 all-reduce of 32 B measured 10.1 us (nccl #583); NCCL's model predicts
# 6.6 (Ring LL base) + 2 x 0.6 (NVLink LL step) = 7.8 us. The 2.3 us left is launch and
# host overhead, which applies to any kernel launch.
_LAUNCH_US = 10.1 - 7.8
# Achieved / datasheet ratios on A100 where the other GPU had no published measurement:
# MAMF A100 PCIe 256.4 of 312 TFLOP/s; A100 HBM achieved ~1,680 of 2,039 GB/s.
_A100_MATMUL_RATIO = 256.4 / 312.0
_A100_HBM_RATIO = 1680.0 / 2039.0
# FlashAttention-2 (fwd+bwd, causal) against the sustained cuBLASLt rate on ND A100 v4:
# 179.5 / 256.5 TFLOP/s (Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md).
_A100_ATTENTION_RATIO = 179.5 / 256.5
# H100 SXM5 achieved / datasheet HBM (h100-sxm-8 below: 3,040 of 3,350 GB/s), for the HBM3e
# parts (H200, B200) where no achieved-bandwidth measurement was published.
_H100_HBM_RATIO = 3040.0 / 3350.0
# Ring busBw per nominal NIC rate with 200 Gb/s NICs: DGX A100, 8x HDR 200G = 200 GB/s,
# AR busBw 192 (NVIDIA, nccl #812); NVIDIA's rule of thumb is the same, "24GB/s is the peak
# performance per 200G NIC" (sjeaugey, nccl-tests #119).
_NET_200G_EFFICIENCY = 192.0 / 200.0

PRESETS: dict[str, HardwareProfile] = {
    "a100-sxm-8": HardwareProfile(
        name="a100-sxm-8",
        gpu="A100 SXM 80GB",
        arch="ampere",
        gpus_per_node=8,
        nodes=1,
        sm_count=108,  # datasheet
        peak_tflops=312.0,  # datasheet, dense BF16
        # Sustained BF16/FP16 matmul: cuBLASLt 16384^3 after 10k warm-up iterations on Azure
        # ND A100 v4 (Azure/AI-benchmarking-guide). The best-shape short-run rate (MAMF,
        # stas00/ml-engineering) is 267.9-271.2; a training step runs at the sustained clock.
        achieved_tflops=256.5,
        hbm_gbps=2039.0,  # datasheet, HBM2e
        achieved_hbm_gbps=1680.0,  # achieved 1.61-1.75 TB/s (Azure ND A100 v4), midpoint
        intra_link="nvlink",
        intra_busbw_gbps=231.0,  # nccl-tests AR busBw 230.8 @1 GB (nccl #527), 231.6 @8 GB (Azure)
        # NCCL: 12 search channels x 20 GB/s, 24 CTAs => 10 GB/s busBw per CTA.
        intra_channel_gbps=10.0,
        net_busbw_gbps=192.0,  # DGX A100, 8x HDR 200G: AR busBw 192 (NVIDIA, nccl #812)
        # Across nodes 8 search channels at the HDR NIC's 24 GB/s, 2 CTAs each: "8 NICs -> 16
        # SMs" at 190 GB/s (NVIDIA, nccl #689) => 12 per CTA.
        net_channel_gbps=12.0,
        net_nccl_channels=16,
        nccl_channels=24,  # "Channel xx/24" on 8xA100 NVSwitch (nccl-tests #100)
        ll128_enabled=True,  # NVLink path (NCCL enables LL128 on NVLink)
        launch_us=_LAUNCH_US,
        # FlashAttention-2 fwd+bwd, causal, head dim 64: 179.5 (Azure/AI-benchmarking-guide,
        # Azure_Results/ND_A100_v4_results.md).
        attention_tflops=179.5,
        xla_target="a100_sxm_80",
        # nccl-tests all-reduce on 2/4/8 A100 SXM4 40GB of Azure ND A100 v4: the same
        # NVLink 3 / NVSwitch fabric (NetX-lab/Echo's logs).
        collective_table="a100-nvswitch",
    ),
    "h100-sxm-8": HardwareProfile(
        name="h100-sxm-8",
        gpu="H100 SXM5",
        arch="hopper",
        gpus_per_node=8,
        nodes=1,
        sm_count=132,  # datasheet
        peak_tflops=989.4,  # datasheet, dense BF16
        achieved_tflops=792.1,  # MAMF best-shape BF16 matmul (stas00/ml-engineering)
        hbm_gbps=3350.0,  # datasheet, HBM3
        achieved_hbm_gbps=3040.0,  # achieved 2.90-3.18 TB/s, midpoint
        intra_link="nvlink",
        # Ring (not NVLS) is modelled: ~365-370 effective (nccl #1455; sjeaugey, nccl-tests #212).
        intra_busbw_gbps=370.0,
        # NCCL: 12 search channels x 30 GB/s, 24 CTAs => 15 GB/s per CTA.
        intra_channel_gbps=15.0,
        # 8x 400 Gb/s NICs; 4x8 H100 with 3.2 Tb/s IB measured AR busBw 330.9 (aigatech).
        net_busbw_gbps=330.9,
        # Across nodes NCCL's search gives each 400 Gb/s NIC one channel at 48 GB/s ("nChannels 8,
        # bw 48"), and ncclTopoPostset runs 2 CTAs per channel: 16 CTAs at 24 GB/s each;
        # multi-node H100 runs log "Channel 00/16" (NVIDIA/nccl issue #1453).
        net_channel_gbps=24.0,
        net_nccl_channels=16,
        nccl_channels=24,  # 6x60 -> 12x30 search channels, 24 CTAs (NCCL search.cc/connect.cc)
        ll128_enabled=True,
        launch_us=_LAUNCH_US,
        # FlashAttention-2 fwd+bwd, causal, head dim 128: 327.9 (Azure/AI-benchmarking-guide,
        # "Azure Results/ND_H100_v5_results.md").
        attention_tflops=327.9,
        xla_target="h100_sxm",
        collective_table="h100-nvswitch",  # XLA's measured sm_90 table, 8 GPUs of one host
        # NCCL's NVLS model: 8 NVLS heads x bwIntra 40 x efficiency 0.85 x 7/8 x 2 = 476
        # (src/graph/tuning.cc); measured 478.9 @8GB (Azure ND H100 v5, AI-benchmarking-guide).
        nvls_busbw_gbps=476.0,
        nvls_channels=16,  # nvlsCTAs on sm_90; "16 nvls channels" in AWS p5 logs (nccl #1453)
    ),
    "a40-pcie-8": HardwareProfile(
        name="a40-pcie-8",
        gpu="A40",
        arch="ampere",  # SM86
        gpus_per_node=8,
        nodes=1,
        sm_count=84,  # datasheet
        peak_tflops=149.7,  # datasheet, dense BF16
        achieved_tflops=round(149.7 * _A100_MATMUL_RATIO, 1),  # no A40 GEMM published: A100 PCIe ratio
        hbm_gbps=696.0,  # datasheet, GDDR6
        achieved_hbm_gbps=round(696.0 * _A100_HBM_RATIO, 1),  # no measurement published: A100 ratio
        intra_link="pcie",
        # No 8xA40 nccl-tests result was published. NCCL rates PCIe Gen4 x16 at 24 GB/s;
        # a PCIe Gen5 box reached 35 of 48 GB/s (nccl #1639, "limited by CPU/memory").
        intra_busbw_gbps=round(24.0 * 35.0 / 48.0, 1),
        # NCCL uses ~2 SMs for a PCIe system with one 12-24 GB/s NIC (NVIDIA, nccl #689).
        intra_channel_gbps=6.0,
        net_busbw_gbps=round(100 / 8 * _RING_EFFICIENCY, 2),  # one 100 Gb/s IB NIC per node
        network_assumption="one 100 Gb/s InfiniBand NIC per node at the A100 ring's efficiency; no A40 "
        "cluster's nccl-tests result was published",
        net_channel_gbps=6.0,  # as above (nccl #689)
        nccl_channels=8,  # NCCL's NC on Lagom's A40 cluster (arXiv 2602.20656); AutoCCL raised it to 61
        ll128_enabled=False,  # PCIe-only boxes get LL + Simple
        launch_us=_LAUNCH_US,
        # XLA ships no A40 description; the RTX A6000 is the same GA102 chip (84 SMs, 48 GB
        # GDDR6, 768 GB/s vs the A40's 696): the compiled module differs only where XLA
        # weighs memory bandwidth.
        # No fused-attention measurement: A100's measured share of its achieved matmul rate.
        attention_tflops=round(149.7 * _A100_MATMUL_RATIO * _A100_ATTENTION_RATIO, 1),
        xla_target="a6000",
    ),
    "v100-25g": HardwareProfile(
        name="v100-25g",
        gpu="V100 SXM2",
        arch="volta",
        gpus_per_node=8,
        nodes=1,
        sm_count=80,  # datasheet
        peak_tflops=125.0,  # datasheet, FP16 tensor core (no BF16 on Volta)
        achieved_tflops=round(125.0 * _A100_MATMUL_RATIO, 1),  # no V100 GEMM published: A100 ratio
        hbm_gbps=900.0,  # datasheet, HBM2
        achieved_hbm_gbps=round(900.0 * _A100_HBM_RATIO, 1),  # no measurement published: A100 ratio
        intra_link="nvlink",
        # 6x NVLink2 at NCCL's SM70 20 GB/s = 120, at the ring efficiency measured on A100.
        intra_busbw_gbps=round(120.0 * _RING_EFFICIENCY, 1),
        # NCCL init: 3 search channels x 40 -> DupChannels 6 x 20 -> 12 CTAs => 10 per CTA.
        intra_channel_gbps=10.0,
        net_busbw_gbps=round(25 / 8 * _RING_EFFICIENCY, 2),  # one 25 Gb/s Ethernet NIC per node
        network_assumption="one 25 Gb/s Ethernet NIC per node at the A100 ring's efficiency",
        net_channel_gbps=6.0,  # one slow NIC: ~2 SMs suffice (nccl #689)
        # One NIC: one search channel across nodes, 2 CTAs ("Channel 00/02" with one NIC per
        # node, nccl-tests #133).
        net_nccl_channels=2,
        nccl_channels=12,  # derived above from NCCL's channel search
        ll128_enabled=True,  # NVLink path
        launch_us=_LAUNCH_US,
        # No fused-attention measurement (FlashAttention-2 has no Volta kernels): A100's
        # measured share of its achieved matmul rate.
        attention_tflops=round(125.0 * _A100_MATMUL_RATIO * _A100_ATTENTION_RATIO, 1),
        xla_target="v100",
    ),
    # DGX H200 / HGX H200: 8x H200 SXM 141GB, 4x NVSwitch (NVLink 4, 18 links, as H100),
    # 8x ConnectX-7 400 Gb/s for the compute fabric (NVIDIA DGX H200 datasheet).
    "h200-sxm-8": HardwareProfile(
        name="h200-sxm-8",
        gpu="H200 SXM 141GB",
        arch="hopper",
        gpus_per_node=8,
        nodes=1,
        sm_count=132,  # the H100's GH100 with HBM3e; XLA's H200 description (h200.txtpb): core_count 132
        peak_tflops=989.4,  # datasheet: 1,979 TFLOP/s BF16 with sparsity, dense half (as H100)
        # No separate H200 row in MAMF's BF16 table: "H200 is the same" as the H100's
        # (stas00/ml-engineering compute/accelerator); the H100's best-shape rate.
        achieved_tflops=792.1,
        hbm_gbps=4800.0,  # datasheet, HBM3e 4.8 TB/s
        # No H200 measurement published: the H100's achieved/datasheet ratio (assumption).
        achieved_hbm_gbps=round(4800.0 * _H100_HBM_RATIO, 1),
        intra_link="nvlink",
        # 8x H200 all-reduce with NCCL_NVLS_ENABLE=0 (ring) busBw 367.61 @16GiB
        # (stas00/ml-engineering network/README, "82% of spec"; NVLS reached 482).
        intra_busbw_gbps=367.6,
        # Same NVLink 4 x18 as H100: NCCL's 12x30 search channels, 24 CTAs => 15 per CTA.
        intra_channel_gbps=15.0,
        # 4 nodes x 8 H200 with 8x 400 Gb/s NICs (p5en.48xlarge, EFA), NCCL 2.27.7 ring forced
        # (NCCL_ALGO=allreduce:ring): AR busBw 364.65 @4GiB (stas00/ml-engineering
        # network/README). DGX H200's fabric is InfiniBand NDR at the same 8x 400 Gb/s: no
        # nccl-tests result on it was found, the EFA measurement stands in (assumption).
        net_busbw_gbps=364.65,
        network_assumption="AWS p5en's measured EFA (8x 400 Gb/s) stands in for InfiniBand NDR",
        # 8x 400 Gb/s NICs: as h100-sxm-8, 16 CTAs at 24 GB/s across nodes (aws-ofi-nccl groups
        # p5en's 2x 200 Gb/s EFA per GPU into one 400 Gb/s device).
        net_channel_gbps=24.0,
        net_nccl_channels=16,
        nccl_channels=24,  # same NVSwitch topology and NCCL search as H100 (6x60 -> 12x30 -> 24)
        ll128_enabled=True,
        launch_us=_LAUNCH_US,
        # FlashAttention-2 fwd+bwd, causal, head dim 128: 329.3 (Azure/AI-benchmarking-guide,
        # Azure_Results/ND_H200_v5_results.md).
        attention_tflops=329.3,
        xla_target="h200",  # XLA's own H200 description (h200.txtpb)
        # XLA has no H200 table: H100's (the same NVLink 4 and NVSwitch) stands in (assumption).
        collective_table="h100-nvswitch",
        # Same NVSwitch as H100: NCCL's NVLS model gives 476; measured 482 with NVLS on
        # (stas00/ml-engineering network/README), 480 @8GB (Azure ND H200 v5).
        nvls_busbw_gbps=476.0,
        nvls_channels=16,  # nvlsCTAs on sm_90
    ),
    # DGX B200 / HGX B200: 8x B200 (1,440 GB of HBM3e per DGX), 2x NVSwitch (NVLink 5, 1.8
    # TB/s per GPU), 8x ConnectX-7 400 Gb/s for the compute fabric (NVIDIA DGX B200
    # datasheet).
    "b200-sxm-8": HardwareProfile(
        name="b200-sxm-8",
        gpu="B200 SXM",
        arch="blackwell",
        gpus_per_node=8,
        nodes=1,
        # NVIDIA's B200 datasheets give no SM count; XLA's B200 description (b200.txtpb):
        # core_count 148.
        sm_count=148,
        # DGX B200 datasheet: 72 PFLOP/s FP8 with sparsity for 8 GPUs = 4.5 dense FP8 per GPU;
        # dense BF16 is half of that (2,250 in stas00/ml-engineering's spec table).
        peak_tflops=2250.0,
        achieved_tflops=1745.0,  # MAMF best-shape BF16 matmul, B200 SXM (stas00/ml-engineering)
        hbm_gbps=8000.0,  # DGX B200 datasheet: 64 TB/s HBM3e for 8 GPUs
        # No B200 measurement published: the H100's achieved/datasheet ratio (assumption).
        achieved_hbm_gbps=round(8000.0 * _H100_HBM_RATIO, 1),
        intra_link="nvlink",
        # NCCL's model of the link: 18 x SM100_NVLINK_BW 40.1 = 721.8 (src/graph/topo.h;
        # "maxBw 721.8" in the log of nccl #1807), as 18 x 20.6 = 370.8 is for H100 whose
        # ring measured 365-370. Checked: 1 node of 8x B200 (P6-B200) all-reduce busBw
        # 723.34 @1GiB, 740.64 @4GiB (stas00/ml-engineering network/README, NCCL 2.27.7;
        # 839-846 at 8-16GiB is above any ring: NVLS).
        intra_busbw_gbps=721.8,
        # NCCL's channel search on sm_100: 8 channels x 90 GB/s (sm100SpeedArrayIntra,
        # 8 x 90 <= 721.8), ncclTopoDupChannels -> 16 x 45, connect.cc doubles -> 32 CTAs
        # => 22.5 GB/s per CTA.
        intra_channel_gbps=22.5,
        # 4 nodes x 8 B200 with 8x 400 Gb/s NICs (P6-B200, EFA v4), NCCL 2.27.7: AR busBw
        # 377.34 @4GiB, 381.80 @16GiB (stas00/ml-engineering network/README; the algorithm,
        # chosen by AWS's tuner plugin, was not reported). DGX B200's InfiniBand NDR fabric
        # at the same 8x 400 Gb/s has no published nccl-tests result: the EFA measurement
        # stands in (assumption).
        net_busbw_gbps=377.34,
        network_assumption="AWS P6-B200's measured EFA (8x 400 Gb/s) stands in for InfiniBand NDR",
        # 8x 400 Gb/s NICs: NCCL's Blackwell inter-node speeds top out at the NIC's 48 (47.9 in
        # NCCL 2.27), so as on H100, 8 search channels and 16 CTAs at 24 GB/s across nodes.
        net_channel_gbps=24.0,
        net_nccl_channels=16,
        # Derived above; NCCL logs "32 coll channels" on a DGX B200 (nccl #1646).
        nccl_channels=32,
        ll128_enabled=True,  # NCCL enables LL128 by default on Hopper/Blackwell (src/graph/tuning.cc)
        launch_us=_LAUNCH_US,
        # XLA's own B200 description (b200.txtpb, sm_100a). The CUDA 12.9 ptxas of
        # nvidia-cuda-nvcc-cu12 assembles sm_100a, so the deviceless compile is the real one.
        # FlashAttention-2 fwd+bwd, causal, head dim 128, on GB200 (the same B200 chip):
        # 373.9 (Azure/AI-benchmarking-guide, Azure_Results/ND_GB200_v6_results.md); no
        # HGX B200 measurement was published.
        attention_tflops=373.9,
        # QuACK's (SonicMoE's) SM100 bf16 gated grouped GEMM alone on one B200: about 1175
        # TFLOP/s (marin-community/marin issue #7012), the CuTe kernel users run through FFI.
        grouped_gemm_tflops=1175.0,
        # XLA's one-shot ragged all-to-all on one 8x B200 node: 297 ms a call in a profile of a
        # 26-layer 64-expert top-4 MoE at EP 2 (d 2560, 65,536 tokens a GPU: 1.34 GB of sorted
        # rows, half of them for the other shard; marin-community/marin
        # .agents/logbooks/7012-b200-moe-mfu.md, B200MFU-018): 0.671 GB / 0.297 s = 2.26 GB/s a
        # peer (openxla/xla issue #33386 also puts this kernel at about 2% of NVLink's rate).
        ragged_one_shot_gbps=2.26,
        xla_target="b200",
        collective_table="b200-nvswitch",  # XLA's measured sm_100_B200 table, 8 GPUs of one host
        # 8x B200 all-reduce busBw 839-846 @8-16GiB, above any ring: NVLS
        # (stas00/ml-engineering network/README, NCCL 2.27.7).
        nvls_busbw_gbps=840.0,
        nvls_channels=24,  # nvlsCTAs on sm_100 inside one NVLink domain (src/transport/nvls.cc, 2.27+)
    ),
}

# DGX H100 is what h100-sxm-8 already describes: 8x H100 SXM5, 4x NVSwitch and 8x
# ConnectX-7 400 Gb/s InfiniBand per node (NVIDIA DGX H100 datasheet); its network number
# was measured on exactly that fabric (3.2 Tb/s IB per node). "dgx-h100" is the same
# profile under the name people search for: every number is equal, only the name differs.
PRESETS["dgx-h100"] = dataclasses.replace(PRESETS["h100-sxm-8"], name="dgx-h100")

# Google Cloud GPU nodes: the GPUs and NVSwitch inside are those of the HGX boxes above; the
# network is the cloud's. NIC counts and rates: Google Cloud, "Networking and GPU machines"
# (cloud.google.com/compute/docs/gpus/gpu-network-bandwidth) and GKE "Maximize GPU network
# bandwidth" (cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx).
# No nccl-tests result of these machine types was found published; each network number
# below says what stands in.
PRESETS["a3"] = dataclasses.replace(
    # a3-highgpu-8g: 8x H100 80GB SXM with NVSwitch; for GPU traffic 4 secondary NICs of up
    # to 200 Gb/s each with GPUDirect-TCPX (1,000 Gbps in all with the 200 Gb/s primary NIC).
    PRESETS["h100-sxm-8"], name="a3",
    # Measured: nccl-tests all_reduce_perf over 2 x 8 GPUs with the TCPX plugin v3.1.6 (2023-10),
    # NCCL_ALGO=Ring NCCL_PROTO=Simple as the plugin's install sets them, 12 channels
    # (GoogleCloudPlatform/ai-infra-cluster-provisioning sample_workloads/nccltest/a3/README.md,
    # 2023-12): busBw 89.54 GB/s at 8 GiB; 1.65-1.79 ms from 1 to 4 MiB, where RDMA fabrics take
    # ~0.1 ms. NCCL's latency composition (2 network hops of a 16-rank ring all-reduce, x1.4 for
    # Simple) puts that floor at 560 us a network hop: NCCL's 14 for a Simple ring hop and twice
    # the device's latency (once for the hop, once for Simple's flush), 273 us: TCP through the
    # host's receive path.
    net_busbw_gbps=89.54,
    net_latency_us=273.0,
    # The measurement ran 12 channels across the nodes (its log); the 4 NICs' 96 GB/s over them.
    # (GKE's TCPX configuration pinned NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=8 from 2023-12.)
    net_nccl_channels=12,
    net_channel_gbps=8.0,
    nccl_env=NcclEnv(algorithms=("ring",), protocols=("Simple",)),
)
PRESETS["a3-mega"] = dataclasses.replace(
    # a3-megagpu-8g: 8x H100 80GB SXM with NVSwitch; 8 secondary NICs of up to 200 Gb/s each
    # with GPUDirect-TCPXO (1,800 Gbps in all with the primary NIC).
    PRESETS["h100-sxm-8"], name="a3-mega",
    # 8 x 200 Gb/s = 200 GB/s at the 200G-NIC ring efficiency (assumption, as for a3; TCPXO
    # offloads the TCP data path to the NICs).
    net_busbw_gbps=round(8 * 200 / 8 * _NET_200G_EFFICIENCY, 2),
    network_assumption="8x 200 Gb/s GPUDirect-TCPXO at InfiniBand's 200G ring efficiency",
    # 8 search channels at a 200 Gb/s NIC's 24 GB/s, 16 CTAs: 12 GB/s each.
    net_channel_gbps=12.0,
)
PRESETS["a3-ultra"] = dataclasses.replace(
    # a3-ultragpu-8g: 8x H200 141GB with NVSwitch; 8 ConnectX-7 NICs, one per GPU, 3,200
    # Gbps of GPUDirect RDMA over RoCE (plus 2 gVNICs, 400 Gbps, for other traffic).
    PRESETS["h200-sxm-8"], name="a3-ultra",
    # Same GPU and the same 8x 400 Gb/s per node as h200-sxm-8: its measured 364.65 (EFA)
    # stands in for RoCE (assumption).
    net_busbw_gbps=PRESETS["h200-sxm-8"].net_busbw_gbps,
    network_assumption="AWS p5en's measured EFA (8x 400 Gb/s) stands in for RoCE",
)
PRESETS["a4"] = dataclasses.replace(
    # a4-highgpu-8g: 8x B200 with NVSwitch; 8 ConnectX-7 NICs, 3,200 Gbps of GPUDirect RDMA
    # over RoCE (plus 2 gVNICs).
    PRESETS["b200-sxm-8"], name="a4",
    # Same GPU and 8x 400 Gb/s as b200-sxm-8: its measured 377.34 (EFA) stands in (assumption).
    net_busbw_gbps=PRESETS["b200-sxm-8"].net_busbw_gbps,
    network_assumption="AWS P6-B200's measured EFA (8x 400 Gb/s) stands in for RoCE",
)

PRESETS["p5"] = dataclasses.replace(
    # AWS p5.48xlarge: 8x H100 80GB SXM with NVSwitch; 32 EFA devices, 3,200 Gbps in all (AWS EC2
    # User Guide, "Maximize network bandwidth ... with EFA").
    PRESETS["h100-sxm-8"], name="p5",
    # 400 GB/s at the 200G-NIC ring efficiency measured on InfiniBand (assumption, as for the
    # Google Cloud nodes).
    net_busbw_gbps=round(32 * 100 / 8 * _NET_200G_EFFICIENCY, 2),
    # The latency aws-ofi-nccl reports to NCCL for p5/p5e, "from empirical testing on P5"
    # (aws/aws-ofi-nccl src/platform-aws.cpp), which NCCL adds to every inter-node hop.
    net_latency_us=75.0,
    network_assumption="32x 100 Gb/s EFA at InfiniBand's 200G ring efficiency (its latency is aws-ofi-nccl's)",
)
# GB200 NVL72: 72 B200 GPUs (18 trays of 2 Grace + 4 B200) joined by NVLink 5 switches into
# one NVLink domain of 1.8 TB/s per GPU (NVIDIA GB200 NVL72 datasheet). The cost model's
# "node" is the NVLink domain, so a job of up to 72 GPUs is one node; NCCL runs NVLS across
# the trays (multi-node NVLink). Numbers not published for the rack are the B200's.
PRESETS["gb200-nvl72"] = dataclasses.replace(
    PRESETS["b200-sxm-8"], name="gb200-nvl72", gpu="B200 (GB200 NVL72)", gpus_per_node=72,
    # Datasheet: 720 PFLOP/s FP8 with sparsity for 72 GPUs = 5 dense FP8 per GPU, 2.5 dense BF16.
    peak_tflops=2500.0,
    # MAMF best-shape BF16 matmul on a GB200, 4096x9728x2048: 1822.0 (stas00/ml-engineering
    # compute/accelerator/README.md, MAMF table).
    achieved_tflops=1822.0,
    # No grouped-GEMM rate measured on GB200: the B200's QuACK figure times GB200's measured dense
    # rate over B200's (MAMF, 1822.0 / 1745.0; its SM clock is higher).
    grouped_gemm_tflops=round(1175.0 * 1822.0 / 1745.0, 1),
    # NVLink inside the rack is the B200's NVLink 5 through NVSwitch: B200's ring model stands
    # in for the rack's rings (no in-rack all-gather or reduce-scatter sweep was published).
    # NVLS: all-reduce busBw over the 72 GPUs of one rack, NCCL 2.26.2 with
    # NCCL_MNNVL_ENABLE=1, 834.6 GB/s at 8 GiB (839.2 at 4 GiB; coreweave/nccl-tests README,
    # out of place), the 8x B200 node's 840 within 1%: kept. Between racks: the B200 node's
    # measured 8x 400 Gb/s stands in (assumption).
    # nvlsCTAs: the B200 node's 24. NCCL 2.27+ counts an MNNVL communicator inside one clique
    # (the rack) as one node for them: 24, and 32 only where it spans several cliques
    # (NVIDIA/nccl src/transport/nvls.cc ``ncclNvlsInit``, NVLS_NCHANNELS_SM100_NVL; 2.26 gave
    # every sm_100 communicator 32).
    # NVLink-C2C to the Grace host, measured per GPU: host to device 201 GB/s, device to host
    # 193 (Azure/AI-benchmarking-guide, Azure_Results/ND_GB200_v6_results.md): the slower
    # direction, offloading's.
    host_link_gbps=193.0,
    # A compute tray: 4 B200 on 2 Grace CPUs, one host.
    host_gpus=4,
    network_assumption="between racks, AWS P6-B200's measured EFA (8x 400 Gb/s per 8 GPUs) stands in",
)

# Azure ND A100 v4: 8x A100 SXM4 40GB with NVSwitch and one 200 Gb/s HDR InfiniBand NIC per
# GPU, the DGX A100's network on paper (Microsoft's VM documentation; NetX-lab/Echo's
# nccl-test-log/README.md). Measured, its all-reduce busBw across nodes peaks at 124-128 GB/s
# at 1-16 GiB over 2-16 VMs (NetX-lab/Echo nccl-test-log/nccl_{16,32,64,128}.log), not the
# DGX A100's 192: the rate of the 2-VM log at its largest size stands in for the network.
PRESETS["nd-a100-v4"] = dataclasses.replace(
    PRESETS["a100-sxm-8"], name="nd-a100-v4", gpu="A100 SXM4 40GB (Azure ND A100 v4)",
    hbm_gbps=1555.0,  # A100 40GB datasheet, HBM2
    # No achieved figure for the 40GB part: the 80GB part's achieved/datasheet ratio (assumption).
    achieved_hbm_gbps=round(1555.0 * PRESETS["a100-sxm-8"].achieved_hbm_gbps / PRESETS["a100-sxm-8"].hbm_gbps),
    net_busbw_gbps=127.95,
    xla_target="a100_sxm_40",  # XLA's own description of the 40GB part (a100_sxm_40.txtpb)
)

# GPU names (as in jax's ``device_kind``) -> the preset with that GPU's links and NCCL
# tables; H800 shares the H100's Hopper tables, A800 the A100's. The first match wins, so
# "NVIDIA GB200" (4 GPUs per tray, NVLink across the rack) also lands on b200-sxm-8: same
# chip, a node shape that is not the GB200's.
GPU_PRESETS: tuple[tuple[str, str], ...] = (
    ("H100", "h100-sxm-8"), ("H200", "h200-sxm-8"), ("H800", "h100-sxm-8"), ("B200", "b200-sxm-8"),
    ("A100", "a100-sxm-8"), ("A800", "a100-sxm-8"), ("A40", "a40-pcie-8"), ("V100", "v100-25g"),
)


def preset_for_device(device_kind: str) -> str | None:
    """The preset name for a GPU's ``device_kind`` (e.g. "NVIDIA H100 80GB HBM3"), or None."""
    for key, preset in GPU_PRESETS:
        if key.lower() in device_kind.lower():
            return preset
    return None


def get(name: str, nodes: int = 1) -> HardwareProfile:
    """The preset ``name`` scaled to ``nodes`` nodes."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown hardware preset {name!r} (known: {', '.join(PRESETS)})") from None
    return base.with_nodes(nodes)


def resolve(name_or_path: str, nodes: int | None = None) -> HardwareProfile:
    """A preset name, ``name:nodes=N``, ``name:gpus_per_node=G`` (both, comma-separated), or a
    JSON file written by ``HardwareProfile.save``.

    ``gpus_per_node``: the GPUs a job uses of each node (NVLink domain), at most the preset's: a
    GB200 NVL72 rack is usually run with 64 of its 72 GPUs (16 compute trays of 4). ``nodes``
    (when given) overrides the node count from the name or the file.
    """
    spec = name_or_path.strip()
    if spec in PRESETS or ":" in spec and spec.split(":", 1)[0] in PRESETS:
        name, _, opts = spec.partition(":")
        given = _options(name, opts, name_or_path)
        hw = get(name, nodes if nodes is not None else given.get("nodes", 1))
        per_node = given.get("gpus_per_node", hw.gpus_per_node)
        if per_node > hw.gpus_per_node:
            raise ValueError(f"{name_or_path!r}: gpus_per_node {per_node} is more than the {hw.gpus_per_node} GPUs "
                             f"a node of {name} has")
        return dataclasses.replace(hw, gpus_per_node=per_node)
    if os.path.isfile(spec):
        hw = HardwareProfile.load(spec)
        return hw.with_nodes(nodes) if nodes is not None else hw
    raise ValueError(
        f"unknown hardware {name_or_path!r}: not a preset (known: {', '.join(PRESETS)}) "
        f"and not a JSON file"
    )


def _options(name: str, opts: str, spec: str) -> dict[str, int]:
    """``nodes=N,gpus_per_node=G`` as numbers (each positive, each at most once)."""
    out: dict[str, int] = {}
    for opt in filter(None, (o.strip() for o in opts.split(","))):
        key, _, value = (x.strip() for x in opt.partition("="))
        if key not in ("nodes", "gpus_per_node") or key in out or not value.isdigit() or int(value) < 1:
            raise ValueError(f"bad hardware option {opt!r} in {spec!r} (expected e.g. '{name}:nodes=4' or "
                             f"'{name}:gpus_per_node=64,nodes=4')")
        out[key] = int(value)
    return out


# The cluster predicted for when the devices in sight are not GPUs of a known kind.
DEFAULT_PREDICTED_CLUSTER = "h100-sxm-8"


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A cluster chosen from what the user gave, and a sentence saying how."""

    hardware: HardwareProfile
    note: str


def resolve_cluster(spec: str | HardwareProfile, *, nodes: int | None = None, num_devices: int | None = None,
                    devices: list | None = None) -> Resolved:
    """The one hardware resolver of the CLI, the decorator and ``advise``.

    ``spec`` is a HardwareProfile, a preset name, ``name:nodes=N`` or ``name:gpus_per_node=G``
    (``resolve``), a JSON file written by
    ``HardwareProfile.save``, or ``"auto"``: the preset of the GPUs this process sees
    (``devices``, default ``jax.devices()``), or the ``DEFAULT_PREDICTED_CLUSTER`` where they
    are not GPUs of a known kind. ``nodes`` overrides the node count. Otherwise a job of
    ``num_devices`` (for "auto": the devices seen) larger than the cluster grows it to as
    many whole nodes as it needs, unless ``spec`` named its node count (``name:nodes=N``) or
    is a HardwareProfile.
    """
    if nodes is not None and nodes <= 0:
        raise ValueError(f"nodes must be positive, got {nodes}")
    auto = isinstance(spec, str) and spec.strip() == "auto"
    if isinstance(spec, HardwareProfile):
        hw, note, explicit = spec, f"hardware: {spec.name}", True
    elif auto:
        hw, note = _auto(devices)
        num_devices, explicit = _device_count(devices), False
    else:
        hw = resolve(spec, nodes)
        name, _, opts = spec.strip().partition(":")
        preset = PRESETS.get(name)
        note, explicit = f"hardware: {hw.name}", preset is not None and "nodes" in _options(name, opts, spec)
        if preset is not None and hw.gpus_per_node != preset.gpus_per_node:
            note += f" ({hw.gpus_per_node} GPUs a node)"
    if nodes is not None:
        hw = hw.with_nodes(nodes)
    elif not explicit and num_devices is not None and num_devices > hw.num_gpus:
        hw = hw.with_nodes(math.ceil(num_devices / hw.gpus_per_node))
    return Resolved(hw, f"{note}, {hw.nodes} node(s)" if auto else note)


def _device_count(devices: list | None) -> int:
    import jax

    return len(devices if devices is not None else jax.devices())


def _auto(devices: list | None) -> tuple[HardwareProfile, str]:
    import jax

    devices = devices if devices is not None else jax.devices()
    d0, n = devices[0], len(devices)
    if d0.platform in ("gpu", "cuda", "rocm"):
        preset = preset_for_device(d0.device_kind)
        if preset is not None:
            return get(preset), f"hardware=auto: {n}x {d0.device_kind} -> preset {preset}"
        return (get(DEFAULT_PREDICTED_CLUSTER),
                f"hardware=auto: no preset for {d0.device_kind!r}; predicting for {DEFAULT_PREDICTED_CLUSTER}")
    return (get(DEFAULT_PREDICTED_CLUSTER),
            f"hardware=auto: {n} {d0.platform.upper()} device(s), no GPU here; "
            f"predicting for the {DEFAULT_PREDICTED_CLUSTER} cluster")
