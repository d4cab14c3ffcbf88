"""What a built-in family's train step needs in GPU memory, from XLA, and its predicted step.

A step is compiled deviceless by XLA's GPU pipeline (``gpu_compile``) in a fresh process,
and its per-GPU memory is read from the executable's memory analysis: arguments + outputs -
aliased + temporaries + generated code (JAX's own account of an executable's peak; on an
H100 the deviceless analysis of a Llama step matched the measured peak within 0.05%,
``gpu_measurements.md``). The limit it is checked against is the GPU's memory times JAX's
``XLA_PYTHON_CLIENT_MEM_FRACTION`` (JAX preallocates that share, default 0.75; JAX's GPU
memory allocation documentation).

XLA's own rematerialization pass (``HloRematerialization`` in the GPU compiler's
post-scheduling pipeline) and its latency-hiding scheduler take one memory limit,
``GetSchedulerMemoryLimit`` (openxla/xla ``xla/service/gpu/gpu_hlo_schedule.cc``):
``(base - inputs and outputs) * xla_gpu_memory_limit_slop_factor / 100`` where ``base`` is
the module's ``device_memory_size`` when set (jaxlib 0.10.2's ``ExecutableBuildOptions``
cannot set it from Python) else 80% of the target description's
``gpu_device_info.device_memory_size``. In a deviceless compile the target description is
ours (``lagom_jax/data/gpu_targets``), so the advisor compiles against a copy whose device
memory is ``limit * 100 / 80`` and with a slop factor of 100: XLA then rematerializes
exactly when arguments + outputs + temporaries would exceed the advisor's limit. A step XLA
had to rematerialize holds instructions named ``*.remat`` (``HloRematerialization`` clones
with that suffix); the advisor says so.

The compile and the prediction (the contract's: ``job.plan_compiled`` with
``xla-default``, as ``predict_train_step_ms`` prices a step) both run in the child, so
several children run in parallel; answers are cached on disk by a fingerprint of what was
asked (``LAGOM_JAX_CACHE``, default ``~/.cache/lagom-jax``, ``advise/``) and, one level down, by a
fingerprint of the program JAX lowered (``advise/programs/``): two configurations that lower to
the same program (e.g. two remat policies that save the same values, as MaxText's
``save_dot_except_mlp`` and ``save_dot_except_mlpwi`` do for a Llama layer, whose MLP output is
never needed by the backward pass) share one XLA compile.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from lagom_jax import job as job_lib, models
from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.files import atomic_write_text, cache_root
from lagom_jax.plan import planning
from lagom_jax.program import gpu_compile

__all__ = ["JAX_MEM_FRACTION", "StepMemory", "compile_step", "gpu_memory_bytes", "memory_fraction",
           "remat_count"]

# JAX's default share of GPU memory preallocated for XLA (XLA_PYTHON_CLIENT_MEM_FRACTION;
# JAX documentation, "GPU memory allocation").
JAX_MEM_FRACTION = 0.75
# GetSchedulerMemoryLimit's share of the target's device memory when the module sets none.
_XLA_BASE_SHARE = 0.80
_DEVICE_MEMORY = re.compile(r"(device_memory_size:\s*)(\d+)")
_REMAT_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\.remat\d*\s*=", re.M)
CACHE_VERSION = 1


def memory_fraction(explicit: float | None = None) -> float:
    """The share of GPU memory the run gives XLA: ``explicit``, else the environment's
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``, else JAX's default 0.75."""
    if explicit is None:
        env = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
        explicit = float(env) if env else JAX_MEM_FRACTION
    if not 0 < explicit <= 1:
        raise ValueError(f"memory fraction must be in (0, 1], got {explicit}")
    return float(explicit)


@functools.cache
def _target_text(name: str) -> str:
    return gpu_compile._raw_target(name)  # noqa: SLF001 - the description file itself


def gpu_memory_bytes(hw: hardware_lib.HardwareProfile) -> int:
    """The GPU's memory, as XLA's target description for it says (``device_memory_size``)."""
    if not hw.xla_target:
        raise ValueError(f"hardware {hw.name!r} names no XLA GPU target, so its memory is unknown")
    match = _DEVICE_MEMORY.search(_target_text(hw.xla_target))
    if match is None:
        raise ValueError(f"the GPU target {hw.xla_target!r} gives no device_memory_size")
    return int(match.group(2))


