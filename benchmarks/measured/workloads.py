"""Llama-class workloads: predicted against measured, predicted gains, and scale.

Two parts, each recorded as its own RESULTS.md section:

``measured`` (section ``workloads``): every published JAX GPU run the built-in families can
rebuild (MaxText Llama 2 7B, Paxml GPT-126M/5B/175B and Llama 2 7B; sources in ``ROWS``),
predicted with the prediction contract (``lagom_jax.predict_train_step_ms``) under the
flags the run used, beside the measured step. Then per row the predicted gain of lagom
over XLA's defaults (``strategy="lagom"`` against ``"xla-default"`` on the step compiled
with no flags) and over the run's own flags. With ``--xla-modules DIR`` (a folder holding
openxla/xla ``xla/tools/benchmarks/hlo/``), also the published steps that are XLA's own
benchmark modules (``MODULE_ROWS``: MaxText's Llama 3.1 8B and Mixtral 8x7B on one H100
node, measured in openxla/xla PR #31030), predicted from the module itself
(``lagom_jax.advise.predict.hlo_step_job``, XLA's defaults): the MoE rows.

``fp8`` (section ``workloads_fp8``): the one published bf16/fp8 step pair (Llama 3.1 8B on
one node of 8 H100, XLA's benchmark modules: 1.370 s in bf16, openxla/xla PR #31030; 1.095 s
in fp8, PR #31375; 1.25x), rebuilt with the llama family in bf16 and with
``quantization="fp8"`` (MaxText's fp8 path) at MaxText's published 8B shape on 8 GPUs
(per-device batch 1, sequence 8192, remat minimal_flash; openxla/xla PR #31108's command),
and the predicted ratio set beside 1.25. ``kernels.FP8_RATE_RATIO`` was calibrated on it.

``scale`` (section ``workloads_scale``): compile deviceless and tune the largest jobs,
each in a fresh process: llama3-70b on 256 H100 (FSDP), llama3.1-405b on 2048 H100
(FSDP x data), mixtral-8x7b on 64 H100 (FSDP x expert); compile time, search time and the
process's peak RSS.

    python -m benchmarks.measured.workloads [--part measured|fp8|scale|all] [--rows NAME,...] [--xla-modules DIR] [--no-record]

Every step time here is *predicted* by the cost model except the "measured" column, which
is the published measurement; nothing runs on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import resource
import statistics
import sys
import time
from typing import Any

from benchmarks.measured.xla_modules import CALIBRATION

GiB, MiB = 1 << 30, 1 << 20

# Flags of the published runs, by name (openxla/xla DebugOptions fields).
LHS = {"xla_gpu_enable_latency_hiding_scheduler": True}
PIPELINED = {"xla_gpu_enable_pipelined_all_gather": True, "xla_gpu_enable_pipelined_reduce_scatter": True,
             "xla_gpu_enable_pipelined_all_reduce": True}
BY_DIM_OFF = {"xla_gpu_enable_all_gather_combine_by_dim": False,
              "xla_gpu_enable_reduce_scatter_combine_by_dim": False}


def thresholds(ar: int, ag: int, rs: int) -> dict[str, int]:
    return {"xla_gpu_all_reduce_combine_threshold_bytes": ar, "xla_gpu_all_gather_combine_threshold_bytes": ag,
            "xla_gpu_reduce_scatter_combine_threshold_bytes": rs}


# Host launches as those runs made them: CUDA graphs off (``--xla_gpu_graph_level=0``, today's
# empty command-buffer set).
GRAPHS_OFF = {"xla_gpu_enable_command_buffer": ""}

# JAX-Toolbox's MaxText flags (NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md; every version
# that published the 0.721 s step turned CUDA graphs off, and those of 2024 Triton GEMMs too).
MAXTEXT_JT = {**LHS, **thresholds(GiB, GiB, 128 * MiB), **PIPELINED,
              "xla_gpu_enable_while_loop_double_buffering": True, **BY_DIM_OFF, **GRAPHS_OFF,
              "xla_disable_hlo_passes": "rematerialization", "xla_gpu_enable_triton_gemm": False}


def maxtext_a3(ar_mib: int, ag_mib: int, rs_mib: int) -> dict[str, Any]:
    """AI-Hypercomputer/maxtext's a3 llama2-7b scripts (1vm.sh .. 16vm.sh as the README's numbers
    were published, 1200dd7e0, 2024-04-05): besides their thresholds, Triton GEMMs and CUDA graphs
    off and XLA's rematerialization pass disabled."""
    return {**LHS, **PIPELINED, "xla_gpu_enable_while_loop_double_buffering": True, **BY_DIM_OFF,
            **GRAPHS_OFF, "xla_gpu_enable_triton_gemm": False, "xla_disable_hlo_passes": "rematerialization",
            **thresholds(ar_mib * MiB, ag_mib * MiB, rs_mib * MiB)}


