"""Measure one GPU and fit the cost model's hardware numbers to what was measured.

Three measurements, each a plain JAX program so that the same code runs on any backend
(on a GPU for real numbers; on the CPU with tiny sizes, for tests):

* **GEMM throughput** for (m, n, k, dtype) shapes: ``measure_gemm``.
* **HBM throughput** of an elementwise fusion (``y = 2x + 1``: one read, one write):
  ``measure_hbm``.
* **Contention sweep**: a compute-bound GEMM timed alone and while a bandwidth-bound
  copy kernel occupying ``k`` CTAs (k = 1, 2, 4 ... 64, as NCCL runs one CTA per channel)
  runs beside it on a second stream, plus the bandwidth that copy kernel reaches:
  ``contention_sweep`` with a ``ContentionProbe``.
* **Per-op times** of any jitted step from a profiler trace (``per_op_times_us``) and
  their error against the cost model's predictions (``accuracy``, MAPE).

How the sweep gets "k CTAs" from JAX, which has no direct CTA control: the copy kernel
is a Pallas kernel (``jax.experimental.pallas``) with ``grid=(k,)``. On the GPU Pallas
lowers through Triton, where one program instance is one CTA, so the kernel occupies
exactly ``k`` CTAs; each program walks its own stripe of the buffer in blocks, so the
work per CTA grows as ``k`` shrinks and the kernel stays bandwidth-bound. It runs on a
second stream through ``jax.experimental.compute_on.compute_on("gpu_stream:1")`` (XLA's
``_xla_stream_annotation``, honoured by default: ``xla_gpu_experimental_stream_annotation``
is true in openxla/xla ``xla/debug_options_flags.cc``), in the same jitted program as the
GEMM. Kernel durations come from the JAX profiler's device plane (CUPTI timestamps, i.e.
device time, not host time). If Pallas or ``compute_on`` does not import on the installed
jaxlib, ``pallas_copy_kernel`` raises ``ProfileError`` saying so; the GEMM and HBM
measurements do not need either.

Fitting (pure numpy, independent of ``cost``). The model fitted is the one
``cost.compute_time_us`` / ``cost.comm_resource_use`` use, restated here:

* compute alone: ``t = t0 + flops / F`` and ``t = t0 + bytes / B``: a least-squares line
  over the measured sizes gives the achieved rate ``F`` (TFLOP/s) and bandwidth ``B``
  (GB/s) as the inverse slope, and a fixed cost ``t0`` as the intercept;
* a collective with ``nc`` channels takes ``a * nc`` SMs from overlapping compute, and the
  HBM traffic beside a compute-bound GEMM (a share ``p`` of its bandwidth) slows it by
  ``(1 - p) ** -beta`` (``CostConfig.hbm_pressure_exponent``, passed in), so the GEMM slows
  by ``s(k) = S / (S - a k) * (1 - p) ** -beta`` (``S`` = SM count): with the pressure
  divided out, ``1 - 1/s' = (a / S) k`` is a line through the origin, fitted for ``a``
  (``HardwareProfile.sm_share_per_channel``);
* the copy kernel's bandwidth grows by ``b`` GB/s per CTA until HBM saturates:
  ``bw(k) = min(b k, B_sat)``, fitted by trying every split point of the sorted ``k``.

The result is a measured ``HardwareProfile`` (``dataclasses.replace`` of a preset with
the measured SM count, TFLOP/s and HBM GB/s) written as JSON next to the raw data.
The fitted ``a`` replaces the profile's ``sm_share_per_channel``; ``b`` and the
saturation bandwidth have no profile field and stay in the raw JSON.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import math
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lagom_jax.cluster import hardware
from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import cost

#: CTA counts of the contention sweep: NCCL's channel range (1..64 CTAs per collective).
DEFAULT_KS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


class ProfileError(ValueError):
    """A measurement could not be taken or a fit could not be made; says which and why."""


# --- Timing -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Timing:
    """Repeated measurements of one thing (us): median and interquartile range."""
    samples_us: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples_us:
            raise ProfileError("a Timing needs at least one sample")
        bad = [s for s in self.samples_us if not (math.isfinite(s) and s > 0)]
        if bad:
            raise ProfileError(f"timing samples must be finite and positive, got {bad[:3]}")

    @property
    def median_us(self) -> float:
        return float(np.median(self.samples_us))

    @property
    def iqr_us(self) -> float:
        q1, q3 = np.percentile(self.samples_us, [25, 75])
        return float(q3 - q1)

    def to_dict(self) -> dict[str, Any]:
        return {"median_us": self.median_us, "iqr_us": self.iqr_us, "samples_us": list(self.samples_us)}


def time_fn(fn: Callable[..., Any], input_sets: Sequence[tuple[Any, ...]], *, warmup: int = 3,
            repeats: int = 20, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time ``fn(*inputs)`` end to end: warm up, then ``repeats`` synchronised runs.

    Inputs rotate over ``input_sets`` so that repeated runs do not measure one buffer
    held in cache. Device work is asynchronous, so the clock is read only
    after the inputs are ready and after the outputs are (``block_until_ready``).
    """
    import jax

    if warmup < 0 or repeats < 1:
        raise ProfileError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    if not input_sets:
        raise ProfileError("time_fn needs at least one input set")
    jax.block_until_ready(input_sets)
    for i in range(warmup):
        jax.block_until_ready(fn(*input_sets[i % len(input_sets)]))
    samples = []
    for i in range(repeats):
        args = input_sets[i % len(input_sets)]
        t0 = clock()
        jax.block_until_ready(fn(*args))
        samples.append((clock() - t0) * 1e6)
    return Timing(tuple(samples))


