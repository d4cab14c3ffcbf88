"""The test suite as a user runs it: on a clean clone, in random order, timed.

Each run clones the repository's committed HEAD into a temporary folder (nothing
uncommitted, no cache, no leftovers of an earlier run), imports the project from that clone,
and runs the README's test command with the collected tests shuffled by a seed
(``LAGOM_TEST_SHUFFLE``, ``tests/conftest.py``). It records, per run, the seed, pytest's
summary line and the wall time, with the machine; a failed run keeps its log's last lines.

    python -m benchmarks.house.shuffled_tests [--seeds 1,2,3,4,5] [--no-record]

The wall time is this machine's with whatever else ran beside it (the section says so);
the suite's goal (issue 49): under 15 minutes alone on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ROOT
# The README's test command after ``python -m pytest``.
README_ARGS = ("-q", "-n", "auto", "--dist", "loadfile")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the machine line imports JAX: no GPU plugin start-up


def one_run(seed: str, timeout_s: float) -> dict:
    """Clone HEAD, run the suite shuffled by ``seed``; the outcome."""
    with tempfile.TemporaryDirectory(prefix="lagom-jax-tests-") as tmp:
        clone = pathlib.Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                                text=True, check=True).stdout.strip()
        env = {**os.environ, "LAGOM_TEST_SHUFFLE": seed, "PYTHONPATH": str(clone)}
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *README_ARGS, "-p", "no:cacheprovider"],
                                  cwd=clone, env=env, capture_output=True, text=True, timeout=timeout_s)
            out, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as err:
            out, rc = f"{err.stdout or ''}{err.stderr or ''}\ntimed out after {timeout_s:.0f} s", -1
        wall = time.perf_counter() - start
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    # pytest's summary (xdist's workers may print to stderr after it)
    summary = next((ln for ln in reversed(lines) if " in " in ln and any(
        w in ln for w in (" passed", " failed", " error", "timed out"))), lines[-1] if lines else "(no output)")
    return {"seed": seed, "commit": commit, "rc": rc, "wall_s": wall, "summary": summary,
            "tail": lines[-15:] if rc else []}


def section(runs: list[dict]) -> str:
    from benchmarks.common import machine_line

    ok = sum(r["rc"] == 0 for r in runs)
    lines = ["## tests (the suite on a clean clone, in random order)", "",
             f"Machine: {machine_line()}. Each run: `git clone` of the committed HEAD, the README's "
             "`python -m pytest " + " ".join(README_ARGS) + "` with the tests shuffled (`LAGOM_TEST_SHUFFLE=seed`, tests/conftest.py), "
             "the project imported from the clone. Wall times are this shared machine's, with whatever ran "
             "beside the suite.", "",
             "| seed | commit | result | wall |", "|---|---|---|---:|"]
    for r in runs:
        lines.append(f"| {r['seed']} | {r['commit']} | {r['summary']} | {r['wall_s'] / 60:.1f} min |")
    lines += ["", f"{ok} of {len(runs)} runs passed" + ("." if ok == len(runs) else "; the failures' last lines:")]
    for r in runs:
        if r["rc"]:
            lines += ["", f"seed {r['seed']}:", "```", *r["tail"], "```"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.house.shuffled_tests", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated shuffle seeds, one run each")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--no-record", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args(argv)
    runs = []
    for seed in [s.strip() for s in args.seeds.split(",") if s.strip()]:
        print(f"[shuffled_tests] seed {seed}: cloning and running the suite ...", file=sys.stderr, flush=True)
        runs.append(one_run(seed, args.timeout))
        print(f"[shuffled_tests] seed {seed}: {runs[-1]['summary']} in {runs[-1]['wall_s']:.0f} s", file=sys.stderr,
              flush=True)
        if not args.no_record:  # after every run: a long series stopped halfway keeps what it ran
            from benchmarks.common import write_section

            write_section("tests", section(runs))
    print(section(runs))
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
