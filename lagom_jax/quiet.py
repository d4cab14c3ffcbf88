"""Drop the start-up noise that importing JAX with the CUDA plugin prints on a GPU-less host.

``import jax`` loads the CUDA plugin, whose C++ start-up logs through absl before anything
initialised absl's logging, so on a machine without a CUDA driver every process gets
lines like::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1795498268.392678 5695 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.

They say nothing a user can act on (lagom-jax compiles for GPUs without one). This module
imports JAX once with the process's stderr (file descriptor 2) captured, and writes back
every line except those two kinds; real warnings and errors pass through unchanged.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

# The two lines, and nothing else: absl's pre-init banner and cudart_stub's driver notice.
NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                   r"|I\d{4} [\d:.]+\s+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine.*)$")


def import_jax_quietly() -> None:
    """``import jax`` with the start-up noise dropped (a no-op once JAX is imported)."""
    if "jax" in sys.modules:
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (an embedding host): import as usual
        import jax  # noqa: F401
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            import jax  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not NOISE.match(ln.rstrip("\n"))]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