def random_inputs(shapes: Sequence[tuple[int, ...]], dtype: Any, *, sets: int, seed: int) -> list[tuple[Any, ...]]:
    """``sets`` fresh input tuples of normal values shifted off zero (never zeros:
    they hide bad indexing and can run faster than real data)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(seed)
    out = []
    for _ in range(sets):
        arrs = []
        for shape in shapes:
            key, sub = jax.random.split(key)
            arrs.append((jax.random.normal(sub, shape, jnp.float32) + 0.5).astype(dtype))
        out.append(tuple(arrs))
    return out


# --- Compute measurements -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GemmPoint:
    m: int
    n: int
    k: int
    dtype: str
    timing: Timing

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        return self.flops / (self.timing.median_us * 1e6)

    def to_dict(self) -> dict[str, Any]:
        return {"m": self.m, "n": self.n, "k": self.k, "dtype": self.dtype, "flops": self.flops,
                "tflops": self.tflops, **self.timing.to_dict()}


@dataclasses.dataclass(frozen=True)
class HbmPoint:
    elements: int
    dtype: str
    bytes_moved: int  # one read and one write of every element
    timing: Timing

    @property
    def gbps(self) -> float:
        return self.bytes_moved / (self.timing.median_us * 1e3)

    def to_dict(self) -> dict[str, Any]:
        return {"elements": self.elements, "dtype": self.dtype, "bytes": self.bytes_moved,
                "gbps": self.gbps, **self.timing.to_dict()}


def measure_gemm(m: int, n: int, k: int, dtype: str = "bfloat16", *, warmup: int = 3,
                 repeats: int = 20, sets: int = 3, seed: int = 0) -> GemmPoint:
    """Time one ``(m, k) @ (k, n)`` matmul in ``dtype`` on the default backend."""
    import jax
    import jax.numpy as jnp

    if min(m, n, k) < 1:
        raise ProfileError(f"GEMM shape must be positive, got m={m}, n={n}, k={k}")
    inputs = random_inputs([(m, k), (k, n)], jnp.dtype(dtype), sets=sets, seed=seed)
    fn = jax.jit(jnp.matmul)
    return GemmPoint(m, n, k, str(jnp.dtype(dtype)), time_fn(fn, inputs, warmup=warmup, repeats=repeats))


def measure_hbm(elements: int, dtype: str = "float32", *, warmup: int = 3, repeats: int = 20,
                sets: int = 3, seed: int = 1) -> HbmPoint:
    """Time an elementwise fusion ``2x + 1`` over ``elements`` values (bytes: read + write)."""
    import jax
    import jax.numpy as jnp

    if elements < 1:
        raise ProfileError(f"HBM measurement needs elements >= 1, got {elements}")
    dt = jnp.dtype(dtype)
    inputs = random_inputs([(elements,)], dt, sets=sets, seed=seed)
    fn = jax.jit(lambda x: x * 2 + 1)
    return HbmPoint(elements, str(dt), 2 * elements * dt.itemsize,
                    time_fn(fn, inputs, warmup=warmup, repeats=repeats))


# --- Contention sweep ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ContentionPoint:
    """One ``k`` of the sweep: the GEMM alone and beside a ``k``-CTA copy kernel, and the
    copy kernel's bandwidth (bytes read + written over its duration)."""
    ctas: int
    gemm_alone: Timing
    gemm_contended: Timing
    copy_bytes: int
    copy: Timing

    @property
    def slowdown(self) -> float:
        return self.gemm_contended.median_us / self.gemm_alone.median_us

    @property
    def copy_gbps(self) -> float:
        return self.copy_bytes / (self.copy.median_us * 1e3)

    def to_dict(self) -> dict[str, Any]:
        return {"ctas": self.ctas, "slowdown": self.slowdown, "copy_gbps": self.copy_gbps,
                "copy_bytes": self.copy_bytes, "gemm_alone": self.gemm_alone.to_dict(),
                "gemm_contended": self.gemm_contended.to_dict(), "copy": self.copy.to_dict()}


ContentionProbe = Callable[[int], ContentionPoint]
"""Measures one point of the sweep for ``k`` CTAs. ``GpuContentionProbe`` is the real one;
tests inject a synthetic one."""


