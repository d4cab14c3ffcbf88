"""Verify a Plan by compiling again: did each option change the module, as predicted?

The search predicts what XLA will do under the Plan's options (its ``combine`` pass stands
for XLA's combiners, and so on). Whether XLA does it is settled by compiling the step
again with the options and reading the module:

* the collectives of the recompiled module, per kind (count and NCCL-convention bytes),
  against the collectives of the StepGraph the search evaluated;
* where they are: per kind, how many run outside loops and how many inside loops of how
  many iterations (``placement``), against the same of the StepGraph. The structure flags
  move collectives between loops and their prologues (the collective pipeliner peels one
  iteration's collective out of the loop) or change the loop (double buffering halves its
  trip count over a body twice as long), so a plan that took one says where its collectives
  will run, and the recompile shows whether XLA put them there;
* whether each option does something. One option alone is compared with the untuned
  module. Several are first compiled together once: where that module is the one the
  search predicted (collectives and placement) and not the untuned one, the options are
  kept as they are, unchecked one by one; where it is not (the prediction missed, or
  nothing changed), each is left out once (leave-one-out), and an option whose absence
  changes nothing is dropped from the Plan, and the report says so: it would only be noise
  in a launch script.
  An option that changes how NCCL runs the step and not the step (``flags.RUNTIME_FLAGS``: the
  NCCL channel caps, symmetric buffers) is compiled along but never left out or dropped: no
  recompile can show what it does, and the search priced it.

``compile_fn(options) -> HLO text`` is the caller's compile (a deviceless XLA:GPU compile
for the CLI). Compiles are the cost: one when the recompile agrees with the prediction,
else one per option that acts on the module plus one; none for runtime options alone.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from lagom_jax.plan.schema import Plan
from lagom_jax.program import flags as flags_lib, graph as graph_lib

__all__ = ["Inventory", "Placement", "Verification", "inventory", "module_options", "placement", "verify_plan"]

Inventory = dict[str, tuple[int, int]]
"""Collective kind -> (count, total bytes) of one StepGraph."""

Placement = dict[tuple[str, int], int]
"""(collective kind, iterations of the loops around it; 1 outside loops) -> collectives
there, each iteration of a loop counted."""

# The module's name carries a compile counter in some JAX versions; ids are not content.
_MODULE_LINE = re.compile(r"^HloModule \S+", re.M)


def inventory(graph: graph_lib.StepGraph) -> Inventory:
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for t in graph.collectives:
        counts[t.kind][0] += 1
        counts[t.kind][1] += int(t.bytes)
    return {k: (c, b) for k, (c, b) in sorted(counts.items())}


def placement(graph: graph_lib.StepGraph) -> Placement:
    counts: collections.Counter[tuple[str, int]] = collections.Counter(
        (t.kind, t.trip_count) for t in graph.collectives)
    return dict(sorted(counts.items()))


def _format_placement(place: Placement) -> str:
    parts = []
    for (kind, trips), n in place.items():
        where = "outside loops" if trips == 1 else f"in loops of {trips} iterations"
        parts.append(f"{n} {kind} {where}")
    return ", ".join(parts) or "none"


def _same_module(a: str, b: str) -> bool:
    return _MODULE_LINE.sub("HloModule m", a) == _MODULE_LINE.sub("HloModule m", b)


def _format_inventory(inv: Inventory) -> str:
    return ", ".join(f"{c} {k} ({b / 2**20:.1f} MiB)" for k, (c, b) in inv.items()) or "none"


@dataclasses.dataclass(frozen=True)
class Verification:
    """What recompiling with a Plan's options showed."""

    predicted: Inventory
    compiled: Inventory
    predicted_placement: Placement
    compiled_placement: Placement
    async_starts: int  # collectives issued as async start/done pairs in the recompiled module
    # (option, changed the module); None: not left out one by one (the options together
    # made the predicted module).
    option_changed: tuple[tuple[str, bool | None], ...]
    compiles: int
    # Options that act when NCCL runs the step, not on the module (``flags.RUNTIME_FLAGS``).
    runtime: tuple[str, ...] = ()
    # The plan's NCCL variables (``Plan.nccl_settings``), which act when NCCL runs the step.
    nccl: tuple[str, ...] = ()

    @property
    def inventory_matches(self) -> bool:
        return self.predicted == self.compiled

    @property
    def placement_matches(self) -> bool:
        return self.predicted_placement == self.compiled_placement

    @property
    def dropped(self) -> tuple[str, ...]:
        return tuple(name for name, changed in self.option_changed if changed is False)

    def lines(self) -> tuple[tuple[str, str], ...]:
        """(subject, outcome) lines for the Plan's report."""
        out = [("collectives", ("as predicted: " if self.inventory_matches else "DIFFER: predicted ")
                + _format_inventory(self.predicted)
                + ("" if self.inventory_matches else f"; compiled {_format_inventory(self.compiled)}")),
               ("placement", ("as predicted: " if self.placement_matches else "DIFFER: predicted ")
                + _format_placement(self.predicted_placement)
                + ("" if self.placement_matches
                   else f"; compiled {_format_placement(self.compiled_placement)}")),
               ("async collectives", f"{self.async_starts} start/done pairs in the recompiled module")]
        out += [(name, "changed the compiled module" if changed
                 else "kept: with the plan's other options it made the predicted module (not left out one by one)"
                 if changed is None else "changed nothing in the compiled module: dropped from the plan")
                for name, changed in self.option_changed]
        out += [(name, "kept: it changes how NCCL runs the step, not the compiled module, so no recompile "
                 "can check it") for name in self.runtime]
        if self.nccl:
            out.append(("NCCL settings", f"{' '.join(self.nccl)}: set in the run's environment before NCCL "
                        "starts; they act only at run time, so no recompile can check them"))
        if not self.option_changed and not self.runtime:
            out.append(("options", "none to apply: the plan runs XLA's default module"))
        return tuple(out)


