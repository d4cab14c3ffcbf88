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

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping

from lagom_jax.files import atomic_write_text, cache_root
from lagom_jax.program import environment, jax_internals

FlagValue = bool | int | str


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """What lagom-jax knows about one DebugOptions field it may emit."""

    name: str
    type: type
    default: FlagValue
    help: str
    # False for flags read once per process (openxla/xla keeps them in a ``static`` taken
    # from GetDebugOptionsFromFlags(), e.g. xla_gpu_enable_nccl_comm_splitting in the GPU
    # clique code): they go into XLA_FLAGS only, never into compiler_options.
    per_compile: bool = True
    # An enum field: the words XLA_FLAGS takes, and the prefix that makes each the name of
    # the proto enum value ``compiler_options`` takes ("on" -> COLLECTIVE_PIPELINING_MODE_ON;
    # XLA's option parser refuses the short word and its flag parser the enum name).
    choices: tuple[str, ...] = ()
    enum_prefix: str = ""
    # True for a flag that changes how NCCL runs the program, not the program: XLA reads it
    # when it makes the communicators or the collective buffers, so the compiled module is
    # the same with or without it and a recompile cannot check it.
    runtime: bool = False

    def option_value(self, value: FlagValue) -> FlagValue:
        """``value`` as ``compiler_options`` takes it."""
        return f"{self.enum_prefix}{str(value).upper()}" if self.choices else value


# Types and defaults: openxla/xla xla/xla.proto (DebugOptions) and xla/debug_options_flags.cc,
# checked by our own measurement against the jaxlib 0.10.2 binary's DebugOptions descriptor
# and default CompileOptions.
_COMBINE_DEFAULT = 31457287  # 30 MiB + 7, xla/service/collective_utils.h
_PIPELINING_MODES = ("default", "off", "on", "explicit")
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
        # jaxlib 0.11 replaced the three booleans above by these enums (openxla/xla PR
        # #45836, "Fine grained control of collectives pipelining"); see RENAMED.
        # Their default is "default", pipelining as the optimization level says; JAX compiles
        # at XLA's default level, where it pipelines nothing: a small scanned llama compiles to
        # the same module with "off" as with "default" for all three kinds (jaxlib 0.11.2 and
        # 0.12.0.1), and so does the main job (0.12.0.1), so "off" is the value the search
        # never needs to compile.
        *(FlagSpec(f"xla_gpu_pipeline_{kind}", str, "off",
                   f"{kind.replace('_', '-')} pipelining: default (what the optimization level "
                   f"does), off, on (every eligible one), explicit (those marked is_pipelineable)",
                   choices=_PIPELINING_MODES, enum_prefix="COLLECTIVE_PIPELINING_MODE_")
          for kind in ("all_gather", "reduce_scatter", "all_reduce")),
        FlagSpec("xla_gpu_enable_pipelined_p2p", bool, False, "pipeline send/recv"),
        FlagSpec("xla_gpu_enable_while_loop_double_buffering", bool, False,
                 "double-buffer while loops"),
        FlagSpec("xla_gpu_experimental_parallel_collective_overlap_limit", int, 1,
                 "collectives in flight at once under the LHS"),
        FlagSpec("xla_gpu_nccl_collective_max_nchannels", int, 0,
                 "maxCTAs of the NCCL communicators (0 = NCCL decides)", runtime=True),
        FlagSpec("xla_gpu_nccl_p2p_max_nchannels", int, 0,
                 "maxCTAs for P2P communicators (0 = NCCL decides)", runtime=True),
        FlagSpec("xla_gpu_experimental_enable_nccl_symmetric_buffers", bool, False,
                 "register collective buffers as NCCL symmetric windows (NCCL 2.27+ symmetric "
                 "kernels; with NCCL_CTA_POLICY=2, copy-engine collectives)", runtime=True),
        FlagSpec("xla_gpu_enable_nccl_user_buffers", bool, False,
                 "register collective buffers with NCCL (ncclCommRegister): NVLS on fewer CTAs",
                 runtime=True),
        # XLA's RaggedAllToAllDecomposer (openxla/xla xla/service/gpu/transforms/
        # ragged_all_to_all_decomposer.cc): each ragged all-to-all becomes a dense all-to-all of
        # per-peer buffers padded to the largest send, with the slicing around it; marin turned it on
        # to step around the one-shot kernel, whose gradients it found corrupted
        # (marin-community/marin issue #8077). A compile shows it.
        FlagSpec("xla_gpu_unsupported_enable_ragged_all_to_all_decomposer", bool, False,
                 "rewrite ragged all-to-all into a dense all-to-all of padded buffers"),
        # XLA's one-shot ragged all-to-all kernel (openxla/xla xla/backends/gpu/runtime/
        # ragged_all_to_all_thunk.cc): on, a ragged all-to-all inside one host runs as XLA's own
        # kernel; off, through NCCL's sends and receives (``cost.one_shot_applies``). Read from the
        # module's options when XLA makes the thunk: the module is the same either way.
        FlagSpec("xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel", bool, True,
                 "run ragged all-to-all inside one host as XLA's one-shot kernel (off: NCCL)", runtime=True),
        FlagSpec("xla_gpu_threshold_for_windowed_einsum_mib", int, 100000,
                 "operand size above which einsums become collective matmuls"),
        FlagSpec("xla_gpu_pgle_accuracy_checker", str, "PGLE_STRICTNESS_LEVEL_WARN",
                 "what LHS does with instructions missing from the profile"),
        FlagSpec("xla_gpu_enable_nccl_comm_splitting", bool, True,
                 "share NCCL resources between cliques", per_compile=False),
    )
}