def contention_sweep(probe: ContentionProbe, ks: Sequence[int] = DEFAULT_KS, *,
                     progress: Callable[[str], None] = lambda s: None) -> tuple[ContentionPoint, ...]:
    """Run ``probe`` for every CTA count in ``ks`` (distinct, 1..64, increasing)."""
    ks = tuple(ks)
    if not ks or any(not isinstance(k, int) or not 1 <= k <= 64 for k in ks) or list(ks) != sorted(set(ks)):
        raise ProfileError(f"CTA counts must be distinct increasing integers in 1..64, got {ks}")
    points = []
    for k in ks:
        p = probe(k)
        if p.ctas != k:
            raise ProfileError(f"contention probe asked for {k} CTAs returned a point for {p.ctas}")
        progress(f"  k={k:>2} CTAs: GEMM x{p.slowdown:.3f}, copy {p.copy_gbps:.1f} GB/s")
        points.append(p)
    return tuple(points)


def pallas_copy_kernel(ctas: int, elements: int, dtype: Any, *, block: int = 4096,
                       interpret: bool = False) -> Callable[[Any], Any]:
    """A bandwidth-bound copy of a 1-D array by exactly ``ctas`` Pallas program instances.

    Each instance copies its own contiguous stripe block by block. ``elements`` must be a
    multiple of ``ctas * block`` (``block`` a power of two, as Triton requires).
    ``interpret=True`` runs it through Pallas' interpreter (for CPU tests).
    """
    try:
        import jax
        from jax.experimental import pallas as pl
    except ImportError as e:
        raise ProfileError(f"jax.experimental.pallas does not import on this jaxlib ({e}); "
                           "the contention sweep needs it (install a jaxlib with Pallas)") from e
    if ctas < 1 or block < 1 or block & (block - 1):
        raise ProfileError(f"need ctas >= 1 and a power-of-two block, got ctas={ctas}, block={block}")
    if elements % (ctas * block):
        raise ProfileError(f"elements {elements} must be a multiple of ctas*block = {ctas * block}")
    stripe = elements // ctas
    steps = stripe // block

    def kernel(x_ref, o_ref):  # noqa: ANN001 - Pallas refs
        base = pl.program_id(0) * stripe

        def body(i, carry):  # noqa: ANN001
            s = pl.ds(pl.multiple_of(base + i * block, block), block)
            o_ref[s] = x_ref[s]
            return carry

        jax.lax.fori_loop(0, steps, body, 0)

    return pl.pallas_call(kernel, grid=(ctas,), out_shape=jax.ShapeDtypeStruct((elements,), dtype),
                          interpret=interpret, name="lagom_copy")


# Lines that summarise other lines (added by the profiler's derived timelines); counting
# them would count every kernel twice.
_DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Source code", "Framework")


def _kernel_lines(plane: Any) -> list[Any]:
    return [ln for ln in plane.lines if not ln.name.startswith(_DERIVED_LINES)]


