"""Kernel times on one GPU: matmuls by shape, memory-bound kernels, the optimizer step.

One peak rate does not time a training step: a matmul's throughput depends on its shape.
The GPU runs a matmul as output tiles, one thread block per tile, in waves of one block per
SM; a wave that is not full wastes the idle SMs (*wave quantization*), and every tile pays
a fixed prologue/epilogue besides its loop over the contraction dimension, so a short
contraction runs below peak. NVIDIA's "Matrix Multiplication Background User's Guide"
(docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication) describes
both effects. The model::

    waves   = ceil(batch * ceil(m / tile_m) * ceil(n / tile_n) / SMs)
    compute = waves * 2 * tile_m * tile_n * (k + k_overhead) / (achieved rate / SMs)
    memory  = itemsize * batch * (m*k + k*n + m*n) / achieved HBM bandwidth
    time    = launch + fixed + max(compute, memory)

The library picks the tile with the shortest time among ``GemmModel.tiles`` (smaller
tiles fill more SMs at a lower per-tile rate). ``achieved rate`` is the hardware
profile's best-shape matmul rate (MAMF). The constants are fitted to XLA's measured
H100 matmul table (see ``GemmModel``). Memory-bound kernels (layer norms, softmax,
element-wise fusions, the optimizer) take ``launch + bytes / achieved HBM bandwidth``.

This module is on the ground floor: it imports only the hardware profiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from lagom_jax.cluster.hardware import HardwareProfile


@dataclasses.dataclass(frozen=True)
class GemmModel:
    """The constants of the matmul model.

    ``tiles``: (tile_m, tile_n, relative rate) of the thread-block tiles the library picks
    from. ``k_overhead``: contraction steps' worth of time every tile pays besides its
    loop. ``fixed_us``: a matmul kernel's start-up beyond the launch.

    Fitted to the 375 BF16 shapes of XLA's measured H100 matmul table (openxla/xla
    ``xla/service/gpu/model/default_matmul_perf_table.txtpb``, ``sm_90``; m, n, k in
    256..4096, batch 1..4; copied to ``lagom_jax/data/xla_matmul_h100.csv``) by a grid
    search: median absolute error 5.2%, mean 6.5% (the first guess, 256x128 tiles with a
    470-step overhead, had 13.8% / 16.4%). No such table exists for the A100; the same
    constants with the A100's best-shape rate give 248 / 265 / 266 TFLOP/s at 4096^3 /
    8192^3 / 16384^3, against 228 / 253.7 / 256.5 measured with cuBLASLt on Azure's ND A100
    v4 (Azure/AI-benchmarking-guide): 4-9% optimistic there.
    """

    tiles: tuple[tuple[int, int, float], ...] = ((256, 128, 1.0), (128, 128, 1.0), (128, 64, 0.85), (64, 64, 0.6))
    k_overhead: float = 64.0
    fixed_us: float = 3.0


DEFAULT_GEMM = GemmModel()


@functools.lru_cache(maxsize=1 << 14)
def gemm_time_us(m: int, n: int, k: int, hw: HardwareProfile, *, batch: int = 1, itemsize: int = 2,
                 sm_fraction: float = 1.0, hbm_gbps: float | None = None,
                 model: GemmModel = DEFAULT_GEMM, tflops: float | None = None) -> float:
    """Time of one (batched) matmul ``[m, k] x [k, n]`` on ``hw`` (us).

    ``sm_fraction`` is the share of SMs left to it (collectives running beside it hold
    the rest); ``hbm_gbps`` the bandwidth left (default: the achieved rate); ``tflops``
    its best-shape rate (default: the profile's BF16 rate; fp8 matmuls run faster).
    """
    if min(m, n, k, batch) < 0 or itemsize <= 0:
        raise ValueError(f"gemm dims must be >= 0 and itemsize > 0, got m={m} n={n} k={k} "
                         f"batch={batch} itemsize={itemsize}")
    if min(m, n, k, batch) == 0:
        return hw.launch_us
    sms = max(hw.sm_count * sm_fraction, 1.0)
    per_sm = (tflops or hw.achieved_tflops) * 1e6 / hw.sm_count  # flops per us of one SM at best shape
    best, _ = _best_tile(m, n, k, batch, sms, per_sm, model)
    hbm = hw.achieved_hbm_gbps if hbm_gbps is None else hbm_gbps
    memory = itemsize * batch * (m * k + k * n + m * n) / (hbm * 1e3)
    return hw.launch_us + model.fixed_us + max(best, memory)


def _best_tile(m: int, n: int, k: int, batch: int, sms: float, per_sm: float,
               model: GemmModel) -> tuple[float, int]:
    """(compute time, waves) of the fastest of ``model.tiles`` on ``sms`` SMs."""
    best, best_waves = math.inf, 0
    for tm, tn, rate in model.tiles:
        waves = math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn) / sms)
        t = waves * 2.0 * tm * tn * (k + model.k_overhead) / (per_sm * rate)
        if t < best:
            best, best_waves = t, waves
    return best, best_waves


def gemm_waves(m: int, n: int, k: int, hw: HardwareProfile, *, batch: int = 1,
               model: GemmModel = DEFAULT_GEMM) -> int:
    """Waves of output tiles the matmul runs on every SM, at the tile ``gemm_time_us`` picks
    for the whole GPU (what the library sizes its kernel for)."""
    if min(m, n, k, batch) <= 0:
        return 0
    return _best_tile(m, n, k, batch, hw.sm_count, hw.achieved_tflops * 1e6 / hw.sm_count, model)[1]


def gemm_tflops(m: int, n: int, k: int, hw: HardwareProfile, *, batch: int = 1, itemsize: int = 2,
                model: GemmModel = DEFAULT_GEMM) -> float:
    """The achieved TFLOP/s the model predicts for one matmul (for reports and checks)."""
    return 2.0 * m * n * k * batch / gemm_time_us(m, n, k, hw, batch=batch, itemsize=itemsize, model=model) / 1e6


def memory_time_us(nbytes: float, hw: HardwareProfile, *, hbm_gbps: float | None = None) -> float:
    """A memory-bound kernel moving ``nbytes`` (read plus written)."""
    if nbytes < 0:
        raise ValueError(f"bytes must be >= 0, got {nbytes}")
    hbm = hw.achieved_hbm_gbps if hbm_gbps is None else hbm_gbps
    return hw.launch_us + nbytes / (hbm * 1e3)



# ------------------------------------------------------------------ grouped GEMMs (MoE)
#
# A grouped GEMM (a dropless MoE's experts: ``jax.lax.ragged_dot``, MegaBlocks, cuBLAS's
# grouped GEMM) runs ``groups`` matmuls ``[m_g, k] x [k, n]`` whose row counts m_g are the
# tokens routed to each expert, known only at run time. As one kernel it launches the
# output tiles of every group together (in waves over the SMs, ``gemm_time_us``'s model),
# but each group pads its rows to whole tiles and reads its own ``k x n`` weights, so its
# time depends on the group sizes, not only on their sum: a group of few rows is bound by
# reading its weights, and an imbalanced routing leaves the busiest expert's tiles running
# after the others finish. MegaBlocks (Gale et al., MLSys 2023, arXiv 2211.15841, fig. 7)
# measured its grouped (block-sparse) GEMMs at 98.6% of cuBLAS's batched GEMM throughput
# on A100 at Mixtral-like sizes (block size 128; groups padded to multiples of 128 rows),
# the measured cost of padding and group bookkeeping at large groups; at small groups the
# weight reads dominate, which the memory term below prices.
#
# What XLA compiles ``jax.lax.ragged_dot`` to is not this kernel: jaxlib 0.10.2's GPU
# pipeline (deviceless, H100 target) and jax 0.11.2 on a real H100 both rewrite it into
# one dense dot over every group (the rows masked per group and multiplied by all experts'
# weights: ``groups`` times the useful FLOPs), whose time does not depend on the group
# sizes (benchmarks/RESULTS.md, ``gpu_kernels``: skewed = balanced). The cost model prices
# that dense dot from the compiled HLO; this model prices a true grouped-GEMM kernel.

GROUPED_GEMM_EFFICIENCY = 0.986  # MegaBlocks' grouped GEMM / cuBLAS batched GEMM (A100)

# JAX's Pallas Mosaic-GPU grouped kernels (``models.grouped_gemm``, the tiles it compiles: 128 x
# 128 x 64, 4 pipelined steps) measured on one H200 (benchmarks/RESULTS.md, ``gpu_grouped_gemm``;
# jax 0.11.2): their rate over this module's tile model, by the 128-row blocks each group's
# weights serve. With 16 row blocks a group (Mixtral 8x7b's expert GEMMs, 2048 rows a group) the
# kernels ran at 0.79-0.87 of ``GROUPED_GEMM_EFFICIENCY``'s price (0.83 here, their median); with 4
# (64 experts top-4, 512 rows a group) at 0.49-0.51 (0.50): the fewer row blocks share a group's
# weights, the more of each tile's time goes to streaming its operands from L2 and HBM (about 5.6
# TB/s of tile operands at 4 blocks against 9.6 at 16). Between the two the efficiency follows
# log2 of the blocks; outside them it is held at the nearer measurement. Two measured shapes:
# a stand-in for a model of the operand traffic, which is not built.
PALLAS_GROUPED_EFFICIENCY = ((4.0, 0.50 * GROUPED_GEMM_EFFICIENCY), (16.0, 0.83 * GROUPED_GEMM_EFFICIENCY))
PALLAS_BLOCK_M = 128


def pallas_grouped_efficiency(group_rows: tuple[int, ...]) -> float:
    """The efficiency ``grouped_gemm_time_us`` takes for JAX's Pallas grouped kernels, from the
    mean 128-row blocks of a non-empty group (``PALLAS_GROUPED_EFFICIENCY``)."""
    rows = [m for m in group_rows if m > 0]
    if not rows:
        return GROUPED_GEMM_EFFICIENCY
    blocks = sum(rows) / len(rows) / PALLAS_BLOCK_M
    (b0, e0), (b1, e1) = PALLAS_GROUPED_EFFICIENCY
    if blocks <= b0:
        return e0
    if blocks >= b1:
        return e1
    return e0 + (e1 - e0) * math.log2(blocks / b0) / math.log2(b1 / b0)


def grouped_efficiency(group_rows: tuple[int, ...], hw: HardwareProfile) -> float:
    """The efficiency ``grouped_gemm_time_us`` takes for the grouped kernel ``hw``'s GPU runs:
    its measured rate over the plain matmul rate where the preset has one (Blackwell's CuTe
    kernel, ``grouped_gemm_tflops``), else JAX's Pallas kernels' (``pallas_grouped_efficiency``)."""
    if hw.grouped_gemm_tflops:
        return hw.grouped_gemm_tflops / hw.achieved_tflops
    return pallas_grouped_efficiency(group_rows)


def balanced_groups(rows: int, groups: int, imbalance: float = 1.0) -> tuple[int, ...]:
    """Row counts of ``groups`` groups summing to ``rows`` whose busiest group holds
    ``imbalance`` times the mean (>= 1); the others share the rest evenly."""
    if groups < 1 or rows < 0:
        raise ValueError(f"groups must be >= 1 and rows >= 0, got groups={groups} rows={rows}")
    if not 1.0 <= imbalance <= groups:
        raise ValueError(f"expert imbalance must be in 1..{groups} (the busiest expert's load over the "
                         f"mean), got {imbalance}")
    busiest = min(rows, round(rows / groups * imbalance))
    if groups == 1:
        return (rows,)
    rest = rows - busiest
    each, extra = divmod(rest, groups - 1)
    return (busiest, *(each + (1 if i < extra else 0) for i in range(groups - 1)))


def grouped_gemm_time_us(group_rows: tuple[int, ...], n: int, k: int, hw: HardwareProfile, *,
                         itemsize: int = 2, model: GemmModel = DEFAULT_GEMM,
                         efficiency: float = GROUPED_GEMM_EFFICIENCY) -> float:
    """Time of one grouped GEMM: group g is ``[group_rows[g], k] x [k, n]`` (us).

    The tiles of all groups share the SMs in waves, each group padded to whole tiles (the
    tile shape the library picks, as ``gemm_time_us``); the kernel cannot end before its
    longest group's tiles, which run one after another on the SMs they hold; and every
    group reads its own weights. ``efficiency``: the grouped kernel's rate over a plain
    GEMM's at large groups (MegaBlocks' measurement)."""
    if any(m < 0 for m in group_rows) or min(n, k) < 0:
        raise ValueError(f"grouped gemm dims must be >= 0, got rows={group_rows} n={n} k={k}")
    rows = [m for m in group_rows if m > 0]
    if not rows or not n or not k:
        return hw.launch_us
    per_sm = hw.achieved_tflops * 1e6 / hw.sm_count * efficiency
    best = math.inf
    for tm, tn, rate in model.tiles:
        tile_us = 2.0 * tm * tn * (k + model.k_overhead) / (per_sm * rate)
        col_tiles = math.ceil(n / tn)
        tiles = sum(math.ceil(m / tm) * col_tiles for m in rows)
        waves = math.ceil(tiles / hw.sm_count)
        # The busiest group: its tiles spread over at most all SMs, but a group of more
        # tiles than its share of SMs keeps them after the others are done.
        longest = max(math.ceil(math.ceil(m / tm) * col_tiles / max(hw.sm_count * m / sum(rows), 1.0))
                      for m in rows)
        best = min(best, max(waves, longest) * tile_us)
    memory = itemsize * sum(m * k + k * n + m * n for m in rows) / (hw.achieved_hbm_gbps * 1e3)
    return hw.launch_us + model.fixed_us + max(best, memory)


Matmul = tuple[int, int, int, int]  # (m, n, k, batch) of [m, k] x [k, n]


def transformer_matmuls(*, sequences: int, seq_len: int, hidden: int, heads: int, head_dim: int,
                        ffn: int, tp: int = 1) -> tuple[tuple[Matmul, ...], tuple[Matmul, ...], tuple[Matmul, ...]]:
    """The forward matmuls of one transformer layer on one tensor-parallel rank (Megatron's
    split: heads and FFN columns over ``tp``), as (attention projections QKV and output,
    attention core scores and context, MLP FC1 and FC2)."""
    tokens = sequences * seq_len
    width = heads * head_dim
    local_heads = heads // tp
    projections = ((tokens, 3 * width // tp, hidden, 1), (tokens, hidden, width // tp, 1))
    core = ((seq_len, seq_len, head_dim, sequences * local_heads),
            (seq_len, head_dim, seq_len, sequences * local_heads))
    mlp = ((tokens, ffn // tp, hidden, 1), (tokens, hidden, ffn // tp, 1))
    return projections, core, mlp


def backward_matmuls(forward: tuple[Matmul, ...]) -> tuple[Matmul, ...]:
    """Data and weight gradients of forward matmuls: ``[m, n] x [n, k]`` and ``[k, m] x [m, n]``."""
    return tuple(g for m, n, k, b in forward for g in ((m, k, n, b), (k, n, m, b)))


def matmuls_us(matmuls: tuple[Matmul, ...], hw: HardwareProfile, *, itemsize: int = 2) -> float:
    """Total time of matmuls run one after another."""
    return sum(gemm_time_us(m, n, k, hw, batch=b, itemsize=itemsize) for m, n, k, b in matmuls)


# ------------------------------------------------------------ library kernels by rate
#
# Kernels a program calls from a library (cuDNN's fused attention through Transformer
# Engine, cuBLASLt's fp8 matmuls) run at their own measured rates, not at the BF16
# matmul rate of the profile. Each rate is TFLOP/s counted the way its source counts
# FLOPs; ``lagom_jax.program.custom_calls`` counts a call's FLOPs the same way.


@dataclasses.dataclass(frozen=True)
class AttentionRates:
    """Dense TFLOP/s of cuDNN's flash attention (what Transformer Engine's fused attention
    runs on Hopper and Blackwell), forward and backward, for head dim 128 at long sequences.

    FLOPs are counted as FlashAttention's papers count them: forward ``4 b h s_q s_k d``,
    halved under a causal mask; backward 2.5 times the forward. ``source`` names the
    measurement.
    """

    forward: float
    backward: float
    source: str


# H100 SXM5, cuDNN 9 (FlashAttention-3, Shah et al., arXiv 2407.08608, figures 5-6: head
# dim 128, 16k tokens per batch, hidden 2048): forward causal 529 TFLOP/s at sequence 8k
# (518 at 4k, 539 at 16k); backward 518 at 8k (the paper's backward figure has no causal
# variant: the non-causal rate stands in). H200 is the same chip with more HBM: the same rates.
# B200, cuDNN 9.13 (FlashAttention-4, arXiv 2603.05451: "up to 1.3x over cuDNN 9.13" at a
# peak of 1613 TFLOP/s BF16 forward): 1613 / 1.3 = 1241 forward; no cuDNN backward on
# B200 was published: the H100's backward/forward ratio (518/529) stands in (assumption).
ATTENTION_RATES: dict[str, AttentionRates] = {
    "hopper": AttentionRates(529.0, 518.0, "cuDNN 9 on H100 SXM5 (FlashAttention-3 paper, figs 5-6)"),
    "blackwell": AttentionRates(1241.0, round(1241.0 * 518.0 / 529.0, 1),
                                "cuDNN 9.13 on B200 (FlashAttention-4 paper: FA4 1613 = 1.3x cuDNN); "
                                "backward from H100's ratio (assumption)"),
}

# fp8 matmul rate over the BF16 rate, as XLA's programs get it: 1.7 on Hopper, calibrated on
# the one step pair XLA publishes (Llama 3.1 8B on one node of 8 H100: 1.370 s in bf16,
# openxla/xla PR #31030; 1.095 s in fp8, PR #31375; 1.25x for the whole step). The llama
# family's step built as MaxText's fp8 path (models/fp8.py: per-device batch 1, sequence 8192,
# remat minimal_flash, fsdp=8) is predicted 1.25x faster than its bf16 step at 1.7 (1.10x at
# 1.2, 1.32x at 2.0; benchmarks/measured/workloads.py --part fp8). Published kernel rates agree: a bare
# cuBLASLt fp8 GEMM reaches 1,599-1,630 TFLOP/s at 8192^3 on H100 (2.0x the profile's 792;
# public cross-check report, gitea.d-robotics.cc/han.zhao/test_gpu_scripts,
# reports_cublaslt_fp8_crosscheck_20260524.md), best-shape torch matmuls 1.77x (stas00/
# ml-engineering MAMF table), Transformer Engine's GEMMs of a 5B model 1.92x on operands already
# in fp8 and 1.69x with delayed scaling's casts in the step (NVIDIA/TransformerEngine docs/
# features/low_precision_training/speedups.rst; lagom_jax/data/KERNELS_SOURCES.md). Measured
# through XLA's ``__cublas$lt$matmul$f8`` on an H200 with jax 0.11.2 (benchmarks/RESULTS.md
# gpu_kernels_moe_fp8): 1.77-2.05x BF16 side by side on fp8 operands at Llama 70B and 405B layer
# shapes, and MaxText's delayed-scaling path 1.58-1.77x forward+backward with its casts; in a
# llama3-8b fp8 step the GEMMs ran 1.94x the preset's BF16 rate, so at 1.7 they are priced 14%
# slow while the casts beside them are 16% fast (the step's sum is right within 0.5 ms). An
# earlier 1.2x (H100) was a plain fp8 ``lax.dot`` at XLA's default flags, which compile it to a
# slower kernel. The casts, amax reductions and history updates of delayed scaling are separate
# fusions in the module and are priced as such, not folded into this ratio. Blackwell: the best-shape
# matmul rates measured on a B200, fp8 e4m3 3432.5 over bf16 1745.0 TFLOP/s (stas00/ml-engineering
# compute/accelerator/README.md, MAMF table; GB200 3615.6 / 1822.0 = 1.98, XLA's own B200 table
# at 4096^3 2765.0 / 1416.9 = 1.95); no fp8 step on Blackwell to check it against. GPUs before
# Hopper have no fp8 tensor cores (1.0).
FP8_RATE_RATIO: dict[str, float] = {"hopper": 1.7, "blackwell": round(3432.5 / 1745.0, 2)}


def attention_rates(hw: HardwareProfile) -> AttentionRates:
    """The cuDNN attention rates of ``hw``'s GPU; where none was measured, the profile's
    fused-attention rate (FlashAttention-2 fwd+bwd), else its matmul rate, for both."""
    rates = ATTENTION_RATES.get(hw.arch)
    if rates is not None:
        return rates
    rate = hw.attention_tflops or hw.achieved_tflops
    why = "FlashAttention-2 fwd+bwd" if hw.attention_tflops else "the best-shape matmul rate"
    return AttentionRates(rate, rate, f"no cuDNN attention measurement for {hw.gpu}: {why}")


def fp8_tflops(hw: HardwareProfile) -> float:
    """The achieved fp8 matmul rate of ``hw`` (``FP8_RATE_RATIO`` x the BF16 rate)."""
    return hw.achieved_tflops * FP8_RATE_RATIO.get(hw.arch, 1.0)


def kernel_tflops(kernel: str, hw: HardwareProfile) -> float | None:
    """The rate a library kernel named by ``custom_calls`` runs at on ``hw`` (None: no own
    rate, the cost model's default applies)."""
    if kernel == "attention-forward":
        return attention_rates(hw).forward
    if kernel == "attention-backward":
        return attention_rates(hw).backward
    if kernel == "fp8-matmul":
        return fp8_tflops(hw)
    return None


# GB/s one way over the GPU's host link where a preset has no measured one
# (``HardwareProfile.host_link_gbps``): PCIe Gen5 x16 on H100/H200 SXM ("PCIe Gen5: 128 GB/s",
# both ways, NVIDIA H100 datasheet) and B200 (HGX B200: PCIe Gen5 x16), Gen4 x16 on A100 SXM
# ("PCIe Gen4: 64 GB/s"). Datasheet rates; transfers reach less.
HOST_LINK_GBPS: dict[str, float] = {"ampere": 32.0, "hopper": 64.0, "blackwell": 64.0}


def host_link_gbps(hw: HardwareProfile) -> float:
    """The host link's one-way rate: the preset's measured one, else the arch's datasheet PCIe."""
    return hw.host_link_gbps or HOST_LINK_GBPS.get(hw.arch, 16.0)


def host_transfer_us(nbytes: float, hw: HardwareProfile) -> float:
    """Time of ``nbytes`` moved one way between HBM and host memory over the host link."""
    return nbytes / (host_link_gbps(hw) * 1e3)
