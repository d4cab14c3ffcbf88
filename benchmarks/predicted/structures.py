"""The structure search on Llama-class steps: the predicted effect of each structure flag.

For each workload the step is compiled deviceless for its cluster and tuned by the
pipeline with the structure search on (``lagom_jax.job.run(..., structures=True)``): every
candidate flag (the collective pipeliner, while-loop double buffering, combine-by-dim) is
compiled where it could hide exposed communication and its predicted effect recorded; then
lagom's predicted gain over XLA's defaults and the number and time of the compiles, and the
plan's verification: the step recompiled with the plan's options has the collectives the
search predicted, in the places it predicted (outside loops, in loops of how many
iterations), and each option changes the module.

    python -m benchmarks.predicted.structures [--no-record]

Every step time here is *predicted* by the cost model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

WORKLOADS = (
    # (name, model, config, mesh, global batch, seq, remat, preset)
    ("llama3-8b fsdp 8 (1 node)", "llama", "llama3-8b", {"fsdp": 8}, 16, 4096, "full", "h100-sxm-8"),
    ("llama3-8b fsdp 16 (2 nodes)", "llama", "llama3-8b", {"fsdp": 16}, 32, 4096, "full", "h100-sxm-8"),
    ("llama2-7b data 2 x fsdp 8 (2 a3 VMs)", "llama", "llama2-7b", {"data": 2, "fsdp": 8}, 64, 4096,
     "minimal_flash", "a3"),
    ("llama3-70b fsdp 64 (8 nodes)", "llama", "llama3-70b", {"fsdp": 64}, 64, 4096, "full", "h100-sxm-8"),
    ("llama3-70b fsdp 256 (32 nodes)", "llama", "llama3-70b", {"fsdp": 256}, 256, 8192, "full", "h100-sxm-8"),
    ("llama3.1-405b data 8 x fsdp 256 (256 nodes)", "llama", "llama3.1-405b", {"data": 8, "fsdp": 256}, 2048,
     8192, "full", "h100-sxm-8"),
    ("mixtral-8x7b fsdp 8 x expert 8 (8 nodes)", "mixtral", "mixtral-8x7b", {"fsdp": 8, "expert": 8}, 64, 4096,
     "full", "h100-sxm-8"),
)


def one(name: str) -> dict[str, Any]:
    from lagom_jax import job
    from lagom_jax.cluster import hardware

    _, model, config, mesh, batch, seq, remat, preset = next(w for w in WORKLOADS if w[0] == name)
    hw = hardware.get(preset, max(1, math.prod(mesh.values()) // 8))
    source = job.ModelSource(model, config, mesh, None, batch, seq, "bfloat16", remat, True, "flash")
    start = time.perf_counter()
    tuned = job.run(source, hw, structures=True, verify=True, baselines=("xla-default", "recipe"))
    predicted = dict(tuned.plan.predicted_us)
    return {"name": name, "decisions": [list(d) for d in tuned.plan.decisions],
            "verification": [list(v) for v in tuned.plan.verification],
            "xla_default_ms": predicted["xla-default"] / 1e3, "recipe_ms": predicted["recipe"] / 1e3,
            "lagom_ms": predicted["lagom"] / 1e3, "flags": tuned.plan.xla_flags(),
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(one(args.child)))
        return 0
    from benchmarks.common import json_from_child, machine_line, write_section

    lines = ["## structures (predicted: the structure search on Llama-class steps)", "",
             f"Machine: {machine_line()}. Each workload compiled deviceless for its cluster (flash attention, "
             "layers scanned) and tuned with the structure search: each candidate flag compiled where it "
             "could hide exposed communication, taken for a predicted step 1% shorter, then verified by "
             "recompiling with the plan's options. *Predicted* times; "
             "`recipe` is the MaxText/JAX-Toolbox flag recipe as the passes model it.", ""]
    for w in WORKLOADS:
        print(f"[structures] {w[0]} ...", file=sys.stderr, flush=True)
        r = json_from_child("benchmarks.predicted.structures", "--child", w[0])
        if "failed" in r:
            lines += [f"### {w[0]}", "", f"failed: {r['failed']}", ""]
            continue
        lines += [f"### {r['name']}", "",
                  f"xla-default {r['xla_default_ms']:.1f} ms, recipe {r['recipe_ms']:.1f} ms, lagom "
                  f"{r['lagom_ms']:.1f} ms ({r['xla_default_ms'] / r['lagom_ms']:.3f}x over xla-default, "
                  f"{r['recipe_ms'] / r['lagom_ms']:.3f}x over the recipe); tuned in {r['seconds']:.0f} s; "
                  f"XLA_FLAGS: `{r['flags'] or 'none'}`", "",
                  "| choice | decision |", "|---|---|"]
        lines += [f"| {s} | {d} |" for s, d in r["decisions"]]
        lines += ["", "Verified by recompiling with the plan's options:", "", "| check | outcome |", "|---|---|"]
        lines += [f"| {s} | {d} |" for s, d in r["verification"]]
        lines.append("")
    section = "\n".join(lines)
    print(section)
    if not args.no_record:
        write_section("structures", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
