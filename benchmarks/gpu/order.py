"""Who holds the SMs: a GEMM beside a collective-like kernel, by launch order and stream priority.

The contention term of the cost model needs one fact that only a GPU can give: when a
collective's CTAs and a GEMM's CTAs want the same SMs, which kernel gets them. A CTA that is
resident keeps its SM until it exits, and a collective kernel's CTAs live as long as the
collective, so the answer depends on who was there first and, for SMs that free up while
both wait, on the streams' priorities (the block scheduler serves a higher-priority stream's
waiting CTAs first; CUDA Programming Guide, "Stream Priorities").

Every case runs ``repeats`` cuBLAS GEMMs (float16, the bf16 tensor-core rate) on a
normal-priority stream, as XLA's compute stream is, beside one "collective" on a second
stream of normal or of the highest priority (XLA puts async collectives on a highest-priority
stream: ``xla_gpu_enable_highest_priority_async_stream``). The collective is one of:

- ``copy``: a grid-stride copy of ``k`` CTAs x 512 threads (one CTA per NCCL channel,
  NCCL_NTHREADS=512): holds k SMs *and* takes HBM bandwidth (~80 GB/s per CTA).
- ``hold``: ``k`` CTAs that hold their SMs and move nothing (each spins on ``%globaltimer``
  with ``__nanosleep``): the SM share alone, as a channel waiting on the network does.
- ``paced``: the copy with each CTA held to ``--paced-gbps`` (15 GB/s read, one NCCL channel's
  NVLink rate): between rounds its thread 0 spins on ``%globaltimer``, as a NCCL channel's
  thread spins on its peer's flag, so the SMs are held at a channel's HBM traffic.
- ``reduce`` / ``paced-reduce``: the destination plus the source into the destination (two reads
  and a write a word, a reduce-scatter step's work), unpaced or paced.
- ``ce``: ``cudaMemcpyAsync`` device to device, done by a copy engine: HBM traffic, no SM.
- ``d2h``: ``cudaMemcpyAsync`` into pinned host memory over PCIe: neither.

and is made ready in one of three ways:

- ``first``: launched on an idle GPU before the GEMMs (its CTAs are resident first);
- ``second``: launched from the host about 200 us after the GEMMs (a GEMM holds every SM);
- ``dep``: made ready by an event recorded after the first GEMM, so it becomes runnable
  exactly when that GEMM's CTAs retire and the second GEMM's CTAs want the same SMs. This is
  how XLA runs an async collective: its start waits on the compute that produced its operand.

Each copy CTA stamps ``%globaltimer`` when it starts and ends; a one-thread kernel stamps the
same clock next to a CUDA event on the GEMM stream, so that CTA stamps and GEMM events share a
time axis. Reported per case: the GEMM slowdown (median of the GEMMs that ran entirely while
the collective did, over the median GEMM alone), how long the collective's CTAs waited after it
was ready, and the collective's rate.

Run on the GPU machine: ``python -m benchmarks.gpu.order --out DIR`` (needs CuPy); ``--kinds``,
``--orders`` and ``--priorities`` choose the cases (default: copy, hold, ce, d2h; every order
and priority).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time
from typing import Any

import numpy as np

_KERNELS = r"""
__device__ __forceinline__ unsigned long long lagom_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// mode 0: grid-stride copy of n 16-byte words, reps passes. mode 1: hold the SM until
// hold_until (a %globaltimer value), moving nothing. mode 2: reduce as it copies,
// dst[i] += src[i] (two reads, one write a word, as a reduce-scatter step adds the chunk it
// received to its own). pace_ns_per_byte > 0 (modes 0 and 2): each CTA moves PACE_UNROLL
// words a thread, then its thread 0 spins on %globaltimer (as a NCCL channel's thread spins
// on its peer's flag) until the CTA's bytes read from src over its time since it started
// fall to 1 / pace_ns_per_byte GB/s. stamps[2b], stamps[2b+1]: CTA b's start, end.
#define PACE_UNROLL 4
extern "C" __global__ void lagom_probe(const float4* __restrict__ src, float4* __restrict__ dst,
                                       long long n, int reps, int mode,
                                       unsigned long long hold_until,
                                       unsigned long long* __restrict__ stamps,
                                       double pace_ns_per_byte) {
  __shared__ unsigned long long start;
  if (threadIdx.x == 0) start = stamps[2 * blockIdx.x] = lagom_now();
  __syncthreads();
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (mode == 1) {
    if (threadIdx.x == 0)
      while (lagom_now() < hold_until) __nanosleep(2000);
  } else if (pace_ns_per_byte <= 0.0) {
    for (int r = 0; r < reps; ++r)
      for (long long i = first; i < n; i += stride) {
        if (mode == 0) {
          dst[i] = src[i];
        } else {
          float4 a = src[i], b = dst[i];
          dst[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
      }
  } else {
    double moved = 0.0;
    for (int r = 0; r < reps; ++r)
      for (long long base = first; base - threadIdx.x < n; base += PACE_UNROLL * stride) {
        for (int u = 0; u < PACE_UNROLL; ++u) {
          const long long i = base + u * stride;
          if (i >= n) break;
          if (mode == 0) {
            dst[i] = src[i];
          } else {
            float4 a = src[i], b = dst[i];
            dst[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
          }
        }
        moved += (double)PACE_UNROLL * blockDim.x * 16.0;
        __syncthreads();
        if (threadIdx.x == 0) {
          const unsigned long long due = start + (unsigned long long)(moved * pace_ns_per_byte);
          while (lagom_now() < due) {
          }
        }
        __syncthreads();
      }
  }
  __syncthreads();
  if (threadIdx.x == 0) stamps[2 * blockIdx.x + 1] = lagom_now();
}

extern "C" __global__ void lagom_stamp(unsigned long long* out) { *out = lagom_now(); }
"""

KINDS = ("copy", "hold", "reduce", "paced", "paced-reduce", "ce", "d2h")
# The kernel kinds: their mode of ``lagom_probe``, HBM bytes per word a pass moves, and paced or not.
_KERNEL_KINDS = {"copy": (0, 2, False), "hold": (1, 0, False), "reduce": (2, 3, False),
                 "paced": (0, 2, True), "paced-reduce": (2, 3, True)}
PACED_GBPS = 15.0  # one NCCL channel's rate over NVLink (~15 GB/s a channel), bytes read from src
ORDERS = ("first", "second", "dep")
THREADS = 512


def _driver() -> Any:
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} returned CUDA error {result}")


def _priority_range(cp: Any) -> tuple[int, int]:
    """(least, greatest) stream priority of the current context. CuPy's runtime module has no
    binding for it before some version, so the driver API is called directly (CuPy has made
    the device's primary context current by then)."""
    import ctypes

    rt = cp.cuda.runtime
    if hasattr(rt, "deviceGetStreamPriorityRange"):
        return tuple(rt.deviceGetStreamPriorityRange())
    least, greatest = ctypes.c_int(), ctypes.c_int()
    _check(_driver().cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
           "cuCtxGetStreamPriorityRange")
    return least.value, greatest.value


def _create_stream(cp: Any, priority: int) -> int:
    """A non-blocking stream of ``priority``; its handle."""
    import ctypes

    rt = cp.cuda.runtime
    if hasattr(rt, "streamCreateWithPriority"):
        return rt.streamCreateWithPriority(rt.streamNonBlocking, priority)
    handle = ctypes.c_void_p()
    _check(_driver().cuStreamCreateWithPriority(ctypes.byref(handle), ctypes.c_uint(1), ctypes.c_int(priority)),
           "cuStreamCreateWithPriority")
    return int(handle.value)


@dataclasses.dataclass
class Case:
    kind: str
    order: str
    priority: str  # "normal" | "high"
    ctas: int  # 0 for the copy-engine kinds
    gemm_us: list[float]  # every GEMM's duration
    gemm_start_us: list[float]  # every GEMM's start, on the common axis
    ready_us: float  # when the collective could run
    cta_start_us: list[float]  # per CTA (one entry, the transfer's start, for ce/d2h)
    end_us: float  # when the collective's last CTA (or the transfer) ended
    bytes_moved: int
    alone_us: float  # median GEMM alone, same stream, just before

    def overlapped(self) -> list[float]:
        """Durations of the GEMMs that ran entirely while the collective ran."""
        if not self.cta_start_us:
            return []
        lo = max(self.cta_start_us)
        return [d for s, d in zip(self.gemm_start_us, self.gemm_us) if s >= lo and s + d <= self.end_us]

    def summary(self) -> dict[str, Any]:
        ov = self.overlapped()
        span = self.end_us - min(self.cta_start_us) if self.cta_start_us else float("nan")
        waits = [s - self.ready_us for s in self.cta_start_us]
        return {
            "kind": self.kind, "order": self.order, "priority": self.priority, "ctas": self.ctas,
            "alone_us": self.alone_us,
            "overlapped_gemms": len(ov),
            "slowdown": (float(np.median(ov)) / self.alone_us) if ov else None,
            "wait_first_cta_us": min(waits) if waits else None,
            "wait_last_cta_us": max(waits) if waits else None,
            "gemms_before_last_cta": sum(1 for s, d in zip(self.gemm_start_us, self.gemm_us)
                                         if s + d <= max(self.cta_start_us)) if self.cta_start_us else None,
            "gbps": (self.bytes_moved / (span * 1e3)) if self.bytes_moved and span > 0 else None,
        }


class Probe:
    """Holds the buffers, kernels and streams; ``run`` measures one case."""

    def __init__(self, size: int = 8192, repeats: int = 12, copy_bytes: int = 1 << 30,
                 paced_gbps: float = PACED_GBPS) -> None:
        if not paced_gbps > 0:
            raise ValueError(f"the paced kinds' rate must be > 0 GB/s a CTA, got {paced_gbps}")
        import cupy as cp

        self.cp = cp
        self.repeats = repeats
        self.paced_gbps = paced_gbps
        rng = cp.random.default_rng(1234)
        self.a = rng.standard_normal((size, size), dtype=cp.float32).astype(cp.float16)
        self.b = rng.standard_normal((size, size), dtype=cp.float32).astype(cp.float16)
        self.c = cp.empty_like(self.a)
        self.words = copy_bytes // 16
        self.src = rng.random(self.words * 4, dtype=cp.float32)
        self.dst = rng.random(self.words * 4, dtype=cp.float32)  # the reducing kinds read it too
        self.host = cp.cuda.alloc_pinned_memory(copy_bytes)
        self.stamps = cp.zeros(2 * 1024, dtype=cp.uint64)
        self.ref = cp.zeros(1, dtype=cp.uint64)
        mod = cp.RawModule(code=_KERNELS)
        self.probe = mod.get_function("lagom_probe")
        self.stamp = mod.get_function("lagom_stamp")
        least, greatest = _priority_range(cp)
        self.priorities = {"normal": int(least), "high": int(greatest)}
        self.gemm_stream = self._stream(least)
        self.side = {p: self._stream(v) for p, v in self.priorities.items()}
        self.gemm_alone_us = self._alone()
        self.copy_gbps_per_cta = self._copy_rate("copy")
        self.reduce_gbps_per_cta = self._copy_rate("reduce")
        self.ce_gbps = self._transfer_rate("ce")
        self.d2h_gbps = self._transfer_rate("d2h")

    # -- pieces -------------------------------------------------------------------------
    def _stream(self, priority: int) -> Any:
        """A non-blocking stream of ``priority`` (cuStreamCreateWithPriority, as XLA makes its own)."""
        return self.cp.cuda.ExternalStream(_create_stream(self.cp, priority))

    def _ev(self, stream: Any) -> Any:
        e = self.cp.cuda.Event()
        e.record(stream)
        return e

    def _gemms(self, n: int) -> list[tuple[Any, Any]]:
        marks = []
        with self.gemm_stream:
            for _ in range(n):
                e0 = self._ev(self.gemm_stream)
                self.cp.matmul(self.a, self.b, out=self.c)
                marks.append((e0, self._ev(self.gemm_stream)))
        return marks

    def _alone(self) -> float:
        self._gemms(3)
        self.gemm_stream.synchronize()
        marks = self._gemms(self.repeats)
        self.gemm_stream.synchronize()
        return float(np.median([self.cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in marks]))

    def _launch(self, kind: str, stream: Any, ctas: int, reps: int, hold_until: int, chunks: int) -> int:
        """Enqueue the collective on ``stream``; the bytes it moves. ``hold_until``: for ``hold``,
        the ``%globaltimer`` value until which its CTAs hold their SMs."""
        cp = self.cp
        if kind in _KERNEL_KINDS:
            mode, per_word, paced = _KERNEL_KINDS[kind]
            until = np.uint64(hold_until if mode == 1 else 0)  # ``run`` read the GPU clock first
            pace = np.float64(1.0 / self.paced_gbps if paced else 0.0)  # ns a byte read from src
            self.probe((ctas,), (THREADS,), (self.src, self.dst, cp.int64(self.words), cp.int32(reps),
                                             cp.int32(mode), until, self.stamps, pace), stream=stream)
            return per_word * self.words * 16 * reps
        nbytes = self.words * 16
        kind_id = cp.cuda.runtime.memcpyDeviceToDevice if kind == "ce" else cp.cuda.runtime.memcpyDeviceToHost
        dst = self.dst.data.ptr if kind == "ce" else self.host.ptr
        for _ in range(chunks):
            cp.cuda.runtime.memcpyAsync(dst, self.src.data.ptr, nbytes, kind_id, stream.ptr)
        return (2 if kind == "ce" else 1) * nbytes * chunks

    def _copy_rate(self, kind: str) -> float:
        """HBM GB/s (read + written) of one unpaced ``kind`` CTA alone (one pass)."""
        s = self.side["normal"]
        e0 = self._ev(s)
        moved = self._launch(kind, s, 1, 1, 0, 0)
        e1 = self._ev(s)
        s.synchronize()
        return moved / (self.cp.cuda.get_elapsed_time(e0, e1) * 1e6)

    def _transfer_rate(self, kind: str) -> float:
        s = self.side["normal"]
        self._launch(kind, s, 0, 0, 0, 1)
        e0 = self._ev(s)
        moved = self._launch(kind, s, 0, 0, 0, 2)
        e1 = self._ev(s)
        s.synchronize()
        return moved / (self.cp.cuda.get_elapsed_time(e0, e1) * 1e6)

    # -- one case -----------------------------------------------------------------------
    def run(self, kind: str, order: str, priority: str, ctas: int) -> Case:
        cp = self.cp
        n = self.repeats
        side = self.side[priority]
        # Size the collective to outlast every GEMM even if it waits for all but one of them
        # and they run 4x slower beside it.
        want_us = 6.0 * (n + 1) * self.gemm_alone_us
        reps = 1
        if kind in _KERNEL_KINDS and kind != "hold":
            _, per_word, paced = _KERNEL_KINDS[kind]
            one = self.reduce_gbps_per_cta if per_word == 3 else self.copy_gbps_per_cta
            if paced:
                one = min(one, per_word * self.paced_gbps)
            gbps = min(ctas * one, 3000.0)
            reps = min(4096, max(1, math.ceil(want_us * gbps * 1e3 / (per_word * self.words * 16))))
        rate = {"ce": self.ce_gbps, "d2h": self.d2h_gbps}.get(kind)
        chunks = max(1, math.ceil(want_us * rate * 1e3 / (self.words * 16 * (2 if kind == "ce" else 1)))) if rate else 0
        self.stamps.fill(0)
        cp.cuda.Device().synchronize()

        # Common time axis: a stamp kernel and an event back to back on the GEMM stream.
        self.stamp((1,), (1,), (self.ref,), stream=self.gemm_stream)
        ref_ev = self._ev(self.gemm_stream)
        self.gemm_stream.synchronize()
        ref_ns = int(self.ref.get()[0])
        hold_until = ref_ns + int(want_us * 1e3)

        if order == "first":
            ready = self._ev(side)
            moved = self._launch(kind, side, ctas, reps, hold_until, chunks)
            done = self._ev(side)
            self.gemm_stream.wait_event(ready)
            marks = self._gemms(n)
        elif order == "second":
            marks = self._gemms(n)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 2e-4:
                pass
            ready = self._ev(side)
            moved = self._launch(kind, side, ctas, reps, hold_until, chunks)
            done = self._ev(side)
        elif order == "dep":
            marks = self._gemms(1)
            after_first = self._ev(self.gemm_stream)
            marks += self._gemms(n - 1)
            side.wait_event(after_first)
            ready = self._ev(side)
            moved = self._launch(kind, side, ctas, reps, hold_until, chunks)
            done = self._ev(side)
        else:
            raise ValueError(f"unknown order {order!r}; known: {ORDERS}")
        cp.cuda.Device().synchronize()

        def t(ev: Any) -> float:
            return cp.cuda.get_elapsed_time(ref_ev, ev) * 1e3

        if kind in _KERNEL_KINDS:
            st = self.stamps.get()[: 2 * ctas].astype(np.int64) - ref_ns
            starts = [float(x) / 1e3 for x in st[0::2]]
            end = float(st[1::2].max()) / 1e3
            if min(st[0::2]) <= -ref_ns or min(st[1::2]) <= -ref_ns:
                raise RuntimeError(f"{kind}/{order}/{priority}/k={ctas}: a CTA left no stamp")
        else:
            starts, end = [t(ready)], t(done)  # a copy engine starts when its stream is ready
        return Case(kind, order, priority, ctas, [cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in marks],
                    [t(a) for a, _ in marks], t(ready), starts, end, moved, self.gemm_alone_us)


def sweep(ctas: list[int], repeats: int, progress: Any = print, *, kinds: tuple[str, ...] = ("copy", "hold", "ce", "d2h"),
          orders: tuple[str, ...] = ORDERS, priorities: tuple[str, ...] = ("normal", "high"),
          paced_gbps: float = PACED_GBPS) -> dict[str, Any]:
    import cupy as cp

    for what, given, known in (("kind", kinds, KINDS), ("order", orders, ORDERS), ("priority", priorities, ("normal", "high"))):
        unknown = sorted(set(given) - set(known))
        if unknown or not given:
            raise ValueError(f"unknown {what}(s) {unknown or given}; known: {', '.join(known)}")
    probe = Probe(repeats=repeats, paced_gbps=paced_gbps)
    props = cp.cuda.runtime.getDeviceProperties(0)
    out: dict[str, Any] = {
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "sms": int(props["multiProcessorCount"]), "priorities": probe.priorities,
        "gemm_alone_us": probe.gemm_alone_us, "copy_gbps_per_cta": probe.copy_gbps_per_cta,
        "reduce_gbps_per_cta": probe.reduce_gbps_per_cta, "paced_gbps": paced_gbps,
        "ce_gbps": probe.ce_gbps, "d2h_gbps": probe.d2h_gbps, "cases": []}
    progress(f"GEMM alone {probe.gemm_alone_us:.0f} us; copy CTA {probe.copy_gbps_per_cta:.0f} GB/s; "
             f"reducing CTA {probe.reduce_gbps_per_cta:.0f} GB/s; "
             f"copy engine D2D {probe.ce_gbps:.0f} GB/s; D2H {probe.d2h_gbps:.0f} GB/s; "
             f"priorities {probe.priorities}")
    plan = [(kind, order, prio, k) for kind in kinds if kind in _KERNEL_KINDS for order in orders
            for prio in priorities for k in ctas]
    plan += [(kind, order, prio, 0) for kind in kinds if kind not in _KERNEL_KINDS
             for order in orders if order != "second" for prio in priorities]
    for kind, order, prio, k in plan:
        try:
            case = probe.run(kind, order, prio, k)
            s = case.summary()
            out["cases"].append({**s, "raw": dataclasses.asdict(case)})
            progress(f"{kind:4s} {order:6s} {prio:6s} k={k:3d}: slowdown "
                     f"{s['slowdown'] if s['slowdown'] is None else round(s['slowdown'], 3)} over "
                     f"{s['overlapped_gemms']} GEMMs, first CTA waited {s['wait_first_cta_us']:.0f} us, "
                     f"last {s['wait_last_cta_us']:.0f} us, {s['gbps'] or 0:.0f} GB/s")
        except Exception as e:  # one case failing must not lose the others
            out["cases"].append({"kind": kind, "order": order, "priority": prio, "ctas": k, "error": repr(e)})
            progress(f"{kind} {order} {prio} k={k}: FAILED {e!r}")
    return out


def table(raw: dict[str, Any]) -> str:
    """Markdown: one row per case."""
    lines = ["| collective | order | side stream | CTAs | GEMMs overlapped | slowdown | first CTA waited us "
             "| last CTA waited us | collective GB/s |", "|---|---|---|---|---|---|---|---|---|"]
    for c in raw["cases"]:
        if "error" in c:
            lines.append(f"| {c['kind']} | {c['order']} | {c['priority']} | {c['ctas']} | failed: {c['error'][:60]} "
                         "| | | | |")
            continue
        sd = "-" if c["slowdown"] is None else f"{c['slowdown']:.3f}"
        lines.append(f"| {c['kind']} | {c['order']} | {c['priority']} | {c['ctas'] or '-'} | "
                     f"{c['overlapped_gemms']} | {sd} | {c['wait_first_cta_us']:.0f} | {c['wait_last_cta_us']:.0f} "
                     f"| {c['gbps'] or 0:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gpu", help="directory for gpu_order.json")
    ap.add_argument("--ctas", default="1,4,16,32,64", help="CTA counts of the copy and hold kernels")
    ap.add_argument("--repeats", type=int, default=12, help="GEMMs per case")
    ap.add_argument("--kinds", default="copy,hold,ce,d2h", help=f"collective kinds, of {', '.join(KINDS)}")
    ap.add_argument("--orders", default=",".join(ORDERS), help=f"launch orders, of {', '.join(ORDERS)}")
    ap.add_argument("--priorities", default="normal,high", help="side-stream priorities, of normal, high")
    ap.add_argument("--paced-gbps", type=float, default=PACED_GBPS,
                    help="the paced kinds' rate a CTA, GB/s read from the source (NCCL's ~15 GB/s a channel)")
    args = ap.parse_args(argv)
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        print(f"gpu_order: needs CuPy and an NVIDIA GPU ({e}); nothing recorded", file=sys.stderr)
        return 2
    def names(text: str) -> tuple[str, ...]:
        return tuple(x.strip() for x in text.split(",") if x.strip())

    try:
        raw = sweep([int(k) for k in args.ctas.split(",")], args.repeats, kinds=names(args.kinds),
                    orders=names(args.orders), priorities=names(args.priorities), paced_gbps=args.paced_gbps)
    except ValueError as e:
        print(f"gpu_order: {e}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_order.json").write_text(json.dumps(raw, indent=1) + "\n")
    print(table(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
