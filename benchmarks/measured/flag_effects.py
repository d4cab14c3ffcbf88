"""Measured effects of one setting, predicted beside them.

Each row is a published measurement of one setting changed with everything else fixed
(sources per row). The workload is rebuilt as closely as the built-in families allow, the
step is predicted with the setting and without it, and the predicted effect is printed
beside the measured one. An effect is a speed-up: (base step - step with the setting) /
base step, so a positive number means the setting made the step faster.

How a setting reaches the prediction:

* **nccl**: NCCL's process-wide variables and XLA's runtime flags (registered buffers,
  command buffers) change no program: the step is compiled once and predicted again under
  them (``predict.repredict_ms``, the same as ``predict_train_step_ms(nccl_env=...)``),
  against a base that may carry runtime flags of its own (``Effect.base_xla_flags``);
* **xla**: an XLA flag is compiled in (``predict_train_step_ms(xla_flags=...)``), so the
  module the cost model reads is the one the flag makes;
  where the flag leaves the module unchanged the row says so ("xla: same collectives") and
  its note says why;
* **graph**: a microbenchmark is rebuilt as a step graph of its kernels;
* **model**: the workload itself changes (fp8 dots): built and compiled both ways.

Goal (issue: "Collectives and contention priced as measured", item 5): the right sign on
every effect the measurement tells apart from its noise, and the magnitude within 3
percentage points. Nothing runs on a GPU; the measured column is the published number.

    python -m benchmarks.measured.flag_effects [--rows N,...] [--no-record]
    python -m benchmarks.measured.flag_effects --xla-modules DIR [--no-record]
    python -m benchmarks.measured.flag_effects --moe [--no-record]

``--xla-modules DIR`` predicts the SM-free settings on the one-node modules of XLA's GPU
benchmark suite (openxla/xla ``xla/tools/benchmarks/hlo/``, downloaded to DIR as
``benchmarks.measured.xla_modules`` does; not kept here): each module is compiled deviceless once
and predicted again with zero-CTA collectives (``NCCL_CTA_POLICY=2`` on XLA's symmetric
buffers) and with NVLS off. Their measured effects are kept aside to judge the model, so
this part prints predictions only.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

MARIN = "marin-community/marin issue #8054"
# The MoE of MARIN's sweep (experiments/grug/moe_hero_fsdp): the mixtral family's ``marin-moe``
# config (d_model 6144, 48 layers, 128 routed experts top-4 of width 3072 and 2 shared, windowed
# layers of 512 with every 6th global, 48 heads / 12 KV heads (6 on global layers), vocab
# 128256), seq 4096 x batch 1024, pure FSDP over 64 GB200 of one NVL72 rack, recompute-all
# remat; 18.101 s per step (median of steps 5-19) with NCCL's defaults.
# The stand-in keeps the optimizer state on the GPU, which marin offloads to the host, so it
# overflows a GB200's memory (303 GiB after XLA's rematerialization, 138.7 GiB available) where
# the real run fits; XLA's rematerialization pass then recomputes to squeeze it (6.3% of the
# step, more under the settings that hold more memory: double buffering 6.3 -> 15.3%). The real
# run fits and pays none of it, so the stand-in compiles without that pass
# (``flag_effects_marin`` shows both).
NO_XLA_REMAT = {"xla_disable_hlo_passes": "rematerialization"}
# Its experts run SonicMoE's sorted grouped GEMMs ('sonic' kernels, QuACK's CuTe GEMMs): the
# family's grouped layer, whose FFI stand-in on sm_100 is priced at QuACK's measured rate.
MARIN_MOE = dict(family="mixtral", config="marin-moe", seq_len=4096, global_batch=1024, mesh={"fsdp": 64},
                 hardware="gb200-nvl72", remat="full", xla_flags=NO_XLA_REMAT, moe="grouped")
MARIN_NOTE = ("the family's marin-moe config; its stand-ins: the grouped layer's FFI grouped GEMMs at QuACK's rate "
              "for the 'sonic' kernels, blocked einsums for FA4's windowed attention, no SConv/XSA/head "
              "gates/gated norms/QK-norm, optimizer state on the GPU (marin offloads it to the host); GB200's rack rings "
              "and network are the B200's")
# MaxText llama3-70b with FSDP 8 x TP 2 (openxla/xla PR #26948): GPU, batch and sequence were
# not published; H100, sequence 8192 and one sequence per GPU (MaxText's default) stand in.
# MaxText shards its activations' embed dimension over its tensor axis (base.yml
# logical_axis_rules, ``activation_embed``), so its tensor-parallel sublayers all-gather before
# and reduce-scatter after: the family's sequence parallelism runs the same collectives.
LLAMA3_70B = dict(family="llama", layers=80, d_model=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
                  seq_len=8192, global_batch=16, mesh={"fsdp": 8, "model": 2}, hardware="h100-sxm-8",
                  remat="full", sequence_parallel=True)
# MaxText llama3-8b with context parallelism 8 over one node of 8 B200 (openxla/xla PR #31108's
# command): ici_context_parallelism 8 (ring, load-balanced), fsdp 1, sequence 8192, one sequence
# per device (global batch 8), bf16, remat minimal_flash. The layers run scanned where MaxText
# unrolled them (scan_layers false): unrolled, the step compiles in 519 s here and predicts
# 946.5 ms, scanned in 10 s and 946.9 ms (2026-11-28). The family's ring attention blocks are
# einsums with their scores materialised where MaxText runs cuDNN's fused kernel (Transformer
# Engine); they run under a named scope the cost model prices as that kernel (models/attention.py).
# With that and the ring's sends on NCCL's 4 CTAs of XLA's 8-partition communicator, the predicted
# base step went 0.959 -> 0.694 s (2026-11-29).
LLAMA3_8B_CP = dict(family="llama", config="llama3-8b", seq_len=8192, global_batch=8, mesh={"context": 8},
                    hardware="b200-sxm-8", remat="minimal_flash", attention="xla", context_parallel="ring")
CP_ROW = "llama3-8b/8xB200 context parallelism 8 (ring, load-balanced)"
# marin's 26-layer MoE on 8 H100 (marin .agents/logbooks/7079-fp8-loss-val.md, FP8VAL-001): d_model
# 2560, 20 heads, 64 experts top-4 of width 1280 and one shared expert of 1280, vocab 128256, EP 8,
# batch 32 x 4096; 1.501 s/step bf16, 1.372 fp8; capacity factor 1.0 and full remat
# (``recompute_all``), as the logbook's config says. Not published, so assumed: 20 KV heads.
# Stand-ins: GShard's one-hot dispatch and its all-to-all in bf16 where the run gathered and
# scattered tokens around a ring with an fp8 wire.
MOE_FP8_ROW = "MoE 26L 64 experts top-4/8xH100 EP8"
MOE_FP8 = dict(family="mixtral", layers=26, d_model=2560, heads=20, kv_heads=20, ffn=1280, vocab=128256, experts=64,
               top_k=4, shared_experts=1, expert_ffn=1280, seq_len=4096, global_batch=32, mesh={"expert": 8},
               hardware="h100-sxm-8", remat="full", capacity_factor=1.0)
WORKLOADS: dict[str, dict[str, Any]] = {"marin-moe/64xGB200": MARIN_MOE, "llama3-70b/16xH100 fsdp8 tp2": LLAMA3_70B,
                                        CP_ROW: LLAMA3_8B_CP, MOE_FP8_ROW: MOE_FP8}
MEASURED_BASE_S = {"marin-moe/64xGB200": 18.101, CP_ROW: 0.70, MOE_FP8_ROW: 1.501}


@dataclasses.dataclass(frozen=True)
class Effect:
    """One measured effect of one setting."""

    workload: str
    setting: str
    measured_pct: float
    source: str
    how: str  # nccl | xla | graph | model | none
    nccl_env: dict[str, str] = dataclasses.field(default_factory=dict)
    xla_flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Two standard deviations of the measurement where published (an effect inside it is
    # not told apart from zero).
    noise_pct: float | None = None
    note: str = ""
    # Runtime XLA flags of the base the measurement started from (e.g. command buffers off).
    base_xla_flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    # NCCL variables of that base (e.g. a container's NCCL_NVLS_ENABLE=0).
    base_nccl_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # A "graph" row: the microbenchmark's command buffers (XLA's flag syntax), where the
    # setting is one of them.
    command_buffer: str | None = None
    # A "model" row: the workload's own keywords the setting changes (e.g. quantization).
    model: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def significant(self) -> bool:
        return self.noise_pct is None or abs(self.measured_pct) > self.noise_pct


EFFECTS: tuple[Effect, ...] = (
    Effect("marin-moe/64xGB200", "NCCL_ALGO=NVLS,Ring NCCL_NVLS_ENABLE=1", 0.68, MARIN, "nccl",
           {"NCCL_ALGO": "NVLS,Ring", "NCCL_NVLS_ENABLE": "1"},
           # NVIDIA/nccl v2.27.7 (also 2.25-2.26): MNNVL fuses the rack into one node (init.cc counts
           # nNodes from the fused topology's rings: 1), so NVLSTree ("Disable NVLS Tree on a single
           # node", tuning.cc), PAT (one GPU per node only) and CollNet are off, Tree's 64-GPU chain
           # never wins, and NVLS is skipped for all-gather/reduce-scatter above 32 local ranks
           # (enqueue.cc): NCCL's defaults there are already NVLS or Ring for every size.
           note="measured 4.6 sigma; by NCCL's own selection rules this setting changes no algorithm on "
                "one 64-GPU MNNVL communicator (nNodes 1: NVLSTree, PAT and CollNet off, the tree never "
                "picked), so the model's 0 is NCCL's; what the measurement moved is outside NCCL's choice"),
    Effect("marin-moe/64xGB200", "NCCL_PROTO=Simple", 0.19, MARIN, "nccl", {"NCCL_PROTO": "Simple"},
           noise_pct=0.29),
    Effect("marin-moe/64xGB200", "NCCL_PROTO=LL128", -2.70, MARIN, "nccl", {"NCCL_PROTO": "LL128"}),
    Effect("marin-moe/64xGB200", "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL", -1.14, MARIN, "nccl",
           xla_flags={"xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL"},
           base_xla_flags={"xla_gpu_enable_command_buffer": ""},
           note="base: the adopted config (17.008 s), command buffers off; priced by the host's launches "
                "(costs/launch.py), which a 17-s step of long kernels hides either way. XLA's runtime gives "
                "no other cost to price: graphs are recorded once and updated at most once a step "
                "(CommandBufferThunk::ExecuteOnStream), the uncaptured collectives keep their stream and "
                "events, and the default LHS mode chains a graph's kernels in schedule order; the one overlap "
                "loss found in XLA's history is of async compute regions (openxla/xla PR #48900), not "
                "collectives. The +3 GiB (driver memory of instantiated graphs) costs no time. Each arm is "
                "one run: the -1.14% may be run-to-run variation"),
    Effect("marin-moe/64xGB200", "--xla_gpu_enable_analytical_sol_latency_estimator=true", 1.10, MARIN, "xla",
           xla_flags={"xla_gpu_enable_analytical_sol_latency_estimator": True}, noise_pct=1.28,
           note="a rerun measured -1.28%; the issue rejects it as no measurable effect"),
    Effect("llama3-70b/16xH100 fsdp8 tp2", "windowed einsum (--xla_gpu_threshold_for_windowed_einsum_mib=0)",
           3.0, "openxla/xla PR #26948 (comment)", "xla", xla_flags={"xla_gpu_threshold_for_windowed_einsum_mib": 0},
           note="partial windowed einsum of a 2-D sharded operand; GPU, batch and sequence not published. "
                "No deviceless compile here windows (jaxlib 0.10.2 leaves XLA's slice size at 0; 0.12 windows "
                "and fails its HLO verifier), so the model's decomposition pass prices the flag, keeping XLA's "
                "limit of a loop to one NVLink domain: the FSDP gathers over 8 GPUs span both nodes and stay "
                "collectives; the tensor-parallel gathers and reduce-scatters over 2 GPUs of a node become "
                "loops of one send each, which NCCL runs on 2 CTAs (its point-to-point share of XLA's "
                "16-partition communicator), the reduce-scatter's loop ending on its send"),
    Effect("gemm+all-gather/8xH100", "NCCL_CTA_POLICY=2 (copy-engine all-gather, symmetric buffers)",
           100 * (2.02 - 1.77) / 2.02, "pytorch/pytorch PR #172714 (#176613)", "graph",
           {"NCCL_CTA_POLICY": "2"},
           note="fp16 8192^3 GEMM beside an all-gather of 64 MiB per rank: overlapped 2.02 ms, copy engine 1.77"),
    Effect("synthetic collectives+compute HLO/8xH100", "collectives captured in command buffers",
           100 * (1 - 1 / 0.71), "openxla/xla issue #35360", "graph", command_buffer="+COLLECTIVES",
           note="the issue's HLO module is not public: PyTorch's GEMM beside an all-gather (the row above) "
                "stands in, its all-gather captured in the graph and so run before the GEMM"),
    Effect(CP_ROW, "NCCL_NVLS_ENABLE=1 with --xla_gpu_enable_nccl_user_buffers=true", 100 * (1 - 0.58 / 0.70),
           "openxla/xla PR #31108", "nccl", {"NCCL_NVLS_ENABLE": "1"},
           xla_flags={"xla_gpu_enable_nccl_user_buffers": True},
           # JAX-Toolbox's JAX image set NCCL_NVLS_ENABLE=0 from 2023-11 until 2025-10-06
           # (NVIDIA/JAX-Toolbox #383, #1708), after this 2025-09 measurement: why the setting names it.
           base_nccl_env={"NCCL_NVLS_ENABLE": "0"},
           note="base 0.70 s/step on plain NCCL, taken as NVLS off: JAX-Toolbox's image disabled it until "
                "2025-10-06 (NVIDIA/JAX-Toolbox #1708), which is why the setting turns it on; the family's ring "
                "blocks (einsums) priced as the cuDNN fused kernel MaxText runs; the setting as priced is registered sends 10% faster (one measured "
                "all-to-all, NVIDIA/nccl #1722): under NCCL's default CTA policy registered buffers leave its "
                "all-gathers and reduce-scatters on rings (NVLS needs NCCL_CTA_POLICY=1), and what else "
                "registration does to a 32 MiB send or a ring's copies has no measurement to price it by"),
    Effect(MOE_FP8_ROW, "quantization=fp8 (dense and expert GEMMs, delayed scaling)", 100 * (1 - 1.372 / 1.501),
           "marin .agents/logbooks/7079-fp8-loss-val.md (FP8VAL-001)", "model", model={"quantization": "fp8"},
           note="the run's dispatch wire was fp8 too, around a ring; here GShard's all-to-all stays bf16"),
    Effect("MoE/8xB200", "auto-PGLE", 100 * (1 - 15.02 / 15.08), "marin-community/marin issue #7507", "none",
           note="model not published; PGLE's profile is a measurement the model would replace"),
)


def _collectives(job: Any) -> tuple[tuple[str, float], ...]:
    """What a flag could change for the cost model: the step's collectives (kind, bytes)."""
    return tuple((t.kind, t.bytes) for t in job.compiled.graph().collectives)


