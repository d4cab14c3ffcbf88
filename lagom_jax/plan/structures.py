"""Compile-in-the-loop: the structure of a scanned program, chosen by compiling it.

Some XLA flags rewrite the program in ways no pass here mimics: the collective pipeliner
(``xla_gpu_pipeline_{all_gather,reduce_scatter,all_reduce}`` on or off, before jaxlib 0.11
``xla_gpu_enable_pipelined_*``: move a layer's collective into the previous or next loop
iteration), while-loop double buffering (unroll
the layer loop by two so one iteration's collectives overlap the other's compute) and
combining all-gathers or reduce-scatters only along one dimension. Each is a candidate the
search takes or leaves, priced by what it does: the step is compiled deviceless with the
flag, read, searched, and its predicted step compared with the best so far.

The search is greedy over the candidates, in order of the exposed communication of the
collective kinds each one touches (a flag for a kind with nothing exposed cannot shorten
the step and is not compiled); a candidate is taken when it shortens the predicted step
by more than ``MIN_GAIN``. Each distinct set of flags is compiled at most once (cached by
the source module's fingerprint and the flags), and the result says how many compiles ran
and how long they took.

Candidates are spelled for the installed XLA (``flags.for_installed``): one it renamed is
compiled under its new name, one that is already the installed XLA's default is not
compiled, and one it lacks is left with a line saying so. A compile that fails leaves its
candidate with XLA's reason; it never ends the search.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from lagom_jax import search as search_lib
from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.plan import planning
from lagom_jax.program import graph as graph_lib
from lagom_jax.program import flags as flags_lib
from lagom_jax.program import hlo
from lagom_jax.program.flags import KNOWN_FLAGS, XlaFlag

__all__ = ["CANDIDATES", "MIN_GAIN", "Candidate", "Outcome", "Recompiler", "search", "trials"]

# A structure is taken only for a predicted step this much shorter: below it the choice is
# within the noise of the cost model's step predictions (the fidelity benchmarks' spread).
MIN_GAIN = 0.01


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One flag away from XLA's default, and the collective kinds whose exposure it can hide."""

    flag: XlaFlag
    kinds: tuple[str, ...]
    needs_loop: bool = True
    # XLA combines the collectives this flag moves under combiner keys of their own, which
    # the combine pass does not model: with it taken, the search leaves those kinds'
    # combine thresholds at XLA's default (`search.Space.default_combine_kinds`).
    combines_apart: bool = False
    # The flag only keeps apart collectives XLA would otherwise combine (combine-by-dim on: the
    # gathered or scattered dimension joins the combiner's key): where the module XLA made
    # without it combined none of those kinds, the module with it is the same one.
    only_splits: bool = False
    # The flag rewrites only instructions of this opcode (its ``-start`` too): a module without
    # one compiles the same with it.
    needs_opcode: str = ""


def _toggle(name: str) -> XlaFlag:
    return XlaFlag(name, not KNOWN_FLAGS[name].default)


def _spelled(flag: XlaFlag) -> tuple[XlaFlag | None, str]:
    """(the flag as the installed XLA takes it, or None, and why not)."""
    try:
        installed = flags_lib.for_installed(flag)
    except flags_lib.FlagError as err:
        return None, f"left: {err}"
    if installed is None:
        return None, f"left: the installed XLA ({flags_lib.installed_version()}) has no such flag"
    if installed.is_default:
        return None, ""
    return installed, ""


