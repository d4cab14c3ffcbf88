"""Custom calls: which ones the installed XLA cannot compile, and what each one costs.

A module from XLA's benchmark suite (openxla/xla ``xla/tools/benchmarks/hlo/``) or a
user's dump calls kernels XLA does not own: Transformer Engine's fused attention through
XLA's typed FFI (``te_fused_attn_forward_ffi`` / ``te_fused_attn_backward_ffi``), whose
handlers live in Transformer Engine's own library. jaxlib has none of them, so XLA's GPU
pipeline stops at code generation ("No FFI handler registered"). XLA's debug option
``xla_gpu_mock_custom_calls`` ("Replace custom calls with noop operations",
``xla/debug_options_flags.cc``) lets the thunk emitter skip a custom call whose handler
it cannot find (``ThunkEmitter::EmitCustomCallThunk`` in
``xla/service/gpu/thunk_emitter.cc``): the rest of the pipeline (fusion, the collective
passes, the latency-hiding scheduler) runs as on the GPUs, and the call stays in the
compiled module with its operands, results and backend config. The option is for the
compile *here* only (:data:`MOCK_OPTION`): on a GPU it would turn the user's attention
into a no-op, so it never reaches a Plan's flags, ``launch.sh`` or the decorator. Before
XLA sees them, such calls lose their pinned operand layouts
(``hlo_compile.portable_text``): jax 0.12's plugin cannot take a custom call with layouts,
and a mocked call's layouts decide nothing.

What the mocked call costs is then priced from the call itself (:func:`price`):

* **TE fused attention** (:class:`AttentionCall`): batch, heads, kv groups, sequence
  lengths, head dims, mask, dropout and direction from its backend config and operand
  shapes; FLOPs as FlashAttention's papers count them (forward ``4 b h s_q s_k d``, half
  of it under a causal mask; backward 2.5x the forward); timed at cuDNN's measured flash
  attention rate on the GPU (``kernels.ATTENTION_RATES``), since TE runs cuDNN's kernels.
* **XLA's own calls** that remain after its pipeline (cuBLAS and cuBLASLt matmuls, fp8
  ones included, cuDNN convolutions and norms, XLA's TopK kernel, Triton kernels): priced
  by ``graph`` as every other kernel.
* **Anything else** (a vendor's FFI kernel, a jaxlib solver, a jax-triton or Mosaic GPU
  kernel) is *unpriced*: timed by the bytes it reads and writes only, and named as
  unpriced in the Plan and the prediction (:func:`unpriced`), never silently free. Only
  those without a handler here are mocked for the compile.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Iterable

from lagom_jax.program import hlo

__all__ = ["AttentionCall", "CONDITIONAL_WITH_COLLECTIVES", "FUSED_PART", "MOCK_OPTION", "Priced", "StandIn", "TE_BACKWARD", "TE_FORWARD", "UnpricedWarning",
           "attention_bytes", "attention_call", "custom_call_target", "describe_stand_ins", "describe_unpriced",
           "needs_mock", "price", "stand_ins", "unpriced"]

# The compile-time option that stands in for custom calls without a handler.
MOCK_OPTION = "xla_gpu_mock_custom_calls"

TE_FORWARD = "te_fused_attn_forward_ffi"
TE_BACKWARD = "te_fused_attn_backward_ffi"
_TE_ATTENTION = (TE_FORWARD, TE_BACKWARD)

# Targets XLA's GPU pipeline handles itself, before or during code generation: the SPMD
# partitioner's and Shardy's markers, host offloading, TopK (rewritten to XLA's TopK kernel
# or a sort), and the library calls its own rewriters write. Any other target needs a
# handler registered from outside (an FFI library such as Transformer Engine's).
_XLA_OWN = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "CustomSPMDPartitioning",
    "MoveToHost", "MoveToDevice", "annotate_device_placement", "TopK", "LayoutConstraint",
    "InspectSharding", "X64Combine", "X64SplitLow", "X64SplitHigh", "PadToStatic",
    "SliceToDynamic", "AllocateBuffer", "AssumeGatherIndicesInBound", "xla_python_gpu_callback",
    "xla_ffi_python_gpu_callback", "xla_ffi_partitioned_python_gpu_callback",
})
_XLA_OWN_PREFIX = ("__cublas$", "__cudnn$", "__gpu$", "xla.sdy.", "xla.gpu.", "__triton")
# Targets jaxlib's CUDA/ROCm plugins register handlers for (jaxlib/gpu: the PRNG, solvers,
# sparse kernels, jax-triton and Mosaic GPU calls): they compile here, no mock needed.
_JAXLIB_PREFIX = ("cu_", "cusolver_", "cublas_", "cusparse_", "hip_", "hipsolver_", "hipsparse_",
                  "triton_kernel_call", "mosaic_gpu")
# Calls whose bytes are their cost (memory-bound elementwise kernels): priced by ``graph``.
_BYTES_ONLY = frozenset({"cu_threefry2x32", "hip_threefry2x32"})

# Custom calls XLA's pipeline writes that ``graph`` prices as kernels (matmuls by shape,
# the rest by FLOPs and bytes): not unpriced.
_PRICED_BY_GRAPH_PREFIX = ("__cublas$", "__cudnn$", "__gpu$", "__triton")
_PRICED_BY_GRAPH = frozenset({"TopK"})

# Transformer Engine's NVTE_Mask_Type (transformer_engine/common/include/transformer_engine/
# fused_attn.h): 2, 3 causal from the top left; 4, 5 causal from the bottom right.
_CAUSAL_MASKS = frozenset({2, 3, 4, 5})
_MASK_NAMES = {0: "none", 1: "padding", 2: "causal", 3: "padding+causal", 4: "causal (bottom right)",
               5: "padding+causal (bottom right)", 6: "arbitrary"}
_MLIR_ENTRY = re.compile(r"(\w+)\s*=\s*(true|false|-?[0-9.eE+-]+)(?:\s*:\s*\w+)?")


def custom_call_target(inst: hlo.Instruction) -> str:
    """The ``custom_call_target`` of a custom call ("" for any other instruction)."""
    if inst.opcode != "custom-call":
        return ""
    return inst.attributes.get("custom_call_target", "").strip().strip('"')


def needs_mock(target: str) -> bool:
    """Whether XLA's GPU pipeline needs a handler from outside for ``target``."""
    return (bool(target) and target not in _XLA_OWN
            and not target.startswith(_XLA_OWN_PREFIX + _JAXLIB_PREFIX))


