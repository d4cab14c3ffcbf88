"""XLA flags as typed data, rendered only at the edge, and checked against the installed XLA.

A Plan speaks about XLA through :class:`XlaFlag` values. They become either per-compile
``compiler_options`` (a dict for ``lowered.compile(compiler_options=...)``) or one
``XLA_FLAGS`` string for launch scripts. Before anybody is told to use them they are
validated by the XLA that is installed here: the flag string by XLA's own flag parser and
the options by a real compile, both in a child process, because XLA aborts the process on
an unknown flag (openxla/xla ``xla/parse_flags_from_env.cc``: "Unknown flag in XLA_FLAGS" is
fatal, exit code 1) and, as we measured with jaxlib 0.10.2, some bad option values fail a
CHECK instead of raising.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping

from lagom_jax.program import jax_internals

FlagValue = bool | int | str


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """What lagom-jax knows about one DebugOptions field it may emit (jaxlib 0.10.2)."""

    name: str
    type: type
    default: FlagValue
    help: str
    # False for flags read once per process (openxla/xla keeps them in a ``static`` taken
    # from GetDebugOptionsFromFlags(), e.g. xla_gpu_enable_nccl_comm_splitting in the GPU
    # clique code): they go into XLA_FLAGS only, never into compiler_options.
    per_compile: bool = True


# Types and defaults: openxla/xla xla/xla.proto (DebugOptions) and xla/debug_options_flags.cc,
# checked by our own measurement against the jaxlib 0.10.2 binary's DebugOptions descriptor
# and default CompileOptions.
_COMBINE_DEFAULT = 31457287  # 30 MiB + 7, xla/service/collective_utils.h
KNOWN_FLAGS: dict[str, FlagSpec] = {
    s.name: s
    for s in (
        FlagSpec("xla_gpu_all_reduce_combine_threshold_bytes", int, _COMBINE_DEFAULT,
                 "all-reduce combiner threshold"),
        FlagSpec("xla_gpu_all_gather_combine_threshold_bytes", int, _COMBINE_DEFAULT,
                 "all-gather combiner threshold"),
        FlagSpec("xla_gpu_reduce_scatter_combine_threshold_bytes", int, _COMBINE_DEFAULT,
                 "reduce-scatter combiner threshold"),
        FlagSpec("xla_gpu_collective_permute_combine_threshold_bytes", int, _COMBINE_DEFAULT,
                 "collective-permute combiner threshold"),
        FlagSpec("xla_gpu_collective_combine_threshold_count", int, 2048,
                 "most collectives one combiner merges"),
        FlagSpec("xla_gpu_enable_all_gather_combine_by_dim", bool, False,
                 "combine only all-gathers of the same dimension"),
        FlagSpec("xla_gpu_enable_reduce_scatter_combine_by_dim", bool, False,
                 "combine only reduce-scatters of the same dimension"),
        FlagSpec("xla_gpu_enable_latency_hiding_scheduler", bool, False,
                 "schedule async collectives to overlap compute"),
        FlagSpec("xla_gpu_enable_analytical_sol_latency_estimator", bool, True,
                 "speed-of-light latency estimator; on Hopper it also turns the LHS on"),
        FlagSpec("xla_gpu_enable_pipelined_all_reduce", bool, False,
                 "move all-reduce across loop iterations"),
        FlagSpec("xla_gpu_enable_pipelined_all_gather", bool, False,
                 "prefetch all-gather one loop iteration ahead"),
        FlagSpec("xla_gpu_enable_pipelined_reduce_scatter", bool, True,
                 "defer reduce-scatter one loop iteration"),
        FlagSpec("xla_gpu_enable_pipelined_p2p", bool, False, "pipeline send/recv"),
        FlagSpec("xla_gpu_enable_while_loop_double_buffering", bool, False,
                 "double-buffer while loops"),
        FlagSpec("xla_gpu_experimental_parallel_collective_overlap_limit", int, 1,
                 "collectives in flight at once under the LHS"),
        FlagSpec("xla_gpu_nccl_collective_max_nchannels", int, 0,
                 "maxCTAs of the NCCL communicators (0 = NCCL decides)"),
        FlagSpec("xla_gpu_nccl_p2p_max_nchannels", int, 0,
                 "maxCTAs for P2P communicators (0 = NCCL decides)"),
        FlagSpec("xla_gpu_experimental_enable_nccl_symmetric_buffers", bool, False,
                 "register collective buffers as NCCL symmetric windows (NCCL 2.27+ symmetric "
                 "kernels; with NCCL_CTA_POLICY=2, copy-engine collectives)"),
        FlagSpec("xla_gpu_threshold_for_windowed_einsum_mib", int, 100000,
                 "operand size above which einsums become collective matmuls"),
        FlagSpec("xla_gpu_pgle_accuracy_checker", str, "PGLE_STRICTNESS_LEVEL_WARN",
                 "what LHS does with instructions missing from the profile"),
        FlagSpec("xla_gpu_enable_nccl_comm_splitting", bool, True,
                 "share NCCL resources between cliques", per_compile=False),
    )
}


class FlagError(ValueError):
    """A flag or compile option that the installed XLA rejects, or that we do not know."""


@dataclasses.dataclass(frozen=True, order=True)
class XlaFlag:
    name: str
    value: FlagValue

    def __post_init__(self) -> None:
        spec = KNOWN_FLAGS.get(self.name)
        if spec is None:
            raise FlagError(
                f"unknown XLA flag {self.name!r}: lagom-jax emits only flags it knows the type of "
                f"(known: {', '.join(sorted(KNOWN_FLAGS))})"
            )
        ok = isinstance(self.value, spec.type) and not (
            spec.type is int and isinstance(self.value, bool)
        )
        if not ok:
            raise FlagError(
                f"flag {self.name} takes a {spec.type.__name__}, got {self.value!r}"
            )

    @property
    def is_default(self) -> bool:
        return self.value == KNOWN_FLAGS[self.name].default

    def render(self) -> str:
        """The ``--name=value`` form XLA's flag parser reads."""
        value = self.value
        if isinstance(value, bool):
            value = "true" if value else "false"
        return f"--{self.name}={value}"


