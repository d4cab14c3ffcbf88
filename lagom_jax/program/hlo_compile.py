"""HLO *before* XLA's optimizations, compiled by XLA's GPU pipeline for abstract GPUs.

XLA's benchmark programs (openxla/xla ``xla/tools/benchmarks/hlo/*.hlo``: Llama 3.1
8B/70B/405B, Mixtral 8x7B on 1x8 to 64x8 GPUs) and the modules an XLA dump writes before
its pipeline (``*.before_optimizations.txt``, or ``*.after_spmd-partitioning*.txt``) are
programs no GPU runs as written: no fusions, no async collective pairs, no schedule. This
module tells such a module from one XLA already compiled (:func:`classify`), says for how
many devices it was written (:func:`partitions`) and compiles it deviceless with XLA's
GPU pipeline for abstract GPUs of a hardware profile (:func:`compile_unoptimized`), so it
can be tuned like any compiled module.

Two kinds of unoptimized module are compiled:

* **per-device** (the benchmark modules, a dump after SPMD partitioning): explicit
  collectives over N devices; compiled with SPMD partitioning off.
* **global view** (a JAX dump's ``before_optimizations.txt``): sharding annotations
  (``custom_call_target="Sharding"``, Shardy's ``xla.sdy`` attributes) that XLA's SPMD
  partitioner turns into collectives; compiled with SPMD partitioning on (Shardy when the
  module carries Shardy attributes).

Custom calls the installed jaxlib has no handler for (Transformer Engine's fused attention
in XLA's Llama and Mixtral benchmark modules) are mocked for the compile here with XLA's
``xla_gpu_mock_custom_calls`` (:func:`compile_options`); they stay in the compiled module
and ``custom_calls`` prices them. Before XLA sees them they lose their pinned operand
layouts (:func:`portable_text`), the one part of them jax 0.12's plugin cannot take. A
module before SPMD partitioning that uses JAX's ``custom_partitioning`` cannot be
partitioned from its text and is refused in one line.

The way from HLO text to the compiler goes through StableHLO (jaxlib 0.10.2's PJRT
compile takes an MLIR module only; ``jax_internals.compile_hlo_for_devices``). Two kinds
of HLO do not survive that way and are rewritten first, each to an equivalent form
(:func:`portable_text`): a ``copy`` of an array (MHLO's copy has no StableHLO form: it
becomes a ``reshape`` to the same shape, a no-op like the copy, which JAX emits for
``sharding_constraint``) and replica groups in mesh form (``mesh['x'=8] {'x'}``, what
jaxlib 0.10.2 prints; the StableHLO export needs a mesh symbol the module does not have:
they become the explicit ``{{0,1,...}}`` list of the same groups). A third kind crosses,
but not to the plugin of jax 0.12: a custom call with ``operand_layout_constraints`` becomes
a StableHLO ``custom_call`` with operand and result layouts, which the serialization to the
plugin's older StableHLO version (1.16.3 for jax-cuda12-plugin 0.12.0.1; StableHLO's VHLO
downgrade of ``custom_call``, ``stablehlo/transforms/VhloToVersion.cpp``) refuses ("Failed to
serialize StableHLO to plugin version"). XLA's benchmark modules pin the layouts of every
Transformer Engine call, so on jax 0.12 none of them compiled. The calls stood in for
(``custom_calls.needs_mock``: no handler here, mocked into a no-op) lose the pin: their
layouts are the default ones in every benchmark module checked (Llama 3 8B context-parallel
and activation offloading, Llama 3.1 70B, Mixtral 8x7B 2x8), which XLA's layout assignment
gives an unconstrained custom call anyway (jax 0.10.2 compiles the same module with or
without the pin, fingerprint aside), and the call keeps its operands, result shapes and
backend config, so it is priced from the same configuration. A call some handler here serves keeps its
layouts (a cuSOLVER call's column-major operands matter).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.program import custom_calls, gpu_compile, hlo as hlo_lib, jax_internals

__all__ = ["COLLECTIVE_OPCODES", "CUDA_LOWERING_HOWTO", "HloCompileError", "Layout", "classify", "compile_options",
           "compile_unoptimized", "cpu_compiled", "cpu_lowered", "layout", "partitions", "portable_text"]


class HloCompileError(ValueError):
    """The installed jaxlib cannot compile this HLO module; the message is one line."""


# Collectives as they appear in a module before XLA's pipeline (sync forms only).
COLLECTIVE_OPCODES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-broadcast", "ragged-all-to-all",
})
# Opcodes only XLA's pipeline makes (JAX's lowering and the SPMD partitioner never emit
# them). ``send``/``recv``/``send-done``/``recv-done`` are not here: JAX emits them.
_COMPILED_OPCODES = frozenset({
    "fusion", "async-start", "async-update", "async-done", "all-reduce-start",
    "all-reduce-done", "all-gather-start", "all-gather-done", "collective-permute-start",
    "collective-permute-done", "copy-start", "copy-done", "bitcast",
})
# Custom calls that XLA's GPU pipeline writes (gemm and convolution rewriters).
_COMPILED_CUSTOM_CALL = re.compile(r"^(__cublas\$|__cudnn\$conv|__cudnn\$norm)")
# Custom calls that only a module before SPMD partitioning has.
_SPMD_CUSTOM_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "CustomSPMDPartitioning"})


def _module(text: str | hlo_lib.Module) -> hlo_lib.Module:
    return text if isinstance(text, hlo_lib.Module) else hlo_lib.parse(text)


def _instructions(module: hlo_lib.Module):
    for comp in module.computations:
        yield from comp.instructions


def classify(text: str | hlo_lib.Module) -> tuple[bool, str]:
    """(whether ``text`` is a module before XLA's optimizations, why).

    The rule, in order: a module is *compiled* (False) when its header says
    ``is_scheduled=true`` (every backend's pipeline ends by scheduling), or when any
    computation holds an instruction only XLA's pipeline makes: a ``fusion``, an async
    pair (``async-start``/``-update``/``-done``, ``all-reduce-start``, ``all-gather-start``,
    ``collective-permute-start``, ``copy-start`` and their ``-done``), a ``bitcast`` (the
    algebraic simplifier's; JAX's bitcasts are ``bitcast-convert``), or a custom call to
    cuBLAS or a cuDNN convolution/norm (GPU rewriters). Otherwise it is *unoptimized*
    (True). ``send``/``recv`` pairs do not count: JAX emits them for host transfers.
    Raises ``hlo.HloParseError`` (a ValueError) when ``text`` is not HLO.
    """
    module = _module(text)
    if module.is_scheduled:
        return False, "the module is scheduled (is_scheduled=true): XLA's pipeline ran"
    for inst in _instructions(module):
        if inst.opcode in _COMPILED_OPCODES:
            return False, (f"{inst.name} is a '{inst.opcode}', which only XLA's pipeline "
                           f"makes (line {inst.line})")
        if inst.opcode == "custom-call":
            target = inst.attributes.get("custom_call_target", "").strip('"')
            if _COMPILED_CUSTOM_CALL.match(target):
                return False, (f"{inst.name} calls {target}, which only XLA's GPU pipeline "
                               f"writes (line {inst.line})")
    kinds = sorted({i.opcode for i in _instructions(module) if i.opcode in COLLECTIVE_OPCODES})
    return True, ("no schedule, fusion, async pair, bitcast or GPU library call: XLA's "
                  "pipeline has not run" + (f" (collectives: {', '.join(kinds)})" if kinds
                                            else " (no collectives)"))


def _max_device_id(module: hlo_lib.Module) -> int:
    """The largest device id any collective names (-1 when none names one)."""
    top = -1
    for inst in _instructions(module):
        for group in inst.replica_groups():
            top = max(top, *group) if group else top
        for pair in inst.source_target_pairs():
            top = max(top, *pair)
    return top


# A tiled sharding's tile assignment (``devices=[8,1]<=[8]``, ``devices=[2,4]0,1,...``,
# ``devices=[1,1,8]<=[8] last_tile_dim_replicate``): its dims multiply to its device count.
_TILED = re.compile(r"devices=\[([\d,]+)\]")
_MAXIMAL = re.compile(r"maximal device=(\d+)")
# A Shardy mesh in the header's frontend attributes: ``#sdy.mesh<["data"=8, "model"=2]>``.
_SDY_MESH = re.compile(r"#sdy\.mesh<\[([^\]]*)\]")
_SDY_AXIS = re.compile(r'=\s*(\d+)')


def _sharding_devices(module: hlo_lib.Module) -> int:
    """The most devices any sharding annotation or Shardy mesh of the module names (0: none).

    A module before SPMD partitioning (``lowered.as_text(dialect="hlo")``) states its device
    count only here: its header has no ``num_partitions`` and its collectives are still to be
    made by the partitioner.
    """
    top = 0
    texts = [module.attributes.get("frontend_attributes", "")]
    for inst in _instructions(module):
        sharding = inst.attributes.get("sharding")
        if sharding:
            texts.append(sharding)
    for text in texts:
        for dims in _TILED.findall(text):
            top = max(top, math.prod(int(d) for d in dims.split(",") if d))
        for device in _MAXIMAL.findall(text):
            top = max(top, int(device) + 1)
        for axes in _SDY_MESH.findall(text):
            top = max(top, math.prod(int(n) for n in _SDY_AXIS.findall(axes)))
    return top


def partitions(text: str | hlo_lib.Module, override: int | None = None) -> int:
    """How many devices the module was written for.

    ``override`` when given (>= 1). Else the largest of the header's device count
    (``replica_count`` x ``num_partitions``, each 1 when absent), one more than the largest
    device id in any collective's ``replica_groups`` (every printed form: explicit, iota,
    mesh) or ``source_target_pairs``, and the devices its sharding annotations or Shardy
    mesh name (``sharding={devices=[8,1]<=[8]}``: 8). The groups decide for modules whose
    header says nothing (XLA's Llama 3.1 70B benchmark has no ``num_partitions``; its
    groups ``[2,64]<=[128]`` say 128); the shardings for a step JAX lowered but did not
    partition (``lowered.as_text(dialect="hlo")``); an empty ``replica_groups={}`` (all
    devices) says nothing.
    """
    if override is not None:
        if override < 1:
            raise ValueError(f"partitions must be >= 1, got {override}")
        return int(override)
    module = _module(text)
    return max(module.num_devices, _max_device_id(module) + 1, _sharding_devices(module))


# What only XLA:CPU's pipeline writes: its backend configs (``outer_dimension_partitions``,
# ``fusion_config``: xla/service/cpu/backend_config.proto; XLA:GPU's are
# ``operation_queue_id``/``fusion_backend_config``, xla/service/gpu/backend_configs.proto)
# and its library calls (oneDNN, XNNPACK/YNNPACK fusions).
_CPU_BACKEND_KEYS = ('"outer_dimension_partitions"', '"fusion_config"')
_CPU_CUSTOM_CALL = re.compile(r"^(__onednn\$|__xnn|__ynn)")


def cpu_compiled(text: str | hlo_lib.Module) -> str:
    """Why ``text`` is a module XLA:CPU compiled ("" when nothing says so).

    On a host without a GPU, ``jit(f).lower(...).compile().as_text()`` is XLA:CPU's module:
    its fusions, layouts and collectives are the CPU backend's, not the program a GPU runs.
    """
    for inst in _instructions(_module(text)):
        config = inst.attributes.get("backend_config", "")
        for key in _CPU_BACKEND_KEYS:
            if key in config:
                return f"{inst.name} has XLA:CPU's backend config {key} (line {inst.line})"
        if inst.opcode == "custom-call" or inst.attributes.get("kind") == "kCustom":
            target = inst.attributes.get("custom_call_target", "").strip('"')
            if _CPU_CUSTOM_CALL.match(target):
                return f"{inst.name} calls {target}, an XLA:CPU library (line {inst.line})"
    return ""


# Custom calls JAX's CPU lowering rules emit (LAPACK, host callbacks, DUCC's FFT); the CUDA
# rules call cuSOLVER, GPU callbacks and cuFFT instead.
_CPU_LOWERED_CALL = re.compile(r"^(lapack_|xla_ffi_python_cpu_callback|xla_python_cpu_callback|ducc_fft)")


def cpu_lowered(text: str | hlo_lib.Module) -> str:
    """Why a module before optimization was lowered by JAX for the CPU ("" when nothing says so).

    ``jit(f).lower(...)`` lowers for the platform of the arguments' devices. Most rules are
    the same for every platform, so most CPU lowerings are the CUDA one; where they differ,
    the module shows it: a custom call of the CPU's libraries, or JAX's threefry random bits
    as a rolled loop (``random/threefry2x32.py``: the CPU rule rolls its rounds, the default
    one used for CUDA unrolls them).
    """
    module = _module(text)
    for comp in module.computations:
        rolled = comp.name.lstrip("%").startswith("threefry2x32") and any(
            i.opcode == "while" for i in comp.instructions)
        if rolled:
            return f"its threefry random bits are the CPU's rolled loop (computation {comp.name})"
        for inst in comp.instructions:
            if inst.opcode == "custom-call":
                target = inst.attributes.get("custom_call_target", "").strip('"')
                if _CPU_LOWERED_CALL.match(target):
                    return f"{inst.name} calls {target}, a CPU library (line {inst.line})"
    return ""


# How to dump what ``tune`` needs from a host without a GPU.
CUDA_LOWERING_HOWTO = ("jax.jit(step).trace(*args).lower(lowering_platforms=('cuda',)).as_text(dialect='hlo'), "
                       "or tune the step in Python with lagom_jax.tune(..., plan_dir=DIR), which writes the same "
                       "as DIR/<module>/step.hlo (docs/hlo.md)")


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a module is compiled: its device count and what its devices are to XLA.

    ``replicas``: the collectives are cross-replica (no ``channel_id``, or a
    ``replica_count`` header), so the devices are replicas; else partitions.
    ``spmd_partitioning``: a global view to be partitioned by XLA (``shardy``: Shardy's).
    """

    devices: int
    replicas: bool
    spmd_partitioning: bool
    shardy: bool
    why: str


def layout(text: str | hlo_lib.Module, partitions_override: int | None = None) -> Layout:
    """The :class:`Layout` of an unoptimized module.

    Replicas or partitions: ``num_partitions`` > 1 in the header means partitions;
    ``replica_count`` > 1 means replicas; a header with neither (the 70B benchmark) goes
    by its collectives: any with a ``channel_id`` (cross-partition, as JAX's SPMD output
    writes them, ``use_global_device_ids`` included) means partitions, collectives all
    without one mean replicas, no collectives means partitions. SPMD partitioning is on
    when the module still has the partitioner's inputs: a ``Sharding`` /
    ``SPMDFullToShardShape`` / ``SPMDShardToFullShape`` custom call or Shardy's
    ``xla.sdy`` attributes; a per-device module's leftover ``sharding=`` on parameters
    does not count.
    """
    module = _module(text)
    n = partitions(module, partitions_override)
    header_p = int(module.attributes.get("num_partitions", "1"))
    header_r = int(module.attributes.get("replica_count", "1"))
    colls = [i for i in _instructions(module) if i.opcode in COLLECTIVE_OPCODES]
    if header_p > 1:
        replicas, why = False, f"num_partitions={header_p} in the header"
    elif header_r > 1:
        replicas, why = True, f"replica_count={header_r} in the header"
    elif colls:
        replicas = not any("channel_id" in i.attributes for i in colls)
        why = ("collectives without channel_id (cross-replica)" if replicas
               else "collectives with channel_id (cross-partition)")
    else:
        replicas, why = False, "no collectives"
    shardy = "xla.sdy" in text if isinstance(text, str) else any(
        "xla.sdy" in i.source for i in _instructions(module))
    spmd = shardy or any(
        i.opcode == "custom-call"
        and i.attributes.get("custom_call_target", "").strip('"') in _SPMD_CUSTOM_CALLS
        for i in _instructions(module))
    return Layout(n, replicas, spmd, shardy, why)


def _explicit_groups(groups: tuple[tuple[int, ...], ...]) -> str:
    return "{" + ",".join("{" + ",".join(str(d) for d in g) + "}" for g in groups) + "}"


_LAYOUTS = "operand_layout_constraints"
_COPY_RE = re.compile(r"(=\s*[a-z0-9]+\[[^\]]*\](?:\{[^}]*\})?\s+)copy\(")


def _drop_layout_constraints(lines: list[str], inst: hlo_lib.Instruction) -> bool:
    """Remove ``inst``'s ``operand_layout_constraints`` from ``lines`` (its first line, or
    the next ones for an instruction printed over several); whether it was there."""
    raw = inst.attributes.get(_LAYOUTS)
    if raw is None or not inst.line:
        return False
    attr = f"{_LAYOUTS}={raw}"
    for i in range(inst.line - 1, min(len(lines), inst.line - 1 + max(1, inst.source.count("\n") + 1))):
        for cut in (", " + attr, attr + ", ", attr):
            if cut in lines[i]:
                lines[i] = lines[i].replace(cut, "", 1)
                return True
    return False


def portable_text(text: str, module: hlo_lib.Module | None = None) -> tuple[str, tuple[str, ...]]:
    """``text`` with the HLO that cannot cross to StableHLO rewritten; (text, what changed).

    An array ``copy`` becomes a same-shape ``reshape``, mesh-form replica groups become
    explicit lists, and a custom call stood in for (``custom_calls.needs_mock``: no handler
    here) loses its ``operand_layout_constraints`` (see the module docstring). Tuple copies
    are left alone. ``module``: ``text`` already parsed (a 4 MB module takes about a second).
    """
    module = module if module is not None else hlo_lib.parse(text)
    lines = text.split("\n")
    copies = unpinned = 0
    groups: dict[str, str] = {}
    for inst in _instructions(module):
        if inst.opcode == "copy" and not inst.shape.is_tuple and inst.line:
            new, k = _COPY_RE.subn(r"\1reshape(", lines[inst.line - 1], count=1)
            if k:
                lines[inst.line - 1] = new
                copies += 1
        if custom_calls.needs_mock(custom_calls.custom_call_target(inst)):
            unpinned += _drop_layout_constraints(lines, inst)
        raw = inst.attributes.get("replica_groups")
        if raw is not None and raw.lstrip().startswith("mesh"):
            groups[raw] = _explicit_groups(inst.replica_groups())
    out = "\n".join(lines)
    for raw, explicit in groups.items():
        out = out.replace(f"replica_groups={raw}", f"replica_groups={explicit}")
    changes = []
    if copies:
        changes.append(f"{copies} copy -> reshape")
    if groups:
        changes.append(f"{len(groups)} mesh replica-group forms -> explicit lists")
    if unpinned:
        changes.append(f"{unpinned} stood-in custom calls' operand layouts unpinned")
    return out, tuple(changes)


def _one_line(err: BaseException | str, limit: int = 400) -> str:
    msg = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    # XLA's MLIR errors put the reason after a "Detailed error from MLIR:" line.
    for i, ln in enumerate(lines):
        if ln.startswith("Detailed error from MLIR") and i + 1 < len(lines):
            lines = [lines[0].rstrip(";"), lines[i + 1]]
            break
    text = " | ".join(lines[:2]) if lines else "unknown error"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compile_here(text: str, hw: hardware_lib.HardwareProfile, lay: Layout,
                  options: Mapping[str, Any] | None) -> str:
    try:
        devices = gpu_compile.devices(hw, lay.devices)
    except ValueError as e:  # the module's device count does not fit the cluster
        raise HloCompileError(f"the module is for {lay.devices} devices: {_one_line(str(e))}") from None
    try:
        return jax_internals.compile_hlo_for_devices(
            text, devices, replicas=lay.replicas, spmd_partitioning=lay.spmd_partitioning,
            shardy=lay.shardy, options=options)
    except jax_internals.JaxInternalsError as e:
        raise gpu_compile.DevicelessUnavailable(str(e)) from e
    except Exception as e:  # noqa: BLE001 - XLA refused the module: say so in one line
        unserved = "" if (options or {}).get(custom_calls.MOCK_OPTION) else _unserved_calls(text)
        raise HloCompileError(f"XLA cannot compile this module for {lay.devices} "
                              f"{hw.gpu}{unserved}: {_one_line(e)}") from None


def _unserved_calls(text: str) -> str:
    """", it calls T1, T2 with no handler here" for the custom calls only an outside FFI
    library serves (jax 0.12 fails on them before naming them: serializing the module)."""
    try:
        found = custom_calls.stand_ins(hlo_lib.parse(text))
    except ValueError:
        return ""
    targets = sorted({s.target for s in found})
    return f" (it calls {', '.join(targets)}, which no handler here serves)" if targets else ""


def compile_options(module: hlo_lib.Module, options: Mapping[str, Any] | None
                    ) -> tuple[dict[str, Any], tuple[custom_calls.StandIn, ...]]:
    """The XLA options to compile ``module`` with here, and the custom calls stood in for.

    ``options`` plus ``xla_gpu_mock_custom_calls=true`` where the module calls a target
    the installed XLA has no handler for (``custom_calls.stand_ins``: Transformer Engine's
    fused attention in XLA's benchmark modules), unless ``options`` sets it already. The
    option is for this compile only; the caller keeps it out of every Plan.
    """
    found = custom_calls.stand_ins(module)
    out = dict(options or {})
    if found:
        out.setdefault(custom_calls.MOCK_OPTION, True)
    return out, (found if out.get(custom_calls.MOCK_OPTION) else ())


def compile_unoptimized(text: str, hw: hardware_lib.HardwareProfile, *,
                        partitions: int | None = None, options: Mapping[str, Any] | None = None,
                        isolated: bool = True, timeout_s: float = 1800.0) -> str:
    """HLO text of the unoptimized module ``text`` compiled by XLA's GPU pipeline for ``hw``.

    Compiled for ``partitions`` (default :func:`partitions` of the module) abstract GPUs
    of ``hw`` (``gpu_compile.devices``; a count above one node must equal
    ``hw.num_gpus``), with the :func:`layout` of the module and the XLA ``options``
    (``xla_gpu_*`` debug options, as for ``gpu_compile``), plus the mock of custom calls
    without a handler (:func:`compile_options`). Nothing runs.

    ``isolated`` (default): compile in a fresh process, so an XLA abort costs that
    process, not the caller. Otherwise in this process, after ``gpu_compile.prepare()``
    (so call it before JAX's backends start). Raises ``HloCompileError`` (one line,
    XLA's message) when the text is not HLO, is already compiled, does not fit ``hw`` or
    XLA refuses it, and ``gpu_compile.DevicelessUnavailable`` when this machine cannot
    compile for abstract GPUs at all.
    """
    try:
        module = hlo_lib.parse(text)
    except ValueError as e:
        raise HloCompileError(f"not an HLO module: {_one_line(str(e))}") from None
    unopt, why = classify(module)
    if not unopt:
        raise HloCompileError(f"the module is already compiled ({why})")
    lay = layout(text, partitions)
    custom_rules = sum(1 for i in _instructions(module) if i.opcode == "custom-call"
                       and i.attributes.get("custom_call_target", "").strip('"') == "CustomSPMDPartitioning")
    if custom_rules:
        raise HloCompileError(
            f"the module is before SPMD partitioning and calls CustomSPMDPartitioning x{custom_rules} "
            "(jax.experimental.custom_partitioning): its partitioning rules are Python callbacks of the "
            "process that traced it, which HLO text does not carry, so XLA cannot partition it here; "
            "dump the module after SPMD partitioning (--xla_dump_hlo_pass_re=spmd-partitioning) instead")
    options, _ = compile_options(module, options)
    portable, _ = portable_text(text, module)
    if not isolated:
        gpu_compile.prepare()
        return _compile_here(portable, hw, lay, options)
    spec = {"text": portable, "hardware": hw.to_dict(), "layout": dataclasses.asdict(lay),
            "options": dict(options or {})}
    try:
        out = gpu_compile.run_isolated("lagom_jax.program.hlo_compile", spec, timeout_s=timeout_s)
    except TimeoutError:
        raise HloCompileError(f"compiling the module took over {timeout_s:.0f} s") from None
    except gpu_compile.ChildAborted as e:
        raise HloCompileError(f"XLA's compiler aborted (status {e.status}): "
                              f"{_one_line(e.detail or 'no message')}") from None
    if out.get("unavailable"):
        raise gpu_compile.DevicelessUnavailable(out["unavailable"])
    if out.get("error"):
        raise HloCompileError(out["error"])
    return out["text"]


def _child(spec_path: str) -> None:
    """compile_unoptimized's other side: compile the spec, write the answer beside it."""
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    hw = hardware_lib.HardwareProfile.from_dict(spec["hardware"])
    lay = Layout(**spec["layout"])
    start = time.perf_counter()
    try:
        gpu_compile.prepare()
        out = {"text": _compile_here(spec["text"], hw, lay, spec["options"])}
    except gpu_compile.DevicelessUnavailable as e:
        out = {"unavailable": str(e)}
    except HloCompileError as e:
        out = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - anything else XLA raised: one line
        out = {"error": f"XLA cannot compile this module: {_one_line(e)}"}
    out["seconds"] = time.perf_counter() - start
    with open(spec_path + ".out", "w", encoding="utf-8") as fh:
        json.dump(out, fh)
