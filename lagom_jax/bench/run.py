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
import shutil
from collections.abc import Callable
from typing import Any

from lagom_jax import job
from lagom_jax.bench import launch, protocol, report as report_lib, stats
from lagom_jax.cluster import hardware as hardware_lib
from lagom_jax.costs import calibrate
from lagom_jax.plan.schema import Plan

__all__ = ["SEARCH_VARIANTS", "STRATEGY_ARMS", "Arm", "BenchSetup", "bench"]

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

    @property
    def predicted_ms(self) -> float:
        """What the model predicts for the arm's plan (XLA's defaults: the plan's baseline)."""
        strategy = "xla-default" if self.name == "xla-default" else self.plan.strategy
        return dict(self.plan.predicted_us).get(strategy, self.plan.makespan_us) / 1e3

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


# The plans the model makes for ``--search``: (arm, strategy, structure search, NCCL settings).
# Each differs from lagom's in what it changes: its loop-structure flags, its process-wide NCCL
# settings, or the strategy that chose the flags and per-collective NCCL parameters.
SEARCH_VARIANTS = (("lagom", "lagom", True, True), ("lagom-no-structure", "lagom", False, True),
                   ("lagom-no-nccl-settings", "lagom", True, False), ("autoccl", "autoccl", False, True),
                   ("recipe", "recipe", False, True))


def changes(arm: Arm) -> int:
    """The settings an arm changes from XLA's and NCCL's defaults (its tuner rules as one)."""
    return len(arm.settings) + int(arm.tuner)


def plan_arms(setup: BenchSetup, hw: hardware_lib.HardwareProfile, out: pathlib.Path,
              plans: tuple[pathlib.Path, ...] = (), log: Callable[[str], None] = job.silent,
              strategies: tuple[str, ...] = STRATEGY_ARMS, search_k: int = 0) -> list[Arm]:
    """XLA's defaults, each other strategy's plan of the step asked for (one compile for all of
    them), written as ``out/arms/<name>/``, and the plan folders given. A given folder whose
    plan is of another step is refused (ValueError naming it). ``search_k``: instead of the
    strategies, the ``search_k`` plans of ``SEARCH_VARIANTS`` the model predicts fastest, no two
    setting the same things."""
    if setup.source is None:
        return _program_arms(out, plans)
    unknown = set(strategies) - set(STRATEGY_ARMS)
    if unknown:
        raise ValueError(f"unknown arm(s) {', '.join(sorted(unknown))} (known: {', '.join(STRATEGY_ARMS)}; "
                         "a plan folder is an arm with --plan DIR)")
    variants = SEARCH_VARIANTS if search_k else tuple(
        (s, s, s == "lagom", True) for s in STRATEGY_ARMS if s in strategies and s != "xla-default")
    compiled = job.compile_source(setup.source, hw, log)
    made = job.plan_compiled(compiled, strategy="xla-default", log=log, verify=False)
    arms = [_defaults_arm(made.plan, out / "arms" / "xla-default")]
    planned = []
    for name, strategy, structures, settings in variants:
        log(f"bench: planning the {name} arm ...")
        made = job.plan_compiled(compiled, strategy=strategy, structures=structures, log=log, verify=False,
                                 nccl_settings_search=settings)
        folder = out / "arms" / name
        made.write(folder, log)
        planned.append(Arm.of_folder(name, folder, made.plan))
    if search_k:
        planned = _best_distinct(planned, search_k, log)
    arms += planned
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


def _best_distinct(arms: list[Arm], k: int, log: Callable[[str], None]) -> list[Arm]:
    """The ``k`` arms predicted fastest, an arm that sets what a faster one sets left out."""
    kept: list[Arm] = []
    seen: set[tuple] = set()
    for arm in sorted(arms, key=lambda a: a.predicted_ms):
        key = (arm.settings, arm.plan.nccl_tuner_config() if arm.tuner else "")
        if key in seen:
            log(f"bench: {arm.name} sets what a plan predicted faster sets; not measured")
            continue
        seen.add(key)
        if len(kept) < k:
            kept.append(arm)
    log(f"bench: measuring the model's {len(kept)} best of {len(seen)} distinct plans: "
        + ", ".join(f"{a.name} ({a.predicted_ms:.3f} ms predicted)" for a in kept))
    return kept


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
          platform: str = "cpu", log: Callable[[str], None] = job.silent, search_k: int = 0,
          profile: bool = False, recalibrate: bool = False) -> report_lib.Report:
    """Plan the arms, measure them in interleaved rounds (resuming ``out``), write the report.
    ``platform``: of the devices the job runs on (``cpu``: ``devices_per_process`` fake ones).
    ``search_k``: measure the model's ``search_k`` best plans (``plan_arms``) and write the
    fastest measured one as ``out/chosen``. ``profile``: before the rounds, one more run of
    lagom's arm traces a few steps, and ``calibrate`` fits the cluster's profile to the trace
    (``out/calibrated.json``); ``recalibrate``: lagom's plan made again on that profile is one
    more arm (``lagom-recalibrated``)."""
    if search_k < 0:
        raise ValueError(f"--search must be at least 1, got {search_k}")
    if search_k and setup.source is None:
        raise ValueError("--search plans the built-in model's step; for your program, give --plan folders")
    if recalibrate and setup.source is None:
        raise ValueError("--recalibrate plans the built-in model's step again; for your program, --profile "
                         "writes the calibrated profile: tune your step with it as --hardware")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arms = plan_arms(setup, hw, out, plans, log, strategies, search_k)
    notes: list[str] = []
    if profile or recalibrate:
        calibrated, note = _calibrated(setup, hw, out, arms, platform, log)
        notes.append(note)
        if recalibrate and calibrated is not None:
            log("bench: planning the lagom-recalibrated arm on the calibrated profile ...")
            made = job.plan_compiled(job.compile_source(setup.source, calibrated, log), strategy="lagom",
                                     structures=True, log=log, verify=False)
            made.write(out / "arms" / "lagom-recalibrated", log)
            arms.append(Arm.of_folder("lagom-recalibrated", out / "arms" / "lagom-recalibrated", made.plan))
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
    if search_k:
        notes.append(_choose(made, arms, out, setup, log))
    made = dataclasses.replace(made, notes=tuple(notes))
    made.write(out)
    return made


