"""Every use of JAX's private internals, in one place.

lagom-jax reaches below JAX's public API for these things: whether backends (a GPU one)
have started and which plugins registered, letting the CUDA plugin register on a machine
without a driver, a jitted function's static arguments, the ``jax.distributed`` client
that shares one Plan between processes, parsing ``XLA_FLAGS``, lowering a step for another
platform whatever wraps its ``jax.jit`` (:func:`lowering_for`), compiling a lowered step
for devices of another platform (abstract GPUs), compiling an HLO module given as text for
such devices, and telling Pallas' Triton lowering which GPU it lowers for (0.11 on). Each
is checked on every release in ``CHECKED_JAX``
(tests/test_jax_internals.py pins each; the test matrix runs it on the oldest and the
newest); where one differs between them, the function here handles both and says
since when. On another version an attribute that moved raises ``JaxInternalsError``
naming it, and every caller treats that as "not available" (tuning goes on without it,
or the step runs untuned with a warning).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# The releases every function below was checked on (lagom_jax.program.environment.TESTED_JAX).
CHECKED_JAX = ("0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.10.2", "0.11.2", "0.12.0.1")
_CHECKED = f"{CHECKED_JAX[0]} to {CHECKED_JAX[-1]}"


class JaxInternalsError(RuntimeError):
    """A JAX internal lagom-jax relies on is not where it was in ``CHECKED_JAX``."""


@contextlib.contextmanager
def _internal(what: str) -> Iterator[None]:
    try:
        yield
    except (AttributeError, ImportError, KeyError) as err:
        import jax

        raise JaxInternalsError(f"{what} is not available in jax {jax.__version__} (lagom-jax checked it "
                                f"with jax {_CHECKED}): {type(err).__name__}: {err}") from err


def backends_started() -> bool:
    """Whether JAX's backends are up (after which platforms and plugins are fixed)."""
    with _internal("jax._src.xla_bridge.backends_are_initialized"):
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())


def gpu_backend_started() -> bool:
    """Whether a GPU backend is up in this process (so NCCL may have communicators)."""
    if not backends_started():
        return False
    with _internal("jax._src.xla_bridge.backends"):
        from jax._src import xla_bridge

        return any(p in ("gpu", "cuda", "rocm") for p in xla_bridge.backends())


def registered_platforms() -> set[str]:
    """Start JAX's backends and return the platforms whose plugins registered."""
    with _internal("jax._src.xla_bridge._backend_factories"):
        from jax._src import xla_bridge

        xla_bridge.backends()
        return set(xla_bridge._backend_factories)


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


# jax-cudaNN-pjrt releases whose plugin checks the CUDA runtime even when JAX's platforms
# exclude CUDA: before 0.9.2 (jax_plugins/xla_cuda12/__init__.py ``initialize``; 0.9.2
# added the ``should_validate`` test of ``jax_platforms``).
_PLUGIN_CHECKS_CUDA_ALWAYS_BEFORE = (0, 9, 2)


def allow_cuda_plugin_without_driver() -> None:
    """Let JAX's CUDA plugin register in a process on a machine without a CUDA driver.

    Deviceless compiling needs the plugin registered, not started. From jax-cuda12-pjrt
    0.9.2 on, the plugin skips its CUDA-runtime check when JAX's platforms exclude CUDA
    (what ``gpu_compile.prepare`` arranges); before 0.9.2 it always checks, fails on the
    missing runtime, and JAX drops it, unless ``JAX_SKIP_CUDA_CONSTRAINTS_CHECK`` is set
    when the backends start. So only for those releases this sets that variable (never
    overriding a value the user gave). Call it only where no driver exists: there the check
    could only fail.
    """
    for major in (12, 13):
        try:
            version = importlib.metadata.version(f"jax-cuda{major}-pjrt")
        except importlib.metadata.PackageNotFoundError:
            continue
        if _release(version) < _PLUGIN_CHECKS_CUDA_ALWAYS_BEFORE:
            os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def parse_xla_flags() -> None:
    """Make XLA parse ``XLA_FLAGS`` now: XLA reads them when the first ``CompileOptions``
    is built, and aborts the process on an unknown flag or a bad value (which is why
    ``flags.validate`` calls this in a child process)."""
    with _internal("jax._src.lib.xla_client.CompileOptions"):
        from jax._src.lib import xla_client

        xla_client.CompileOptions()


