"""Which JAX releases the smoke subset passes on, and what each predicts for the same steps.

    python -m benchmarks.house.jax_matrix ENV_PYTHON... [--write]
    python -m benchmarks.house.jax_matrix --predict ENV_PYTHON... [--write]

Each ENV_PYTHON is the interpreter of an environment that holds one JAX (and a CUDA
plugin), made beforehand, e.g. ``python -m venv v && v/bin/pip install 'jax==0.9.2'
'jaxlib==0.9.2' -e '.[test]'``. The smoke subset (the files ``.ci/smoke_matrix`` runs)
runs in each with ``LAGOM_REQUIRE_DEVICELESS=1``, so a missing deviceless compile fails.
``--write`` records the table as the ``jax_matrix`` section of RESULTS.md. This is a
record of compatibility, not a timing: the seconds are only there to size CI.

``--predict`` runs the same steps in each environment instead: the main job (Llama 3 8B
under FSDP over 2 nodes of 8 H100, structure search included) and two suite cells, each
compiled deviceless by that environment's XLA and tuned. Per step it records the predicted
step (lagom and XLA's defaults), the compiled program's collectives by kind (count, how
many XLA left synchronous, how many run in a Triton collective fusion, bytes), its compute
(tasks and time alone) and the structure flags taken, so that every difference between two
JAX releases can be traced to the programs they compiled. ``--write`` records it as the
``jax_matrix_predict`` section.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from benchmarks.common import ROOT
# The same files as .ci/smoke_matrix.
SMOKE_TESTS = ("tests/test_smoke.py", "tests/test_jax_internals.py", "tests/test_environment.py")
_DESCRIBE = ("import platform; from lagom_jax.program import environment as e; "
             "print(platform.python_version(), '|', e.describe(e.installed()))")


def _describe(python: str, env: dict[str, str]) -> tuple[str, str] | None:
    """(Python version, installed JAX packages) of the environment of ``python``; None when
    it cannot import lagom_jax."""
    described = subprocess.run([python, "-W", "ignore", "-c", _DESCRIBE], capture_output=True, text=True,
                               cwd=ROOT, env=env, timeout=600)
    if described.returncode != 0:
        return None
    py_version, installed = (part.strip() for part in described.stdout.strip().splitlines()[-1].split("|", 1))
    return py_version, installed


def run_one(python: str) -> dict[str, str]:
    """The smoke subset in the environment of ``python``: versions, pytest's count, status."""
    env = {**os.environ, "LAGOM_REQUIRE_DEVICELESS": "1"}
    described = _describe(python, env)
    if described is None:
        return {"python": "?", "installed": python, "result": "cannot import lagom_jax", "ok": "no", "seconds": "0"}
    py_version, installed = described
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE_TESTS],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    seconds = time.perf_counter() - start
    summary = next((ln.strip("= ") for ln in reversed(proc.stdout.splitlines())
                    if re.search(r"\d+ (passed|failed)", ln)), "no pytest summary")
    failed = [ln.split(" - ")[0].removeprefix("FAILED ") for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    result = re.sub(r" in [\d.]+s.*", "", summary) + (f" ({', '.join(failed)})" if failed else "")
    return {"python": py_version, "installed": installed, "result": result,
            "ok": "yes" if proc.returncode == 0 else "no", "seconds": f"{seconds:.0f}"}


# The steps --predict compares: (name, built-in model source arguments, preset, nodes, structures).
PREDICT_CASES = (
    ("main job: llama3-8b fsdp=16, 32 x 4096, flash, full remat", "llama", "llama3-8b", {"fsdp": 16}, 32, 4096,
     {"attention": "flash", "remat": "full"}, 2, True),
    ("suite gpt2/dp+tp (124M, data=2 x model=4)", "gpt2", "124M", {"data": 2, "model": 4}, 16, 1024, {}, 1, False),
    ("suite bert/fsdp (base, fsdp=8)", "bert", "base", {"fsdp": 8}, 32, 512, {}, 1, False),
)


def predict_here() -> list[dict]:
    """Every PREDICT_CASES step compiled and tuned by this process's JAX (the child side)."""
    from lagom_jax import job
    from lagom_jax.cluster import hardware
    from lagom_jax.program import graph as graph_lib

    out = []
    for name, model, config, mesh, batch, seq, extra, nodes, structures in PREDICT_CASES:
        hw = hardware.get("h100-sxm-8", nodes)
        start = time.perf_counter()
        tuned = job.run(job.ModelSource(model, config, mesh, None, batch, seq, **extra), hw,
                        structures=structures, verify=False)
        step = graph_lib.from_hlo_text(tuned.compiled.text, unroll_loops=False)
        kinds: dict[str, dict[str, float]] = {}
        for c in step.collectives:
            k = kinds.setdefault(c.kind, {"count": 0, "sync": 0, "triton": 0, "mib": 0.0})
            k["count"] += c.trip_count
            k["sync"] += 0 if c.is_async else c.trip_count
            k["triton"] += c.trip_count if c.kernel == graph_lib.TRITON_COLLECTIVE else 0
            k["mib"] += c.bytes * c.trip_count / 2**20
        # The compiled schedule's overlap: compute between each async collective's start
        # and the kernel that waits for it (none: the collective is exposed whatever it costs).
        pos = {t.id: i for i, t in enumerate(step.tasks)}
        windows = [[t for t in step.tasks[pos[c.id] + 1:pos[c.done_before]] if t.kind == "compute"]
                   for c in step.collectives if c.is_async and c.done_before is not None]
        timeline = tuned.planned.results["xla-default"].timeline
        out.append({
            "case": name, "lagom_ms": tuned.predicted_ms("lagom"), "default_ms": tuned.predicted_ms("xla-default"),
            "compute_ms": timeline.compute_us / 1e3, "exposed_ms": timeline.exposed_comm_us / 1e3,
            "compute_tasks": sum(t.trip_count for t in step.tasks if t.kind == "compute"),
            "async": len(windows), "empty_windows": sum(1 for w in windows if not w),
            "window_gflop": sum(t.flops * t.trip_count for w in windows for t in w) / 1e9,
            "kinds": kinds, "flags": [f"{f.name}={f.value}" for f in tuned.plan.flags],
            "seconds": time.perf_counter() - start})
    return out


def predict_in(python: str) -> dict:
    """``predict_here`` in the environment of ``python``."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    described = _describe(python, env)
    installed = described[1] if described else python
    proc = subprocess.run([python, "-W", "ignore", "-m", "benchmarks.house.jax_matrix", "--child-predict"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=3600)
    found = re.search(r"^LAGOM_PREDICT (.*)$", proc.stdout, re.M)
    if not found:
        raise RuntimeError(f"predicting in {installed} failed:\n{proc.stderr[-3000:]}")
    return {"installed": installed, "cases": json.loads(found.group(1))}


def _kinds_line(kinds: dict) -> str:
    def one(kind: str, k: dict) -> str:
        extra = [f"{k['sync']} sync" if k["sync"] else "", f"{k['triton']} triton" if k["triton"] else ""]
        extra = [e for e in extra if e]
        return f"{kind} {k['count']}{' (' + ', '.join(extra) + ')' if extra else ''} {k['mib']:.1f} MiB"
    return "; ".join(one(kind, kinds[kind]) for kind in sorted(kinds))


def predict_section(envs: list[dict], machine: str) -> str:
    lines = ["## jax_matrix_predict (predicted: the same steps compiled by each JAX)", "",
             f"Machine: {machine}. No GPU: each step is compiled deviceless for H100 SXM5 by the environment's "
             "own XLA and tuned by the same lagom-jax. Collectives are per step (loop bodies times their trips); "
             "sync: left synchronous by XLA; triton: in a Triton collective fusion.", ""]
    for i, (name, *_rest) in enumerate(PREDICT_CASES):
        lines += [f"### {name}", "", "| jax | lagom ms | xla-default ms | compute alone ms | exposed comm ms "
                  "(default) | compute tasks | collectives | async: nothing to overlap / GFLOP overlappable | "
                  "flags taken |", "|---|---:|---:|---:|---:|---:|---|---|---|"]
        for env in envs:
            c = env["cases"][i]
            lines.append(f"| {env['installed'].split(',')[0]} | {c['lagom_ms']:.3f} | {c['default_ms']:.3f} | "
                         f"{c['compute_ms']:.3f} | {c['exposed_ms']:.3f} | {c['compute_tasks']} | "
                         f"{_kinds_line(c['kinds'])} | {c['empty_windows']} of {c['async']} / "
                         f"{c['window_gflop']:.0f} | {', '.join(c['flags']) or 'none'} |")
        if len(envs) > 1:
            a, b = envs[0]["cases"][i], envs[-1]["cases"][i]
            lines += ["", f"lagom {b['lagom_ms'] / a['lagom_ms'] - 1:+.1%}, xla-default "
                          f"{b['default_ms'] / a['default_ms'] - 1:+.1%}, compute alone "
                          f"{b['compute_ms'] / a['compute_ms'] - 1:+.1%} from the first row to the last."]
        lines.append("")
    return "\n".join(lines).rstrip()


def section(rows: list[dict[str, str]], machine: str) -> str:
    from lagom_jax.program import environment

    lines = [
        "## jax_matrix (tested: the smoke subset on each installed JAX)",
        "",
        f"Machine: {machine}. No GPU: every compile is XLA:GPU's, deviceless, by the plugin named.",
        f"Declared range: jax >= {environment.OLDEST_JAX}, no upper pin; tested range (no warning at import): "
        f"{environment.OLDEST_JAX} to {'.'.join(environment.NEWEST_TESTED_JAX.split('.')[:2])}.x. "
        f"Smoke subset: {', '.join(f'`{t}`' for t in SMOKE_TESTS)} with `LAGOM_REQUIRE_DEVICELESS=1`. "
        "CI runs the full suite on the newest tested JAX (Python 3.12) and this subset on the oldest and on "
        "jax 0.11.2 with CUDA 13's plugin, the GPU hosts' stack (`.ci/smoke_matrix`).",
        "",
        "| python | installed | smoke subset | passed | s |",
        "|---|---|---|---|---:|",
    ]
    for r in rows:
        version = r["installed"].split(",")[0].removeprefix("jax ")
        ok = r["ok"] + (" (outside the tested range)" if environment.range_warning(version) else "")
        lines.append(f"| {r['python']} | {r['installed']} | {r['result']} | {ok} | {r['seconds']} |")
    if any(environment.range_warning(r["installed"].split(",")[0].removeprefix("jax ")) for r in rows):
        lines += ["", "Outside the tested range the import warns (docs/install.md)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pythons", nargs="*", help="the interpreter of each environment")
    parser.add_argument("--write", action="store_true", help="record the section in RESULTS.md")
    parser.add_argument("--predict", action="store_true", help="predict the same steps in each environment")
    parser.add_argument("--child-predict", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_predict:
        print("LAGOM_PREDICT " + json.dumps(predict_here()))
        return 0
    if not args.pythons:
        parser.error("name at least one environment's interpreter")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the machine line needs no plugin started
    if args.predict:
        from benchmarks.common import machine_info, machine_line, write_section

        envs = []
        for python in args.pythons:
            envs.append(predict_in(python))
            print(f"{envs[-1]['installed']}: " + "; ".join(
                f"{c['lagom_ms']:.1f} ms ({c['seconds']:.0f} s)" for c in envs[-1]["cases"]), flush=True)
        info = {k: v for k, v in machine_info().items() if k not in ("jax", "jaxlib", "backend")}
        text = predict_section(envs, machine_line(info))
        print(text)
        if args.write:
            print(f"wrote {write_section('jax_matrix_predict', text)}")
        return 0
    rows = []
    for python in args.pythons:
        row = run_one(python)
        print(f"{row['installed']}: {row['result']} ({row['seconds']} s)", flush=True)
        rows.append(row)
    from benchmarks.common import machine_info, machine_line, write_section

    info = {k: v for k, v in machine_info().items() if k not in ("jax", "jaxlib", "backend")}
    text = section(rows, machine_line(info))
    print(text)
    if args.write:
        print(f"wrote {write_section('jax_matrix', text)}")
    return 0 if all(r["ok"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
