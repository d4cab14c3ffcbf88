"""XLA's own GPU benchmark modules: compiled, priced, tuned and verified, one row each.

XLA keeps the programs it tunes GPUs on in openxla/xla ``xla/tools/benchmarks/hlo/``
(Apache-2.0): Llama 3.1 8B/70B/405B and Mixtral 8x7B training steps in bf16 and fp8 on
1x8 to 64x8 H100s, and a few others. They are too large to keep here (up to 4 MB each):
this script takes the folder they were downloaded to (``DIR``; e.g. a checkout's
``xla/tools/benchmarks/hlo``) and runs every ``*.hlo`` in it through the pipeline of
``lagom-jax tune`` (``job.run`` on an ``HloSource``), each in its own process so that its
peak memory is its own and an XLA abort costs one row:

* **compile**: deviceless with XLA's GPU pipeline for the module's device count of the
  hardware preset; the custom calls jaxlib has no handler for (Transformer Engine's fused
  attention) are mocked for that compile only (``lagom_jax.program.custom_calls``);
* **price**: the stood-in calls from their backend config (cuDNN flash attention rates);
* **tune**: lagom's search against XLA's defaults;
* **verify**: the plan's options recompiled (``--no-verify`` skips it).

Rows: compile s, search s, verify s, collectives, the stood-in calls and their priced
time, unpriced calls, predicted step under XLA's defaults, lagom's predicted gain, peak
RSS. Calibration: XLA's PR #31030 measured two of these one-node steps on H100
(``CALIBRATION``); the table gives the model's error on them. The multi-node steps the
same PRs report are held aside (not used here) to judge the model across nodes.

Run: ``python -m benchmarks.measured.xla_modules DIR [--modules NAME ...] [--hardware h100-sxm-8] [--record]``;
``--rows LOG`` re-renders an earlier run's printed rows with ``--modules`` run again.

``--compare PYTHON_A PYTHON_B`` tunes each module of DIR with two interpreters (two JAX releases),
one process after the other, and prints them side by side: the collectives each compiled, the
predicted steps, the plans and the wall times (issue 79: jax 0.12 against 0.10.2).

``--tune PATH [--nodes N]`` times the whole ``lagom-jax tune PATH --hardware H --nodes N`` (structure
search and verification included) in a process of its own, wall clock, and records the plan it
printed (section ``xla_modules_tune``; the goal: XLA's Mixtral 2x8 module under 180 s here with
nothing else running).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import resource
import sys
import time

# Measured step seconds on 8x H100 (one node), "main" column of openxla/xla PR #31030.
CALIBRATION = {"hlo_llama31_8b_bf16_1x8": 1.3696, "hlo_mixtral_8x7b_bf16_1x8": 0.7445}
NAME = "xla_modules"
TUNE_NAME = "xla_modules_tune"
# The lines of ``lagom-jax tune``'s report the tune section keeps.
_TUNE_LINES = ("predicted step on", "speedup on", "search:", "structure search:", "NCCL settings for every rank",
               "XLA_FLAGS=", "zero-CTA collectives", "collectives:")


_PREDICTED = re.compile(r"predicted step on \S+ ([\d.]+) ms")
_DEFAULT = re.compile(r"over xla-default \(([\d.]+) ms\)")
_VERIFIED = re.compile(r"(\d+) ([a-z-]+) \(([\d.]+) [KMG]?i?B\)")
_COMPILED = re.compile(r"; (\d+) collectives, (\d+) tasks")
_STAGE = re.compile(r"^lagom-jax \[([\d.]+) s, \+([\d.]+) s\]: (.*)$")


def tune_once(path: str, hardware: str, nodes: int | None, python: str = sys.executable) -> dict:
    """``lagom-jax tune`` of ``path`` by the interpreter ``python``, in a process of its own,
    timed end to end: wall and CPU seconds, its JAX, the kept report lines, the predicted
    steps, the collectives compiled (count) and verified (per kind), the plan, the stages."""
    import subprocess

    cmd = [python, "-m", "lagom_jax.cli", "tune", path, "--hardware", hardware]
    cmd += ["--nodes", str(nodes)] if nodes else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"tune failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    lines: list[str] = []
    for ln in done.stdout.splitlines():  # the report wraps a line's tail in lines indented by two
        if ln.startswith("  ") and not ln.startswith("   ") and lines:
            lines[-1] += " " + ln.strip()
        else:
            lines.append(ln.strip())
    text = "\n".join(lines)
    out: dict = {"module": pathlib.Path(path).stem, "wall_s": wall,
                 "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                 "kept": [ln for ln in lines if ln.startswith(_TUNE_LINES)],
                 "shown": "lagom-jax " + " ".join(cmd[3:]).replace(path, pathlib.Path(path).name)}
    version = subprocess.run([python, "-c", "import jax, jaxlib, platform; print(platform.python_version(), "
                              "jax.__version__, jaxlib.__version__)"], capture_output=True, text=True, check=False)
    out["python"], out["jax"], out["jaxlib"] = (version.stdout.split() + ["?"] * 3)[:3]
    if m := _PREDICTED.search(text):
        out["lagom_ms"] = float(m.group(1))
    if m := _DEFAULT.search(" ".join(text.split())):
        out["xla_default_ms"] = float(m.group(1))
    flat = " ".join(done.stdout.split())  # the report wraps at 100 columns, sub-items indented
    verified = m.group(1) if (m := re.search(r"verified by recompiling.*? collectives: (.*?) placement:", flat)) else ""
    out["verified"] = {kind: int(n) for n, kind, _ in _VERIFIED.findall(verified)}
    out["verified_as_predicted"] = verified.startswith("as predicted")
    plan = re.finditer(r"XLA_FLAGS='[^']*'|NCCL settings for every rank: [^\n]*", done.stdout)
    out["plan"] = " ".join(m.group(0) for m in plan)
    stages = []
    for ln in done.stderr.splitlines():
        if m := _COMPILED.search(ln):
            out["collectives"], out["tasks"] = int(m.group(1)), int(m.group(2))
        if m := _STAGE.match(ln.strip()):
            stages.append((float(m.group(2)), m.group(3)[:90]))
    out["stages"] = stages
    out["report"] = done.stdout
    return out


def tune_wall(path: str, hardware: str, nodes: int | None) -> str:
    """``lagom-jax tune`` of ``path`` timed end to end in its own process: a section."""
    from benchmarks import common

    r = tune_once(path, hardware, nodes)
    return (f"## {TUNE_NAME} (lagom-jax tune of an XLA benchmark module, end to end)\n\n"
            f"Machine: {common.machine_line()}.\n\n`{r['shown']}`: "
            f"**{r['wall_s']:.1f} s wall** (goal: under 180 s on this machine with nothing else running).\n\n"
            + "\n".join(f"    {ln}" for ln in r["kept"]) + "\n")


def _pct(a: float | None, b: float | None) -> str:
    return f"{b / a - 1:+.2%}" if a and b else "-"


def compare_md(rows: list[tuple[dict, dict]]) -> str:
    """Side by side: ``lagom-jax tune`` of each module by two JAX releases (a, b)."""
    a0, b0 = rows[0]
    ja, jb = a0["jax"], b0["jax"]
    head = ["| module | collectives compiled (jax " + ja + " / " + jb + ") | verified collectives by kind, same? "
            "| XLA defaults ms (" + ja + " / " + jb + ", diff) | lagom ms (" + ja + " / " + jb + ", diff) "
            "| same plan? | tune wall s (" + ja + " / " + jb + ") |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for a, b in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(a["verified"].items()))
        same_kinds = "yes" if a["verified"] == b["verified"] and a["verified"] else f"no: {b['verified']}"
        head.append(
            f"| {a['module']} | {a.get('collectives', '?')} / {b.get('collectives', '?')} | {kinds}: {same_kinds} "
            f"| {a.get('xla_default_ms', 0):.1f} / {b.get('xla_default_ms', 0):.1f} "
            f"({_pct(a.get('xla_default_ms'), b.get('xla_default_ms'))}) "
            f"| {a.get('lagom_ms', 0):.1f} / {b.get('lagom_ms', 0):.1f} ({_pct(a.get('lagom_ms'), b.get('lagom_ms'))}) "
            f"| {'yes' if a['plan'] == b['plan'] else 'no'} | {a['wall_s']:.0f} / {b['wall_s']:.0f} |")
    return "\n".join(head) + "\n"


def _rss_gb() -> float:
    from lagom_jax.program import fork_server

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return max(own, fork_server.largest_child_rss_bytes()) / 1e9


def one(path: str, hardware: str, verify: bool) -> dict:
    """One module through the pipeline, in this process (the compile runs in a child)."""
    from lagom_jax import job
    from lagom_jax.costs import cost
    from lagom_jax.program import custom_calls, hlo, hlo_compile
    from lagom_jax.cluster import hardware as hardware_lib

    text = pathlib.Path(path).read_text()
    row: dict = {"module": pathlib.Path(path).stem}
    module = hlo.parse(text)
    unoptimized, why = hlo_compile.classify(module)
    if unoptimized:
        row["devices"] = hlo_compile.partitions(module)
    row["stood_in"] = {s.target: s.count for s in custom_calls.stand_ins(module)}
    hw = hardware_lib.resolve_cluster(hardware).hardware
    t0 = time.perf_counter()
    try:
        compiled = job.compile_source(job.HloSource(text, row["module"]), hw)
    except Exception as e:  # noqa: BLE001 - XLA's one-line reason is the row
        row["failed"] = f"compile: {type(e).__name__}: {e}"
        return row
    row["compile_s"] = time.perf_counter() - t0
    step = compiled.graph()
    chw = compiled.hardware
    row["collectives"] = len(step.collectives)
    # The graph unrolls loops: every executed call is a task of its own.
    priced = sum(cost.compute_time_us(t.flops, t.bytes, chw, kernel=t.kernel)
                 for t in step.compute_tasks if t.kernel.startswith("attention-"))
    row["priced_ms"] = priced / 1e3
    row["unpriced"] = custom_calls.unpriced(step.tasks)
    t1 = time.perf_counter()
    done = job.plan_compiled(compiled, strategy="lagom", baselines=("xla-default",), verify=False)
    row["search_s"] = time.perf_counter() - t1
    predicted = dict(done.plan.predicted_us)
    row["xla_default_ms"] = predicted["xla-default"] / 1e3
    row["lagom_ms"] = predicted["lagom"] / 1e3
    row["options"] = len(done.plan.compiler_options())
    row["flags_clean"] = custom_calls.MOCK_OPTION not in json.dumps(done.plan.xla_flags()) + json.dumps(
        {k: str(v) for k, v in done.plan.compiler_options().items()})
    if verify and compiled.recompile is not None:
        from lagom_jax.plan import verify as verify_lib

        t2 = time.perf_counter()
        try:
            plan, _ = verify_lib.verify_plan(done.plan, done.planned.chosen.graph, compiled.text,
                                             compiled.recompile)
            row["verified"] = "; ".join(f"{k}: {v}" for k, v in plan.verification)[:200]
        except Exception as e:  # noqa: BLE001
            row["verified"] = f"failed: {type(e).__name__}: {e}"[:200]
        row["verify_s"] = time.perf_counter() - t2
    row["rss_gb"] = _rss_gb()
    return row


def _row_md(r: dict) -> str:
    if "failed" in r:
        return f"| {r['module']} | {r.get('devices', '')} | - | - | - | - | {_calls(r)} | - | - | - | - | {r['failed'][:160]} |"
    gain = r["xla_default_ms"] / r["lagom_ms"] if r.get("lagom_ms") else float("nan")
    verify = f"{r['verify_s']:.0f}" if "verify_s" in r else "-"
    unpriced = ", ".join(f"{k} x{n}" for k, n in r["unpriced"].items()) or "none"
    return (f"| {r['module']} | {r.get('devices', '')} | {r['compile_s']:.1f} | {r['search_s']:.1f} | {verify} | "
            f"{r['collectives']} | {_calls(r)} | {r['priced_ms']:.1f} | {unpriced} | {r['xla_default_ms']:.1f} | "
            f"{gain:.3f}x | {r['rss_gb']:.1f} GB |")


def _calls(r: dict) -> str:
    return ", ".join(f"{k} x{n}" for k, n in r.get("stood_in", {}).items()) or "none"


def render(rows: list[dict], hardware: str, machine: str) -> str:
    lines = [f"## XLA's benchmark modules ({hardware})", "",
             f"Machine: {machine}. Every `*.hlo` of openxla/xla `xla/tools/benchmarks/hlo/` present, "
             "compiled deviceless for its device count (custom calls without a handler mocked for the "
             "compile only and priced from their backend config), tuned by lagom and, where asked, "
             "verified by recompiling. *Predicted* steps; compile/search/verify are seconds here.", "",
             "| module | GPUs | compile s | search s | verify s | collectives | stood in | priced ms "
             "| unpriced | predicted step ms (XLA defaults) | lagom gain | peak RSS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_row_md(r) for r in rows]
    cal = [r for r in rows if r["module"] in CALIBRATION and "xla_default_ms" in r]
    if cal:
        lines += ["", "Calibration against XLA PR #31030's one-node H100 steps (measured, \"main\" column); "
                  "no constant was fitted to them:", "",
                  "| module | measured s | predicted s | error |", "| --- | --- | --- | --- |"]
        for r in cal:
            measured = CALIBRATION[r["module"]]
            predicted = r["xla_default_ms"] / 1e3
            lines.append(f"| {r['module']} | {measured:.4f} | {predicted:.4f} | {predicted / measured - 1:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", help="folder holding XLA's benchmark *.hlo modules")
    parser.add_argument("--modules", nargs="*", default=None, help="module names (file stems) to run")
    parser.add_argument("--hardware", default="h100-sxm-8")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--record", action="store_true", help="write the section of RESULTS.md")
    parser.add_argument("--rows", metavar="LOG", help="rows of an earlier run (its printed JSON lines): "
                        "run only --modules again and render them all")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--tune", metavar="PATH", help="time lagom-jax tune of one module end to end")
    parser.add_argument("--nodes", type=int, default=None, help="with --tune: nodes of the preset")
    parser.add_argument("--compare", nargs=2, metavar=("PYTHON_A", "PYTHON_B"),
                        help="tune every module of DIR (or --modules) with each interpreter's JAX, one after "
                             "the other, and print them side by side")
    args = parser.parse_args(argv)
    if args.compare:
        if not args.dir:
            parser.error("--compare needs DIR")
        pairs = []
        for p in sorted(pathlib.Path(args.dir).glob("*.hlo")):
            if args.modules and p.stem not in args.modules:
                continue
            pair = tuple(tune_once(str(p), args.hardware, None, python) for python in args.compare)
            for r in pair:
                print(json.dumps(r), flush=True)
            pairs.append(pair)
        print(compare_md(pairs))
        return 0
    if args.tune:
        from benchmarks import common

        md = tune_wall(args.tune, args.hardware, args.nodes)
        print(md)
        if args.record:
            common.write_section(TUNE_NAME, md)
        return 0
    if args.one:
        print(json.dumps(one(args.one, args.hardware, not args.no_verify)))
        return 0
    if not args.dir:
        parser.error("give the folder of XLA's benchmark modules (xla/tools/benchmarks/hlo)")
    from benchmarks import common

    paths = sorted(pathlib.Path(args.dir).glob("*.hlo"))
    if args.modules:
        paths = [p for p in paths if p.stem in args.modules]
    earlier: dict[str, dict] = {}
    if args.rows:
        for line in pathlib.Path(args.rows).read_text().splitlines():
            if line.startswith("{") and '"module"' in line:
                row = json.loads(line)
                earlier[row["module"]] = row
    rows = []
    for p in paths:
        extra = ["--hardware", args.hardware] + (["--no-verify"] if args.no_verify else [])
        t = time.perf_counter()
        try:
            row = common.json_from_child("benchmarks.measured.xla_modules", "--one", str(p), *extra, timeout_s=args.timeout)
        except Exception as e:  # noqa: BLE001 - a timeout is a row too
            row = {"failed": f"{type(e).__name__}: {e}"}
        row.setdefault("module", p.stem)
        row["wall_s"] = time.perf_counter() - t
        print(json.dumps(row), flush=True)
        rows.append(row)
    if earlier:
        fresh = {r["module"]: r for r in rows}
        rows = [fresh.get(name, row) for name, row in sorted({**earlier, **fresh}.items())]
    md = render(rows, args.hardware, common.machine_line())
    print(md)
    if args.record:
        common.write_section(NAME, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