def predict_effects(effects: list[Effect]) -> list[dict[str, Any]]:
    from lagom_jax.advise import predict

    jobs: dict[str, Any] = {}
    out = []
    for e in effects:
        print(f"[flag_effects] {e.workload}: {e.setting} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        row: dict[str, Any] = {"effect": e, "how": e.how, "base_s": None, "predicted_pct": None}
        if e.how == "graph":
            from benchmarks.measured.contention import gemm_beside_all_gather_ms

            base = gemm_beside_all_gather_ms()
            new = (gemm_beside_all_gather_ms(command_buffer=e.command_buffer) if e.command_buffer is not None
                   else gemm_beside_all_gather_ms(e.nccl_env))
            row.update(base_s=base / 1e3)
        elif e.how in ("nccl", "xla", "model"):
            kw = dict(WORKLOADS[e.workload])
            if "config" in kw:  # a named config of the family: its dimensions
                kw = {**predict.config_dims(kw["family"], kw.pop("config")), **kw}  # the workload's own keys win
            base_flags = kw.pop("xla_flags", {})
            if e.workload not in jobs:
                jobs[e.workload] = predict.train_step_job(**kw, strategy="xla-default", xla_flags=base_flags)
            job = jobs[e.workload]
            base = (predict.repredict_ms(job, xla_flags=e.base_xla_flags, nccl_env=e.base_nccl_env)
                    if e.base_xla_flags or e.base_nccl_env else job.predicted_ms("xla-default"))
            row.update(base_s=base / 1e3)
            if e.how == "nccl":
                new = predict.repredict_ms(job, nccl_env=e.nccl_env, xla_flags=e.xla_flags)
            elif e.how == "model":
                new = predict.train_step_job(**{**kw, **e.model}, strategy="xla-default",
                                             xla_flags=base_flags).predicted_ms("xla-default")
            else:
                try:
                    flagged = predict.train_step_job(**kw, strategy="xla-default",
                                                     xla_flags={**base_flags, **e.xla_flags})
                except ValueError as err:  # the installed XLA cannot compile the setting in
                    row.update(how="xla: not compiled", why=str(err))
                    out.append(row)
                    continue
                new = flagged.predicted_ms("xla-default")
                if flagged.compiled.windowed_by_flag:  # not compiled in: priced by the decomposition pass
                    row["how"] = "xla: windowed-einsum pass"
                elif _collectives(flagged) == _collectives(job):
                    row["how"] = "xla: same collectives"
        else:
            out.append(row)
            continue
        row["predicted_pct"] = 100 * (base - new) / base
        row["seconds"] = time.perf_counter() - start
        out.append(row)
    return out


def _verdict(row: dict[str, Any]) -> tuple[str, str]:
    e: Effect = row["effect"]
    p = row["predicted_pct"]
    if p is None:
        return "-", "-"
    within = "yes" if abs(p - e.measured_pct) <= 3.0 else "no"
    if not e.significant:
        return "(noise)", within
    same = (p > 0) == (e.measured_pct > 0) and abs(p) > 1e-6
    return ("yes" if same else "no"), within


def section(rows: list[dict[str, Any]]) -> str:
    from benchmarks.common import machine_line

    lines = ["## flag_effects (measured effects of one setting, predicted)", "",
             f"Machine: {machine_line()}. *Measured*: the published effect; *predicted*: lagom-jax's cost model "
             "on the workload compiled deviceless by XLA's GPU pipeline (or the microbenchmark's kernels), "
             "with the setting against without it. Effect = (base step - step with the setting) / base step; "
             "positive = faster. Goal: the right sign wherever the measurement tells the effect from its "
             "noise, magnitude within 3 points.", "",
             "| workload | setting | measured | predicted | how | sign right | within 3 pts | predicted base step | note |",
             "|---|---|---:|---:|---|---|---|---:|---|"]
    for row in rows:
        e: Effect = row["effect"]
        p = row["predicted_pct"]
        sign, within = _verdict(row)
        base = row["base_s"]
        measured_base = MEASURED_BASE_S.get(e.workload)
        base_txt = "-" if base is None else (f"{base:.3f} s" if base >= 0.1 else f"{base * 1e3:.3f} ms")
        if measured_base and base is not None:
            base_txt += f" (measured {measured_base:.3f} s)"
        noise = f" (noise {e.noise_pct:.2f})" if e.noise_pct is not None else ""
        lines.append(f"| {e.workload} | `{e.setting}` | {e.measured_pct:+.2f}%{noise} | "
                     + ("not expressible" if p is None else f"{p:+.2f}%")
                     + f" | {row['how']} | {sign} | {within} | {base_txt} | "
                     + (f"{row['why']}; " if row.get("why") else "") + f"{e.note}; {e.source} |")
    judged = [r for r in rows if r["predicted_pct"] is not None]
    signs = [r for r in judged if r["effect"].significant]
    right = sum(_verdict(r)[0] == "yes" for r in signs)
    close = sum(_verdict(r)[1] == "yes" for r in judged)
    errors = [abs(r["predicted_pct"] - r["effect"].measured_pct) for r in judged]
    met = right == len(signs) and close == len(judged)
    lines += ["", f"Sign right on {right} of {len(signs)} effects told apart from noise; magnitude within 3 points "
              f"on {close} of {len(judged)} predicted; median |predicted - measured| "
              f"{statistics.median(errors):.2f} points. {len(rows) - len(judged)} effects not expressible. "
              f"Goal {'met' if met else 'not met'}.",
              "", f"Workloads: marin-moe: {MARIN_NOTE}."]
    return "\n".join(lines)


# One-node modules of XLA's benchmark suite, and the SM-free settings predicted on them.
MODULES = ("hlo_llama31_8b_bf16_1x8", "hlo_mixtral_8x7b_bf16_1x8")
MODULE_SETTINGS = (("zero-CTA collectives (NCCL_CTA_POLICY=2, xla_gpu_experimental_enable_nccl_symmetric_buffers)",
                    {"NCCL_CTA_POLICY": "2"}, {"xla_gpu_experimental_enable_nccl_symmetric_buffers": True}),
                   ("xla_gpu_experimental_enable_nccl_symmetric_buffers alone (XLA sets no CTA policy)",
                    {}, {"xla_gpu_experimental_enable_nccl_symmetric_buffers": True}),
                   ("NVLS off (NCCL_NVLS_ENABLE=0)", {"NCCL_NVLS_ENABLE": "0"}, {}))


def predict_modules(folder: Any, hardware: str = "h100-sxm-8") -> list[dict[str, Any]]:
    """Each module of ``MODULES`` found in ``folder``: XLA's defaults, then every setting of
    ``MODULE_SETTINGS`` (they change no program: the compiled module is predicted again)."""
    import pathlib
    import warnings

    from lagom_jax.advise import predict

    rows = []
    for name in MODULES:
        path = pathlib.Path(folder) / f"{name}.hlo"
        if not path.exists():
            print(f"[flag_effects] {path}: not there, skipped", file=sys.stderr)
            continue
        print(f"[flag_effects] {name}: compiling deviceless for {hardware} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the stood-in custom calls are named in the row
            done = predict.hlo_step_job(path, hardware=hardware)
        base = done.predicted_ms("xla-default")
        for setting, env, flags in MODULE_SETTINGS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a setting priced as no change is a row of its own
                new = predict.repredict_ms(done, nccl_env=env, xla_flags=flags, strategy="xla-default")
            rows.append({"module": name, "setting": setting, "base_ms": base, "new_ms": new,
                         "predicted_pct": 100 * (base - new) / base, "seconds": time.perf_counter() - start})
    return rows


def _table_section(title: str, intro: str, header: str, cells: list[str]) -> str:
    """A predictions-only section: its title, the machine and ``intro``, a table of ``header``
    (columns after the first two numeric) and one row per item of ``cells``."""
    from benchmarks.common import machine_line

    columns = header.count("|") - 1
    return "\n".join([f"## {title}", "", f"Machine: {machine_line()}. {intro}", "", header,
                      "|---|---|" + "---:|" * (columns - 2), *cells])


def modules_section(rows: list[dict[str, Any]]) -> str:
    return _table_section(
        "flag_effects_modules (SM-free settings on XLA's benchmark modules, predicted)",
        "Each module of openxla/xla `xla/tools/benchmarks/hlo/` compiled deviceless "
        "for one node of 8 H100 (Transformer Engine attention stood in for the compile and priced from its "
        "config, as `benchmarks.measured.xla_modules` does) and predicted under XLA's and NCCL's defaults, then again "
        "with the setting (it changes no program). Effect = (base - with the setting) / base, positive = "
        "faster. The measured effects are kept aside to judge the model; only predictions are shown.",
        "| module | setting | predicted base step | predicted with the setting | predicted effect |",
        [f"| {r['module']} | {r['setting']} | {r['base_ms']:.1f} ms | {r['new_ms']:.1f} ms | "
         f"{r['predicted_pct']:+.2f}% |" for r in rows])


# The MoE steps MaxText's GPU configurations run, as the mixtral family builds them (layers
# under scan), and the settings whose effect on them the model predicts (issue 47, item 5).
# No measurement of these steps is published: predictions only, each with its sign and size.
# AI-Hypercomputer/maxtext: configs/gpu/models/mixtral_8x7b.yml (per_device_batch_size 12,
# max_target_length 4096; sparse_matmul left at base.yml's true, so the dropless ragged_dot
# path; ici_fsdp -1, no expert axis; remat minimal_with_context, for which "minimal" stands in;
# cudnn_flash_te attention, for which the Pallas flash kernel stands in) and
# tests/end_to_end/gpu/mixtral/test_8x7b.sh (sparse_matmul=False, capacity_factor=1.25,
# ici_expert_parallelism=-1, per_device_batch_size=1, max_target_length=1024).
_MIXTRAL_8X7B = dict(family="mixtral", layers=32, d_model=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                     experts=8, top_k=2, hardware="h100-sxm-8")
MOE_STEPS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b/8xH100 gpu yml (dropless, fsdp 8)": dict(
        _MIXTRAL_8X7B, moe="dropless", seq_len=4096, global_batch=96, mesh={"fsdp": 8}, remat="minimal"),
    "mixtral-8x7b/8xH100 e2e test (GShard 1.25, ep 8)": dict(
        _MIXTRAL_8X7B, moe="dropping", capacity_factor=1.25, seq_len=1024, global_batch=8, mesh={"expert": 8},
        remat="full"),
}
MOE_SETTINGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("NCCL_PROTO=LL128", "nccl", {"NCCL_PROTO": "LL128"}),
    ("NCCL_PROTO=Simple", "nccl", {"NCCL_PROTO": "Simple"}),
    ("NCCL_ALGO=Ring", "nccl", {"NCCL_ALGO": "Ring"}),
    ("NCCL_NVLS_ENABLE=0", "nccl", {"NCCL_NVLS_ENABLE": "0"}),
    ("all-gather combine threshold 1 GiB", "xla", {"xla_gpu_all_gather_combine_threshold_bytes": 1 << 30}),
    ("reduce-scatter combine threshold 0 (no combining)", "xla",
     {"xla_gpu_reduce_scatter_combine_threshold_bytes": 0}),
    ("collectives in flight: 2", "xla", {"xla_gpu_experimental_parallel_collective_overlap_limit": 2}),
    ("collective pipeliner: all-gather", "xla", {"xla_gpu_enable_pipelined_all_gather": True}),
)


