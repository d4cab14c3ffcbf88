"""ConfigTuner: the one adviser. Which parallel configuration should a model train with?

``advise(model, config, gpus, hardware, ...)`` answers it for every built-in model (gpt2,
bert, t5, llama, mixtral, and the contract's ``gpt``) with one search, after ConfigTuner
("Analyzing Communication Predictability in LLM Training", arXiv 2512.24750: the traffic of
every parallelism is predictable from the configuration, so no profiling run is needed):

1. arithmetic rules out the meshes whose sizes do not divide the model or the batch, and those
   whose float32 weights and Adam moments alone exceed the memory limit;
2. a closed-form screen (``screen_terms``: matmuls at their shapes' rates with what remat
   recomputes, memory-bound kernels, the collectives nothing runs beside, the fsdp weights'
   traffic) orders what is left, each mesh judged at its best per-device batch, and the screen
   is calibrated on the compiled steps as they come in (``Screen.fit``), so that it prunes in
   the compiled model's numbers;
3. each configuration compiled is the real train step (`lagom_jax.models.build`) compiled by
   XLA's GPU pipeline for the cluster's GPUs (deviceless): its memory is XLA's, its step the
   cost model's prediction of that compiled step (``predict_train_step_ms``'s number).

``advise_train_step`` is the same search with the dimensions spelled out. ``predict_step``
and ``rank_steps`` price Megatron-LM's own iteration (`megatron`), the same question in
Megatron's terms (``lagom-jax predict --rank``). All times are predictions, never
measurements.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lagom_jax import job as job_lib
from lagom_jax.advise import megatron, memory, predict
from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.costs import cost as cost_lib
from lagom_jax.costs import kernels
from lagom_jax.models.families import DEFAULT_CONFIG, resolve_config
from lagom_jax.plan import report as report_lib

# GPU memory per device, GB (1e9 B). HardwareProfile has no memory field, so it lives here,
# keyed by preset name. Sources: NVIDIA datasheets (A100 SXM 80GB; H100 SXM5 80GB HBM3;
# A40 48GB GDDR6; V100 SXM2 ships with 16 or 32 GB, the 32 GB part is assumed).
GPU_MEMORY_GB: dict[str, float] = {
    "a100-sxm-8": 80.0,
    "h100-sxm-8": 80.0,
    "a40-pcie-8": 48.0,
    "v100-25g": 32.0,
    "h200-sxm-8": 141.0,  # NVIDIA H200 datasheet: 141 GB HBM3e
    "b200-sxm-8": 180.0,  # NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs
    "dgx-h100": 80.0,  # = h100-sxm-8
    "a3": 80.0,  # Google Cloud a3-highgpu-8g: 8x H100 80GB
    "a3-mega": 80.0,  # a3-megagpu-8g: 8x H100 80GB
    "a3-ultra": 141.0,  # a3-ultragpu-8g: 8x H200 141GB
    "a4": 180.0,  # a4-highgpu-8g: 8x B200 (as b200-sxm-8)
    "p5": 80.0,  # AWS p5.48xlarge: 8x H100 80GB
    "nd-a100-v4": 40.0,  # Azure ND A100 v4: 8x A100 40GB
    "gb200-nvl72": 186.0,  # NVIDIA GB200 NVL72 datasheet: up to 13.4 TB HBM3e for 72 GPUs
}

Progress = Callable[[str], None]


def _coll_us(kind: str, nbytes: float, n: int, nodes: int, hw: hardware_lib.HardwareProfile) -> float:
    """One collective under NCCL's own choice of parameters."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return cost_lib.default_time_us(kind, nbytes, n, nodes, hw)


# ------------------------------------------------------------- Megatron-terms prediction

def predict_step(*, hidden: int, heads: int, layers: int, seq_len: int, vocab: int, gpus: int,
                 tp: int, dp: int, pp: int, micro_batch: int, global_batch: int,
                 hardware: str | hardware_lib.HardwareProfile = "a100-sxm-8",
                 schedule: str = "1f1b", **options: Any) -> megatron.StepTime:
    """The predicted iteration of a Megatron-LM GPT configuration with its parts
    (`megatron.predict`). ``hardware`` is a preset name (grown to ``gpus`` GPUs), a
    ``name:nodes=N`` spec, a JSON profile or a profile; ``options`` are `megatron.GPTRun`'s
    optional fields (``recompute``, ``ffn_hidden``, ``sequence_parallel``,
    ``virtual_stages``, ``distributed_optimizer``, ``overlap_grad_reduce``, ``dtype``).
    Raises ValueError naming the number that does not divide, or the unknown preset."""
    run = megatron.GPTRun(hidden=hidden, heads=heads, layers=layers, seq_len=seq_len, vocab=vocab,
                          gpus=gpus, tp=tp, dp=dp, pp=pp, micro_batch=micro_batch,
                          global_batch=global_batch, schedule=schedule, **options)
    hw = hardware_lib.resolve_cluster(hardware, num_devices=gpus).hardware
    if hw.num_gpus < gpus:
        hw = hw.with_nodes(math.ceil(gpus / hw.gpus_per_node))
    return megatron.predict(run, hw, gpu_memory_gb=GPU_MEMORY_GB.get(hw.name, 80.0))


def rank_steps(*, hidden: int, heads: int, layers: int, seq_len: int, vocab: int, gpus: int,
               global_batch: int, hardware: str | hardware_lib.HardwareProfile = "a100-sxm-8",
               micro_batches: tuple[int, ...] = (1, 2, 4, 8), schedule: str = "1f1b",
               **options: Any) -> list[tuple[dict[str, int], megatron.StepTime]]:
    """The one search's space in Megatron-LM's terms, priced by Megatron's own iteration:
    every data x stage x model mesh of ``gpus`` that ``advise`` would consider (model inside a
    node, dividing the heads and the FFN; stages dividing the layers; Megatron has no fsdp axis
    here), as tp x dp x pp, with each micro-batch in ``micro_batches`` that divides the per-rank
    batch and fits in GPU memory, fastest first. ``options`` as `predict_step`'s. The vocabulary
    is padded as Megatron-LM pads it (to a multiple of 128 x tp), so tp need not divide it.
    Raises ValueError when no split runs at all."""
    hw = hardware_lib.resolve_cluster(hardware, num_devices=gpus).hardware
    dims = dict(layers=layers, d_model=hidden, heads=heads, kv_heads=heads,
                ffn=options.get("ffn_hidden") or 4 * hidden, vocab=128 * hw.gpus_per_node, seq_len=seq_len)
    meshes, _ = _family_meshes("gpt", dims, gpus, hw.gpus_per_node, global_batch, pipeline=True)
    out = []
    skipped: list[str] = []
    for m in (m for m in meshes if m["fsdp"] == 1):
        tp, pp, dp = m["model"], m.get("stage", 1), m["data"]
        for mb in micro_batches:
            config = dict(tp=tp, dp=dp, pp=pp, micro_batch=mb)
            try:
                step = predict_step(hidden=hidden, heads=heads, layers=layers, seq_len=seq_len,
                                    vocab=vocab, gpus=gpus, global_batch=global_batch,
                                    hardware=hardware, schedule=schedule, **config, **options)
            except ValueError as err:
                skipped.append(str(err))
                continue
            if step.fits:
                out.append((config, step))
    if not out:
        why = f" (e.g. {skipped[0]})" if skipped else " (none fits in GPU memory)"
        raise ValueError(f"no tp x dp x pp split of {gpus} GPUs with micro-batch in "
                         f"{list(micro_batches)} runs this model{why}")
    return sorted(out, key=lambda cs: cs[1].total_ms)


def predict_step_ms(*, hidden: int, heads: int, layers: int, seq_len: int, vocab: int, gpus: int,
                    tp: int, dp: int, pp: int, micro_batch: int, global_batch: int,
                    hardware: str | hardware_lib.HardwareProfile = "a100-sxm-8",
                    schedule: str = "1f1b", **options: Any) -> float:
    """Milliseconds per training iteration of a Megatron-LM GPT configuration, predicted.

    ``gpus = tp * dp * pp`` may span nodes (``nodes = gpus / gpus_per_node`` of the preset);
    ``schedule`` is ``"1f1b"`` or ``"gpipe"``; ``options`` are `predict_step`'s
    (``recompute`` (default ``auto``: the cheapest that fits), ``ffn_hidden`` (default
    4 x hidden), ``sequence_parallel``, ...). Never
    raises on a configuration whose numbers divide; one that does not gets a ValueError
    saying which number does not divide which.
    """
    return predict_step(hidden=hidden, heads=heads, layers=layers, seq_len=seq_len, vocab=vocab,
                        gpus=gpus, tp=tp, dp=dp, pp=pp, micro_batch=micro_batch,
                        global_batch=global_batch, hardware=hardware, schedule=schedule,
                        **options).total_ms


# ------------------------------------------------------ the one search: memory from XLA
#
# Which mesh (data x fsdp x model x expert, model and expert inside a node), per-device batch
# and gradient accumulation, remat policy and attention implementation. Arithmetic rules out
# what cannot run; XLA's deviceless compile gives the memory of the rest
# (`lagom_jax.advise.memory`) and the contract's prediction ranks them.

# The built-in model each family of the search compiles. ``gpt`` is the prediction contract's
# name for GPT-2's layers at any dimensions.
FAMILY_MODELS = {**predict.FAMILY_MODELS, "gpt2": "gpt2", "bert": "bert", "t5": "t5"}
# Families whose layers are GPT-2's Block (pre- or post-norm, biases, a two-matrix MLP); they
# tag no activation names, so only the policies that need none apply.
BLOCK_FAMILIES = ("gpt", "gpt2", "bert", "t5")
# Families whose MLP is gated (SwiGLU: gate and up matrices in, one out).
GATED_FAMILIES = ("llama", "mixtral")
# Families whose meshes include pipeline stages unless told otherwise: those the first adviser
# pipelined. Llama, Mixtral and the contract's gpt are searched as MaxText's and JAX-Toolbox's
# GPU recipes run them, without a pipeline (and the built-in pipeline is GPipe, all forward then
# all backward, not MaxText's circular one); ``pipeline=True`` adds stages to them too.
PIPELINED_BY_DEFAULT = ("gpt2", "bert", "t5")

# Remat policies from least memory to most: each saves a superset of what the one before
# saves (models/pipeline.py), so memory rises along this order and recomputation falls.
REMAT_ORDER = ("full", "save_qkv_proj", "save_dot_except_mlp", "save_dot_except_mlpwi", "minimal",
               "minimal_flash", "none")