@dataclasses.dataclass(frozen=True)
class StandIn:
    """Calls of one target that the compile here stood in for (mocked), and why."""

    target: str
    count: int
    why: str


def _custom_calls(module: hlo.Module) -> Iterable[hlo.Instruction]:
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode == "custom-call":
                yield inst


def stand_ins(module: hlo.Module) -> tuple[StandIn, ...]:
    """The custom calls of ``module`` that the installed XLA cannot compile, by target."""
    counts = Counter(t for t in map(custom_call_target, _custom_calls(module)) if needs_mock(t))
    out = []
    for target, n in sorted(counts.items()):
        if target in _TE_ATTENTION:
            why = ("Transformer Engine's fused attention through XLA's FFI; jaxlib registers no "
                   "handler for it; priced as cuDNN flash attention")
        else:
            why = "no handler registered in the installed jaxlib; unpriced (timed by its bytes only)"
        out.append(StandIn(target, n, why))
    return tuple(out)


def describe_stand_ins(found: tuple[StandIn, ...]) -> str:
    """One line for a Plan's decisions."""
    calls = "; ".join(f"{s.target} x{s.count}: {s.why}" for s in found)
    return (f"compiled here with {MOCK_OPTION}=true (compile-time only, never in the plan's "
            f"flags): {calls}")


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One Transformer Engine fused-attention call, as its backend config and shapes say."""

    backward: bool
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    qk_dim: int
    v_dim: int
    mask: int
    dropout: float
    window_left: int = -1

    @property
    def causal(self) -> bool:
        return self.mask in _CAUSAL_MASKS

    @property
    def pairs(self) -> float:
        """Query-key pairs the kernel computes per (batch, head): all of them, about half
        under a causal mask (cuDNN skips the tiles above the diagonal), fewer with a
        sliding window."""
        full = float(self.q_len) * self.kv_len
        if self.window_left >= 0:
            full = min(full, float(self.q_len) * (self.window_left + 1))
        return full / 2.0 if self.causal and self.window_left < 0 else full

    @property
    def forward_flops(self) -> float:
        """``2 b h pairs (d_qk + d_v)``: the two matmuls ``q k^T`` and ``p v``."""
        return 2.0 * self.batch * self.heads * self.pairs * (self.qk_dim + self.v_dim)

    @property
    def flops(self) -> float:
        """FLOPs of this call: the forward's, or 2.5x it for the backward (five matmuls:
        ``q k^T`` again, ``dv``, ``dp``, ``dq``, ``dk``)."""
        return self.forward_flops * (2.5 if self.backward else 1.0)

    @property
    def kernel(self) -> str:
        return "attention-backward" if self.backward else "attention-forward"

    def describe(self) -> str:
        kv = f", {self.kv_heads} kv heads" if self.kv_heads != self.heads else ""
        return (f"{'backward' if self.backward else 'forward'} b={self.batch} h={self.heads}{kv} "
                f"s_q={self.q_len} s_kv={self.kv_len} d={self.qk_dim} mask={_MASK_NAMES.get(self.mask, self.mask)}"
                + (f" dropout={self.dropout:g}" if self.dropout else ""))


def _mlir_dict(raw: str) -> dict[str, str]:
    """``{attn_heads = 32 : i64, is_training = true, ...}`` as {name: value text}."""
    return {k: v for k, v in _MLIR_ENTRY.findall(raw)}


def attention_call(inst: hlo.Instruction, operands: list[hlo.Shape]) -> AttentionCall | None:
    """The :class:`AttentionCall` of a TE fused-attention custom call (None for any other
    instruction). Sizes come from the backend config; where it lacks one, from q and k
    (``[b, s, h, d]``, TE's BSHD layouts)."""
    target = custom_call_target(inst)
    if target not in _TE_ATTENTION:
        return None
    cfg = _mlir_dict(inst.attributes.get("backend_config", ""))
    q = operands[0] if operands and not operands[0].is_tuple and len(operands[0].dims) == 4 else None
    k = operands[1] if len(operands) > 1 and not operands[1].is_tuple and len(operands[1].dims) == 4 else None

    def num(key: str, fallback: float) -> float:
        try:
            return float(cfg[key])
        except (KeyError, ValueError):
            return fallback

    b, s_q, h, d = q.dims if q else (1, 0, 0, 0)
    s_k, h_k = (k.dims[1], k.dims[2]) if k else (s_q, h)
    heads = int(num("attn_heads", h))
    call = AttentionCall(
        backward=target == TE_BACKWARD, batch=int(num("input_batch", b)), heads=heads,
        kv_heads=int(num("num_gqa_groups", h_k)), q_len=int(num("q_max_seqlen", s_q)),
        kv_len=int(num("kv_max_seqlen", s_k)), qk_dim=int(num("qk_head_dim", d)),
        v_dim=int(num("v_head_dim", num("qk_head_dim", d))), mask=int(num("mask_type", 0)),
        dropout=num("dropout_probability", 0.0), window_left=int(num("window_size_left", -1)))
    if min(call.batch, call.heads, call.q_len, call.kv_len, call.qk_dim) <= 0:
        return None
    return call


def attention_bytes(call: AttentionCall, itemsize: int = 2) -> float:
    """HBM bytes of one call: q, k, v (and o, do) read, outputs written, the softmax
    statistics (f32 per query row and head) once; the workspace TE asks XLA for is
    scratch, not traffic. k/v re-reads per query tile are assumed to hit L2."""
    q = call.batch * call.q_len * call.heads * call.qk_dim
    kv = call.batch * call.kv_len * call.kv_heads * (call.qk_dim + call.v_dim)
    o = call.batch * call.q_len * call.heads * call.v_dim
    stats = 4.0 * call.batch * call.heads * call.q_len
    if call.backward:  # read q, k, v, o, do, stats; write dq, dk, dv
        return itemsize * (2 * q + 2 * kv + 2 * o) + stats
    return itemsize * (q + kv + o) + stats


@dataclasses.dataclass(frozen=True)
class Priced:
    """What ``graph`` charges for one custom call: FLOPs, bytes and the kernel whose rate
    times it ("" for the default rate; "unpriced" for a call no model knows), and the
    matmul shape it runs where it runs one."""

    flops: float
    bytes: float
    kernel: str
    gemm: tuple[int, ...] = ()


# The grouped-GEMM kernels of ``models.grouped_gemm``: JAX's Pallas kernels (Mosaic-GPU custom
# calls) on Hopper, the typed-FFI call standing in for a Blackwell CuTe kernel on sm_100; their
# op_name carries the scope they run under. Their last two operands are the rows [T, K] (the
# weights' gradient: the rows [T, M]) and the other side, the first the group sizes [G]; the
# output's last dimension is N. FLOPs 2 T K N either way (T the rows sorted by group); the
# shape (groups, rows of the busiest group, N, K) times them (``kernels.grouped_gemm_time_us``),
# balanced until ``graph.with_group_load`` says otherwise. T is the buffer's rows; for the FFI
# (Blackwell CuTe) kernels, which run the groups' tiles only, fewer where the op_name says how many
# its groups hold (a scope ``routed_rows_R``, models.grouped_gemm): a receive buffer sized for
# every source. JAX's Hopper kernels spend a tile's work on every row block past the groups.
GROUPED_GEMM = "grouped-gemm"
GROUPED_GEMM_SCOPE = "grouped_gemm"
_MOSAIC_PREFIX = "mosaic_gpu"
_ROUTED = "routed_rows_"  # models.grouped_gemm.ROUTED_ROWS
# models.grouped_gemm.FFI_FORWARD and FFI_WEIGHT_GRAD (the model layer does not import this one).
GROUPED_GEMM_FFI = ("lagom_grouped_gemm", "lagom_grouped_gemm_wgrad")


def grouped_gemm(inst: hlo.Instruction, operands: list[hlo.Shape]) -> Priced | None:
    """The price of one of the grouped-GEMM kernels (None: ``inst`` is not one)."""
    target = custom_call_target(inst)
    if (not (target.startswith(_MOSAIC_PREFIX) or target in GROUPED_GEMM_FFI) or len(operands) < 3
            or GROUPED_GEMM_SCOPE not in re.split(r"[/()]", inst.metadata().get("op_name", ""))):
        return None
    groups, (lhs, other), out = operands[0].dims, operands[-2:], inst.shape
    if len(groups) != 1 or len(lhs.dims) != 2 or out.is_tuple or not out.dims:
        return None
    rows, k = lhs.dims
    n = out.dims[-1]
    routed = [int(t[len(_ROUTED):]) for t in re.split(r"[/()]", inst.metadata().get("op_name", ""))
              if t.startswith(_ROUTED) and t[len(_ROUTED):].isdigit()]
    if routed and target in GROUPED_GEMM_FFI:  # JAX's Hopper kernels compute the padding too (docs/moe.md)
        rows = min(rows, routed[-1])
    return Priced(2.0 * rows * k * n, float(out.bytes + lhs.bytes + other.bytes), GROUPED_GEMM,
                  (groups[0], math.ceil(rows / max(groups[0], 1)), n, k))


def price(inst: hlo.Instruction, operands: list[hlo.Shape]) -> Priced | None:
    """The price of a custom call ``graph`` has no other rule for; None where ``graph``'s
    own rules apply (XLA's library calls, Triton kernels)."""
    target = custom_call_target(inst)
    if not target or target.startswith(_PRICED_BY_GRAPH_PREFIX) or target in _PRICED_BY_GRAPH:
        return None
    grouped = grouped_gemm(inst, operands)
    if grouped is not None:
        return grouped
    call = attention_call(inst, operands)
    if call is not None:
        itemsize = max(1, (hlo.dtype_bits(operands[0].dtype) or 16) // 8) if operands else 2
        return Priced(call.flops, attention_bytes(call, itemsize), call.kernel)
    if target in _XLA_OWN or target.startswith(_XLA_OWN_PREFIX) or target in _BYTES_ONLY:
        return None  # the partitioner's and host offloading's markers, memory-bound kernels
    # No model for its FLOPs: a vendor FFI kernel, a jaxlib solver, a jax-triton or Mosaic kernel.
    return Priced(0.0, float(inst.shape.bytes + sum(s.bytes for s in operands)), "unpriced")


# The kernel tag of a kernel XLA compiles out of work that stands in for one fused kernel
# priced by its other parts (``graph``'s fused attention blocks: their softmax and masks run
# inside the fused kernel's matmuls): it takes no time of its own.
FUSED_PART = "fused-part"


class UnpricedWarning(UserWarning):
    """A prediction includes custom calls no model prices (timed by their bytes only)."""


# What ``graph`` names a conditional of several branches whose branches hold collectives: it
# is one compute task at its most expensive branch's FLOPs, and none of those collectives is
# priced (a conditional of one branch is read as a call and fully priced).
CONDITIONAL_WITH_COLLECTIVES = "conditional (collectives in its branches)"


def describe_unpriced(missing: dict[str, int]) -> str:
    """One line naming the unpriced calls of a prediction."""
    rest = dict(missing)
    conditionals = rest.pop(CONDITIONAL_WITH_COLLECTIVES, 0)
    parts = []
    if rest:
        calls = ", ".join(f"{target} x{n}" for target, n in sorted(rest.items()))
        parts.append(f"{calls}: no cost model knows these custom calls; each is timed by the bytes it "
                     "reads and writes only, so the predicted step is a lower bound for their share")
    if conditionals:
        parts.append(f"{conditionals} conditional(s) of several branches hold collectives: each is priced as its "
                     "most expensive branch's compute and its collectives are not priced at all")
    return "; ".join(parts)


def unpriced(tasks: Iterable) -> dict[str, int]:
    """{target: instructions} of the tasks of a StepGraph priced as "unpriced" (an unrolled
    loop's copies of one instruction count once)."""
    seen = {(t.custom_call or t.name, t.name) for t in tasks if t.kernel == "unpriced"}
    return dict(Counter(target for target, _ in seen))