# XLA's structure flags on MARIN's step (issue 63, item 6): the collective pipeliner for
# all-gather, reduce-scatter and all-reduce, and with while-loop double buffering as well (the
# structure part of XLA's O1). Their measured effects are kept aside to judge the model.
_PIPELINED = {"xla_gpu_enable_pipelined_all_gather": True, "xla_gpu_enable_pipelined_reduce_scatter": True,
              "xla_gpu_enable_pipelined_all_reduce": True}
MARIN_STRUCTURES = (("collective pipeliner (all-gather, reduce-scatter, all-reduce)", _PIPELINED),
                    ("O1 structure: the pipeliner and while-loop double buffering",
                     {**_PIPELINED, "xla_gpu_enable_while_loop_double_buffering": True}))


def predict_marin_structures() -> list[dict[str, Any]]:
    """Each of MARIN_STRUCTURES on MARIN's step, compiled with and without XLA's
    rematerialization pass: what the flags change in the module, and how it is priced."""
    from lagom_jax.advise import predict

    kw = dict(MARIN_MOE)
    kw = {**predict.config_dims(kw["family"], kw.pop("config")), **kw}  # the workload's own keys win
    kw.pop("xla_flags")
    rows = []
    for remat, extra in (("XLA's rematerialization on (as compiled)", {}), ("without it (the stand-in)", NO_XLA_REMAT)):
        print(f"[flag_effects] marin structures, {remat}: base ...", file=sys.stderr, flush=True)
        base_job = predict.train_step_job(**kw, strategy="xla-default", xla_flags=extra)
        base = base_job.predicted_ms("xla-default")
        for setting, flags in MARIN_STRUCTURES:
            print(f"[flag_effects] marin structures, {remat}: {setting} ...", file=sys.stderr, flush=True)
            job = predict.train_step_job(**kw, strategy="xla-default", xla_flags={**flags, **extra})
            rows.append({"remat": remat, "setting": setting, "base_ms": base, "new_ms": job.predicted_ms("xla-default"),
                         "parts": (_parts(base_job), _parts(job))})
    return rows