def render_xla_flags(flags: Iterable[XlaFlag]) -> str:
    """One ``XLA_FLAGS`` string, sorted by name so that equal plans print equal strings."""
    return " ".join(f.render() for f in sorted(flags))


def compiler_options(flags: Iterable[XlaFlag]) -> dict[str, FlagValue]:
    """The per-compile subset, as ``lowered.compile(compiler_options=...)`` takes it."""
    return {f.name: f.value for f in sorted(flags) if KNOWN_FLAGS[f.name].per_compile}


def bool_setting(name: str, options: Mapping[str, FlagValue] | None = None,
                 environ: Mapping[str, str] | None = None) -> bool | None:
    """The value a step's compile will see for boolean XLA flag ``name``: its compile option
    (``options``), else ``--name=...`` in ``XLA_FLAGS`` (the last one given, as XLA's own
    parser takes it), else None (XLA's default)."""
    if options and name in options:
        return bool(options[name])
    found = None
    for token in (environ if environ is not None else os.environ).get("XLA_FLAGS", "").split():
        key, eq, value = token.removeprefix("--").partition("=")
        if key == name:
            found = not eq or value.strip().lower() in ("true", "1")
    return found


_UNKNOWN_FLAG = re.compile(r"Unknown flag in XLA_FLAGS: --([A-Za-z0-9_]+)")
_BAD_VALUE = re.compile(r"Couldn't interpret value (.*?) for flag ([A-Za-z0-9_]+)")
_NO_OPTION = re.compile(r"No such compile option: '([A-Za-z0-9_]+)'")

# The child process: XLA_FLAGS is parsed (jax_internals.parse_xla_flags, loaded from its
# file so that the child does not import all of lagom_jax), then a tiny function is
# compiled with the options read from stdin.
_CHILD = r"""
import importlib.util, json, sys
opts = json.loads(sys.stdin.read())
import jax
spec = importlib.util.spec_from_file_location("_lagom_jax_internals", sys.argv[1])
internals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(internals)
internals.parse_xla_flags()
jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options=opts)
print("LAGOM_FLAGS_OK")
"""


def _explain_failure(output: str) -> str:
    for pattern, fmt in (
        (_UNKNOWN_FLAG, "XLA does not know flag --{0}"),
        (_BAD_VALUE, "XLA cannot read value {0} for flag --{1}"),
        (_NO_OPTION, "XLA does not know compile option {0!r}"),
    ):
        m = pattern.search(output)
        if m:
            return fmt.format(*m.groups())
    usage = re.search(r"usage: (.*)", output)
    if usage and "Flag parsing failed" in output:
        return f"XLA rejected the flags: {usage.group(1).strip()}"
    tail = "\n".join(output.strip().splitlines()[-5:])
    return f"XLA rejected the flags:\n{tail}"


@functools.lru_cache(maxsize=64)
def _validate_cached(xla_flags: str, options_json: str) -> None:
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.pop("XLA_FLAGS_RESET", None)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, jax_internals.__file__],
        input=options_json,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 or "LAGOM_FLAGS_OK" not in proc.stdout:
        raise FlagError(_explain_failure(proc.stderr + proc.stdout))


def validate(xla_flags: str = "", options: Mapping[str, FlagValue] | None = None) -> None:
    """Raise :class:`FlagError` naming the flag unless the installed XLA accepts both.

    ``xla_flags`` goes through XLA's own flag parser (as ``XLA_FLAGS`` of a child process)
    and ``options`` through a real compile with ``compiler_options``. Results are cached
    per process, so validating the same plan twice costs nothing. When XLA's message does
    not name the culprit (a bad enum value only prints the usage), the flags are tried one
    by one so that the error can.
    """
    opts = {k: v for k, v in (options or {}).items() if k != "fdo_profile"}
    try:
        _validate_cached(xla_flags, json.dumps(opts, sort_keys=True))
    except FlagError as err:
        parts = xla_flags.split()
        if str(err).startswith("XLA rejected") and len(parts) > 1:
            for part in parts:
                try:
                    _validate_cached(part, "{}")
                except FlagError:
                    raise FlagError(f"XLA cannot parse {part}") from err
        raise
