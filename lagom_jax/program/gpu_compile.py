"""Compile a step for a GPU cluster on any machine: XLA's deviceless GPU compilation.

The module a GPU cluster runs is the one XLA's GPU pipeline makes: async collective
pairs, the GPU combiners, the latency-hiding scheduler, Triton and cuBLAS gemm fusions.
XLA can make it without a GPU. Given a device description (a ``GpuTargetConfigProto`` in
text form), the CUDA PJRT plugin's ``PJRT_GpuDeviceTopology_Create`` builds abstract
devices and ``StreamExecutorGpuCompiler`` compiles for them with no client
(openxla/xla ``xla/pjrt/c/pjrt_c_api_gpu_internal.cc``, ``xla/pjrt/gpu/se_gpu_pjrt_compiler.cc``).
From JAX this is ``jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=..., topology="1xHOSTSxGPUS")`` and the usual ``jit(...).lower(...).compile()``
on a mesh of those devices.

What it needs: JAX's CUDA plugin of jaxlib's version (``jax-cuda12-plugin`` and
``jax-cuda12-pjrt``, or CUDA 13's; ``pip install 'lagom-jax[deviceless]'``), and, on a
machine without a CUDA driver, JAX's platforms limited to the CPU before its backends
start (else the plugin's start-up check fails on ``cuInit`` and the plugin is dropped):
:func:`prepare` does that. No CUDA libraries are needed. A plugin of another version or
CUDA major is refused before it loads (``environment.problems``), with the install that
fixes it.

What it cannot do without a GPU: gemm autotuning. Gemms keep XLA's default Triton tiles;
an autotune-results file recorded on a real GPU (``xla_gpu_load_autotune_results_from``)
gives the real choices. So a process with no GPU asks XLA for no autotuning at all, and its
compiles share one kernel cache file (:func:`prepare`, ``_deviceless_xla_flags``).

The device descriptions are XLA's own (``lagom_jax/data/gpu_targets``, see SOURCE.md
there). Fields the installed jaxlib's proto does not know are dropped at load time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.resources
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.program import environment, fork_server, jax_internals

__all__ = ["CPU_FALLBACK_LOSS", "ChildAborted", "DevicelessUnavailable",
           "StepDevices", "answer_in_child", "compile_for_cluster", "compile_lowered",
           "compiler", "devices", "has_cuda_driver", "lower_for_cluster",
           "prepare", "run_isolated", "step_devices", "target_config", "topology_string", "unavailable_reason"]

# The CUDA 12 plugin (what lagom-jax installs) or CUDA 13's (newer jax on GPU hosts).
_PLUGIN_MODULES = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def _plugin_installed() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in _PLUGIN_MODULES)


class DevicelessUnavailable(RuntimeError):
    """This process cannot compile for abstract GPUs; the message says why and the fix."""


def has_cuda_driver() -> bool:
    """Whether a CUDA driver loads in this process (a GPU host)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _other_accelerator_plugins() -> list[str]:
    """JAX plugins installed besides CUDA's (ROCm, TPU, ...): their devices are not ours to hide."""
    import pkgutil

    try:
        import jax_plugins
    except ImportError:
        names = []
    else:
        names = [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    ours = {m.rpartition(".")[2] for m in _PLUGIN_MODULES}
    found = [n for n in names if n not in ours]
    if importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    return found


def prepare() -> None:
    """Make the deviceless route possible in this process, if JAX has not started yet.

    On a machine with no CUDA driver, the CUDA plugin registers only when JAX's platforms
    are limited to the CPU before its backends start; left to itself, JAX tries to start
    CUDA there, logs the plugin's traceback ("Unable to load CUDA. Is it installed?") and
    runs on the CPU anyway. So where the CUDA plugin is installed, no CUDA driver loads, no
    other accelerator plugin is installed and the user chose no platforms, JAX's platforms
    become "cpu": the devices a program sees are the ones it would have got, without the
    traceback, and the plugin stays registered for compiling. In every such process, whatever
    its platforms, the deviceless compiles get their XLA flags (``_deviceless_xla_flags``).
    ``import lagom_jax`` calls this. Nothing changes on a GPU machine or once the backends
    are up.
    """
    import jax

    if jax_internals.backends_started() or not _plugin_installed() or has_cuda_driver():
        return
    _deviceless_xla_flags()
    jax_internals.allow_cuda_plugin_without_driver()
    if jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or _other_accelerator_plugins():
        return
    jax.config.update("jax_platforms", "cpu")


# The file of compiled GPU kernels deviceless compiles share, and the size past which it starts afresh.
KERNEL_CACHE = "xla_gpu_kernels.bin"
KERNEL_CACHE_LIMIT = 256 * 2**20


def _deviceless_xla_flags() -> None:
    """XLA flags for a process whose GPU compiles are all deviceless (unless ``XLA_FLAGS`` sets them).

    - No GPU autotuning: without a GPU nothing can be timed, so a deviceless compile keeps
      XLA's default kernel configurations at any level; jaxlib 0.12's GPU pipeline nevertheless
      spends most of such a compile in its config-assigner pass (a two-layer Llama step: 6.5 of
      11 s; at level 0 the compile takes 3.7 s and the module differs only in fields of backend
      configs no price reads). jaxlib 0.10 compiles the same module at either level.
    - One kernel cache file for every deviceless compile (``xla_gpu_kernel_cache_file``, in
      ``files.cache_root()``): a compile's kernels are code-generated and assembled once and
      reused by the next compile with the same fusions (the structure search's recompiles, an
      advise's candidates, the next run). The HLO module, what the cost model reads, is made
      before code generation and does not change. XLA rewrites the file atomically (openxla/xla
      ``xla/service/gpu/kernel_reuse_cache.cc``), so processes may share it; past
      ``KERNEL_CACHE_LIMIT`` it starts afresh, since every compile reads and rewrites it whole.

    XLA reads ``XLA_FLAGS`` once, when it first compiles, so this acts only before JAX's
    backends start.
    """
    from lagom_jax import files

    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_autotune_level" not in flags:
        flags += " --xla_gpu_autotune_level=0"
    if "xla_gpu_kernel_cache_file" not in flags:
        path = files.cache_root() / KERNEL_CACHE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > KERNEL_CACHE_LIMIT:
                path.unlink()
            flags += f" --xla_gpu_kernel_cache_file={path}"
        except OSError:
            pass  # an unwritable cache folder: compile without the cache
    os.environ["XLA_FLAGS"] = flags.strip()


def unavailable_reason() -> str | None:
    """None when this process can compile for abstract GPUs, else why not and the fix.

    Starts JAX's backends (after :func:`prepare`): plugins register when they start.
    """
    found = environment.problems(environment.installed(), deviceless=True)
    if found:
        return "; ".join(found)
    if not _plugin_installed():
        return ("the CUDA PJRT plugin's module is missing (pip install --force-reinstall "
                "'lagom-jax[deviceless]')")
    prepare()
    if "cuda" not in jax_internals.registered_platforms():
        return ("the CUDA plugin did not register: JAX's backends started with CUDA enabled on a "
                "machine without a CUDA driver (import lagom_jax before the program first uses "
                "JAX, or set JAX_PLATFORMS=cpu)")
    return None


def compiler() -> str:
    """The plugin that compiles for abstract GPUs here, e.g. ``jax-cuda12-plugin 0.10.2``."""
    found = [p for p in environment.installed().plugins if p.plugin]
    return ", ".join(f"{p.name} {p.plugin}" for p in found) or "no CUDA plugin"


def topology_string(hw: hardware_lib.HardwareProfile, num_devices: int | None = None) -> str:
    """``partitions x hosts x GPUs-per-host`` for ``num_devices`` GPUs of ``hw``.

    A job smaller than one node runs on one host; a larger one must fill whole nodes.
    """
    n = hw.num_gpus if num_devices is None else num_devices
    if n < 1:
        raise ValueError(f"need at least one GPU, got {n}")
    if n <= hw.gpus_per_node:
        if hw.nodes != 1:
            raise ValueError(f"{n} GPUs fit in one node of {hw.name}, but the cluster has "
                             f"{hw.nodes} nodes; use nodes=1 or a mesh of "
                             f"{hw.num_gpus} devices")
        return f"1x1x{n}"
    if n != hw.num_gpus:
        raise ValueError(f"{n} devices do not match {hw.name} with {hw.nodes} node(s) of "
                         f"{hw.gpus_per_node} GPUs ({hw.num_gpus} GPUs); "
                         + (f"use {n // hw.gpus_per_node} nodes" if n % hw.gpus_per_node == 0
                            else f"use a multiple of {hw.gpus_per_node} devices"))
    return f"1x{hw.nodes}x{hw.gpus_per_node}"


# ------------------------------------------------------------------ device descriptions


def _raw_target(name: str) -> str:
    root = importlib.resources.files("lagom_jax") / "data" / "gpu_targets"
    known = sorted(p.name.removesuffix(".txtpb") for p in root.iterdir() if p.name.endswith(".txtpb"))
    if name not in known:
        raise ValueError(f"unknown GPU target {name!r} (known: {', '.join(known)})")
    return (root / f"{name}.txtpb").read_text()


@contextlib.contextmanager
def _captured_fd2():
    """Capture what C++ code writes to file descriptor 2 (XLA's parse errors go there)."""
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        box: list[str] = []
        try:
            yield box
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            box.append(tmp.read().decode("utf-8", "replace"))


_UNKNOWN_FIELD = re.compile(r'(\d+):(\d+): Message type "[\w.]+" has no field named "(\w+)"')


def _drop_field(text: str, line_no: int, field: str) -> str:
    """``text`` without the field starting on 1-based line ``line_no`` (a value or a block)."""
    lines = text.split("\n")
    i = line_no - 1
    if not re.match(rf"\s*{field}\s*[:{{]", lines[i]):
        raise ValueError(f"cannot find field {field!r} on line {line_no}")
    end = i
    if "{" in lines[i] and "}" not in lines[i]:
        depth = 0
        for end in range(i, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            if depth == 0:
                break
    return "\n".join(lines[:i] + lines[end + 1:])


def _require(what: str) -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise DevicelessUnavailable(f"cannot compile for {what} GPUs here: {reason}")


@functools.cache
def target_config(name: str) -> tuple[str, tuple[str, ...]]:
    """XLA's device description ``name`` as the installed jaxlib accepts it.

    Returns (text, fields dropped). The description is parsed by the installed proto
    through the plugin; each field it does not know (newer XLA adds fields) is removed.
    """
    from jax.experimental import topologies

    _require(name)
    text, dropped = _raw_target(name), []
    for _ in range(64):
        with _captured_fd2() as err:
            try:
                topologies.get_topology_desc(platform="cuda", topology_name="",
                                             target_config=text, topology="1x1x1")
                return text, tuple(dropped)
            except Exception as e:  # noqa: BLE001 - classified below
                failure = e
        match = _UNKNOWN_FIELD.search(err[0])
        if match is None:
            raise DevicelessUnavailable(
                f"XLA rejected the GPU description {name!r}: {failure}"
                + (f" ({err[0].strip().splitlines()[-1]})" if err[0].strip() else "")) from failure
        text = _drop_field(text, int(match.group(1)), match.group(3))
        dropped.append(match.group(3))
    raise DevicelessUnavailable(f"too many unknown fields in the GPU description {name!r}")


@functools.cache
def _topology(target: str, topology: str) -> Any:
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="cuda", topology_name="",
                                        target_config=target_config(target)[0], topology=topology)


def devices(hw: hardware_lib.HardwareProfile, num_devices: int | None = None) -> list[Any]:
    """``num_devices`` (default: all) abstract GPUs of ``hw``, host by host.

    Raises DevicelessUnavailable when this process cannot compile for them.
    """
    if not hw.xla_target:
        raise DevicelessUnavailable(f"hardware {hw.name!r} names no XLA GPU target "
                                    "(HardwareProfile.xla_target)")
    topo = topology_string(hw, num_devices)
    try:
        return list(_topology(hw.xla_target, topo).devices)
    except DevicelessUnavailable:
        raise
    except Exception as e:  # the plugin refused: say so with its words
        raise DevicelessUnavailable(f"cannot create {topo} {hw.gpu} GPUs: {e}") from e


def lower_for_cluster(fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                      hw: hardware_lib.HardwareProfile) -> Any:
    """JAX's ``Lowered`` of ``fn(*args, **kwargs)`` with JAX's CUDA lowering rules.

    ``fn`` is a jitted step of any wrapper (``jax.jit``, ``eqx.filter_jit``, ``nnx.jit``,
    haliax's ``named_jit``; ``lagom_jax.program.step``); its arguments may live on other
    devices (CPU devices of a test host): it is traced as usual and lowered for the
    ``cuda`` platform with its own shardings. Nothing runs.
    """
    from lagom_jax.program import step as step_lib

    # From jax 0.11 Pallas' Triton lowering (flash attention) asks which GPU it lowers for;
    # a step on CPU devices would answer "cpu".
    with jax_internals.triton_kernels_for(devices(hw, 1)[0].device_kind):
        return step_lib.jax_lowered(step_lib.lower(fn, tuple(args), kwargs, platform="cuda"))


def compile_lowered(lowered: Any, hw: hardware_lib.HardwareProfile,
                    options: Mapping[str, Any] | None = None) -> str:
    """HLO text of a step lowered for CUDA (:func:`lower_for_cluster`), compiled by XLA's GPU
    pipeline for as many abstract GPUs of ``hw`` as the step has devices, GPU i standing
    for device i. This reaches into JAX's internals (``jax_internals.compile_for_devices``):
    callers treat any exception as "not available" and go on without it."""
    return jax_internals.compile_for_devices(lowered, lambda n: devices(hw, n), options)


def compile_for_cluster(jitted: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                        hw: hardware_lib.HardwareProfile,
                        options: Mapping[str, Any] | None = None) -> str:
    """HLO text of ``jitted(*args, **kwargs)`` compiled by XLA's GPU pipeline for ``hw``
    (:func:`lower_for_cluster`, then :func:`compile_lowered`)."""
    return compile_lowered(lower_for_cluster(jitted, args, kwargs, hw), hw, options)


# What a plan loses when XLA:CPU's module stands in for the GPU one.
CPU_FALLBACK_LOSS = ("XLA:CPU's module has no async collectives and its own combiner and "
                     "fusion, so the plan tunes a different program than the GPUs run and its "
                     "predicted gains are rough")


@dataclasses.dataclass(frozen=True)
class StepDevices:
    """The devices a step for a GPU cluster is compiled on, and what that means.

    ``deviceless``: abstract GPUs of the cluster (XLA's GPU pipeline). Otherwise CPU
    devices stand in and ``warning`` says why and what is lost.
    """

    devices: tuple[Any, ...]
    where: str
    warning: str | None = None

    @property
    def deviceless(self) -> bool:
        return self.warning is None


def step_devices(hw: hardware_lib.HardwareProfile, num_devices: int) -> StepDevices:
    """Where to compile a step of ``num_devices`` devices of ``hw``, with XLA:CPU as fallback.

    Abstract GPUs when this process can make them (call before JAX's backends start, so
    :func:`prepare` can act); else the first ``num_devices`` CPU devices, whose count is
    raised to ``num_devices`` here if the backends have not started. Raises ValueError when
    ``num_devices`` does not fit the cluster and DevicelessUnavailable when neither route
    has enough devices.
    """
    import jax

    topology_string(hw, num_devices)  # the mesh and the cluster agree, or ValueError
    if not jax_internals.backends_started() and jax.config.jax_num_cpu_devices < num_devices:
        jax.config.update("jax_num_cpu_devices", num_devices)
    prepare()
    try:
        return StepDevices(tuple(devices(hw, num_devices)),
                           f"XLA:GPU deviceless compile for {num_devices}x {hw.gpu}")
    except DevicelessUnavailable as err:
        reason = str(err)
    try:
        cpu = jax.devices("cpu")
    except RuntimeError:  # the user limited JAX to other platforms
        cpu = []
    if len(cpu) < num_devices:
        raise DevicelessUnavailable(
            f"{reason}; the XLA:CPU fallback has {len(cpu)} devices, not {num_devices} (set "
            f"jax_num_cpu_devices={num_devices} before JAX starts)")
    return StepDevices(tuple(cpu[:num_devices]),
                       f"XLA:CPU compile on {num_devices} fake CPU devices",
                       f"{reason}. Falling back to XLA:CPU's module: {CPU_FALLBACK_LOSS}")


# ------------------------------------------------------------- a built-in model's step


class ChildAborted(RuntimeError):
    """A child process of :func:`run_isolated` died without an answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"status {status}: {detail}")
        self.status, self.detail = status, detail


def run_isolated(module: str, spec: Mapping[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """``module._child(spec_path)`` in a fresh process limited to JAX's CPU platform; the JSON
    object it writes beside the spec.

    XLA's compilers abort the whole process on some inputs, which must cost the child, not
    the caller. Raises TimeoutError past ``timeout_s`` and ChildAborted when the child ends
    without an answer (``detail``: glog's fatal line, else the end of its stderr). The child
    is forked from a server that has JAX and lagom-jax imported (``fork_server``), else, where
    no server runs, started as a new interpreter.
    """
    with tempfile.TemporaryDirectory(prefix="lagom-compile-") as tmp:
        path = os.path.join(tmp, "spec.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(spec, fh)
        err_path = os.path.join(tmp, "stderr.txt")
        # The child never needs a real GPU; on a GPU host this also keeps it off the GPUs.
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        try:
            status = fork_server.run_child(module, path, err_path, env, timeout_s)
            stderr = pathlib.Path(err_path).read_text(errors="replace") if os.path.exists(err_path) else ""
        except fork_server.ServerGone:
            try:
                proc = subprocess.run([sys.executable, "-c", f"from {module} import _child; _child({path!r})"],
                                      env=env, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"the child took over {timeout_s:.0f} s") from None
            status, stderr = proc.returncode, proc.stderr
        out_path = path + ".out"
        if status or not os.path.exists(out_path):
            # glog's fatal line: "F1122 03:20:49.438142 18858 file.cc:1615] message"
            fatal = next((ln.partition("] ")[2] for ln in stderr.splitlines()
                          if ln.startswith("F") and "] " in ln), "")
            raise ChildAborted(status, fatal or stderr[-300:])
        with open(out_path, encoding="utf-8") as fh:
            return json.load(fh)


def answer_in_child(spec_path: str, work: Callable[[dict[str, Any]], Any]) -> None:
    """The child side of :func:`run_isolated` for a compile of a valid step: ``work(spec)``'s
    result (a dataclass) written beside the spec as ``{"result", "error", "crash"}``. A
    refused step or setup (ValueError, DevicelessUnavailable) is an ``error``; anything else
    XLA raised is a ``crash``, the compiler failing on a valid step."""
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    try:
        out = {"result": dataclasses.asdict(work(spec)), "error": None, "crash": None}
    except (ValueError, DevicelessUnavailable) as e:
        out = {"result": None, "error": str(e), "crash": None}
    except Exception as e:  # noqa: BLE001 - XLA refused a valid step: say how
        out = {"result": None, "error": None, "crash": f"{type(e).__name__}: {e}"}
    with open(spec_path + ".out", "w", encoding="utf-8") as fh:
        json.dump(out, fh)
