"""Tile sweep of JAX's grouped-GEMM kernels on one Hopper GPU: which tiles ``moe="grouped"`` runs.

``models.grouped_gemm`` calls JAX's Pallas Mosaic-GPU kernels
(``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu.ragged_dot`` and
``transposed_ragged_dot_mgpu.transposed_ragged_dot``) with one tile configuration. This times
each kernel over a small grid of tiles (block_m, block_n, block_k, max_concurrent_steps,
grid_block_n: the parameters JAX's own benchmark in those modules sweeps) at the expert GEMMs
of Mixtral 8x7b and of a 64-expert top-4 layer, balanced groups, bfloat16, and records the
rate of each (useful FLOPs, 2 x rows x K x N, over the median time). A configuration the
kernel refuses (shared memory, divisibility) is recorded with its error.

Run on the GPU machine: ``python -m benchmarks.gpu.grouped_tiles --out DIR`` (writes
``grouped_tiles.json`` after every configuration, so a run stopped at its limit keeps the rest).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import pathlib
import sys
import time
from typing import Any

# (shape, groups, rows, K, N) of each forward GEMM: the up (d_model -> FFN) and down projections.
FORWARD = (("mixtral-8x7b up", 8, 16384, 4096, 14336), ("mixtral-8x7b down", 8, 16384, 14336, 4096),
           ("64 experts up", 64, 32768, 2560, 1280), ("64 experts down", 64, 32768, 1280, 2560))
# The weights' gradient of the up projections: x [rows, K], dy [rows, N] -> [groups, K, N].
WEIGHT_GRAD = (("mixtral-8x7b up", 8, 16384, 4096, 14336), ("64 experts up", 64, 32768, 2560, 1280))
FORWARD_TILES = dict(block_m=(128, 64), block_n=(128, 256), block_k=(64,), max_concurrent_steps=(2, 4),
                     grid_block_n=(1, 4))
WEIGHT_TILES = dict(block_m=(64, 128), block_n=(64, 128), block_k=(64,), max_concurrent_steps=(2, 4),
                    grid_block_n=(1,))
CURRENT = {"forward": dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=2, grid_block_n=1),
           "weight_grad": dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=2, grid_block_n=1)}


def configs(grid: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def sweep(out: pathlib.Path, *, repeats: int, inner: int, progress: Any = print,
          forward_tiles: dict[str, tuple[int, ...]] = FORWARD_TILES,
          weight_tiles: dict[str, tuple[int, ...]] = WEIGHT_TILES) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from benchmarks.gpu.kernels import _normal, timed
    from lagom_jax.costs import kernels as cost_kernels
    from lagom_jax.costs import profile

    result: dict[str, Any] = {"environment": profile.environment_info(), "current": CURRENT, "rows": []}
    key = jax.random.key(5)

    def record(row: dict[str, Any]) -> None:
        result["rows"].append(row)
        out.write_text(json.dumps(result, indent=1) + "\n")
        tiles = " ".join(f"{k}={v}" for k, v in row["tiles"].items())
        what = (f"{row['median_us']:.0f} us, {row['tflops']:.0f} TFLOP/s" if "median_us" in row
                else row["error"][:120])
        progress(f"{row['kernel']} {row['shape']} {tiles}: {what}")

    def run(kernel: str, shape: str, fn: Any, sets: list[tuple[Any, ...]], flops: float, tiles: dict[str, int]) -> None:
        row = {"kernel": kernel, "shape": shape, "tiles": tiles,
               "current": tiles == CURRENT[kernel]}
        t0 = time.perf_counter()
        try:
            exe = jax.jit(fn).lower(*sets[0]).compile()
            row["compile_s"] = time.perf_counter() - t0
            row.update(timed(exe, sets, repeats=repeats, inner=inner))
            row["tflops"] = flops / (row["median_us"] * 1e6)
        except Exception as e:  # noqa: BLE001 - a refused configuration is a result
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        record(row)

    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

    for shape, g, m, k, n in FORWARD:
        key, *ks = jax.random.split(key, 5)
        sizes = jnp.asarray(cost_kernels.balanced_groups(m, g), jnp.int32)
        sets = [(_normal(ks[2 * i], (m, k), jnp.bfloat16), _normal(ks[2 * i + 1], (g, k, n), jnp.bfloat16), sizes)
                for i in range(2)]
        for tiles in configs(forward_tiles):
            if n % (tiles["block_n"] * tiles["grid_block_n"]) or k % tiles["block_k"]:
                continue
            fn = functools.partial(lambda x, w, s, **kw: ragged_dot_mgpu.ragged_dot(x, w, group_sizes=s, **kw), **tiles)
            run("forward", shape, fn, sets, 2.0 * m * k * n, tiles)
    for shape, g, m, k, n in WEIGHT_GRAD:
        key, *ks = jax.random.split(key, 5)
        sizes = jnp.asarray(cost_kernels.balanced_groups(m, g), jnp.int32)
        sets = [(_normal(ks[2 * i], (m, k), jnp.bfloat16), _normal(ks[2 * i + 1], (m, n), jnp.bfloat16), sizes)
                for i in range(2)]
        for tiles in configs(weight_tiles):
            if k % tiles["block_m"] or n % tiles["block_n"]:
                continue
            fn = functools.partial(
                lambda x, dy, s, **kw: transposed_ragged_dot_mgpu.transposed_ragged_dot(x, dy, group_sizes=s, **kw),
                **tiles)
            run("weight_grad", shape, fn, sets, 2.0 * m * k * n, tiles)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gpu", help="directory for grouped_tiles.json")
    ap.add_argument("--repeats", type=int, default=6, help="timed batches per configuration")
    ap.add_argument("--inner", type=int, default=3, help="calls per timed batch")
    ap.add_argument("--forward", action="append", default=[], metavar="NAME=V1,V2",
                    help=f"replace one tile parameter's values in the forward sweep (of {', '.join(FORWARD_TILES)})")
    ap.add_argument("--weight-grad", action="append", default=[], metavar="NAME=V1,V2",
                    help="replace one tile parameter's values in the weights' gradient sweep")
    args = ap.parse_args(argv)
    grids = []
    for given, grid in ((args.forward, FORWARD_TILES), (args.weight_grad, WEIGHT_TILES)):
        grid = dict(grid)
        for item in given:
            name, _, values = item.partition("=")
            try:
                parsed = tuple(int(v) for v in values.split(","))
            except ValueError:
                parsed = ()
            if name not in grid or not parsed or min(parsed) < 1:
                ap.error(f"{item!r}: expected NAME=V1,V2 with NAME one of {', '.join(grid)} and positive integers")
            grid[name] = parsed
        grids.append(grid)

    import jax

    if jax.default_backend() != "gpu":
        print(f"grouped_tiles: the default backend is {jax.default_backend()!r}, not a GPU; the Mosaic-GPU "
              "kernels run only on a Hopper GPU; nothing measured", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep(out / "grouped_tiles.json", repeats=args.repeats, inner=args.inner, forward_tiles=grids[0],
          weight_tiles=grids[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
