"""Kernel rates and step memory on one GPU: what the cost model prices from public rates.

Parts (``--parts``, comma-separated):

- ``attention``: causal attention of llama3-8b's heads (32 query heads, 8 kv heads, head dim
  128) at a fixed 16k tokens and sequence 2k-8k, forward and forward+backward, three ways:
  cuDNN (``jax.nn.dot_product_attention(implementation="cudnn")``), the project's Pallas/Triton
  flash kernel (``lagom_jax.models.attention``, ``impl="flash"``) and XLA's unfused attention.
  Rates are the causal FLOPs (half of ``4 * b * h * s^2 * d`` forward; the backward
  counted as 2.5x the forward, FlashAttention-2's count) over the measured time.
- ``fp8``: the GEMMs of a llama3-70b layer and of a llama3.1-405b layer at 8192 tokens (QKV, O,
  gate/up, down), float8_e4m3fn operands into bf16, beside the same GEMMs in bf16, and as
  MaxText's delayed scaling runs them from bf16 (``lagom_jax.models.fp8``).
- ``ragged``: ``jax.lax.ragged_dot`` with Mixtral 8x7b's expert up-projection (8 experts,
  4096 -> 14336) on 16384 routed rows, groups balanced and skewed, compiled as XLA does by
  default and with ``xla_gpu_experimental_use_ragged_dot_grouped_gemm``.
- ``grouped``: the grouped-GEMM kernels ``moe="grouped"`` compiles (``models.grouped_gemm``:
  JAX's Pallas Mosaic-GPU ``ragged_dot`` forward and input gradient, its transposed kernel for
  the weights' gradient) against XLA's ``jax.lax.ragged_dot`` on the same operands, forward and
  forward+backward, at Mixtral 8x7b's expert GEMMs (8 experts, 16384 routed rows, 4096 <-> 14336)
  and a 64-expert top-4 layer's (32768 routed rows, 2560 <-> 1280), groups balanced and 2x
  imbalanced (the busiest expert twice the mean, ``kernels.balanced_groups``). Rates count the
  useful FLOPs (2 x rows x K x N per GEMM); the relative error of each kernel's outputs against
  XLA's is recorded beside the time.
- ``dispatch``: the GShard layer's one-hot dispatch and combine einsums (MaxText's dense MoE
  path, ``lagom_jax.models.llama.MoE``) at Mixtral 8x7b's recipe shape: 4 sequences of 4096
  tokens per GPU, 8 experts, top-2, capacity factor 1.25 (1280 slots), hidden 4096.
- ``memory``: llama2-7b-shaped train steps (flash attention, 2 x 4096 tokens, 6 and 10 layers:
  about 36 and 57 GB by XLA's analysis, the second near the GPU's memory): the peak bytes in
  use (``Device.memory_stats``) against XLA's compiled memory analysis of the same step,
  compiled on the GPU and deviceless for an abstract GPU of the same kind.

Every time is the median of ``--repeats`` timed batches (each ``--inner`` calls, fresh
inputs per call set, after warm-up) with the interquartile range. Run on the GPU machine::

    python -m benchmarks.gpu.kernels --out DIR

``--allow-cpu --quick`` runs the flow on the CPU with tiny shapes, for tests; nothing it prints
is a GPU number.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

PARTS = ("attention", "fp8", "ragged", "grouped", "dispatch", "memory")


def timed(fn: Callable[..., Any], arg_sets: list[tuple[Any, ...]], *, repeats: int, inner: int) -> dict[str, float]:
    """Median and IQR (us per call) of ``fn`` over ``repeats`` batches of ``inner`` calls."""
    import jax

    for args in arg_sets[:2]:
        jax.block_until_ready(fn(*args))
    per = []
    for r in range(repeats):
        t0 = time.perf_counter()
        outs = [fn(*arg_sets[(r * inner + i) % len(arg_sets)]) for i in range(inner)]
        jax.block_until_ready(outs)
        per.append((time.perf_counter() - t0) * 1e6 / inner)
    q1, med, q3 = np.percentile(per, [25, 50, 75])
    return {"median_us": float(med), "iqr_us": float(q3 - q1)}


def measure(fn: Callable[..., Any], arg_sets: list[tuple[Any, ...]], flops: float, *, repeats: int, inner: int,
            label: str, progress: Any, **fields: Any) -> dict[str, Any]:
    """One table row: ``fields``, the time of ``fn`` and its TFLOP/s at ``flops`` per call, or
    the error that stopped it (one kernel failing must not lose the rest)."""
    try:
        t = timed(fn, arg_sets, repeats=repeats, inner=inner)
        row = {**fields, **t, "tflops": flops / (t["median_us"] * 1e6)}
        progress(f"{label}: {row['median_us']:.0f} us (IQR {row['iqr_us']:.0f}), {row['tflops']:.0f} TFLOP/s")
    except Exception as e:  # noqa: BLE001
        row = {**fields, "error": repr(e)[:300]}
        progress(f"{label}: {row['error']}")
    return row


def _normal(key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    import jax

    return jax.random.normal(key, shape, jax.numpy.float32).astype(dtype)


def with_backward(f: Callable[..., Any], arg_sets: list[tuple[Any, ...]], n_diff: int,
                  key: Any) -> tuple[Callable[..., Any], list[tuple[Any, ...]]]:
    """``f``'s forward and backward as a training step runs them: the pullback of its first
    ``n_diff`` arguments against a random cotangent (appended to each argument set). The
    gradient of a plain sum would not do: its all-ones cotangent lets XLA rewrite a dot's
    backward into a reduction, which times far faster than the GEMMs a step runs."""
    import jax

    out = jax.eval_shape(f, *arg_sets[0])
    cts = [_normal(k, out.shape, out.dtype) for k in jax.random.split(key, len(arg_sets))]

    def step(*args):  # noqa: ANN002, ANN202
        *xs, ct = args
        y, pull = jax.vjp(lambda *d: f(*d, *xs[n_diff:]), *xs[:n_diff])
        return y, pull(ct)

    return jax.jit(step), [(*a, c) for a, c in zip(arg_sets, cts)]


def compiled(fn: Callable[..., Any], arg_sets: list[tuple[Any, ...]], options: dict[str, Any] | None = None) -> Any:
    """``fn`` compiled once for the first argument set: timed and read from the same executable."""
    import jax

    return jax.jit(fn).lower(*arg_sets[0]).compile(options)


# --------------------------------------------------------------------------- attention


def attention(quick: bool, repeats: int, inner: int, progress: Any) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    from lagom_jax.models import attention as attn
    from lagom_jax.models.sharding import Layout

    heads, kv, d = (4, 2, 32) if quick else (32, 8, 128)
    tokens = 256 if quick else 16384
    seqs = (64, 128) if quick else (2048, 4096, 8192)
    dt = jnp.float32 if quick else jnp.bfloat16
    cpu = jax.default_backend() != "gpu"

    def impls() -> dict[str, Callable[..., Any]]:
        out = {
            "flash (Pallas/Triton)": lambda q, k, v: attn.attend(q, k, v, causal=True, impl="flash", layout=Layout()),
            "xla (unfused)": lambda q, k, v: attn.attend(q, k, v, causal=True, impl="xla", layout=Layout()),
        }
        if not cpu:
            out["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                         implementation="cudnn")
        return out

    rows = []
    for s in seqs:
        b = tokens // s
        keys = jax.random.split(jax.random.key(s), 9)
        sets = [(_normal(keys[3 * i], (b, s, heads, d), dt), _normal(keys[3 * i + 1], (b, s, kv, d), dt),
                 _normal(keys[3 * i + 2], (b, s, kv, d), dt)) for i in range(3)]
        fwd_flops = 4 * b * heads * s * s * d / 2
        for name, f in impls().items():
            both, both_sets = with_backward(f, sets, 3, keys[-1])
            for what, fn, args, flops in (("forward", jax.jit(f), sets, fwd_flops),
                                          ("forward+backward", both, both_sets, 3.5 * fwd_flops)):
                rows.append(measure(fn, args, flops, repeats=repeats, inner=inner, progress=progress,
                                    label=f"attention {name} s={s} {what}", impl=name, seq=s, batch=b, heads=heads,
                                    kv_heads=kv, head_dim=d, **{"pass": what}))
    return rows


# --------------------------------------------------------------------------------- fp8


def fp8(quick: bool, repeats: int, inner: int, progress: Any, gemms: str | None = None) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    m = 256 if quick else 8192
    # llama3-70b: d_model 8192, 64 heads + 2 x 8 kv heads of 128, d_ff 28672; llama3.1-405b:
    # d_model 16384, 128 heads + 2 x 8 kv heads, d_ff 53248.
    shapes = {"qkv": (m, 10240, 8192), "o": (m, 8192, 8192), "gate/up": (m, 28672, 8192),
              "down": (m, 8192, 28672), "405b qkv": (m, 18432, 16384), "405b o": (m, 16384, 16384),
              "405b gate/up": (m, 53248, 16384), "405b down": (m, 16384, 53248)}
    if gemms:
        unknown = sorted(set(gemms.split(",")) - set(shapes))
        if unknown:
            raise ValueError(f"unknown GEMM(s) {unknown}; known: {', '.join(shapes)}")
        shapes = {g: shapes[g] for g in gemms.split(",")}
    if quick:
        shapes = {k: (m, n // 64, kk // 64) for k, (_, n, kk) in shapes.items()}
    rows = []
    for name, (mm, n, k) in shapes.items():
        keys = jax.random.split(jax.random.key(n + k), 4)
        for dtype in ("bfloat16", "float8_e4m3fn"):
            dt = jnp.dtype(dtype)
            sets = [(_normal(keys[2 * i], (mm, k), dt), _normal(keys[2 * i + 1], (k, n), dt)) for i in range(2)]
            fn = compiled(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.bfloat16), sets)
            row = measure(fn, sets, 2 * mm * n * k, repeats=repeats, inner=inner, progress=progress,
                          label=f"gemm {name} {mm}x{n}x{k} {dtype}", gemm=name, m=mm, n=n, k=k, dtype=dtype)
            rows.append({**row, "cublaslt_fp8": "__cublas$lt$matmul$f8" in fn.as_text()})
        rows += _fp8_scaled(name, mm, n, k, keys, repeats, inner, progress)
    return rows


def _fp8_scaled(name: str, m: int, n: int, k: int, keys: Any, repeats: int, inner: int,
                progress: Any) -> list[dict[str, Any]]:
    """The same GEMM as MaxText's fp8 path runs it (``lagom_jax.models.fp8``: bf16 operands
    scaled, clipped and cast to e4m3 with delayed scaling, flax's ``fp8_scaled_dot_general``),
    forward and forward+backward: what the cost model's fp8 rate stands for."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax.linen import fp8_ops

    scale, hist = jnp.ones((1,), jnp.float32), jnp.zeros((1024,), jnp.float32)
    dot = functools.partial(fp8_ops.fp8_scaled_dot_general, lhs_scale=scale, rhs_scale=scale, grad_scale=scale,
                            lhs_amax_history=hist, rhs_amax_history=hist, grad_amax_history=hist,
                            quantize_compute_type=jnp.bfloat16)

    def f(a, b):  # noqa: ANN001, ANN202
        return jnp.einsum("mk,kn->mn", a, b, _dot_general=dot)

    sets = [(_normal(keys[2 * i], (m, k), jnp.bfloat16), _normal(keys[2 * i + 1], (k, n), jnp.bfloat16))
            for i in range(2)]
    both, both_sets = with_backward(f, sets, 2, keys[-1])
    rows = []
    for what, fn, args, flops in (("forward", f, sets, 2 * m * n * k),
                                  ("forward+backward", both, both_sets, 6 * m * n * k)):
        exe = compiled(fn, args)
        text = exe.as_text()
        rows.append({**measure(exe, args, flops, repeats=repeats, inner=inner, progress=progress,
                               label=f"gemm {name} {m}x{n}x{k} fp8 delayed scaling {what}", gemm=name, m=m, n=n,
                               k=k, dtype="fp8 delayed scaling (bf16 in)", **{"pass": what}),
                     "cublaslt_fp8": text.count("__cublas$lt$matmul$f8"), "f8_operands": "f8e4m3fn[" in text})
    return rows