def remat_count(text: str) -> int:
    """Instructions XLA's rematerialization pass added to a compiled module."""
    return len(_REMAT_NAME.findall(text))


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """A compiled step: its per-GPU memory (bytes, XLA's memory analysis), how many
    instructions XLA rematerialized to meet the limit, and its predicted step (ms)."""
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    remat_instructions: int
    step_ms: float
    where: str
    reused: bool = False  # the answer of an earlier compile of the same lowered program

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


# XLA's limit is the whole of ``base - inputs and outputs`` (default slop factor 95).
LIMIT_OPTIONS = {"xla_gpu_memory_limit_slop_factor": 100}


def _spec(hw: hardware_lib.HardwareProfile, model: str, config: str, mesh: Mapping[str, int], *,
          batch_size: int, seq_len: int, dtype: str, remat: str, attention: str,
          limit_bytes: int, scan: bool, options: Mapping[str, Any],
          microbatches: int | None = None) -> dict[str, Any]:
    spec = {"hardware": hw.to_dict(), "model": model, "config": config, "mesh": dict(mesh),
            "batch_size": batch_size, "seq_len": seq_len, "dtype": dtype, "remat": remat,
            "attention": attention, "limit_bytes": int(limit_bytes), "scan": bool(scan),
            "options": dict(options)}
    if microbatches is not None:  # a pipeline's; absent otherwise, so other steps keep their keys
        spec["microbatches"] = int(microbatches)
    return spec