def device_kernel_times_us(xplane_path: str | pathlib.Path, marker: str = "lagom_copy") -> dict[str, list[float]]:
    """Kernel durations (us) on the GPU device planes of a profiler trace, split into
    those whose name contains ``marker`` (``"marked"``) and all others (``"other"``)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(xplane_path))
    out: dict[str, list[float]] = {"marked": [], "other": []}
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in _kernel_lines(plane):
            for ev in line.events:
                if any(w in ev.name.lower() for w in ("memcpy", "memset")) or "memcpy" in line.name.lower():
                    continue
                out["marked" if marker in ev.name else "other"].append(ev.duration_ns / 1e3)
    return out


def gemm_beside_copy(copy: Callable[[Any], Any], stream: int = 1) -> Callable[..., tuple[Any, Any]]:
    """``(a, b, x) -> (a @ b, copy(x))`` with the copy placed on GPU stream ``stream``
    (``_xla_stream_annotation``) and the matmul on the main compute stream."""
    import jax.numpy as jnp

    try:
        from jax.experimental.compute_on import compute_on
    except ImportError as e:
        raise ProfileError(f"jax.experimental.compute_on does not import ({e}); it places the "
                           "copy kernel on a second stream (needs a newer jax)") from e

    on_stream = _on_stream(copy, compute_on, f"gpu_stream:{stream}")

    def both(a, b, x):  # noqa: ANN001, ANN202 - arrays
        return jnp.matmul(a, b), on_stream(x)

    return both


# A grid-stride copy in 16-byte words, ``reps`` passes: ``k`` CTAs of it stand in for a
# collective on ``k`` NCCL channels (one CTA each, NCCL_NTHREADS = 512 threads by default).
_COPY_KERNEL = r"""
extern "C" __global__ void lagom_copy(const float4* __restrict__ src, float4* __restrict__ dst,
                                      long long n, int reps) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (int r = 0; r < reps; ++r)
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
      dst[i] = src[i];
}
"""


@dataclasses.dataclass(frozen=True)
class CudaContentionProbe:
    """A cuBLAS GEMM on one CUDA stream while a ``k``-CTA copy kernel runs on another.

    Through CuPy, so that the launch order is ours: the copy is launched first (its ``k``
    CTAs take their SMs, as a NCCL kernel launched before the compute does), then the
    GEMM is repeated on the second stream. CUDA events time every GEMM and the copy; a
    point counts only if every contended GEMM ended before the copy did, i.e. it ran
    under contention from start to end. float16 operands (same tensor-core rate as bf16
    on A100/H100; CuPy has no bf16 GEMM).
    """
    size: int = 8192
    repeats: int = 10
    threads: int = 512
    copy_bytes: int = 1 << 30

    def __call__(self, k: int) -> ContentionPoint:
        try:
            import cupy as cp
        except ImportError as e:
            raise ProfileError(f"the CUDA contention probe needs CuPy ({e})") from e
        rng = cp.random.default_rng(k)
        a = rng.standard_normal((self.size, self.size), dtype=cp.float32).astype(cp.float16)
        b = rng.standard_normal((self.size, self.size), dtype=cp.float32).astype(cp.float16)
        c = cp.empty_like(a)
        words = self.copy_bytes // 16
        src = rng.random(words * 4, dtype=cp.float32)
        dst = cp.empty_like(src)
        kernel = cp.RawKernel(_COPY_KERNEL, "lagom_copy")
        gemm_stream, copy_stream = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

        def timed_gemms(n: int, after: Any = None) -> list[tuple[Any, Any]]:
            if after is not None:
                gemm_stream.wait_event(after)
            marks = []
            with gemm_stream:
                for _ in range(n):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(gemm_stream)
                    cp.matmul(a, b, out=c)
                    e1.record(gemm_stream)
                    marks.append((e0, e1))
            return marks

        def copy(reps: int) -> tuple[Any, Any]:
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(copy_stream)
            kernel((k,), (self.threads,), (src, dst, cp.int64(words), cp.int32(reps)), stream=copy_stream)
            e1.record(copy_stream)
            return e0, e1

        ms = cp.cuda.get_elapsed_time
        timed_gemms(3)
        gemm_stream.synchronize()
        alone = timed_gemms(self.repeats)
        gemm_stream.synchronize()
        alone_us = [ms(e0, e1) * 1e3 for e0, e1 in alone]
        one = copy(1)
        copy_stream.synchronize()
        one_us = ms(*one) * 1e3
        # The copy must outlast every contended GEMM; contention can slow them ~3x, and
        # each too-short try doubles the copy.
        reps = max(1, math.ceil(4.0 * (self.repeats + 1) * float(np.median(alone_us)) / one_us))
        for _ in range(3):
            start, end = copy(reps)
            contended = timed_gemms(self.repeats, after=start)
            copy_stream.synchronize()
            gemm_stream.synchronize()
            copy_us = ms(start, end) * 1e3
            last_end = max(ms(start, e1) * 1e3 for _, e1 in contended)
            if last_end <= copy_us:
                break
            reps *= 2
        else:
            raise ProfileError(f"k={k}: the copy ({copy_us:.0f} us) ended before the last GEMM "
                               f"({last_end:.0f} us after the copy started), three times")
        return ContentionPoint(k, Timing(tuple(alone_us)),
                               Timing(tuple(ms(e0, e1) * 1e3 for e0, e1 in contended)),
                               2 * words * 16 * reps, Timing((copy_us,)))


def _on_stream(fn: Callable[[Any], Any], compute_on: Any, compute_type: str) -> Callable[[Any], Any]:
    """``fn`` placed on ``compute_type`` by whichever ``compute_on`` this jax has.

    Up to jax 0.10 ``compute_on(compute_type)`` is a context manager; from 0.11 it
    transforms a function and needs the memory space of its outputs.
    """
    import inspect

    import jax

    if "out_memory_spaces" in inspect.signature(compute_on).parameters:
        return compute_on(fn, compute_type=compute_type, out_memory_spaces=jax.memory.Space.Device)

    def placed(x):  # noqa: ANN001, ANN202 - arrays
        with compute_on(compute_type):
            return fn(x)

    return placed


@dataclasses.dataclass(frozen=True)
class GpuContentionProbe:
    """The real probe: a ``size``-cubed GEMM on the main stream and the Pallas copy kernel
    with ``k`` CTAs on ``gpu_stream:1`` in one jitted program; durations from the profiler.

    The copy buffer is sized so that the copy outlasts the GEMM (about ``copy_over_gemm``
    times its solo time at the bandwidth measured for ``k`` CTAs alone), so that the GEMM
    runs under contention from its first to its last CTA.
    """
    size: int = 8192
    dtype: str = "bfloat16"
    repeats: int = 10
    copy_over_gemm: float = 3.0
    block: int = 4096

    def __call__(self, k: int) -> ContentionPoint:
        import jax
        import jax.numpy as jnp

        if jax.default_backend() != "gpu":
            raise ProfileError(f"the contention probe needs a GPU; the default backend is {jax.default_backend()!r}")
        dt = jnp.dtype(self.dtype)
        ab = random_inputs([(self.size, self.size)] * 2, dt, sets=1, seed=k)[0]
        gemm = jax.jit(jnp.matmul)
        gemm_alone = self._kernel_times(gemm, ab, "other")
        # Size the copy from a solo run at a small size for this k.
        unit = k * self.block
        probe_elems = unit * max(1, (64 << 20) // (unit * 4))
        src = random_inputs([(probe_elems,)], jnp.float32, sets=1, seed=100 + k)[0]
        solo = self._kernel_times(jax.jit(pallas_copy_kernel(k, probe_elems, jnp.float32, block=self.block)),
                                  src, "marked")
        gbps = 2 * probe_elems * 4 / (solo.median_us * 1e3)
        want_bytes = gbps * 1e3 * gemm_alone.median_us * self.copy_over_gemm / 2
        elems = unit * max(1, math.ceil(want_bytes / 4 / unit))
        copy = pallas_copy_kernel(k, elems, jnp.float32, block=self.block)

        src = random_inputs([(elems,)], jnp.float32, sets=1, seed=200 + k)[0]
        both_j = jax.jit(gemm_beside_copy(copy))
        contended = self._kernel_times(both_j, (*ab, *src), "other")
        copy_t = self._kernel_times(both_j, (*ab, *src), "marked")
        if copy_t.median_us < contended.median_us:
            raise ProfileError(f"k={k}: the copy ({copy_t.median_us:.0f} us) ended before the GEMM "
                               f"({contended.median_us:.0f} us), so part of the GEMM ran alone; "
                               f"raise copy_over_gemm (now {self.copy_over_gemm})")
        return ContentionPoint(k, gemm_alone, contended, 2 * elems * 4, copy_t)

    def _kernel_times(self, fn: Callable[..., Any], args: tuple[Any, ...], which: str) -> Timing:
        """Device time per run of the kernels selected by ``which`` (summed within a run)."""
        import jax

        for _ in range(3):
            jax.block_until_ready(fn(*args))
        samples = []
        for _ in range(self.repeats):
            d = tempfile.mkdtemp(prefix="lagom_profile_")
            try:
                with jax.profiler.trace(d):
                    jax.block_until_ready(fn(*args))
                files = sorted(pathlib.Path(d).rglob("*.xplane.pb"))
                if not files:
                    raise ProfileError(f"the JAX profiler wrote no trace under {d}")
                times = device_kernel_times_us(files[-1])[which]
            finally:
                shutil.rmtree(d, ignore_errors=True)
            if not times:
                raise ProfileError(f"no {which!r} kernel on the GPU device plane (is CUPTI available?)")
            samples.append(sum(times))
        return Timing(tuple(samples))


# --- Per-op accuracy ----------------------------------------------------------------------


def per_op_times_us(xplane_path: str | pathlib.Path, *, module: str | None = None) -> dict[str, float]:
    """Time per HLO instruction (us) in a JAX profiler trace, summed over its events.

    XLA tags every kernel (GPU device plane) or thunk (CPU host plane) with an ``hlo_op``
    stat naming the instruction, the name that ``StepGraph`` tasks carry. GPU device
    planes are used when the trace has any; otherwise the host planes (CPU backend).
    ``module`` keeps only events of that ``hlo_module`` (e.g. ``"jit_step"``).
    """
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(xplane_path))
    planes = list(data.planes)
    gpu = [pl for pl in planes if pl.name.startswith("/device:GPU")]
    out: dict[str, float] = {}
    for plane in gpu or [pl for pl in planes if pl.name.startswith("/host:")]:
        for line in _kernel_lines(plane):
            for ev in line.events:
                stats = dict(ev.stats)
                op = stats.get("hlo_op")
                if not op or (module is not None and stats.get("hlo_module") != module):
                    continue
                out[str(op)] = out.get(str(op), 0.0) + ev.duration_ns / 1e3
    return out


@dataclasses.dataclass(frozen=True)
class Accuracy:
    """Mean absolute percentage error of predicted against measured per-op times."""
    mape: float  # percent
    per_op: tuple[tuple[str, float, float], ...]  # (op, measured us, predicted us)
    unmatched: tuple[str, ...]  # measured ops with no prediction

    def to_dict(self) -> dict[str, Any]:
        return {"mape_percent": self.mape, "unmatched": list(self.unmatched),
                "per_op": [{"op": o, "measured_us": m, "predicted_us": p} for o, m, p in self.per_op]}


def accuracy(measured_us: dict[str, float], predicted_us: dict[str, float], *,
             min_measured_us: float = 0.0) -> Accuracy:
    """MAPE over the ops present in both maps (ops measured under ``min_measured_us`` are
    left out: their percentage error is dominated by timer resolution)."""
    ops = sorted(o for o in measured_us if o in predicted_us and measured_us[o] >= min_measured_us)
    if not ops:
        raise ProfileError(f"no op is both measured and predicted (measured: {sorted(measured_us)[:5]}, "
                           f"predicted: {sorted(predicted_us)[:5]}): are the names from the same module?")
    rows = []
    for o in ops:
        m, p = float(measured_us[o]), float(predicted_us[o])
        if not (math.isfinite(m) and m > 0 and math.isfinite(p) and p >= 0):
            raise ProfileError(f"op {o!r}: measured {m} us and predicted {p} us must be finite, measured > 0")
        rows.append((o, m, p))
    mape = 100.0 * float(np.mean([abs(p - m) / m for _, m, p in rows]))
    return Accuracy(mape, tuple(rows), tuple(sorted(set(measured_us) - set(predicted_us))))


# --- Fitting ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LineFit:
    """``t_us = intercept_us + x / (rate * scale)``: rate from the inverse slope."""
    rate: float
    intercept_us: float
    rms_residual_us: float
    points: int


@dataclasses.dataclass(frozen=True)
class ContentionFit:
    """Fitted contention terms (see module docstring for the model)."""
    sm_per_cta: float  # SMs one copy CTA takes from a compute-bound GEMM
    slowdown_rms: float  # rms residual of the slowdown curve
    hbm_gbps_per_cta: float  # bandwidth one CTA drives before HBM saturates
    hbm_saturation_gbps: float  # when no point saturates: b x the largest k (a lower bound)
    bandwidth_rms_gbps: float
    points: int


def _finite_array(values: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ProfileError(f"{what} must be a flat sequence of numbers")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ProfileError(f"{what} has non-finite values at positions {bad.tolist()}: drop or re-measure them")
    return arr


def fit_line(sizes: Sequence[float], times_us: Sequence[float], *, scale: float, what: str) -> LineFit:
    """Least-squares ``t = t0 + size / (rate * scale)`` over at least two distinct sizes.

    ``scale`` turns the rate into the unit of ``size`` per us (1e6 for TFLOP/s with
    sizes in FLOPs, 1e3 for GB/s with sizes in bytes).
    """
    x = _finite_array(sizes, f"{what} sizes")
    t = _finite_array(times_us, f"{what} times")
    if x.shape != t.shape:
        raise ProfileError(f"{what}: {x.size} sizes but {t.size} times")
    if np.unique(x).size < 2:
        raise ProfileError(f"{what}: need at least two distinct sizes to fit a rate, got {np.unique(x).tolist()}")
    if (x <= 0).any() or (t <= 0).any():
        raise ProfileError(f"{what}: sizes and times must be positive")
    design = np.stack([np.ones_like(x), x], axis=1)
    (t0, slope), *_ = np.linalg.lstsq(design, t, rcond=None)
    if not slope > 0:
        raise ProfileError(f"{what}: time does not grow with size (slope {slope:.3g}); the "
                           "measurements are noise-dominated: use larger sizes")
    resid = t - (t0 + slope * x)
    return LineFit(float(1.0 / (slope * scale)), float(t0), float(np.sqrt(np.mean(resid**2))), int(x.size))


def fit_contention(ctas: Sequence[int], slowdown: Sequence[float], copy_gbps: Sequence[float], *,
                   sm_count: int, tolerance: float = 0.05, hbm_gbps: float | None = None,
                   pressure_exponent: float = 0.0) -> ContentionFit:
    """Fit ``sm_per_cta`` from the GEMM slowdown curve and ``hbm_gbps_per_cta`` /
    ``hbm_saturation_gbps`` from the copy bandwidth curve.

    With ``pressure_exponent`` > 0 the slowdown the copy's share of ``hbm_gbps`` explains
    is divided out first, so the SMs fitted are what the cost model adds on top of it.

    Needs at least three distinct CTA counts, slowdowns >= 1 - ``tolerance`` and not
    falling with k by more than ``tolerance`` (contention cannot speed the GEMM up), and
    positive copy bandwidths.
    """
    k = _finite_array(ctas, "CTA counts")
    s = _finite_array(slowdown, "slowdowns")
    bw = _finite_array(copy_gbps, "copy bandwidths")
    if not (k.size == s.size == bw.size):
        raise ProfileError(f"contention curves differ in length: {k.size} CTA counts, "
                           f"{s.size} slowdowns, {bw.size} bandwidths")
    if np.unique(k).size < 3:
        raise ProfileError(f"need at least three distinct CTA counts to fit contention, got {np.unique(k).tolist()}")
    if sm_count < 1:
        raise ProfileError(f"sm_count must be >= 1, got {sm_count}")
    if (k < 1).any() or (k > sm_count).any():
        raise ProfileError(f"CTA counts must be in 1..{sm_count} (the SM count), got {k.tolist()}")
    order = np.argsort(k)
    k, s, bw = k[order], s[order], bw[order]
    if (s < 1 - tolerance).any():
        raise ProfileError(f"slowdowns below 1 - {tolerance} ({s.tolist()}): the GEMM ran faster beside the "
                           "copy kernel, so the two did not overlap or the timing is wrong")
    running_max = np.maximum.accumulate(s)
    if (running_max - s > tolerance * running_max).any():
        raise ProfileError(f"slowdown falls with more CTAs beyond the {tolerance:.0%} noise tolerance "
                           f"({dict(zip(k.tolist(), s.tolist()))}): re-measure with more repeats")
    if (bw <= 0).any():
        raise ProfileError(f"copy bandwidths must be positive, got {bw.tolist()}")
    pressure = np.ones_like(s)
    if pressure_exponent:
        if not hbm_gbps or hbm_gbps <= 0:
            raise ProfileError(f"the pressure term needs the HBM bandwidth, got {hbm_gbps}")
        pressure = np.maximum(1.0 - bw / hbm_gbps, 0.1) ** -pressure_exponent
    # 1 - 1/s' = (a/S) k with s' = s / pressure: least squares through the origin, a >= 0.
    y = 1.0 - 1.0 / (s / pressure)
    a = max(float(sm_count * (k @ y) / (k @ k)), 0.0)
    s_fit = sm_count / np.maximum(sm_count - a * k, 1.0) * pressure
    slow_rms = float(np.sqrt(np.mean((s - s_fit) ** 2)))
    # bw = min(b k, B_sat): try every split (first j points linear, the rest saturated).
    best: tuple[float, float, float] | None = None
    for j in range(1, k.size + 1):
        b = float(k[:j] @ bw[:j] / (k[:j] @ k[:j]))
        sat = float(bw[j:].mean()) if j < k.size else float(b * k[-1])
        if j < k.size and sat < b * k[j - 1]:
            continue  # saturation below the linear part: not this split
        sse = float(np.sum((np.minimum(b * k, sat) - bw) ** 2))
        if best is None or sse < best[0]:
            best = (sse, b, sat)
    assert best is not None  # j = k.size always qualifies
    sse, b, sat = best
    return ContentionFit(a, slow_rms, b, sat, float(np.sqrt(sse / k.size)), int(k.size))


# --- The measured profile -----------------------------------------------------------------


def base_preset_for(device_kind: str) -> str:
    """The preset whose link and NCCL numbers a measured GPU profile keeps (those are not
    measured on one GPU)."""
    preset = hardware.preset_for_device(device_kind)
    if preset is None:
        raise ProfileError(f"no preset for GPU {device_kind!r} (known: "
                           f"{', '.join(k for k, _ in hardware.GPU_PRESETS)}); "
                           f"pass base= one of {', '.join(hardware.PRESETS)}")
    return preset


def measured_profile(base: HardwareProfile, *, name: str, gpu: str, gemm: LineFit, hbm: LineFit,
                     sm_count: int | None = None) -> HardwareProfile:
    """``base`` with the measured SM count, achieved TFLOP/s and HBM GB/s."""
    return dataclasses.replace(base, name=name, gpu=gpu, achieved_tflops=round(gemm.rate, 3),
                               achieved_hbm_gbps=round(hbm.rate, 3),
                               sm_count=sm_count if sm_count is not None else base.sm_count)


@dataclasses.dataclass(frozen=True)
class ProfileSizes:
    """What ``run_profile`` measures on one backend."""
    gemms: tuple[tuple[int, int, int], ...]
    gemm_dtype: str
    hbm_elements: tuple[int, ...]
    repeats: int
    ks: tuple[int, ...]


def profile_sizes(backend: str, *, quick: bool) -> ProfileSizes:
    """GPU sizes fill the chip: GPT-2-style model shapes (tokens 8192, hidden 768..4096 and
    their 4x MLP) and square GEMMs; CPU sizes are tiny, only to exercise the code."""
    if backend != "gpu":
        return ProfileSizes(((64, 64, 64), (128, 128, 128), (256, 256, 256)), "float32",
                            (1 << 16, 1 << 18, 1 << 20), 5 if quick else 10, ())
    gemms = ((8192, 768, 768), (8192, 3072, 768), (8192, 1024, 4096), (8192, 4096, 4096), (8192, 8192, 8192))
    hbm = (1 << 24, 1 << 26, 1 << 28)
    if quick:
        return ProfileSizes(gemms[1::2], "bfloat16", hbm[1:], 10, (1, 4, 16, 64))
    return ProfileSizes(gemms, "bfloat16", hbm, 30, DEFAULT_KS)


def _driver_version() -> str:
    if shutil.which("nvidia-smi") is None:
        return "unknown (no nvidia-smi)"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"


def environment_info() -> dict[str, str]:
    """Device name, driver and versions recorded with every profile."""
    import jax
    import jaxlib

    dev = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": str(jax.device_count()),
        "driver": _driver_version() if jax.default_backend() == "gpu" else "n/a (not a GPU)",
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }


CPU_WARNING = ("these are CPU numbers from the JAX CPU backend, NOT a GPU profile: do not use this "
               "hardware.json for GPU predictions")


def write_profile(out_dir: str | pathlib.Path, profile: HardwareProfile, raw: dict[str, Any]) -> pathlib.Path:
    """Write ``hardware.json`` (loads with ``HardwareProfile.load``) and ``raw.json``."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    profile.save(out / "hardware.json")
    (out / "raw.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return out / "hardware.json"


def _default_probe(repeats: int) -> ContentionProbe:
    """CuPy's stream-ordered probe where CuPy imports, else the all-JAX one."""
    if importlib.util.find_spec("cupy") is not None:
        return CudaContentionProbe(repeats=max(5, repeats // 2))
    return GpuContentionProbe(repeats=max(5, repeats // 3))


def run_profile(out_dir: str | pathlib.Path, *, quick: bool = False,
                progress: Callable[[str], None] = print, base: str | None = None,
                probe: ContentionProbe | None = None) -> pathlib.Path:
    """Measure the default backend, fit, and write ``hardware.json`` + ``raw.json`` to
    ``out_dir``; returns the path of ``hardware.json``.

    On a GPU: GEMM and HBM sweeps and the contention sweep (``probe`` defaults to
    ``GpuContentionProbe``). On the CPU: tiny GEMM and HBM sweeps only (no second
    stream, so no contention sweep), and the profile is named as a CPU profile.
    """
    import jax

    backend = jax.default_backend()
    env = environment_info()
    on_gpu = backend == "gpu"
    if not on_gpu:
        progress(f"WARNING: default backend is {backend!r}: {CPU_WARNING}")
    sizes = profile_sizes(backend, quick=quick)
    progress(f"profiling {env['device_kind']} ({backend}), {'quick' if quick else 'full'} run")
    gemms = []
    for m, n, k in sizes.gemms:
        p = measure_gemm(m, n, k, sizes.gemm_dtype, repeats=sizes.repeats)
        progress(f"  GEMM {m}x{n}x{k} {p.dtype}: {p.timing.median_us:.1f} us (IQR {p.timing.iqr_us:.1f}), "
                 f"{p.tflops:.2f} TFLOP/s")
        gemms.append(p)
    hbms = []
    for e in sizes.hbm_elements:
        p = measure_hbm(e, repeats=sizes.repeats)
        progress(f"  fusion {p.bytes_moved / 1e6:.1f} MB: {p.timing.median_us:.1f} us "
                 f"(IQR {p.timing.iqr_us:.1f}), {p.gbps:.1f} GB/s")
        hbms.append(p)
    gemm_fit = fit_line([p.flops for p in gemms], [p.timing.median_us for p in gemms], scale=1e6, what="GEMM")
    hbm_fit = fit_line([p.bytes_moved for p in hbms], [p.timing.median_us for p in hbms], scale=1e3, what="HBM")
    dev = jax.devices()[0]
    if on_gpu:
        base_name = base or base_preset_for(dev.device_kind)
        sm_count = int(getattr(dev, "core_count", 0)) or None
        name = f"measured-{dev.device_kind.lower().replace(' ', '-')}"
    else:
        base_name = base or "h100-sxm-8"
        sm_count = None
        name = f"cpu-not-a-gpu-{base_name}"
    preset = hardware.get(base_name)
    prof = measured_profile(preset, name=name, gpu=dev.device_kind, gemm=gemm_fit, hbm=hbm_fit, sm_count=sm_count)
    raw: dict[str, Any] = {
        "environment": env,
        "base_preset": base_name,
        "warning": None if on_gpu else CPU_WARNING,
        "gemm": [p.to_dict() for p in gemms],
        "hbm": [p.to_dict() for p in hbms],
        "fits": {"gemm": dataclasses.asdict(gemm_fit), "hbm": dataclasses.asdict(hbm_fit)},
        "contention": None,
    }
    points = None
    if on_gpu or probe is not None:
        try:
            points = contention_sweep(probe or _default_probe(sizes.repeats),
                                      sizes.ks or DEFAULT_KS, progress=progress)
        except Exception as err:  # noqa: BLE001 - the GEMM and HBM fits still stand
            raw["contention_error"] = f"{type(err).__name__}: {err}"
            progress(f"  contention sweep FAILED ({raw['contention_error']}); the profile keeps "
                     f"the preset's sm_share_per_channel {preset.sm_share_per_channel}")
    if points:
        cfit = fit_contention([p.ctas for p in points], [p.slowdown for p in points],
                              [p.copy_gbps for p in points], sm_count=prof.sm_count,
                              hbm_gbps=prof.achieved_hbm_gbps,
                              pressure_exponent=cost.DEFAULT_COSTS.hbm_pressure_exponent)
        raw["contention"] = [p.to_dict() for p in points]
        raw["fits"]["contention"] = dataclasses.asdict(cfit)
        prof = dataclasses.replace(prof, sm_share_per_channel=round(min(max(cfit.sm_per_cta, 0.01), 1.0), 3))
        progress(f"  contention: {cfit.sm_per_cta:.2f} SM per CTA (preset: {preset.sm_share_per_channel}), "
                 f"{cfit.hbm_gbps_per_cta:.1f} GB/s per CTA, HBM saturates at {cfit.hbm_saturation_gbps:.0f} GB/s")
    elif not (on_gpu or probe is not None):
        progress("  contention sweep skipped: it needs a GPU (a second stream beside the GEMM)")
    path = write_profile(out_dir, prof, raw)
    progress(f"wrote {path} and {path.with_name('raw.json')}")
    return path
