"""Every use of JAX's private internals, in one place.

lagom-jax reaches below JAX's public API for six things: whether backends (a GPU one)
have started and which plugins registered, a jitted function's static arguments, the
``jax.distributed`` client that shares one Plan between processes, compiling a lowered
step for devices of another platform (abstract GPUs), and compiling an HLO module given
as text for such devices. Each is checked with
``CHECKED_JAX``; on another version an attribute that moved raises ``JaxInternalsError``
naming it, and every caller treats that as "not available" (tuning goes on without it,
or the step runs untuned with a warning).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

CHECKED_JAX = "0.10.2"


class JaxInternalsError(RuntimeError):
    """A JAX internal lagom-jax relies on is not where it was in ``CHECKED_JAX``."""


@contextlib.contextmanager
def _internal(what: str) -> Iterator[None]:
    try:
        yield
    except (AttributeError, ImportError, KeyError) as err:
        import jax

        raise JaxInternalsError(f"{what} is not available in jax {jax.__version__} (lagom-jax checked it "
                                f"with jax {CHECKED_JAX}): {type(err).__name__}: {err}") from err


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
        compile_options = pxla.create_compile_options(
            module, compile_args["tuple_args"], [False] * len(compile_args["global_in_avals"]),
            [False] * len(compile_args["global_out_avals"]), client,
            np.array(devices, dtype=object), dict(options or {}))
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
        from_text = xc.hlo.hlo_module_from_text
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
