"""ConfigTuner: the one adviser on the smaller built-in models, and (``--families``) at cluster scale.

Default part (section ``advise``): GPT-2 355M, BERT-large and T5-base on 8 GPUs of
``h100-sxm-8`` (NVLink) and ``a40-pcie-8`` (PCIe), one node each, advised by
`lagom_jax.advise.configtuner.advise`: the search llama and mixtral get (meshes ruled out by
arithmetic, the closed-form screen calibrated on the compiled steps, the finalists' batch and
remat searched, memory from XLA's deviceless compile against the limit), and the best
configuration tuned by the pipeline. Every step time is *predicted* by the cost model.

Run: ``python -m benchmarks.predicted.advise [--batch 32] [--jobs N]``. Records the ranked tables in
benchmarks/RESULTS.md (section ``advise``) and the full advice as ``benchmarks/results/advise.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from ..common import RESULTS_DIR, machine_line, write_section

DEVICES = 8
MODELS = (("gpt2", "355M", 1024), ("bert", "large", 512), ("t5", "base", 512))  # (model, config, seq_len)
PRESETS = ("h100-sxm-8", "a40-pcie-8")
SHOWN = 8  # ranked rows per table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    from lagom_jax.advise.configtuner import advise
    from lagom_jax.program import gpu_compile

    gpu_compile.prepare()  # before JAX starts: on a host without a CUDA driver, stay on the CPU
    sections, dump = [], []
    jobs = [(m, c, s, p) for m, c, s in MODELS for p in PRESETS]
    for model, config, seq, preset in jobs:
        t0 = time.perf_counter()
        a = advise(model, config, DEVICES, preset, global_batch=args.batch, seq_len=seq, jobs=args.jobs,
                   tune=True, progress=lambda m: print(m, file=sys.stderr, flush=True))
        wall = time.perf_counter() - t0
        report = a.report(SHOWN, width=None)
        sections.append(f"### {model} {config} on {DEVICES} x {preset}, global batch {args.batch}, seq {seq}\n\n"
                        f"advise wall time {wall:.0f} s ({a.compiles} configurations compiled, {args.jobs} "
                        f"parallel; measured, this machine).\n\n" + report.split("\n", 2)[2] + "\n")
        dump.append({**json.loads(a.to_json()), "config": config, "wall_s_measured": wall})
        # Written after every job, so that a run cut short keeps what it did (and says so).
        done = "" if len(dump) == len(jobs) else f" (this run was cut short: {len(dump)} of {len(jobs)} jobs)"
        md = ("## advise\n\n"
              f"Machine: {machine_line()}\n\n"
              "ConfigTuner's one search (`lagom_jax.advise.configtuner.advise`, `lagom-jax advise`) on the smaller "
              "built-in models: the same search as Llama and Mixtral get in `advise_families`, with pipeline stages "
              "(GPipe, XLA's attention). Memory is XLA's deviceless compile for 8 GPUs of the preset against the "
              "limit; every step time is **predicted** (`predict_train_step_ms`'s prediction of the compiled step, "
              "XLA defaults), and the lines under each table say how far the calibrated screen is from the "
              f"compiled steps{done}.\n\n" + "\n".join(sections))
        (RESULTS_DIR / "advise.json").write_text(json.dumps(dump, indent=2) + "\n")
        write_section("advise", md)


# ------------------------------------------- Llama, Mixtral, GPT: memory from XLA (issue 37)

FAMILY_FRACTIONS = (0.75, 0.9)  # JAX's default; what MaxText/JAX-Toolbox scripts often set
ADVISED_ROWS = ("maxtext-llama2-7b/8xH100", "paxml-llama2-7b/16xH100", "paxml-gpt5b/16xH100")
SCALE_RUNS = (  # (name, config, family, current mesh, seq, global batch, current remat)
    ("llama3-70b on 256 H100", "llama3-70b", "llama", {"fsdp": 256}, 8192, 256, "full"),
    ("mixtral-8x7b on 64 H100", "mixtral-8x7b", "mixtral", {"fsdp": 8, "expert": 8}, 4096, 256, "full"),
)


def _child_rss_gib() -> float:
    from lagom_jax.program import fork_server

    return fork_server.largest_child_rss_bytes() / 2 ** 30


def _published(jobs: int, say) -> tuple[list[str], list[dict]]:
    """Every published run of benchmarks/measured/workloads.py: its own configuration's memory from
    XLA (with the run's flags, scan and attention) against the limits, and, for
    ``ADVISED_ROWS``, the advised alternative at fraction 0.9 with the run's flags."""
    import concurrent.futures

    from lagom_jax.advise import configtuner, memory, predict

    from ..measured.workloads import ROWS

    def own(row):
        kw = row.contract_kwargs()
        options, _cap, _runtime = predict._split_flags(row.flags)  # noqa: SLF001
        hw = predict._cluster(row.hardware, row.gpus)  # noqa: SLF001
        src = predict.train_step_source(kw["family"], **{k: v for k, v in kw.items() if k not in ("family", "hardware")})
        limit = int(memory.gpu_memory_bytes(hw) * 0.9)
        step, _ = memory.compile_step(hw, src.model, src.config, src.shape(), batch_size=row.global_batch,
                                      seq_len=row.seq_len, remat=row.remat, attention=row.attention,
                                      limit_bytes=limit, scan=row.scan, options=options)
        say(f"{row.name}: peak {step.peak_bytes / 2 ** 30:.1f} GiB")
        return step, memory.gpu_memory_bytes(hw)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        owns = list(pool.map(own, ROWS))
    lines = ["| published run | GPUs | mesh, remat, batch per rank | peak GiB (XLA) | fits at 0.75 / 0.9 | "
             "predicted s | advised alternative (fraction 0.9, the run's flags) | advised peak GiB | "
             "advised s | predicted gain | why it differs |", "|---|---:|---|---:|---|---:|---|---:|---:|---:|---|"]
    dump = []
    for row, (step, gpu) in zip(ROWS, owns):
        ways = math.prod(row.mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
        fits = " / ".join("yes" if step.peak_bytes <= gpu * f else "NO" for f in FAMILY_FRACTIONS)
        mesh = ",".join(f"{a}={n}" for a, n in row.mesh.items())
        alt = "-"
        cells = ["-", "-", "-", "-"]
        entry = {"row": row.name, "peak_bytes": step.peak_bytes, "gpu_bytes": gpu, "step_ms": step.step_ms,
                 "xla_remat": step.remat_instructions}
        if row.name in ADVISED_ROWS:
            kw = row.contract_kwargs()
            dims = {k: kw[k] for k in ("layers", "d_model", "heads", "kv_heads", "ffn", "vocab")}
            t0 = time.perf_counter()
            a = configtuner.advise_train_step(kw["family"], **dims, gpus=row.gpus, hardware=row.hardware,
                                              global_batch=row.global_batch, seq_len=row.seq_len,
                                              memory_fraction=0.9, jobs=jobs, mesh_finalists=2,
                                              xla_flags=row.flags, progress=say)
            b = a.best
            gain = step.step_ms / b.step_ms
            why = ("-" if abs(gain - 1) <= 0.03 else
                   ("the published run unrolled its layers; the advised step is scanned. " if not row.scan else "")
                   + _why(row, b, ways))
            alt = b.label()
            cells = [f"{b.peak_bytes / 2 ** 30:.1f}", f"{b.step_ms / 1e3:.3f}", f"{gain:.2f}x", why]
            entry.update(advised=b.to_dict(), compiles=a.compiles, wall_s=time.perf_counter() - t0)
        dump.append(entry)
        lines.append(f"| {row.name} | {row.gpus} | {mesh}, {row.remat}, {row.global_batch // ways} | "
                     f"{step.peak_bytes / 2 ** 30:.1f}" + (" (XLA remat)" if step.remat_instructions else "")
                     + f" | {fits} | {step.step_ms / 1e3:.3f} | {alt} | " + " | ".join(cells) + " |")
    return lines, dump


def _why(row, best, ways: int) -> str:
    parts = []
    if best.remat != row.remat:
        parts.append(f"remat {best.remat} instead of {row.remat} (less recomputation fits)"
                     if configtuner_order(best.remat) > configtuner_order(row.remat) else
                     f"remat {best.remat} instead of {row.remat}")
    if {a: n for a, n in best.mesh.items() if n > 1} != {a: n for a, n in row.mesh.items() if n > 1}:
        parts.append("another mesh")
    if best.grad_accum > 1:
        parts.append(f"{best.grad_accum} micro-steps")
    return "; ".join(parts) or "the same configuration, compiled scanned"


def configtuner_order(remat: str) -> int:
    from lagom_jax.advise.configtuner import REMAT_ORDER

    return REMAT_ORDER.index(remat)


def _scale(jobs: int, say) -> tuple[list[str], list[dict]]:
    from lagom_jax import models
    from lagom_jax.advise import configtuner

    lines, dump = [], []
    for name, config, family, mesh, seq, batch, remat in SCALE_RUNS:
        cfg = models.families.resolve_config(family, config)
        dims = dict(layers=cfg.layers, d_model=cfg.d_model, heads=cfg.heads, kv_heads=cfg.kv_heads or cfg.heads,
                    ffn=cfg.d_ff, vocab=cfg.vocab, experts=cfg.experts, top_k=cfg.top_k)
        gpus = math.prod(mesh.values())
        t0 = time.perf_counter()
        a = configtuner.advise_train_step(family, **dims, gpus=gpus, hardware="h100-sxm-8", global_batch=batch,
                                          seq_len=seq, current={"mesh": mesh, "per_device_batch": None,
                                                                "remat": remat},
                                          jobs=jobs, cache=False, progress=say)
        wall = time.perf_counter() - t0
        lines += [f"### {name}: global batch {batch} x seq {seq}, yours: {mesh}, remat {remat}", "",
                  f"advise wall time {wall:.0f} s (measured, this machine, {jobs} parallel compiles), "
                  f"{a.compiles} configurations compiled (none from the cache), {len(a.rejected)} ruled out "
                  f"before compiling; largest child RSS {_child_rss_gib():.2f} GiB.", "",
                  a.table(8), "", "Pruning: " + " ".join(a.pruning), "",
                  "MaxText-style config of the best:", "", "```yaml",
                  configtuner.maxtext_fragment(a.best, gpus, 8), "```", ""]
        dump.append(json.loads(a.to_json()) | {"wall_s": wall})
    return lines, dump


def families_main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.predicted.advise --families``: the section ``advise_families``."""
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--families", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip-scale", action="store_true")
    args = ap.parse_args(argv)
    from lagom_jax.program import gpu_compile

    gpu_compile.prepare()
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    scale, scale_dump = ([], []) if args.skip_scale else _scale(args.jobs, say)
    t0 = time.perf_counter()
    pub, pub_dump = _published(args.jobs, say)
    pub_wall = time.perf_counter() - t0
    md = "\n".join([
        "## advise_families (memory from XLA, predicted steps: Llama, Mixtral, GPT)", "",
        f"Machine: {machine_line()}", "",
        "`lagom_jax.advise_train_step` (`lagom-jax advise --model llama|mixtral|gpt`): peak memory per GPU "
        "is XLA's memory analysis of the step compiled deviceless for the cluster (arguments + outputs - "
        "aliased + temporaries + code), against the GPU's memory (`device_memory_size` of XLA's target "
        "description) times the memory fraction; steps are predicted by the cost model (the contract's "
        "`predict_train_step_ms`, xla-default with the run's flags).", "",
        "### Published runs (benchmarks/measured/workloads.py): predicted to fit, and the advised alternative", "",
        "Each published configuration compiled as it ran (its flags, scan or not, attention); the reference "
        "does not list each run's `XLA_PYTHON_CLIENT_MEM_FRACTION`, so the fit is shown at JAX's default "
        "0.75 and at 0.9. The advised alternative (2 mesh finalists) is searched at 0.9 with the run's flags, "
        f"scanned. Wall time of this part {pub_wall:.0f} s.", "",
        *pub, "", *scale])
    (RESULTS_DIR / "advise_families.json").write_text(json.dumps({"published": pub_dump, "scale": scale_dump},
                                                                  indent=2) + "\n")
    write_section("advise_families", md)


if __name__ == "__main__":
    if "--families" in sys.argv[1:]:
        families_main()
    else:
        main()
