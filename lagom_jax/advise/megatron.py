"""Iteration time of Megatron-LM GPT training, in Megatron's own terms.

A configuration (hidden, heads, layers, seq_len, vocab, tp x dp x pp, micro-batch, global
batch) is replayed kernel by kernel on one GPU of each pipeline stage, the way Megatron-LM
runs it (NVIDIA/Megatron-LM ``megatron/core/transformer``, ``megatron/core/pipeline_parallel
/schedules.py``):

* **A transformer layer**, per micro-batch of ``b`` sequences: the six matmuls (QKV,
  scores, context, projection, FC1, FC2; three times in the backward: data and weight
  gradients) timed by shape (`kernels.gemm_time_us`), and the memory-bound kernels
  between them (layer norms, fused scale-mask-softmax, dropouts, bias-GeLU, bias-dropout-
  add) from their bytes. Tensor parallelism splits heads and FFN columns and adds two
  blocking all-reduces of the ``[s, b, h]`` activation forward and two backward (an
  all-gather and a reduce-scatter each with sequence parallelism).
* **The ends of the pipeline**: the vocab-parallel embedding on the first stage; the final
  layer norm, the output matmul against the (tied) embedding and the fused vocab-parallel
  cross entropy in float32 on the last.
* **Activation recomputation**: ``selective`` re-runs the attention core in the backward,
  ``full`` the whole layer forward (Korthikanti et al. 2022, arXiv 2205.05198). ``auto``
  takes the first of none / selective / full whose activations fit in GPU memory, as a
  user of Megatron must.
* **The schedule**: 1F1B and GPipe run the same ticks, ``T = (m-1) max_i S_i + sum_i S_i``
  for ``m`` micro-batches and per-micro-batch stage times ``S_i`` (forward + backward +
  the blocking sends between stages); they differ in how many micro-batches' activations
  a stage holds (``min(pp, m)`` against ``m``). Each send moves ``[s, b, h]`` (``1/tp`` of
  it with Megatron's scatter-gather optimisation, plus an all-gather on the receiver).
* **After the pipeline**: the data-parallel all-reduce of the float32 gradients
  (Megatron's default DDP reduces after the backward), the all-reduce of the tied
  embedding's gradient between the first and last stage, and the optimizer (gradient-norm
  clipping, Adam over float32 master weights, the copy to 16-bit weights, zeroing the
  gradient buffer), memory-bound.

Ranks are laid out as Megatron does: tensor parallel innermost, then data, then pipeline,
so a group spans nodes when its stride times its size passes a node. Collectives take the
project's NCCL model (`cost.collective_time_us` under NCCL's own parameters); groups that
run side by side on one node share its network. Inside one node of a preset with measured
collective times (A100: nccl-tests logs of NetX-lab/Echo; H100/B200: XLA's tables) the
model's time is the measured one (`cost.measured_ratio`).

Eager execution (`Eager`): PyTorch issues every kernel from Python, and the GPU cannot run
ahead of the CPU that feeds it. Each phase takes the longer of its kernels' GPU time and the
host time to issue them: a transformer layer's forward and backward take Megatron's measured
host time per layer (`Eager.layer_host_us`); the other phases at least ``host_us_per_kernel``
per kernel. Each micro-batch adds, on every stage, the schedule's host bookkeeping in series
with the GPU (Megatron's ``get_batch`` reads the broadcast batch sizes back to the host, and
a pipeline's ``p2p_communication`` synchronises the device after each exchange), and each
iteration the host work around the optimizer step (``Eager.step_host_us``). Small layers
split many ways are bound by the host, not by their kernels: their iteration time stops
falling with tensor parallelism. One factor, fitted to published step times, scales the
compute kernels' modelled times to what an eager training step reaches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import cost as cost_lib, kernels

Schedule = Literal["1f1b", "gpipe"]
Recompute = Literal["auto", "none", "selective", "full"]
SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe")
RECOMPUTE: tuple[str, ...] = ("auto", "none", "selective", "full")
ITEMSIZE = {"bfloat16": 2, "float16": 2}

# Megatron pads the vocabulary to a multiple of 128 x tp (``--make-vocab-size-divisible-by``
# default 128, megatron/training/tokenizer).
VOCAB_MULTIPLE = 128
# Bytes of training state per parameter under Megatron's mixed precision without the
# distributed optimizer: 16-bit weight 2, float32 main gradient 4, float32 master weight 4,
# Adam moments 8 (Korthikanti et al. 2022, sec. 2; Megatron-LM docs: 18 bytes/parameter).
STATE_BYTES_PER_PARAM = 18
# Bytes the optimizer step moves per parameter (all float32 unless said): gradient norm
# for clipping (read gradient 4); Adam (read weight, gradient, two moments 16, write weight
# and moments 12); copy to the 16-bit weight (read 4, write 2); zeroing the gradient
# buffer before the next step (write 4).
OPTIMIZER_BYTES_PER_PARAM = 4 + 28 + 6 + 4
# Memory the framework holds besides weights, state and activations: CUDA context, cuBLAS
# workspaces, NCCL buffers, allocator fragmentation (GB). An assumption; a model that
# needs more than the GPU's memory less this is said not to fit.
RESERVED_GB = 6.0
# Megatron-LM's host time, us: one transformer layer's forward and backward for one
# micro-batch, the rest of one micro-batch's bookkeeping on one stage, one iteration's work
# beyond its micro-batches. Fitted to Megatron-LM's functional-test iteration times on one
# DGX A100 node (Selene, 2023) and one DGX H100 node (2024) (`Eager`; benchmarks/data/
# megatron_ci_runs.md): median abs error 5.1% / 6.6% on the fitted layouts (refitted
# 2026-11-29 once the pipeline's stage sends ran NCCL's point-to-point CTAs, ``cost.p2p_ctas``,
# and again once a send inside a node was anchored to XLA's all-to-all rows, the same
# machinery, not the all-reduce's, ``collective_tables.SAME_MACHINERY``, and ran on the
# pipeline group's communicator, ``_Cluster.stage_send``).
LAYER_HOST_US = 3801.0
STEP_HOST_US = 6824.0
MICROBATCH_HOST_US = 0.0
HOPPER_LAYER_HOST_US = 2253.0
HOPPER_MICROBATCH_HOST_US = 1439.0
HOPPER_STEP_HOST_US = 8495.0
# Host calls of one blocking stage exchange in Megatron-LM's pipeline (``megatron/core/
# pipeline_parallel/p2p_communication.py::_communicate`` with the default ``batch_p2p_comm``
# and ``batch_p2p_sync``): the ``torch.empty`` of the received tensor, the NCCL group of
# ``batch_isend_irecv`` (group start, send, receive, group end), a ``wait`` on each of its two
# requests and the ``torch.cuda.synchronize()`` Megatron issues after every exchange "to
# protect against race condition when using batch_isend_irecv()". Counted from the code, not
# fitted; each takes ``Eager.host_us_per_kernel``. The synchronisation drains the GPU, so the
# host's time for the exchange adds to the stage's time instead of hiding behind its kernels.
P2P_HOST_CALLS = 8


@dataclasses.dataclass(frozen=True)
class GPTRun:
    """One Megatron GPT training configuration. ``ffn_hidden`` defaults to 4 x hidden."""

    hidden: int
    heads: int
    layers: int
    seq_len: int
    vocab: int
    gpus: int
    tp: int
    dp: int
    pp: int
    micro_batch: int
    global_batch: int
    ffn_hidden: int | None = None
    schedule: str = "1f1b"
    recompute: str = "auto"
    sequence_parallel: bool = False
    # Megatron's interleaved 1F1B: each GPU holds this many model chunks (1: plain 1F1B).
    virtual_stages: int = 1
    # Adam state sharded over data parallelism (Megatron's --use-distributed-optimizer,
    # DeepSpeed ZeRO-1): gradients reduce-scattered and weights all-gathered.
    distributed_optimizer: bool = False
    # Megatron's --overlap-grad-reduce: the data-parallel reduction runs during the last
    # micro-batch's backward (gradients are complete only then).
    overlap_grad_reduce: bool = False
    # Layers spread over stages as evenly as they go when pp does not divide them
    # (DeepSpeed's pipeline partitioning); Megatron-LM requires pp to divide the layers.
    uneven_stages: bool = False
    # Megatron's --tp-comm-overlap (Transformer Engine userbuffers): each sublayer's
    # tensor-parallel all-gather/reduce-scatter runs beside its two linear layers' matmuls
    # and shows only where it outlasts them. Needs sequence parallelism.
    tp_comm_overlap: bool = False
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "layers", "seq_len", "vocab", "gpus", "tp", "dp", "pp",
                     "micro_batch", "global_batch", "virtual_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise ValueError(f"ffn_hidden must be a positive integer, got {self.ffn_hidden!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r} (known: {', '.join(SCHEDULES)})")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"unknown recompute {self.recompute!r} (known: {', '.join(RECOMPUTE)})")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"unknown dtype {self.dtype!r} (known: {', '.join(ITEMSIZE)})")
        if self.tp * self.dp * self.pp != self.gpus:
            raise ValueError(f"tp x dp x pp = {self.tp} x {self.dp} x {self.pp} = "
                             f"{self.tp * self.dp * self.pp} does not equal gpus {self.gpus}")
        checks = (
            (self.hidden, self.heads, "heads", "hidden"),
            (self.heads, self.tp, "tp", "heads"),
            (self.ffn, self.tp, "tp", "ffn_hidden"),
            (self.layers, 1 if self.uneven_stages else self.pp * self.virtual_stages,
             "pp x virtual_stages", "layers"),
            (self.global_batch, self.micro_batch * self.dp, "micro_batch x dp", "global_batch"),
        )
        for total, part, part_name, total_name in checks:
            if total % part:
                raise ValueError(f"{part_name} = {part} does not divide {total_name} = {total}")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ValueError("tp_comm_overlap needs sequence_parallel=True (as in Megatron-LM)")
        if self.uneven_stages and self.virtual_stages > 1:
            raise ValueError("uneven_stages needs virtual_stages = 1")
        if self.layers < self.pp:
            raise ValueError(f"pp = {self.pp} stages need at least as many layers, got {self.layers}")
        if self.virtual_stages > 1 and self.schedule != "1f1b":
            raise ValueError("virtual_stages > 1 is Megatron's interleaved 1F1B; use schedule='1f1b'")
        if self.sequence_parallel and self.seq_len % self.tp:
            raise ValueError(f"tp = {self.tp} does not divide seq_len = {self.seq_len} "
                             "(sequence parallelism splits the sequence)")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    def stage_layers(self, stage: int) -> int:
        """Layers on pipeline stage ``stage`` (the first ``layers % pp`` stages take one
        more when they do not divide)."""
        return self.layers // self.pp + (stage < self.layers % self.pp)

    @property
    def padded_vocab(self) -> int:
        step = VOCAB_MULTIPLE * self.tp
        return -(-self.vocab // step) * step

    def layer_params(self) -> float:
        """Parameters of one layer on one tensor-parallel rank (matrices and column-parallel
        biases split by tp; row-parallel biases and layer norms replicated)."""
        h, f, t = self.hidden, self.ffn, self.tp
        return (4 * h * h + 2 * h * f + 3 * h + f) / t + 2 * h + 4 * h

    def stage_params(self) -> tuple[float, float]:
        """(first stage, last stage) parameters per GPU: the layers plus the embeddings
        (word embedding split by tp, learned positions) on the first stage and the final
        layer norm and the tied output embedding on the last (the same tensor when pp=1)."""
        layers = self.stage_layers(0) * self.layer_params()
        word = self.padded_vocab * self.hidden / self.tp
        first = layers + word + self.seq_len * self.hidden
        if self.pp == 1:
            return first + 2 * self.hidden, first + 2 * self.hidden
        return first, layers + word + 2 * self.hidden


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Predicted iteration time and its parts (ms), for the slowest pipeline stage."""

    total_ms: float
    pipeline_ms: float  # forward/backward of all micro-batches incl. bubble and stage sends
    bubble_ms: float  # the fill/drain part of pipeline_ms
    forward_ms: float  # one micro-batch, the slowest stage
    backward_ms: float  # one micro-batch incl. recomputation, the slowest stage
    tp_comm_ms: float  # tensor-parallel collectives inside forward+backward of one micro-batch
    pp_comm_ms: float  # stage sends of one micro-batch, forward + backward
    dp_comm_ms: float  # gradient all-reduce after the pipeline (incl. tied embedding)
    optimizer_ms: float  # the optimizer's kernels and the step's host work (Eager.step_host_us)
    recompute: str  # the recomputation the prediction assumed
    memory_gb: float  # weights + state + activations on the fullest GPU
    fits: bool
    # One layer's forward + backward of one micro-batch: the host's time to issue it and
    # its kernels' GPU time (ms); the larger is what the layer takes.
    layer_host_ms: float = 0.0
    layer_gpu_ms: float = 0.0

    @property
    def host_bound(self) -> bool:
        """Whether a layer takes the host's time to issue it rather than its kernels'."""
        return self.layer_host_ms > self.layer_gpu_ms

    def describe(self) -> str:
        return (f"{self.total_ms:.1f} ms = pipeline {self.pipeline_ms:.1f} (bubble {self.bubble_ms:.1f}; "
                f"per micro-batch fwd {self.forward_ms:.2f} + bwd {self.backward_ms:.2f}, of which tp "
                f"{self.tp_comm_ms:.2f}, pp {self.pp_comm_ms:.2f}) + dp all-reduce "
                f"{self.dp_comm_ms:.1f} + optimizer and step host {self.optimizer_ms:.1f}; recompute "
                f"{self.recompute}; {self.memory_gb:.1f} GB/GPU{'' if self.fits else ' (does not fit)'}"
                + (f"; layers bound by the host (issued in {self.layer_host_ms:.2f} ms, their "
                   f"kernels take {self.layer_gpu_ms:.2f}: splitting them further saves nothing)"
                   if self.host_bound else ""))


