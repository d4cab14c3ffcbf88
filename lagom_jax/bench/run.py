"""The bench: plan the arms, run them interleaved in rounds, keep every measurement, report.

Arms: ``xla-default``, ``recipe``, ``autoccl`` and ``lagom``, each the plan of that strategy
for the step, made by the one pipeline (``job.plan_compiled``; lagom's with the structure
search), and any plan folder given (``--plan DIR``). Each arm's plan is written as a folder
(``arms/<name>/``, with its ``launch.sh``) and every run of the arm is a fresh job under it.

Rounds run the arms in turn (A B C D, A B C D, ...) so that drift hits all of them. Each
finished (arm, round) is appended to ``measurements.jsonl`` at once: an interrupted bench
keeps what it measured, and a rerun with the same setup resumes where it stopped. An arm that
crashes leaves the others measured and its error's last lines in the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from collections.abc import Callable
from typing import Any

from lagom_jax import job
from lagom_jax.bench import launch, report as report_lib, stats
from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.plan.schema import Plan

__all__ = ["STRATEGY_ARMS", "Arm", "BenchSetup", "bench"]

STRATEGY_ARMS = ("xla-default", "recipe", "autoccl", "lagom")
MEASUREMENTS = "measurements.jsonl"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One way to run the step: a plan folder whose ``launch.sh`` starts the job."""

    name: str
    folder: pathlib.Path
    plan: Plan

    @property
    def launch_sh(self) -> pathlib.Path:
        return self.folder / "launch.sh"


@dataclasses.dataclass(frozen=True)
class BenchSetup:
    """What is measured and how: the model, the job's processes, steps and rounds."""

    source: job.ModelSource
    processes: int = 1
    devices_per_process: int = 8
    steps: int = 10
    warmup: int = 2
    rounds: int = 3
    launcher: str = "local"
    timeout_s: float = 1800.0
    join_timeout_s: int = 120

    def __post_init__(self) -> None:
        for name in ("processes", "devices_per_process", "steps", "rounds", "join_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {self.warmup}")
        if self.launcher not in launch.LAUNCHERS:
            raise ValueError(f"unknown launcher {self.launcher!r} (known: {', '.join(launch.LAUNCHERS)}); "
                             "under another launcher, start `lagom_jax.bench.worker` yourself")

    def worker_spec(self, platform: str) -> dict[str, Any]:
        src = self.source
        return {"model": {"model": src.model, "config": src.config, "recipe": src.resolved_recipe(),
                          "mesh": dict(src.shape()), "batch_size": src.batch_size,
                          "seq_len": src.seq_len, "dtype": src.dtype, "remat": src.remat, "scan": src.scan,
                          "attention": src.attention},
                "processes": self.processes, "devices_per_process": self.devices_per_process,
                "steps": self.steps, "warmup": self.warmup, "platform": platform,
                "join_timeout_s": self.join_timeout_s}

    def key(self, arms: list[Arm]) -> str:
        """What makes two benches the same (a rerun resumes only such a one)."""
        spec = {**self.worker_spec("any"), "launcher": self.launcher,
                "arms": [(a.name, a.plan.fingerprint, a.plan.xla_flags()) for a in arms]}
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def plan_arms(setup: BenchSetup, hw: hardware_lib.HardwareProfile, out: pathlib.Path,
              plans: tuple[pathlib.Path, ...] = (), log: Callable[[str], None] = job.silent) -> list[Arm]:
    """Each strategy's plan of the step (one compile for all of them), and the plan folders
    given, written as ``out/arms/<name>/``. A given folder whose plan is of another step is
    refused (ValueError naming it)."""
    compiled = job.compile_source(setup.source, hw, log)
    arms = []
    for strategy in STRATEGY_ARMS:
        log(f"bench: planning the {strategy} arm ...")
        made = job.plan_compiled(compiled, strategy=strategy, structures=strategy == "lagom", log=log,
                                 verify=False)
        folder = out / "arms" / strategy
        made.write(folder, log)
        arms.append(Arm(strategy, folder, made.plan))
    fingerprint = arms[0].plan.fingerprint
    for given in plans:
        path = pathlib.Path(given)
        if not (path / "plan.json").exists() or not (path / "launch.sh").exists():
            raise ValueError(f"--plan {given}: not a plan folder (no plan.json and launch.sh; "
                             "`lagom-jax tune ... --out DIR` writes one)")
        plan = Plan.load(path / "plan.json")
        if plan.fingerprint != fingerprint:
            raise ValueError(f"--plan {given}: its plan is of another step ({plan.module}, module "
                             f"{plan.fingerprint[:12]}; this bench's is {fingerprint[:12]}): tune this "
                             "model with the same flags to get one")
        arms.append(Arm(path.name, path, plan))
    return arms


def _load(path: pathlib.Path, key: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if rows and rows[0].get("setup") != key:
        raise ValueError(f"{path.parent} holds a bench of another setup; give another --out, or delete "
                         f"{path} to start afresh")
    return rows


def bench(setup: BenchSetup, hw: hardware_lib.HardwareProfile, out: str | pathlib.Path, *,
          plans: tuple[pathlib.Path, ...] = (), platform: str = "cpu",
          log: Callable[[str], None] = job.silent) -> report_lib.Report:
    """Plan the arms, measure them in interleaved rounds (resuming ``out``), write the report."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arms = plan_arms(setup, hw, out, plans, log)
    key = setup.key(arms)
    path = out / MEASUREMENTS
    rows = _load(path, key)
    done = {(r["arm"], r["round"]) for r in rows if "arm" in r}
    if not rows:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"setup": key}) + "\n")
    spec = setup.worker_spec(platform)
    for r in range(1, setup.rounds + 1):
        for arm in arms:
            if (arm.name, r) in done:
                log(f"round {r}/{setup.rounds} {arm.name}: measured before, kept")
                continue
            got = launch.run_arm(setup.launcher, arm.launch_sh, spec, timeout_s=setup.timeout_s)
            row: dict[str, Any] = {"arm": arm.name, "round": r, "seconds": got.seconds}
            if got.result is not None:
                row.update(got.result)
                median = stats.summarize(got.result["times_ms"]).median_ms
                log(f"round {r}/{setup.rounds} {arm.name}: median step {median:.2f} ms over "
                    f"{len(got.result['times_ms'])} steps ({got.seconds:.1f} s)")
            else:
                row["error"] = got.error
                log(f"round {r}/{setup.rounds} {arm.name}: failed ({(got.error or '').splitlines()[0]})")
            with path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            rows.append(row)
    made = report_lib.build(arms, [r for r in rows if "arm" in r], hw, setup)
    made.write(out)
    return made
