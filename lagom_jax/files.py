"""Files written so that a reader never sees half of one."""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile


def cache_root() -> pathlib.Path:
    """Where lagom-jax keeps what it can find again: ``LAGOM_JAX_CACHE``, else
    ``~/.cache/lagom-jax``."""
    root = os.environ.get("LAGOM_JAX_CACHE")
    return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "lagom-jax"


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never a torn one."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