def _fingerprint(spec: Mapping[str, Any]) -> str:
    import jax

    hw = hardware_lib.HardwareProfile.from_dict(spec["hardware"])
    # The plan version moves with the cost model and the built-in models (a cached step time
    # from another model would be stale).
    blob = json.dumps({"spec": spec, "jax": jax.__version__, "target": _target_text(hw.xla_target),
                       "v": CACHE_VERSION, "lagom": planning.VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _cache_dir() -> pathlib.Path:
    return cache_root() / "advise"


class CompileFailed(RuntimeError):
    """XLA could not compile a step (the message says why)."""


def compile_step(hw: hardware_lib.HardwareProfile, model: str, config: str, mesh: Mapping[str, int], *,
                 batch_size: int, seq_len: int, dtype: str = "bfloat16", remat: str = "full",
                 attention: str = "flash", limit_bytes: int, scan: bool = True,
                 options: Mapping[str, Any] | None = None, timeout_s: float = 1800.0,
                 cache: bool = True, programs: str | os.PathLike | None = None,
                 microbatches: int | None = None) -> tuple[StepMemory, bool]:
    """The step compiled deviceless in a fresh process, its memory and predicted step;
    (answer, whether it came from the cache or an earlier compile of the same program).
    ``options``: XLA flags of the run (compile options; the slop factor of ``LIMIT_OPTIONS``
    is added). ``programs``: where answers by lowered program are kept (default: beside the
    cache when ``cache``; a caller that wants no cache across runs can still share compiles
    within one by naming a folder of its own). ``microbatches``: a pipeline's (a ``stage`` axis;
    default two per stage). Raises ValueError when ``models.build``
    refuses the step and CompileFailed when XLA cannot compile it."""
    spec = _spec(hw, model, config, mesh, batch_size=batch_size, seq_len=seq_len, dtype=dtype,
                 remat=remat, attention=attention, limit_bytes=limit_bytes, scan=scan,
                 options=options or {}, microbatches=microbatches)
    path = _cache_dir() / f"{_fingerprint(spec)}.json"
    if cache and (known := _read_answer(path)) is not None:
        return known, True
    if programs is not None or cache:
        spec = {**spec, "programs": str(programs if programs is not None else _cache_dir() / "programs")}
    what = f"{model} {config} {mesh} batch {batch_size} remat {remat} {attention}"
    try:
        out = gpu_compile.run_isolated("lagom_jax.advise.memory", spec, timeout_s=timeout_s)
    except TimeoutError:
        raise CompileFailed(f"compiling {what} took over {timeout_s:.0f} s") from None
    except gpu_compile.ChildAborted as e:
        raise CompileFailed(f"XLA's compiler aborted on {what}: {e.detail.strip()[:300]}") from None
    if out["error"] is not None:
        raise ValueError(out["error"])
    if out["crash"] is not None:
        raise CompileFailed(f"XLA failed to compile {what}: {out['crash'][:500]}")
    answer = StepMemory(**out["result"])
    if cache:
        _write_answer(path, answer)
    return answer, answer.reused


def _read_answer(path: pathlib.Path) -> StepMemory | None:
    """A cached answer, or None where there is none (a corrupt entry is compiled again)."""
    try:
        return StepMemory(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_answer(path: pathlib.Path, answer: StepMemory) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(dataclasses.asdict(dataclasses.replace(answer, reused=False))))


def _devices(hw: hardware_lib.HardwareProfile, n: int, limit_bytes: int) -> list[Any]:
    """``n`` abstract GPUs of ``hw`` whose description gives XLA the advisor's limit."""
    from jax.experimental import topologies

    text, _ = gpu_compile.target_config(hw.xla_target)
    memory = math.ceil(limit_bytes / _XLA_BASE_SHARE)
    text = _DEVICE_MEMORY.sub(lambda m: f"{m.group(1)}{memory}", text, count=1)
    topo = topologies.get_topology_desc(platform="cuda", topology_name="", target_config=text,
                                        topology=gpu_compile.topology_string(hw, n))
    return list(topo.devices)


def _compile_and_predict(spec: Mapping[str, Any]) -> StepMemory:
    gpu_compile.prepare()
    hw = hardware_lib.HardwareProfile.from_dict(spec["hardware"])
    shape = {a: int(n) for a, n in spec["mesh"].items()}
    n = math.prod(shape.values())
    gpu_compile._require(hw.gpu)  # noqa: SLF001 - the deviceless route or DevicelessUnavailable
    devices = _devices(hw, n, spec["limit_bytes"])
    recipe = job_lib.ModelSource(spec["model"], spec["config"], shape).resolved_recipe()
    built = models.build(spec["model"], spec["config"], recipe, shape, batch_size=spec["batch_size"],
                         seq_len=spec["seq_len"], dtype=spec["dtype"], devices=devices,
                         remat=spec["remat"], scan=spec.get("scan", True), attention=spec["attention"],
                         microbatches=spec.get("microbatches"))
    lowered = built.lower()
    options = {**spec.get("options", {}), **LIMIT_OPTIONS}
    program = None
    if spec.get("programs"):
        # What XLA is given (the lowered program, the flags, the target with its memory) and
        # what prices it (the cluster, the cost model's version) decide the answer.
        blob = json.dumps({"program": lowered.as_text(), "options": options, "limit": spec["limit_bytes"],
                           "hardware": spec["hardware"], "target": _target_text(hw.xla_target),
                           "v": CACHE_VERSION, "lagom": planning.VERSION}, sort_keys=True, default=str)
        program = pathlib.Path(spec["programs"]) / f"{hashlib.sha256(blob.encode()).hexdigest()[:32]}.json"
        if (known := _read_answer(program)) is not None:
            return dataclasses.replace(known, reused=True)
    compiled = lowered.compile(compiler_options=options)
    text = compiled.as_text()
    mem = compiled.memory_analysis()
    where = f"XLA:GPU deviceless compile for {n}x {hw.gpu}"
    done = job_lib.plan_compiled(job_lib.Compiled(text, where, hw), strategy="xla-default",
                                 baselines=("xla-default",), verify=False)
    answer = StepMemory(int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                        int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes),
                        int(mem.generated_code_size_in_bytes), remat_count(text),
                        done.predicted_ms("xla-default"), where)
    if program is not None:
        _write_answer(program, answer)
    return answer


def _child(spec_path: str) -> None:
    """compile_step's other side: compile and predict the spec, write the answer beside it."""
    gpu_compile.answer_in_child(spec_path, _compile_and_predict)
