"""How long README.md is, how long its sentences are, and whether the claims a script can
check are true.

Run: ``python -m benchmarks.house.readme_stats [--no-record]``. It prints the ``readme``
section and records it in RESULTS.md; it exits 1 when a limit is passed or a claim is false.
tests/test_readme.py runs the same checks in CI.

How the text is counted:

- **Words**: whitespace-separated tokens outside fenced code blocks (prose, headings, list
  items and table cells). A link counts its text, not its address; an inline code span counts
  as one word, however long (a command or a name is read as one unit). Fenced blocks (the
  commands and what they print) are left out; the whole file's ``wc -w`` is shown beside.
- **Sentences**: in paragraphs and list items only (headings, tables and fenced blocks are
  left out). A sentence ends at ``.``, ``!`` or ``?`` followed by a space and a capital, a
  digit, a code span or an opening bracket, and at the end of its paragraph or list item
  (so a list item without a full stop is one sentence). Words are counted as above.
- **Dates**: ``YYYY-MM-DD`` or ``YYYY-MM`` anywhere in the file, fenced blocks included, and
  a month's name followed by a year (``November 2026``, ``Nov 29, 2026``).

The claims checked (each names the file it is checked against):

- the two commands: the main job (``pip install -e '.[deviceless]' && lagom-jax tune ...``
  with Llama 3 8B, whose arguments the CLI parses, the job tests/test_docs.py looks for) and
  the test command, the line ``.ci/run`` runs as "the README's test command";
- the JAX range: ``jax>=V`` as pyproject.toml requires it, "tested with jax A to B" as the
  first and last of ``CHECKED_JAX`` (lagom_jax/program/jax_internals.py), "a fresh Python 3.12
  gets jax X" as its newest (what .ci/run pins), and every other "jax X" one of ``CHECKED_JAX``;
- the test count: "N passed, M skipped in T min, on a C-core machine" and the printed pytest
  summary as the latest run of the ``tests`` section of RESULTS.md;
- the main job: the excerpt's predicted step and ``XLA_FLAGS`` and "tuned in N s" as the
  ``structures`` section's 2-node llama3-8b job;
- the commands listed as "Other commands are ..." with tune and bench as the CLI's commands;
- numbers beside a section name: every percentage or speedup (``12.0%``, ``1.016x``) in a
  paragraph, list item or table row that names a RESULTS.md section in backticks is found in
  one of the sections it names.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import shlex
import statistics
import sys
from pathlib import Path

from benchmarks.common import RESULTS_MD, ROOT

MAX_WORDS = 1500
MAX_MEDIAN_SENTENCE = 20

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_SPAN = re.compile(r"`[^`]+`")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]*]*\s+(?=[A-Z0-9`\"'(\[*])")
_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
_DATE = re.compile(rf"\b(?:(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?:-\d\d)?|(?:{_MONTHS})\.?\s+"
                   rf"(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?(?:19|20)\d\d)\b")
# a percentage or a speedup, alone or as the ends of a range ("3.8-9.4%": 3.8% and 9.4%)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?(%|x(?![A-Za-z0-9]))")
TEST_COMMAND_MARK = "# The README's test command:"


@dataclasses.dataclass(frozen=True)
class Parsed:
    """README.md cut into what is counted: prose blocks (paragraphs and list items), table
    rows, headings, and the fenced blocks with their language."""

    blocks: tuple[str, ...]
    rows: tuple[str, ...]
    headings: tuple[str, ...]
    fenced: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def parse(text: str) -> Parsed:
    blocks: list[str] = []
    rows: list[str] = []
    headings: list[str] = []
    fenced: list[tuple[str, str]] = []
    current: list[str] = []
    fence: list[str] | None = None
    language = ""

    def close() -> None:
        if current:
            blocks.append(" ".join(line.strip() for line in current))
            current.clear()

    for line in text.splitlines():
        if fence is not None:
            if _FENCE.match(line):
                fenced.append((language, "\n".join(fence)))
                fence = None
            else:
                fence.append(line)
            continue
        if _FENCE.match(line):
            close()
            fence, language = [], line.strip().strip("`~").strip()
            continue
        stripped = line.strip()
        if not stripped:
            close()
        elif stripped.startswith("#"):
            close()
            headings.append(stripped.lstrip("#").strip())
        elif stripped.startswith("|"):
            close()
            if not re.fullmatch(r"\|[\s:|-]+\|", stripped):
                rows.append(stripped)
        elif re.match(r"([-*+]|\d+\.)\s", stripped):
            close()
            current.append(re.sub(r"^([-*+]|\d+\.)\s+", "", stripped))
        else:
            current.append(stripped)
    close()
    return Parsed(tuple(blocks), tuple(rows), tuple(headings), tuple(fenced))


def _plain(text: str) -> str:
    """Links to their text, each code span to one word, emphasis marks dropped."""
    text = _LINK.sub(r"\1", text)
    text = _SPAN.sub("CODE", text)
    return text.replace("**", "").replace("|", " ")


def words(text: str) -> int:
    return len(_plain(text).split())


def sentences(block: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(_plain(block)) if s.strip()]


def sections(results: str) -> dict[str, str]:
    """RESULTS.md's sections by name (the first word of each ``## `` heading)."""
    return {part.split("\n", 1)[0].split(" ")[0]: part for part in re.split(r"(?m)^## ", results)[1:]}


