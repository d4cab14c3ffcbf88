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
    settings: tuple[tuple[str, str], ...] = ()  # what launch.sh sets: XLA flags and NCCL variables
    tuner: bool = False  # whether launch.sh loads NCCL's tuner plugin with the plan's rules

    @property
    def launch_sh(self) -> pathlib.Path:
        return self.folder / "launch.sh"

    @classmethod
    def of_folder(cls, name: str, folder: pathlib.Path, plan: Plan) -> Arm:
        """The arm of a plan folder; what its ``launch.sh`` sets, read from the folder's plan."""
        settings = [tuple(f.render().lstrip("-").split("=", 1)) for f in plan.flags]
        env = plan.nccl_env(config_path=folder / "nccl_tuner.conf")
        settings += [(k, v) for k, v in env.items() if k.startswith("NCCL_") and not k.startswith("NCCL_TUNER")]
        return cls(name, folder, plan, tuple(sorted(settings)), "NCCL_TUNER_PLUGIN" in env)


def _defaults_arm(plan: Plan, folder: pathlib.Path) -> Arm:
    """XLA's and NCCL's defaults: a launch.sh that sets nothing, and no tuner plugin."""
    folder.mkdir(parents=True, exist_ok=True)
    plan.save(folder / "plan.json")
    launch_sh = folder / "launch.sh"
    launch_sh.write_text("#!/usr/bin/env bash\n# XLA's and NCCL's defaults: nothing set.\nexec \"$@\"\n")
    launch_sh.chmod(0o755)
    return Arm("xla-default", folder, plan)


@dataclasses.dataclass(frozen=True)
class BenchSetup:
    """What is measured and how: the model, the job's processes, steps and rounds."""

    source: job.ModelSource | None  # None: ``program`` is the workload
    processes: int = 1
    devices_per_process: int = 8
    steps: int = 10
    warmup: int = 2
    rounds: int = 3
    launcher: str = "local"
    timeout_s: float = 1800.0
    join_timeout_s: int = 120
    program: tuple[str, ...] = ()  # a user's command whose decorated step reports its times

    def __post_init__(self) -> None:
        if (self.source is None) == (not self.program):
            raise ValueError("give a built-in model (--model) or a program (-- python train.py ...), not both")
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
        if src is None:
            return {"program": list(self.program), "processes": self.processes, "warmup": self.warmup,
                    "platform": platform}
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
                "arms": [(a.name, a.settings) for a in arms]}
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def plan_arms(setup: BenchSetup, hw: hardware_lib.HardwareProfile, out: pathlib.Path,
              plans: tuple[pathlib.Path, ...] = (), log: Callable[[str], None] = job.silent,
              strategies: tuple[str, ...] = STRATEGY_ARMS) -> list[Arm]:
    """XLA's defaults, each other strategy's plan of the step asked for (one compile for all of
    them), written as ``out/arms/<name>/``, and the plan folders given. A given folder whose
    plan is of another step is refused (ValueError naming it)."""
    if setup.source is None:
        return _program_arms(out, plans)
    unknown = set(strategies) - set(STRATEGY_ARMS)
    if unknown:
        raise ValueError(f"unknown arm(s) {', '.join(sorted(unknown))} (known: {', '.join(STRATEGY_ARMS)}; "
                         "a plan folder is an arm with --plan DIR)")
    compiled = job.compile_source(setup.source, hw, log)
    arms = []
    for strategy in STRATEGY_ARMS:
        if strategy not in strategies and strategy != "xla-default":
            continue
        log(f"bench: planning the {strategy} arm ...")
        made = job.plan_compiled(compiled, strategy=strategy, structures=strategy == "lagom", log=log,
                                 verify=False)
        folder = out / "arms" / strategy
        if strategy == "xla-default":
            arms.append(_defaults_arm(made.plan, folder))
            continue
        made.write(folder, log)
        arms.append(Arm.of_folder(strategy, folder, made.plan))
    # The modules this step compiles to: as XLA makes it, and as each arm's structure flags make it.
    known = {a.plan.fingerprint for a in arms}
    for given in plans:
        path, plan = _given(given)
        if plan.fingerprint not in known:
            raise ValueError(f"--plan {given}: its plan is of another step ({plan.module}, module "
                             f"{plan.fingerprint[:12]}, none of the {len(known)} this bench compiled): tune this "
                             "model with the same options (lagom-jax tune --model ... --out DIR) to get one")
        arms.append(Arm.of_folder(path.name, path, plan))
    return arms


def _given(given: pathlib.Path) -> tuple[pathlib.Path, Plan]:
    path = pathlib.Path(given)
    if not (path / "plan.json").exists() or not (path / "launch.sh").exists():
        raise ValueError(f"--plan {given}: not a plan folder (no plan.json and launch.sh; "
                         "`lagom-jax tune ... --out DIR` or `lagom_jax.tune(..., plan_dir=DIR)` writes one)")
    return path, Plan.load(path / "plan.json")


def _program_arms(out: pathlib.Path, plans: tuple[pathlib.Path, ...]) -> list[Arm]:
    """A user's program: XLA's defaults and each plan folder given (at least one)."""
    if not plans:
        raise ValueError("a program needs the plan(s) to measure: --plan DIR (written by lagom-jax tune --out DIR "
                         "or by lagom_jax.tune(..., plan_dir=DIR))")
    given = [_given(p) for p in plans]
    arms = [_defaults_arm(given[0][1], out / "arms" / "xla-default")]
    return arms + [Arm.of_folder(path.name, path, plan) for path, plan in given]


def _load(path: pathlib.Path, key: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if rows and rows[0].get("setup") != key:
        raise ValueError(f"{path.parent} holds a bench of another setup; give another --out, or delete "
                         f"{path} to start afresh")
    return rows


def bench(setup: BenchSetup, hw: hardware_lib.HardwareProfile, out: str | pathlib.Path, *,
          plans: tuple[pathlib.Path, ...] = (), strategies: tuple[str, ...] = STRATEGY_ARMS,
          platform: str = "cpu", log: Callable[[str], None] = job.silent) -> report_lib.Report:
    """Plan the arms, measure them in interleaved rounds (resuming ``out``), write the report.
    ``platform``: of the devices the job runs on (``cpu``: ``devices_per_process`` fake ones)."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arms = plan_arms(setup, hw, out, plans, log, strategies)
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
            got = launch.run_arm(setup.launcher, arm.launch_sh, {**spec, "expected": dict(arm.settings)},
                                 timeout_s=setup.timeout_s, program=setup.program,
                                 log_dir=out / "logs" / arm.name / f"round{r}", tuner=arm.tuner)
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
