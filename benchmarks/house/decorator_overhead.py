"""What ``@lagom_jax.tune`` adds to a step's first call, with the full search and with ``search="fast"``.

    python -m benchmarks.house.decorator_overhead [--rounds 3] [--write]

The step is the main job's scaled down to run here: a Llama 3 8B-shaped step (its head and
width ratios, 1/8 of its width, 4 layers, vocabulary 8192) under FSDP over 8 fake CPU devices,
bfloat16, full remat, layers under ``scan``, batch 8 x 256 tokens, tuned for one node of 8
H100 SXM (``h100-sxm-8``). Three arms, each in a fresh process so no compile cache of one
helps another (XLA's deviceless kernel cache file aside, which every arm shares alike):

- ``jit``: the step as ``jax.jit`` runs it, untuned;
- ``fast``: ``lagom_jax.tune(step, search="fast")``;
- ``full``: ``lagom_jax.tune(step)`` (the default: the pipeline ``lagom-jax tune`` runs).

Per arm: the first call (lower, compile for the cluster, plan, compile with the plan, run;
``block_until_ready``), the second call, and the plan's predicted speedup over XLA's defaults.
The arms run interleaved in rounds (jit, fast, full, jit, ...) so that drift on this shared
machine hits all of them; the table gives each arm's median and range. ``--write`` records it
as the ``decorator_overhead`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.common import ROOT, machine_line, write_section

CONFIG = "vocab=8192,d_model=512,heads=8,kv_heads=2,d_ff=1792,layers=4"
ARMS = ("jit", "fast", "full")


def _child(arm: str) -> dict:
    """One arm, timed in this (fresh) process."""
    import os
    import tempfile

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import lagom_jax
    from lagom_jax import models

    built = models.build("llama", CONFIG, "fsdp", "fsdp=8", batch_size=8, seq_len=256, dtype="bfloat16",
                         remat="full")
    step = built.train_step
    if arm != "jit":
        step = lagom_jax.tune(step, hardware="h100-sxm-8", search=arm,
                              cache_dir=tempfile.mkdtemp(prefix="lagom-overhead-"))
    state, batch = built.init(jax.random.key(0))
    jax.block_until_ready((state, batch))
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    first = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    second = time.perf_counter() - start
    out = {"arm": arm, "first_s": first, "second_s": second, "pid": os.getpid()}
    if arm != "jit":
        plan = step.plan(state, batch)
        out.update(speedup=plan.speedup_over("xla-default"), flags=plan.xla_flags(),
                   predicted_ms=plan.makespan_us / 1e3, tunes=step.tunes)
    return out


def _run_arm(arm: str) -> dict:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "benchmarks.house.decorator_overhead",
                           "--child", arm], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"arm {arm} failed: {proc.stderr.strip().splitlines()[-1:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import lagom_jax  # noqa: F401 - before JAX starts: CPU platforms, no CUDA plugin traceback
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm in ARMS:
            got = _run_arm(arm)
            runs[arm].append(got)
            print(f"round {r + 1}/{args.rounds} {arm}: first call {got['first_s']:.1f} s, "
                  f"second {got['second_s']:.2f} s", flush=True)
    base = statistics.median(x["first_s"] for x in runs["jit"])
    lines = ["## decorator_overhead", "",
             f"Machine: {machine_line()} (each arm: 8 fake CPU devices in its own process).", "",
             "The decorator's first call on the main job's step scaled down (Llama 3 8B's shape at 1/8 width, "
             "4 layers, FSDP over 8 fake CPU devices, bf16, full remat, batch 8 x 256), tuned for "
             f"`h100-sxm-8`; each arm a fresh process, {args.rounds} interleaved rounds, *measured* "
             "seconds (median, range). Speedups are *predicted* by the cost model.", "",
             "| arm | first call s | over jit s | second call s | predicted speedup over XLA defaults | flags |",
             "|---|---|---|---|---|---|"]
    for arm in ARMS:
        firsts = [x["first_s"] for x in runs[arm]]
        med = statistics.median(firsts)
        second = statistics.median(x["second_s"] for x in runs[arm])
        speed = f"{runs[arm][0]['speedup']:.3f}x" if arm != "jit" else "-"
        flags = f"`{runs[arm][0]['flags']}`" if arm != "jit" and runs[arm][0]["flags"] else "-"
        lines.append(f"| {arm} | {med:.1f} ({min(firsts):.1f}-{max(firsts):.1f}) | "
                     f"{med - base:+.1f} | {second:.2f} | {speed} | {flags} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("decorator_overhead", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
