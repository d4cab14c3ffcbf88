"""Lower and compile the large models' sharded train steps on 8 and 64 fake CPU devices.

GPT-2 1.5B, BERT-large and T5-base are built with `lagom_jax.models.build` and compiled
from abstract inputs (`jax.ShapeDtypeStruct` with shardings), so no weight is allocated.
The device count of a JAX process is fixed when its backend starts, and peak RSS only
grows within a process, so each (model, device count) compiles in its own subprocess,
which reports its lower/compile times and its peak resident memory.

Recipes: FSDP over all devices (``fsdp=8``; ``data=8,fsdp=8`` on 64), which every model
divides evenly, and a hybrid with a GPipe pipeline: data x pipeline x tensor for BERT-large
and T5-base; GPT-2 1.5B has 25 heads, so tensor parallelism over 2/4/8 does not divide it
and its hybrid uses FSDP instead. Sequences have the model's full length; the global
batch is one sequence per device, or what the pipeline's microbatches need.

Run: ``python -m benchmarks.house.compile_large [--devices 8 64] [--models gpt2:1.5B ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

MODELS = ("gpt2:1.5B", "bert:large", "t5:base")
# devices -> [(recipe, mesh, models it applies to, global batch)]
RECIPES = {
    8: [("fsdp", "fsdp=8", MODELS, 8),
        ("dp+pp+tp", "data=2,stage=2,model=2", ("bert:large", "t5:base"), 8),
        ("dp+fsdp+pp", "data=2,fsdp=2,stage=2", ("gpt2:1.5B",), 16)],
    64: [("dp+fsdp", "data=8,fsdp=8", MODELS, 64),
         ("dp+pp+tp", "data=4,stage=4,model=4", ("bert:large", "t5:base"), 128),
         ("dp+fsdp+pp", "data=4,fsdp=4,stage=4", ("gpt2:1.5B",), 128)],
}
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def compile_one(model: str, config: str, recipe: str, mesh: str, batch: int) -> dict:
    """In this process (whose backend has enough CPU devices): build, lower, compile."""
    import jax

    from lagom_jax.models import build

    t0 = time.perf_counter()
    built = build(model, config, recipe, mesh, batch_size=batch)
    t1 = time.perf_counter()
    lowered = built.lower()
    t2 = time.perf_counter()
    text = lowered.compile().as_text()
    t3 = time.perf_counter()
    # ru_maxrss is in KiB on Linux.
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"model": model, "config": config, "devices": len(jax.devices()), "recipe": recipe,
            "mesh": mesh, "batch": batch,
            "params": built.num_params,
            "build_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2,
            "peak_rss_mib": rss_mib, "hlo_lines": text.count("\n") + 1,
            "collectives": {k: len(re.findall(rf"\s{k}(?:-start)?\(", text)) for k in KINDS}}


def _worker(devices: int, *args: str | int) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    print(json.dumps(compile_one(*args)))


def run_subprocess(devices: int, model: str, config: str, recipe: str, mesh: str,
                   batch: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    args = (devices, model, config, recipe, mesh, batch)
    code = f"from benchmarks.house.compile_large import _worker; _worker(*{args!r})"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"compiling {model} {config} on {devices} devices failed:\n"
                           f"{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def render(results: list[dict], machine: str) -> str:
    rows = ["| model | params | devices | recipe (mesh) | batch | lower s | compile s |"
            " peak RSS MiB | collectives in HLO |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items() if v)
        rows.append(f"| {r['model']} {r['config']} | {r['params'] / 1e6:.0f}M | {r['devices']} |"
                    f" {r['recipe']} ({r['mesh']}) | {r['batch']} | {r['lower_s']:.1f} |"
                    f" {r['compile_s']:.1f} |"
                    f" {r['peak_rss_mib']:.0f} | {coll} |")
    return "\n".join([
        "## compile_large",
        "",
        f"Machine: {machine}",
        "",
        "Large train steps (AdamW, float32, full sequence length) lowered and compiled on fake CPU devices from abstract inputs; one subprocess per"
        " row, peak RSS of that subprocess. Times *measured* on a shared machine (other jobs"
        " were running), so they are upper bounds. Collective counts are of the CPU HLO"
        " (layer loops counted once, not per layer).",
        "",
        *rows,
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=sorted(RECIPES),
                    choices=sorted(RECIPES))
    ap.add_argument("--models", nargs="+", default=list(MODELS),
                    help="model:config pairs, e.g. gpt2:1.5B bert:large t5:base")
    args = ap.parse_args(argv)

    from benchmarks.common import machine_line, write_section

    results = []
    for devices in args.devices:
        for recipe, mesh, models, batch in RECIPES[devices]:
            for spec in (m for m in models if m in args.models):
                model, _, config = spec.partition(":")
                r = run_subprocess(devices, model, config, recipe, mesh, batch)
                print(json.dumps(r), flush=True)
                results.append(r)
    write_section("compile_large", render(results, machine_line()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
