"""Operations a user calls inside ``jax.shard_map``: CommFuse's ring collective matmuls."""

from .commfuse import allgather_matmul as allgather_matmul
from .commfuse import matmul_reducescatter as matmul_reducescatter

__all__ = ["allgather_matmul", "matmul_reducescatter"]
