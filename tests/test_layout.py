"""The house's shape: imports point down the pipeline only (docs/layout.md)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Floors, lowest first: a module may import its own floor or a lower one, never a higher one.
FLOORS = (
    {"ops", "units", "files", "hashing", "quiet"},  # imports no project module above it
    {"cluster"},
    {"program"},
    {"costs"},
    {"passes"},
    {"search"},
    {"plan"},
    {"models"},
    {"job"},  # the one pipeline
    {"advise"},  # advisers on top of it
    {"bench"},  # measuring plans where the job runs (its protocol also serves the decorator)
    {"api", "cli", "__init__"},  # the faces
)
FOLDERS = {"lagom_jax": None, "passes": "passes", "models": "models"}


def _floor(name: str) -> int:
    return next(i for i, names in enumerate(FLOORS) if name in names)


def _room(path: pathlib.Path) -> str:
    top = path.relative_to(ROOT).parts
    if top[0] != "lagom_jax":
        return top[0]
    rest = top[1:]
    return rest[0] if len(rest) > 1 else rest[0].removesuffix(".py")


def _imported_rooms(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "lagom_jax":
                yield from (a.name for a in node.names)
            elif node.module.startswith("lagom_jax."):
                yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            yield from (a.name.split(".")[1] for a in node.names if a.name.startswith("lagom_jax."))


def test_imports_point_down_the_pipeline_only():
    files = [p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 40
    upward = []
    for path in files:
        room = _room(path)
        for target in _imported_rooms(ast.parse(path.read_text())):
            if target != room and _floor(target) > _floor(room):
                upward.append(f"{path.relative_to(ROOT)} ({room}) imports {target}")
    assert not upward, upward


def test_the_ring_operations_live_with_operations_and_their_price_with_costs():
    from lagom_jax import ops
    from lagom_jax.costs import commfuse

    assert callable(ops.allgather_matmul) and callable(ops.matmul_reducescatter)
    assert not hasattr(commfuse, "allgather_matmul") and callable(commfuse.choose)
