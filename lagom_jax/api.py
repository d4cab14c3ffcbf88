"""``lagom_jax.tune``: capture a jitted step, plan, apply the Plan, and never break the step.

The step may be jitted by any wrapper that has JAX's AOT stages (``jax.jit``/pjit,
``eqx.filter_jit``, ``nnx.jit``, haliax's ``named_jit``: ``program.step``). The whole flow of
tuning one input signature::

    lowered  = step.lower(*args)                         # the wrapper's own lowering, for this host
    job      = job.run(StepSource(step, args), hw, structures=...)  # the pipeline every face runs:
               # the step's CUDA lowering compiled deviceless for hw, read, planned (NCCL settings
               # and, with search="full", the structure search), validated, verified
    tuned    = lowered.compile(compiler_options=job.plan.compiler_options())  # kept and called

Any exception on that path leaves the user's step running untuned (the step itself, as
its wrapper runs it) with a warning that says why. A wrapper whose compiled stage cannot
be called with the step's arguments (haliax's ``named_jit``) runs untuned here, and the
warning gives the plan's launch file, whose XLA_FLAGS apply the plan from the next start.

A new input signature is tuned again only where ``jax.jit`` would compile again: arrays are
keyed by shape, dtype and the layout of their shards (equivalent shardings, such as one
naming a mesh axis of size 1, are one signature), and a signature whose lowering is one
already tuned shares its executable. A re-tune says why in one line (``RetuneWarning``).

With ``retune=`` the decorator then watches the step (`Retune`): when the measured step
time drifts from the Plan's prediction, the hardware is recalibrated from the measurement
and the step re-planned and recompiled, a bounded number of times.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import shlex
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from lagom_jax import files, job, search as search_lib
from lagom_jax.bench import protocol as bench_protocol
from lagom_jax.cluster import hardware as hardware_lib, nccl_env as nccl_env_lib
from lagom_jax.costs import calibrate as calibrate_lib
from lagom_jax.files import atomic_write_text
from lagom_jax.plan import nccl_settings, planning, sharing
from lagom_jax.plan.cache import PlanCache
from lagom_jax.plan.planning import BASELINES, VERSION, make_plan
from lagom_jax.plan.schema import Plan
from lagom_jax.program import environment, flags as flags_lib, jax_internals
from lagom_jax.program import step as step_lib

__all__ = ["BASELINES", "Retune", "RetuneWarning", "SEARCHES", "Tuned", "TuningWarning", "apply_nccl_env",
           "auto_hardware", "launch_line", "make_plan", "nccl_env", "tune"]

# What the decorator may search on a step's first call (``tune(search=...)``): "full", the
# pipeline ``lagom-jax tune`` runs, structure search included; "fast", without the structure
# search (the plan says what that left out).
SEARCHES = ("full", "fast")


class TuningWarning(UserWarning):
    """Tuning did not (fully) happen; the step still runs."""


class RetuneWarning(UserWarning):
    """A new input signature of a tuned step is tuned again; the message says what changed."""


def auto_hardware(devices: list[Any] | None = None) -> tuple[hardware_lib.HardwareProfile, str]:
    """A preset for the devices this process sees, and a sentence saying what was chosen."""
    resolved = hardware_lib.resolve_cluster("auto", devices=devices)
    return resolved.hardware, resolved.note


_LAYOUTS: dict[tuple[Any, tuple[int, ...]], Any] = {}


def _layout(sharding: Any, shape: tuple[int, ...]) -> Any:
    """Which shard of an array of ``shape`` each device holds under ``sharding``: equal for
    shardings ``jax.jit`` runs with one executable (a mesh axis of size 1 named or not)."""
    key = (sharding, shape)
    try:
        return _LAYOUTS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable sharding: itself
        return sharding
    try:
        shards = sharding.devices_indices_map(shape)
        layout = (getattr(sharding, "memory_kind", None),
                  tuple(sorted((d.id, tuple((s.start, s.stop, s.step) for s in index))
                               for d, index in shards.items())))
    except Exception:  # noqa: BLE001 - a sharding that cannot say: compare it as it is
        layout = sharding
    if len(_LAYOUTS) > 4096:
        _LAYOUTS.clear()
    _LAYOUTS[key] = layout
    return layout


class _ArrayKey(NamedTuple):
    """What of an array argument decides the executable."""

    shape: tuple[int, ...]
    dtype: Any
    layout: Any  # ``_layout``
    weak_type: bool


def _leaf_key(x: Any, traced_scalars: bool) -> Any:
    """What of one argument leaf decides the compiled executable (hashable, cheap).

    ``jax.jit`` traces Python scalars as weakly typed arrays, so there their type matters,
    not their value (keying on the value would tune again for every new learning rate);
    other wrappers may hold them static (equinox does), so there the value is the key.
    """
    if isinstance(x, jax.Array):
        return _ArrayKey(x.shape, x.dtype, _layout(x.sharding, x.shape), x.weak_type)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        shape = tuple(x.shape)
        sharding = getattr(x, "sharding", None)
        return _ArrayKey(shape, str(x.dtype), None if sharding is None else _layout(sharding, shape),
                         getattr(x, "weak_type", False))
    if traced_scalars and isinstance(x, (bool, int, float, complex)):
        return type(x)
    return _static_key(x)


def _static_key(x: Any) -> Any:
    try:
        hash(x)
        return ("static", type(x), x)
    except TypeError:
        return ("static-object", type(x).__name__, id(x))


@dataclasses.dataclass(frozen=True)
class _Statics:
    """The wrapped jit's static arguments: part of the key, not passed to an executable."""

    argnums: frozenset[int] = frozenset()
    argnames: frozenset[str] = frozenset()

    @classmethod
    def of(cls, jitted: Any) -> _Statics:
        argnums, argnames = jax_internals.jit_statics(jitted)
        return cls(frozenset(argnums), frozenset(argnames))

    def split(self, args: tuple, kwargs: Mapping[str, Any]):
        """(dynamic args, dynamic kwargs, static part) of one call."""
        if not self.argnums and not self.argnames:
            return args, kwargs, ()
        n = len(args)
        static_pos = {i % n for i in self.argnums if -n <= i < n}
        dyn_args = tuple(a for i, a in enumerate(args) if i not in static_pos)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.argnames}
        static = (tuple((i, _static_key(args[i])) for i in sorted(static_pos)),
                  tuple((k, _static_key(v)) for k, v in sorted(kwargs.items())
                        if k in self.argnames))
        return dyn_args, dyn_kwargs, static


