"""Grouped GEMMs for MoE experts as users run them on Hopper: JAX's Pallas Mosaic-GPU kernels.

``grouped_matmul(x, w, sizes)``: rows of ``x`` [T, K] sorted by group, ``sizes`` [G] rows per
group, ``w`` [G, K, N] -> [T, N], row block ``g`` times ``w[g]`` (``jax.lax.ragged_dot``'s
contract). XLA:GPU compiles ``ragged_dot`` to one dense dot over every group (``G`` times the
useful FLOPs, docs/moe.md); this runs JAX's own grouped-GEMM kernels instead,
``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu.ragged_dot`` forward and for the input's
gradient (``transpose_rhs``), and ``transposed_ragged_dot_mgpu.transposed_ragged_dot`` for the
weights' gradient (group ``g``: ``x_g^T dy_g``), wired by a ``custom_vjp`` (the kernels have
none). They are Hopper kernels (wgmma, TMA): on CUDA they lower to ``mosaic_gpu`` custom calls,
which compile deviceless for sm_90; on the CPU (tests) the same contract runs as
``jax.lax.ragged_dot`` and its transposes. The choice is ``jax.lax.platform_dependent`` on the
platform lowered for, as for the flash kernel (models/attention.py).

Every call runs under the named scope ``SCOPE``; ``lagom_jax.program.custom_calls`` reads it
from the kernels' op_name to price them by their group shapes (``kernels.grouped_gemm_time_us``).
A buffer with padding past its groups (an expert exchange's receive buffer, sized for every
source) says under a nested scope ``routed_rows_R`` how many rows its groups hold when the
routing is balanced: Blackwell's CuTe kernels run the groups' tiles only, so the FFI calls are
priced by those rows (the Hopper kernels compute the padding too, docs/moe.md).

Tiles: 128 rows x 128 columns x 64 of the reduction, 4 pipelined steps, and (forward and the
input's gradient) 4 column blocks per pass where N allows, each cut to the largest power of two
dividing its dimension; the kernels need the reduction (and, for the weights' gradient, both
output dimensions) to divide by them, so K and N must be multiples of 16. Chosen from a tile
sweep on an H200 (benchmarks/RESULTS.md, ``gpu_grouped_gemm``): at Mixtral 8x7b's expert
GEMMs 4 steps and 4 column blocks run the forward at 631-688 TFLOP/s against 267-275 with 2
steps and 1 block, and the weights' gradient at 654 against 336.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

SCOPE = "grouped_gemm"
# Blackwell (sm_100): JAX's Pallas kernels are Hopper's (wgmma), and users run their MoE's
# grouped GEMMs as CuTe kernels (QuACK, SonicMoE) called through XLA's typed FFI, as MaxText
# runs Transformer Engine's attention. There the same contract is an FFI call of these targets
# (the forward and the input's gradient; the weights' gradient), which the deviceless compile
# stands in for (XLA's mock custom calls) and the cost model prices by their group shapes at
# the measured Blackwell grouped-GEMM rate (``HardwareProfile.grouped_gemm_tflops``). No
# handler of these names ships: a step with them compiles and is priced, it does not run.
FFI_FORWARD = "lagom_grouped_gemm"
FFI_WEIGHT_GRAD = "lagom_grouped_gemm_wgrad"
FFI_TARGETS = (FFI_FORWARD, FFI_WEIGHT_GRAD)
KERNELS = ("pallas", "ffi")
_BLOCK_M, _BLOCK_N, _BLOCK_K = 128, 128, 64
_STEPS = 4  # pipelined loads in flight (max_concurrent_steps)
_GRID_BLOCK_N = 4  # column blocks a pass walks together (grid_block_n), where N divides by them
_MIN_DIM = 16


def _block(target: int, n: int) -> int:
    return math.gcd(target, n & -n)


def check_dims(k: int, n: int) -> None:
    """The kernels' tiling: K and N multiples of 16 (ValueError naming them otherwise)."""
    if k % _MIN_DIM or n % _MIN_DIM:
        raise ValueError(f"grouped GEMM of [rows, {k}] x [{k}, {n}]: JAX's Hopper kernels tile both dimensions; "
                         f"use d_model and expert FFN widths that are multiples of {_MIN_DIM} (or moe='dropless')")


