"""Graph passes over the StepGraph (installed as ``lagom_jax.passes``).

Each pass is a pure function ``StepGraph x params -> StepGraph`` that mirrors what XLA's
GPU pipeline does under a flag, so a choice can be evaluated before it is applied. The
``*_rewrite`` forms also say which input tasks every output task came from.
"""

from .chunk import chunk as chunk
from .chunk import chunk_rewrite as chunk_rewrite
from .combine import COMBINABLE_KINDS as COMBINABLE_KINDS
from .combine import DEFAULT_COMBINE_MAX_COUNT as DEFAULT_COMBINE_MAX_COUNT
from .combine import DEFAULT_COMBINE_THRESHOLD_BYTES as DEFAULT_COMBINE_THRESHOLD_BYTES
from .combine import DEFAULT_COMBINE_THRESHOLDS as DEFAULT_COMBINE_THRESHOLDS
from .combine import THRESHOLD_FLAGS as THRESHOLD_FLAGS
from .combine import combine as combine
from .combine import combine_groups as combine_groups
from .combine import combine_rewrite as combine_rewrite
from .combine import unreproduced_kinds as unreproduced_kinds
from .decompose import DECOMPOSABLE_KINDS as DECOMPOSABLE_KINDS
from .decompose import ORDERS as ORDERS
from .decompose import WINDOWED_EINSUM_KINDS as WINDOWED_EINSUM_KINDS
from .decompose import XLA_ORDER as XLA_ORDER
from .decompose import Pair as Pair
from .decompose import decompose as decompose
from .decompose import decompose_rewrite as decompose_rewrite
from .decompose import eligible_pairs as eligible_pairs
from .decompose import is_matmul as is_matmul
from .rewrite import Rewrite as Rewrite
from .schedule import DEFAULT_OVERLAP_LIMIT as DEFAULT_OVERLAP_LIMIT
from .schedule import Schedule as Schedule
from .schedule import schedule as schedule

__all__ = [
    "COMBINABLE_KINDS",
    "DEFAULT_COMBINE_MAX_COUNT",
    "DEFAULT_COMBINE_THRESHOLD_BYTES",
    "DEFAULT_COMBINE_THRESHOLDS",
    "DECOMPOSABLE_KINDS",
    "DEFAULT_OVERLAP_LIMIT",
    "ORDERS",
    "Pair",
    "Rewrite",
    "Schedule",
    "THRESHOLD_FLAGS",
    "WINDOWED_EINSUM_KINDS",
    "XLA_ORDER",
    "chunk",
    "chunk_rewrite",
    "combine",
    "combine_groups",
    "combine_rewrite",
    "decompose",
    "decompose_rewrite",
    "eligible_pairs",
    "is_matmul",
    "schedule",
    "unreproduced_kinds",
]
