"""``lagom_jax.tune``: capture a jitted step, plan, apply the Plan, and never break the step.

The whole flow of tuning one input signature::

    lowered  = jitted.lower(*args)                      # JAX's own lowering
    baseline = lowered.compile()                        # the untuned executable
    graph    = graph.from_hlo_text(baseline.as_text())  # StepGraph of the compiled HLO
                                 # (off a GPU host: of XLA:GPU's deviceless compile of it)
    plan     = planning.plan(graph, hw, strategy).plan  # search + baselines -> Plan
    flags.validate(options=plan.compiler_options())     # the installed XLA accepts them
    tuned    = lowered.compile(compiler_options=...)    # the tuned executable, kept

Any exception on that path leaves the user's step running untuned (the baseline
executable, or plain ``jitted`` if even that failed) with a warning that says why.

With ``retune=`` the decorator then watches the step (`Retune`): when the measured step
time drifts from the Plan's prediction, the hardware is recalibrated from the measurement
and the step re-planned and recompiled, a bounded number of times.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shlex
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax

from lagom_jax import job, search as search_lib
from lagom_jax.cluster import hardware as hardware_lib, nccl_env as nccl_env_lib
from lagom_jax.costs import calibrate as calibrate_lib
from lagom_jax.files import atomic_write_text
from lagom_jax.plan import nccl_settings, planning, sharing
from lagom_jax.plan.cache import PlanCache
from lagom_jax.plan.planning import BASELINES, VERSION, make_plan
from lagom_jax.plan.schema import Plan
from lagom_jax.program import environment, flags as flags_lib, graph as graph_lib, jax_internals

__all__ = ["BASELINES", "Retune", "Tuned", "TuningWarning", "apply_nccl_env", "auto_hardware",
           "launch_line", "make_plan", "nccl_env", "tune"]


class TuningWarning(UserWarning):
    """Tuning did not (fully) happen; the step still runs."""


def auto_hardware(devices: list[Any] | None = None) -> tuple[hardware_lib.HardwareProfile, str]:
    """A preset for the devices this process sees, and a sentence saying what was chosen."""
    resolved = hardware_lib.resolve_cluster("auto", devices=devices)
    return resolved.hardware, resolved.note


def _leaf_key(x: Any) -> Any:
    """What of one traced argument leaf decides the compiled executable (hashable, cheap).

    Python scalars are traced as weakly typed arrays, so their type matters, not their
    value (keying on the value would tune again for every new learning rate).
    """
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, x.sharding, x.weak_type)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return (tuple(x.shape), str(x.dtype), getattr(x, "sharding", None),
                getattr(x, "weak_type", False))
    return type(x)


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


def _signature(args: tuple, kwargs: Mapping[str, Any], static: Any = ()) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten((args, dict(kwargs)))
    return (treedef, tuple(_leaf_key(x) for x in leaves), static)


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

    lowered: Any
    text: str
    hw: hardware_lib.HardwareProfile
    plan: Plan
    calls: int = 0
    last: float | None = None
    intervals: list[float] = dataclasses.field(default_factory=list)
    replans: int = 0


class Tuned:
    """A jitted function that compiles each input signature once, with its tuned Plan.

    It mirrors the function it wraps: same call, ``lower``, ``trace``, ``__wrapped__``,
    and ``plan(*args)`` for the Plan of a signature.
    """

    def __init__(self, fn: Callable, *, hardware="auto", strategy: str = "lagom",
                 cache_dir: str | os.PathLike[str] | None = None, use_cache: bool = True,
                 with_profile: bool = False, verbose: bool = False,
                 retune: Retune | bool | None = None, min_gain: float | None = None,
                 nccl_env: Mapping[str, str] | None = None) -> None:
        if strategy not in search_lib.STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(search_lib.STRATEGIES)})")
        self._space = search_lib.Space(min_gain=min_gain)  # ValueError for a bad min_gain
        # The NCCL variables the job runs with (``lagom-jax tune --nccl-env``): checked now,
        # planned inside, and set with the plan's environment. ValueError for a bad one.
        self._nccl_env = dict(nccl_env or {})
        nccl_env_lib.NcclEnv.from_environ(self._nccl_env)
        for line in nccl_env_lib.unpriced(self._nccl_env):
            warnings.warn(f"lagom-jax: {line}", TuningWarning, stacklevel=2)
        self._jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        self.__wrapped__ = fn
        functools.update_wrapper(self, fn, updated=())
        self._hardware = hardware
        self._strategy = strategy
        self._cache = PlanCache(cache_dir) if use_cache else None
        self._with_profile = with_profile
        self._verbose = verbose
        self._statics = _Statics.of(self._jitted)
        self._entries: dict[tuple, tuple[Callable, Plan | None]] = {}
        self._retune = Retune() if retune is True else (retune or None)
        self._watch: dict[tuple, _Watch] = {}
        self.replans = 0  # re-plans made on measured drift, over all signatures
        self.recalibrated: list[hardware_lib.HardwareProfile] = []  # the profiles they used

    # -- the jit surface ------------------------------------------------------------------
    def lower(self, *args, **kwargs):
        return self._jitted.lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return self._jitted.trace(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(self, *args, **kwargs):
        dyn_args, dyn_kwargs, static = self._statics.split(args, kwargs)
        key = _signature(dyn_args, dyn_kwargs, static)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._tune(args, kwargs, key)
        executable = entry[0]
        if executable is self._jitted:
            return executable(*args, **kwargs)
        try:
            out = executable(*dyn_args, **dyn_kwargs)
        except TypeError as err:  # the executable refuses these arguments: jit decides
            warnings.warn(f"lagom-jax: the tuned executable refused this call ({err}); "
                          "running the step untuned", TuningWarning, stacklevel=2)
            self._entries[key] = (self._jitted, None)
            self._watch.pop(key, None)
            return self._jitted(*args, **kwargs)
        watch = self._watch.get(key)
        if watch is not None:
            self._observe(key, watch)
        return out

    def plan(self, *args, **kwargs) -> Plan | None:
        """The Plan of this input signature (tuning first if needed); None if tuning failed."""
        dyn_args, dyn_kwargs, static = self._statics.split(args, kwargs)
        key = _signature(dyn_args, dyn_kwargs, static)
        if key not in self._entries:
            self._entries[key] = self._tune(args, kwargs, key)
        return self._entries[key][1]

    # -- tuning -------------------------------------------------------------------------
    def _tune(self, args, kwargs, key: tuple = ()) -> tuple[Callable, Plan | None]:
        try:
            lowered = self._jitted.lower(*args, **kwargs)
            baseline = lowered.compile()
        except Exception as err:  # the user's own program fails to lower: let jit say so
            warnings.warn(f"lagom-jax: could not compile the step for tuning ({err}); running it untuned",
                          TuningWarning, stacklevel=3)
            return self._jitted, None
        bad = environment.bad_environment()  # before anything loads a mismatched plugin
        if bad is not None:
            warnings.warn(f"lagom-jax: {bad}; running the step untuned", TuningWarning, stacklevel=3)
            return baseline, None
        try:
            resolved = hardware_lib.resolve_cluster(self._hardware)
            hw, note = resolved.hardware, resolved.note
            if self._nccl_env:
                hw = dataclasses.replace(hw, nccl_env=nccl_env_lib.pinned(hw.nccl_env, self._nccl_env))
            if self._verbose:
                print(f"lagom-jax: {note}")
            text = self._module_text(baseline, args, kwargs, hw)
            plan = self._plan_for(text, hw)
            tuned = self._compile(lowered, plan)
        except Exception as err:
            warnings.warn(f"lagom-jax: tuning failed, running the step untuned: "
                          f"{type(err).__name__}: {err}", TuningWarning, stacklevel=3)
            return baseline, None
        apply_nccl_env(plan)
        unmet = nccl_settings.unmet_needs(plan, nccl_settings.installed_nccl_version())
        if unmet:
            warnings.warn(f"lagom-jax: {unmet}", TuningWarning, stacklevel=3)
        if self._retune is not None:
            self._watch[key] = _Watch(lowered, text, hw, plan)
        return tuned, plan

    def _compile(self, lowered, plan: Plan):
        options = plan.compiler_options(with_profile=self._with_profile)
        flags_lib.validate("", options)
        return lowered.compile(compiler_options=options)

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
            plan = self._plan_for(w.text, hw)
            tuned = self._compile(w.lowered, plan)
        except Exception as err:  # keep the running executable; never break the step
            warnings.warn(f"lagom-jax: re-planning on drift failed, keeping the current plan: "
                          f"{type(err).__name__}: {err}", TuningWarning, stacklevel=4)
            del self._watch[key]
            return
        warnings.warn(f"lagom-jax: measured step {measured / 1e3:.3f} ms against {predicted / 1e3:.3f} ms "
                      f"predicted (x{ratio:.2f}, beyond the {self._retune.threshold:.0%} threshold): "
                      f"hardware recalibrated by that factor and the step re-planned "
                      f"({w.replans + 1} of at most {self._retune.max_replans})", TuningWarning, stacklevel=4)
        self._entries[key] = (tuned, plan)
        w.hw, w.plan, w.replans = hw, plan, w.replans + 1
        self.replans += 1
        self.recalibrated.append(hw)

    def _module_text(self, baseline, args, kwargs, hw: hardware_lib.HardwareProfile) -> str:
        """The module to tune: the pipeline's compile step (``job.compile_source``) for the
        step's own executable on a GPU host, else XLA's GPU pipeline deviceless for ``hw``;
        if that cannot be done, XLA:CPU's module stands in, with a warning of what it costs."""
        compiled = job.compile_source(job.StepSource(self._jitted, args, kwargs, baseline), hw,
                                      log=print if self._verbose else job.silent)
        for warning in compiled.warnings:
            warnings.warn(f"lagom-jax: {warning}", TuningWarning, stacklevel=4)
        return compiled.text

    def _plan_for(self, text: str, hw: hardware_lib.HardwareProfile) -> Plan:
        fingerprint = hashlib.sha256(text.encode()).hexdigest()
        key = PlanCache.key(fingerprint, hw.to_json(), f"{self._strategy} min_gain={self._space.min_gain}", VERSION)
        if self._cache is not None:
            try:
                cached = self._cache.get(key)
            except ValueError as err:  # a corrupt file: tune again and overwrite it
                warnings.warn(f"lagom-jax: {err}; tuning again", TuningWarning, stacklevel=4)
                cached = None
            except OSError as err:
                warnings.warn(f"lagom-jax: cannot read the plan cache ({err}); tuning again",
                              TuningWarning, stacklevel=4)
                cached = None
            if cached is not None:
                return cached
        start = time.perf_counter()

        def tune() -> Plan:
            graph = graph_lib.from_hlo_text(text)
            space, kept = planning.module_space(graph, self._space)
            made = planning.plan(graph, hw, strategy=self._strategy, fingerprint=fingerprint, space=space).plan
            return nccl_settings.carrying_cluster_settings(
                dataclasses.replace(made, decisions=made.decisions + kept), hw)

        plan = sharing.one_plan_for_all_processes(key, tune)
        if self._verbose:
            print(f"lagom-jax: tuned {plan.module} in {time.perf_counter() - start:.2f}s")
        if self._cache is not None:
            try:
                self._cache.put(key, plan)
            except OSError as err:
                warnings.warn(f"lagom-jax: could not write the plan cache ({err}); "
                              "the plan is used but not cached", TuningWarning, stacklevel=4)
        return plan


def _recalibrated(w: _Watch, measured_us: float) -> hardware_lib.HardwareProfile:
    """``w.hw`` slowed (or sped up) uniformly until its prediction of the step is the
    measured time: a few multiplicative fixed-point steps on `calibrate.scaled`, since
    launch costs and overlap make the predicted time not proportional to the factor. The
    prediction under XLA/NCCL defaults is fitted to what the measurement implies for it
    (measured x default / planned, both as the Plan predicted them)."""
    predicted = dict(w.plan.predicted_us)
    chosen = predicted.get(w.plan.strategy, 0.0)
    target = measured_us * predicted.get("xla-default", chosen) / chosen if chosen > 0 else measured_us
    graph = graph_lib.from_hlo_text(w.text)
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