# ------------------------------------------------------------------------------ ragged


def ragged(quick: bool, repeats: int, inner: int, progress: Any) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    g, k, n, m = (4, 64, 128, 512) if quick else (8, 4096, 14336, 16384)
    dt = jnp.float32 if quick else jnp.bfloat16
    splits = {"balanced": [1 / g] * g,
              "skewed": [0.4, 0.2, 0.12, 0.1, 0.08, 0.05, 0.03, 0.02][:g]}
    rows = []
    keys = jax.random.split(jax.random.key(7), 4)
    sets_base = [(_normal(keys[2 * i], (m, k), dt), _normal(keys[2 * i + 1], (g, k, n), dt)) for i in range(2)]
    for name, frac in splits.items():
        sizes = np.floor(np.array(frac) / sum(frac) * m).astype(np.int32)
        sizes[0] += m - sizes.sum()
        gs = jnp.asarray(sizes)
        sets = [(a, b, gs) for a, b in sets_base]
        fwd = jax.lax.ragged_dot
        both, both_sets = with_backward(fwd, sets, 2, keys[-1])
        # Each pass as XLA compiles it by default and under its grouped-GEMM flag (a deviceless
        # compile shows no change: only a GPU can say whether it runs a grouped GEMM).
        for flag in (None, GROUPED_GEMM_FLAG):
            for what, fn, args, mult in (("forward", fwd, sets, 1), ("forward+backward", both, both_sets, 3)):
                label = f"ragged_dot {name} {what}" + (", grouped-GEMM flag" if flag else "")
                fields = dict(groups=name, group_sizes=sizes.tolist(), m=m, k=k, n=n, flag=flag, **{"pass": what})
                try:
                    exe = compiled(fn, args, {flag: True} if flag else None)
                except Exception as e:  # noqa: BLE001 - an XLA without the flag is a result too
                    rows.append({**fields, "error": repr(e)[:300]})
                    progress(f"{label}: {rows[-1]['error']}")
                    continue
                row = measure(exe, args, mult * 2 * m * k * n, repeats=repeats, inner=inner, progress=progress,
                              label=label, **fields)
                rows.append({**row, **_compiled_form(exe.as_text(), m, g * k)})
    return rows