def module_options(plan: Plan) -> dict[str, Any]:
    """The plan's compile options that change the compiled module: all but the runtime flags
    (``flags.RUNTIME_FLAGS``), which XLA reads when it runs the step. What the verification
    compiles with, so a caller can start that compile early."""
    return {k: v for k, v in plan.compiler_options().items() if k not in flags_lib.RUNTIME_FLAGS}


def verify_plan(plan: Plan, predicted: graph_lib.StepGraph, baseline_text: str,
                compile_fn: Callable[[Mapping[str, Any]], str]) -> tuple[Plan, Verification]:
    """Recompile with ``plan``'s options, check them (one by one where the recompile is not
    the predicted module), and return the Plan without the options that changed nothing
    (with the verification in its report)."""
    options = plan.compiler_options()
    runtime = tuple(name for name in options if name in flags_lib.RUNTIME_FLAGS)
    module = module_options(plan)  # what runs no differently at run time compiles the same module
    changing = list(module)
    full = compile_fn(module) if module else baseline_text
    compiles = 1 if module else 0
    compiled = graph_lib.from_hlo_text(full)
    changes = not _same_module(baseline_text, full)
    result = Verification(
        predicted=inventory(predicted), compiled=inventory(compiled),
        predicted_placement=placement(predicted), compiled_placement=placement(compiled),
        async_starts=sum(t.is_async for t in compiled.collectives), option_changed=(), compiles=compiles)
    as_predicted = changes and result.inventory_matches and result.placement_matches
    changed: list[tuple[str, bool | None]] = []
    for name in changing:
        if len(changing) == 1:
            changed.append((name, changes))
        elif as_predicted:
            changed.append((name, None))
        else:
            without = compile_fn({k: v for k, v in module.items() if k != name})
            compiles += 1
            changed.append((name, not _same_module(without, full)))
    result = dataclasses.replace(result, option_changed=tuple(changed), compiles=compiles, runtime=runtime,
                                 nccl=tuple(f"{k}={v}" for k, v in plan.nccl_settings))
    kept = tuple(f for f in plan.flags if f.name not in result.dropped)
    return dataclasses.replace(plan, flags=kept, verification=result.lines()), result