def _calibrated(setup: BenchSetup, hw: hardware_lib.HardwareProfile, out: pathlib.Path, arms: list[Arm],
                platform: str, log: Callable[[str], None]) -> tuple[hardware_lib.HardwareProfile | None, str]:
    """The cluster's profile fitted to a trace of lagom's arm (traced once: a rerun reads the
    trace ``out/profile`` holds), and the report's paragraph on it."""
    arm = next((a for a in arms if a.name == "lagom"), arms[-1])
    folder = out / "profile"
    if not (folder / "step.hlo").exists():
        log(f"bench: tracing {protocol.PROFILE_STEPS} steps of the {arm.name} arm (one run, not timed) ...")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        # The built-in worker reads the folder from its spec, a user's decorated step from PROFILE_ENV.
        got = launch.run_arm(setup.launcher, arm.launch_sh,
                             {**setup.worker_spec(platform), "expected": dict(arm.settings),
                              "profile_dir": str(folder.resolve())}, timeout_s=setup.timeout_s,
                             program=setup.program, env={protocol.PROFILE_ENV: str(folder.resolve())})
        if got.result is None or not (folder / "step.hlo").exists():
            shutil.rmtree(folder, ignore_errors=True)
            return None, f"## Calibration\n\nThe traced run of {arm.name} failed; nothing calibrated:\n\n" \
                         f"```text\n{got.error or 'it wrote no module'}\n```"
    try:
        fitted = calibrate.calibrate(folder, (folder / "step.hlo").read_text(), hw)
    except ValueError as err:
        return None, f"## Calibration\n\nThe trace of {arm.name} could not be fitted: {err}"
    fitted.profile.save(out / "calibrated.json")
    log(f"bench: calibrated on {fitted.matched} ops of {arm.name}; wrote {out / 'calibrated.json'}")
    moved = dataclasses.replace(fitted.profile, name=hw.name) != hw
    said = (f"## Calibration\n\nA trace of {protocol.PROFILE_STEPS} steps of {arm.name} ({fitted.matched} ops "
            f"matched), fitted by `calibrate`: `{out / 'calibrated.json'}` (use it as `--hardware`).")
    if not moved:
        said += " Nothing in it moved, so no arm is planned on it."
    return (fitted.profile if moved else None), f"{said}\n\n{fitted.table()}"


def _choose(made: report_lib.Report, arms: list[Arm], out: pathlib.Path, setup: BenchSetup,
            log: Callable[[str], None]) -> str:
    """The plan the search keeps, copied to ``out/chosen``: the model's fastest predicted, unless
    an arm measured faster than it beyond the noise (then the fastest such), and what it took."""
    searched = {name for name, *_ in SEARCH_VARIANTS} | {"xla-default"}
    arms = [a for a in arms if a.name in searched]
    results = {a.name: a for a in made.arms if a.name in searched}
    runs = len(arms) * setup.rounds
    lagom = next((a for a in arms if a.name == "lagom"), None) or max(arms, key=changes)
    m = changes(lagom)
    blind = (f"Trying the {m} settings lagom's plan changes in every combination, blind, would take "
             f"{2 ** m} arms x {setup.rounds} rounds = {2 ** m * setup.rounds} runs")
    ok = [a for a in arms if results[a.name].measured is not None and not results[a.name].not_applied]
    if not ok:
        return f"## Search\n\nNo arm finished with its plan applied: nothing chosen. {blind}."
    proposed = min((a for a in ok if a.name != "xla-default"), key=lambda a: a.predicted_ms, default=ok[0])
    beat = [a for a in ok if stats.faster(results[a.name].measured, results[proposed.name].measured)]
    best = min(beat, key=lambda a: results[a.name].measured.median_ms) if beat else proposed
    why = (f"measured faster than the model's pick, {proposed.name}, beyond the noise" if beat else
           "the model's pick; no arm measured faster than it beyond the noise")
    chosen = out / "chosen"
    if chosen.exists():
        shutil.rmtree(chosen)
    shutil.copytree(best.folder, chosen)
    median = results[best.name].measured.median_ms
    log(f"bench: chose {best.name} ({median:.2f} ms measured; {why}); written to {chosen}")
    return (f"## Search\n\nThe model's {len(arms) - 1} best plans and XLA's defaults, measured in {runs} runs "
            f"({len(arms)} arms x {setup.rounds} rounds). Chosen: {best.name}, median {median:.2f} ms "
            f"(predicted {best.predicted_ms:.3f} ms), {why}; its folder is written to `{chosen}`. {blind}.")