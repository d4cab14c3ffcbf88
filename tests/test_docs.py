"""The README and docs/*.md stay true to the code: every `lagom-jax ...` command they show
parses with the CLI's own parser, and every relative link points to a file that exists.

Commands are taken from fenced code blocks other than ```text ones (program output; line by line, backslash-continued lines
joined) and from inline code spans. A leading `$ ` is dropped, shell comments are
skipped, and a chain such as `pip install ... && lagom-jax tune ...` yields the part that
starts at `lagom-jax`. Nothing is skipped as a placeholder: the docs show commands whose
every argument parses (file names such as step.hlo stand for the user's own files, which
the parser accepts as strings); a reference to a command by name only is written without
the `lagom-jax` prefix.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_PROGRAM = re.compile(r"(^|[\s;&|(])lagom-jax\s")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SEPARATORS = {"&&", "||", ";", "|", "&"}


def _split(text: str) -> tuple[list[tuple[int, str]], str]:
    """(line number, line) of every fenced-block line, and the prose with fences blanked."""
    code: list[tuple[int, str]] = []
    prose: list[str] = []
    fenced = output = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            # a ```text block shows what a command printed, not commands to run
            output = fenced and line.strip().strip("`~").strip() == "text"
            prose.append("")
            continue
        if fenced:
            if not output:
                code.append((number, line))
            prose.append("")
        else:
            prose.append(line)
    return code, "\n".join(prose)


def _joined(code: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Fenced lines with backslash continuations joined, numbered by their first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in code:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        out.append((number, line))
    if pending is not None:
        out.append(pending)
    return out


def _commands_in(snippet: str) -> list[str]:
    """The argument strings of every `lagom-jax` command in one shell line."""
    text = snippet.strip()
    if text.startswith("$ "):
        text = text[2:]
    if text.startswith("#") or not _PROGRAM.search(text):
        return []
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)  # an unbalanced quote raises here, and the test fails on it
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    found = []
    for segment in segments:
        while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[0]):
            segment = segment[1:]  # VAR=value lagom-jax ...
        if segment and segment[0] == "lagom-jax":
            found.append(shlex.join(segment[1:]))
    return found


def _documented_commands() -> list[tuple[str, str]]:
    """(where, args) of every command shown in the README and docs."""
    found = []
    for path in DOCS:
        code, prose = _split(path.read_text(encoding="utf-8"))
        name = path.relative_to(ROOT).as_posix()
        for number, line in _joined(code):
            found += [(f"{name}:{number}", args) for args in _commands_in(line)]
        for match in _SPAN.finditer(prose):
            number = prose.count("\n", 0, match.start()) + 1
            span = " ".join(match.group(1).split())
            found += [(f"{name}:{number}", args) for args in _commands_in(span)]
    return found


def _relative_links() -> list[tuple[str, str]]:
    """(where, target) of every relative link in the README and docs, anchors stripped."""
    found = []
    for path in DOCS:
        _, prose = _split(path.read_text(encoding="utf-8"))
        prose = _SPAN.sub("``", prose)  # a link inside a code span is not a link
        name = path.relative_to(ROOT).as_posix()
        for match in _LINK.finditer(prose):
            target = match.group(1)
            if re.match(r"(https?|mailto|ftp):", target) or target.startswith("#"):
                continue
            number = prose.count("\n", 0, match.start()) + 1
            found.append((f"{name}:{number}", target))
    return found


COMMANDS = _documented_commands()
LINKS = _relative_links()


def test_the_docs_show_commands_and_links():
    # The README shows the main job; the README and docs together show every subcommand.
    assert len(COMMANDS) >= 10, COMMANDS
    assert any("llama3-8b" in args for _, args in COMMANDS)
    assert LINKS


def test_the_extractor_finds_chains_continuations_and_comments():
    assert _commands_in("pip install -e '.[deviceless]' && lagom-jax tune --model gpt2") == [
        "tune --model gpt2"]
    assert _commands_in("$ lagom-jax analyze step.hlo   # a comment") == ["analyze step.hlo"]
    assert _commands_in("# lagom-jax tune --nope") == []
    assert _commands_in("pip install lagom-jax") == []
    assert _joined([(1, "lagom-jax predict \\"), (2, "  --gpus 8")]) == [(1, "lagom-jax predict  --gpus 8")]


@pytest.mark.parametrize("where,args", COMMANDS, ids=[f"{w} lagom-jax {a}" for w, a in COMMANDS])
def test_documented_command_parses(where, args):
    from lagom_jax.cli import build_parser

    try:
        build_parser().parse_args(shlex.split(args))
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # --help exits 0
            pytest.fail(f"{where}: `lagom-jax {args}` does not parse (exit {exit_.code})")


def test_a_broken_command_fails_to_parse():
    from lagom_jax.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(shlex.split("tune --model gpt2 --no-such-option"))
    assert exit_.value.code == 2


@pytest.mark.parametrize("where,target", LINKS, ids=[f"{w} {t}" for w, t in LINKS])
def test_relative_link_points_to_a_file(where, target):
    source = ROOT / where.split(":")[0]
    path = target.split("#", 1)[0]
    if not path:
        return
    assert (source.parent / path).exists(), f"{where}: link to {target}, which does not exist"
