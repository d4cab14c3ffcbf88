"""Does ``passes.combine`` predict XLA:GPU's combiners? A sweep of combine thresholds.

Run from the repository root (no GPU needed)::

    python -m benchmarks.predicted.combine_sweep [--models gpt2,bert,t5] [--recipes dp,fsdp,tp,dp+tp]
        [--dtypes bfloat16,float32] [--thresholds 0,4KiB,1MiB,8MiB,32MiB,default,1GiB]
        [--out benchmarks/results/combine_sweep.json] [--hlo-dir DIR [--reuse]]

Every step is compiled *deviceless* with XLA's real GPU pipeline for abstract GPUs of
``--hardware`` (``lagom_jax.program.gpu_compile``: 8 of them, 4 for ``tp``), in this process. Per
(model, recipe, dtype):

1. compile once with every ``xla_gpu_<kind>_combine_threshold_bytes`` at 0 (XLA's
   combiners do nothing at 0): the *uncombined* StepGraph;
2. per threshold T, compile with every threshold flag at T (``default``: no option at all,
   i.e. XLA's 30 MiB + 7 and the heuristics it applies only at the default) and compare
   the collectives XLA emitted, kind by kind (count and NCCL-convention bytes of each
   call), with ``passes.combine.combine(uncombined, T)``.

The comparison (``compare_combine``, ``KindAgreement``, ``collective_sizes``) is
``benchmarks.gpu.hlo``'s. Threshold 0 needs no second compile: XLA's output is the
uncombined module itself. The tiny configs keep each compile to seconds; their collectives
are a few KiB, so the 4 KiB threshold is the one that makes the byte limit bind.

Prints a Markdown table, writes ``--out`` (JSON) and records the ``combine_sweep``
section of RESULTS.md. With ``--hlo-dir`` every compiled module is kept there
(``<model>_<recipe>_<dtype>_<threshold>.hlo``); ``--reuse`` reads them back instead of
compiling (to re-check the pass after a change).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.common import RESULTS_DIR
from benchmarks.gpu.hlo import KindAgreement, _bytes, compare_combine, threshold_options
from lagom_jax.program import graph as graph_lib

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
DEFAULT_MODELS = ("gpt2", "bert", "t5")
DEFAULT_RECIPES = ("dp", "fsdp", "tp", "dp+tp")
DEFAULT_DTYPES = ("bfloat16", "float32")
# None: no threshold option at all (XLA's default, 30 MiB + 7, and its default-only heuristics).
DEFAULT_THRESHOLDS: tuple[int | None, ...] = (0, 4 * KIB, MIB, 8 * MIB, 32 * MIB, None, GIB)
DEFAULT_OUT = RESULTS_DIR / "combine_sweep.json"
# Mesh of each recipe. The tiny configs have 4 attention heads, so pure tensor parallelism
# runs on 4 GPUs (benchmarks.gpu.hlo's model=8 does not divide them).
MESHES = {"dp": "data=8", "fsdp": "fsdp=8", "tp": "model=4", "dp+tp": "data=4,model=2"}
KIND_ORDER = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """XLA's collectives against the pass's prediction for one config and threshold."""

    model: str
    recipe: str
    dtype: str
    threshold: int | None  # None: XLA's default (no option)
    agreements: tuple[KindAgreement, ...]
    compile_s: float  # 0 when nothing was compiled (threshold 0, or --reuse)

    @property
    def match(self) -> bool:
        return all(a.count_match and a.sizes_match for a in self.agreements)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "recipe": self.recipe, "dtype": self.dtype,
                "threshold": self.threshold if self.threshold is not None else "default",
                "match": self.match, "compile_s": round(self.compile_s, 2),
                "kinds": [a.to_dict() for a in self.agreements]}


def threshold_label(threshold: int | None) -> str:
    if threshold is None:
        return "default"
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if threshold and threshold % size == 0:
            return f"{threshold // size}{unit}"
    return str(threshold)


def parse_threshold(text: str) -> int | None:
    return None if text.strip().lower() == "default" else _bytes(text)


def compile_options(threshold: int | None) -> dict[str, object]:
    """The compile options of one sweep point: every combine threshold flag at ``threshold``."""
    return {} if threshold is None else threshold_options(threshold)


def sweep_case(model: str, recipe: str, dtype: str, thresholds: Sequence[int | None], *,
               devices: Callable[[int], Sequence[Any]], config: str = "tiny", hlo_dir: pathlib.Path | None = None,
               reuse: bool = False, progress: Callable[[str], None] = print) -> list[SweepRow]:
    """One (model, recipe, dtype): the uncombined compile, then one compile per threshold.

    ``devices(n)`` gives the n abstract GPUs the recipe's mesh needs.
    """
    from lagom_jax.models import build
    from lagom_jax.passes.combine import COMBINABLE_KINDS, DEFAULT_COMBINE_THRESHOLD_BYTES, combine

    if recipe not in MESHES:
        raise ValueError(f"recipe {recipe!r}: known {', '.join(MESHES)}")
    lowered: list[Any] = []

    def module_text(threshold: int | None) -> tuple[str, float]:
        path = None
        if hlo_dir is not None:
            path = hlo_dir / f"{model}_{recipe.replace('+', '_')}_{dtype}_{threshold_label(threshold)}.hlo"
            if reuse and path.exists():
                return path.read_text(), 0.0
        if not lowered:
            mesh = MESHES[recipe]
            n = math.prod(int(part.split("=")[1]) for part in mesh.split(","))
            built = build(model, config, recipe, mesh, devices=devices(n), dtype=dtype)
            lowered.append(built.lower())
        start = time.perf_counter()
        text = lowered[0].compile(compiler_options=compile_options(threshold)).as_text()
        elapsed = time.perf_counter() - start
        if path is not None:
            path.write_text(text)
        return text, elapsed

    text0, seconds0 = module_text(0)
    uncombined = graph_lib.from_hlo_text(text0)
    rows = []
    for threshold in thresholds:
        if threshold == 0:
            real, seconds = uncombined, seconds0
        else:
            text, seconds = module_text(threshold)
            real = graph_lib.from_hlo_text(text)
        limit = DEFAULT_COMBINE_THRESHOLD_BYTES if threshold is None else threshold
        predicted = combine(uncombined, {k: limit for k in COMBINABLE_KINDS})
        row = SweepRow(model, recipe, dtype, threshold, compare_combine(real, predicted, limit), seconds)
        rows.append(row)
        progress(f"{model} {recipe} {dtype} {threshold_label(threshold)}: "
                 + "; ".join(f"{a.kind} XLA {a.real_count} ({sum(a.real_sizes)} B) ours "
                             f"{a.predicted_count} ({sum(a.predicted_sizes)} B)" for a in row.agreements)
                 + (" -- match" if row.match else " -- DIFFER") + f" [{seconds:.1f} s]")
    return rows


def run(models: Sequence[str] = DEFAULT_MODELS, recipes: Sequence[str] = DEFAULT_RECIPES,
        dtypes: Sequence[str] = DEFAULT_DTYPES,
        thresholds: Sequence[int | None] = DEFAULT_THRESHOLDS, *, hardware: str = "h100-sxm-8",
        config: str = "tiny", hlo_dir: pathlib.Path | None = None, reuse: bool = False,
        progress: Callable[[str], None] = print) -> list[SweepRow]:
    """The whole sweep, deviceless, in this process (raises DevicelessUnavailable if it cannot)."""
    from lagom_jax.program import gpu_compile
    from lagom_jax.cluster import hardware as hardware_lib

    gpu_compile.prepare()
    hw = hardware_lib.resolve(hardware)

    def devices(n: int) -> Sequence[Any]:
        return gpu_compile.devices(hw, n)

    if hlo_dir is not None:
        hlo_dir.mkdir(parents=True, exist_ok=True)
    rows: list[SweepRow] = []
    for model in models:
        for recipe in recipes:
            for dtype in dtypes:
                rows += sweep_case(model, recipe, dtype, thresholds, devices=devices, config=config,
                                   hlo_dir=hlo_dir, reuse=reuse, progress=progress)
    return rows


def _cell(a: KindAgreement | None, side: str) -> str:
    if a is None:
        return "-"
    sizes = a.real_sizes if side == "real" else a.predicted_sizes
    return f"{len(sizes)} / {sum(sizes)} B"


def markdown(rows: Sequence[SweepRow], *, hardware: str = "h100-sxm-8", config: str = "tiny") -> str:
    """The RESULTS.md section: per config and threshold, XLA's collectives and the pass's."""
    import jax

    from benchmarks.common import machine_line

    kinds = [k for k in KIND_ORDER if any(a.kind == k for r in rows for a in r.agreements)]
    matched = sum(r.match for r in rows)
    lines = [
        "## combine_sweep (compiled: XLA:GPU deviceless, predicted: `passes.combine`)", "",
        f"Machine: {machine_line()}. Each step ({config} configs) is compiled with XLA's GPU "
        f"pipeline for abstract GPUs of `{hardware}` (jax {jax.__version__}, "
        "`lagom_jax.program.gpu_compile`; meshes "
        + ", ".join(f"{r} `{m}`" for r, m in MESHES.items()) + "), once with every combine threshold at 0 (uncombined) and "
        "once per threshold with every `xla_gpu_*_combine_threshold_bytes` at that value "
        "(`default`: no option, XLA's 30 MiB + 7). The prediction is "
        "`combine(uncombined, threshold)`; cells are `calls / total NCCL-convention bytes`, and "
        "a row matches when every kind has the same count and the same size of every call.", "",
        f"**{matched} of {len(rows)} (config, threshold) points agree exactly.**", "",
        "| model | recipe | dtype | threshold | "
        + " | ".join(f"{k} XLA | {k} ours" for k in kinds) + " | match |",
        "|---|---|---|---|" + "---|---|" * len(kinds) + "---|",
    ]
    for r in rows:
        by_kind = {a.kind: a for a in r.agreements}
        cells = [f"{_cell(by_kind.get(k), 'real')} | {_cell(by_kind.get(k), 'pred')}" for k in kinds]
        lines.append(f"| {r.model} | {r.recipe} | {r.dtype} | {threshold_label(r.threshold)} | "
                     + " | ".join(cells) + f" | {'yes' if r.match else '**no**'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--recipes", default=",".join(DEFAULT_RECIPES), help=f"of {', '.join(MESHES)}")
    ap.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES))
    ap.add_argument("--thresholds", default=",".join(threshold_label(t) for t in DEFAULT_THRESHOLDS),
                    help="bytes, e.g. 4KiB, 1MiB, 1GiB; 'default' for XLA's default (no option)")
    ap.add_argument("--config", default="tiny", help="model config (default tiny)")
    ap.add_argument("--hardware", default="h100-sxm-8", help="preset whose GPUs are compiled for")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results")
    ap.add_argument("--hlo-dir", default=None, help="keep every compiled module here")
    ap.add_argument("--reuse", action="store_true", help="read modules from --hlo-dir instead of compiling")
    ap.add_argument("--no-record", action="store_true", help="do not write the RESULTS.md section")
    args = ap.parse_args(argv)
    if args.reuse and not args.hlo_dir:
        ap.error("--reuse needs --hlo-dir")
    from lagom_jax.program.gpu_compile import DevicelessUnavailable

    try:
        rows = run(args.models.split(","), args.recipes.split(","), args.dtypes.split(","),
                   [parse_threshold(t) for t in args.thresholds.split(",")], hardware=args.hardware,
                   config=args.config, hlo_dir=pathlib.Path(args.hlo_dir) if args.hlo_dir else None,
                   reuse=args.reuse)
    except DevicelessUnavailable as e:
        print(f"combine_sweep: {e}", file=sys.stderr)
        return 2
    md = markdown(rows, hardware=args.hardware, config=args.config)
    print(md)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([r.to_dict() for r in rows], indent=1) + "\n")
    if not args.no_record:
        from benchmarks.common import write_section

        write_section("combine_sweep", md)
    return 0 if all(r.match for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