# GPT-2's layers tag no names, so the name-based policies save what `full` saves.
GPT_REMATS = ("full", "minimal", "none")
# Float32 weights and the two Adam moments per parameter: the step's arguments.
STATE_BYTES = 12
GRAD_ACCUM_BYTES = 4  # the float32 gradient accumulator a step with grad_accum > 1 keeps
# HBM bytes of one AdamW update per byte of weights and moments (float32, STATE_BYTES per
# parameter): read off XLA's compiled steps, as the memory-bound traffic of data=8 less that of
# fsdp=8 (which updates an eighth of the state) over the state's difference: 6.5 for gpt2 355M
# and 6.6 for BERT large (8 H100, one sequence per GPU), where reading the weights, gradients
# and both moments and writing three would be 7/3.
OPTIMIZER_TRAFFIC = 6.5
DEFAULT_MESH_FINALISTS = 3
DEFAULT_TOP = 10
DEFAULT_MAX_PROBES = 10
# A mesh the calibrated screen puts this much slower than the finalist-th fastest probe is not
# probed (the calibrated screen is within 10% of the compiled steps it is fitted on).
PROBE_MARGIN = 0.10
# A remat policy that keeps more is compiled on a finalist only if the calibrated screen puts it
# this much faster than the finalist's best so far.
REMAT_GAIN = 0.01
# How far a configuration's memory, bounded below from a compiled one, must be over the limit
# before it is not compiled (the bound assumes the policies' order and the state estimate).
MEMORY_MARGIN = 0.10


class NothingFits(ValueError):
    """No configuration of the search fits in GPU memory (the message says what would)."""


@dataclasses.dataclass(frozen=True)
class TrainCandidate:
    """One configuration of a training step, evaluated: memory from XLA (``peak_bytes``)
    against ``limit_bytes``, and the predicted step (``step_ms``: the contract's
    ``predict_train_step_ms`` of one micro-step times ``grad_accum``)."""
    mesh: dict[str, int]
    per_device_batch: int  # sequences per data x fsdp x expert rank in one micro-step
    grad_accum: int  # gradient-accumulation steps; on a stage axis, the pipeline's micro-batches
    remat: str
    attention: str
    fits: bool
    peak_bytes: int
    limit_bytes: int
    step_ms: float
    micro_step_ms: float
    tokens_per_s_per_gpu: float
    mfu: float
    xla_remat: int  # instructions XLA's rematerialization pass added to meet the limit
    why: str
    temp_bytes: int = 0  # of peak_bytes, XLA's temporaries of one micro-step

    def label(self) -> str:
        mesh = ",".join(f"{a}={n}" for a, n in self.mesh.items())
        return (f"[{mesh}] b={self.per_device_batch} x{self.grad_accum}{' mb' if self.pipelined else ''} {self.remat}"
                + ("" if self.attention == "flash" else f" {self.attention}-attn"))

    @property
    def pipelined(self) -> bool:
        """Whether the step is a GPipe pipeline (``grad_accum`` then counts its micro-batches)."""
        return self.mesh.get("stage", 1) > 1

    def key(self) -> tuple:
        return (tuple(sorted(self.mesh.items())), self.per_device_batch, self.grad_accum, self.remat,
                self.attention)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TrainAdvice:
    """What ``advise_train_step`` returns (the issue's ``Advice``): ``candidates`` fastest
    first (fitting ones, then the rest), ``current`` (the user's own configuration, always
    evaluated) and how the search went."""
    family: str
    dims: dict[str, int]
    gpus: int
    hardware: str
    nodes: int
    global_batch: int
    seq_len: int
    memory_fraction: float
    gpu_memory_bytes: int
    limit_bytes: int
    candidates: tuple[TrainCandidate, ...]
    current: TrainCandidate | None
    screened: int
    rejected: tuple[tuple[str, str], ...]  # (configuration, why), ruled out before compiling
    compiles: int
    cached: int
    wall_s: float
    pruning: tuple[str, ...]
    tuned: Any = None  # job.Job of the best candidate (``tune=True``)

    @property
    def best(self) -> TrainCandidate:
        fitting = [c for c in self.candidates if c.fits]
        if not fitting:
            raise NothingFits("no configuration fits")
        return fitting[0]

    def gain(self, c: TrainCandidate) -> float | None:
        return None if self.current is None else self.current.step_ms / c.step_ms

    def table(self, top: int | None = None) -> str:
        gib = 2 ** 30
        # Headers short, the mesh by its axes over 1 and the gain only beside a configuration of
        # the user's, so that a row fits report_lib.WIDTH.
        gain = self.current is not None
        rows = [f"| rank | mesh | b/dev | accum | remat | attn | peak GiB of {self.limit_bytes / gib:.1f} | "
                "step ms | tok/s/GPU | MFU |" + " gain |" * gain,
                "|---|---|---:|---:|---|---|---|---:|---:|---:|" + "---:|" * gain]
        # Candidates XLA compiled to the same step (the same predicted time and peak) are one
        # row: the first, its alternatives named under the table.
        shown: list[TrainCandidate] = []
        ties: dict[int, list[TrainCandidate]] = {}
        for c in self.candidates[:top]:
            prev = shown[-1] if shown else None
            if prev is not None and prev.fits == c.fits and prev.peak_bytes == c.peak_bytes and math.isclose(
                    prev.step_ms, c.step_ms, rel_tol=1e-9):
                ties.setdefault(len(shown), []).append(c)
            else:
                shown.append(c)
        if self.current is not None:
            shown.append(self.current)
        notes = [f"rank {i} stands for {len(same) + 1} configurations predicted the same (step and peak): "
                 + "; ".join(x.label() for x in [shown[i - 1], *same]) for i, same in ties.items()]
        for i, c in enumerate(shown, 1):
            rank = "yours" if c is self.current else (f"{i} (x{len(ties[i]) + 1})" if i in ties else str(i))
            mesh = ",".join(f"{a}={n}" for a, n in c.mesh.items() if n > 1) or "one device"
            fit = f"{c.peak_bytes / gib:.1f}" + ("" if c.fits else " (over)") + (
                f" XLA remat {c.xla_remat}" if c.xla_remat else "")
            g = self.gain(c)
            accum = f"{c.grad_accum} (pipeline)" if c.pipelined else str(c.grad_accum)
            rows.append(f"| {rank} | {mesh} | {c.per_device_batch} | {accum} | {c.remat} | "
                        f"{c.attention} | {fit} | {c.step_ms:.1f} | {c.tokens_per_s_per_gpu:.0f} | "
                        f"{c.mfu * 100:.1f}% |" + (f" {'-' if g is None else f'{g:.2f}x'} |" if gain else ""))
        return "\n".join(rows + [""] * bool(notes) + notes)

    def report(self, top: int | None = None, *, width: int | None = report_lib.WIDTH) -> str:
        """What ``lagom-jax advise`` prints: the ranked table, how the search pruned, the best
        configuration as MaxText's config and, when tuned, its ``XLA_FLAGS`` line (kept whole);
        every other line wrapped to ``width`` (``report_lib.wrap``)."""
        d = self.dims
        head = (f"{self.family} (layers {d['layers']}" + (f" + {d['dec_layers']} decoder" if d.get("dec_layers") else "")
                + f", d_model {d['d_model']}, heads {d['heads']}/"
                f"{d['kv_heads']}, ffn {d['ffn']}, vocab {d['vocab']}"
                + (f", {d['experts']} experts top-{d['top_k']}" if d.get("experts") else "")
                + f") on {self.gpus} x {self.hardware} ({self.nodes} node(s)), global batch "
                f"{self.global_batch} x seq {self.seq_len}; limit {self.limit_bytes / 2 ** 30:.1f} GiB "
                f"= {self.memory_fraction:g} x {self.gpu_memory_bytes / 2 ** 30:.1f} GiB "
                "-- memory from XLA's deviceless compile, times predicted by the cost model")
        lines = [head, "", self.table(top), ""]
        remat = [c for c in self.candidates[:top] if c.xla_remat and c.fits]
        if remat:
            lines.append(f"XLA had to rematerialize to fit in {len(remat)} of these rows (its "
                         "rematerialization pass ran against the same limit; 'XLA remat N': N "
                         "instructions recomputed).")
        lines += [f"Searched: {self.screened} meshes screened by arithmetic, "
                  f"{len(self.rejected)} ruled out before compiling, {self.compiles} configurations compiled "
                  f"({self.cached} from the cache), {self.wall_s:.0f} s.",
                  "Pruning:", *(f"- {step}" for step in self.pruning)]
        try:
            best = self.best
        except NothingFits:
            return report_lib.wrap(lines, width=width)
        lines += ["", f"Recommendation: {best.label()}: {best.why}", "", "MaxText-style config:",
                  maxtext_fragment(best, self.gpus, self.nodes_size()), ""]
        if self.tuned is not None:
            flags = self.tuned.plan.xla_flags()
            lines += [f"Tuned by the pipeline (lagom): {self.tuned.predicted_ms('lagom'):.1f} ms "
                      f"(XLA defaults {self.tuned.predicted_ms('xla-default'):.1f} ms); flags:",
                      report_lib.Paste(f"  XLA_FLAGS='{flags}'") if flags else "  XLA_FLAGS: none to set"]
        return report_lib.wrap(lines, width=width)

    def nodes_size(self) -> int:
        return self.gpus // self.nodes

    def to_json(self) -> str:
        d = {k: getattr(self, k) for k in ("family", "dims", "gpus", "hardware", "nodes", "global_batch",
                                           "seq_len", "memory_fraction", "gpu_memory_bytes",
                                           "limit_bytes", "screened", "compiles", "cached", "wall_s")}
        d["pruning"] = list(self.pruning)
        d["candidates"] = [c.to_dict() for c in self.candidates]
        d["current"] = None if self.current is None else self.current.to_dict()
        d["rejected"] = [{"config": c, "why": w} for c, w in self.rejected]
        if self.tuned is not None:
            d["tuned"] = {"xla_flags": self.tuned.plan.xla_flags(),
                          "lagom_ms": self.tuned.predicted_ms("lagom"),
                          "xla_default_ms": self.tuned.predicted_ms("xla-default")}
        return json.dumps(d, indent=2)


# What each attention choice was priced as, in the words of MaxText's fragment.
MAXTEXT_ATTENTION_PRICED = {
    "flash": "JAX's Pallas flash-attention kernel (jax.experimental.pallas.ops.gpu.attention.mha), "
             "what MaxText's attention=flash runs on GPUs; not cudnn_flash_te",
    "xla": "XLA's attention with the scores materialised",
}