def checked_jax(root: Path) -> tuple[str, ...]:
    source = (root / "lagom_jax" / "program" / "jax_internals.py").read_text()
    return next(ast.literal_eval(node.value) for node in ast.parse(source).body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CHECKED_JAX")


def _check(name: str, ok: bool, detail: str) -> Check:
    return Check(name, bool(ok), detail)


def _commands(parsed: Parsed) -> list[Check]:
    shell = [line.strip() for lang, body in parsed.fenced if lang == "bash" for line in body.splitlines()]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    marks = [i for i, line in enumerate(ci) if line.strip() == TEST_COMMAND_MARK]
    ci_command = ci[marks[0] + 1].strip() if marks and marks[0] + 1 < len(ci) else ""
    test_ok = bool(ci_command) and ci_command in shell
    main = [line for line in shell if line.startswith("pip install -e '.[deviceless]' && lagom-jax tune ")]
    detail = "no `pip install -e '.[deviceless]' && lagom-jax tune ...` line in a bash block"
    main_ok = False
    if len(main) == 1:
        args = shlex.split(main[0].split("&& lagom-jax ", 1)[1])
        from lagom_jax.cli import build_parser

        try:
            parsed_args = build_parser().parse_args(args)
            main_ok = parsed_args.model == "llama" and parsed_args.config == "llama3-8b"
            detail = f"`lagom-jax {shlex.join(args)}` parses; model {parsed_args.model} {parsed_args.config}"
        except SystemExit:
            detail = f"`lagom-jax {shlex.join(args)}` does not parse"
    elif main:
        detail = f"{len(main)} main-job lines; one expected"
    return [
        _check("main job command", main_ok, detail),
        _check("test command is .ci/run's", test_ok,
               f"`{ci_command}`" + ("" if test_ok else " (.ci/run's) is not a line of a bash block")),
    ]


def _jax_range(text: str, root: Path) -> list[Check]:
    checked = checked_jax(root)
    # the dependency line "jax>=V" of pyproject.toml (read as text: tomllib needs Python 3.11)
    found = re.search(r'^\s*"jax>=([^",;]+)"', (root / "pyproject.toml").read_text(), re.M)
    required = found.group(1) if found else None
    flat = " ".join(_LINK.sub(r"\1", text).split())
    stated_min = re.findall(r"`jax>=([\d.]+)`", flat)
    tested = re.findall(r"tested with jax ([\d.]*\d) to ([\d.]*\d)", flat)
    fresh = re.findall(r"fresh Python 3\.12 gets jax ([\d.]*\d)", flat)
    mentioned = sorted(set(re.findall(r"\bjax ([\d]+\.[\d.]*\d)", flat)))
    strays = [v for v in mentioned if v not in checked]
    return [
        _check("jax requirement is pyproject's", stated_min == [required] and required == checked[0],
               f"README `jax>={', '.join(stated_min) or '?'}`; pyproject jax>={required}; oldest checked {checked[0]}"),
        _check("tested range is CHECKED_JAX", tested == [(checked[0], checked[-1])],
               f"README {tested or 'states no range'}; CHECKED_JAX {checked[0]} to {checked[-1]}"),
        _check("fresh Python 3.12 gets the newest checked jax", fresh == [checked[-1]],
               f"README {fresh or 'says nothing'}; newest checked {checked[-1]}"),
        _check("every jax release named is checked", not strays,
               f"named: {', '.join(mentioned)}" + (f"; not in CHECKED_JAX: {', '.join(strays)}" if strays else "")),
    ]


def _latest_tests_run(results: dict[str, str]) -> dict[str, str] | None:
    section = results.get("tests", "")
    rows = [r for r in section.splitlines() if r.startswith("|") and not re.fullmatch(r"\|[\s:|-]+\|", r)]
    if len(rows) < 2:
        return None
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    last = dict(zip(header, (c.strip() for c in rows[-1].strip("|").split("|"))))
    machine = re.search(r"cpus (\d+)", section)
    return {**last, "cpus": machine.group(1) if machine else "?"}


def _test_count(text: str, parsed: Parsed, results: dict[str, str]) -> list[Check]:
    run = _latest_tests_run(results)
    if run is None:
        return [_check("test count is the tests section's", False, "RESULTS.md has no `tests` run")]
    flat = " ".join(text.split())
    stated = re.findall(r"(\d+) passed(?:, (\d+) skipped)? in ([\d.]+) min, on a (\d+)-core machine", flat)
    result = re.match(r"(\d+) passed(?:, (\d+) skipped)?", run.get("result", ""))
    wall = re.match(r"([\d.]+) min", run.get("wall", ""))
    expected = (result.group(1), result.group(2) or "", wall.group(1), run["cpus"]) if result and wall else None
    summaries = [line.strip() for lang, body in parsed.fenced if lang == "text"
                 for line in body.splitlines() if re.search(r"\d+ passed", line)]
    return [
        _check("test count is the tests section's", stated == [expected],
               f"README {stated or 'states no `N passed, M skipped in T min, on a C-core machine`'}; "
               f"latest `tests` run: {run.get('result')}, {run.get('wall')}, {run['cpus']} CPUs"),
        _check("printed summary is the tests section's", all(s == run.get("result") for s in summaries),
               f"README shows {summaries or 'no summary'}; latest run: {run.get('result')}"),
    ]


def _main_job(text: str, parsed: Parsed, results: dict[str, str]) -> list[Check]:
    part = results.get("structures", "").split("### llama3-8b fsdp 16 (2 nodes)", 1)
    if len(part) < 2:
        return [_check("main job is the structures section's", False, "no `llama3-8b fsdp 16 (2 nodes)` job")]
    job = part[1].split("\n### ", 1)[0]
    output = "\n".join(body for lang, body in parsed.fenced if lang == "text")
    step = re.findall(r"predicted step on \S+ ([\d.]+) ms", output)
    flags = re.findall(r"XLA_FLAGS='([^']*)'", output)
    tuned = re.findall(r"tuned in (\d+) s", " ".join(text.split()))
    job_tuned = re.findall(r"tuned in (\d+) s", job)
    ok = (len(step) == 1 and re.search(rf"\b{re.escape(step[0])} ms", job)
          and len(flags) == 1 and f"XLA_FLAGS: `{flags[0]}`" in job and tuned == job_tuned[:1] and tuned)
    return [_check("main job is the structures section's", ok,
                   f"README: step {step}, flags {flags}, tuned in {tuned} s; "
                   f"structures: tuned in {job_tuned[:1]} s, flags {re.findall(r'XLA_FLAGS: `([^`]*)`', job)}")]


def _subcommands(text: str) -> list[Check]:
    from lagom_jax.cli import build_parser

    found = re.search(r"Other commands are ([a-z-, ]+?) and ([a-z-]+)\.", " ".join(text.split()))
    listed = set(found.group(1).split(", ")) | {found.group(2)} if found else set()
    parser = build_parser()
    actual = set(next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)))
    named = listed | {"tune", "bench"}
    return [_check("commands listed are the CLI's", named == actual,
                   f"README: tune, bench and {', '.join(sorted(listed)) or 'nothing'}; CLI: {', '.join(sorted(actual))}")]