def maxtext_llama2_7b_tflop(batch: int = 4, seq: int = 4096) -> float:
    """TFLOP per GPU per step as MaxText counted them when the a3 README published its TFLOP/s
    (AI-Hypercomputer/maxtext efb6d9e, 2024-04-09; ``calculate_tflops_training_per_device`` in
    MaxText/maxtext_utils.py then): 6 x parameters x tokens, the parameters counted from the
    pytree (both embedding tables: 6,738,415,616), plus 12 x heads x layers x head_dim x seq^2
    x batch halved for the causal mask. The step is that count over the published rate."""
    params, heads, layers, head_dim = 6_738_415_616, 32, 32, 128
    return (6 * params * seq * batch + 12 * heads * layers * head_dim * seq ** 2 * batch / 2) / 1e12


# NVIDIA/dgxc-benchmarking paxml/configure.sh.
PAX_DGXC = {**LHS, **thresholds(512 * MiB, 512 * MiB, 8 * MiB), **PIPELINED,
            "xla_gpu_enable_while_loop_double_buffering": False, **BY_DIM_OFF,
            "xla_gpu_enable_triton_gemm": False, **GRAPHS_OFF,
            "xla_disable_hlo_passes": "rematerialization"}

# The XLA flags of Paxml's GPU run scripts (google/paxml paxml/contrib/gpu/scripts_gpu/
# run_pile_multinode.sh, 2024-05, which NVIDIA/JAX-Toolbox's Pax README says its runs use): LHS,
# Triton GEMM off, CUDA graphs off (``--xla_gpu_graph_level=0``, today's empty command-buffer
# set), the all-reduce combine threshold 51200 bytes (the README: 32 MiB for 126M). The
# scripts' other flags are XLA's defaults now or gone from XLA (async collectives, the
# highest-priority stream, fp-conversion simplification, Triton softmax fusion).
def pax_run(ar_bytes: int = 51200) -> dict[str, Any]:
    return {**LHS, "xla_gpu_enable_triton_gemm": False, **GRAPHS_OFF,
            "xla_gpu_all_reduce_combine_threshold_bytes": ar_bytes}


# Dimensions: AI-Hypercomputer/maxtext src/maxtext/configs/models/*.yml; Pax GPT:
# google/paxml paxml/contrib/gpu/scripts_gpu/configs.py.
LLAMA2_7B = dict(family="llama", layers=32, d_model=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)
PAX_126M = dict(family="gpt", layers=12, d_model=768, heads=12, kv_heads=12, ffn=3072, vocab=50304)
PAX_5B = dict(family="gpt", layers=24, d_model=4096, heads=32, kv_heads=32, ffn=16384, vocab=50304)
PAX_175B = dict(family="gpt", layers=96, d_model=12288, heads=96, kv_heads=96, ffn=49152, vocab=50304)
# MaxText's Mixtral 8x7B as AI-Hypercomputer/gpu-recipes runs it on A3 Ultra (token dropping,
# capacity factor 1).
MIXTRAL_8X7B = dict(family="mixtral", layers=32, d_model=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                    experts=8, top_k=2, moe="dropping", capacity_factor=1.0)
# Its recipe's XLA flags (the chart's values.yaml): LHS, Triton GEMM and command buffers off, its
# combine thresholds, the pipeliner for all three kinds, double buffering, combine-by-dim off, XLA's
# rematerialization pass disabled.
MAXTEXT_A3U_MIXTRAL = {**LHS, **thresholds(71303168, 536870912, 134217728), **PIPELINED,
                       "xla_gpu_enable_while_loop_double_buffering": True, **BY_DIM_OFF,
                       "xla_disable_hlo_passes": "rematerialization", "xla_gpu_enable_triton_gemm": False,
                       **GRAPHS_OFF}


