"""CommFuse rings against the plain collectives on tensor-parallel-heavy cells (predicted).

Run: ``python -m benchmarks.predicted.commfuse [--no-compile]``. Two parts, every number *predicted*
by the cost model (no multi-GPU machine here):

1. **Per MLP, analytic** (`lagom_jax.costs.commfuse.choose`): the sequence-parallel MLP of GPT-2
   1.5B and T5 base, all-gather + FC1 and FC2 + reduce-scatter, plain against the ring, at
   TP 8 on one node and TP 16 on two, on the H100, A100 and A40 presets: time and exposed
   communication, and which the model chooses. XLA's own windowed einsum is not a column:
   jaxlib 0.10.2's deviceless compile produces no windowed loop (see README).
2. **Compiled steps**: the built-in step under ``tp+sp`` and ``tp+sp+cf`` compiled by XLA's
   GPU pipeline for abstract H100s and replayed by the simulator (xla-default parameters):
   step time, exposed communication, and the collective-permutes the ring put in the module.
"""

from __future__ import annotations

import argparse
import sys

from lagom_jax.cluster import hardware
from lagom_jax.costs import commfuse
from lagom_jax.models import FAMILIES, compiled
from lagom_jax.plan import planning
from lagom_jax.program import gpu_compile, graph as graph_lib

from ..common import machine_line, write_section

MLP_CELLS = (("gpt2", "1.5B"), ("t5", "base"))
TP = ((8, 1), (16, 2))  # (tp, nodes)
PRESETS = ("h100-sxm-8", "a100-sxm-8", "a40-pcie-8")
BATCH, SEQ = 8, 1024
COMPILED = (("gpt2", "355M", "model=8", 8, 1024), ("t5", "base", "model=4", 8, 512))


def mlp_rows() -> list[str]:
    rows = ["| model | TP (nodes) | hardware | plain us (exposed) | ring us (exposed) | chosen |",
            "|---|---|---|---:|---:|---|"]
    for model, config in MLP_CELLS:
        cfg = FAMILIES[model].configs[config]
        for t, nodes in TP:
            for name in PRESETS:
                hw = hardware.get(name, nodes=nodes)
                shapes = {"allgather": (cfg.d_model, cfg.d_ff // t), "reducescatter": (cfg.d_ff // t, cfg.d_model)}
                got = [commfuse.choose(kind, rows=BATCH * SEQ, k=k, n=n, t=t, hw=hw, nodes=nodes)
                       for kind, (k, n) in shapes.items()]
                plain = sum(c.plain_us for c in got)
                ring = sum(c.ring_us for c in got)
                chosen = " + ".join(f"{c.kind}: {'ring' if c.ring else 'plain'}" for c in got)
                rows.append(f"| {model} {config} | {t} ({nodes}) | {name} | {plain:.0f} "
                            f"({sum(c.exposed_plain_us for c in got):.0f}) | {ring:.0f} "
                            f"({sum(c.exposed_ring_us for c in got):.0f}) | {chosen} |")
    return rows


def compiled_rows(progress) -> list[str]:
    hw = hardware.get("h100-sxm-8")
    rows = ["| model | mesh | recipe | collective-permutes | predicted step ms | exposed comm ms |",
            "|---|---|---|---:|---:|---:|"]
    for model, config, mesh, batch, seq in COMPILED:
        for recipe in ("tp+sp", "tp+sp+cf"):
            progress(f"compiling {model} {config} {recipe} [{mesh}] for H100")
            step = compiled.compile_builtin_isolated(hw, model, config, recipe, mesh,
                                                        batch_size=batch, seq_len=seq, dtype="bfloat16")
            g = graph_lib.from_hlo_text(step.text)
            permutes = sum(1 for t in g.collectives if t.kind == "collective-permute")
            timeline = planning.plan(g, hw, strategy="xla-default").chosen.timeline
            rows.append(f"| {model} {config} | {mesh} | {recipe} | {permutes} "
                        f"| {timeline.makespan_us / 1e3:.2f} | {timeline.exposed_comm_us / 1e3:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-compile", action="store_true", help="only the analytic part")
    args = parser.parse_args(argv)
    gpu_compile.prepare()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    out = ["## commfuse (predicted: plain collectives against CommFuse rings)", "",
           f"Machine: {machine_line()}. Every time is predicted by the cost model.", "",
           f"Sequence-parallel MLP, {BATCH} x {SEQ} tokens, bfloat16, per layer forward "
           "(all-gather + FC1, FC2 + reduce-scatter), `commfuse.choose`:", ""]
    out += mlp_rows()
    if not args.no_compile:
        out += ["", "Compiled steps (XLA:GPU deviceless, H100; simulated with XLA/NCCL defaults):", ""]
        out += compiled_rows(progress)
    text = "\n".join(out)
    print(text)
    write_section("commfuse", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