def _numbers_beside_sections(parsed: Parsed, results: dict[str, str]) -> list[Check]:
    checks = []
    for block in (*parsed.blocks, *parsed.rows):
        named = [n for n in re.findall(r"`([a-z0-9_]+)`", block) if n in results]
        if not named:
            continue
        numbers = [n + unit for *ends, unit in _NUMBER.findall(_LINK.sub(r"\1", block)) for n in ends if n]
        missing = [n for n in numbers if not any(n in results[s] for s in named)]
        if numbers:
            checks.append(_check(f"numbers in {', '.join(named)}", not missing,
                                 f"{', '.join(numbers)}" + (f"; not found: {', '.join(missing)}" if missing else " found")))
    return checks


@dataclasses.dataclass(frozen=True)
class Stats:
    words: int
    words_wc: int
    sentences: int
    median_sentence: float
    longest_sentence: int
    dates: tuple[str, ...]
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def measure(text: str, root: Path = ROOT, results_md: str | None = None) -> Stats:
    """README ``text`` counted and checked against the files under ``root``."""
    parsed = parse(text)
    results = sections(results_md if results_md is not None else RESULTS_MD.read_text())
    n_words = sum(words(t) for t in (*parsed.blocks, *parsed.rows, *parsed.headings))
    lengths = [words(s) for b in parsed.blocks for s in sentences(b)]
    median = statistics.median(lengths) if lengths else 0.0
    dates = tuple(m.group(0) for m in _DATE.finditer(text))
    checks = [
        _check(f"at most {MAX_WORDS} words", n_words <= MAX_WORDS, f"{n_words} words"),
        _check(f"median sentence at most {MAX_MEDIAN_SENTENCE} words", median <= MAX_MEDIAN_SENTENCE,
               f"median {median:g} over {len(lengths)} sentences"),
        _check("no dates", not dates, ", ".join(dates) or "none"),
        *_commands(parsed),
        *_jax_range(text, root),
        *_test_count(text, parsed, results),
        *_main_job(text, parsed, results),
        *_subcommands(text),
        *_numbers_beside_sections(parsed, results),
    ]
    return Stats(n_words, len(text.split()), len(lengths), median, max(lengths, default=0), dates, tuple(checks))