GROUPED_GEMM_FLAG = "xla_gpu_experimental_use_ragged_dot_grouped_gemm"


def _compiled_form(text: str, m: int, masked_k: int) -> dict[str, Any]:
    """How XLA compiled a ragged dot: whether the rows were masked into one dense dot over every
    group (an ``[m, groups * k]`` operand), and the custom calls the module holds."""
    return {"dense_dot": f"[{m},{masked_k}]" in text,
            "custom_calls": sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))}


# ----------------------------------------------------------------------------- grouped

# (name, groups, routed rows, d_model, expert FFN) of the grouped part; each runs its up
# (d_model -> FFN) and down (FFN -> d_model) projection.
GROUPED_SHAPES = (("mixtral-8x7b", 8, 16384, 4096, 14336), ("64 experts top-4", 64, 32768, 2560, 1280))
GROUPED_QUICK = (("tiny", 4, 512, 64, 128),)


def _rel_error(got: Any, want: Any) -> float:
    import jax.numpy as jnp

    got, want = jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)
    return float(jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30))


def grouped(quick: bool, repeats: int, inner: int, progress: Any) -> list[dict[str, Any]]:
    """The grouped-GEMM kernels of ``moe="grouped"`` against XLA's ``ragged_dot``, timed."""
    import jax
    import jax.numpy as jnp

    from lagom_jax.costs import kernels as cost_kernels
    from lagom_jax.models import grouped_gemm

    dt = jnp.float32 if quick else jnp.bfloat16
    rows_out = []
    key = jax.random.key(23)
    for shape, g, m, d, f in GROUPED_QUICK if quick else GROUPED_SHAPES:
        for proj, k, n in (("up", d, f), ("down", f, d)):
            key, *ks = jax.random.split(key, 5)
            base = [(_normal(ks[2 * i], (m, k), dt), _normal(ks[2 * i + 1], (g, k, n), dt)) for i in range(2)]
            first = [(a, b, jnp.asarray(cost_kernels.balanced_groups(m, g), jnp.int32)) for a, b in base]
            # One executable per implementation and pass: the group sizes are an operand.
            impls = {}
            for impl, f_ in (("grouped kernel", grouped_gemm.grouped_matmul), ("XLA ragged_dot", jax.lax.ragged_dot)):
                both, both_first = with_backward(jax.jit(f_), first, 2, ks[-1])
                cts = [c for *_, c in both_first]
                try:  # the forward compiled once: timed, and read for the calls it makes
                    fwd = compiled(f_, first)
                    targets = _compiled_form(fwd.as_text(), m, g * k)["custom_calls"]
                except Exception as e:  # noqa: BLE001 - the timing below says what failed
                    fwd, targets = jax.jit(f_), [f"compile failed: {e!r}"[:200]]
                impls[impl] = (fwd, both, cts, targets)
            for load in (1.0, 2.0):
                sizes = np.array(cost_kernels.balanced_groups(m, g, load), np.int32)
                sets = [(a, b, jnp.asarray(sizes)) for a, b in base]
                outs: dict[Any, Any] = {}
                for impl, (fwd, both, cts, targets) in impls.items():
                    both_sets = [(*a, c) for a, c in zip(sets, cts)]
                    for what, fn, args, mult in (("forward", fwd, sets, 1), ("forward+backward", both, both_sets, 3)):
                        label = f"{shape} {proj} {impl} load {load:g}x {what}"
                        fields = dict(shape=shape, proj=proj, impl=impl, groups=g, m=m, k=k, n=n, load=load,
                                      busiest=int(sizes.max()), custom_calls=targets, **{"pass": what})
                        row = measure(fn, args, mult * 2 * m * k * n, repeats=repeats, inner=inner,
                                      progress=progress, label=label, **fields)
                        if "error" not in row:
                            try:
                                outs[(impl, what)] = jax.device_get(fn(*args[0]))
                            except Exception as e:  # noqa: BLE001 - the time stands without the check
                                row["check_error"] = repr(e)[:300]
                        rows_out.append(row)
                for row in rows_out[-4:]:
                    got, want = outs.get((row["impl"], row["pass"])), outs.get(("XLA ragged_dot", row["pass"]))
                    if row["impl"] == "grouped kernel" and got is not None and want is not None:
                        row["rel_error"] = max(_rel_error(a, b) for a, b in
                                               zip(jax.tree.leaves(got), jax.tree.leaves(want)))
                        progress(f"  {shape} {proj} load {load:g}x {row['pass']}: relative error of the "
                                 f"grouped kernel against XLA {row['rel_error']:.2e}")
    return rows_out


