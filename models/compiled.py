"""A built-in model's train step compiled for a cluster: XLA's GPU pipeline on abstract GPUs
of the cluster (deviceless), else XLA:CPU on as many CPU devices, in this process or in a
fresh one (``compile_builtin_isolated``, for callers that compile many steps)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.program import gpu_compile

from .build import build
from .sharding import parse_mesh


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """The HLO text of a compiled step, which compiler made it, and why, if not the GPU's."""

    text: str
    where: str
    warning: str | None = None


def compile_builtin(hw: hardware_lib.HardwareProfile, model: str, config: str, recipe: str,
                    mesh: str, compiler_options: Mapping[str, Any] | None = None,
                    **build_kwargs: Any) -> CompiledStep:
    """A built-in model's train step (``lagom_jax.models.build``) compiled for ``hw``.

    XLA's GPU pipeline for abstract GPUs of the cluster, else XLA:CPU on as many CPU
    devices (:func:`lagom_jax.program.gpu_compile.step_devices`); in this process, so for the XLA:CPU fallback JAX's
    backends must not have started yet. ``build_kwargs`` go to ``build`` (batch_size,
    seq_len, dtype, microbatches). Raises ValueError when ``build`` rejects the step.
    """
    n = math.prod(parse_mesh(mesh).values())
    target = gpu_compile.step_devices(hw, n)
    built = build(model, config, recipe, mesh, devices=target.devices, **build_kwargs)
    return CompiledStep(built.compiled_text(compiler_options), target.where, target.warning)


class CompileCrash(RuntimeError):
    """XLA's compiler killed the process that compiled a step (the step is valid; the
    compiler cannot compile it)."""


def compile_builtin_isolated(hw: hardware_lib.HardwareProfile, model: str, config: str,
                             recipe: str, mesh: str, *, timeout_s: float = 1800.0,
                             **build_kwargs: Any) -> CompiledStep:
    """:func:`compile_builtin` in a fresh process.

    For callers that compile many steps: the XLA:CPU fallback needs as many CPU devices as
    the mesh, and a process's count is fixed once JAX starts; and XLA's compilers abort
    the whole process on some valid steps (jaxlib 0.10.2's CPU pipeline: a CHECK in
    AllReducePromotion on bfloat16 GPipe steps), which must cost one step, not the
    caller. Raises ValueError when ``build`` rejects the step and CompileCrash when the
    compiler fails (with its error or fatal line) or runs past ``timeout_s``.
    """
    spec = {"hardware": hw.to_dict(), "model": model, "config": config, "recipe": recipe,
            "mesh": mesh, "build_kwargs": build_kwargs}
    what = f"{model} {config} {recipe} [{mesh}] {build_kwargs.get('dtype', '')}".rstrip()
    try:
        out = gpu_compile.run_isolated("lagom_jax.models.compiled", spec, timeout_s=timeout_s)
    except TimeoutError:
        raise CompileCrash(f"compiling {what} took over {timeout_s:.0f} s") from None
    except gpu_compile.ChildAborted as e:
        raise CompileCrash(f"XLA's compiler aborted on {what} (status {e.status}): "
                           f"{e.detail.strip()[:300]}") from None
    if out["error"] is not None:
        raise ValueError(out["error"])
    if out["crash"] is not None:
        raise CompileCrash(f"XLA failed to compile {what}: {out['crash'][:500]}")
    return CompiledStep(**out["result"])


def _child(spec_path: str) -> None:
    """compile_builtin_isolated's other side: compile the spec, write the answer beside it."""
    gpu_compile.answer_in_child(spec_path, lambda spec: compile_builtin(
        hardware_lib.HardwareProfile.from_dict(spec["hardware"]), spec["model"], spec["config"],
        spec["recipe"], spec["mesh"], **spec["build_kwargs"]))