@dataclasses.dataclass(frozen=True)
class Row:
    """One published run rebuilt: the contract's arguments and the measured step."""

    name: str
    model: dict[str, Any]
    seq_len: int
    global_batch: int
    mesh: dict[str, int]
    hardware: str
    remat: str
    flags: dict[str, Any]
    measured_s: float
    source: str
    scan: bool = True
    note: str = ""
    attention: str = "flash"
    moe: bool = False
    # When the software that ran the measurement was current (its container or commit, YYYY-MM):
    # the same configuration moves by more than the model's miss between stacks months apart.
    stack: str = ""
    # The run's token lookup and gradient clip (``ModelConfig.embed_lookup``, ``grad_clip``).
    embed_lookup: str = "gather"
    grad_clip: float = 0.0

    @property
    def gpus(self) -> int:
        return math.prod(self.mesh.values())

    def contract_kwargs(self) -> dict[str, Any]:
        m = dict(self.model)
        return dict(family=m.pop("family"), **m, seq_len=self.seq_len, global_batch=self.global_batch,
                    mesh=self.mesh, hardware=self.hardware, remat=self.remat, scan=self.scan,
                    attention=self.attention, embed_lookup=self.embed_lookup, grad_clip=self.grad_clip)


# What the runs did around the layers, the same in both frameworks: a one-hot matmul lookup and
# gradients clipped to a global norm of 1.0. MaxText: ``use_iota_embed=true`` on every llama2-7b
# command here and base.yml's gradient_clipping_threshold. Paxml's GPT: TransformerLmSpmdAdam's
# EMBEDDING_LOOKUP_STYLE "matmul" (tokens and learned positions; paxml/tasks/lm/params/c4.py) and
# CLIP_GRADIENT_NORM_TO_VALUE (configs.py).
MATMUL_LOOKUP_CLIPPED = dict(embed_lookup="matmul", grad_clip=1.0)

_JT = "NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md"
_A3 = "AI-Hypercomputer/maxtext src/maxtext/configs/gpu/a3/llama_2_7b/README.md"
_DGXC = "NVIDIA/dgxc-benchmarking paxml/README_5b.md"
_PAX = "NVIDIA/JAX-Toolbox rosetta/rosetta/projects/pax/README.md"
_PAX_NOTE = "flags: Paxml's GPU run script (the README names it; its table lists none)"
# Remat of the Pax GPT configs (google/paxml paxml/contrib/gpu/scripts_gpu/configs.py): GPT5B sets
# SAVE_DOT_WITH_NO_BATCH_DIM; GPT126M and GPT175B inherit SAVE_NOTHING from
# paxml/tasks/lm/model_params.py TransformerLmSpmdAdafactor, which Pax applies to repeated layers only.
_PAX_126M_REMAT = ("remat none, layers unrolled: GPT126M does not repeat its layers (USE_REPEATED_LAYER False), "
                   "and Pax remats repeated layers only")
_PAX_175B_REMAT = "remat full: GPT175B keeps Pax's default CHECKPOINT_POLICY, SAVE_NOTHING"

