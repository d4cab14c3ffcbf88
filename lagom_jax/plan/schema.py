"""The Plan: what the search decided for one compiled step, as data, and its renderings.

A Plan renders compiler options, an ``XLA_FLAGS`` string, the NCCL environment, the NCCL
tuner-plugin config and an LHS profile; it never writes files (that is the caller's job,
``PlanCache`` aside, which stores Plans).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib

from lagom_jax.cluster import collective_tables
from lagom_jax.cluster.params import CONSULTED_KINDS, CollectiveParams
from lagom_jax.files import atomic_write_text
from lagom_jax.plan import nccl_tuner
from lagom_jax.plan import report as report_lib
from lagom_jax.program.flags import XlaFlag, compiler_options, render_xla_flags
from lagom_jax.units import human_bytes

@dataclasses.dataclass(frozen=True)
class CollectiveChoice:
    """What the search decided for one collective, and why."""

    name: str
    kind: str
    bytes: int
    group_size: int
    nodes: int
    params: CollectiveParams
    default_params: CollectiveParams
    predicted_us: float
    exposed_us: float
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """The tuned configuration of one compiled step, and everything needed to apply it.

    A Plan is data: it renders compiler options, an ``XLA_FLAGS`` string, NCCL environment,
    the NCCL tuner-plugin config and an LHS profile on demand, and it round-trips through
    JSON so that every process of a job can load the same one.
    """

    module: str
    fingerprint: str
    hardware: str
    gpus_per_node: int
    nodes: int
    strategy: str
    version: str
    collectives: tuple[CollectiveChoice, ...] = ()
    flags: tuple[XlaFlag, ...] = ()
    # Predicted step time (us) of this plan and of every baseline strategy, by name.
    predicted_us: tuple[tuple[str, float], ...] = ()
    bound_us: float = 0.0
    evaluations: int = 0
    search_seconds: float = 0.0
    # Cost of each instruction (us) under this plan: the LHS profile.
    costs: tuple[tuple[str, float], ...] = ()
    # (subject, outcome) lines from recompiling with the plan's options (lagom_jax.plan.verify);
    # empty when the plan was not verified.
    verification: tuple[tuple[str, str], ...] = ()
    # A collective's parameters changed only for a predicted gain above this fraction of
    # its own time (the search's ``Space.min_gain``; None: the model's measured error for a
    # collective of its size and span, ``collective_tables.measured_error``; 0: no floor).
    min_gain: float | None = 0.0
    # How much shorter (us) the step is predicted with every gain taken (the same search at
    # min_gain 0): what that floor held back. 0 when it held back nothing.
    held_back_us: float = 0.0
    # (subject, decision and why) of choices about the program made before the search,
    # e.g. CommFuse rings for a built-in model's MLP (``lagom-jax tune --commfuse``).
    decisions: tuple[tuple[str, str], ...] = ()
    # Process-wide NCCL variables the plan runs with (``nccl_settings.choose``), e.g.
    # NCCL_CTA_POLICY=2 beside XLA's symmetric buffers; part of ``nccl_env()``.
    nccl_settings: tuple[tuple[str, str], ...] = ()

    # -- what the plan predicts --------------------------------------------------------
    @property
    def cluster(self) -> str:
        """The cluster every prediction of the plan is for, as its lines name it."""
        return f"{self.hardware} ({self.nodes} node(s) x {self.gpus_per_node} GPUs)"

    @property
    def makespan_us(self) -> float:
        return dict(self.predicted_us)[self.strategy]

    def speedup_over(self, baseline: str) -> float:
        times = dict(self.predicted_us)
        if baseline not in times:
            raise KeyError(f"no prediction for {baseline!r} (have: {', '.join(times)})")
        return times[baseline] / self.makespan_us

    def report(self, *, top: int = 20, width: int | None = report_lib.WIDTH) -> str:
        """The table a person reads: predictions, speedups and the choice per NCCL tuner key.

        A row is one key of NCCL's tuner plugin (kind, bytes, ranks, nodes: all the plugin
        sees of a call, so all its calls run with one choice), ranked by total predicted
        time, with its choice; under it, NCCL's default where the choice differs, the
        instructions it covers (with their calls) and why the choice was made. Every line
        wraps to ``width`` columns (``report_lib.wrap``; None: one line each, as in
        ``report.txt``); the table's rows fit 100.
        """
        times = dict(self.predicted_us)
        lines = [
            f"lagom-jax plan for {self.module} on {self.cluster}, strategy {self.strategy}",
            f"predicted step on {self.hardware} {self.makespan_us / 1e3:.3f} ms; overlap bound "
            f"{self.bound_us / 1e3:.3f} ms (efficiency {self.bound_us / self.makespan_us:.1%})",
        ]
        others = [n for n in times if n != self.strategy]
        if others:
            lines.append(f"speedup on {self.hardware}: " + ", ".join(
                f"{self.speedup_over(n):.3f}x over {n} ({times[n] / 1e3:.3f} ms)" for n in others))
        lines.append(f"search: {self.evaluations} evaluations in {self.search_seconds:.2f} s")
        if self.held_back_us > 0:
            eager = self.makespan_us - self.held_back_us
            lines.append(f"the floor on per-collective changes (the model's error) held back a "
                         f"{self.makespan_us / eager:.4f}x speedup ({self.held_back_us:.1f} us): taking every "
                         f"predicted gain gives {eager / 1e3:.3f} ms (--min-gain 0, Space(min_gain=0))")
        lines += [f"{subject}: {decision}" for subject, decision in self.decisions]
        if self.nccl_settings:
            said, env = "NCCL settings for every rank:", " ".join(f"{k}={v}" for k, v in self.nccl_settings)
            # an environment line is pasted whole: beside its label where both fit, else under it
            fits = width is None or len(said) + 1 + len(env) <= width
            lines += [f"{said} {env}"] if fits else [said, report_lib.Paste(f"  {env}")]
        if self.verification:
            lines.append("verified by recompiling with the plan's options:")
            lines += [f"  {subject}: {outcome}" for subject, outcome in self.verification]
        if not self.collectives:
            lines.append("no collectives: nothing to tune")
            return "\n".join(lines)
        rows = self.rows()
        lines += ["", f"{len(self.collectives)} collective calls after XLA's combiners, in {len(rows)} rows (a row: "
                      "a key of NCCL's tuner plugin, which gives all its calls one choice)"]
        if self.min_gain is None:
            lines.append("(a collective's parameters change only where the predicted gain exceeds the cost "
                         "model's measured error on a collective of its size, a share of its own time: "
                         f"{collective_tables.describe_measured_error()})")
        elif self.min_gain:
            lines.append(f"(a collective's parameters change only where the predicted gain exceeds "
                         f"{self.min_gain:.0%} of its own time, the cost model's error on a collective)")
        lines.append(f"{'kind':<14} {'bytes':>10} {'ranks':>5} {'nodes':>5} {'calls':>5}  {'time us':>9} "
                     f"{'exposed':>9}  chosen")
        for row in rows[:top]:
            c = row.example
            lines.append(f"{c.kind:<14} {human_bytes(c.bytes):>10} {c.group_size:>5} {c.nodes:>5} {row.calls:>5}  "
                         f"{row.total_us:>9.1f} {row.exposed_us:>9.1f}  {_brief(c.params)}")
            if c.default_params != c.params:
                lines.append(f"  instead of NCCL's default {_brief(c.default_params)}")
            lines.append("  covers " + ", ".join(
                f"{_short_name(name, 48)}" + (f" x{n}" if n > 1 else "") for name, n in row.instructions))
            why = c.why.removeprefix(c.params.describe() + ": ")
            if why:
                lines.append("  why: " + why)
        if len(rows) > top:
            lines.append(f"... {len(rows) - top} more rows (all of them: report.txt of --out, --json, Plan.to_json)")
        return report_lib.wrap(lines, width=width)

    def rows(self) -> list[ReportRow]:
        """One row per NCCL tuner key and choice, longest total predicted time first."""
        groups: dict[tuple, list[CollectiveChoice]] = {}
        for c in self.collectives:
            key = (c.kind, c.bytes, c.group_size, c.nodes, c.params, c.default_params)
            groups.setdefault(key, []).append(c)
        rows = []
        for cs in groups.values():
            counts: dict[str, int] = {}
            for c in cs:
                counts[c.name] = counts.get(c.name, 0) + 1
            rows.append(ReportRow(
                example=max(cs, key=lambda c: c.predicted_us), calls=len(cs),
                total_us=sum(c.predicted_us for c in cs), exposed_us=sum(c.exposed_us for c in cs),
                instructions=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))))
        return sorted(rows, key=lambda r: -r.total_us)

    # -- how the plan reaches XLA --------------------------------------------------------
    def compiler_options(self, *, with_profile: bool = False) -> dict[str, object]:
        """Options for ``lowered.compile(compiler_options=...)``.

        ``with_profile`` adds ``fdo_profile``: the LHS profile, whose instruction names are
        those of the module this plan was made from, so it only helps a compile of that
        same module on the same backend.
        """
        opts: dict[str, object] = dict(compiler_options(self.flags))
        if with_profile and self.costs:
            opts["fdo_profile"] = self.lhs_profile().encode()
        return opts

    def xla_flags(self) -> str:
        """One ``XLA_FLAGS`` string for launch scripts."""
        return render_xla_flags(self.flags)

    def lhs_profile(self) -> str:
        """A ProfiledInstructionsProto in text form (PGLE, openxla/xla gpu_hlo_schedule.cc)."""
        return "".join(
            f'costs {{ name: "{name}" cost_us: {cost:.3f} }}\n' for name, cost in self.costs
        )

    # -- how the plan reaches NCCL ----------------------------------------------------------
    def nccl_tuner_rules(self) -> tuple[nccl_tuner.TunerRule, ...]:
        """Per-collective choices as tuner-plugin rules.

        NCCL asks the plugin by (kind, nBytes, nranks, nnodes) only, so collectives are
        grouped by those keys; each distinct size owns the byte range up to the geometric
        midpoints with its neighbours (sizes in between are rare and near either choice).
        The search gives every collective of one key the same choice
        (``search.strategies.one_choice_per_key``), so a searched plan's rules say exactly
        what it predicted; for a plan edited by hand, the collective with the longest
        predicted time decides its key.
        Collective-permutes and all-to-alls are point-to-point, which NCCL never asks a tuner
        about (``params.CONSULTED_KINDS``), nor a
        collective on symmetric buffers (NCCL runs its symmetric kernel before any algorithm
        choice, ``cost.symmetric_pick``).
        """
        by_key: dict[tuple, dict[int, CollectiveChoice]] = {}
        for c in self.collectives:
            if c.kind not in CONSULTED_KINDS or c.params.algorithm == "symmetric":
                continue
            sizes = by_key.setdefault((c.kind, c.group_size, c.nodes), {})
            if c.bytes not in sizes or c.predicted_us > sizes[c.bytes].predicted_us:
                sizes[c.bytes] = c
        rules = []
        for (kind, nranks, nnodes), sizes in sorted(by_key.items()):
            ordered = sorted(sizes)
            for i, size in enumerate(ordered):
                lo = 0 if i == 0 else int(math.sqrt(ordered[i - 1] * size)) + 1
                hi = None if i == len(ordered) - 1 else int(math.sqrt(size * ordered[i + 1])) + 1
                rules.append(nccl_tuner.TunerRule.from_params(
                    kind, sizes[size].params, min_bytes=lo, max_bytes=hi,
                    nranks=nranks, nnodes=nnodes))
        return tuple(rules)

    def nccl_tuner_config(self) -> str:
        """The tuner-plugin config file (format: lagom_jax/plan/nccl_tuner/README.md)."""
        return nccl_tuner.render_config(self.nccl_tuner_rules())

    def tuner_config_path(self, plugin_path: str | os.PathLike[str] | None = None) -> pathlib.Path:
        """Where this plan's tuner config goes by default: beside the plugin, by fingerprint."""
        plugin = pathlib.Path(plugin_path) if plugin_path else nccl_tuner.default_out_dir() / nccl_tuner.PLUGIN_FILE
        return plugin.parent / "configs" / f"{self.fingerprint[:16] or 'plan'}.conf"

    def nccl_env(self, *, config_path: str | os.PathLike[str] | None = None,
                 plugin_path: str | os.PathLike[str] | None = None) -> dict[str, str]:
        """NCCL environment for every rank, set before the first communicator exists.

        Per-call settings travel through the tuner plugin when one is built
        (``lagom-jax build-tuner``), reading ``nccl_tuner_config()`` from ``config_path``
        (default ``tuner_config_path()``); writing that file is the caller's job. Threads
        per CTA cannot be set per call, so a common choice becomes ``NCCL_NTHREADS``; chunks
        above NCCL's 2 MiB cap (Ring/Simple chunk = NCCL_BUFFSIZE / 2: 8 steps of which 4
        make a chunk, NVIDIA/nccl ``src/include/device.h`` and
        ``src/include/collectives.h``) raise ``NCCL_BUFFSIZE``.
        """
        env: dict[str, str] = dict(self.nccl_settings)
        simple = {c.params.nthreads for c in self.collectives if c.params.protocol != "LL128"}
        if len(simple) == 1 and (nt := min(512, simple.pop())) != 512:
            env["NCCL_NTHREADS"] = str(nt)
        max_chunk = max((c.params.chunk_bytes for c in self.collectives), default=0)
        if max_chunk > 2 << 20:
            env["NCCL_BUFFSIZE"] = str(2 * max_chunk)
        plugin = pathlib.Path(plugin_path) if plugin_path else (
            nccl_tuner.default_out_dir() / nccl_tuner.PLUGIN_FILE)
        if plugin.exists():
            env.update(nccl_tuner.tuner_env(plugin, config_path or self.tuner_config_path(plugin)))
        return env

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The Plan as plain JSON data (what ``to_json`` writes)."""
        return _to_jsonable(self)  # type: ignore[return-value]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            raw = json.loads(text)
            return cls(
                **{
                    **raw,
                    "collectives": tuple(
                        CollectiveChoice(
                            **{
                                **c,
                                "params": CollectiveParams(**c["params"]),
                                "default_params": CollectiveParams(**c["default_params"]),
                            }
                        )
                        for c in raw["collectives"]
                    ),
                    "flags": tuple(XlaFlag(f["name"], f["value"]) for f in raw["flags"]),
                    "predicted_us": tuple((k, float(v)) for k, v in raw["predicted_us"]),
                    "costs": tuple((k, float(v)) for k, v in raw["costs"]),
                    "verification": tuple((str(a), str(b)) for a, b in raw.get("verification", ())),
                    "decisions": tuple((str(a), str(b)) for a, b in raw.get("decisions", ())),
                    "nccl_settings": tuple((str(a), str(b)) for a, b in raw.get("nccl_settings", ())),
                }
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a lagom-jax Plan: {err}") from err

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON (atomically: a reader sees the old file or the new one)."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        return cls.from_json(pathlib.Path(path).read_text())


def _to_jsonable(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_to_jsonable(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class ReportRow:
    """One row of :meth:`Plan.report`: a tuner key's calls, the longest of them, their total
    and exposed predicted time, and the instructions they come from with their call counts."""

    example: CollectiveChoice
    calls: int
    total_us: float
    exposed_us: float
    instructions: tuple[tuple[str, int], ...]


def _brief(params: CollectiveParams) -> str:
    """``params`` in at most 27 characters: ``ring/LL128 24ch 512K 256t``."""
    return (f"{params.algorithm}/{params.protocol} {params.nchannels}ch "
            f"{params.chunk_bytes // 1024}K {params.nthreads}t")


def _short_name(name: str, width: int) -> str:
    """``name`` in ``width`` characters: a combined collective by its count and first part."""
    if name.startswith("combined(") and "+" in name:
        parts = name[len("combined("):].rstrip(")").split("+")
        name = f"combined {len(parts)}: {parts[0]}+..."
    return name if len(name) <= width else name[:width - 3] + "..."
