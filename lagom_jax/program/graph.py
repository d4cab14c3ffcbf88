"""StepGraph: the tasks of one training step, in schedule order.

A StepGraph is what every later stage works on: the passes rewrite it, the simulator
replays it on a HardwareProfile, the search evaluates candidates on it. It is built from
the entry computation of an HLO module (``from_module``) and holds only what the cost
model needs: FLOPs and bytes of compute, kind / bytes / groups of collectives, and the
data dependencies between them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
from typing import Literal, NamedTuple

from lagom_jax.program import custom_calls, hlo

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
TaskKind = Literal[
    "compute", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"
]


@dataclasses.dataclass(frozen=True)
class Task:
    """One unit of work on one device.

    ``bytes`` follows NCCL's ``nBytes`` convention for collectives: the buffer size for
    all-reduce, all-to-all and collective-permute; the *total* (gathered) size for
    all-gather and the total (unscattered) input size for reduce-scatter. For compute
    tasks it is the bytes read plus written.
    """

    id: int
    name: str
    kind: TaskKind
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = ""
    opcode: str = ""
    deps: tuple[int, ...] = ()
    # Product of the known trip counts of the enclosing while loops (1 at top level).
    # When loops are unrolled each copy keeps this number and gets its ``iteration``.
    trip_count: int = 1
    iteration: int = 0
    # The HLO computation the instruction sits in, as the path of computation names from
    # the entry ("main/while_body"): a while body or called computation adds its name. XLA's
    # combiners merge collectives of one computation only, and there a while or call is
    # one instruction.
    computation: str = ""
    # The instruction's position in its computation's post order as XLA walks it
    # (``HloComputation::MakeInstructionPostOrder``: depth first from each instruction
    # without users, first operand first), the order XLA's combiners visit; -1 if unknown.
    post_order: int = -1
    # Collectives only.
    groups: tuple[tuple[int, ...], ...] = ()
    # all-reduce / reduce-scatter: the opcode at the root of the reduction computation
    # (``to_apply``), e.g. "add" or "maximum"; collectives of different reductions never merge.
    reduction: str = ""
    # collective-permute: (source, target) pairs.
    pairs: tuple[tuple[int, int], ...] = ()
    # Where the compiled schedule waited for this collective: the id of the first compute
    # task after its ``-done`` (async pairs) or after the collective itself (synchronous
    # ones), or None when the HLO gives no such point.
    done_before: int | None = None
    # Whether XLA emitted it as an async pair (``*-start``/``*-done`` or ``async-start``).
    is_async: bool = False
    # Compute only: (batch, m, n, k) of the matmul the kernel runs (a dot, a cuBLAS call,
    # or the largest dot of a fusion), so the cost model can time it by shape; () if none.
    gemm: tuple[int, int, int, int] = ()
    # Compute only: a fused attention kernel (flash attention), which the cost model times
    # at the hardware's measured fused-attention rate rather than its matmul rate.
    fused_attention: bool = False
    # Compute only: a library kernel with its own measured rate ("attention-forward",
    # "attention-backward", "fp8-matmul"; ``kernels.kernel_tflops``), or "unpriced": a
    # custom call no model knows, timed by its bytes only and named in the Plan
    # (``custom_calls``), or "host-transfer": an async copy between HBM and host memory
    # (``host_transfers``), timed by its HBM side. "": the cost model's own rules.
    # Collectives: ``TRITON_COLLECTIVE`` for one XLA runs as its own Triton kernel inside a
    # collective fusion rather than through NCCL; ``RAGGED_ALL_TO_ALL`` for a dropless MoE's
    # exchange (NCCL's grouped send/recv); "" for NCCL's other collectives.
    kernel: str = ""
    # Compute only: the custom call's target ("" for any other instruction).
    custom_call: str = ""

    @property
    def itemsize(self) -> int:
        """Bytes per element of the task's dtype (2 when unknown or sub-byte)."""
        bits = hlo.dtype_bits(self.dtype) if self.dtype else None
        return max(1, bits // 8) if bits else 2

    @property
    def is_collective(self) -> bool:
        return self.kind != "compute"

    def evolve(self, **changes: object) -> Task:
        """This task with ``changes``: ``dataclasses.replace`` without re-running the
        constructor, for the passes and the search, which copy tasks by the ten thousand."""
        unknown = changes.keys() - _TASK_FIELDS
        if unknown:
            raise TypeError(f"Task has no field(s) {sorted(unknown)}")
        new = object.__new__(Task)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        if not _SHAPE_FIELDS.isdisjoint(changes):
            new.__dict__.pop(_SHAPES, None)  # its collective shape is not this task's
        return new

    def piece(self, name: str, parts: int) -> Task:
        """One of ``parts`` equal pieces of this task, named ``name``: FLOPs and bytes
        divided, and a matmul's shape cut along its larger output dimension, so that the
        cost model times the piece's own matmul and not the whole one ``parts`` times."""
        if parts < 1:
            raise ValueError(f"{self.name}: parts must be >= 1, got {parts}")
        gemm = self.gemm
        if gemm:
            b, m, n, k = gemm
            gemm = (b, math.ceil(m / parts), n, k) if m >= n else (b, m, math.ceil(n / parts), k)
        return dataclasses.replace(self, name=name, flops=self.flops / parts, bytes=self.bytes / parts, gemm=gemm)

    def ranks(self, num_devices: int) -> int:
        """Ranks in one of the collective's groups: the one rule for a group's size.

        HLO's empty ``replica_groups`` mean every one of ``num_devices`` devices takes part;
        a collective-permute moves between two ranks.
        """
        if self.groups:
            return len(self.groups[0])
        if self.pairs:
            return 2
        return max(num_devices, 1)

    def crosses_nodes(self, gpus_per_node: int) -> bool:
        """Whether any group (or permute pair) spans devices on different nodes."""
        if gpus_per_node <= 0:
            raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node}")
        sets = list(self.groups) + [tuple(p) for p in self.pairs]
        return any(len({d // gpus_per_node for d in g}) > 1 for g in sets)

    def nodes_spanned(self, gpus_per_node: int) -> int:
        """The largest number of distinct nodes any one group touches (1 if none)."""
        if gpus_per_node <= 0:
            raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node}")
        sets = list(self.groups) + [tuple(p) for p in self.pairs]
        return max((len({d // gpus_per_node for d in g}) for g in sets), default=1)


_TASK_FIELDS = frozenset(f.name for f in dataclasses.fields(Task))
# What ``collective_shape`` reads of a task, and where a task keeps the shapes it was asked
# for (per device count and node size), beside its fields: not one of them, so equality,
# hashing and ``repr`` ignore it, and ``evolve`` drops it when one of these fields changes.
_SHAPE_FIELDS = frozenset({"kind", "bytes", "groups", "pairs"})
_SHAPES = "_collective_shapes"


class CollectiveShape(NamedTuple):
    """A collective as the cost model sizes it."""

    kind: str
    bytes: float
    ranks: int
    nodes: int


def collective_shape(task: Task, num_devices: int, gpus_per_node: int) -> CollectiveShape:
    """(kind, bytes, ranks, nodes spanned) of ``task`` in a step over ``num_devices``.

    Kept in the task: the search asks for it hundreds of thousands of times, and at
    thousands of devices hashing a task's replica groups to look it up elsewhere cost
    more than the simulation around it (52 us a call for the groups of 2,048 devices).
    """
    memo = task.__dict__.get(_SHAPES)
    if memo is None:
        memo = {}
        object.__setattr__(task, _SHAPES, memo)
    key = (num_devices, gpus_per_node)
    shape = memo.get(key)
    if shape is None:
        shape = _shape(task.kind, float(task.bytes), task.groups, task.pairs, num_devices, gpus_per_node)
        if task.kernel == RAGGED_ALL_TO_ALL:  # priced as its own kind (``cost.RAGGED``)
            shape = shape._replace(kind=RAGGED_ALL_TO_ALL)
        memo[key] = shape
    return shape


@functools.lru_cache(maxsize=1 << 14)
def _shape(kind: str, nbytes: float, groups: tuple[tuple[int, ...], ...], pairs: tuple[tuple[int, int], ...],
           num_devices: int, gpus_per_node: int) -> CollectiveShape:
    t = Task(0, "", kind, bytes=nbytes, groups=groups, pairs=pairs)  # type: ignore[arg-type]
    n = t.ranks(num_devices)
    if groups or pairs:
        nodes = t.nodes_spanned(gpus_per_node)
    else:  # every device takes part
        nodes = math.ceil(n / gpus_per_node)
    return CollectiveShape(kind, nbytes, n, min(nodes, n))


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """Tasks in schedule order; ``tasks[i].id == i`` and deps point backwards."""

    name: str
    tasks: tuple[Task, ...]
    num_devices: int = 1

    def __post_init__(self) -> None:
        for i, t in enumerate(self.tasks):
            if t.id != i:
                raise ValueError(f"task {t.name!r} has id {t.id}, expected {i}")
            bad = [d for d in t.deps if not 0 <= d < i]
            if bad:
                raise ValueError(f"task {t.name!r} (id {i}) depends on later/unknown tasks {bad}")

    @property
    def collectives(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.is_collective)

    @property
    def compute_tasks(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if not t.is_collective)

    def shape(self, task: Task, gpus_per_node: int) -> CollectiveShape:
        """(kind, bytes, ranks, nodes spanned) of a collective of this step.

        Kept in the task (``collective_shape``): the search asks again for every copy of a
        task it makes.
        """
        return collective_shape(task, self.num_devices, gpus_per_node)

    @property
    def total_flops(self) -> float:
        return sum(t.flops for t in self.tasks)

    @functools.cached_property
    def content_hash(self) -> str:
        """SHA-256 of the graph's ``repr`` (names included): computed once, as a step of
        thousands of devices takes about a second to print."""
        return hashlib.sha256(repr(self).encode()).hexdigest()

    @functools.cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """``consumers[i]``: ids of the tasks that depend on task i, ascending."""
        out: list[list[int]] = [[] for _ in self.tasks]
        for t in self.tasks:
            for d in t.deps:
                out[d].append(t.id)
        return tuple(tuple(c) for c in out)


# ----------------------------------------------------------------------------- building

# Ops that move no data of their own: they only rename, bundle or unbundle values, so they
# are not tasks; dependencies flow through them to the real producers.
_TRIVIAL_OPCODES = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
    "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
    "async-update", "get-dimension-size", "set-dimension-size",
})  # fmt: skip
# Opcodes XLA's HloCostAnalysis charges as one flop per output element.
_ELEMENTWISE_FLOP_OPCODES = frozenset({
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power",
    "atan2", "and", "or", "xor", "not", "negate", "abs", "sign", "compare", "select",
    "clamp", "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
    "logistic", "sqrt", "rsqrt", "cbrt", "sine", "cosine", "tan", "erf", "floor",
    "ceil", "round-nearest-even", "round-nearest-afz", "is-finite", "shift-left",
    "shift-right-logical", "shift-right-arithmetic", "popcnt", "clz", "real", "imag",
})  # fmt: skip
_REDUCING_OPCODES = frozenset({
    "reduce", "reduce-window", "all-reduce", "reduce-scatter", "scatter", "select-and-scatter",
})  # fmt: skip
_COLLECTIVE_START = {
    "all-reduce-start": "all-reduce",
    "all-gather-start": "all-gather",
    "collective-permute-start": "collective-permute",
    # Newer XLA gives reduce-scatter and all-to-all their own async pair too.
    "reduce-scatter-start": "reduce-scatter",
    "all-to-all-start": "all-to-all",
    "ragged-all-to-all-start": "all-to-all",
}
_COLLECTIVE_DONE = frozenset({
    "all-reduce-done", "all-gather-done", "collective-permute-done", "reduce-scatter-done",
    "all-to-all-done", "ragged-all-to-all-done", "async-done",
    # Async pairs of non-collectives (host offloading's transfers): the start is the task.
    "fusion-done", "copy-done",
})  # fmt: skip
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")


def _dot_flops(inst: hlo.Instruction, lhs: hlo.Shape, result: hlo.Shape) -> float:
    """2 × result elements × contracted size (XLA HloCostAnalysis counts an FMA as 2)."""
    contracting = inst.int_list("lhs_contracting_dims")
    return 2.0 * result.elements * _contracted(inst, lhs, contracting)


def _contracted(inst: hlo.Instruction, lhs: hlo.Shape, dims: tuple[int, ...]) -> int:
    if lhs.is_tuple or any(d >= len(lhs.dims) for d in dims):
        raise hlo.HloParseError(
            inst.line, 1, f"{inst.name}: contracting dims {list(dims)} do not fit operand {lhs}"
        )
    size = 1
    for d in dims:
        size *= lhs.dims[d]
    return size


def _conv_flops(inst: hlo.Instruction, kernel: hlo.Shape, result: hlo.Shape) -> float:
    """2 × output elements × (kernel input features × kernel spatial size).

    ``dim_labels=b01f_01io->b01f``: in the kernel part, ``i`` is the input-feature
    dimension (already divided by feature_group_count) and digits are spatial dims.
    """
    labels = inst.attributes.get("dim_labels", "")
    parts = labels.split("_")
    kernel_labels = parts[1].split("->")[0] if len(parts) > 1 else ""
    if kernel.is_tuple or len(kernel_labels) != len(kernel.dims):
        raise hlo.HloParseError(
            inst.line, 1, f"{inst.name}: dim_labels {labels!r} do not fit kernel {kernel}"
        )
    per_output = 1
    for label, size in zip(kernel_labels, kernel.dims):
        if label == "i" or label.isdigit():
            per_output *= size
    return 2.0 * result.leaves()[0].elements * per_output


def _gemm_flops(inst: hlo.Instruction, lhs: hlo.Shape) -> float:
    """FLOPs of a cuBLAS gemm custom-call from its backend_config dot dimension numbers."""
    cfg = inst.backend_config()
    gemm = cfg.get("gemm_backend_config", cfg)
    dnums = gemm.get("dot_dimension_numbers", {}) if isinstance(gemm, dict) else {}
    raw = dnums.get("lhs_contracting_dimensions", []) if isinstance(dnums, dict) else []
    try:
        dims = tuple(int(d) for d in raw)
    except (TypeError, ValueError):
        raise hlo.HloParseError(
            inst.line, 1, f"{inst.name}: bad lhs_contracting_dimensions {raw!r}"
        ) from None
    result = inst.shape.leaves()[0]  # (output, workspace) tuple: the output comes first
    return 2.0 * result.elements * _contracted(inst, lhs, dims)


# ------------------------------------------------------------- flash attention kernels

# XLA:GPU's custom call for a Pallas (Triton) kernel. Its backend_config is an MLIR
# dictionary, not JSON: ``{debug = false, grid_x = 32 : i32, grid_y = 4 : i32, grid_z = 8 :
# i32, ir = "<MLIR bytecode>", name = "mha_forward", num_stages = 2 : i32, num_warps = 8 :
# i32}``; the metadata's op_name ends ``.../mha_forward/pallas_call``.
TRITON_TARGET = "__gpu$xla.gpu.triton"
# The kernels of JAX's Pallas GPU flash attention (jax 0.10.2,
# jax/experimental/pallas/ops/gpu/attention.py: ``pallas_call(..., name=...)``).
FLASH_KERNELS = ("mha_forward", "mha_preprocess_backward", "mha_backward")
# The named scope `models.attention` runs a causal kernel under (it shows in the op_name of
# the forward and backward kernels); the causal mask itself is invisible in the HLO.
FLASH_CAUSAL_SCOPE = "flash_attention_causal"
# The scope as one op_name component, maybe inside transform names: "jvp(<scope>)".
_CAUSAL_IN_OP_NAME = re.compile(rf"(?:^|[/(]){FLASH_CAUSAL_SCOPE}(?:$|[/)])")
_MLIR_IR_STRING = re.compile(r'\bir\s*=\s*"(?:[^"\\]|\\.)*"')
_MLIR_NAME = re.compile(r'\bname\s*=\s*"([^"]*)"')
_MLIR_GRID = re.compile(r'\bgrid_([xyz])\s*=\s*(\d+)')


def triton_kernel(inst: hlo.Instruction) -> tuple[str, dict[str, int]]:
    """(kernel name, grid {"x": .., "y": .., "z": ..}) of a Triton custom call; ("", {})
    for anything else. The name is the ``pallas_call``'s, from backend_config, else the
    op_name component before ``pallas_call``."""
    target = inst.attributes.get("custom_call_target", "").strip('"')
    if inst.opcode != "custom-call" or target != TRITON_TARGET:
        return "", {}
    raw = _MLIR_IR_STRING.sub("", inst.attributes.get("backend_config", ""))
    m = _MLIR_NAME.search(raw)
    name = m.group(1) if m else ""
    if not name:
        parts = inst.metadata().get("op_name", "").split("/")
        name = parts[-2] if len(parts) > 1 and parts[-1] == "pallas_call" else ""
    return name, {axis: int(n) for axis, n in _MLIR_GRID.findall(raw)}


def flash_attention_flops(inst: hlo.Instruction, operands: list[hlo.Shape]) -> float | None:
    """FLOPs one kernel of JAX's Pallas GPU flash attention executes; None for any other.

    From the kernels' code (jax 0.10.2, ``jax/experimental/pallas/ops/gpu/attention.py``),
    per (batch, head) and per pair of a query row and a key row that the kernel visits,
    with ``D`` the head dim padded to a power of two (the kernel's ``head_dim_padded``;
    the tensor cores run it) and ``b, s_q, h`` from q and ``s_k`` from k:

    * ``mha_forward``: two matmuls, ``q k^T`` and ``p v``: 4 D FLOPs, so ``4 b h s_q s_k D``
      over all pairs: the count of FlashAttention-2 (Dao, arXiv 2307.08691, section 4.1).
    * ``mha_backward``: the dK/dV scan runs four matmuls per block pair (``q k^T`` again,
      ``p^T do``, ``do v^T``, ``ds^T q``) and the dQ scan three (``q k^T`` and ``do v^T``
      again, ``ds k``): 7 matmuls, ``3.5 x`` the forward. (FlashAttention-2 counts its
      backward as 2.5x the forward, 5 matmuls: it accumulates dQ in the dK/dV loop; this
      kernel recomputes two matmuls instead.)
    * ``mha_preprocess_backward``: ``delta = rowsum(o * do)``: ``2 b s h D`` (memory-bound).

    Causal (an op_name component is ``FLASH_CAUSAL_SCOPE``, maybe wrapped as
    ``jvp(...)``/``transpose(jvp(...))``): the kernels skip the key blocks past
    each query block but compute the diagonal blocks whole, so a fraction
    ``(1 + B / s_k) / 2`` of the pairs runs, ``B`` the block along the outer loop's
    dimension, read from the grid (forward: ``B = s_q / grid_x``; backward ``B = s_k /
    grid_z``, the dK/dV scan's kv block, which the dQ scan's query block equals);
    exactly half when the grid is unknown. FlashAttention-2 quotes causal as half.

    Only the FLOPs are set here. The task's bytes stay what every custom call gets, its
    operands read and results written once (q, k, v, and for the backward also o, do,
    lse, delta; o and lse, or dq, dk, dv out); the kernels re-read k/v once per query block
    (q/do once per kv block in the backward), which is assumed to hit L2 and is not
    counted. The task gets no ``gemm`` shape: the matmul model's memory term would charge
    the ``s_q x s_k`` scores, which a flash kernel never writes. So `cost.compute_time_us`
    times these kernels by the roofline of FLOPs at the hardware's achieved (best-shape
    matmul) rate: compute-bound for any real length, and optimistic, since attention
    kernels run below the matmul rate (FlashAttention-2, section 4.1, reports up to 335
    TFLOP/s forward+backward on an H100 for its CUDA kernels, against the ~790 TFLOP/s bf16
    matmul rate of the h100 profile); no measurement of this Triton kernel exists here to
    calibrate a factor.
    """
    name, grid = triton_kernel(inst)
    if name not in FLASH_KERNELS or not operands:
        return None
    q = operands[0]
    if q.is_tuple or len(q.dims) != 4:
        return None
    b, s_q, h, d = q.dims
    dpad = 1 << max(d - 1, 0).bit_length()
    if name == "mha_preprocess_backward":
        return 2.0 * b * s_q * h * dpad
    k = operands[1] if len(operands) > 1 else q
    s_k = k.dims[1] if not k.is_tuple and len(k.dims) == 4 else s_q
    pairs = float(s_q * s_k)
    if _CAUSAL_IN_OP_NAME.search(inst.metadata().get("op_name", "")):
        outer = grid.get("x") if name == "mha_forward" else grid.get("z")
        block = (s_q if name == "mha_forward" else s_k) / outer if outer else 0.0
        pairs *= (1.0 + block / s_k) / 2.0
    forward = 4.0 * b * h * pairs * dpad
    return forward if name == "mha_forward" else 3.5 * forward


# Blocks of attention that stand in for one fused kernel (``models/attention.py``: context
# parallelism's blocks, einsums with their scores materialised where MaxText runs cuDNN's
# fused kernel through Transformer Engine). Their op_name carries one of these scopes (the
# second where the block is masked causally), maybe inside transform names.
FUSED_BLOCK_SCOPES = ("fused_attention_block", "fused_attention_block_causal")
_FUSED_BLOCK_IN_OP_NAME = re.compile(rf"(?:^|[/(])({'|'.join(FUSED_BLOCK_SCOPES)})(?:$|[/)])")


def fused_block_price(op_name: str, flops: float, gemm: tuple[int, ...]) -> tuple[float, str] | None:
    """(FLOPs, kernel tag) of a kernel inside a fused attention block (``FUSED_BLOCK_SCOPES``),
    None outside one. The block's matmuls keep their FLOPs (half under the causal scope: a
    fused kernel skips the masked half, FlashAttention's count), timed at the GPU's measured
    fused-attention rate (``attention-backward`` under ``transpose(``, the backward pass, else
    ``attention-forward``) with no memory term: the scores they read and write never leave a
    fused kernel. Every other kernel of the block (the mask, softmax, log-sum-exp and their
    gradients) is ``custom_calls.FUSED_PART``, no time of its own: a fused kernel does that
    work between its matmuls, and its measured rate counts only the matmuls."""
    m = _FUSED_BLOCK_IN_OP_NAME.search(op_name)
    if m is None:
        return None
    if not gemm:
        return 0.0, custom_calls.FUSED_PART
    backward = "transpose(" in op_name
    causal = m.group(1) == FUSED_BLOCK_SCOPES[1]
    return flops * (0.5 if causal else 1.0), "attention-backward" if backward else "attention-forward"


def _gemm_dims(lhs: hlo.Shape, result: hlo.Shape, batch_dims: tuple[int, ...],
               contracting: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a matmul from its lhs, result and the lhs batch/contracting dims:
    the lhs's other dims are m, the result's other elements n."""
    if lhs.is_tuple or any(d >= len(lhs.dims) for d in batch_dims + contracting):
        return ()  # type: ignore[return-value]
    batch = math.prod(lhs.dims[d] for d in batch_dims)
    k = math.prod(lhs.dims[d] for d in contracting)
    if not batch or not k:
        return ()  # type: ignore[return-value]
    m = lhs.elements // (batch * k)
    n = result.elements // (batch * m) if m else 0
    return (batch, m, n, k) if m and n else ()  # type: ignore[return-value]


class _Builder:
    """Walks computations in schedule order and emits tasks (as dicts until frozen)."""

    def __init__(self, module: hlo.Module, unroll_loops: bool, max_tasks: int) -> None:
        self.module = module
        self.unroll = unroll_loops
        self.max_tasks = max_tasks
        self.num_devices = module.num_devices
        self.tasks: list[dict] = []
        # Collectives whose -done (or synchronous collective) was seen; their done_before is
        # the next compute task emitted.
        self.waiting: list[int] = []
        self.flops_cache: dict[str, float] = {}
        # Names of the computations being walked, outermost (the entry) first.
        self.scope: list[str] = []
        self.post_orders: dict[str, dict[str, int]] = {}

    # -- values: a producer set per array, a tuple of them per tuple value --------------
    @staticmethod
    def flat(v) -> frozenset[int]:
        if isinstance(v, frozenset):
            return v
        out: frozenset[int] = frozenset()
        for x in v:
            out |= _Builder.flat(x)
        return out

    def emit(self, **fields) -> int:
        tid = len(self.tasks)
        if tid >= self.max_tasks:
            raise ValueError(
                f"module {self.module.name!r} unrolls to more than max_tasks={self.max_tasks} "
                "tasks; pass unroll_loops=False or a larger max_tasks"
            )
        if fields["kind"] == "compute":
            # The wait is on the compute stream: a collective that follows a ``-done`` (or a
            # synchronous collective) does not end the wait, the next kernel does. jax 0.11+
            # schedules such runs (``all-reduce-done`` then ``all-to-all-start``; a
            # synchronous collective-permute then all-gather).
            for c in self.waiting:
                self.tasks[c]["done_before"] = tid
            self.waiting = []
        fields["id"] = tid
        self.tasks.append(fields)
        return tid

    # -- FLOPs of a called computation (fusion bodies, reducers) --------------------
    def computation_flops(self, comp: hlo.Computation) -> float:
        cached = self.flops_cache.get(comp.name)
        if cached is None:
            cached = sum(self.inst_flops(comp, i) for i in comp.instructions)
            self.flops_cache[comp.name] = cached
        return cached

    def called_flops(self, inst: hlo.Instruction) -> list[float]:
        return [self.computation_flops(self.module.computation(c)) for c in inst.called_computations]

    def gemm(self, comp: hlo.Computation, inst: hlo.Instruction) -> tuple[int, int, int, int]:
        """(batch, m, n, k) of the matmul ``inst`` runs, or of the largest dot in the
        computations it calls (a fusion); () when it runs none."""
        op = inst.opcode
        if op == "dot" and inst.operands:
            lhs = comp.by_name[inst.operands[0]].shape
            return _gemm_dims(lhs, inst.shape, inst.int_list("lhs_batch_dims"),
                              inst.int_list("lhs_contracting_dims"))
        if op == "custom-call" and inst.operands:
            target = inst.attributes.get("custom_call_target", "").strip('"')
            if target not in _GEMM_TARGETS:
                return ()
            cfg = inst.backend_config()
            dnums = cfg.get("gemm_backend_config", cfg).get("dot_dimension_numbers", {})
            try:
                batch = tuple(int(d) for d in dnums.get("lhs_batch_dimensions", []))
                contracting = tuple(int(d) for d in dnums.get("lhs_contracting_dimensions", []))
            except (TypeError, ValueError, AttributeError):
                return ()
            return _gemm_dims(comp.by_name[inst.operands[0]].shape, inst.shape.leaves()[0],
                              batch, contracting)
        if op in ("fusion", "call", "async-start"):
            best: tuple[int, int, int, int] = ()
            for name in inst.called_computations:
                called = self.module.computation(name)
                for i in called.instructions:
                    dims = self.gemm(called, i)
                    if dims and (not best or math.prod(dims) > math.prod(best)):
                        best = dims
            return best
        return ()

    def op_name(self, inst: hlo.Instruction) -> str:
        """The JAX op_name of ``inst``; for a fusion without one (its root was made by a pass,
        e.g. the reduce of a log-sum-exp), that of the last instruction inside it that has one."""
        name = inst.metadata().get("op_name", "")
        if name or inst.opcode != "fusion":
            return name
        for called in inst.called_computations:
            for i in reversed(self.module.computation(called).instructions):
                name = i.metadata().get("op_name", "")
                if name:
                    return name
        return ""

    def fp8_dot(self, comp: hlo.Computation, inst: hlo.Instruction) -> bool:
        """Whether ``inst`` runs a matmul of fp8 operands: a dot, or one in the computations
        it calls (XLA's Triton GEMM fusions of fp8 dots, nested ones included)."""
        if inst.opcode == "dot":
            return any(comp.by_name[o].shape.dtype.startswith("f8") for o in inst.operands[:2])
        if inst.opcode not in ("fusion", "call", "async-start"):
            return False
        for name in inst.called_computations:
            called = self.module.computation(name)
            if any(self.fp8_dot(called, i) for i in called.instructions if i.opcode in ("dot", "fusion")):
                return True
        return False

    def inst_flops(self, comp: hlo.Computation, inst: hlo.Instruction) -> float:
        op = inst.opcode
        shapes = [comp.by_name[o].shape for o in inst.operands]
        if op == "dot" and shapes:
            return _dot_flops(inst, shapes[0], inst.shape)
        if op == "convolution" and len(shapes) > 1:
            return _conv_flops(inst, shapes[1], inst.shape)
        if op == "custom-call" and shapes:
            target = inst.attributes.get("custom_call_target", "").strip('"')
            if target in _GEMM_TARGETS:
                return _gemm_flops(inst, shapes[0])
            priced = custom_calls.price(inst, shapes)
            if priced is not None:
                return priced.flops
            attention = flash_attention_flops(inst, shapes)
            # Any other custom call (XLA's and others' kernels) stays at 0 FLOPs: timed by
            # the bytes it reads and writes.
            return attention if attention is not None else 0.0
        if op == "conditional":
            # One branch runs; without the predicate, charge the most expensive one.
            return max(self.called_flops(inst), default=0.0)
        if op in ("fusion", "call"):
            return sum(self.called_flops(inst))
        if op in _REDUCING_OPCODES:
            # The reducer runs about once per input element.
            reducer = sum(self.called_flops(inst))
            n_in = sum(s.elements for s in shapes[: max(1, len(shapes) // 2)]) if shapes else 0
            return reducer * n_in
        if op in _ELEMENTWISE_FLOP_OPCODES:
            return float(inst.shape.elements)
        return 0.0

    def post_order(self, comp: hlo.Computation) -> dict[str, int]:
        """Instruction name -> position in XLA's post order of ``comp``.

        Mirrors ``HloComputation::MakeInstructionPostOrder`` (xla/hlo/ir/hlo_computation.cc):
        for each instruction without users, in instruction order, a depth-first walk that
        emits an instruction after its operands (first operand first) and its control
        predecessors.
        """
        cached = self.post_orders.get(comp.name)
        if cached is not None:
            return cached
        used = {o for i in comp.instructions for o in i.operands}
        order: dict[str, int] = {}
        expanded: set[str] = set()
        for root in comp.instructions:
            if root.name in used or root.name in order:
                continue
            stack = [root.name]
            while stack:
                name = stack[-1]
                if name in order:
                    stack.pop()
                elif name in expanded:
                    stack.pop()
                    order[name] = len(order)
                else:
                    expanded.add(name)
                    inst = comp.by_name[name]
                    preds = [c for c in _called_names(inst, "control-predecessors") if c in comp.by_name]
                    stack.extend(o for o in reversed(inst.operands) if o not in order)
                    stack.extend(c for c in preds if c not in order)
        self.post_orders[comp.name] = order
        return order

    # -- walking ------------------------------------------------------------------
    def walk(self, comp: hlo.Computation, params: list, trip: int, iteration: int):
        """Emit the tasks of ``comp``; return the producer value of its root."""
        self.scope.append(comp.name)
        try:
            return self._walk(comp, params, trip, iteration)
        finally:
            self.scope.pop()

    def _walk(self, comp: hlo.Computation, params: list, trip: int, iteration: int):
        vals: dict[str, object] = {}
        starts: dict[str, int] = {}  # async start name -> collective task id
        for inst in comp.instructions:
            op = inst.opcode
            deps = frozenset()
            for o in inst.operands:
                deps |= self.flat(vals[o])
            for c in _called_names(inst, "control-predecessors"):
                if c in vals:
                    deps |= self.flat(vals[c])
            if op == "parameter":
                n = int(inst.literal)
                vals[inst.name] = params[n] if n < len(params) else frozenset()
            elif op == "tuple":
                vals[inst.name] = tuple(vals[o] for o in inst.operands)
            elif op == "get-tuple-element":
                src = vals[inst.operands[0]] if inst.operands else frozenset()
                idx = inst.attributes.get("index", "0")
                k = int(idx) if idx.isdigit() else -1
                in_range = isinstance(src, tuple) and 0 <= k < len(src)
                vals[inst.name] = src[k] if in_range else self.flat(src)
            elif op in _TRIVIAL_OPCODES:
                vals[inst.name] = deps
            elif op in _COLLECTIVE_DONE:
                start = inst.operands[0] if inst.operands else ""
                if start in starts:
                    self.waiting.append(starts[start])
                    vals[inst.name] = frozenset({starts[start]})
                else:
                    # async-done of a wrapped non-collective: its start emitted a compute task.
                    vals[inst.name] = deps
            elif op == "while":
                vals[inst.name] = self.walk_while(comp, inst, deps, vals, trip, iteration)
            elif op in ("call", "async-start") and not inst.called_computations:
                raise hlo.HloParseError(
                    inst.line, 1, f"{inst.name}: {op} needs a called computation"
                )
            elif op == "call":
                callee = self.module.computation(inst.called_computations[0])
                vals[inst.name] = self.walk(
                    callee, [vals[o] for o in inst.operands], trip, iteration
                )
            elif op == "conditional" and self.single_branch(inst):
                # One branch, run whatever the index (HLO runs the last branch for an index out
                # of range): its instructions, collectives included, are the step's, as a call's.
                # ``jax.lax.platform_dependent`` leaves such a conditional where its branch holds
                # a collective (a dropless MoE's ragged all-to-all).
                callee = self.module.computation(_called_names(inst, "branch_computations")[0])
                vals[inst.name] = self.walk(callee, [vals[inst.operands[1]]], trip, iteration)
            else:
                tid = self.task(comp, inst, deps, trip, iteration)
                vals[inst.name] = frozenset({tid})
                if self.tasks[tid].get("is_async"):
                    starts[inst.name] = tid
        return vals[comp.root.name]

    def holds_collective(self, inst) -> bool:
        """Whether a computation ``inst`` calls (transitively) runs a collective."""
        seen: set[str] = set()
        todo = list(inst.called_computations)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for i in self.module.computation(name).instructions:
                if _collective_kind(self.module, i)[0] is not None:
                    return True
                todo.extend(i.called_computations)
        return False

    @staticmethod
    def single_branch(inst) -> bool:
        """A ``conditional`` whose one branch always runs."""
        return len(_called_names(inst, "branch_computations")) == 1 and len(inst.operands) == 2

    def walk_while(self, comp, inst, deps, vals, trip, iteration):
        names = _called_names(inst, "body")
        if len(names) != 1:
            raise hlo.HloParseError(inst.line, 1, f"{inst.name}: while needs one body= computation")
        body = self.module.computation(names[0])
        count = inst.known_trip_count()
        n = 1 if count is None else count
        state = vals[inst.operands[0]] if inst.operands else deps
        if n == 0:
            return state
        if not self.unroll:
            return self.walk(body, [state], trip * n, iteration)
        for k in range(n):
            state = self.walk(body, [state], trip * n, iteration * n + k)
        return state

    def memory_bytes(self, comp, inst) -> float:
        """Bytes one compute instruction reads and writes in HBM.

        Operands plus result, except where XLA works in place or reads a window: a
        dynamic-update-slice writes only its update into the buffer it aliases, and a
        dynamic-slice reads only the slice. Charging whole buffers would make a scanned
        layer stack move every layer's weights on every iteration.
        """
        operands = [comp.by_name[o].shape.bytes for o in inst.operands]
        if inst.opcode == "dynamic-update-slice" and len(operands) >= 2:
            return 2.0 * operands[1] + sum(operands[2:])
        if inst.opcode == "dynamic-slice" and operands:
            return 2.0 * inst.shape.bytes + sum(operands[1:])
        if inst.opcode not in ("fusion", "fusion-start") or not inst.called_computations:
            return float(inst.shape.bytes + sum(operands))
        fused = self.module.computation(inst.called_computations[0])
        params = {i.name: int(i.literal) for i in fused.instructions if i.opcode == "parameter"}
        users: dict[str, list] = {}
        for i in fused.instructions:
            for o in i.operands:
                users.setdefault(o, []).append(i)

        def source(i):  # look through dtype/layout wrappers (XLA:CPU's bf16 normalisation)
            while i.opcode in _WRAPPERS and i.operands:
                i = fused.by_name[i.operands[0]]
            return i

        def windows(name):  # the dynamic-slices reached from ``name`` through wrappers
            out = []
            for u in users.get(name, []):
                if u.opcode in _WRAPPERS:
                    inner = windows(u.name)
                    if inner is None:
                        return None
                    out += inner
                elif u.opcode == "dynamic-slice" and u.operands[0] == name:
                    out.append(u)
                else:
                    return None
            return out or None

        roots = ([fused.by_name[o] for o in fused.root.operands] if fused.root.opcode == "tuple"
                 else [fused.root])
        written = 0.0
        aliased: set[int] = set()
        for r in roots:
            dus = source(r)
            buffer = source(fused.by_name[dus.operands[0]]) if dus.opcode == "dynamic-update-slice" else None
            if buffer is not None and buffer.name in params:
                aliased.add(params[buffer.name])
                update = fused.by_name[dus.operands[1]].shape
                written += update.elements * r.shape.bytes / max(r.shape.elements, 1)
            else:
                written += r.shape.bytes
        read = 0.0
        for name, k in params.items():
            if k in aliased or k >= len(operands):
                continue
            slices = windows(name)
            if slices:
                read += sum(u.shape.elements for u in slices) * (
                    operands[k] / max(fused.by_name[name].shape.elements, 1))
            else:
                read += operands[k]
        return float(read + written)

    def task(self, comp, inst, deps, trip, iteration) -> int:
        op = inst.opcode
        kind, target = _collective_kind(self.module, inst)
        dtype = next(
            (s.dtype for s in inst.shape.leaves() if s.dtype not in ("token", "opaque")), ""
        )
        if kind is None:
            target = custom_calls.custom_call_target(inst)
            priced = custom_calls.price(inst, [comp.by_name[o].shape for o in inst.operands]) if target else None
            if op == "async-start":
                wrapped = self.module.computation(inst.called_computations[0])
                flops = self.computation_flops(wrapped)
            elif priced is not None:
                flops = priced.flops
            else:
                flops = self.inst_flops(comp, inst)
            nbytes = priced.bytes if priced is not None else self.memory_bytes(comp, inst)
            kernel = priced.kernel if priced is not None else ""
            if op in ("fusion-start", "copy-start") and _HOST_MEMORY in inst.source:
                kernel = "host-transfer"
            if op == "conditional" and self.holds_collective(inst):
                # Several branches, one runs: the task is the most expensive branch's FLOPs, and
                # the branches' collectives are in no task. Said, as an unpriced call is.
                kernel, target = "unpriced", custom_calls.CONDITIONAL_WITH_COLLECTIVES
            gemm = priced.gemm if priced is not None and priced.gemm else (
                self.gemm(comp, inst) if flops and not kernel else ())
            if gemm and (target == "__cublas$lt$matmul$f8" or self.fp8_dot(comp, inst)):
                kernel = "fp8-matmul"
            fused = None if kernel else fused_block_price(self.op_name(inst), flops, gemm)
            if fused is not None:  # part of a fused attention kernel: no score traffic, no matmul shape
                (flops, kernel), nbytes, gemm = fused, 0.0, ()
            return self.emit(
                name=inst.name, kind="compute", flops=flops, bytes=nbytes, dtype=dtype,
                gemm=gemm, kernel=kernel, custom_call=target,
                fused_attention=(op == "custom-call" and triton_kernel(inst)[0] in FLASH_KERNELS
                                 or kernel.startswith("attention-")),
                opcode=op, deps=tuple(sorted(deps)), trip_count=trip, iteration=iteration,
                computation="/".join(self.scope), post_order=self.post_order(comp)[inst.name],
            )
        owner = comp if target is inst else self.module.computation(inst.called_computations[0])
        operand_bytes = [owner.by_name[o].shape.bytes for o in target.operands]
        groups = target.replica_groups(self.num_devices)
        pairs = target.source_target_pairs()
        if kind == "all-gather":
            size = len(groups[0]) if groups else self.num_devices
            nbytes = sum(operand_bytes) * size
        elif target.opcode.startswith(RAGGED_ALL_TO_ALL):
            # (input, output, offsets and sizes): it moves at most its input and receives at most
            # its output buffer (a MoE's combine sends from a buffer sized for every source).
            nbytes = min(operand_bytes[:2]) if operand_bytes else 0
        elif kind == "collective-permute" and "slice_sizes" in target.attributes:
            # The in-place form (input, output, offsets...) moves at most its input.
            nbytes = operand_bytes[0] if operand_bytes else 0
        else:
            nbytes = sum(operand_bytes)
        if kind != "collective-permute" and not groups:
            groups = (tuple(range(self.num_devices)),)
        # An async-start wrapper or a ``*-start`` (``fusion-start`` included) is an async
        # pair; a plain ``fusion`` that runs a collective is as synchronous as the collective.
        is_async = op == "async-start" or op.endswith("-start")
        reduction = ""
        reducer = self.module.by_name.get(target.attributes.get("to_apply", "").strip().lstrip("%"))
        if kind in ("all-reduce", "reduce-scatter") and reducer is not None:
            reduction = reducer.root.opcode
        tid = self.emit(
            name=inst.name, kind=kind, flops=0.0, bytes=float(nbytes), dtype=dtype, opcode=op,
            deps=tuple(sorted(deps)), trip_count=trip, iteration=iteration,
            computation="/".join(self.scope), post_order=self.post_order(comp)[inst.name],
            groups=groups if kind != "collective-permute" else (), pairs=pairs, is_async=is_async,
            reduction=reduction,
            kernel=(TRITON_COLLECTIVE if _is_triton_collective(inst)
                    else RAGGED_ALL_TO_ALL if target.opcode.startswith(RAGGED_ALL_TO_ALL) else ""),
        )
        if not is_async:
            # A synchronous collective blocks the stream: the next compute task waits for it.
            self.waiting.append(tid)
        return tid


# XLA's memory space of pinned host memory in a layout (``{1,0:S(5)}``;
# ``Layout::kHostMemorySpace`` in xla/layout.h).
_HOST_MEMORY = ":S(5)}"


def host_transfers(tasks) -> tuple[int, float]:
    """(count, bytes) of the async transfers between HBM and host memory among ``tasks``
    (host offloading: ``fusion-start`` of a dynamic-update-slice into, or a dynamic-slice
    from, a buffer in host memory). The bytes are those crossing PCIe: half of what the
    task reads and writes in HBM (the slice is read on one side and written on the other)."""
    moved = [t.bytes / 2 for t in tasks if t.kernel == "host-transfer"]
    return len(moved), float(sum(moved))


def _called_names(inst: hlo.Instruction, key: str) -> list[str]:
    raw = inst.attributes.get(key)
    if raw is None:
        return []
    return [c.strip().lstrip("%") for c in raw.strip("{}").split(",") if c.strip()]


# A dropless MoE's token exchange (``jax.lax.ragged_all_to_all``): an all-to-all whose
# per-peer sizes are operands known at run time. Its bytes are the smaller of its input and
# output buffers (the most it can move), which is the balanced exchange; under a skewed
# routing ``with_exchange_load`` scales it to the busiest device. Its shape's kind is this
# one: XLA runs it with its own one-shot kernel inside one host, else with NCCL's grouped
# sends and receives (``cost.RAGGED``).
RAGGED_ALL_TO_ALL = "ragged-all-to-all"


def busiest_device_load(experts: int, ways: int, imbalance: float) -> float:
    """The busiest device's share of a dropless exchange over the balanced share.

    ``experts`` over ``ways`` devices (``experts / ways`` each); the busiest expert takes
    ``imbalance`` times the mean load and the other experts share the rest evenly
    (``kernels.balanced_groups``). The device holding the busiest expert receives (and sends
    back) that much more than under balanced routing, and the exchange ends when it does.
    """
    if ways <= 1 or experts < 1:
        return 1.0
    if experts % ways or not 1.0 <= imbalance <= experts:
        raise ValueError(f"need experts ({experts}) divisible by the expert axis ({ways}) and the "
                         f"imbalance ({imbalance}) in 1..experts")
    local = experts // ways
    others = (experts - imbalance) / (experts - 1) if experts > 1 else 1.0
    return (imbalance + (local - 1) * others) / local


def with_group_load(graph: StepGraph, imbalance: float) -> StepGraph:
    """``graph`` with every grouped GEMM (``custom_calls.GROUPED_GEMM``) holding a busiest group of
    ``imbalance`` times the mean rows: a MoE's busiest expert, which sets the kernel's time."""
    if imbalance == 1.0:
        return graph

    def busier(t: Task) -> Task:
        groups, _, n, k = t.gemm
        rows = t.flops / (2.0 * n * k)
        return t.evolve(gemm=(groups, min(int(rows), math.ceil(rows / groups * imbalance)), n, k))

    tasks = tuple(busier(t) if t.kernel == custom_calls.GROUPED_GEMM and len(t.gemm) == 4 else t
                  for t in graph.tasks)
    return dataclasses.replace(graph, tasks=tasks)


def with_exchange_load(graph: StepGraph, load: float) -> StepGraph:
    """``graph`` with every dropless exchange (ragged all-to-all) carrying ``load`` times its
    balanced bytes: the busiest device's, which sets the exchange's time."""
    if load == 1.0:
        return graph
    tasks = tuple(dataclasses.replace(t, bytes=t.bytes * load) if t.kernel == RAGGED_ALL_TO_ALL else t
                  for t in graph.tasks)
    return dataclasses.replace(graph, tasks=tasks)
# The synchronous opcodes (and roots of an async-start) that are collectives, and their kind.
_KIND_OF = {**{k: k for k in COLLECTIVE_KINDS}, RAGGED_ALL_TO_ALL: "all-to-all"}


# XLA:GPU's Triton collective fusion (jax 0.11 on; openxla/xla
# ``xla/backends/gpu/transforms/collectives/collective_fusion.cc``): a collective whose
# ``collective_backend_config.kernel_strategy`` XLA set to a Triton one
# (``KERNEL_STRATEGY_TRITON_ONE_SHOT`` for inputs up to 256 KB, ``..._TWO_SHOT`` above) becomes
# a ``kCustom`` fusion of kind ``"__triton_collective"`` (``fusion-start``/``fusion-done``
# when XLA made it async) whose called computation is the collective on its parameters
# (between bitcasts where a two-shot all-reduce or a reduce-scatter is flattened to 1-D).
# ``xla/backends/gpu/codegen/triton/collective_emitter.cc`` compiles it into one kernel that
# reads the peers' buffers directly over NVLink: one-shot, every rank reads every peer's
# whole input and reduces it; two-shot, a reduce-scatter then an all-gather inside the
# kernel. No NCCL call, channel, algorithm or protocol, within one node only. The task
# keeps the collective's kind, groups and bytes and is marked with ``kernel``: the cost
# model (``lagom_jax.costs``) has no model of this kernel and prices it as NCCL's
# collective of the same shape, and no NCCL setting of a Plan reaches it.
TRITON_COLLECTIVE = "triton-collective"


def _is_triton_collective(inst: hlo.Instruction) -> bool:
    """Whether ``inst`` is a Triton collective fusion (its ``fusion_backend_config.kind``)."""
    if not inst.opcode.startswith("fusion"):
        return False
    config = inst.backend_config().get("fusion_backend_config")
    return isinstance(config, dict) and config.get("kind") == "__triton_collective"


def _collective_kind(module: hlo.Module, inst: hlo.Instruction):
    """(kind, the instruction that carries the collective's attributes) or (None, None)."""
    op = inst.opcode
    if op in _KIND_OF:
        return _KIND_OF[op], inst
    if op in _COLLECTIVE_START:
        return _COLLECTIVE_START[op], inst
    if op == "async-start" and inst.called_computations:
        root = module.computation(inst.called_computations[0]).root
        if root.opcode in _KIND_OF:
            return _KIND_OF[root.opcode], root
    # Only a custom fusion (XLA's collective fusions are kCustom) can hold a collective:
    # the loop and input fusions that make up most of a module are not searched.
    if op in ("fusion", "fusion-start") and inst.attributes.get("kind") == "kCustom" and inst.called_computations:
        inner = _fused_collective(module.computation(inst.called_computations[0]))
        if inner is not None:
            return _KIND_OF[inner.opcode], inner
    return None, None


def _fused_collective(comp: hlo.Computation) -> hlo.Instruction | None:
    """The collective a fusion's computation runs (a Triton collective fusion's, above), or
    None. XLA fuses one collective per fusion; the first one stands for the fusion."""
    return next((i for i in comp.instructions if i.opcode in _KIND_OF), None)


# Ops that only change dtype or layout: in-place updates and windowed reads are looked for
# through them.
_WRAPPERS = frozenset({"convert", "bitcast", "copy", "bitcast-convert"})


def from_module(
    module: hlo.Module, *, unroll_loops: bool = True, max_tasks: int = 200_000
) -> StepGraph:
    """The StepGraph of ``module``'s entry computation, in its printed (schedule) order.

    With ``unroll_loops`` every while body with a known trip count is repeated that many
    times (each copy keeps ``trip_count`` = product of enclosing trip counts and gets its
    ``iteration``); without it each body task appears once and stands for ``trip_count``
    executions. Loops with an unknown trip count run once.
    """
    builder = _Builder(module, unroll_loops, max_tasks)
    builder.walk(module.entry, [], 1, 0)
    tasks = []
    for t in builder.tasks:
        tid = t["id"]
        t["deps"] = tuple(d for d in t["deps"] if d != tid)
        tasks.append(Task(**t))
    return StepGraph(module.name, tuple(tasks), module.num_devices)


def from_hlo_text(text: str, **kw) -> StepGraph:
    """``from_module(hlo.parse(text), **kw)``."""
    return from_module(hlo.parse(text), **kw)