RUNTIME_FLAGS = frozenset(name for name, spec in KNOWN_FLAGS.items() if spec.runtime)


# Flags XLA renamed: old name -> (new name, old value -> new value). jaxlib 0.11 dropped the
# ``xla_gpu_enable_pipelined_*`` DebugOptions fields (as compile options they are "No such
# compile option"; XLA_FLAGS still parses them, mapping false to "default"). A plan or a
# user that says "pipelined = false" means off, which is what 0.10's false did, so false
# maps to "off" here.
_PIPELINED_TO_MODE = {True: "on", False: "off"}
RENAMED: dict[str, tuple[str, dict[FlagValue, FlagValue]]] = {
    f"xla_gpu_enable_pipelined_{kind}": (f"xla_gpu_pipeline_{kind}", _PIPELINED_TO_MODE)
    for kind in ("all_gather", "reduce_scatter", "all_reduce")
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
        if spec.choices and self.value not in spec.choices:
            raise FlagError(f"flag {self.name} takes one of {', '.join(spec.choices)}, got {self.value!r}")

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
    return {f.name: KNOWN_FLAGS[f.name].option_value(f.value) for f in sorted(flags)
            if KNOWN_FLAGS[f.name].per_compile}


def bool_setting(name: str, options: Mapping[str, FlagValue] | None = None,
                 environ: Mapping[str, str] | None = None) -> bool | None:
    """The value a step's compile will see for boolean XLA flag ``name``: its compile option
    (``options``), else ``--name=...`` in ``XLA_FLAGS`` (the last one given, as XLA's own
    parser takes it), else None (XLA's default)."""
    if options and name in options:
        return bool(options[name])
    found = text_setting(name, None, environ)
    return None if found is None else found.strip().lower() in ("", "true", "1")


def text_setting(name: str, options: Mapping[str, FlagValue] | None = None,
                 environ: Mapping[str, str] | None = None) -> str | None:
    """``bool_setting`` for a flag of any type, as the text given (a bare ``--name`` is "")."""
    if options and name in options:
        value = options[name]
        return ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    found = None
    for token in (environ if environ is not None else os.environ).get("XLA_FLAGS", "").split():
        key, _eq, value = token.removeprefix("--").partition("=")
        if key == name:
            found = value.strip().strip("'\"")
    return found


# The installed XLA's flag table, as far as lagom-jax's flags go: which of KNOWN_FLAGS it
# takes. A child process compiles a tiny function once per per-compile flag at its default
# (an unknown name raises "No such compile option", a changed type "not a valid enum
# value") and parses the per-process flags from XLA_FLAGS (an unknown one is fatal there, so
# the child is started again without it).
_TABLE_CHILD = r"""
import json, sys
import jax
out = {}
for name, value in json.loads(sys.stdin.read()):
    try:
        jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options={name: value})
        out[name] = None
    except Exception as err:
        out[name] = str(err).strip().splitlines()[0][:300]
print("LAGOM_TABLE " + json.dumps(out))
"""


def _probe_table() -> dict[str, str | None]:
    per_compile = [(s.name, s.option_value(s.default)) for s in KNOWN_FLAGS.values() if s.per_compile]
    per_process = [s for s in KNOWN_FLAGS.values() if not s.per_compile]
    refused: dict[str, str | None] = {}
    while True:
        env = dict(os.environ)
        env["XLA_FLAGS"] = render_xla_flags(XlaFlag(s.name, s.default) for s in per_process)
        env.setdefault("JAX_PLATFORMS", "cpu")
        proc = subprocess.run([sys.executable, "-c", _TABLE_CHILD], input=json.dumps(per_compile), env=env,
                              capture_output=True, text=True, timeout=300)
        found = re.search(r"^LAGOM_TABLE (.*)$", proc.stdout, re.M)
        if found:
            return {**json.loads(found.group(1)), **{s.name: None for s in per_process}, **refused}
        unknown = _UNKNOWN_FLAG.search(proc.stderr)
        if unknown is None or unknown.group(1) not in {s.name for s in per_process}:
            raise FlagError(f"could not read the installed XLA's flags: {_explain_failure(proc.stderr + proc.stdout)}")
        refused[unknown.group(1)] = f"Unknown flag in XLA_FLAGS: --{unknown.group(1)}"
        per_process = [s for s in per_process if s.name != unknown.group(1)]


@functools.lru_cache(maxsize=1)
def installed_table() -> Mapping[str, str | None]:
    """For each flag in KNOWN_FLAGS, None where the installed XLA takes it at its default,
    else XLA's reason it does not. Read once per process (a few seconds, in a child)."""
    return _probe_table()


def installed_version() -> str:
    """The jaxlib whose XLA the flag table is of, for messages."""
    return f"jaxlib {environment.installed(driver=lambda: None).jaxlib or '?'}"


def for_installed(flag: XlaFlag) -> XlaFlag | None:
    """``flag`` as the installed XLA spells it: itself where XLA takes it, else the flag XLA
    renamed it to (or from) with its value mapped (RENAMED); None where XLA has neither, or
    where the value has no counterpart (the "explicit" pipelining mode before 0.11)."""
    table = installed_table()
    if table.get(flag.name, "absent") is None:
        return flag
    if flag.name in RENAMED:
        new, values = RENAMED[flag.name]
        if table.get(new, "absent") is None and flag.value in values:
            return XlaFlag(new, values[flag.value])
    for old, (new, values) in RENAMED.items():
        if new == flag.name and table.get(old, "absent") is None:
            if flag.value == "default":
                return XlaFlag(old, KNOWN_FLAGS[old].default)
            back = [v for v, mode in values.items() if mode == flag.value]
            return XlaFlag(old, back[0]) if back else None
    return None


def installed_options(options: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """Compile options as the installed XLA spells them (``for_installed``), in the form
    ``compiler_options`` takes; raises FlagError naming a flag the installed XLA lacks.
    Options lagom-jax does not know pass through unchanged (XLA judges them)."""
    out: dict[str, FlagValue] = {}
    for name, value in options.items():
        spec = KNOWN_FLAGS.get(name)
        if spec is None:
            out[name] = value
            continue
        if spec.choices and isinstance(value, str) and value.startswith(spec.enum_prefix):
            value = value.removeprefix(spec.enum_prefix).lower()
        mapped = for_installed(XlaFlag(name, value))
        if mapped is None:
            raise FlagError(f"the installed XLA ({installed_version()}) has no flag {name} "
                            f"(nor a successor that takes {value!r})")
        out[mapped.name] = KNOWN_FLAGS[mapped.name].option_value(mapped.value)
    return out


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


@functools.cache
def installed_xla_key() -> str:
    """Which XLA this process would check flags against: JAX's and jaxlib's versions and the
    file of jaxlib's compiled extension (its path, size and modification time)."""
    import jax
    import jaxlib

    ext = next(iter(sorted(pathlib.Path(jaxlib.__file__).parent.glob("_jax*"))), None)
    stat = ext.stat() if ext is not None else None
    return json.dumps([sys.executable, jax.__version__, jaxlib.__version__, str(ext),
                       stat and stat.st_size, stat and stat.st_mtime_ns])


def installed_xla_marker(folder: str, *parts: str, suffix: str = ".ok") -> pathlib.Path:
    """The file under ``cache_root()/folder`` that records an answer of the installed XLA
    about ``parts``: keyed by that XLA, so another jaxlib asks again."""
    key = hashlib.sha256(json.dumps([installed_xla_key(), *parts]).encode()).hexdigest()[:32]
    return cache_root() / folder / f"{key}{suffix}"


def _accepted_marker(xla_flags: str, options_json: str) -> pathlib.Path:
    """The file that records that the installed XLA accepted these flags and options."""
    return installed_xla_marker("flags", xla_flags, options_json)


@functools.lru_cache(maxsize=64)
def _validate_cached(xla_flags: str, options_json: str) -> None:
    """Check with a child process, once per installed XLA: what it accepted is remembered on
    disk (``cache_root()/flags``), keyed by the XLA it was checked against; a rejection is
    checked again next time."""
    marker = _accepted_marker(xla_flags, options_json)
    if marker.exists():
        return
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
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next check
        atomic_write_text(marker, "")


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