def section(stats: Stats, machine: str) -> str:
    lines = [
        "## readme (README.md's length and its checkable claims)",
        "",
        f"Machine: {machine}. Counted by `benchmarks/house/readme_stats.py` (its docstring says how): words "
        "outside fenced code blocks, a link as its text and a code span as one word; sentences in "
        "paragraphs and list items only. *Measured* on the text, no timing.",
        "",
        "| what | value |",
        "|---|---|",
        f"| words (limit {MAX_WORDS}) | {stats.words} |",
        f"| whole file, `wc -w` | {stats.words_wc} |",
        f"| sentences | {stats.sentences} |",
        f"| median sentence, words (limit {MAX_MEDIAN_SENTENCE}) | {stats.median_sentence:g} |",
        f"| longest sentence, words | {stats.longest_sentence} |",
        f"| dates | {', '.join(stats.dates) or 'none'} |",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'true' if c.ok else '**false**'} | {c.detail.replace('|', '/')} |" for c in stats.checks),
        "",
        f"{sum(c.ok for c in stats.checks)} of {len(stats.checks)} checks true.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-record", action="store_true", help="print the section; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    from benchmarks.common import machine_line, write_section

    stats = measure((ROOT / "README.md").read_text(encoding="utf-8"))
    md = section(stats, machine_line())
    print(md)
    if not args.no_record:
        write_section("readme", md)
    return 0 if stats.ok else 1


if __name__ == "__main__":
    sys.exit(main())
