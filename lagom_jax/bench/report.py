"""What a bench measured, beside what the cost model predicted: Markdown, JSON and a PNG.

Per arm: its flags, the median step over every timed step of every round with its 95%
interval (``stats``), the model's prediction for the cluster the plan is for, what of the arm
applied (``protocol.applied``), and the last lines of any run that failed. An arm none of whose
runs finished is reported as failed, never compared. The verdict compares lagom's arm with
XLA's defaults.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from lagom_jax.bench import stats
from lagom_jax.plan import report as report_lib

__all__ = ["ArmResult", "Report", "build"]


@dataclasses.dataclass(frozen=True)
class ArmResult:
    name: str
    flags: str
    predicted_ms: float
    measured: stats.Summary | None
    runs: int
    platform: str
    applied: tuple[tuple[str, str], ...]
    errors: tuple[str, ...]

    @property
    def not_applied(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.applied if v.startswith("not applied"))


@dataclasses.dataclass(frozen=True)
class Report:
    arms: tuple[ArmResult, ...]
    verdict: str
    cluster: str
    setup: str
    notes: tuple[str, ...] = ()  # what --search and --profile found, a paragraph each

    def markdown(self) -> str:
        lines = ["# lagom-jax bench", "", f"Setup: {self.setup}.", "",
                 f"Predicted: by the cost model, for {self.cluster}. Measured: on this job's "
                 f"{self.arms[0].platform if self.arms else '?'} devices, warm-up steps left out; the interval is "
                 "the 95% interval of the median step.", "",
                 "| arm | measured median ms | 95% interval ms | steps | predicted ms |",
                 "|---|---|---|---|---|"]
        for a in self.arms:
            if a.measured is None or a.not_applied:
                what = "failed" if a.measured is None else "not applied"
                lines.append(f"| {a.name} | {what} | - | 0 | {a.predicted_ms:.3f} |")
                continue
            m = a.measured
            lines.append(f"| {a.name} | {m.median_ms:.2f} | {m.low_ms:.2f}-{m.high_ms:.2f} | {m.n} | "
                         f"{a.predicted_ms:.3f} |")
        lines += ["", f"Verdict: {self.verdict}.", "", "## Each arm's XLA flags", ""]
        # under the table, not in it: a flag line is pasted whole, and a row fits the terminal
        for a in self.arms:
            lines += ([f"- {a.name}:", "", "  ```bash", report_lib.Paste(f"  XLA_FLAGS='{a.flags}'"), "  ```"]
                      if a.flags else [f"- {a.name}: none (XLA's defaults)"])
        lines += ["", "## Did each arm apply", ""]
        for a in self.arms:
            said = "; ".join(f"{k}: {v}" for k, v in a.applied) or "no settings (XLA's and NCCL's defaults)"
            lines.append(f"- {a.name}: {said}")
        for note in self.notes:
            lines += ["", note]
        failed = [(a.name, e) for a in self.arms for e in a.errors]
        if failed:
            lines += ["", "## Runs that failed", ""]
            for name, err in failed:
                lines += [f"- {name}:", "", "```text", err, "```"]
        return report_lib.wrap(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "setup": self.setup, "verdict": self.verdict,
                "arms": [{**dataclasses.asdict(a), "applied": dict(a.applied)} for a in self.arms]}

    def write(self, out: pathlib.Path) -> None:
        (out / "report.md").write_text(self.markdown())
        (out / "report.json").write_text(json.dumps(self.to_json(), indent=1) + "\n")
        try:
            self._png(out / "report.png")
        except ImportError:
            pass  # matplotlib is the plot extra

    def _png(self, path: pathlib.Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shown = [a for a in self.arms if a.measured is not None]
        if not shown:
            return
        fig, ax = plt.subplots(figsize=(6, 3))
        xs = range(len(shown))
        med = [a.measured.median_ms for a in shown]
        err = [[a.measured.median_ms - a.measured.low_ms for a in shown],
               [a.measured.high_ms - a.measured.median_ms for a in shown]]
        ax.bar(xs, med, yerr=err, capsize=4, color="#6a9fd4", label="measured median, 95% interval")
        ax.set_xticks(list(xs), [a.name for a in shown])
        ax.set_ylabel("step ms (measured)")
        ax2 = ax.twinx()
        ax2.plot(list(xs), [a.predicted_ms for a in shown], "o", color="#d46a6a", label=f"predicted ({self.cluster})")
        ax2.set_ylabel("step ms (predicted)")
        fig.legend(loc="upper right", fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def build(arms: list, rows: list[dict[str, Any]], hw: Any, setup: Any) -> Report:
    results = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm.name]
        ok = [r for r in mine if "times_ms" in r]
        times = [t for r in ok for t in r["times_ms"]]
        flags = " ".join(f"--{k}={v}" for k, v in arm.settings if not k.startswith("NCCL_"))
        last = ok[-1] if ok else {"platform": "?", "applied": {}}
        results.append(ArmResult(arm.name, flags, arm.predicted_ms, stats.summarize(times) if times else None, len(ok),
                                 last["platform"], tuple(sorted(last["applied"].items())),
                                 tuple(r["error"] for r in mine if "error" in r)))
    by = {a.name: a for a in results}
    # lagom's arm, else the first plan folder given, against XLA's defaults.
    lagom = by.get("lagom") or next((a for a in results if a.name != "xla-default"), None)
    base = by.get("xla-default")
    name = lagom.name if lagom is not None else "lagom"
    if lagom is None or base is None or lagom.measured is None or base.measured is None:
        verdict = f"no comparison: {name}'s arm or XLA's defaults has no finished run"
    elif lagom.not_applied:
        verdict = f"no comparison: {name}'s plan did not apply ({', '.join(lagom.not_applied)})"
    else:
        verdict = stats.verdict(lagom.measured, base.measured, name, "xla-default")
    src = setup.source
    if src is None:
        described = (f"the program `{' '.join(setup.program)}`, {setup.warmup} warm-up steps left out, "
                     f"{setup.rounds} rounds, launcher {setup.launcher}")
    else:
        described = (f"{src.describe()}, batch {src.batch_size} x {src.seq_len}, {setup.processes} process(es) x "
                     f"{setup.devices_per_process} devices, {setup.warmup} warm-up + {setup.steps} timed steps, "
                     f"{setup.rounds} rounds, launcher {setup.launcher}")
    return Report(tuple(results), verdict, f"{hw.name} ({hw.nodes} node(s) x {hw.gpus_per_node} GPUs)", described)
