"""Frozen dataclasses hashed once.

The cost model caches its tables per hardware profile and cost config, so those two are
hashed on every lookup; hashing their dozens of fields each time cost more than the
lookups. A class takes these two functions as its ``__hash__`` and ``__getstate__``:
the hash is computed on first use and kept in the instance, and left out of pickles
(string hashes differ between processes).
"""

from __future__ import annotations

import dataclasses


def hash_fields_once(self: object) -> int:
    """The hash of the dataclass's fields, computed once per instance."""
    cached = self.__dict__.get("_hash")
    if cached is None:
        cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))  # type: ignore[arg-type]
        object.__setattr__(self, "_hash", cached)
    return cached


def state_without_hash(self: object) -> dict:
    """The instance's state for pickling and copying, without the kept hash."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}