CANDIDATES: tuple[Candidate, ...] = (
    # The pipeliner each way: which of the two is the installed XLA's default differs by
    # kind and release (0.10 pipelines reduce-scatters only; 0.11+ "default" follows the
    # optimization level), and the default one is never compiled.
    *(Candidate(XlaFlag(f"xla_gpu_pipeline_{kind.replace('-', '_')}", mode), (kind,), combines_apart=True)
      for kind in ("all-gather", "reduce-scatter", "all-reduce") for mode in ("on", "off")),
    Candidate(_toggle("xla_gpu_enable_while_loop_double_buffering"),
              ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")),
    # Combining by dimension keys the combiner by each collective's dimension too: the module
    # XLA compiles with it is what runs, and a threshold the search chose for it would not
    # compile to the module predicted (a plan that took it predicted 65 reduce-scatters
    # where the verify compile made 129).
    Candidate(_toggle("xla_gpu_enable_all_gather_combine_by_dim"), ("all-gather",), needs_loop=False,
              combines_apart=True, only_splits=KNOWN_FLAGS["xla_gpu_enable_all_gather_combine_by_dim"].default is False),
    Candidate(_toggle("xla_gpu_enable_reduce_scatter_combine_by_dim"), ("reduce-scatter",), needs_loop=False,
              combines_apart=True,
              only_splits=KNOWN_FLAGS["xla_gpu_enable_reduce_scatter_combine_by_dim"].default is False),
    # A dropless MoE's ragged all-to-all as a dense all-to-all of padded buffers: more bytes, but a
    # module without a ragged collective keeps XLA's latency-hiding scheduler on Hopper and
    # Blackwell (``HardwareProfile.xla_schedules_by_default``), and NCCL runs the exchange.
    Candidate(_toggle("xla_gpu_unsupported_enable_ragged_all_to_all_decomposer"), ("all-to-all",),
              needs_loop=False, needs_opcode="ragged-all-to-all"),
)


@functools.lru_cache(maxsize=4)
def _combined_kinds(text: str) -> frozenset[str]:
    """The collective kinds of which the module holds a combined instance (one instruction,
    sync or async start, over several operands). Cached: ``trials`` and ``search`` ask of
    the same module."""
    module = hlo.parse(text)
    out = set()
    for comp in module.computations:
        for inst in comp.instructions:
            kind = inst.opcode.removesuffix("-start")
            if kind in ("all-gather", "reduce-scatter", "all-reduce") and len(inst.operands) > 1:
                out.add(kind)
    return frozenset(out)


class Recompiler:
    """A source's ``recompile(options)`` that compiles each set of options once, and can
    queue some ahead (``start``) while the caller does other work: the compile runs in a
    process of its own (``hlo_compile``, ``gpu_compile``), so a thread only waits for it.
    The structure search and the verification share one, so neither compiles what the other
    already has. A compile started and never asked for is abandoned with its process.

    The queue runs one compile at a time beside the caller's own work. While the caller
    waits for one of them, a second worker takes the next in the queue, so the wait costs
    no core (Mixtral's 2x8 module on 2 cores: its verification compile no longer waits
    behind the structure trials)."""

    def __init__(self, compile_fn: Callable[[Mapping[str, Any]], str]) -> None:
        self._compile = compile_fn
        self._futures: dict[tuple, concurrent.futures.Future] = {}
        self._seconds: dict[tuple, float] = {}
        self._queue: list[tuple[tuple, Mapping[str, Any]]] = []  # started ahead, not begun
        self._workers = 0  # threads taking from the queue
        self._lock = threading.Lock()

    def _timed(self, key: tuple, options: Mapping[str, Any]) -> str:
        start = time.perf_counter()
        try:
            return self._compile(dict(options))
        finally:
            self._seconds[key] = time.perf_counter() - start

    def seconds(self, options: Mapping[str, Any]) -> float | None:
        """How long the compile with ``options`` took (None: not compiled yet), waited for or not."""
        return self._seconds.get(self._key(options))

    @staticmethod
    def _key(options: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in options.items()))

    def _work(self) -> None:
        """Compile the queue's options in order until it is empty."""
        while True:
            with self._lock:
                if not self._queue:
                    self._workers -= 1
                    return
                key, one = self._queue.pop(0)
                if key in self._futures:
                    continue
                future: concurrent.futures.Future = concurrent.futures.Future()
                self._futures[key] = future
            try:
                future.set_result(self._timed(key, one))
            except BaseException as err:  # handed to whoever asks for the result
                future.set_exception(err)

    def _worker(self) -> None:
        """One more thread on the queue (a daemon: it never holds the process open); the
        lock is held by the caller."""
        self._workers += 1
        threading.Thread(target=self._work, name="lagom-structure-compile", daemon=True).start()

    def start(self, *options: Mapping[str, Any]) -> None:
        """Queue a compile with each of ``options``, run one after another in the background.
        One not begun yet when the caller asks for it is compiled by the caller
        (``__call__``), not waited for behind the others."""
        with self._lock:
            self._queue.extend((self._key(one), one) for one in options)
            if self._workers == 0 and self._queue:
                self._worker()

    def __call__(self, options: Mapping[str, Any]) -> str:
        key = self._key(options)
        with self._lock:
            future = self._futures.get(key)
            self._queue = [(k, o) for k, o in self._queue if k != key]
            if future is not None and not future.done() and self._queue and self._workers < 2:
                self._worker()  # the caller waits: the next compile runs beside the one it waits for
        if future is None:
            text = self._timed(key, options)
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(text)
            with self._lock:
                self._futures.setdefault(key, done)
            return text
        return future.result()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The structure chosen, its module and search results, and what was tried."""

    flags: tuple[XlaFlag, ...]
    text: str
    planned: planning.Planned
    decisions: tuple[tuple[str, str], ...]
    compiles: int
    compile_seconds: float
    # The chosen module's step and the search space it was planned in (``None``: the
    # module the search started from, planned by the caller).
    graph: graph_lib.StepGraph | None = None
    space: search_lib.Space | None = None


def _exposed_by_kind(planned: planning.Planned) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in planned.plan.collectives:
        out[c.kind] = out.get(c.kind, 0.0) + c.exposed_us
    return out


def _why(before: planning.Planned, after: planning.Planned, kinds: tuple[str, ...]) -> str:
    """Where a structure's predicted change comes from: the exposed time of the collective
    kinds it touches, and the rest of the step (compute, its slowdown beside the
    collectives, the copies a restructured loop adds)."""
    def split(p: planning.Planned) -> tuple[float, float]:
        exposed = sum(v for k, v in _exposed_by_kind(p).items() if k in kinds)
        return exposed, p.plan.makespan_us - exposed

    def ms(us: float) -> str:
        return f"{us / 1e3:.0f}" if us >= 1e6 else f"{us / 1e3:.4g}"

    (e0, r0), (e1, r1) = split(before), split(after)
    what = "communication" if len(kinds) > 2 else "/".join(kinds)
    return (f"; exposed {what} {ms(e0)} -> {ms(e1)} ms, the rest (compute slowed beside "
            f"communication, added copies) {ms(r0)} -> {ms(r1)} ms")


def _not_compiled(cand: Candidate, flag: XlaFlag, best: planning.Planned, chosen: tuple[XlaFlag, ...],
                  has_loop: bool, combined: frozenset[str] | None) -> str:
    """Why ``flag`` needs no compile from the module planned as ``best`` ("" where it does):
    its answer is already known."""
    if cand.needs_loop and not has_loop:
        return "left: the step has no loop to pipeline"
    if cand.needs_opcode and not any(t.opcode in (cand.needs_opcode, f"{cand.needs_opcode}-start")
                                     for t in best.chosen.graph.tasks):
        return f"left: the step has no {cand.needs_opcode} to rewrite"
    if sum(_exposed_by_kind(best).get(k, 0.0) for k in cand.kinds) <= 0.0:
        return f"left: no {'/'.join(cand.kinds)} time is exposed to hide"
    if any(f.name == flag.name for f in chosen):
        return "left: the search took this flag's other value"
    if cand.only_splits and flag.value is True and combined is not None and not combined.intersection(cand.kinds):
        return (f"left: XLA combined no two {'/'.join(cand.kinds)}s without it and it only keeps combinations "
                "apart, so it compiles the same module (not compiled)")
    return ""


def _order(planned: planning.Planned, candidates: tuple[Candidate, ...]) -> list[Candidate]:
    """Candidates by the exposed communication of the kinds each touches, most first."""
    exposed = _exposed_by_kind(planned)
    return sorted(candidates, key=lambda c: -sum(exposed.get(k, 0.0) for k in c.kinds))


def trials(text: str, planned: planning.Planned,
           candidates: tuple[Candidate, ...] = CANDIDATES) -> list[dict[str, Any]]:
    """The compile options of the trials ``search`` would compile from ``text`` planned as
    ``planned`` where it took none of them, in its order, so a caller can start them early
    (``Recompiler.start``): the first is always one it compiles."""
    has_loop = any(t.trip_count > 1 for t in planned.chosen.graph.tasks)
    combined = None
    out = []
    for cand in _order(planned, candidates):
        flag, _ = _spelled(cand.flag)
        if flag is None:
            continue
        why_not = _not_compiled(cand, flag, planned, (), has_loop, combined)
        if not why_not and cand.only_splits and flag.value is True and combined is None:
            combined = _combined_kinds(text)
            why_not = _not_compiled(cand, flag, planned, (), has_loop, combined)
        if not why_not:
            out.append(flags_lib.compiler_options((flag,)))
    return out


def search(text: str, planned: planning.Planned, hw: HardwareProfile,
           recompile: Callable[[Mapping[str, Any]], str], *, strategy: str,
           baselines: tuple[str, ...], log: Callable[[str], None] = lambda _: None,
           candidates: tuple[Candidate, ...] = CANDIDATES, space: search_lib.Space = search_lib.Space()) -> Outcome:
    """Greedy structure search from the module ``text`` (compiled with no structure flags)
    and its ``planned`` search; ``recompile(options)`` compiles the same step with options."""
    cache: dict[tuple[str, tuple[XlaFlag, ...]], str | Exception] = {}
    source = hashlib.sha256(text.encode()).hexdigest()
    compiles, seconds, waited_total = 0, 0.0, 0.0
    has_loop = any(t.trip_count > 1 for t in planned.chosen.graph.tasks)
    chosen: tuple[XlaFlag, ...] = ()
    best_text, best = text, planned
    best_graph: graph_lib.StepGraph | None = None
    best_space: search_lib.Space | None = None
    decisions: list[tuple[str, str]] = []
    combined: frozenset[str] | None = None  # of best_text, parsed where a candidate asks
    order = _order(planned, candidates)
    spelled = {c: _spelled(c.flag) for c in candidates}
    for cand in order:
        flag, why_not = spelled[cand]
        shown = flag or cand.flag
        subject = f"{shown.name}={str(shown.value).lower()}"
        if flag is None:
            if why_not:
                decisions.append((subject, why_not))
            continue
        why_not = _not_compiled(cand, flag, best, chosen, has_loop, combined)
        if not why_not and cand.only_splits and flag.value is True and combined is None:
            combined = _combined_kinds(best_text)  # parsed only where it can save a compile
            why_not = _not_compiled(cand, flag, best, chosen, has_loop, combined)
        if why_not:
            decisions.append((subject, why_not))
            continue
        trial = tuple(sorted((*chosen, flag)))
        key = (source, trial)
        if key not in cache:
            log(f"structure: compiling with {subject} ...")
            options = flags_lib.compiler_options(trial)
            start = time.perf_counter()
            try:
                cache[key] = recompile(options)
            except Exception as err:  # XLA's own refusal: this candidate is out, the search goes on
                cache[key] = err
            waited = time.perf_counter() - start
            waited_total += waited
            took = recompile.seconds(options) if isinstance(recompile, Recompiler) else None
            seconds += waited if took is None else took
            compiles += 1
        trial_text = cache[key]
        if isinstance(trial_text, Exception):
            reason = str(trial_text).strip().splitlines()[0] if str(trial_text).strip() else type(trial_text).__name__
            decisions.append((subject, f"left: XLA could not compile with it: {reason[:200]}"))
            continue
        if trial_text == best_text:
            decisions.append((subject, "left: XLA compiled the same module with it"))
            continue
        apart = {k for c in candidates if c.combines_apart and spelled[c][0] in trial for k in c.kinds}
        trial_graph = graph_lib.from_hlo_text(trial_text)
        trial_space, _ = planning.module_space(trial_graph, dataclasses.replace(
            space, default_combine_kinds=tuple(sorted({*space.default_combine_kinds, *apart}))))
        trial_planned = planning.plan(trial_graph, hw, strategy=strategy, baselines=baselines,
                                      fingerprint=hashlib.sha256(trial_text.encode()).hexdigest(),
                                      space=trial_space, floor_note=False)
        before, after = best.plan.makespan_us, trial_planned.plan.makespan_us
        change = f"predicted step {before / 1e3:.3f} -> {after / 1e3:.3f} ms ({before / after:.3f}x speedup)"
        change += _why(best, trial_planned, cand.kinds)
        if after < before * (1 - MIN_GAIN):
            chosen, best_text, best, combined = trial, trial_text, trial_planned, None
            best_graph, best_space = trial_graph, trial_space
            decisions.append((subject, f"taken: {change}"))
        else:
            decisions.append((subject, f"left: {change}, below the {1 / (1 - MIN_GAIN):.3f}x floor "
                                       f"({MIN_GAIN:.0%} of the step)"))
    ahead = f" ({waited_total:.1f} s waited for: started beside the NCCL settings)" if seconds - waited_total > 1 else ""
    decisions.append(("structure search", f"{compiles} compile(s) in {seconds:.1f} s{ahead}"))
    return Outcome(chosen, best_text, best, tuple(decisions), compiles, seconds, best_graph, best_space)