def _signature(args: tuple, kwargs: Mapping[str, Any], static: Any = (), traced_scalars: bool = True) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten((args, dict(kwargs)))
    return (treedef, tuple(_leaf_key(x, traced_scalars) for x in leaves), static)


def _describe_leaf(key: Any) -> str:
    if isinstance(key, _ArrayKey):
        return f"{key.dtype}{list(key.shape)}"
    if isinstance(key, tuple) and key and key[0] == "static":
        return f"static {key[2]!r}"
    return getattr(key, "__name__", str(key))


def _what_changed(new: tuple, old: tuple, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """The first difference between two signatures, named by the argument's path."""
    if new[0] != old[0]:
        return f"the arguments' structure changed ({new[0].num_leaves} leaves, were {old[0].num_leaves})"
    if new[2] != old[2]:
        return "a static argument changed"
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path((args, dict(kwargs)))[0]]
    for path, a, b in zip(paths, new[1], old[1]):
        if a == b:
            continue
        if isinstance(a, _ArrayKey) and isinstance(b, _ArrayKey) and a[:2] == b[:2]:
            what = "the layout of its shards (its sharding)" if a.layout != b.layout else "its weak type"
            return f"argument {path}: {what} changed"
        return f"argument {path}: {_describe_leaf(b)} -> {_describe_leaf(a)}"
    return "the signature changed"