@dataclasses.dataclass(frozen=True)
class Eager:
    """What an eager PyTorch step adds to the kernels' own times.

    ``host_us_per_kernel``: the CPU time to launch one kernel from Python (op dispatch,
    autograd bookkeeping, the CUDA launch). Of the order PyTorch's own microbenchmark
    measures for one eager op, 4.6 us, 5.6 us with autograd (pytorch/pytorch#122029), plus
    the launch; it bounds the phases outside the transformer layers (embedding, output head)
    when their kernels are shorter than it. A layer's host time is far more than its
    kernels times this: Megatron's layer makes two to three times as many host calls as it
    launches kernels (views, splits, RNG-state switches, autograd functions in Python).

    ``layer_host_us``: the CPU time Megatron-LM takes to issue one transformer layer's
    forward and backward for one micro-batch (``backward_host_share`` of it in the
    backward): every module call, view, autograd node, RNG-tracker fork and collective call
    of the layer, not only its kernel launches. ``microbatch_host_us``: the schedule's host
    work per micro-batch and stage outside the layers. ``step_host_us``: the host work of one iteration
    beyond the micro-batches (gradient-norm and loss-scale checks that read GPU values back,
    the optimizer's launches, the logging of a step). All three were measured from Megatron-
    LM's own functional tests on one DGX A100 node (a 12-layer, hidden-512 GPT whose kernels
    are far shorter than its host work, so its iteration time is the host's:
    ``benchmarks/data/megatron_ci_runs.md``; fitted by ``python -m benchmarks.measured.fidelity
    --fit-host`` on three layouts and checked on the others) and are properties of that
    software and its host CPU (AMD EPYC 7742 on NVIDIA's Selene, Megatron-LM of 2023): a
    faster CPU or a newer PyTorch moves them (`HOPPER_EAGER`: the same tests on DGX H100).

    ``kernel_slowdown``: measured compute-kernel time over the kernel model's, fitted once
    to the calibration runs of ``benchmarks/measured/fidelity.py`` (Narayanan et al. 2021 and
    Korthikanti et al. 2022 on A100, rows whose micro-batch is printed) and checked on the
    held-out runs there. It stands for what the kernel model leaves out in a long eager
    run: unfused small kernels, allocator and stream synchronisation, clock variation.
    """

    host_us_per_kernel: float = 8.0
    kernel_slowdown: float = 1.10  # fitted: median signed error -8.0% -> 0.0% on 15 calibration rows
    layer_host_us: float = LAYER_HOST_US
    # Assumed, not fitted (the tests' iteration times only see the sum): the backward issues
    # about twice the forward's calls (two matmuls per forward matmul, one autograd node per
    # forward op, the gradient hooks).
    backward_host_share: float = 2 / 3
    microbatch_host_us: float = MICROBATCH_HOST_US
    step_host_us: float = STEP_HOST_US

    def __post_init__(self) -> None:
        for name in ("host_us_per_kernel", "kernel_slowdown", "layer_host_us", "microbatch_host_us",
                     "step_host_us"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Eager.{name} must be a finite number >= 0, got {v!r}")
        if not 0 <= self.backward_host_share <= 1:
            raise ValueError(f"Eager.backward_host_share must lie in [0, 1], got {self.backward_host_share!r}")


DEFAULT_EAGER = Eager()
# The host of a DGX H100 (two Xeon Platinum 8480C) under the Megatron-LM of 2024 issues a
# layer and a step faster than Selene's DGX A100 (two EPYC 7742) under that of 2023: the same
# functional tests, fitted the same way (`benchmarks.measured.fidelity --fit-host`).
HOPPER_EAGER = dataclasses.replace(DEFAULT_EAGER, layer_host_us=HOPPER_LAYER_HOST_US,
                                   microbatch_host_us=HOPPER_MICROBATCH_HOST_US,
                                   step_host_us=HOPPER_STEP_HOST_US)


def eager_for(hw: HardwareProfile) -> Eager:
    """The eager step's constants for the node of ``hw``: the DGX H100 host on Hopper and
    newer GPUs, the DGX A100 host otherwise."""
    return DEFAULT_EAGER if hw.arch in ("ampere", "volta", "turing") else HOPPER_EAGER


class _Phase:
    """A sequence of kernels on the compute stream: GPU time, the kernels launched, and the
    transformer-layer forwards and backwards whose host work it carries."""

    __slots__ = ("gpu_us", "kernels", "comm_us", "layer_forwards", "layer_backwards")

    def __init__(self) -> None:
        self.gpu_us = 0.0
        self.kernels = 0
        self.comm_us = 0.0
        self.layer_forwards = 0
        self.layer_backwards = 0

    def add(self, us: float, comm: bool = False) -> None:
        self.gpu_us += us
        self.kernels += 1
        if comm:
            self.comm_us += us

    def host_us(self, eager: Eager) -> float:
        share = eager.backward_host_share
        layers = eager.layer_host_us * (self.layer_forwards * (1 - share) + self.layer_backwards * share)
        return max(layers, self.kernels * eager.host_us_per_kernel)

    def gpu_time_us(self, eager: Eager) -> float:
        return (self.gpu_us - self.comm_us) * eager.kernel_slowdown + self.comm_us

    def time_us(self, eager: Eager) -> float:
        return max(self.gpu_time_us(eager), self.host_us(eager))


def group_nodes(size: int, stride: int, gpus_per_node: int) -> int:
    """Nodes the first group of ``size`` ranks ``stride`` apart spans."""
    return len({(i * stride) // gpus_per_node for i in range(size)})


class _Cluster:
    """Collective times on ``hw`` for Megatron's rank layout (tp, then dp, then pp)."""

    def __init__(self, run: GPTRun, hw: HardwareProfile) -> None:
        self.run, self.hw = run, hw
        self.gpn = hw.gpus_per_node

    def time_us(self, kind: str, nbytes: float, size: int, stride: int, p2p_ranks: int = 0) -> float:
        if size <= 1 or nbytes <= 0:
            return 0.0
        nodes = group_nodes(size, stride, self.gpn)
        hw = self.hw
        # Groups side by side on a node share its network (cost.net_share).
        return cost_lib.default_time_us(kind, nbytes, size, nodes, hw, p2p_ranks=p2p_ranks)

    def tp(self, kind: str, nbytes: float) -> float:
        return self.time_us(kind, nbytes, self.run.tp, 1)

    def dp(self, kind: str, nbytes: float) -> float:
        return self.time_us(kind, nbytes, self.run.dp, self.run.tp)

    def stage_send(self, nbytes: float) -> float:
        """One send between neighbouring stages (one GPU pair of many sending at once), on the
        pipeline group's communicator: PyTorch runs a batch of sends and receives
        (``batch_isend_irecv``) on its group's NCCL communicator, a lone one on a
        communicator of the pair (ProcessGroupNCCL ``pointToPoint``)."""
        r = self.run
        stride = r.tp * r.dp
        return self.time_us("collective-permute", nbytes, 2, stride, p2p_ranks=r.pp)

    def first_last(self, kind: str, nbytes: float) -> float:
        r = self.run
        return self.time_us(kind, nbytes, 2, r.tp * r.dp * (r.pp - 1))


def _layer(run: GPTRun, hw: HardwareProfile, cl: _Cluster, recompute: str
           ) -> tuple[_Phase, _Phase]:
    """(forward, backward) of one transformer layer for one micro-batch on one GPU."""
    b, s, h, a, t = run.micro_batch, run.seq_len, run.hidden, run.heads, run.tp
    f, B = run.ffn, ITEMSIZE[run.dtype]
    tokens = b * s
    hd = h // a
    heads = a // t
    sp = run.sequence_parallel
    # Tokens the element-wise kernels outside attention/MLP see: 1/t with sequence parallelism.
    ew_tokens = tokens / t if sp else tokens
    act = tokens * h * B  # one [s, b, h] activation
    scores = b * heads * s * s  # attention score elements

    def gemm(m: int, n: int, k: int, batch: int = 1) -> float:
        return kernels.gemm_time_us(m, n, k, hw, batch=batch, itemsize=B)

    def mem(nbytes: float) -> float:
        return kernels.memory_time_us(nbytes, hw)

    projections, core, mlp = kernels.transformer_matmuls(
        sequences=b, seq_len=s, hidden=h, heads=a, head_dim=hd, ffn=f, tp=t)
    dense = [projections[0], projections[1], mlp[0], mlp[1]]

    def tp_collectives(phase: _Phase, hidden_by: tuple[float, float]) -> None:
        """The two sublayers' tensor-parallel collectives, forward or backward (Megatron's
        column-parallel input / row-parallel output conjugates); with ``tp_comm_overlap``
        only what outlasts each sublayer's matmuls (``hidden_by``) is exposed."""
        for gemms in hidden_by:
            if sp:
                comm = cl.tp("all-gather", act) + cl.tp("reduce-scatter", act)
            else:
                comm = cl.tp("all-reduce", act)
            phase.add(max(0.0, comm - gemms) if run.tp_comm_overlap else comm, comm=True)

    def core_forward(phase: _Phase) -> None:
        phase.add(gemm(*core[0][:3], batch=core[0][3]))
        phase.add(mem(2 * scores * B))  # fused scale + mask + softmax: read, write
        phase.add(mem(scores * (2 * B + 1)))  # dropout: read, write, mask byte
        phase.add(gemm(*core[1][:3], batch=core[1][3]))

    def forward(phase: _Phase) -> None:
        phase.add(mem(2 * ew_tokens * h * B))  # layer norm
        phase.add(gemm(*dense[0][:3]))
        core_forward(phase)
        phase.add(mem(2 * tokens * h / t * B))  # context [b, heads, s, hd] -> [s, b, h/t]
        phase.add(gemm(*dense[1][:3]))
        phase.add(mem(ew_tokens * h * (3 * B + 1)))  # bias + dropout + residual add
        phase.add(mem(2 * ew_tokens * h * B))  # layer norm
        phase.add(gemm(*dense[2][:3]))
        phase.add(mem(2 * tokens * f / t * B))  # bias + GeLU
        phase.add(gemm(*dense[3][:3]))
        phase.add(mem(ew_tokens * h * (3 * B + 1)))  # bias + dropout + residual add
        tp_collectives(phase, (gemm(*dense[0][:3]) + gemm(*dense[1][:3]),
                               gemm(*dense[2][:3]) + gemm(*dense[3][:3])))

    fwd = _Phase()
    forward(fwd)
    fwd.layer_forwards = 1

    bwd = _Phase()
    bwd.layer_backwards = 1
    if recompute == "full":
        forward(bwd)
        bwd.layer_forwards = 1
    elif recompute == "selective":
        core_forward(bwd)
    for m, n, k, batch in kernels.backward_matmuls(tuple(dense) + core):
        bwd.add(gemm(m, n, k, batch))
    dgrad = [gemm(m, k, n) for m, n, k, _ in dense]
    bwd.add(mem(3 * scores * B))  # softmax backward: read probabilities and gradient, write
    bwd.add(mem(scores * (2 * B + 1)))  # dropout backward
    bwd.add(mem(2 * tokens * h / t * B))  # context layout back
    for _ in range(2):
        bwd.add(mem(3 * ew_tokens * h * B))  # layer norm backward
        bwd.add(mem(ew_tokens * h * (3 * B + 1)))  # dropout + residual backward
    bwd.add(mem(3 * tokens * f / t * B))  # GeLU backward
    tp_collectives(bwd, (dgrad[0] + dgrad[1], dgrad[2] + dgrad[3]))
    return fwd, bwd


def _ends(run: GPTRun, hw: HardwareProfile, cl: _Cluster) -> tuple[tuple[_Phase, _Phase], tuple[_Phase, _Phase]]:
    """((forward, backward) of the first stage's embedding, the same of the last stage's
    head: final layer norm, output matmul, vocab-parallel cross entropy in float32)."""
    b, s, h, t, B = run.micro_batch, run.seq_len, run.hidden, run.tp, ITEMSIZE[run.dtype]
    tokens = b * s
    v = run.padded_vocab // t
    act = tokens * h * B

    emb_f, emb_b = _Phase(), _Phase()
    emb_f.add(kernels.memory_time_us(2 * act, hw))  # word-embedding gather
    if t > 1:
        emb_f.add(cl.tp("all-reduce", act), comm=True)  # vocab-parallel embedding
    emb_f.add(kernels.memory_time_us(tokens * h * (3 * B + 1), hw))  # + positions, dropout
    emb_b.add(kernels.memory_time_us(tokens * h * (2 * B + 1), hw))  # dropout backward
    emb_b.add(kernels.memory_time_us(tokens * h * (B + 8), hw))  # scatter-add into float32 grads

    head_f, head_b = _Phase(), _Phase()
    head_f.add(kernels.memory_time_us(2 * act, hw))  # final layer norm
    head_f.add(kernels.gemm_time_us(tokens, v, h, hw, itemsize=B))
    logits = tokens * v
    # Cross entropy (megatron/core/tensor_parallel/cross_entropy.py): cast to float32
    # (read 2, write 4), max (read 4), subtract (read, write), exp (read, write), sum
    # (read), divide (read, write); three all-reduces of [s, b] floats across tp.
    for nbytes in (B + 4, 4, 8, 8, 4, 8):
        head_f.add(kernels.memory_time_us(logits * nbytes, hw))
    if t > 1:
        for _ in range(3):
            head_f.add(cl.tp("all-reduce", tokens * 4), comm=True)
    head_b.add(kernels.memory_time_us(logits * 8, hw))  # softmax - one-hot, times the grad
    head_b.add(kernels.memory_time_us(logits * (4 + B), hw))  # cast back to 16-bit
    head_b.add(kernels.gemm_time_us(tokens, h, v, hw, itemsize=B))  # data gradient
    head_b.add(kernels.gemm_time_us(v, h, tokens, hw, itemsize=B))  # weight gradient
    head_b.add(kernels.memory_time_us(3 * act, hw))  # final layer norm backward
    if t > 1:
        head_b.add(cl.tp("all-reduce", act), comm=True)
    return (emb_f, emb_b), (head_f, head_b)


def activation_bytes(run: GPTRun, recompute: str) -> float:
    """Activations the first stage holds at its peak (Korthikanti et al. 2022, Table 2:
    per layer and micro-batch ``s*b*h*(10 + 24/t) + 5*a*s^2*b/t`` bytes at 16 bits,
    ``34/t`` in place of ``10 + 24/t`` with sequence parallelism; selective drops the
    ``5as^2b`` attention term, full keeps only each layer's ``2sbh`` input), times the
    micro-batches in flight: ``min(pp, m)`` under 1F1B, ``m`` under GPipe. The last stage's
    float32 logits and their softmax are added when there is one stage."""
    b, s, h, a, t = run.micro_batch, run.seq_len, run.hidden, run.heads, run.tp
    sbh = s * b * h
    linear = sbh * (34 / t if run.sequence_parallel else 10 + 24 / t)
    attention = 5 * a * s * s * b / t
    per_layer = {"none": linear + attention, "selective": linear,
                 "full": 2 * sbh / (t if run.sequence_parallel else 1)}[recompute]
    in_flight = run.microbatches if run.schedule == "gpipe" else min(run.pp, run.microbatches)
    total = per_layer * run.stage_layers(0) * in_flight
    if run.pp == 1:
        total += 2 * s * b * run.padded_vocab / t * 4
    return total


def memory_gb(run: GPTRun, recompute: str) -> float:
    """Weights, gradients and optimizer state plus activations on the fullest GPU (GB)."""
    params = max(run.stage_params())
    # The distributed optimizer keeps float32 master weights and moments (12 of the 18
    # bytes) on 1/dp of the ranks.
    state = params * (STATE_BYTES_PER_PARAM - (12 - 12 / run.dp) * run.distributed_optimizer)
    return (state + activation_bytes(run, recompute)) / 1e9


def choose_recompute(run: GPTRun, gpu_memory_gb: float) -> str:
    """``run.recompute``, or under ``auto`` the cheapest recomputation that fits."""
    if run.recompute != "auto":
        return run.recompute
    limit = gpu_memory_gb - RESERVED_GB
    for option in ("none", "selective", "full"):
        if memory_gb(run, option) <= limit:
            return option
    return "full"


def layer_ms(run: GPTRun, hw: HardwareProfile, *, eager: Eager | None = None) -> tuple[float, float]:
    """(forward, backward) of one transformer layer for one micro-batch (ms), with the
    recomputation ``run`` names (``auto`` counts as none)."""
    eager = eager or eager_for(hw)
    recompute = "none" if run.recompute == "auto" else run.recompute
    fwd, bwd = _layer(run, hw, _Cluster(run, hw), recompute)
    return fwd.time_us(eager) / 1e3, bwd.time_us(eager) / 1e3


def predict(run: GPTRun, hw: HardwareProfile, *, gpu_memory_gb: float,
            eager: Eager | None = None) -> StepTime:
    """The iteration time of ``run`` on ``hw`` (a cluster with enough GPUs for it), under
    ``eager`` (default: the constants of ``hw``'s node, `eager_for`)."""
    if hw.num_gpus < run.gpus:
        hw = hw.with_nodes(math.ceil(run.gpus / hw.gpus_per_node))
    eager = eager or eager_for(hw)
    recompute = choose_recompute(run, gpu_memory_gb)
    cl = _Cluster(run, hw)
    B = ITEMSIZE[run.dtype]
    layer_f, layer_b = _layer(run, hw, cl, recompute)
    (emb_f, emb_b), (head_f, head_b) = _ends(run, hw, cl)
    lf, lb = layer_f.time_us(eager), layer_b.time_us(eager)
    ef, eb = emb_f.time_us(eager), emb_b.time_us(eager)
    hf, hb = head_f.time_us(eager), head_b.time_us(eager)

    # Sends between stages: [s, b, h] forward, its gradient backward (1/tp each with the
    # scatter-gather optimisation, then an all-gather over tp on the receiver).
    act = run.seq_len * run.micro_batch * run.hidden * B
    send = 0.0
    if run.pp > 1:
        if run.tp > 1 and not run.sequence_parallel:
            send = cl.stage_send(act / run.tp) + cl.tp("all-gather", act)
        else:
            send = cl.stage_send(act / (run.tp if run.sequence_parallel else 1))
        # Each exchange is a synchronised call on the host (`P2P_HOST_CALLS`), in series.
        send += P2P_HOST_CALLS * eager.host_us_per_kernel
    v = run.virtual_stages
    pp_comm = 2 * v * send  # each model chunk sends forward and backward
    stages = []
    for i in range(run.pp):
        n = run.stage_layers(i)
        fwd = n * lf + (ef if i == 0 else 0.0) + (hf if i == run.pp - 1 else 0.0)
        bwd = n * lb + (eb if i == 0 else 0.0) + (hb if i == run.pp - 1 else 0.0)
        stages.append((fwd, bwd))
    # Each stage runs the schedule's bookkeeping of every micro-batch on the host, in series
    # with its GPU work (the batch broadcast reads sizes back, ``get_batch`` in Megatron-LM).
    per_mb = [fw + bw + pp_comm + eager.microbatch_host_us for fw, bw in stages]
    m = run.microbatches
    slowest = max(range(run.pp), key=lambda i: per_mb[i])
    # The slowest stage runs all m micro-batches; the others' share of one micro-batch
    # fills and drains the pipeline, in 1/v pieces with v model chunks per GPU.
    bubble = (sum(per_mb) - per_mb[slowest]) / v
    pipeline = m * per_mb[slowest] + bubble

    # After the pipeline, every stage at once: the gradient reduction over dp (float32
    # all-reduce; reduce-scatter plus a 16-bit all-gather of the weights with the
    # distributed optimizer), the tied embedding's gradient between first and last stage,
    # the optimizer.
    params = max(run.stage_params())
    if run.distributed_optimizer:
        dp_comm = cl.dp("reduce-scatter", params * 4) + cl.dp("all-gather", params * B)
        opt_bytes = (OPTIMIZER_BYTES_PER_PARAM - 4) * params / run.dp + 4 * params
    else:
        dp_comm = cl.dp("all-reduce", params * 4)
        opt_bytes = OPTIMIZER_BYTES_PER_PARAM * params
    if run.overlap_grad_reduce:
        dp_comm = max(0.0, dp_comm - stages[slowest][1])
    if run.pp > 1:
        dp_comm += cl.first_last("all-reduce", run.padded_vocab * run.hidden / run.tp * 4)
    # The optimizer's kernels, then the step's host work (it reads the gradient norm and the
    # loss scale back, so the host cannot run ahead of it into the next iteration).
    optimizer = kernels.memory_time_us(opt_bytes, hw) + eager.step_host_us
    total = pipeline + dp_comm + optimizer
    mem = memory_gb(run, recompute)
    tp_comm = run.stage_layers(slowest) * (layer_f.comm_us + layer_b.comm_us)
    fw, bw = stages[slowest]
    return StepTime(
        total_ms=total / 1e3, pipeline_ms=pipeline / 1e3, bubble_ms=bubble / 1e3,
        forward_ms=fw / 1e3, backward_ms=bw / 1e3, tp_comm_ms=tp_comm / 1e3,
        pp_comm_ms=pp_comm / 1e3, dp_comm_ms=dp_comm / 1e3, optimizer_ms=optimizer / 1e3,
        recompute=recompute, memory_gb=mem, fits=mem <= gpu_memory_gb - RESERVED_GB,
        layer_host_ms=(layer_f.host_us(eager) + layer_b.host_us(eager)) / 1e3,
        layer_gpu_ms=(layer_f.gpu_time_us(eager) + layer_b.gpu_time_us(eager)) / 1e3,
    )
