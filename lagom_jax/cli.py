"""The ``lagom-jax`` command line: a thin shell over library functions.

Each subcommand is one ``_add_<name>(subparsers)`` function that declares its arguments
and one ``_run_<name>(args) -> int`` that does the work; adding a subcommand means adding
that pair and one line in :data:`_SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
from collections.abc import Callable, Sequence

from lagom_jax import graph, hlo

EXAMPLES = ("gpt_train_step",)


def example_text(name: str = "gpt_train_step") -> str:
    """HLO text of a built-in example module (``lagom_jax/data/example_<name>.hlo``)."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r} (known: {', '.join(EXAMPLES)})")
    return (importlib.resources.files("lagom_jax") / "data" / f"example_{name}.hlo").read_text()


class _UsageError(Exception):
    """A bad argument or input file: reported on stderr, exit status 2, no traceback."""


def _read_module(args: argparse.Namespace) -> hlo.Module:
    if args.example is not None:
        if args.path is not None:
            raise _UsageError("give either PATH or --example, not both")
        text, where = example_text(args.example), f"example {args.example}"
    elif args.path is None:
        raise _UsageError("missing PATH (an HLO text file, or - for stdin); or use --example")
    elif args.path == "-":
        text, where = sys.stdin.read(), "<stdin>"
    else:
        try:
            with open(args.path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise _UsageError(f"cannot read {args.path}: {e}") from None
        where = args.path
    try:
        return hlo.parse(text)
    except hlo.HloParseError as e:
        raise _UsageError(f"{where}: {e}") from None


# ----------------------------------------------------------------------------- analyze


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="list the collectives and compute totals of an HLO module",
        description="Parse HLO text (compiled.as_text() or an XLA dump) and report its "
        "collectives (kind, bytes, group size, loop trip count, async) and compute totals.",
    )
    p.add_argument("path", nargs="?", help="HLO text file, or - to read stdin")
    p.add_argument("--example", nargs="?", const=EXAMPLES[0], choices=EXAMPLES,
                   help="analyze a built-in GPU-style example module instead of PATH")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs per node: adds how many nodes each collective's group spans")


def _run_analyze(args: argparse.Namespace) -> int:
    if args.gpus_per_node is not None and args.gpus_per_node <= 0:
        raise _UsageError(f"--gpus-per-node must be positive, got {args.gpus_per_node}")
    module = _read_module(args)
    try:
        result = graph.analyze(module)
        nodes_of = None
        if args.gpus_per_node is not None:
            step = graph.from_module(module, unroll_loops=False)
            nodes_of = {t.name: t.nodes_spanned(args.gpus_per_node) for t in step.collectives}
    except hlo.HloParseError as e:
        raise _UsageError(f"{args.path or args.example}: {e}") from None
    if args.json:
        print(json.dumps(result))
    else:
        print(graph.format_analysis(result, nodes_of=nodes_of))
    return 0


_SUBCOMMANDS: dict[str, tuple[Callable, Callable[[argparse.Namespace], int]]] = {
    "analyze": (_add_analyze, _run_analyze),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lagom-jax",
        description="Contention-aware tuning of communication/computation overlap for JAX.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in _SUBCOMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lagom-jax``; returns the exit status (2 for bad input)."""
    args = build_parser().parse_args(argv)
    try:
        return _SUBCOMMANDS[args.command][1](args)
    except _UsageError as e:
        print(f"lagom-jax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