def _mosaic_forward(x: jax.Array, w: jax.Array, sizes: jax.Array, transpose_rhs: bool = False) -> jax.Array:
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

    k = x.shape[1]
    n = w.shape[1] if transpose_rhs else w.shape[2]
    block_n = _block(_BLOCK_N, n)
    return ragged_dot_mgpu.ragged_dot(x, w, group_sizes=sizes, block_m=_BLOCK_M, block_n=block_n,
                                      block_k=_block(_BLOCK_K, k), max_concurrent_steps=_STEPS,
                                      grid_block_n=_block(_GRID_BLOCK_N, n // block_n), transpose_rhs=transpose_rhs)


# The weights' kernel sizes its grid from ``jax.devices()[0].core_count``, read while tracing:
# a process tracing for GPUs it does not have (the deviceless compile, and every trace here,
# since ``platform_dependent`` traces each platform's branch) has CPU devices without it. The
# kernel is Hopper's, and Hopper SXM parts have 132 SMs (H100, H200; XLA's h100_sxm spec).
HOPPER_SMS = 132


class _Hopper:
    core_count = HOPPER_SMS


@contextlib.contextmanager
def _gpu_devices_while_tracing():
    """``jax.devices()`` answering with one Hopper's SM count where this process has no GPU."""
    if hasattr(jax.devices()[0], "core_count"):
        yield
        return
    real = jax.devices
    jax.devices = lambda *a, **k: [_Hopper()]  # only for the trace of the kernel below
    try:
        yield
    finally:
        jax.devices = real


def _mosaic_weight_grad(x: jax.Array, dy: jax.Array, sizes: jax.Array) -> jax.Array:
    from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu

    with _gpu_devices_while_tracing():
        return transposed_ragged_dot_mgpu.transposed_ragged_dot(
            x, dy, group_sizes=sizes, block_m=_block(_BLOCK_M, x.shape[1]), block_n=_block(_BLOCK_N, dy.shape[1]),
            block_k=_BLOCK_K, max_concurrent_steps=_STEPS, grid_block_n=1)


def _lax_forward(x: jax.Array, w: jax.Array, sizes: jax.Array, transpose_rhs: bool = False) -> jax.Array:
    return jax.lax.ragged_dot(x, jnp.swapaxes(w, 1, 2) if transpose_rhs else w, sizes)


def _lax_weight_grad(x: jax.Array, dy: jax.Array, sizes: jax.Array) -> jax.Array:
    # Group g: x_g^T dy_g, as the transposed kernel computes it (rows outside every group: none).
    groups = sizes.shape[0]
    ends = jnp.cumsum(sizes)
    row = jnp.arange(x.shape[0])
    member = (row[:, None] < ends[None, :]) & (row[:, None] >= (ends - sizes)[None, :])  # [T, G]
    return jnp.einsum("tg,tk,tn->gkn", member.astype(x.dtype), x, dy,
                      preferred_element_type=jnp.float32).astype(x.dtype).reshape(groups, x.shape[1], dy.shape[1])


def _ffi_forward(x: jax.Array, w: jax.Array, sizes: jax.Array, transpose_rhs: bool = False) -> jax.Array:
    n = w.shape[1] if transpose_rhs else w.shape[2]
    return jax.ffi.ffi_call(FFI_FORWARD, jax.ShapeDtypeStruct((x.shape[0], n), x.dtype))(
        sizes, x, w, transpose_rhs=np.bool_(transpose_rhs))


def _ffi_weight_grad(x: jax.Array, dy: jax.Array, sizes: jax.Array) -> jax.Array:
    out = jax.ShapeDtypeStruct((sizes.shape[0], x.shape[1], dy.shape[1]), x.dtype)
    return jax.ffi.ffi_call(FFI_WEIGHT_GRAD, out)(sizes, x, dy)


# The GPU side of each kernel the layer can run (``KERNELS``).
_GPU_FORWARD = {"pallas": _mosaic_forward, "ffi": _ffi_forward}
_GPU_WEIGHT_GRAD = {"pallas": _mosaic_weight_grad, "ffi": _ffi_weight_grad}


def kernel_for(device: object) -> str:
    """The grouped GEMMs a GPU runs: JAX's Pallas kernels up to Hopper (sm_90), the FFI call
    standing in for a Blackwell CuTe kernel from sm_100 on (``compute_capability`` of the
    devices the step is compiled for; CPU devices run ``ragged_dot`` either way)."""
    cc = getattr(device, "compute_capability", None)
    try:
        return "ffi" if cc is not None and float(cc) >= 10 else "pallas"
    except ValueError:
        return "pallas"


ROUTED_ROWS = "routed_rows_"


@contextlib.contextmanager
def _scope(rows: int):
    """``SCOPE``, and inside it the balanced rows of the groups where the buffer has more."""
    with jax.named_scope(SCOPE), (jax.named_scope(f"{ROUTED_ROWS}{rows}") if rows else contextlib.nullcontext()):
        yield


def _forward(x, w, sizes, kernel, rows=0, transpose_rhs=False):
    with _scope(rows):
        return jax.lax.platform_dependent(
            x, w, sizes, cpu=functools.partial(_lax_forward, transpose_rhs=transpose_rhs),
            cuda=functools.partial(_GPU_FORWARD[kernel], transpose_rhs=transpose_rhs))


def _weight_grad(x, dy, sizes, kernel, rows=0):
    with _scope(rows):
        return jax.lax.platform_dependent(x, dy, sizes, cpu=_lax_weight_grad, cuda=_GPU_WEIGHT_GRAD[kernel])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def grouped_matmul(x: jax.Array, w: jax.Array, sizes: jax.Array, kernel: str = "pallas", rows: int = 0
                   ) -> jax.Array:
    """``jax.lax.ragged_dot(x, w, sizes)`` on the GPU's grouped-GEMM kernels (``kernel``, one of
    ``KERNELS``; see the module). ``rows``: the rows the groups hold under balanced routing
    where ``x`` is a buffer with more (0: all of them)."""
    return _forward(x, w, sizes, kernel, rows)


def _fwd(x, w, sizes, kernel, rows):
    return _forward(x, w, sizes, kernel, rows), (x, w, sizes)


def _bwd(kernel, rows, res, dy):
    x, w, sizes = res
    dy = dy.astype(x.dtype)
    dx = _forward(dy, w, sizes, kernel, rows, transpose_rhs=True)
    dw = _weight_grad(x, dy, sizes, kernel, rows)
    return dx, dw.astype(w.dtype), None


grouped_matmul.defvjp(_fwd, _bwd)