ROWS: tuple[Row, ...] = (
    Row("maxtext-llama2-7b/8xH100", LLAMA2_7B, 4096, 16, {"fsdp": 8}, "h100-sxm-8", "minimal_flash",
        MAXTEXT_JT, 0.721, _JT, scan=False, stack="2024-05", **MATMUL_LOOKUP_CLIPPED),
    *(Row(f"maxtext-llama2-7b/a3x{vms}", LLAMA2_7B, 4096, 4 * 8 * vms,
          {"data": vms, "fsdp": 8} if vms > 1 else {"fsdp": 8}, "a3", "minimal_flash",
          maxtext_a3(*thr), maxtext_llama2_7b_tflop() / tflops, _A3, scan=False, stack="2024-04",
          **MATMUL_LOOKUP_CLIPPED,
          note=f"step = {maxtext_llama2_7b_tflop():.1f} TFLOP a GPU (MaxText's count when the numbers were "
               f"published) / the published {tflops} TFLOP/s")
      for vms, thr, tflops in ((1, (128, 128, 64), 492), (2, (64, 128, 64), 422), (4, (512, 128, 64), 407),
                               (8, (1024, 128, 64), 409), (16, (1024, 128, 128), 375))),
    *(Row(f"paxml-gpt5b/{n}xH100", PAX_5B, 2048, 4 * n, {"data": n // 8, "fsdp": 8}, "dgx-h100", "minimal",
          PAX_DGXC, s, _DGXC, note="remat SAVE_DOT_ONLY = MaxText's minimal", stack="2024-03",
          **MATMUL_LOOKUP_CLIPPED)
      for n, s in ((16, 0.634), (32, 0.639), (64, 0.643), (128, 0.651))),
    Row("paxml-gpt126m/64xA100", PAX_126M, 2048, 256, {"data": 64}, "a100-sxm-8", "none", pax_run(32 * MiB), 0.122, _PAX,
        note=_PAX_NOTE + "; " + _PAX_126M_REMAT + "; no flash attention (scores materialised, as measured)",
        attention="xla", scan=False, stack="2024-06", **MATMUL_LOOKUP_CLIPPED),
    Row("paxml-gpt5b/256xA100", PAX_5B, 2048, 2048, {"fsdp": 256}, "a100-sxm-8", "minimal", pax_run(), 3.447, _PAX,
        note=_PAX_NOTE, stack="2024-06", **MATMUL_LOOKUP_CLIPPED),
    Row("paxml-gpt175b/256xA100-te", PAX_175B, 2048, 1536, {"fsdp": 256}, "a100-sxm-8", "full", pax_run(), 75.15,
        _PAX, note=_PAX_NOTE + "; " + _PAX_175B_REMAT + "; measured with Transformer Engine", stack="2024-06",
        **MATMUL_LOOKUP_CLIPPED),
    Row("paxml-gpt126m/64xH100-te", PAX_126M, 2048, 256, {"data": 64}, "h100-sxm-8", "none", pax_run(32 * MiB),
        256 / 4709, _PAX, note=_PAX_NOTE + "; " + _PAX_126M_REMAT + "; measured with Transformer Engine; "
        "no flash attention (the source: flash attention except 126M)", attention="xla", scan=False,
        stack="2024-06", **MATMUL_LOOKUP_CLIPPED),
    Row("paxml-gpt5b/256xH100-te", PAX_5B, 2048, 2048, {"fsdp": 256}, "h100-sxm-8", "minimal", pax_run(),
        2048 / 1657, _PAX, note=_PAX_NOTE + "; measured with Transformer Engine", stack="2024-06",
        **MATMUL_LOOKUP_CLIPPED),
    Row("paxml-llama2-7b/16xH100", LLAMA2_7B, 4096, 32, {"fsdp": 16}, "h100-sxm-8", "minimal", pax_run(), 0.740,
        _PAX, note=_PAX_NOTE, stack="2024-06"),
    Row("maxtext-mixtral-8x7b/a3-ultra x32", MIXTRAL_8X7B, 4096, 1280, {"data": 16, "fsdp": 2, "expert": 8},
        "a3-ultra", "save_proj_and_mlp", MAXTEXT_A3U_MIXTRAL, 3.437,
        "AI-Hypercomputer/gpu-recipes training/a3ultra/mixtral-8x7b/maxtext-pretraining-gke/README.md",
        scan=False, moe=True, stack="2024-12",
        note="remat custom with q/k/v/out/mlpwi_0/mlpwi_1/mlpwo on the device; with the family's 'minimal' "
             "instead the experts' dots (batched over the experts) are recomputed: 462 TFLOP a GPU, +19.4%"),
)


@dataclasses.dataclass(frozen=True)
class ModuleRow:
    """A published step that is one of XLA's benchmark modules: predicted from the module."""

    name: str
    module: str  # file stem in xla/tools/benchmarks/hlo/
    hardware: str
    measured_s: float
    source: str
    gpus: int = 8
    moe: bool = False
    note: str = ""
    remat: str = "as exported"
    stack: str = ""


_XLA_PR = "openxla/xla PR #31030 (\"main\" column)"
_XLA_NOTE = "XLA's module as MaxText exported it, under XLA's defaults; Transformer Engine's attention priced"
MODULE_ROWS: tuple[ModuleRow, ...] = (
    ModuleRow("xla-hlo-llama3.1-8b/8xH100", "hlo_llama31_8b_bf16_1x8", "h100-sxm-8",
              CALIBRATION["hlo_llama31_8b_bf16_1x8"], _XLA_PR, note=_XLA_NOTE, stack="2025"),
    ModuleRow("xla-hlo-mixtral-8x7b/8xH100", "hlo_mixtral_8x7b_bf16_1x8", "h100-sxm-8",
              CALIBRATION["hlo_mixtral_8x7b_bf16_1x8"], _XLA_PR, moe=True, note=_XLA_NOTE, stack="2025"),
)


@dataclasses.dataclass(frozen=True)
class Scale:
    name: str
    config: str
    model: str
    mesh: dict[str, int]
    seq_len: int
    global_batch: int
    remat: str = "full"


SCALE: tuple[Scale, ...] = (
    Scale("llama3-70b/256xH100 fsdp", "llama3-70b", "llama", {"fsdp": 256}, 8192, 256),
    Scale("llama3.1-405b/2048xH100 data x fsdp", "llama3.1-405b", "llama", {"data": 8, "fsdp": 256}, 8192, 2048),
    Scale("mixtral-8x7b/64xH100 fsdp x expert", "mixtral-8x7b", "mixtral", {"fsdp": 8, "expert": 8}, 4096, 256),
    # Issue 38: larger MoE, the family's default routing (GShard dropping, as MaxText runs on GPUs), scanned.
    Scale("mixtral-8x22b/256xH100 fsdp x expert", "mixtral-8x22b", "mixtral", {"fsdp": 32, "expert": 8}, 4096, 256),
    Scale("deepseek-v3-shaped/1024xH100 fsdp x expert", "deepseek-v3", "mixtral", {"fsdp": 128, "expert": 8}, 4096,
          1024),
)


def predict_row(row: Row) -> dict[str, Any]:
    """The row's predictions: with its flags (against measured), and lagom's gains."""
    from lagom_jax.advise import predict

    kw = row.contract_kwargs()
    start = time.perf_counter()
    with_flags = predict.predict_train_step_ms(**kw, xla_flags=row.flags) / 1e3
    defaults = predict.train_step_job(**kw, strategy="lagom")
    default_s, lagom_s = defaults.predicted_ms("xla-default") / 1e3, defaults.predicted_ms("lagom") / 1e3
    return {"row": row.name, "predicted_s": with_flags, "measured_s": row.measured_s,
            "error": with_flags / row.measured_s - 1, "default_s": default_s, "lagom_s": lagom_s,
            "gain_over_default": default_s / lagom_s, "gain_over_run_flags": with_flags / lagom_s,
            "seconds": time.perf_counter() - start}


def predict_module_row(row: ModuleRow, folder: str) -> dict[str, Any]:
    """A module row's prediction under XLA's defaults (against measured) and lagom's gain."""
    import pathlib

    from lagom_jax.advise import predict

    start = time.perf_counter()
    done = predict.hlo_step_job(pathlib.Path(folder) / f"{row.module}.hlo", hardware=row.hardware,
                                strategy="lagom")
    default_s, lagom_s = done.predicted_ms("xla-default") / 1e3, done.predicted_ms("lagom") / 1e3
    return {"row": row.name, "predicted_s": default_s, "measured_s": row.measured_s,
            "error": default_s / row.measured_s - 1, "default_s": default_s, "lagom_s": lagom_s,
            "gain_over_default": default_s / lagom_s, "gain_over_run_flags": default_s / lagom_s,
            "seconds": time.perf_counter() - start}


def scale_one(case: Scale) -> dict[str, Any]:
    """Compile ``case`` deviceless for its cluster and tune it; times and peak RSS."""
    from lagom_jax import job
    from lagom_jax.cluster import hardware
    from lagom_jax.plan import planning

    hw = hardware.get("h100-sxm-8", math.prod(case.mesh.values()) // 8)
    source = job.ModelSource(case.model, case.config, case.mesh, None, case.global_batch, case.seq_len,
                             "bfloat16", case.remat, True, "flash")
    start = time.perf_counter()
    compiled = job.compile_source(source, hw)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    step = compiled.graph()
    planned = planning.plan(step, hw, strategy="lagom", baselines=("xla-default",),
                            space=planning.module_space(step)[0])
    search_s = time.perf_counter() - start
    predicted = dict(planned.plan.predicted_us)
    return {"case": case.name, "compiled_by": compiled.where, "warnings": list(compiled.warnings),
            "compile_s": compile_s, "search_s": search_s,
            "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "collectives": len(step.collectives), "tasks": len(step.tasks),
            "xla_default_s": predicted["xla-default"] / 1e6, "lagom_s": predicted["lagom"] / 1e6}


def _in_child(kind: str, name: str, *extra: str, timeout_s: float = 900) -> dict[str, Any]:
    from benchmarks.common import json_from_child

    return json_from_child("benchmarks.measured.workloads", "--child", kind, name, *extra, timeout_s=timeout_s)


def measured_section(rows: list[Row], modules: list[ModuleRow] = (), folder: str | None = None) -> str:
    from benchmarks.common import machine_line

    results: list[tuple[Row | ModuleRow, dict[str, Any]]] = []
    for row in [*rows, *modules]:
        print(f"[workloads] {row.name} ...", file=sys.stderr, flush=True)
        if isinstance(row, ModuleRow):
            r = _in_child("module", row.name, "--xla-modules", folder or "")
        else:
            r = _in_child("row", row.name)
        results.append((row, r))
        print(f"[workloads]   {json.dumps(r)}", file=sys.stderr, flush=True)
    ok = [r for _, r in results if "failed" not in r]
    errors = [abs(r["error"]) for r in ok]
    moe = [abs(r["error"]) for row, r in results if "failed" not in r and getattr(row, "moe", False)]
    dense = [abs(r["error"]) for row, r in results if "failed" not in r and not getattr(row, "moe", False)]
    lines = [
        "## workloads (predicted against measured: published JAX GPU runs)",
        "",
        f"Machine: {machine_line()}. Each row is rebuilt with a built-in family and predicted by "
        "`lagom_jax.predict_train_step_ms` (deviceless XLA:GPU compile for the row's cluster, flash "
        "attention, layers scanned unless the run unrolled them, the run's remat policy and XLA flags), "
        "then compared with the published step time. The `xla-hlo-*` rows are XLA's own benchmark modules "
        "(MaxText exported them): predicted from the module under XLA's defaults, the flags of the "
        "measurement not being published. *stack*: when the software that ran the measurement was current "
        "(its container, commit or results table, year-month). Gains are *predicted*: lagom against XLA's "
        "defaults on the step compiled without flags, and against the run's own flags.",
        "",
        f"Median absolute error {statistics.median(errors):.1%} over {len(ok)} rows "
        f"(goal: at most 10%); worst {max(errors):.1%}." if errors else "No row predicted.",
        "",
        (f"Dense rows: median absolute error {statistics.median(dense):.1%} over {len(dense)} rows "
         f"(goal: at most 5%, none past 10%); worst {max(dense):.1%}." if dense else "Dense rows: none predicted."),
        "",
        (f"MoE rows: median absolute error {statistics.median(moe):.1%} over {len(moe)} (goal: at most 10%)."
         if moe else "MoE rows: none predicted."),
        "",
        *_by_stack(results),
        "| row | GPUs | system | stack | remat | predicted s | measured s | error | lagom over defaults | "
        "lagom over the run's flags | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, r in results:
        head = f"| {row.name} | {row.gpus} | {row.hardware} | {row.stack} | {row.remat} |"
        if "failed" in r:
            lines.append(f"{head} failed: {r['failed']} | {row.measured_s:.3f} | | | | {row.source} |")
            continue
        lines.append(f"{head} {r['predicted_s']:.3f} | {row.measured_s:.3f} | {r['error']:+.1%} | "
                     f"{r['gain_over_default']:.3f}x | {r['gain_over_run_flags']:.3f}x | {row.source} |")
    notes = [f"- {row.name}: {row.note}" for row, _ in results if row.note]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


def _by_stack(results: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    """One line: the signed median error of the rows by when their software stack was current
    (the same configuration on two stacks months apart differs by more than the model's miss,
    docs/predictions.md)."""
    groups: dict[str, list[float]] = {}
    for row, r in results:
        if "failed" not in r and row.stack:
            groups.setdefault(row.stack, []).append(r["error"])
    if not groups:
        return []
    cells = [f"{stack}: {statistics.median(errs):+.1%} ({len(errs)})" for stack, errs in sorted(groups.items())]
    return ["By the date of the software stack each measurement ran on (median signed error, rows): "
            + "; ".join(cells) + ".", ""]


def scale_section(cases: list[Scale]) -> str:
    from benchmarks.common import machine_line

    lines = ["## workloads_scale (compile deviceless and tune the largest jobs)", "",
             f"Machine: {machine_line()}. Each case in a fresh process: build the train step on abstract "
             "H100s, compile it with XLA's GPU pipeline, read it and search (lagom and xla-default). "
             "Goal: each within 5 minutes and 8 GB RSS. Step times are *predicted*.", "",
             "| case | compile s | search s | peak RSS GiB | collectives | tasks | xla-default s | lagom s |",
             "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        print(f"[workloads] {case.name} ...", file=sys.stderr, flush=True)
        r = _in_child("scale", case.name, timeout_s=1800)
        print(f"[workloads]   {json.dumps(r)}", file=sys.stderr, flush=True)
        if "failed" in r:
            lines.append(f"| {case.name} | failed: {r['failed']} | | | | | | |")
            continue
        lines.append(f"| {case.name} | {r['compile_s']:.1f} | {r['search_s']:.1f} | {r['rss_gib']:.2f} | "
                     f"{r['collectives']} | {r['tasks']} | {r['xla_default_s']:.3f} | {r['lagom_s']:.3f} |")
    return "\n".join(lines)


# The published pair (openxla/xla PR #31030 and #31375, "main" column, H100).
FP8_PAIR = {"bf16_s": 1.3696, "fp8_s": 1.0953}
FP8_SHAPE = dict(layers=32, d_model=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192,
                 global_batch=8, mesh={"fsdp": 8}, hardware="h100-sxm-8", remat="minimal_flash")


def fp8_section() -> str:
    from benchmarks.common import machine_line
    from lagom_jax.advise import predict
    from lagom_jax.costs import kernels

    rows, ms = [], {}
    for q in ("", "fp8"):
        t0 = time.time()
        job = predict.train_step_job("llama", quantization=q, strategy="xla-default", **FP8_SHAPE)
        ms[q] = job.predicted_ms("xla-default")
        gemms = sum(t.kernel == "fp8-matmul" for t in job.planned.results["xla-default"].graph.compute_tasks)
        rows.append(f"| {q or 'bf16'} | {ms[q] / 1e3:.3f} | {gemms} | {time.time() - t0:.0f} |")
        print(f"[workloads] fp8 pair: {q or 'bf16'} {ms[q]:.1f} ms", file=sys.stderr, flush=True)
    measured = FP8_PAIR["bf16_s"] / FP8_PAIR["fp8_s"]
    predicted = ms[""] / ms["fp8"]
    return "\n".join([
        "## workloads_fp8 (predicted: the one published bf16/fp8 step pair)", "",
        f"Machine: {machine_line()}. Llama 3.1 8B on one node of 8 H100 (fsdp=8, per-device batch 1, "
        "sequence 8192, remat minimal_flash, flash attention), built by the llama family in bf16 and with "
        "`quantization=\"fp8\"` (MaxText's fp8 path: delayed scaling, every dense dot but the output head), "
        "compiled deviceless by XLA's GPU pipeline and predicted under XLA's defaults. Measured pair: XLA's "
        "own modules of the same model, 1.3696 s bf16 (openxla/xla PR #31030) and 1.0953 s fp8 (PR #31375). "
        f"The fp8 GEMM rate is {kernels.FP8_RATE_RATIO['hopper']}x bf16's (`kernels.FP8_RATE_RATIO`), "
        "calibrated on this pair; goal: the predicted ratio within 5% of the measured.", "",
        "| step | predicted s | fp8 GEMMs in the module | compile + predict s |", "|---|---|---|---|", *rows, "",
        f"Predicted bf16/fp8: **{predicted:.3f}x** against {measured:.3f}x measured "
        f"({predicted / measured - 1:+.1%}). The absolute steps are not comparable with the pair's: the modules' "
        "per-device batch is not published with them, and the family runs its own flash attention where the "
        "modules call Transformer Engine's; the ratio is what is compared.",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="all", choices=("measured", "fp8", "scale", "all"))
    p.add_argument("--rows", default=None, help="comma-separated row or case names (default: all)")
    p.add_argument("--no-record", action="store_true", help="print the sections, do not write RESULTS.md")
    p.add_argument("--xla-modules", metavar="DIR", default=None,
                   help="folder of XLA's benchmark *.hlo modules (xla/tools/benchmarks/hlo): adds MODULE_ROWS")
    p.add_argument("--child", nargs=2, metavar=("KIND", "NAME"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, name = args.child
        if kind == "row":
            print(json.dumps(predict_row(next(r for r in ROWS if r.name == name))))
        elif kind == "module":
            print(json.dumps(predict_module_row(next(r for r in MODULE_ROWS if r.name == name), args.xla_modules)))
        else:
            print(json.dumps(scale_one(next(c for c in SCALE if c.name == name))))
        return 0
    wanted = set(args.rows.split(",")) if args.rows else None
    from benchmarks.common import write_section

    if args.part in ("measured", "all"):
        modules = [r for r in MODULE_ROWS if args.xla_modules and (wanted is None or r.name in wanted)]
        section = measured_section([r for r in ROWS if wanted is None or r.name in wanted], modules,
                                   args.xla_modules)
        print(section)
        if not args.no_record:
            write_section("workloads", section)
    if args.part in ("fp8", "all"):
        section = fp8_section()
        print(section)
        if not args.no_record:
            write_section("workloads_fp8", section)
    if args.part in ("scale", "all"):
        section = scale_section([c for c in SCALE if wanted is None or c.name in wanted])
        print(section)
        if not args.no_record:
            write_section("workloads_scale", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