@dataclasses.dataclass(frozen=True)
class Retune:
    """When the decorator re-plans a step from its measured times.

    After ``warmup`` calls of one input signature, the intervals between the next
    ``window`` + 1 consecutive calls are its measured step time. No call is blocked for
    this: with JAX's asynchronous dispatch the host runs at the device's pace once the
    queue is full, so the interval is the step time in steady state (plus whatever the
    host does between steps). When the median differs from the Plan's predicted step by
    more than ``threshold`` (relative), the hardware profile is scaled by measured /
    predicted (`calibrate.scaled`), the step re-planned and recompiled with the new Plan's
    options; at most ``max_replans`` times per signature, after which watching stops.
    Process 0's median is the one every process of a ``jax.distributed`` job decides on.
    """

    warmup: int = 3
    window: int = 10
    threshold: float = 0.5
    max_replans: int = 1

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.window < 1 or self.max_replans < 0:
            raise ValueError(f"retune needs warmup >= 0, window >= 1, max_replans >= 0, got {self}")
        if not self.threshold > 0:
            raise ValueError(f"retune threshold must be > 0, got {self.threshold}")


@dataclasses.dataclass
class _Watch:
    """What re-planning one signature needs, and the times measured so far."""

    lowered: Any  # the wrapper's lowered stage, compiled again with a new plan's options
    run: step_lib.Executable
    compiled: job.Compiled
    plan: Plan
    calls: int = 0
    last: float | None = None
    intervals: list[float] = dataclasses.field(default_factory=list)
    replans: int = 0

    @property
    def hw(self) -> hardware_lib.HardwareProfile:
        return self.compiled.hardware


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One signature: the executable that runs it (None: the step as its wrapper runs it)."""

    run: step_lib.Executable | None
    plan: Plan | None


_UNTUNED = _Entry(None, None)


class Tuned:
    """A jitted function that compiles each input signature once, with its tuned Plan.

    It mirrors the function it wraps: same call, ``lower``, ``trace``, ``__wrapped__``,
    and ``plan(*args)`` for the Plan of a signature. ``tunes`` counts the pipeline's runs.
    """

    def __init__(self, fn: Callable, *, hardware="auto", strategy: str = "lagom", search: str = "full",
                 cache_dir: str | os.PathLike[str] | None = None, use_cache: bool = True,
                 plan_dir: str | os.PathLike[str] | None = None,
                 with_profile: bool = False, verbose: bool = False,
                 retune: Retune | bool | None = None, min_gain: float | None = None,
                 nccl_env: Mapping[str, str] | None = None) -> None:
        if strategy not in search_lib.STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(search_lib.STRATEGIES)})")
        if search not in SEARCHES:
            raise ValueError(f"unknown search {search!r} (known: {', '.join(SEARCHES)})")
        self._space = search_lib.Space(min_gain=min_gain)  # ValueError for a bad min_gain
        # The NCCL variables the job runs with (``lagom-jax tune --nccl-env``): checked now,
        # planned inside, and set with the plan's environment. ValueError for a bad one.
        self._nccl_env = dict(nccl_env or {})
        nccl_env_lib.NcclEnv.from_environ(self._nccl_env)
        for line in nccl_env_lib.unpriced(self._nccl_env):
            warnings.warn(f"lagom-jax: {line}", TuningWarning, stacklevel=2)
        self._step = fn
        self._staged = step_lib.has_stages(fn)
        if not self._staged:
            warnings.warn(f"lagom-jax: got {step_lib.describe(fn)}, which has no AOT stages (lower, compile) to "
                          "tune; put @lagom_jax.tune above a jitted step (jax.jit, eqx.filter_jit, nnx.jit, "
                          "haliax's named_jit). It runs as given, untuned", TuningWarning, stacklevel=3)
        self.__wrapped__ = fn
        functools.update_wrapper(self, fn, updated=())
        self._what = step_lib.describe(fn)
        self._hardware = hardware
        self._strategy = strategy
        self._search = search
        self._cache = PlanCache(cache_dir) if use_cache else None
        self._plan_dir = None if plan_dir is None else pathlib.Path(plan_dir)
        self._with_profile = with_profile
        self._verbose = verbose
        self._statics = _Statics.of(fn)
        self._traced_scalars = jax_internals.is_jax_jit(fn)
        self._entries: dict[tuple, _Entry] = {}
        self._lowerings: dict[str, _Entry] = {}  # by the fingerprint of the step's lowering here
        self._retune = Retune() if retune is True else (retune or None)
        self._watch: dict[tuple, _Watch] = {}
        # Under `lagom-jax bench` (a user's program as the workload): time every call, tune nothing.
        self._reporter = bench_protocol.StepReporter.from_environ()
        self.tunes = 0  # runs of the pipeline, over all signatures
        self.replans = 0  # re-plans made on measured drift, over all signatures
        self.recalibrated: list[hardware_lib.HardwareProfile] = []  # the profiles they used

    # -- the jit surface ------------------------------------------------------------------
    def lower(self, *args, **kwargs):
        return self._step.lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        trace = getattr(self._step, "trace", None)
        if trace is None:
            raise AttributeError(f"{self._what} has no trace stage")
        return trace(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)

    def _key(self, args: tuple, kwargs: Mapping[str, Any]):
        dyn_args, dyn_kwargs, static = self._statics.split(args, kwargs)
        return _signature(dyn_args, dyn_kwargs, static, self._traced_scalars), dyn_args, dyn_kwargs

    def _entry(self, args: tuple, kwargs: Mapping[str, Any]):
        key, dyn_args, dyn_kwargs = self._key(args, kwargs)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._tune(args, kwargs, key, dyn_args, dyn_kwargs)
        return key, entry, dyn_args, dyn_kwargs

    def __call__(self, *args, **kwargs):
        if self._reporter is not None:  # the bench's arm, not this decorator, sets the treatment
            self._reporter.before()
            out = self._step(*args, **kwargs)
            self._reporter.called(out, lambda: self._step.lower(*args, **kwargs).compile().as_text())
            return out
        if not self._staged:
            return self._step(*args, **kwargs)
        key, entry, dyn_args, dyn_kwargs = self._entry(args, kwargs)
        if entry.run is None:
            return self._step(*args, **kwargs)
        try:
            out = entry.run(args, kwargs, dyn_args, dyn_kwargs)
        except TypeError as err:  # the executable refuses these arguments: the wrapper decides
            warnings.warn(f"lagom-jax: the tuned executable refused this call ({err}); "
                          "running the step untuned", TuningWarning, stacklevel=2)
            self._entries[key] = _UNTUNED
            self._watch.pop(key, None)
            return self._step(*args, **kwargs)
        watch = self._watch.get(key)
        if watch is not None:
            self._observe(key, watch)
        return out

    def plan(self, *args, **kwargs) -> Plan | None:
        """The Plan of this input signature (tuning first if needed); None if tuning failed."""
        if not self._staged:
            return None
        return self._entry(args, kwargs)[1].plan

    # -- tuning -------------------------------------------------------------------------
    def _tune(self, args, kwargs, key: tuple, dyn_args: tuple, dyn_kwargs: Mapping[str, Any]) -> _Entry:
        try:
            lowered = step_lib.lower(self._step, args, kwargs)
            lowering = hashlib.sha256(step_lib.jax_lowered(lowered).as_text().encode()).hexdigest()
        except Exception as err:  # the user's own program fails to lower: let the wrapper say so
            warnings.warn(f"lagom-jax: could not lower the step for tuning ({type(err).__name__}: {err}); "
                          "running it untuned", TuningWarning, stacklevel=4)
            return _UNTUNED
        same = self._lowerings.get(lowering)
        if same is not None:  # jax.jit would run this signature with the executable it has
            return same
        if self._entries:
            old = next(reversed(self._entries))
            jit = "jax.jit" if self._traced_scalars else self._what
            warnings.warn(f"lagom-jax: tuning {self._name()} again for a new input signature, which {jit} "
                          f"compiles again too: {_what_changed(key, old, dyn_args, dyn_kwargs)}",
                          RetuneWarning, stacklevel=4)
        entry = self._lowerings[lowering] = self._tune_lowered(lowered, args, kwargs, key, dyn_args, dyn_kwargs)
        return entry

    def _name(self) -> str:
        return getattr(self._step, "__name__", self._what)

    def _tune_lowered(self, lowered, args, kwargs, key, dyn_args, dyn_kwargs) -> _Entry:
        bad = environment.bad_environment()  # before anything loads a mismatched plugin
        if bad is not None:
            warnings.warn(f"lagom-jax: {bad}; running the step untuned", TuningWarning, stacklevel=5)
            return _UNTUNED
        self.tunes += 1
        try:
            resolved = hardware_lib.resolve_cluster(self._hardware)
            hw, note = resolved.hardware, resolved.note
            if self._nccl_env:
                hw = dataclasses.replace(hw, nccl_env=nccl_env_lib.pinned(hw.nccl_env, self._nccl_env))
            self._log(note)
            compiled = job.compile_source(job.StepSource(self._step, args, kwargs, lowered), hw, log=self._log)
            for warning in compiled.warnings:
                warnings.warn(f"lagom-jax: {warning}", TuningWarning, stacklevel=5)
            plan, made = self._plan_for(compiled)
            options = plan.compiler_options(with_profile=self._with_profile)
            flags_lib.validate("", options)
            run, why = step_lib.executable(lowered, options, dyn_args, dyn_kwargs, self._what)
            folder = self._write(plan, compiled, made, force=run is None)
        except Exception as err:
            warnings.warn(f"lagom-jax: tuning failed, running the step untuned: "
                          f"{type(err).__name__}: {err}", TuningWarning, stacklevel=5)
            return _UNTUNED
        if run is None:
            warnings.warn(f"lagom-jax: {why}, so the plan cannot run in this process and the step runs untuned "
                          f"here; it applies from the next start: {folder / 'launch.sh'} python train.py "
                          "(XLA_FLAGS, the NCCL environment and the tuner plugin)", TuningWarning, stacklevel=5)
            return _Entry(None, plan)
        apply_nccl_env(plan)
        unmet = nccl_settings.unmet_needs(plan, nccl_settings.installed_nccl_version())
        if unmet:
            warnings.warn(f"lagom-jax: {unmet}", TuningWarning, stacklevel=5)
        if self._retune is not None:
            self._watch[key] = _Watch(lowered, run, compiled, plan)
        return _Entry(run, plan)

    def _log(self, message: str) -> None:
        if self._verbose:
            print(f"lagom-jax: {message}")

    def _write(self, plan: Plan, compiled: job.Compiled, made: job.Job | None, *, force: bool) -> pathlib.Path:
        """The plan's folder (``plan_dir``, else under the cache) when asked for or needed."""
        root = self._plan_dir or files.cache_root() / "launch"
        folder = root / f"{plan.module}-{plan.fingerprint[:12]}"
        if self._plan_dir is None and not force:
            return folder
        if made is None:  # a cached plan: the job behind it is not here, so no trace
            made = job.Job(plan, None, compiled)  # type: ignore[arg-type]
        made.write(folder, self._log)
        return folder

    def _plan_for(self, compiled: job.Compiled) -> tuple[Plan, job.Job | None]:
        """The pipeline's plan of the compiled step (steps 2-5 of ``job``), from the cache where
        it holds one for this module, cluster, strategy, search and version."""
        fingerprint = hashlib.sha256(compiled.text.encode()).hexdigest()
        hw = compiled.hardware
        key = PlanCache.key(fingerprint, hw.to_json(),
                            f"{self._strategy} min_gain={self._space.min_gain} search={self._search}", VERSION)
        if self._cache is not None:
            try:
                cached = self._cache.get(key)
            except ValueError as err:  # a corrupt file: tune again and overwrite it
                warnings.warn(f"lagom-jax: {err}; tuning again", TuningWarning, stacklevel=6)
                cached = None
            except OSError as err:
                warnings.warn(f"lagom-jax: cannot read the plan cache ({err}); tuning again",
                              TuningWarning, stacklevel=6)
                cached = None
            if cached is not None:
                return cached, None
        start = time.perf_counter()
        made: list[job.Job] = []

        def tune() -> Plan:
            made.append(self._job(compiled))
            return made[0].plan

        plan = sharing.one_plan_for_all_processes(key, tune)
        self._log(f"tuned {plan.module} in {time.perf_counter() - start:.2f}s")
        if self._cache is not None:
            try:
                self._cache.put(key, plan)
            except OSError as err:
                warnings.warn(f"lagom-jax: could not write the plan cache ({err}); "
                              "the plan is used but not cached", TuningWarning, stacklevel=6)
        return plan, (made[0] if made else None)

    def _job(self, compiled: job.Compiled) -> job.Job:
        full = self._search == "full"
        made = job.plan_compiled(compiled, strategy=self._strategy, structures=full, log=self._log,
                                 space=self._space)
        if full or compiled.recompile is None:
            return made
        plan = made.plan
        not_searched = ("structure search", (
            f"not run (search='fast'): the collective pipeliner, while-loop double buffering and combine-by-dim "
            f"were not compiled and priced; the most any restructuring could gain is the step's distance to its "
            f"overlap bound, {(plan.makespan_us - plan.bound_us) / 1e3:.3f} ms of {plan.makespan_us / 1e3:.3f} ms "
            "predicted; search='full' (the default) searches them"))
        decisions = tuple(d for d in plan.decisions if d[0] != "structure search") + (not_searched,)
        plan = dataclasses.replace(plan, decisions=decisions)
        return dataclasses.replace(made, plan=plan, planned=dataclasses.replace(made.planned, plan=plan))

    def _observe(self, key: tuple, w: _Watch) -> None:
        """Count one finished call of ``key``; at the end of a window, compare and decide."""
        assert self._retune is not None
        now = time.perf_counter()
        if w.last is not None and w.calls > self._retune.warmup:
            w.intervals.append(now - w.last)
        w.last, w.calls = now, w.calls + 1
        if len(w.intervals) < self._retune.window:
            return
        intervals, w.intervals, w.calls, w.last = w.intervals, [], 0, None
        measured = sharing.one_value_for_all_processes(
            f"{w.plan.fingerprint}/{w.hw.name}/{w.replans}", lambda: statistics.median(intervals) * 1e6)
        predicted = dict(w.plan.predicted_us).get(w.plan.strategy, 0.0)
        ratio = measured / predicted if predicted > 0 else 1.0
        if abs(ratio - 1) <= self._retune.threshold or w.replans >= self._retune.max_replans:
            del self._watch[key]  # agrees, or re-planned as often as allowed: stop watching
            return
        try:
            hw = _recalibrated(w, measured)
            compiled = dataclasses.replace(w.compiled, hardware=hw)
            plan = self._job(compiled).plan
            options = plan.compiler_options(with_profile=self._with_profile)
            flags_lib.validate("", options)
            run = dataclasses.replace(w.run, compiled=w.lowered.compile(compiler_options=options))
        except Exception as err:  # keep the running executable; never break the step
            warnings.warn(f"lagom-jax: re-planning on drift failed, keeping the current plan: "
                          f"{type(err).__name__}: {err}", TuningWarning, stacklevel=4)
            del self._watch[key]
            return
        warnings.warn(f"lagom-jax: measured step {measured / 1e3:.3f} ms against {predicted / 1e3:.3f} ms "
                      f"predicted (x{ratio:.2f}, beyond the {self._retune.threshold:.0%} threshold): "
                      f"hardware recalibrated by that factor and the step re-planned "
                      f"({w.replans + 1} of at most {self._retune.max_replans})", TuningWarning, stacklevel=4)
        self._entries[key] = _Entry(run, plan)
        w.compiled, w.run, w.plan, w.replans = compiled, run, plan, w.replans + 1
        self.replans += 1
        self.recalibrated.append(hw)