def _parts(job: Any) -> dict[str, float]:
    """Where a compiled step's time goes under XLA's defaults (ms): its kernels alone
    (matmuls, copies, the rest) and its exposed communication."""
    from lagom_jax.costs import simulate

    graph, hw = job.compiled.graph(), job.compiled.hardware
    timeline = simulate.simulate(graph, hw)
    unrolled = any(t.iteration > 0 for t in graph.tasks)
    parts = {"matmuls": 0.0, "copies": 0.0, "other kernels": 0.0}
    for t in graph.tasks:
        if not t.is_collective:
            key = "matmuls" if t.gemm else "copies" if t.opcode == "copy" else "other kernels"
            parts[key] += simulate.alone_us(t, hw) * (1 if unrolled else max(t.trip_count, 1)) / 1e3
    parts["exposed communication"] = timeline.exposed_comm_us / 1e3
    return parts


def marin_section(rows: list[dict[str, Any]]) -> str:
    cells = []
    for r in rows:
        before, after = r["parts"]
        parts = "; ".join(f"{k} {before[k]:.0f} -> {after[k]:.0f}" for k in before)
        cells.append(f"| {r['remat']} | {r['setting']} | {r['base_ms'] / 1e3:.3f} s | {r['new_ms'] / 1e3:.3f} s | "
                     f"{100 * (r['base_ms'] - r['new_ms']) / r['base_ms']:+.1f}% | {parts} |")
    return _table_section(
        "flag_effects_marin (XLA's structure flags on MARIN's MoE step, predicted)",
        "`python -m benchmarks.measured.flag_effects --marin-structures`. MARIN's "
        "stand-in (`flag_effects`' marin-moe workload, 64 GB200) compiled deviceless with each setting, with "
        "XLA's rematerialization pass on (as XLA compiles it) and off (the stand-in overflows the GPU's memory "
        "where the real run fits, NO_XLA_REMAT in the source), predicted under XLA's and NCCL's defaults. The "
        "measured effects of these settings are kept aside to judge the model: predictions only. Parts: the "
        "step's kernels alone and its exposed communication, ms (XLA's defaults, one replay).",
        "| XLA rematerialization | setting | base step | with the setting | effect | parts, base -> with |", cells)


