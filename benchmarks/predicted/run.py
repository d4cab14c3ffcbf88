"""The benchmark suite: predicted (and, where devices exist, measured) speedups per cell.

``python -m benchmarks.predicted.run [--quick] [--cells gpt2/dp,bert/fsdp] [--strategies ...]
[--hardware h100-sxm-8,a40-pcie-8] [--no-measure]``

For every cell (model x recipe x mesh, see ``benchmarks/predicted/suite.py``) and hardware preset it
compiles the cell's train step from abstract inputs, parses the HLO into a StepGraph and
runs every strategy (xla-default, recipe, autoccl, lagom) under the cost model: predicted
step time, speedup over xla-default and over autoccl, efficiency against the overlap
bound, search evaluations and search time. Cells whose mesh fits the devices of this run
are also *measured*: warm-up, then timed steps (median, min-max) of the untuned jitted step
and of ``lagom_jax.tune`` of it. Output: a progress line per cell on stderr,
``<out>/<name>.json`` (machine, versions, every number), ``<out>/<name>.png`` (speedup
chart) and the Markdown table, recorded in benchmarks/RESULTS.md through
``benchmarks.common.write_section`` when ``--out`` is the default results folder.

Where it runs
-------------
*This machine* (CPU only): measurements use the ``tiny`` configs on 8 fake CPU devices,
which shows the tuned executable runs; CPU timings say nothing about GPU overlap.

*One multi-GPU host*: ``python -m benchmarks.predicted.run --quick`` (JAX sees all local GPUs; the
cells whose mesh has at most that many devices are measured at their real size, and the
plan predicts for ``--measure-hardware``, ``auto`` by default: the preset of the GPU model).

*Several hosts*, one process per host (or per GPU), every process running the same
command with ``--distributed`` (which calls ``jax.distributed.initialize``; process 0
writes the results, every process runs the measured steps of the cells whose mesh
uses every device):

- SLURM (JAX reads the allocation itself)::

      srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 \\
          python -m benchmarks.predicted.run --distributed --cells gpt2/dp/16,gpt2/dp+tp/16

- ``mpirun`` (Open MPI; JAX reads ``OMPI_*``)::

      mpirun -np 2 -H host1,host2 python -m benchmarks.predicted.run --distributed --cells gpt2/dp/16

- plain environment variables, on each host (``JAX_COORDINATOR_ADDRESS`` is JAX's own)::

      JAX_COORDINATOR_ADDRESS=host1:1234 python -m benchmarks.predicted.run --distributed \\
          --num-processes 2 --process-id 0    # 1 on host2

NCCL reads its environment when the first communicator is created, so a tuned plan's
NCCL settings reach a GPU run only if set at launch: the JSON records each plan's flags,
and ``lagom_jax.launch_line(plan)`` prints the launch line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..common import RESULTS_DIR, machine_info, machine_line, write_section
from .suite import (HARDWARE, STRATEGIES, CompileError, chart, check_names, compile_hlo,
                    full_matrix, markdown, measure, predict, quick_matrix, select)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.predicted.run",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a representative subset (<= 10 min here)")
    p.add_argument("--cells", type=_csv, default=None, help="comma-separated cell ids, e.g. gpt2/dp+tp")
    p.add_argument("--strategies", type=_csv, default=list(STRATEGIES))
    p.add_argument("--hardware", type=_csv, default=None,
                   help=f"presets (default: {', '.join(HARDWARE)}; with --quick the first two)")
    p.add_argument("--tiny", action="store_true",
                   help="predict the tiny configs too (seconds a cell; for tests and smoke runs)")
    p.add_argument("--no-measure", dest="measure", action="store_false",
                   help="predictions only, no timed steps")
    p.add_argument("--steps", type=int, default=5, help="timed steps per measurement (after 2 warm-up)")
    p.add_argument("--measure-hardware", default=None,
                   help="preset the tuned measurement plans for (default: auto on GPUs, else the first --hardware)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="where to write (default: benchmarks/results, recorded in RESULTS.md; with --quick "
                        "benchmarks/results/local, untracked, unless --record)")
    p.add_argument("--record", action="store_true",
                   help="with --quick: record in benchmarks/results and RESULTS.md like a full run")
    p.add_argument("--name", default=None, help="output name (default: suite, or suite_quick with --quick)")
    p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize first")
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)
    args = p.parse_args(list(argv))
    if args.out is None:
        args.out = RESULTS_DIR / "local" if args.quick and not args.record else RESULTS_DIR
    return args


def _versions() -> dict[str, str]:
    import flax
    import jax
    import numpy

    from lagom_jax import api

    return {"lagom_jax": api.VERSION, "jax": jax.__version__, "flax": flax.__version__,
            "numpy": numpy.__version__, "python": sys.version.split()[0]}


def _progress(i: int, n: int, text: str) -> None:
    bar = "#" * round(20 * i / n)
    print(f"[{bar:<20}] {i}/{n} {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    """Run the suite as the command line says; returns the report that the JSON holds."""
    args = parse_args(argv)
    import jax

    from lagom_jax.program import gpu_compile

    # Both must precede the first backend use: on a host without a CUDA driver, keep JAX
    # on the CPU (the CUDA plugin would fail its start-up check); a GPU backend ignores
    # the CPU device count.
    gpu_compile.prepare()
    jax.config.update("jax_num_cpu_devices", 8)
    if args.distributed:
        jax.distributed.initialize(num_processes=args.num_processes, process_id=args.process_id)
    from lagom_jax.program import graph as graph_lib
    from lagom_jax.cluster import hardware as hardware_lib

    strategies = check_names("strategies", args.strategies, STRATEGIES)
    if not strategies:
        raise ValueError("--strategies is empty; known: " + ", ".join(STRATEGIES))
    default_hw = HARDWARE[:2] if args.quick else HARDWARE
    presets = check_names("hardware", args.hardware or list(default_hw), list(hardware_lib.PRESETS))
    cells = select(quick_matrix() if args.quick else full_matrix(), args.cells)
    if args.tiny:
        cells = tuple(dict.fromkeys(c.tiny() for c in cells))
    name = args.name or ("suite_quick" if args.quick else "suite")
    writer = jax.process_index() == 0
    platform = jax.devices()[0].platform
    measure_hw = args.measure_hardware or ("auto" if platform != "cpu" else presets[0])

    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []
    total = len(cells) * len(presets)
    done = 0
    for cell in cells:
        for preset in presets:
            per_node = hardware_lib.get(preset).gpus_per_node
            hw = hardware_lib.get(preset, nodes=max(1, -(-cell.num_devices // per_node)))
            row: dict[str, Any] = {"cell": cell.id, "label": cell.label(), "spec": dataclasses.asdict(cell),
                                   "hardware": preset, "nodes": hw.nodes, "num_devices": cell.num_devices}
            t0 = time.perf_counter()
            try:
                step = compile_hlo(cell, hw)
            except CompileError as err:
                step, row["error"] = None, str(err)
            row["compile_s"] = time.perf_counter() - t0
            done += 1
            if step is None:
                _progress(done, total, f"{cell.label()} on {preset} x{hw.nodes}: {row['error']}")
                rows.append(row)
                continue
            g = graph_lib.from_hlo_text(step.text)
            row["compiled_by"] = step.where
            if step.warning:
                row["compile_warning"] = step.warning
            row["graph"] = {"tasks": len(g.tasks), "collectives": len(g.collectives),
                            "total_flops": g.total_flops}
            row["strategies"] = predict(step.text, hw, strategies)
            lag = row["strategies"].get("lagom", {})
            _progress(done, total, f"{cell.label()} on {preset} x{hw.nodes}: {len(g.collectives)} collectives, "
                      f"compile {row['compile_s']:.1f}s"
                      + (f", lagom {lag['speedup_vs_xla-default']:.3f}x over xla-default, "
                         f"{lag['evaluations']} evals in {lag['search_time_s']:.2f}s"
                         if "speedup_vs_xla-default" in lag else ""))
            rows.append(row)
        if args.measure:
            m = measure(cell, measure_hw, steps=args.steps)
            measured.append(m)
            what = m.get("skipped") or (f"untuned {m['untuned']['median_ms']:.1f} ms, "
                                        f"tuned {m['tuned']['median_ms']:.1f} ms")
            print(f"  measured ({m['platform']}, {m['config']}) {cell.id}: {what}", file=sys.stderr, flush=True)

    info = machine_info()
    selection = "selected cells" if args.cells else "quick subset" if args.quick else "full matrix"
    report = {
        "name": name, "quick": args.quick, "selection": selection + (", tiny configs" if args.tiny else ""),
        "command": " ".join(["python -m benchmarks.predicted.run", *argv]),
        "machine": info, "versions": _versions(), "strategies": list(strategies),
        "hardware": list(presets), "wall_s": time.perf_counter() - start,
        "rows": rows, "measured": measured,
        "measured_note": ("CPU measurements time the tiny configs on fake devices; they do not "
                          "reflect GPU overlap") if platform == "cpu" else "",
    }
    if writer:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.json").write_text(json.dumps(report, indent=1, sort_keys=True))
        md = markdown(report, machine_line(info))
        chart(report, args.out / f"{name}.png")
        if args.out.resolve() == RESULTS_DIR.resolve():
            write_section(name, md)
        else:
            (args.out / f"{name}.md").write_text(md + "\n")
        print(md)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
