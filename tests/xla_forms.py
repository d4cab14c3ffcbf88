"""What XLA:GPU's pipeline emits, by jaxlib release, for tests that check compiled modules.

Up to jaxlib 0.10 every collective of a GPU module is an async pair. From 0.11 XLA leaves
collectives synchronous where it sees nothing to overlap them with (``"is_sync":true``) and
runs small all-reduces in Triton collective fusions (``fusion-start``): tests read the module
as the tuner does (``graph.from_hlo_text``) and ask for every collective async only where the
release makes them so.
"""

import jax

from lagom_jax.program import environment, graph

RELEASE = environment.parse_version(jax.__version__)[:2]
EVERY_COLLECTIVE_ASYNC = RELEASE < (0, 11)


def collective_kinds(text: str) -> set[str]:
    """The kinds of the collectives the tuner reads in ``text``."""
    return {c.kind for c in graph.from_hlo_text(text).collectives}


def assert_async_collectives(step: graph.StepGraph) -> None:
    """Collectives there, async: all of them up to 0.10, at least one from 0.11."""
    flags = [c.is_async for c in step.collectives]
    assert flags and (all(flags) if EVERY_COLLECTIVE_ASYNC else any(flags)), step.collectives