def _recalibrated(w: _Watch, measured_us: float) -> hardware_lib.HardwareProfile:
    """``w.hw`` slowed (or sped up) uniformly until its prediction of the step is the
    measured time: a few multiplicative fixed-point steps on `calibrate.scaled`, since
    launch costs and overlap make the predicted time not proportional to the factor. The
    prediction under XLA/NCCL defaults is fitted to what the measurement implies for it
    (measured x default / planned, both as the Plan predicted them)."""
    predicted = dict(w.plan.predicted_us)
    chosen = predicted.get(w.plan.strategy, 0.0)
    target = measured_us * predicted.get("xla-default", chosen) / chosen if chosen > 0 else measured_us
    graph = w.compiled.graph()
    space, _ = planning.module_space(graph)  # as the Plan was made
    name = f"{w.hw.name.removesuffix('-measured')}-measured"
    factor = measured_us / chosen if chosen > 0 else 1.0
    for _ in range(4):
        got = planning.plan(graph, calibrate_lib.scaled(w.hw, factor), strategy="xla-default",
                            baselines=(), space=space).plan.predicted_us
        factor *= target / dict(got)["xla-default"]
    return calibrate_lib.scaled(w.hw, factor, name=name)


def nccl_env(plan: Plan, config_path: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The plan's NCCL environment, writing its tuner config where the env points.

    The config goes to ``config_path`` (default ``plan.tuner_config_path()``) only when the
    tuner plugin is built, since only then does the environment load it.
    """
    env = plan.nccl_env(config_path=config_path)
    if "NCCL_TUNER_PLUGIN" in env:
        atomic_write_text(config_path or plan.tuner_config_path(), plan.nccl_tuner_config())
    return env


def launch_line(plan: Plan, command: str = "python train.py", *,
                config_path: str | os.PathLike[str] | None = None) -> str:
    """The shell line that starts a job with this plan's NCCL environment and XLA flags."""
    env = nccl_env(plan, config_path)
    env["XLA_FLAGS"] = plan.xla_flags()
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + f" {command}"


def apply_nccl_env(plan: Plan, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Put the plan's NCCL environment into this process, only while that is safe.

    NCCL reads its environment when a communicator is created, and XLA creates them
    lazily once a GPU backend is up; after that, a change would apply to some
    communicators and not others. So the environment is set only while no GPU backend has
    started (NCCL cannot have a communicator yet); otherwise nothing is changed and a
    warning gives the exact launch line. Returns what was set.
    """
    environ = os.environ if environ is None else environ
    missing = {k: v for k, v in nccl_env(plan).items() if environ.get(k) != v}
    if not missing:
        return {}
    if jax_internals.gpu_backend_started():
        warnings.warn("lagom-jax: NCCL settings must be in place before the first NCCL "
                      f"communicator exists; relaunch with: {launch_line(plan)}",
                      TuningWarning, stacklevel=2)
        return {}
    environ.update(missing)
    return missing


def tune(fn: Callable | None = None, **options) -> Tuned | Callable[[Callable], Tuned]:
    """``@lagom_jax.tune(hardware=...)`` above ``@jax.jit``, or ``lagom_jax.tune(jitted, ...)``."""
    if fn is None:
        return lambda f: Tuned(f, **options)
    return Tuned(fn, **options)