def is_jax_jit(fn: Any) -> bool:
    """Whether ``fn`` is a ``jax.jit`` (or pjit) function itself, not another wrapper."""
    return getattr(fn, "_jit_info", None) is not None  # jax's PjitInfo


def jit_statics(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(static_argnums, static_argnames) of a ``jax.jit`` function; empty for other wrappers."""
    info = getattr(jitted, "_jit_info", None)  # jax's PjitInfo
    if info is None:
        return (), ()
    return tuple(info.static_argnums or ()), tuple(info.static_argnames or ())


def distributed_state() -> tuple[Any, int, int]:
    """(key-value client or None, process id, number of processes) of ``jax.distributed``."""
    with _internal("jax._src.distributed.global_state"):
        from jax._src import distributed

        state = distributed.global_state
        return state.client, int(state.process_id or 0), int(state.num_processes or 1)


def _call_by_name(fn: Any, values: Mapping[str, Any]) -> Any:
    """``fn`` called with the entries of ``values`` its signature names, all by keyword.

    For a private function whose parameters came and went between releases while their
    names kept their meaning: ``pxla.create_compile_options`` took ``mesh``,
    ``spmd_lowering``, ``auto_spmd_lowering`` and ``pmap_nreps`` in 0.9.x, only ``mesh``
    and ``auto_spmd_lowering`` of them in 0.10.0, none from 0.10.1 on. A parameter it
    names that ``values`` lacks raises KeyError (a JaxInternalsError under ``_internal``).
    """
    import inspect

    return fn(**{name: values[name] for name in inspect.signature(fn).parameters})


@contextlib.contextmanager
def lowering_for(platforms: tuple[str, ...]) -> Iterator[None]:
    """Every ``jax.jit`` lowering made inside is for ``platforms`` unless it names its own.

    ``jit(f).lower(*args)`` is ``jit(f).trace(*args).lower()`` (``pjit.jit_lower``), and
    ``Traced.lower`` takes the platforms from the arguments' devices when given none. The
    wrappers users jit through (``eqx.filter_jit``, ``nnx.jit``, haliax's ``named_jit``) each
    call ``jax.jit(...).lower`` inside their own ``lower`` on the arrays they keep dynamic, so
    under this context a step whose arrays live on CPU devices is lowered with JAX's CUDA
    lowering rules, whatever wraps it. The default is swapped on JAX's ``Traced`` class for
    the duration, so a lowering another thread makes meanwhile is affected too.
    """
    with _internal("jax._src.stages.Traced.lower"):
        from jax._src import stages

        original = stages.Traced.lower

    def lower(self: Any, *, lowering_platforms: tuple[str, ...] | None = None, **kwargs: Any) -> Any:
        return original(self, lowering_platforms=lowering_platforms or tuple(platforms), **kwargs)

    stages.Traced.lower = lower
    try:
        yield
    finally:
        stages.Traced.lower = original


def compile_for_devices(lowered: Any, devices_for: Any, options: Mapping[str, Any] | None = None) -> str:
    """HLO text of a step lowered for another platform, compiled for ``devices_for(n)``.

    ``lowered`` comes from ``jitted.trace(...).lower(lowering_platforms=(...))``;
    ``devices_for`` maps the step's device count to that many devices of the platform.
    Shardings are fixed by the step as traced: XLA may not propagate new ones to its inputs
    or outputs. Nothing runs.
    """
    import numpy as np

    with _internal("Lowered._lowering.compile_args / pxla.create_compile_options / "
                   "compiler.backend_compile_and_load"):
        from jax._src import compiler
        from jax._src.interpreters import pxla
        from jax._src.lib import xla_client as xc

        compile_args = lowered._lowering.compile_args
        devices: Sequence[Any] = devices_for(compile_args["num_devices"])
        module = lowered.compiler_ir("stablehlo")
        client = devices[0].client
        compile_options = _call_by_name(pxla.create_compile_options, {
            "computation": module, "tuple_args": compile_args["tuple_args"],
            "allow_prop_to_inputs": [False] * len(compile_args["global_in_avals"]),
            "allow_prop_to_outputs": [False] * len(compile_args["global_out_avals"]),
            "backend": client, "np_dev": np.array(devices, dtype=object),
            "compiler_options": dict(options or {}),
            # Before 0.10.1 (the automatic SPMD partitioner's and pmap's parameters):
            "mesh": None, "auto_spmd_lowering": False, "spmd_lowering": True, "pmap_nreps": 1})
        executable = compiler.backend_compile_and_load(
            client, module, xc.DeviceList(tuple(devices)), compile_options, [])
        return executable.hlo_modules()[0].to_string()


def compile_hlo_for_devices(text: str, devices: Sequence[Any], *, replicas: bool = False,
                            spmd_partitioning: bool = False, shardy: bool = False,
                            options: Mapping[str, Any] | None = None) -> str:
    """HLO text of the HLO module ``text`` compiled for ``devices`` (e.g. abstract GPUs).

    The text is parsed by jaxlib's C++ HLO parser, converted to a StableHLO MLIR module
    (``_xla.mlir.hlo_to_stablehlo``, the route XLA's own tools take) and compiled by the
    devices' client as ``compile_for_devices`` does. ``replicas``: the devices are
    replicas (cross-replica collectives) instead of partitions; ``spmd_partitioning``:
    the module is a global view still to be partitioned (``shardy``: by Shardy). XLA's
    own errors propagate (``JaxRuntimeError``, ``ValueError``); moved internals raise
    ``JaxInternalsError``. Nothing runs.
    """
    import numpy as np

    with _internal("xla_client.hlo.hlo_module_from_text / _xla.mlir.hlo_to_stablehlo / "
                   "mlir.make_ir_context / compiler.get_compile_options"):
        from jax._src import compiler
        from jax._src.interpreters import mlir
        from jax._src.lib import xla_client as xc
        from jax._src.lib.mlir import ir

        hlo_to_stablehlo = xc._xla.mlir.hlo_to_stablehlo
        # xla_client.hlo from 0.10.2 on; jaxlib's extension module before.
        from_text = xc.hlo.hlo_module_from_text if hasattr(xc, "hlo") else xc._xla.hlo_module_from_text
        get_compile_options = compiler.get_compile_options
        make_ir_context = mlir.make_ir_context
        device_list = xc.DeviceList
    proto = from_text(text).as_serialized_hlo_module_proto()
    bytecode = hlo_to_stablehlo(proto)
    n = len(devices)
    grid = np.array(list(devices), dtype=object).reshape((n, 1) if replicas else (1, n))
    compile_options = get_compile_options(grid.shape[0], grid.shape[1], grid,
                                          env_options_overrides=dict(options or {}))
    build = compile_options.executable_build_options
    build.use_spmd_partitioning = bool(spmd_partitioning)
    build.use_shardy_partitioner = bool(shardy)
    with make_ir_context():
        module = ir.Module.parse(bytecode)
        executable = devices[0].client.compile(module, executable_devices=device_list(tuple(devices)),
                                               compile_options=compile_options)
    return executable.hlo_modules()[0].to_string()


@contextlib.contextmanager
def triton_kernels_for(device_kind: str) -> Iterator[None]:
    """Lower Pallas' Triton kernels (flash attention) for the GPU named ``device_kind``.

    From jax 0.11 the Triton lowering asks ``jax._src.pallas.triton.gpu_info.get_device_kind``
    which GPU it compiles for: the abstract mesh's device, else the default device. A step
    traced on CPU devices (a test host) and lowered for ``cuda`` answers "cpu" inside its
    ``shard_map`` and the lowering fails ("No supported GPU devices found"); for the duration
    of the lowering this answers the cluster's GPU instead. Before 0.11 the lowering takes
    the platform alone and this does nothing.
    """
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        gpu_info = None
    if gpu_info is None or not hasattr(gpu_info, "get_device_kind"):
        yield
        return
    saved = gpu_info.get_device_kind
    gpu_info.get_device_kind = lambda: device_kind
    try:
        yield
    finally:
        gpu_info.get_device_kind = saved