def maxtext_fragment(c: TrainCandidate, gpus: int, gpus_per_node: int) -> str:
    """MaxText's names for a candidate: the mesh split into ici (inside a node) and dcn
    (across nodes) parts, filled innermost first (expert, model, stage, fsdp, data: the layout
    of the contract's mesh), the per-device batch per GPU, accumulation or a pipeline's
    micro-batches, remat, attention."""
    room = gpus_per_node
    ici, dcn = {}, {}
    for axis in ("expert", "model", "stage", "fsdp", "data"):
        n = c.mesh.get(axis, 1)
        inside = math.gcd(n, room)
        ici[axis], dcn[axis] = inside, n // inside
        room //= inside
    ways = math.prod(c.mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
    per_gpu = c.per_device_batch * ways * (c.grad_accum if c.pipelined else 1) / gpus
    names = {"data": "data", "fsdp": "fsdp", "stage": "pipeline", "model": "tensor", "expert": "expert"}
    axes = ("data", "fsdp", "stage", "model", "expert") if c.pipelined else ("data", "fsdp", "model", "expert")
    steps = (["gradient_accumulation_steps: 1", f"num_pipeline_microbatches: {c.grad_accum}"] if c.pipelined
             else [f"gradient_accumulation_steps: {c.grad_accum}"])
    lines = [f"per_device_batch_size: {per_gpu:g}", *steps, f"remat_policy: {c.remat}",
             # MaxText's GPU "flash" is the kernel priced here: JAX's Pallas mha with the kv heads
             # repeated (AI-Hypercomputer/maxtext layers/attention_op.py, ``gpu_pallas_attention.mha``);
             # "cudnn_flash_te" (cuDNN through Transformer Engine) is another kernel, not priced.
             f"# attention: lagom-jax priced {MAXTEXT_ATTENTION_PRICED[c.attention]}",
             f"attention: {'flash' if c.attention == 'flash' else 'dot_product'}  # priced as said above",
             "scan_layers: true"]
    lines += [f"ici_{names[a]}_parallelism: {ici[a]}" for a in axes]
    lines += [f"dcn_{names[a]}_parallelism: {dcn[a]}" for a in axes]
    return report_lib.wrap(lines)


def _divisors_upto(n: int, cap: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (cap is None or d <= cap)]


def _layer_groups(family: str, dims: Mapping[str, int], seq_len: int) -> list[tuple[int, dict[str, float]]]:
    """The layers of ``family`` as (how many, forward FLOPs per token of each part): ``qkv``
    and ``out`` (attention's projections), ``attn`` (scores and values: half the square where
    causal), ``wi`` and ``wo`` (the MLP's input and output matmuls, top-k experts for MoE).
    A T5 decoder layer adds cross-attention (projections and full scores) to causal
    self-attention."""
    L, d, h, kv, ff = (dims[k] for k in ("layers", "d_model", "heads", "kv_heads", "ffn"))
    hd = dims.get("head_dim") or d // h
    k = dims.get("top_k") or 1
    gated = family in GATED_FAMILIES
    qkv, out = 2 * d * (h + 2 * kv) * hd, 2 * h * hd * d
    causal, full = 2 * seq_len * h * hd, 4 * seq_len * h * hd
    mlp = {"wi": 2 * (2 if gated else 1) * d * ff * k, "wo": 2 * d * ff * k}
    if family == "t5":
        enc = {"qkv": qkv, "out": out, "attn": full, **mlp}
        dec = {"qkv": 2 * qkv, "out": 2 * out, "attn": causal + full, **mlp}
        return [(L, enc), (dims.get("dec_layers", 0), dec)]
    return [(L, {"qkv": qkv, "out": out, "attn": full if family == "bert" else causal, **mlp})]


def state_bytes_per_gpu(family: str, dims: Mapping[str, int], mesh: Mapping[str, int]) -> float:
    """Float32 weights and Adam moments one GPU holds on ``mesh`` (bytes): every matrix over
    fsdp (its embed dimension) and model (heads, kv heads, MLP, vocab), experts also over
    expert (models/sharding.py's rules); norms and biases over fsdp; the layers over stage."""
    f, t, e, s = (mesh.get(a, 1) for a in ("fsdp", "model", "expert", "stage"))
    L, d, h, kv, ff, v = (dims[k] for k in ("layers", "d_model", "heads", "kv_heads", "ffn", "vocab"))
    hd = dims.get("head_dim") or d // h
    attn = d * (h + 2 * kv) * hd + h * hd * d
    positions = dims.get("max_len") or dims["seq_len"]
    matrices = L * attn  # the layers' matrices, sharded over fsdp x model (and stage)
    if family in BLOCK_FAMILIES:
        mlp, small = 2 * d * ff, (0 if family == "t5" else 9 * d + ff)  # T5 has no biases, RMS norms
        embed = v * d + (positions * d if family != "t5" else 0)
        matrices += L * mlp + dims.get("dec_layers", 0) * (2 * attn + mlp)
        smalls = L * max(small, 2 * d) + dims.get("dec_layers", 0) * 3 * d
        # The final norm; BERT's token types, embedding norm and masked-LM head (a d x d
        # transform with its bias and norm, a bias per word); T5's relative-position biases
        # (32 buckets per head, encoder and decoder) and two final norms.
        tail = {"bert": 5 * d + v + 2 * d, "t5": 2 * d + 2 * 32 * h}.get(family, 2 * d)
        if family == "bert":
            embed += d * d
    else:
        mlp, embed = 3 * d * ff, 2 * v * d
        experts = dims.get("experts", 0)
        if experts:
            matrices += L * experts * mlp / e
            smalls = L * (d * experts + 2 * d)
        else:
            matrices += L * mlp
            smalls = L * 2 * d
        tail = d  # the final norm
    return STATE_BYTES * ((matrices / s + embed) / (f * t) + (smalls / s + tail) / f)


def model_flops_per_token(family: str, dims: Mapping[str, int], seq_len: int) -> float:
    """Training FLOPs per token (forward + backward, no recomputation): 3 x the forward of
    every layer (6 x the matmul parameters a token meets, top-k experts for MoE, plus the
    attention scores: ``6 L s h d_head`` causal, twice that bidirectional), plus the
    vocabulary projection, as MaxText and Megatron count them."""
    d, v = dims["d_model"], dims["vocab"]
    layers = sum(n * sum(parts.values()) for n, parts in _layer_groups(family, dims, seq_len))
    return 3 * layers + 6 * v * d + (6 * d * d if family == "bert" else 0)


def _mesh_str(mesh: Mapping[str, int]) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "data=1"


def _recomputed_flops_per_token(family: str, dims: Mapping[str, int], seq_len: int, remat: str) -> float:
    """Forward FLOPs per token a remat policy computes again in the backward pass: the matmuls
    whose outputs the policy does not keep and the backward needs. The backward needs every
    matmul's input (for its weight gradient): attention's output (the output projection's
    input) and the output projection's (through the residual and the norm, the MLP's input).
    The MLP's last output only goes to the next layer, whose input is kept. So ``full``
    recomputes the q/k/v and output projections, attention and the MLP's input matmuls;
    ``save_qkv_proj`` all but the q/k/v projections; ``save_dot_except_mlp(wi)`` attention and
    the MLP's input matmuls; ``minimal`` (every matmul without batch dimensions kept)
    attention; ``minimal_flash`` and ``none`` nothing. In a MoE layer the router's gradient
    needs each expert's output, so the experts' output matmul is recomputed too unless kept
    (``save_dot_except_mlpwi`` keeps it), and the expert matmuls carry the expert as a batch
    dimension, so ``minimal`` and ``minimal_flash`` recompute them."""
    moe = bool(dims.get("experts"))
    total = 0.0
    for n, p in _layer_groups(family, dims, seq_len):
        wo = p["wo"] if moe else 0.0  # an expert's output, for the router
        per_layer = {"full": p["qkv"] + p["attn"] + p["out"] + p["wi"] + wo,
                     "save_qkv_proj": p["attn"] + p["out"] + p["wi"] + wo,
                     "save_dot_except_mlp": p["attn"] + p["wi"] + wo, "save_dot_except_mlpwi": p["attn"] + p["wi"],
                     "minimal": p["attn"] + (p["wi"] + wo if moe else 0), "minimal_flash": p["wi"] + wo if moe else 0}
        total += n * per_layer.get(remat, 0)
    return total


# Families whose self-attention is causal (XLA's attention still computes the whole square).
CAUSAL_FAMILIES = frozenset({"gpt2", "llama", "mixtral", "gpt"})


def _part_shapes(family: str, dims: Mapping[str, int], tokens: int, t: int) -> dict[str, tuple[int, int, int]]:
    """A representative forward matmul ``(m, n, k)`` of each layer part on one tensor-parallel
    rank for ``tokens`` rows: what sets the rate the part's FLOPs run at."""
    d, h, kv, ff = (dims[k] for k in ("d_model", "heads", "kv_heads", "ffn"))
    hd = dims.get("head_dim") or d // h
    wide = (2 if family in GATED_FAMILIES else 1) * ff
    rows = tokens * max(1, dims.get("top_k") or 1)
    return {"qkv": (tokens, max(1, (h + 2 * kv) * hd // t), d), "out": (tokens, d, max(1, h * hd // t)),
            "wi": (rows, max(1, wide // t), d), "wo": (rows, d, max(1, ff // t))}


def _forward_bytes_per_token(family: str, dims: Mapping[str, int], seq_len: int, t: int, attention: str) -> float:
    """Bytes the memory-bound kernels of one layer's forward read and write per token (bf16):
    two norms and two residual adds over the model width, the MLP's activation over its width
    (a gated MLP reads two), the attention inputs' relayouts, and with XLA's attention its
    scores (materialised, softmax in float32: read and written twice). A rough count; the
    calibration (``Screen.fit``) weighs it against the compiled steps."""
    d, h, ff = dims["d_model"], dims["heads"], dims["ffn"]
    hd = dims.get("head_dim") or d // h
    k = max(1, dims.get("top_k") or 1)
    act = (3 if family in GATED_FAMILIES else 2) * ff * k / t
    elems = 10 * d + act + 4 * h * hd / t
    scores = 6.0 * h / t * seq_len if attention == "xla" else 0.0
    return 2.0 * elems + scores


def screen_terms(family: str, dims: Mapping[str, int], mesh: Mapping[str, int], hw: hardware_lib.HardwareProfile,
                 *, global_batch: int, seq_len: int, per_device_batch: int | None = None,
                 remat: str = "full", attention: str = "flash") -> dict[str, float]:
    """The closed-form parts of one configuration's step (ms), before calibration (``Screen``).

    ``compute``: the training FLOPs plus what ``remat`` recomputes, each layer part's at the
    rate the matmul model (``costs.kernels.gemm_time_us``) gives its shape at the micro-step's
    tokens, flash attention at cuDNN's rate, XLA's attention as batched matmuls over the whole
    square; on a pipeline each of the ``g + S - 1`` ticks runs a stage's layers (GPipe's
    bubble). ``memory``: the memory-bound kernels (norms, activations, residuals, XLA's
    attention scores) per layer and micro-step at the achieved HBM rate, their launches, and
    the optimizer's passes over the state (per micro-step, as the compiled steps are predicted;
    once in a pipeline). ``exposed``: per micro-step and layer the
    tensor-parallel all-reduces of the activations (2 forward, 2 backward, 2 more where the
    forward is recomputed) and the expert all-to-alls (2 each way), which sit between dependent
    matmuls, a pipeline's sends between stages (one each way per tick) and the data-parallel
    gradient all-reduce (after the scanned backward, per accumulation step); ``weights``: per
    micro-step the fsdp weight all-gathers (forward and backward) and gradient reduce-scatter,
    which overlap the layers' compute; both in bfloat16, as XLA compiles them. ``g``
    = local batch / ``per_device_batch`` (default 1 sequence) micro-steps: accumulation steps,
    or on a ``stage`` axis of S the pipeline's micro-batches."""
    d, f, t, e, st = (mesh.get(a, 1) for a in ("data", "fsdp", "model", "expert", "stage"))
    dm = dims["d_model"]
    # Layers that each gather their weights; a T5 decoder layer has three sublayers to two.
    L = dims["layers"] + dims.get("dec_layers", 0)
    sublayer_pairs = dims["layers"] + 1.5 * dims.get("dec_layers", 0)
    gpn = hw.gpus_per_node
    local = global_batch // (d * f * e)
    b = per_device_batch or 1
    g = max(1, local // b)
    ticks = g + st - 1 if st > 1 else g
    tokens = b * seq_len  # one micro-step's rows on one rank
    # Compute: a layer's parts at their shapes' rates, forward once, backward twice, plus what
    # the policy recomputes (in the proportions of the forward).
    recompute = _recomputed_flops_per_token(family, dims, seq_len, remat)
    forward = sum(n * sum(p.values()) for n, p in _layer_groups(family, dims, seq_len))
    passes = 3 + recompute / forward
    shapes = _part_shapes(family, dims, tokens, t)
    rate = {part: kernels.gemm_tflops(*shape, hw) for part, shape in shapes.items()}
    att = kernels.attention_rates(hw)
    layer_us = 0.0
    for n, parts in _layer_groups(family, dims, seq_len):
        us = sum(parts[k] / t * tokens / (rate[k] * 1e6) for k in shapes)
        attn = parts["attn"] / t * tokens
        if attention == "xla":  # the whole square as batched matmuls, where causal too
            heads, hd = max(1, dims["heads"] // t), dims.get("head_dim") or dm // dims["heads"]
            square = attn * (2 if family in CAUSAL_FAMILIES else 1)
            layer_us += n * (us + square / (kernels.gemm_tflops(seq_len, seq_len, hd, hw, batch=b * heads) * 1e6)) * passes
        else:
            layer_us += n * (us * passes + attn / (att.forward * 1e6) * (1 + recompute / forward)
                             + 2 * attn / (att.backward * 1e6))
    v = dims["vocab"]
    # A pipeline's head runs once on the rank's micro-batches, on a stage's share where it is whole.
    head_rows = tokens * g // (st if local % st == 0 else 1) if st > 1 else tokens
    head_us = 3 * 2 * v * dm / t * head_rows / (kernels.gemm_tflops(head_rows, max(1, v // t), dm, hw) * 1e6)
    compute = ticks * layer_us / st + (1 if st > 1 else g) * head_us
    # Memory-bound kernels: per layer and micro-step, each with its launch, and the optimizer.
    # What a policy keeps is stored into the scan's stacked buffers (zero-filled first) in the
    # forward and read back in the backward, some of it in float32: about four forwards' traffic
    # when everything is kept, half of one when the matmul outputs are; a pipeline's tick loop
    # stacks its layers' stacks once more. (Read off the compiled steps of gpt2 355M and BERT
    # large on 8 GPUs, ``benchmarks/predicted/advise.py``.)
    kept = {"full": 0.0, "none": 4.0}.get(remat, 0.5)
    if st > 1 and remat != "full":
        kept += 1.5
    per_layer = _forward_bytes_per_token(family, dims, seq_len, t, attention) * tokens * (passes + kept)
    kernels_per_layer = 12 * passes
    layer_mem = per_layer / (hw.achieved_hbm_gbps * 1e3) + kernels_per_layer * hw.launch_us
    state = state_bytes_per_gpu(family, dims, mesh)
    # AdamW as XLA compiles optax's update moves OPTIMIZER_TRAFFIC times the state's bytes; a
    # step of g accumulation steps is predicted as g micro-steps, each with its update
    # (``advise_train_step``), a pipeline's micro-batches as one step with one.
    optimizer = state * OPTIMIZER_TRAFFIC / (hw.achieved_hbm_gbps * 1e3)
    memory_us = ticks * L / st * layer_mem + (1 if st > 1 else g) * optimizer
    act = b * seq_len * dm * 2
    exposed = 0.0
    if t > 1:
        exposed += (6 if remat == "full" else 4) * sublayer_pairs / st * _coll_us("all-reduce", act, t, 1, hw)
    if e > 1:
        exposed += 4 * L / st * _coll_us("all-to-all", act * max(1, dims.get("top_k") or 1), e, 1, hw)
    # Stages hold groups of f x t x e neighbouring GPUs: a send crosses nodes once they fill one.
    sends = 2 * _coll_us("collective-permute", act / t, 2, 1 if f * t * e * st <= gpn else 2, hw) if st > 1 else 0.0
    # bfloat16: XLA converts the float32 weights before gathering them, and reduces bf16 gradients.
    layer_bytes = state_bytes_per_gpu(family, dims, {"fsdp": 1, "model": t, "expert": e}) / STATE_BYTES * 2 / L
    weights = 0.0
    if f > 1:
        fn = max(1, min(-(-f * t * e // gpn), -(-d * f * t * e * st // gpn)))
        weights += L / st * (2 * _coll_us("all-gather", layer_bytes, f, fn, hw)
                             + _coll_us("reduce-scatter", layer_bytes, f, fn, hw))
    # The data-parallel gradient all-reduce: after the scanned backward of each micro-step; in
    # the GPipe step once, after the tick loop, of the stage's float32 gradient sums
    # (models/pipeline.py).
    all_reduce = 0.0
    if d > 1:
        dn = max(1, -(-d * f * t * e * st // gpn) // max(1, -(-f * t * e * st // gpn)))
        all_reduce = _coll_us("all-reduce", L / st * layer_bytes / f * (2 if st > 1 else 1), d, dn, hw)
    return {"compute": compute / 1e3, "memory": memory_us / 1e3,
            "exposed": (ticks * (exposed + sends) + (all_reduce if st > 1 else g * all_reduce)) / 1e3,
            "weights": ticks * weights / 1e3}


# The most a calibration may scale one part: the compiled step adds memory-bound kernels and
# overheads to each part, but a part priced at a tenth of what it costs is a fit to noise.
MAX_PART_WEIGHT = 10.0
# The least share of some fitted step a part must have for the calibration to weigh it alone.
MIN_PART_SHARE = 0.1
# Shares of the compute under which the weights' traffic may hide, tried by the calibration.
_HIDDEN_SHARES = tuple(i / 8 for i in range(13))


@dataclasses.dataclass(frozen=True)
class Screen:
    """A step time from ``screen_terms``: ``a x compute + m x memory + b x exposed + c x max(0,
    weights - hidden x compute)``. Uncalibrated (``UNCALIBRATED``): every part as priced, the
    weights' traffic past 2/3 of the compute. ``Screen.fit`` calibrates it on compiled
    predictions of the same configurations."""
    compute: float = 1.0
    memory: float = 1.0
    exposed: float = 1.0
    weights: float = 1.0
    hidden: float = 2 / 3
    fitted_on: int = 0

    def __call__(self, terms: Mapping[str, float]) -> float:
        return (self.compute * terms["compute"] + self.memory * terms["memory"] + self.exposed * terms["exposed"]
                + self.weights * max(0.0, terms["weights"] - self.hidden * terms["compute"]))

    @classmethod
    def fit(cls, pairs: Sequence[tuple[Mapping[str, float], float]]) -> Screen:
        """The calibration closest to ``pairs`` (terms, compiled ms) in relative error, of two
        forms: one scale of the uncalibrated screen, or a weight per part (``_fit_parts``).
        The form is chosen by leave-one-out error (each pair priced by the fit to the others),
        so a few pairs that cannot tell the parts apart get one scale, not a law that fits
        them and nothing else."""
        if not pairs:
            return cls()
        if len(pairs) < 3:
            return cls._fit_scale(pairs)
        forms = (cls._fit_scale, cls._fit_parts)

        def held_out(form: Callable[[Sequence[tuple[Mapping[str, float], float]]], Screen]) -> float:
            return sum((form([*pairs[:i], *pairs[i + 1:]])(t) / ms - 1) ** 2 for i, (t, ms) in enumerate(pairs))

        return min(forms, key=held_out)(pairs)

    @classmethod
    def _fit_scale(cls, pairs: Sequence[tuple[Mapping[str, float], float]]) -> Screen:
        ratios = [UNCALIBRATED(t) / ms for t, ms in pairs]
        k = sum(ratios) / sum(r * r for r in ratios)
        return cls(k, k, k, k, UNCALIBRATED.hidden, len(pairs))

    @classmethod
    def _fit_parts(cls, pairs: Sequence[tuple[Mapping[str, float], float]]) -> Screen:
        """For each hidden share, the least-squares weights of the four parts in relative error,
        each between 0 and ``MAX_PART_WEIGHT`` (every subset of parts solved exactly: at most 15
        solves); the best."""
        import numpy as np

        y = np.array([ms for _, ms in pairs])
        scale = cls._fit_scale(pairs).compute
        best: tuple[float, Screen] | None = None
        for hidden in _HIDDEN_SHARES:
            cols = np.array([[t["compute"], t["memory"], t["exposed"], max(0.0, t["weights"] - hidden * t["compute"])]
                             for t, _ in pairs]) / y[:, None]
            # A part that is never a tenth of a fitted step cannot be told from noise: it keeps
            # the one scale (a weight fitted on it would price the meshes where it dominates).
            weak = [i for i in range(4) if cols[:, i].max() < MIN_PART_SHARE]
            target = 1 - scale * cols[:, weak].sum(axis=1)
            free = [i for i in range(4) if i not in weak]
            for mask in range(1, 1 << len(free)):
                use = [free[j] for j in range(len(free)) if mask >> j & 1]
                coef, *_ = np.linalg.lstsq(cols[:, use], target, rcond=None)
                if (coef < 0).any() or (coef > MAX_PART_WEIGHT).any():
                    continue
                full = np.zeros(4)
                full[use] = coef
                full[weak] = scale
                err = float(((cols @ full - 1) ** 2).sum())
                if best is None or err < best[0] - 1e-12:
                    best = (err, cls(*map(float, full), hidden, len(pairs)))
        return best[1] if best is not None else cls._fit_scale(pairs)


UNCALIBRATED = Screen()


def best_batch(screen: Callable[[int], float], local_batch: int) -> tuple[int, float]:
    """The per-device batch (a divisor of the rank's ``local_batch``) ``screen`` prices fastest,
    and its price: what a mesh can reach if memory allows (a mesh judged at one sequence per
    micro-step would carry a gradient all-reduce per sequence that a larger batch pays once)."""
    return min(((b, screen(b)) for b in _divisors_upto(local_batch)), key=lambda bt: bt[1])


def mesh_screen_us(family: str, dims: Mapping[str, int], mesh: Mapping[str, int], hw: hardware_lib.HardwareProfile,
                   *, global_batch: int, seq_len: int, attention: str = "flash") -> float:
    """The uncalibrated screen of ``mesh`` with ``full`` remat at its best per-device batch (us);
    a pipeline's (a ``stage`` axis) with XLA's attention, the only one its stages run."""
    if mesh.get("stage", 1) > 1:
        attention = "xla"
    local = global_batch // math.prod(mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
    return best_batch(lambda b: UNCALIBRATED(screen_terms(family, dims, mesh, hw, global_batch=global_batch,
                                                          seq_len=seq_len, per_device_batch=b,
                                                          attention=attention)), local)[1] * 1e3


def _full_mesh(mesh: Mapping[str, int]) -> dict[str, int]:
    """Every axis of the search with its size, in the contract's order; a stage or context axis
    only where the mesh has one (the search tries neither, so a mesh reads as it always has)."""
    return {a: int(mesh.get(a, 1)) for a in predict.MESH_AXES
            if a not in ("stage", "context") or mesh.get(a, 1) > 1}


def _family_meshes(family: str, dims: Mapping[str, int], gpus: int, gpus_per_node: int,
                   global_batch: int, pipeline: bool = True) -> tuple[list[dict[str, int]], list[tuple[str, str]]]:
    """Every data x fsdp x stage x model x expert mesh of ``gpus`` with model x expert inside a
    node, and the ones arithmetic rules out, with why. A stage axis (GPipe) must divide the
    layers (a T5's encoder and decoder both)."""
    keep, out = [], []
    experts = dims.get("experts", 0)
    stacks = [dims["layers"]] + ([dims["dec_layers"]] if dims.get("dec_layers") else [])
    for t in _divisors_upto(gpus, gpus_per_node):
        for e in (_divisors_upto(gpus // t, gpus_per_node // t) if experts else [1]):
            if gpus_per_node % (t * e) and t * e < gpus:
                continue  # a model x expert group must tile a node
            for s in (_divisors_upto(gpus // (t * e)) if pipeline else [1]):
                rest = gpus // (t * e * s)
                for f in _divisors_upto(rest):
                    mesh = _full_mesh({"data": rest // f, "fsdp": f, "stage": s, "model": t, "expert": e})
                    why = []
                    for name in ("heads", "kv_heads", "ffn", "vocab"):
                        if dims[name] % t:
                            why.append(f"model {t} does not divide {name} {dims[name]}")
                    if dims["d_model"] % f:
                        why.append(f"fsdp {f} does not divide d_model {dims['d_model']}")
                    if any(n % s for n in stacks):
                        why.append(f"stage {s} does not divide the {' and '.join(map(str, stacks))} layers")
                    if experts and experts % e:
                        why.append(f"expert {e} does not divide {experts} experts")
                    ways = (rest // f) * f * e
                    if global_batch % ways:
                        why.append(f"global batch {global_batch} not divisible by data x fsdp x expert {ways}")
                    (out.append((_mesh_str(mesh), "; ".join(why))) if why else keep.append(mesh))
    return keep, out


def kept_mlp_bytes(family: str, dims: Mapping[str, int], mesh: Mapping[str, int], sequences: int,
                   remat: str) -> float:
    """A lower bound of what one GPU keeps for the backward pass under ``remat``: the MLP's
    activations of every layer it holds, in bfloat16, where the policy keeps them. ``none``
    keeps every value the backward needs: the input matmuls' outputs (gate and up of a gated
    MLP; the activation's input otherwise) and the output matmul's input. ``minimal`` and
    ``minimal_flash`` keep the outputs of every matmul without batch dimensions, which a dense
    MLP's input matmuls are and a MoE layer's expert matmuls (the expert a batch dimension) are
    not; the name-based policies keep no ``mlpwi``. ``sequences``: those whose activations are
    alive at once (a micro-step's, or a pipeline's whole per-rank batch). A MoE layer's expert
    matmuls see each token ``top_k`` times (at least: capacity only adds slots)."""
    experts = dims.get("experts", 0)
    gated = family in GATED_FAMILIES
    if remat == "none":
        per_row = 3 if gated else 2
    elif remat in ("minimal", "minimal_flash") and not experts:
        per_row = 2 if gated else 1
    else:
        return 0.0
    t, s = mesh.get("model", 1), mesh.get("stage", 1)
    rows = sequences * dims["seq_len"] * ((dims.get("top_k") or 1) if experts else 1)
    layers = (dims["layers"] + dims.get("dec_layers", 0)) / s
    return layers * rows * per_row * dims["ffn"] / t * 2


def step_source(family: str, dims: Mapping[str, int], *, global_batch: int, mesh: Mapping[str, int],
                remat: str, attention: str, compiler_options: Mapping[str, Any] | None = None,
                microbatches: int | None = None) -> job_lib.ModelSource:
    """The train step of one configuration as a ``job.ModelSource``: the prediction contract's
    step for llama, mixtral and gpt (gpt2 is gpt at its config's dimensions), the built-in
    model at these dimensions for bert and t5. ValueError names what does not fit."""
    if family not in ("bert", "t5"):
        return predict.train_step_source(
            "gpt" if family == "gpt2" else family, layers=dims["layers"], d_model=dims["d_model"],
            heads=dims["heads"], kv_heads=dims["kv_heads"], ffn=dims["ffn"], vocab=dims["vocab"],
            seq_len=dims["seq_len"], global_batch=global_batch, mesh=mesh, remat=remat, experts=dims.get("experts", 0),
            top_k=dims.get("top_k", 0), attention=attention, compiler_options=compiler_options,
            microbatches=microbatches)
    shape = {a: int(mesh[a]) for a in predict.MESH_AXES if mesh.get(a, 1) > 1} or {"data": 1}
    if "expert" in shape:
        raise ValueError(f"{family} has no experts: the expert axis must be 1, got {shape['expert']}")
    config = dict(layers=dims["layers"], d_model=dims["d_model"], heads=dims["heads"],
                  head_dim=dims["d_model"] // dims["heads"], d_ff=dims["ffn"], vocab=dims["vocab"],
                  max_len=dims.get("max_len") or dims["seq_len"])
    if family == "t5":
        config["dec_layers"] = dims["dec_layers"]
    return job_lib.ModelSource(FAMILY_MODELS[family], ",".join(f"{k}={v}" for k, v in config.items()), shape, None,
                               global_batch, dims["seq_len"], "bfloat16", remat, True, attention, "off",
                               tuple(sorted((compiler_options or {}).items())), microbatches)


def screen_agreement(pairs: Mapping[str, tuple[float, float]], screen: Screen,
                     fitted_on: str = "compiled candidates that fit without XLA's rematerialization") -> str:
    """How far the calibrated screen is from the compiled prediction of the candidates it was
    calibrated on: ``pairs`` is label -> (screen ms, compiled ms). A sentence for the output."""
    if not pairs:
        return "No candidate compiled that fits, so the screen was not calibrated."
    errors = sorted((est / compiled - 1, label) for label, (est, compiled) in pairs.items())
    worst = max(errors, key=lambda e: abs(e[0]))
    within = sum(abs(e) <= 0.10 for e, _ in errors)
    return (f"The screen, calibrated on the {len(errors)} {fitted_on} ({screen.compute:.2f} x compute + "
            f"{screen.memory:.2f} x memory-bound kernels + {screen.exposed:.2f} x exposed collectives + {screen.weights:.2f} x weight traffic past "
            f"{screen.hidden:.2f} x compute): "
            f"{within} of {len(errors)} within 10%, median {errors[len(errors) // 2][0]:+.0%}, worst "
            f"{worst[0]:+.1%} ({worst[1]}). Every number in the table is the compiled prediction.")


class TimeLeft:
    """The seconds left that a progress line shows: the compiles left times the mean compile
    time so far, never more than the last figure shown plus the work found since. (The mean
    moves as compiles of other sizes finish; a figure that rose with it would say the search
    got longer when it only got better measured.)"""

    def __init__(self) -> None:
        self.shown: float | None = None
        self.planned = 0

    def __call__(self, left: int, planned: int, seconds_each: float) -> float:
        estimate = left * seconds_each
        if self.shown is not None:
            estimate = min(estimate, self.shown + max(0, planned - self.planned) * seconds_each)
        self.shown, self.planned = estimate, planned
        return estimate


def advise_train_step(family: str, *, layers: int, d_model: int, heads: int, kv_heads: int = 0, ffn: int,
                      vocab: int, experts: int = 0, top_k: int = 0, dec_layers: int = 0, max_len: int = 0,
                      gpus: int, hardware: str | hardware_lib.HardwareProfile, global_batch: int, seq_len: int,
                      current: Mapping[str, Any] | None = None, memory_fraction: float | None = None,
                      top: int = DEFAULT_TOP, jobs: int | None = None,
                      mesh_finalists: int = DEFAULT_MESH_FINALISTS, max_probes: int = DEFAULT_MAX_PROBES,
                      meshes: Sequence[Mapping[str, int]] | None = None,
                      remats: Sequence[str] | None = None, attentions: Sequence[str] | None = None,
                      tune: bool = False, cache: bool = True, xla_flags: Mapping[str, Any] | None = None,
                      pipeline: bool | None = None, progress: Progress | None = None) -> TrainAdvice:
    """The fastest configurations of ``family``'s training step that fit in GPU memory.

    family: one of ``FAMILY_MODELS`` (llama, mixtral and gpt at ``predict_train_step_ms``'s
    dimensions; gpt2, bert and t5 with their configs' ``max_len`` and, for t5, ``dec_layers``:
    ``advise`` fills them from a named config); kv_heads defaults to heads; gpus on
    ``hardware`` (a preset; nodes = gpus / GPUs per node); global_batch sequences of seq_len per step. current: the user's configuration
    ({"mesh": {...}, "per_device_batch": b, "grad_accum": g, "remat": ..., "attention": ...}),
    always compiled and returned as ``current``. memory_fraction: the share of GPU memory
    XLA gets (default ``XLA_PYTHON_CLIENT_MEM_FRACTION``, else JAX's 0.75).

    The search (each stage prunes the next; ``TrainAdvice.pruning`` says it with numbers):

    1. arithmetic, nothing compiled: meshes data x fsdp x stage x model x expert with model x
       expert inside a node whose sizes divide heads, kv heads, ffn, vocab (model), d_model
       (fsdp), the layers (stage), experts (expert) and the global batch (data x fsdp x expert);
       then those whose float32 weights and Adam moments alone exceed the limit are rejected.
       ``pipeline``: whether stage axes (``models.build``'s GPipe, the per-rank batch in
       ``grad_accum`` micro-batches of ``per_device_batch``) are searched; default
       ``PIPELINED_BY_DEFAULT``;
    2. a probe of each mesh (compiled; the ``max_probes`` meshes the uncalibrated screen,
       ``screen_terms``, puts fastest, fastest first): per-device batch 1 with ``full`` remat,
       the least memory any configuration of that mesh needs: a mesh where it does not fit is
       out. Once ``mesh_finalists`` probes fit, the screen is calibrated on the compiled
       candidates (``Screen.fit``) after each compile, and a mesh it puts more than
       ``PROBE_MARGIN`` slower than the ``mesh_finalists``-th fastest probe is not probed;
    3. the ``mesh_finalists`` meshes of fastest probe, searched: for each remat policy from
       least memory to most (``REMAT_ORDER``), the largest per-device batch that fits, found by
       bisection over the divisors of the per-rank batch (memory rises with the batch, and a
       policy saving more cannot fit a larger batch than one saving less, so each policy's
       bisection starts at or below the last); every compiled configuration that fits is ranked;
    4. the other attention implementation (XLA's materialised scores, where flash applies)
       at the best configuration found.

    The screen's calibration on every compiled candidate that fits, and how far it is from
    each, is the last pruning line. A configuration asked for twice (the user's own and a
    probe) is compiled once; two that lower to the same program share one XLA compile
    (``memory.compile_step``).

    A micro-step is compiled deviceless and predicted as ``predict_train_step_ms`` would
    (same step, ``xla-default``); a step of ``grad_accum`` micro-steps is predicted as that
    many micro-steps (an upper bound by ``grad_accum - 1`` optimizer updates) and needs a
    float32 gradient accumulator beside the micro-step's peak. Compiles run in ``jobs``
    parallel processes (default: the CPU count) and are cached by fingerprint.
    ``tune``: also run the best candidate through the pipeline (``job.run``, lagom) and
    keep the Job in ``tuned``. ``xla_flags``: the run's XLA flags, applied to every compile
    (and the NCCL channel cap to the prediction), as ``predict_train_step_ms`` applies them. Raises ValueError for input no mesh or split can use and
    NothingFits (a ValueError) when nothing fits, naming the smallest memory found and what
    would fit.
    """
    import concurrent.futures
    import os
    import tempfile
    import threading
    import time

    say = progress or (lambda _m: None)
    start = time.monotonic()
    if family not in FAMILY_MODELS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILY_MODELS)}")
    if family == "t5" and dec_layers < 1:
        raise ValueError(f"t5 needs dec_layers >= 1 (decoder layers), got {dec_layers}")
    kv_heads = kv_heads or heads
    if family in BLOCK_FAMILIES and kv_heads != heads:
        raise ValueError(f"{family} has no grouped-query attention: kv_heads {kv_heads} must equal heads {heads}")
    if max_len and seq_len > max_len:
        raise ValueError(f"seq_len {seq_len} is longer than the model's {max_len} positions")
    dims = dict(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab,
                experts=experts, top_k=top_k, seq_len=seq_len)
    dims.update({k: v for k, v in dict(dec_layers=dec_layers, max_len=max_len).items() if v})
    for name in ("layers", "d_model", "heads", "kv_heads", "ffn", "vocab", "gpus", "global_batch",
                 "seq_len", "top", "mesh_finalists"):
        value = dims.get(name, locals()[name])
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    hw = predict._cluster(hardware, gpus)  # noqa: SLF001 - the contract's cluster; ValueError if not whole nodes
    options, cap, runtime = predict._split_flags(xla_flags)  # noqa: SLF001 - the contract's reading of flags
    hw = predict._with_nccl_settings(hw, cap, None, runtime)  # noqa: SLF001
    fraction = memory.memory_fraction(memory_fraction)
    gpu_bytes = memory.gpu_memory_bytes(hw)
    limit = int(gpu_bytes * fraction)
    gib = 2 ** 30
    hd = d_model // heads if d_model % heads == 0 else 0
    # T5's attention carries a position bias, which the flash kernel does not take: the step
    # runs XLA's attention under either name.
    flash_ok = seq_len % 16 == 0 and hd >= 16 and family != "t5"
    attns = list(attentions or (("flash", "xla") if flash_ok else ("xla",)))
    if "flash" in attns and not flash_ok:
        raise ValueError(f"flash attention needs seq_len a multiple of 16 and head_dim >= 16 (got "
                         f"{seq_len}, {hd}) and a model without a position bias (not t5); use attention xla")
    policies = [r for r in (remats or (GPT_REMATS if family in BLOCK_FAMILIES else REMAT_ORDER))]
    policies.sort(key=REMAT_ORDER.index)
    pruning: list[str] = []

    # 1. arithmetic
    if pipeline is None:
        pipeline = family in PIPELINED_BY_DEFAULT
    all_meshes, rejected = _family_meshes(family, dims, gpus, hw.gpus_per_node, global_batch, pipeline)
    screened, divisibility = len(all_meshes) + len(rejected), len(rejected)
    if meshes is not None:
        wanted = [_full_mesh(m) for m in meshes]
        all_meshes = [m for m in all_meshes if m in wanted]
    if "xla" not in attns:  # the built-in pipeline's stages run XLA's attention only
        rejected += [(_mesh_str(m), "a pipeline runs XLA's attention, not asked for") for m in all_meshes
                     if m.get("stage", 1) > 1]
        all_meshes = [m for m in all_meshes if m.get("stage", 1) == 1]
    if not all_meshes:
        if not rejected:
            raise ValueError(f"no data x fsdp x model x expert mesh of {gpus} GPUs")
        batch_bad = [w for _, w in rejected if w.startswith("global batch")]  # only the batch
        if batch_bad:
            raise ValueError(f"global batch {global_batch} is divided by no mesh of {gpus} GPUs "
                             f"(every mesh spreads the batch over data x fsdp x expert); use a multiple "
                             f"of {min(int(w.rsplit(' ', 1)[1]) for w in batch_bad)}")
        raise ValueError(f"no mesh of {gpus} GPUs can run this model: "
                         + "; ".join(f"{c}: {w}" for c, w in rejected[:3]))
    survivors = []
    smallest_state = min(state_bytes_per_gpu(family, dims, m) for m in all_meshes)
    for m in all_meshes:
        state = state_bytes_per_gpu(family, dims, m)
        if state > limit:
            rejected.append((_mesh_str(m), f"weights and Adam state alone {state / gib:.1f} GiB > "
                                           f"limit {limit / gib:.1f} GiB"))
        else:
            survivors.append(m)
    pruning.append(f"{screened} meshes (model x expert inside a node; "
                   + ("pipeline stages searched" if pipeline else "no pipeline stages") + f"): {divisibility} ruled out by "
                   f"divisibility, {len(all_meshes) - len(survivors)} by weights + Adam state alone over "
                   "the limit (never compiled)"
                   + (f", {screened - divisibility - len(all_meshes)} outside the meshes asked for"
                      if meshes is not None else "") + ".")
    if len(survivors) > max_probes:
        first = "flash" if "flash" in attns else attns[0]
        order = sorted(survivors, key=lambda m: (round(mesh_screen_us(family, dims, m, hw, global_batch=global_batch,
                                                                      seq_len=seq_len, attention=first), -3),
                                                 state_bytes_per_gpu(family, dims, m)))
        pruning.append(f"The {len(survivors) - max_probes} meshes the closed-form screen (matmuls at their shapes' "
                       f"rates, memory-bound kernels, tensor and expert collectives, fsdp/data traffic past 2/3 of "
                       f"the compute) puts slowest are not probed (--max-probes {max_probes}).")
        survivors = order[:max_probes]
    if not survivors and current is None:
        need = math.ceil(smallest_state / limit * gpus)
        more = need if need <= hw.gpus_per_node else hw.gpus_per_node * -(-need // hw.gpus_per_node)
        raise NothingFits(
            f"nothing fits: the weights and Adam state alone need at least {smallest_state / gib:.1f} GiB "
            f"per GPU over the {limit / gib:.1f} GiB limit ({fraction:g} x {gpu_bytes / gib:.1f} GiB); "
            f"about {more} GPUs would hold them")
    lock = threading.Lock()
    counts = {"compiles": 0, "cached": 0, "seconds": 0.0}
    results: dict[tuple, TrainCandidate] = {}
    failures: dict[tuple, str] = {}
    pending: dict[tuple, threading.Event] = {}  # set once the configuration's answer is in
    workers = max(1, jobs or os.cpu_count() or 1)
    planned = {"n": 0}
    time_left = TimeLeft()
    searched: set[tuple] = set()  # what the search evaluated (the user's own configuration aside)

    def local_batch(m: Mapping[str, int]) -> int:
        return global_batch // math.prod(m.get(a, 1) for a in ("data", "fsdp", "expert"))


    def evaluate(m: Mapping[str, int], b: int, g: int, remat: str, attention: str, note: str = ""
                 ) -> TrainCandidate | None:
        """Compile and predict one configuration (cached in ``results``)."""
        key = (tuple(sorted(m.items())), b, g, remat, attention)
        with lock:
            if not note:
                searched.add(key)
            running = pending.get(key)
            if running is None:
                pending[key] = threading.Event()
        if running is not None:  # asked for again (or compiling in another thread): one compile
            running.wait()
            return results.get(key)
        try:
            return compile_one(key, m, b, g, remat, attention, note)
        finally:
            pending[key].set()

    def compile_one(key: tuple, m: Mapping[str, int], b: int, g: int, remat: str, attention: str,
                    note: str) -> TrainCandidate | None:
        ways = math.prod(m.get(a, 1) for a in ("data", "fsdp", "expert"))
        # A pipeline runs its g micro-batches in one compiled step; otherwise g accumulation
        # steps each run the compiled micro-step.
        staged = m.get("stage", 1) > 1
        batch, micro = (b * g * ways, g) if staged else (b * ways, None)
        try:
            src = step_source(family, dims, global_batch=batch, mesh=m, remat=remat, attention=attention,
                              microbatches=micro)
            t0 = time.monotonic()
            step, hit = memory.compile_step(hw, src.model, src.config, src.shape(), batch_size=batch,
                                            seq_len=seq_len, remat=remat, attention=attention,
                                            limit_bytes=limit, options=options, cache=cache,
                                            programs=programs and programs.name, microbatches=micro)
        except (ValueError, memory.CompileFailed) as err:
            with lock:
                failures[key] = str(err)
            say(f"  {_mesh_str(m)} b={b} {remat} {attention}: not compiled: {str(err)[:200]}")
            return None
        state = state_bytes_per_gpu(family, dims, m)
        accumulates = g > 1 and not staged
        peak = step.peak_bytes + (int(GRAD_ACCUM_BYTES / STATE_BYTES * state) if accumulates else 0)
        step_ms = step.step_ms if staged else g * step.step_ms
        tokens = global_batch * seq_len
        tps = tokens / (step_ms / 1e3) / gpus
        mfu = model_flops_per_token(family, dims, seq_len) * tps / (hw.peak_tflops * 1e12)
        fits = peak <= limit
        why = (f"peak {peak / gib:.1f} GiB ({'fits' if fits else 'over'} the {limit / gib:.1f} GiB limit: "
               f"arguments {step.argument_bytes / gib:.1f}, temporaries {step.temp_bytes / gib:.1f}"
               + (f", accumulator {(peak - step.peak_bytes) / gib:.1f}" if accumulates else "")
               + (f"); a {m['stage']}-stage GPipe step of {g} micro-batches" if staged
                  else f"); {g} x {step.step_ms:.1f} ms micro-step")
               + (f"; XLA rematerialized {step.remat_instructions} instructions"
                  if step.remat_instructions else "") + (f"; {note}" if note else ""))
        cand = TrainCandidate(dict(m), b, g, remat, attention, fits, peak, limit, step_ms, step.step_ms,
                              tps, mfu, step.remat_instructions, why, step.temp_bytes)
        with lock:
            results[key] = cand
            counts["compiles"] += 1
            counts["cached"] += int(hit)
            if not hit:
                counts["seconds"] += time.monotonic() - t0
            done = counts["compiles"]
            per = counts["seconds"] / max(1, done - counts["cached"])
            left = max(0, planned["n"] - done)
            seconds_left = time_left(left, planned["n"], per / workers)
        say(f"[{done} compiled, ~{left} to go, {time.monotonic() - start:.0f} s, ~{seconds_left:.0f} s "
            f"left] {cand.label()}: {'fits' if fits else 'does not fit'} {peak / gib:.1f} GiB, "
            f"{step_ms:.1f} ms")
        return cand

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    # Without the cache, configurations that lower to the same program still share a compile
    # within this run.
    programs = None if cache else tempfile.TemporaryDirectory(prefix="lagom-advise-")
    try:
        cur_future = None
        if current is not None:
            cm = _full_mesh(current["mesh"])
            if math.prod(cm.values()) != gpus:
                raise ValueError(f"current mesh {current['mesh']} has {math.prod(cm.values())} GPUs, not {gpus}")
            cb = int(current.get("per_device_batch") or 0)
            cg = int(current.get("grad_accum") or 0)
            lb = local_batch(cm) if global_batch % math.prod(cm[a] for a in ("data", "fsdp", "expert")) == 0 else 0
            if not lb:
                raise ValueError(f"current mesh {_mesh_str(cm)}: global batch {global_batch} not divisible "
                                 "by data x fsdp x expert")
            cb, cg = (cb or lb // (cg or 1)), (cg or lb // (cb or lb))
            if cb * cg != lb:
                raise ValueError(f"current: per-device batch {cb} x grad accum {cg} != {lb} sequences "
                                 f"per data x fsdp x expert rank (global batch {global_batch})")
            planned["n"] += 1
            cur_future = pool.submit(evaluate, cm, cb, cg, current.get("remat", "full"),
                                     current.get("attention", "flash" if flash_ok else "xla"),
                                     "your configuration")

        # 2. probes: per-device batch 1, full remat (the least memory of a mesh)
        probe_attn = "flash" if "flash" in attns else attns[0]
        probe_remat = policies[0]
        others = [a for a in attns if a != probe_attn]

        def attention_of(m: Mapping[str, int]) -> str:
            """The attention a mesh is searched with: the probes', except in a pipeline, whose
            stages run in a shard_map the flash kernel cannot run in (XLA's attention there)."""
            return "xla" if m.get("stage", 1) > 1 else probe_attn

        def budget(m: dict[str, int]) -> int:
            """The most compiles a finalist's batch search takes: one try and a bisection per policy
            (a pipeline's climb: every batch per policy)."""
            sizes = len(_divisors_upto(local_batch(m)))
            if m.get("stage", 1) > 1:
                return len(policies) * sizes
            return len(policies) * (1 + math.ceil(math.log2(sizes)))

        # Every later stage's most compiles are counted now, so that the time left only falls
        # as the search goes (each stage hands back what it did not use).
        finalist_reserve = sum(sorted((budget(m) for m in survivors), reverse=True)[:mesh_finalists])
        attention_reserve = len(others)
        planned["n"] += len(survivors) + finalist_reserve + attention_reserve
        say(f"screened {screened} meshes: {len(survivors)} pass arithmetic; probing each at per-device "
            f"batch 1, remat {probe_remat} ({workers} parallel compiles)")
        def terms(m: Mapping[str, int], b: int, remat: str, attention: str | None = None) -> dict[str, float]:
            return screen_terms(family, dims, m, hw, global_batch=global_batch, seq_len=seq_len,
                                per_device_batch=b, remat=remat, attention=attention or attention_of(m))

        fitted: dict[tuple, Screen] = {}

        def calibrated_on() -> list[TrainCandidate]:
            """Every compiled candidate that fits without XLA's rematerialization (a step XLA
            had to shrink is not what the screen prices)."""
            with lock:
                return sorted((c for c in results.values() if c.fits and not c.xla_remat), key=TrainCandidate.key)

        def calibration() -> Screen:
            """The screen fitted on ``calibrated_on()``."""
            done = calibrated_on()
            key = tuple(c.key() for c in done)
            if key not in fitted:
                fitted[key] = Screen.fit([(terms(c.mesh, c.per_device_batch, c.remat, c.attention), c.step_ms)
                                          for c in done])
            return fitted[key]

        def reach(c: TrainCandidate, screen: Screen) -> float:
            """What a fitting probe's mesh can reach: its compiled step scaled by the screen's
            ratio of its best per-device batch to the probe's one sequence."""
            at_one = screen(terms(c.mesh, 1, probe_remat))
            best = best_batch(lambda b: screen(terms(c.mesh, b, probe_remat)), local_batch(c.mesh))[1]
            return c.step_ms * best / at_one if at_one > 0 else c.step_ms

        # Probe the meshes fastest-first by the screen; once three probes fit, the screen is
        # calibrated on them after every compile, and a mesh whose best per-device batch it
        # puts more than PROBE_MARGIN slower than what the finalist-th probe can reach is not
        # probed: it would not be a finalist.
        queue = list(survivors)
        probes: dict[str, TrainCandidate | None] = {}
        running: dict[concurrent.futures.Future, dict[str, int]] = {}
        skipped: list[tuple[str, float, float]] = []  # (mesh, calibrated screen ms, bar ms)
        skipped_configs: list[str] = []  # finalists' configurations the calibrated screen ruled out
        over_memory: list[str] = []  # finalists' configurations a compiled one shows over the limit
        while queue or running:
            while queue and len(running) < workers:
                m = queue.pop(0)
                running[pool.submit(evaluate, m, 1, local_batch(m), probe_remat, attention_of(m))] = m
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                probes[_mesh_str(running.pop(fut))] = fut.result()
            fitting = [c for c in probes.values() if c is not None and c.fits]
            # Pruned only by a screen fitted on three compiled steps or more: one scale from a
            # single step would carry the uncalibrated screen's ratios between meshes, which is
            # what the calibration fixes.
            screen = calibration() if len(fitting) >= max(3, mesh_finalists) else UNCALIBRATED
            if screen.fitted_on >= 3:
                reached = sorted(reach(c, screen) for c in fitting)
                bar = reached[mesh_finalists - 1] * (1 + PROBE_MARGIN)
                for m in list(queue):
                    guess = best_batch(lambda b: screen(terms(m, b, probe_remat)), local_batch(m))[1]
                    if guess > bar:
                        queue.remove(m)
                        skipped.append((_mesh_str(m), guess, bar))
                        with lock:
                            planned["n"] -= 1
        judge = calibration()
        fit_probes = sorted((c for c in probes.values() if c is not None and c.fits),
                            key=lambda c: reach(c, judge) if judge.fitted_on >= 3 else c.step_ms)
        finalists = [c.mesh for c in fit_probes[:mesh_finalists]]
        with lock:
            planned["n"] -= finalist_reserve - sum(budget(m) for m in finalists)
        pruning.append(f"{len(probes)} probed at per-device batch 1 with {probe_remat} remat, "
                       f"{len(fit_probes)} fit; the {len(finalists)} that can reach the fastest steps (each probe "
                       f"scaled by the calibrated screen to its best per-device batch) searched further."
                       + (f" Not probed: {len(skipped)} mesh{'es' if len(skipped) > 1 else ''} the calibrated screen puts, "
                          f"at their best per-device batch, over {PROBE_MARGIN:.0%} slower than what the probe "
                          f"ranked {mesh_finalists} can reach ("
                          + ", ".join(f"{m} {g / 1e3:.2f} s" for m, g, _ in skipped[:4])
                          + (", ..." if len(skipped) > 4 else "") + f"; bar {skipped[-1][2] / 1e3:.2f} s)."
                          if skipped else ""))

        # 3. per finalist mesh: the largest per-device batch that fits, per remat policy
        def search_mesh(m: dict[str, int]) -> None:
            lb = local_batch(m)
            sizes = _divisors_upto(lb)
            used = [0]
            try:
                walk(m, lb, sizes, len(sizes) - 1, used)
            finally:
                with lock:
                    planned["n"] -= budget(m) - used[0]

        def best_ms(m: Mapping[str, int] | None = None) -> float:
            """The fastest fitting configuration searched so far (of mesh ``m``, if given)."""
            with lock:
                return min((c.step_ms for k, c in results.items() if k in searched and c.fits
                            and (m is None or c.mesh == m)), default=math.inf)

        def not_worth(m: Mapping[str, int], b: int, remat: str) -> bool:
            """Whether the calibrated screen puts this configuration over PROBE_MARGIN slower than
            the best found, or not REMAT_GAIN faster than the best of its own mesh (a policy that
            keeps more for no predicted gain only adds memory)."""
            screen = calibration()
            if screen.fitted_on < 3:
                return False  # too few compiled steps to trust a calibration
            guess = screen(terms(m, b, remat))
            if guess > best_ms() * (1 + PROBE_MARGIN) or guess > best_ms(m) * (1 - REMAT_GAIN):
                with lock:
                    skipped_configs.append(f"{_mesh_str(m)} b={b} {remat}")
                return True
            return False

        def known_over(m: Mapping[str, int], b: int, remat: str) -> bool:
            """Whether a compiled configuration of mesh ``m`` shows that batch ``b`` with ``remat``
            cannot fit: one at a batch of ``b`` or more, with a policy keeping no more (earlier
            in ``policies``), whose peak with its temporaries scaled down to ``b`` (they hold a
            part that grows with the batch and one that does not) is still over the limit by
            ``MEMORY_MARGIN``."""
            with lock:
                same_mesh = [c for c in results.values() if c.mesh == m and c.attention == attention_of(m)]
            known = [c for c in same_mesh if c.per_device_batch >= b and policies.index(c.remat) <= policies.index(remat)
                     and (c.per_device_batch, c.remat) != (b, remat)]  # itself: already known
            if same_mesh:  # the arguments (weights, Adam state) and what the policy must keep
                fixed = min(c.peak_bytes - c.temp_bytes for c in same_mesh)
                alive = local_batch(m) if m.get("stage", 1) > 1 else b  # a pipeline holds every micro-batch
                kept = kept_mlp_bytes(family, dims, m, alive, remat)
                if fixed + kept > limit * (1 + MEMORY_MARGIN):
                    with lock:
                        over_memory.append(f"{_mesh_str(m)} b={b} {remat}: the MLP activations it keeps alone "
                                           f"{kept / gib:.0f} GiB beside {fixed / gib:.0f} GiB of arguments")
                    return True
            for c in known:
                if c.peak_bytes - c.temp_bytes * (1 - b / c.per_device_batch) > limit * (1 + MEMORY_MARGIN):
                    with lock:
                        over_memory.append(f"{_mesh_str(m)} b={b} {remat}, shown by b={c.per_device_batch} "
                                           f"{c.remat} at {c.peak_bytes / gib:.0f} GiB")
                    return True
            return False

        def climb(m: dict[str, int], lb: int, sizes: list[int], used: list[int]) -> None:
            """A pipeline's batch search: its memory hardly moves with the micro-batch (it holds
            the whole per-rank batch, in more or fewer micro-batches) while its bubble, (S - 1)
            / micro-batches, grows with it; so per policy the micro-batch grows from one
            sequence while the predicted step falls and the step fits, and while the calibrated
            screen does not rule the next one out (its bubble only grows). A policy that keeps more
            starts where the last one's climb ended: it recomputes less at every micro-batch."""
            start = 0
            for remat in policies:
                prev: TrainCandidate | None = None
                cut = False
                for b in sizes[start:]:
                    if known_over(m, b, remat):
                        break
                    if not_worth(m, b, remat):
                        cut = True
                        break
                    used[0] += 1
                    c = evaluate(m, b, lb // b, remat, attention_of(m))
                    if c is None or not c.fits or (prev is not None and c.step_ms >= prev.step_ms):
                        break
                    prev = c
                if prev is None and not cut:
                    return  # this policy fits no batch: the ones saving more cannot either
                if prev is not None:
                    start = sizes.index(prev.per_device_batch)

        def walk(m: dict[str, int], lb: int, sizes: list[int], hi: int, used: list[int]) -> None:
            if m.get("stage", 1) > 1:
                climb(m, lb, sizes, used)
                return
            for remat in policies:
                def fits(i: int) -> bool:
                    if known_over(m, sizes[i], remat):
                        return False
                    used[0] += 1
                    c = evaluate(m, sizes[i], lb // sizes[i], remat, attention_of(m))
                    return c is not None and c.fits

                # The largest batch allowed first (it fits where memory is plenty), then bisect
                # for the largest that fits. A batch the screen rules out rules out every smaller
                # one too (more micro-steps repeat the weights' traffic), so the search moves up.
                best, cut, lo, up = None, False, 0, hi
                first = True
                while lo <= up:
                    mid, first = (up if first else (lo + up + 1) // 2), False
                    if not_worth(m, sizes[mid], remat):
                        cut, lo = True, mid + 1
                    elif fits(mid):
                        best, lo = mid, mid + 1
                    else:
                        up = mid - 1
                if best is None and not cut:
                    return  # this policy fits no batch: the ones saving more cannot either
                hi = best if best is not None else up  # the largest batch not known to be over

        list(pool.map(search_mesh, finalists))
        pruning.append(f"Per finalist, each remat policy ({', '.join(policies)}) bisects the per-device "
                       "batch below the last policy's largest fit (memory rises with the batch and along "
                       "the policies)" + ("; a pipeline's micro-batch grows from one sequence while its predicted "
                                          "step falls" if any(f.get("stage", 1) > 1 for f in finalists) else "")
                       + (f"; {len(skipped_configs)} configurations not compiled, the calibrated screen putting "
                          f"them over {PROBE_MARGIN:.0%} slower than the best found or under {REMAT_GAIN:.0%} "
                          f"faster than their mesh's best ({', '.join(skipped_configs[:4])}"
                          + (", ..." if len(skipped_configs) > 4 else "") + ")." if skipped_configs else ".")
                       + (f" {len(over_memory)} not compiled, a compiled configuration of the same mesh with as "
                          f"large a batch and a policy keeping no more showing them over the limit "
                          f"({'; '.join(over_memory[:3])}" + ("; ..." if len(over_memory) > 3 else "") + ")."
                          if over_memory else ""))

        # 4. the other attention implementation at the best configuration it can fit in: XLA's
        # attention holds at least one layer's scores of the micro-batch, float32 and bfloat16.
        def scores_bytes(c: TrainCandidate, attention: str) -> float:
            if attention != "xla":
                return 0.0
            return c.per_device_batch * (heads // c.mesh.get("model", 1)) * seq_len ** 2 * 6

        leaders = sorted((c for c in results.values() if c.fits), key=lambda c: c.step_ms)[:3] if others else []
        tries = [(c, a) for a in others
                 for c in [next((c for c in leaders if c.peak_bytes + scores_bytes(c, a) <= limit), None)] if c]
        with lock:
            planned["n"] -= attention_reserve - len(tries)
        list(pool.map(lambda ca: evaluate(ca[0].mesh, ca[0].per_device_batch, ca[0].grad_accum, ca[0].remat, ca[1]),
                      tries))
        for a in others:
            where = next((c for c, b in tries if b == a), None)
            if where is not None:
                pruning.append(f"Attention {a} tried at {where.label()}, the best configuration with room for it.")
            elif leaders:
                pruning.append(
                    f"Attention {a} not tried: at the {len(leaders)} best configurations one layer's attention scores "
                    f"alone (at least {min(scores_bytes(c, a) for c in leaders) / gib:.1f} GiB) do not fit in the "
                    f"memory the step leaves (at most {max(limit - c.peak_bytes for c in leaders) / gib:.1f} GiB).")
        cur = cur_future.result() if cur_future is not None else None
    finally:
        pool.shutdown(wait=True)
        if programs is not None:
            programs.cleanup()

    if current is not None and cur is None:
        key = next(iter(k for k in failures), None)
        raise ValueError(f"the current configuration could not be compiled: {failures.get(key, '?')}")
    ranked = sorted((c for k, c in results.items() if k in searched), key=lambda c: (not c.fits, c.step_ms if c.fits else c.peak_bytes))
    fitting = [c for c in ranked if c.fits]
    if not fitting:
        smallest = min((c.peak_bytes for k, c in results.items() if k in searched), default=None)
        if smallest is None:
            need = math.ceil(smallest_state / limit * gpus) if smallest_state > limit else gpus
            more = need if need <= hw.gpus_per_node else hw.gpus_per_node * -(-need // hw.gpus_per_node)
            raise NothingFits(
                f"nothing fits: the weights and Adam state alone need at least {smallest_state / gib:.1f} GiB "
                f"per GPU over the {limit / gib:.1f} GiB limit ({fraction:g} x {gpu_bytes / gib:.1f} GiB); "
                f"about {more} GPUs would hold them")
        best_small = min(results.values(), key=lambda c: c.peak_bytes)
        raise NothingFits(
            f"nothing fits: the smallest peak found is {smallest / gib:.1f} GiB ({best_small.label()}) over "
            f"the {limit / gib:.1f} GiB limit ({fraction:g} x {gpu_bytes / gib:.1f} GiB): per-device batch 1 "
            f"with full remat was tried on every mesh; use about "
            f"{hw.gpus_per_node * max(1, -(-math.ceil(gpus * smallest / limit) // hw.gpus_per_node))} GPUs, "
            f"a shorter sequence or a larger --memory-fraction")
    final = calibration()
    pruning.append(screen_agreement(
        {c.label(): (final(terms(c.mesh, c.per_device_batch, c.remat, c.attention)), c.step_ms)
         for c in calibrated_on()}, final))
    tuned = None
    if tune:
        b = fitting[0]
        ways = math.prod(b.mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
        say(f"tuning the best candidate {b.label()} with the pipeline (lagom) ...")
        staged = b.mesh.get("stage", 1) > 1
        src = step_source(family, dims, global_batch=b.per_device_batch * ways * (b.grad_accum if staged else 1),
                          mesh=b.mesh, remat=b.remat, attention=b.attention, compiler_options=options,
                          microbatches=b.grad_accum if staged else None)
        tuned = job_lib.run(src, hw, strategy="lagom", baselines=("xla-default",), verify=False, log=say)
    wall = time.monotonic() - start
    return TrainAdvice(family, {k: v for k, v in dims.items() if k != "seq_len"}, gpus, hw.name, hw.nodes,
                       global_batch, seq_len, fraction, gpu_bytes, limit, tuple(ranked[:max(top, 1)]),
                       cur, screened, tuple(rejected), counts["compiles"], counts["cached"], wall,
                       tuple(pruning), tuned)


def family_dims(model: str, config: str | None = None) -> dict[str, int]:
    """``advise_train_step``'s dimensions of a built-in model's named config (default: its
    smallest real size) or of ``"layers=...,d_model=..."``."""
    if model not in FAMILY_MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(FAMILY_MODELS)}")
    built = FAMILY_MODELS[model]
    cfg = resolve_config(built, config or DEFAULT_CONFIG[built])
    dims = dict(layers=cfg.layers, d_model=cfg.d_model, heads=cfg.heads, kv_heads=cfg.kv or cfg.heads,
                ffn=cfg.d_ff, vocab=cfg.vocab, experts=cfg.experts, top_k=cfg.top_k)
    if model in ("bert", "t5"):
        dims["max_len"] = cfg.max_len
    if model == "t5":
        dims["dec_layers"] = cfg.dec_layers
    return dims


# The first adviser's keywords (an analytic screen over data x fsdp x stage x model that
# compiled its top few), and what each became in the one search.
_RENAMED = {"num_devices": "gpus", "max_candidates": "top", "top_k": "max_probes"}
_warned: set[str] = set()


def advise(model: str, config: str | None = None, gpus: int | None = None,
           hardware: str | hardware_lib.HardwareProfile = "h100-sxm-8", *, global_batch: int, seq_len: int,
           **options: Any) -> TrainAdvice:
    """The one adviser: ``advise_train_step`` for a built-in model's named config (or
    ``"layers=..."`` dimensions), ``gpus`` GPUs of ``hardware``; ``options`` are
    ``advise_train_step``'s (``current``, ``memory_fraction``, ``top``, ``jobs``, ...).

    The first adviser's keywords still work, each with a warning (once per keyword) naming
    its new name: ``num_devices`` (gpus), ``max_candidates`` (top), ``top_k`` (max_probes: how
    many meshes the screen lets through to compile), ``recipes`` (meshes: only meshes whose
    axes the recipes name), ``dtype`` (the search compiles bfloat16 steps; float32 is an
    error)."""
    for old, new in _RENAMED.items():
        if old in options:
            _warn_once(old, f"advise({old}=...) is now {new}=...")
            value = options.pop(old)
            if old == "num_devices":
                gpus = value
            else:
                options[new] = value
    if "dtype" in options:
        _warn_once("dtype", "advise(dtype=...) is gone: the search compiles bfloat16 steps, as MaxText trains")
        if options.pop("dtype") != "bfloat16":
            raise ValueError("advise compiles bfloat16 steps only (weights and optimizer state stay float32)")
    if "recipes" in options:
        _warn_once("recipes", "advise(recipes=...) is now meshes=[{axis: size, ...}]")
        options["meshes"] = _recipe_meshes(options.pop("recipes"), gpus)
    if gpus is None:
        raise TypeError("advise() needs gpus")
    return advise_train_step(model, **family_dims(model, config), gpus=gpus, hardware=hardware,
                             global_batch=global_batch, seq_len=seq_len, **options)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, DeprecationWarning, stacklevel=3)


def _recipe_meshes(recipes: Sequence[str], gpus: int) -> list[dict[str, int]]:
    """Every data x fsdp x model mesh of ``gpus`` whose axes above 1 are among one recipe's parts
    (dp, fsdp, tp; sp rides on tp; pp is not searched)."""
    axis_of = {"dp": "data", "fsdp": "fsdp", "tp": "model", "sp": "model"}
    unknown = sorted({p for r in recipes for p in r.split("+")} - set(axis_of))
    if unknown:
        raise ValueError(f"recipes {list(recipes)}: parts {unknown} are not searched (dp, fsdp, tp, sp)")
    allowed = [{axis_of[p] for p in r.split("+")} for r in recipes]
    return [m for t in _divisors_upto(gpus) for f in _divisors_upto(gpus // t)
            for m in [{"data": gpus // (t * f), "fsdp": f, "model": t}]
            if any({a for a, n in m.items() if n > 1} <= axes for axes in allowed)]