def predict_moe_effects() -> list[dict[str, Any]]:
    """Every setting of MOE_SETTINGS on every step of MOE_STEPS, predicted."""
    from lagom_jax.advise import predict

    rows = []
    for workload, kw in MOE_STEPS.items():
        print(f"[flag_effects] {workload}: compiling deviceless ...", file=sys.stderr, flush=True)
        job = predict.train_step_job(**kw, strategy="xla-default")
        base = job.predicted_ms("xla-default")
        for setting, how, values in MOE_SETTINGS:
            print(f"[flag_effects] {workload}: {setting} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            if how == "nccl":
                new, how_done = predict.repredict_ms(job, nccl_env=values), "nccl"
            else:
                flagged = predict.train_step_job(**kw, strategy="xla-default", xla_flags=values)
                new = flagged.predicted_ms("xla-default")
                how_done = "xla: same collectives" if _collectives(flagged) == _collectives(job) else "xla"
            rows.append({"workload": workload, "setting": setting, "how": how_done, "base_ms": base, "new_ms": new,
                         "predicted_pct": 100 * (base - new) / base, "seconds": time.perf_counter() - start})
    return rows


def moe_section(rows: list[dict[str, Any]]) -> str:
    from benchmarks.common import machine_line

    lines = ["## flag_effects_moe (settings on the MoE steps MaxText's GPU recipes run, predicted)", "",
             f"Machine: {machine_line()}. Each step of MaxText's GPU configurations for Mixtral 8x7B (sources in "
             "`benchmarks/measured/flag_effects.py`, MOE_STEPS) built by the mixtral family, compiled deviceless by XLA's GPU pipeline "
             "and predicted under XLA's and NCCL's defaults, then with the setting: NCCL variables change no "
             "program (the module is priced again), an XLA flag is compiled in. Effect = (base - with the "
             "setting) / base, positive = faster. No measurement of these steps is published: predictions "
             "only.", "",
             "| workload | setting | how | predicted base step | predicted with the setting | predicted effect |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | `{r['setting']}` | {r['how']} | {r['base_ms']:.1f} ms | "
                     f"{r['new_ms']:.1f} ms | {r['predicted_pct']:+.2f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="", help="comma-separated row numbers (1-based) to run; default all")
    parser.add_argument("--no-record", action="store_true", help="print only; do not write RESULTS.md")
    parser.add_argument("--xla-modules", metavar="DIR", default=None,
                        help="predict the SM-free settings on XLA's one-node benchmark modules in DIR instead")
    parser.add_argument("--moe", action="store_true",
                        help="predict NCCL and XLA settings on the MoE steps of MaxText's GPU recipes instead")
    parser.add_argument("--marin-structures", action="store_true",
                        help="predict XLA's structure flags on MARIN's step, with and without XLA's rematerialization")
    args = parser.parse_args(argv)
    if args.marin_structures:
        _show("flag_effects_marin", marin_section(predict_marin_structures()), record=not args.no_record)
        return 0
    if args.moe:
        _show("flag_effects_moe", moe_section(predict_moe_effects()), record=not args.no_record)
        return 0
    if args.xla_modules:
        rows = predict_modules(args.xla_modules)
        if not rows:
            parser.error(f"--xla-modules {args.xla_modules}: none of {', '.join(MODULES)} is there")
        _show("flag_effects_modules", modules_section(rows), record=not args.no_record)
        return 0
    effects = list(EFFECTS)
    if args.rows:
        try:
            picked = [int(x) for x in args.rows.split(",") if x.strip()]
        except ValueError:
            parser.error(f"--rows takes row numbers, got {args.rows!r}")
        bad = [i for i in picked if not 1 <= i <= len(effects)]
        if bad:
            parser.error(f"--rows {bad}: there are {len(effects)} rows")
        effects = [effects[i - 1] for i in picked]
    _show("flag_effects", section(predict_effects(effects)),
          record=not args.no_record and len(effects) == len(EFFECTS))
    return 0


def _show(name: str, md: str, *, record: bool) -> None:
    """Print a section, and record it in RESULTS.md under ``name`` where asked."""
    print(md)
    if record:
        from benchmarks.common import write_section

        print(f"recorded in {write_section(name, md)}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
