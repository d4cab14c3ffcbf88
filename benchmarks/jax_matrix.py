"""Which JAX releases the smoke subset passes on: one row per environment.

    python -m benchmarks.jax_matrix ENV_PYTHON... [--write]

Each ENV_PYTHON is the interpreter of an environment that holds one JAX (and a CUDA
plugin), made beforehand, e.g. ``python -m venv v && v/bin/pip install 'jax==0.9.2'
'jaxlib==0.9.2' -e '.[test]'``. The smoke subset (the files ``.ci/smoke_matrix`` runs)
runs in each with ``LAGOM_REQUIRE_DEVICELESS=1``, so a missing deviceless compile fails.
``--write`` records the table as the ``jax_matrix`` section of RESULTS.md. This is a
record of compatibility, not a timing: the seconds are only there to size CI.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The same files as .ci/smoke_matrix.
SMOKE_TESTS = ("tests/test_smoke.py", "tests/test_jax_internals.py", "tests/test_environment.py")
_DESCRIBE = ("import platform; from lagom_jax import environment as e; "
             "print(platform.python_version(), '|', e.describe(e.installed()))")


def run_one(python: str) -> dict[str, str]:
    """The smoke subset in the environment of ``python``: versions, pytest's count, status."""
    env = {**os.environ, "LAGOM_REQUIRE_DEVICELESS": "1"}
    described = subprocess.run([python, "-W", "ignore", "-c", _DESCRIBE], capture_output=True, text=True,
                               cwd=ROOT, env=env, timeout=600)
    if described.returncode != 0:
        return {"python": "?", "installed": python, "result": "cannot import lagom_jax", "ok": "no", "seconds": "0"}
    py_version, installed = (part.strip() for part in described.stdout.strip().splitlines()[-1].split("|", 1))
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


def section(rows: list[dict[str, str]], machine: str) -> str:
    from lagom_jax.program import environment

    lines = [
        "## jax_matrix (tested: the smoke subset on each installed JAX)",
        "",
        f"Machine: {machine}. No GPU: every compile is XLA:GPU's, deviceless, by the plugin named.",
        f"Declared range: jax >= {environment.OLDEST_JAX}, no upper pin; tested range (no warning at import): "
        f"{environment.OLDEST_JAX} to {'.'.join(environment.NEWEST_TESTED_JAX.split('.')[:2])}.x. "
        f"Smoke subset: {', '.join(f'`{t}`' for t in SMOKE_TESTS)} with `LAGOM_REQUIRE_DEVICELESS=1`. "
        "CI runs the full suite on the newest tested JAX and this subset on the oldest and on CUDA 13's "
        "plugin (`.ci/smoke_matrix`).",
        "",
        "| python | installed | smoke subset | passed | s |",
        "|---|---|---|---|---:|",
    ]
    for r in rows:
        version = r["installed"].split(",")[0].removeprefix("jax ")
        ok = r["ok"] + (" (outside the tested range)" if environment.range_warning(version) else "")
        lines.append(f"| {r['python']} | {r['installed']} | {r['result']} | {ok} | {r['seconds']} |")
    if any(environment.range_warning(r["installed"].split(",")[0].removeprefix("jax ")) for r in rows):
        lines += ["", "Outside the tested range the import warns; docs/install.md says what XLA emits there "
                      "that the HLO reader does not price yet (the failing HLO-text check)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pythons", nargs="+", help="the interpreter of each environment")
    parser.add_argument("--write", action="store_true", help="record the section in RESULTS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the machine line needs no plugin started
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
