"""README.md stays short and true: benchmarks/house/readme_stats.py's limits (words, median
sentence, no dates) and every claim it can check (the two commands, the JAX range, the test
count, the main job, the numbers beside a RESULTS.md section). Its docstring says how the
text is counted."""

from __future__ import annotations

import pytest

from benchmarks.house import readme_stats

README = readme_stats.ROOT / "README.md"
STATS = readme_stats.measure(README.read_text(encoding="utf-8"))


@pytest.mark.parametrize("check", STATS.checks, ids=[c.name for c in STATS.checks])
def test_readme_check_holds(check):
    assert check.ok, f"README.md: {check.name}: {check.detail}"


def test_every_kind_of_claim_is_checked():
    names = {c.name for c in STATS.checks}
    assert {"main job command", "test command is .ci/run's", "tested range is CHECKED_JAX",
            "test count is the tests section's", "no dates"} <= names
    assert any(name.startswith("numbers in ") for name in names)


# The checks fail on a README that breaks them (a small text, RESULTS.md given beside it).

_RESULTS = """# Benchmark results

## tests (the suite)

Machine: date x, host vm, cpus 2, python 3.11.7.

| seed | commit | result | wall |
|---|---|---:|---:|
| 1 | abc | 10 passed in 60.00s (0:01:00) | 1.0 min |
| 2 | def | 12 passed, 1 skipped in 120.00s (0:02:00) | 2.0 min |

## suite_quick (predicted)

lagom over xla-default: geometric mean 1.008x.
"""


def _failed(text: str) -> set[str]:
    stats = readme_stats.measure(text, results_md=_RESULTS)
    return {c.name for c in stats.checks if not c.ok}


def test_counting_leaves_out_code_and_link_addresses():
    parsed = readme_stats.parse("# Title\n\nOne two [three](http://x/y z) `a b c`.\n\n```bash\nx y z\n```\n"
                                "\n| a | b c |\n|---|---|\n")
    assert parsed.blocks == ("One two [three](http://x/y z) `a b c`.",)
    assert readme_stats.words(parsed.blocks[0]) == 4
    assert parsed.rows == ("| a | b c |",) and parsed.fenced == (("bash", "x y z"),)
    assert readme_stats.sentences("It runs. Then `x` stops. e.g. not here: 0.5 s.") == [
        "It runs.", "Then CODE stops. e.g. not here: 0.5 s."]


def test_a_long_text_long_sentences_and_dates_fail():
    long_sentence = " ".join(["word"] * 21) + "."
    assert {"at most 1500 words", "median sentence at most 20 words"} <= _failed(
        "\n\n".join([long_sentence] * 80))
    assert "no dates" in _failed("Recorded on 2026-11-29. Also in November 2026.")
    assert "no dates" not in _failed("Sizes 2048K, 16 ranks.")


def test_false_claims_fail():
    assert "test count is the tests section's" in _failed(
        "The last recorded run: 10 passed in 1.0 min, on a 2-core machine.")
    assert "test count is the tests section's" not in _failed(
        "The last recorded run: 12 passed, 1 skipped in 2.0 min, on a 2-core machine.")
    assert "tested range is CHECKED_JAX" in _failed("It is tested with jax 0.9.0 to 0.10.2.")
    assert "every jax release named is checked" in _failed("With jax 0.8.1 it warns.")
    assert "numbers in suite_quick" in _failed("A geometric mean of 1.5x (`suite_quick`).")
    assert "numbers in suite_quick" not in _failed("A geometric mean of 1.008x (`suite_quick`).")
    assert {"main job command", "test command is .ci/run's"} <= _failed("No commands here.")
