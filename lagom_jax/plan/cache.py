"""Plans on disk, keyed by content (``PlanCache``)."""

from __future__ import annotations

import hashlib
import os
import pathlib

from lagom_jax.plan.schema import Plan


class PlanCache:
    """Plans on disk, keyed by content: (HLO fingerprint, hardware, strategy, version).

    Writes are atomic (write to a temporary file, then rename), so any number of processes
    may read and write the same key at once and never see a torn file.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        if directory is None:
            directory = os.environ.get("LAGOM_JAX_CACHE") or (
                pathlib.Path.home() / ".cache" / "lagom-jax" / "plans"
            )
        self.directory = pathlib.Path(directory)

    @staticmethod
    def key(fingerprint: str, hardware_json: str, strategy: str, version: str) -> str:
        h = hashlib.sha256()
        for part in (fingerprint, hardware_json, strategy, version):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]

    def path(self, key: str) -> pathlib.Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> Plan | None:
        """The cached Plan, None when absent; ValueError naming the file when corrupt."""
        path = self.path(key)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return Plan.from_json(text)
        except ValueError as err:
            raise ValueError(f"corrupt plan cache file {path}: {err}") from err

    def put(self, key: str, plan: Plan) -> pathlib.Path:
        path = self.path(key)
        plan.save(path)
        return path
