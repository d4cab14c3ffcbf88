"""What the CLI prints fits a terminal of 100 columns (issue 79): prose wraps with a hanging
indent and loses no word; a line meant to be pasted (XLA_FLAGS, NCCL environment, a command)
is printed whole on its own line."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax import Plan, cli
from lagom_jax.cluster.params import CollectiveParams
from lagom_jax.plan.report import WIDTH, Paste, wrap
from lagom_jax.plan.schema import CollectiveChoice
from lagom_jax.program.flags import XlaFlag

PROSE = ("xla_gpu_enable_reduce_scatter_combine_by_dim=true: taken: predicted step 912.137 -> 898.771 ms "
         "(1.015x speedup); exposed reduce-scatter 44.56 -> 27.5 ms, the rest (compute slowed beside "
         "communication, added copies) 867.6 -> 871.3 ms")


def _too_wide(text: str, pasted: set[str] = frozenset()) -> list[str]:
    return [line for line in text.splitlines() if len(line) > WIDTH and line not in pasted]


def test_wrap_keeps_every_word_and_indents_what_it_continues():
    for lead in ("", "  "):
        text = wrap(lead + PROSE)
        lines = text.splitlines()
        assert len(lines) > 1 and all(len(line) <= WIDTH for line in lines)
        assert text.split() == PROSE.split()  # every word, in order, none cut at a hyphen
        assert lines[0].startswith(lead + "xla_gpu") and all(line.startswith(lead + "  ") for line in lines[1:])
    assert wrap(["short", "", "  a table row   with   gaps"]) == "short\n\n  a table row   with   gaps"
    long_word = "x" * (WIDTH + 20)
    assert wrap(f"see {long_word} here").splitlines() == ["see", f"  {long_word}", "  here"]
    assert wrap("# " + PROSE).splitlines()[1].startswith("#   ")  # a comment goes on as one
    assert wrap(PROSE, width=None) == PROSE


def test_wrap_never_splits_a_line_to_paste():
    flags = Paste("  XLA_FLAGS='" + " ".join(f"--xla_gpu_flag_{i}=true" for i in range(12)) + "'")
    env = Paste("NCCL_MIN_CTAS=32 NCCL_CTA_POLICY=1 NCCL_NVLS_ENABLE=0 NCCL_BUFFSIZE=8388608 " * 2)
    lines = wrap(["XLA_FLAGS (checked by the installed XLA):", flags, env, PROSE]).splitlines()
    assert lines[:3] == ["XLA_FLAGS (checked by the installed XLA):", flags, env]
    assert len(flags) > WIDTH and not _too_wide("\n".join(lines), {flags, env})
    assert wrap(flags) == flags


def _wide_plan() -> Plan:
    why = "one choice for the 192 calls that NCCL's tuner sees as one key; " + "alone 890.5 us, window 3906 us " * 6
    choices = tuple(
        CollectiveChoice(
            name=f"all-gather-start.{i}", kind="all-gather", bytes=117440512, group_size=16, nodes=2,
            params=CollectiveParams("ring", "Simple", 8, 2 << 20, 512),
            default_params=CollectiveParams("ring", "Simple", 16, 2 << 20, 512),
            predicted_us=700.0, exposed_us=0.0, why=f"ring/Simple nc=8 chunk=2048KiB nt=512: {why}")
        for i in range(12)
    )
    return Plan(
        module="jit_step", fingerprint="ab" * 16, hardware="h100-sxm-8", gpus_per_node=8, nodes=2,
        strategy="lagom", version="0.1.0", collectives=choices,
        flags=(XlaFlag("xla_gpu_enable_reduce_scatter_combine_by_dim", True),),
        predicted_us=(("lagom", 898771.0), ("xla-default", 913340.0), ("recipe", 982811.0),
                      ("autoccl", 913336.0)),
        bound_us=843814.0, evaluations=11362, search_seconds=1.87, costs=(),
        decisions=(("xla_gpu_enable_reduce_scatter_combine_by_dim=true", PROSE.split(": ", 1)[1]),),
        verification=(("collectives", "as predicted: " + ", ".join(f"{i} all-gather (1.0 MiB)" for i in range(9))),),
        nccl_settings=tuple((f"NCCL_SETTING_{i}", "1" * 12) for i in range(6)),
    )


def test_the_plan_table_fits_and_says_in_full_what_it_said_cut():
    plan = _wide_plan()
    text, whole = plan.report(), plan.report(width=None)
    env = "  " + " ".join(f"{k}={v}" for k, v in plan.nccl_settings)
    assert not _too_wide(text, {env}) and env in text.splitlines()  # the environment: whole, on its own line
    assert text.split() == whole.split()  # wrapped, never cut
    assert "…" not in text and max(map(len, whole.splitlines())) > WIDTH
    header = next(line for line in text.splitlines() if line.startswith("kind "))
    assert "chosen" in header and len(header) <= WIDTH
    assert "  instead of NCCL's default ring/Simple 16ch 2048K 512t" in text.splitlines()
    # A setting short enough stays beside its label.
    one = dataclasses.replace(plan, nccl_settings=(("NCCL_CTA_POLICY", "2"),))
    assert "NCCL settings for every rank: NCCL_CTA_POLICY=2" in one.report().splitlines()


@pytest.mark.parametrize("argv", [
    ["simulate", "--example", "--hardware", "h100-sxm-8"],
    ["analyze", "--example", "--gpus-per-node", "8"],
    ["predict", "--d-model", "4096", "--heads", "32", "--layers", "32", "--seq-len", "2048", "--gpus", "64",
     "--tp", "4", "--dp", "8", "--pp", "2", "--micro-batch", "2", "--global-batch", "512"],
    ["predict", "--d-model", "4096", "--heads", "32", "--layers", "32", "--seq-len", "2048", "--vocab", "51200",
     "--gpus", "64", "--global-batch", "512", "--rank", "5", "--hardware", "a100-sxm-8"],
])
def test_the_documented_quick_commands_fit(argv, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.strip() and not _too_wide(out)


def test_the_bench_report_keeps_flags_whole_under_its_table():
    from lagom_jax.bench import stats
    from lagom_jax.bench.report import ArmResult, Report

    flags = " ".join(f"--xla_gpu_flag_number_{i}=true" for i in range(5))
    applied = (("XLA_FLAGS", "applied: every flag, as the worker read them back from its executable " * 2),)
    arms = (ArmResult("lagom", flags, 12.3, stats.summarize([1.0, 1.1, 1.2, 1.05]), 2, "cpu", applied, ()),
            ArmResult("xla-default", "", 12.5, None, 0, "cpu", (), ("Traceback: boom " * 12,)))
    text = Report(arms, "no comparison: " + "xla-default has no finished run " * 4,
                  "h100-sxm-8 (2 node(s) x 8 GPUs)", "llama tiny, " * 12).markdown()
    pasted = f"  XLA_FLAGS='{flags}'"
    assert pasted in text.splitlines() and not _too_wide(text, {pasted})
    assert "| lagom |" in text and "| xla-default | failed |" in text


@pytest.mark.slow
def test_the_main_jobs_printers_fit_a_terminal(tmp_path, capsys):
    """The main job's code path (a Llama step under FSDP over two nodes of 8 H100, the structure
    search, verification, --out) on the tiny Llama config: the real llama3-8b takes a minute and
    more; tiny prints through the same printers (decisions, verification, table, flags)."""
    out_dir = tmp_path / "plan"
    assert cli.main(["tune", "--model", "llama", "--config", "tiny", "--mesh", "fsdp=16", "--remat", "full",
                     "--hardware", "h100-sxm-8", "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    plan = Plan.load(out_dir / "plan.json")
    from lagom_jax import api

    # the pasteable lines, known from what the printer prints, not from their looks
    pasted = {f"  XLA_FLAGS='{plan.xla_flags()}'", f"  {out_dir / 'launch.sh'} python train.py"}
    pasted |= {f"  {k}={v}" for k, v in api.nccl_env(plan).items()}
    lines = text.splitlines()
    assert f"  {out_dir / 'launch.sh'} python train.py" in lines
    assert not plan.flags or f"  XLA_FLAGS='{plan.xla_flags()}'" in lines
    assert "lagom-jax plan for" in text and "predicted gain" in text and "covers" in text
    assert not _too_wide(text, pasted)
    # wrapped, never cut: the terminal says every word report.txt says
    assert "…" not in text and plan.report(width=None).split() == plan.report().split()


def test_progress_lines_wrap_at_a_terminal_and_stay_whole_in_a_pipe():
    import io

    from lagom_jax import cli

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    message = "structure: " + " ".join(f"word{i}" for i in range(40))
    tty, pipe = Terminal(), io.StringIO()
    cli._log(message, tty)
    cli._log(message, pipe)
    assert all(len(line) <= 100 for line in tty.getvalue().splitlines()) and len(tty.getvalue().splitlines()) > 1
    assert tty.getvalue().split()[5:] == pipe.getvalue().split()[5:]  # every word kept (after the clock)
    assert len(pipe.getvalue().splitlines()) == 1