# ---------------------------------------------------------------------------- dispatch


def dispatch(quick: bool, repeats: int, inner: int, progress: Any) -> list[dict[str, Any]]:
    """GShard's dispatch ("btd,btec->ebcd") and combine ("ebcd,btec->btd") einsums, forward
    and forward+backward, at Mixtral 8x7b's recipe shape on one GPU."""
    import jax
    import jax.numpy as jnp

    b, s, d, e, c = (2, 64, 32, 4, 40) if quick else (4, 4096, 4096, 8, 1280)
    dt = jnp.float32 if quick else jnp.bfloat16
    keys = jax.random.split(jax.random.key(11), 6)
    x_sets = [_normal(keys[i], (b, s, d), dt) for i in range(2)]
    masks = [(jax.random.uniform(keys[2 + i], (b, s, e, c)) < 1.0 / c).astype(dt) for i in range(2)]
    out_sets = [_normal(keys[4 + i], (e, b, c, d), dt) for i in range(2)]
    flops = 2 * b * s * e * c * d
    rows = []
    for name, eqn, sets in (("dispatch", "btd,btec->ebcd", list(zip(x_sets, masks))),
                            ("combine", "ebcd,btec->btd", list(zip(out_sets, masks)))):
        fwd = jax.jit(lambda a, m, eqn=eqn: jnp.einsum(eqn, a, m))
        both, both_sets = with_backward(fwd, sets, 2, keys[-1])
        for what, fn, args, mult in (("forward", fwd, sets, 1), ("forward+backward", both, both_sets, 3)):
            rows.append(measure(fn, args, mult * flops, repeats=repeats, inner=inner, progress=progress,
                                label=f"{name} {eqn} {what}", einsum=name, equation=eqn, batch=b, seq=s,
                                experts=e, capacity=c, d_model=d, **{"pass": what}))
    return rows


