"""Whether the installed XLA's deviceless compile can run a windowed einsum at all.

XLA's collective matmul (``--xla_gpu_threshold_for_windowed_einsum_mib``) is decided in
SPMD partitioning: a dot is windowed only if its partitions number at most the
partitioner's iteration limit (openxla/xla ``xla/service/spmd/dot_handler.cc``,
``GetWindowedEinsumConfiguration``), and the GPU pipeline sets that limit to the compile's
fast-interconnect slice size (``AddSPMDPasses``). A real GPU client sets it to its NVLink
domain; XLA's ahead-of-time path, which a deviceless compile takes, left it at 0
(``GpuCompiler::CompileAheadOfTime``) until openxla/xla commit 75d31665 took it from the
topology. Where it is 0 the flag compiles to the same program as without it, so a
prediction compiled with it would silently price the step *without* the collective matmul
the user asked about.

:func:`why_not` asks the installed XLA once, with the smallest step that windows on a GPU
(an all-gather over 2 GPUs feeding a matmul, threshold 0), in a child process, and
remembers the answer on disk per installed XLA (``files.cache_root()/probes``). jaxlib
0.10.2 compiles it without a window (the slice size above); jaxlib 0.12.0.1 windows it and
then fails its own HLO verifier on the loop's asynchronous GEMM (with Triton GEMMs on, its
autotuner finds no config for the partial GEMMs instead).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from typing import Any

from lagom_jax.files import atomic_write_text
from lagom_jax.program import flags

FLAG = "xla_gpu_threshold_for_windowed_einsum_mib"
# XLA's default threshold (MiB): windowing is off in practice below any real operand.
DEFAULT_MIB = int(flags.KNOWN_FLAGS[FLAG].default)
NO_WINDOW = ("this jaxlib's deviceless compile windows no einsum: XLA caps windowed-einsum loops at the "
             "fast-interconnect slice size (dot_handler.cc, GetWindowedEinsumConfiguration), which its "
             "ahead-of-time path leaves at 0 (GpuCompiler::CompileAheadOfTime; openxla/xla 75d31665 takes it "
             "from the topology), so the step would compile as without the flag")
# How a prediction prices the flag where the compile cannot apply it (``passes.decompose``).
WHAT_IF = ("passes.decompose, XLA's loop order: every all-gather + matmul and matmul + reduce-scatter "
           "pair of the step compiled without the flag runs as a ring of collective-permutes beside "
           "partial matmuls; on a GPU XLA windows only dots whose partitions fit its NVLink domain")


def asks_for_windowing(options: dict[str, Any]) -> bool:
    """Whether compile ``options`` turn XLA's windowed einsum on for any realistic operand."""
    return FLAG in options and int(options[FLAG]) < DEFAULT_MIB


@functools.cache
def why_not() -> str:
    """"" where a deviceless compile with the installed XLA windows an eligible einsum, else
    why not (cached per process and, per installed XLA, on disk)."""
    marker = flags.installed_xla_marker("probes", "windowed-einsum", suffix=".json")
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads(marker.read_text())["why_not"])
    from lagom_jax.program import gpu_compile

    answer = gpu_compile.run_isolated(__name__, {}, timeout_s=300)
    if answer.get("error"):  # no deviceless compile here at all
        raise gpu_compile.DevicelessUnavailable(answer["error"])
    if answer.get("crash"):  # XLA failed to compile the collective matmul: say its first line
        reason = "this jaxlib's XLA fails to compile a windowed einsum deviceless: " + answer["crash"].splitlines()[0]
    else:
        reason = "" if answer["result"]["applies"] else NO_WINDOW
    with contextlib.suppress(OSError):  # an unwritable cache only costs the next probe
        atomic_write_text(marker, json.dumps({"why_not": reason}))
    return reason


@dataclasses.dataclass
class _Answer:
    applies: bool


def _probe(spec: dict[str, Any]) -> _Answer:
    """The child's work: compile x @ w with x all-gathered over 2 GPUs, threshold 0."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from lagom_jax.cluster import hardware
    from lagom_jax.program import gpu_compile

    del spec
    gpu_compile.prepare()
    mesh = Mesh(np.array(gpu_compile.devices(hardware.get("h100-sxm-8"), 2)), ("m",))
    out = NamedSharding(mesh, PartitionSpec(None, "m"))
    x = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("m", None)))
    w = jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16, sharding=out)
    lowered = jax.jit(lambda a, b: a @ b, out_shardings=out).lower(x, w)
    # Triton GEMM off: XLA's deviceless autotuner finds no config for the windowed loop's
    # partial GEMM fusions in some versions (jaxlib 0.12), which is not what is asked here.
    text = lowered.compile(compiler_options={FLAG: 0, "xla_gpu_enable_triton_gemm": False}).as_text()
    return _Answer("collective-permute" in text)


def _child(spec_path: str) -> None:
    from lagom_jax.program import gpu_compile

    gpu_compile.answer_in_child(spec_path, _probe)