# ------------------------------------------------------------------------------ memory


def memory(quick: bool, layers: int, batch: int, seq: int, progress: Any) -> dict[str, Any]:
    """Peak bytes of a llama2-7b-shaped step, measured and as XLA's memory analysis says.

    The analysis is recorded before the step runs, so that a step that does not fit (the
    allocator may fail on fragmentation where the analysis fits) still leaves it."""
    import jax

    from lagom_jax.cluster import hardware
    from lagom_jax.costs import profile
    from lagom_jax.program import gpu_compile
    from lagom_jax.models import build

    config = ("layers=2,d_model=64,heads=4,kv_heads=4,d_ff=128,vocab=256,max_len=64" if quick
              else f"layers={layers},d_model=4096,heads=32,kv_heads=32,d_ff=11008,vocab=32000,max_len=4096")
    seq = 64 if quick else seq
    dtype = "float32" if quick else "bfloat16"
    attention = "xla" if quick else "flash"  # XLA's attention would spend the memory on scores
    device = jax.devices()[0]
    out: dict[str, Any] = {"config": config, "batch": batch, "seq": seq, "dtype": dtype, "attention": attention,
                           "device_kind": device.device_kind}

    def analysis(compiled: Any) -> dict[str, int]:
        ma = compiled.memory_analysis()
        fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                  "temp_size_in_bytes", "generated_code_size_in_bytes")
        return {f: int(getattr(ma, f)) for f in fields}

    if jax.default_backend() == "gpu":
        try:
            hw = hardware.get(profile.base_preset_for(device.device_kind))
            gpu_compile.prepare()
            built_d = build("llama", config, "dp", {"data": 1}, batch_size=batch, seq_len=seq, dtype=dtype,
                            devices=gpu_compile.devices(hw, 1), attention=attention)
            out["deviceless_target"] = hw.name
            out["compiled_deviceless"] = analysis(built_d.lower().compile())
        except Exception as e:  # noqa: BLE001
            out["deviceless_error"] = repr(e)[:300]
        progress(f"memory {layers} layers deviceless: {out.get('compiled_deviceless') or out.get('deviceless_error')}")
    built = build("llama", config, "dp", {"data": 1}, batch_size=batch, seq_len=seq, dtype=dtype, devices=[device],
                  attention=attention)
    t0 = time.perf_counter()
    compiled = built.lower().compile()
    out["compile_s"] = time.perf_counter() - t0
    out["compiled_here"] = analysis(compiled)
    progress(f"memory {layers} layers analysis on the GPU: {out['compiled_here']}")
    try:
        state, _ = built.init(jax.random.key(0))
        b1 = built.init(jax.random.key(1))[1]
        jax.block_until_ready((state, b1))
        out["in_use_before_bytes"] = int((device.memory_stats() or {}).get("bytes_in_use", 0))
        state, metrics = compiled(state, b1)
        jax.block_until_ready((state, metrics))
        out["loss"] = float(metrics["loss"])
        del state, metrics, b1
    except Exception as e:  # noqa: BLE001 - an out-of-memory is a result too
        out["run_error"] = repr(e)[:400]
    stats = device.memory_stats() or {}
    out["peak_bytes_in_use"] = int(stats.get("peak_bytes_in_use", 0))
    out["bytes_limit"] = int(stats.get("bytes_limit", 0))
    progress(f"memory {layers} layers: peak {out['peak_bytes_in_use'] / 2**30:.2f} GiB of "
             f"{out['bytes_limit'] / 2**30:.2f}; {out.get('run_error', 'ran')}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gpu", help="directory for gpu_kernels.json")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {', '.join(PARTS)}")
    ap.add_argument("--repeats", type=int, default=15, help="timed batches per kernel")
    ap.add_argument("--inner", type=int, default=5, help="calls per timed batch")
    ap.add_argument("--memory-layers", default="6,10", help="layers of the memory steps (comma-separated; "
                    "each runs in this process, the smaller first)")
    ap.add_argument("--memory-batch", type=int, default=2)
    ap.add_argument("--memory-seq", type=int, default=4096)
    ap.add_argument("--gemms", default=None, help="the fp8 part's GEMMs, comma-separated (default: all; e.g. "
                    "'gate/up,405b down')")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (tests)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU (tests; not GPU numbers)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")

    import jax

    if jax.default_backend() != "gpu" and not args.allow_cpu:
        print(f"gpu_kernels: the default backend is {jax.default_backend()!r}, not a GPU; nothing measured "
              "(--allow-cpu runs the flow on the CPU for tests)", file=sys.stderr)
        return 2
    from lagom_jax.costs import profile

    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ("gpu_kernels.json" if jax.default_backend() == "gpu" else "cpu_kernels.json")
    result: dict[str, Any] = {"environment": profile.environment_info()}
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part == "memory":
                result[part] = [memory(args.quick, int(n), args.memory_batch, args.memory_seq, print)
                                for n in args.memory_layers.split(",")]
            else:
                extra = {"gemms": args.gemms} if part == "fp8" else {}
                result[part] = globals()[part](args.quick, args.repeats, args.inner, print, **extra)
        except Exception:  # noqa: BLE001 - record and go on to the next part
            result[part] = {"error": traceback.format_exc()[-2000:]}
            print(f"{part}: FAILED\n{result[part]['error']}")
        print(f"{part}: {time.perf_counter() - t0:.0f} s", flush=True)
        path.write_text(json.dumps(result, indent=1) + "\n")  # after every part: nothing lost on a timeout
    return 0


if __name__ == "__main__":
    sys.exit(main())
