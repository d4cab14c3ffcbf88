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
# Any line of XLA's (absl's) C++ log: severity, date, time, thread, file:line] message, e.g.
# "W0000 00:00:1795.. 5695 hlo_rematerialization.cc:3121] Can't reduce memory use below ...".
XLA_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w./+-]+:\d+\] ")


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


def filter_stderr(*, xla_logs: bool = False) -> None:
    """For the rest of this process, drop the start-up noise from file descriptor 2, and
    XLA's own log lines unless ``xla_logs`` (the command line's ``--verbose``).

    The CUDA plugin logs its notice again when JAX's backends start, which happens at a
    different moment in every command, so the command line filters the whole process:
    file descriptor 2 becomes a pipe that a thread copies to the real stderr line by line,
    leaving the noise out. XLA's log lines (e.g. "Involuntary full rematerialization" from a
    compile that does not fit) say nothing the command's own output does not; at exit one
    line counts those kept off. At exit the pipe is drained before the process ends.
    """
    import atexit
    import threading

    try:
        sys.stderr.flush()
        real = os.dup(2)
        read_end, write_end = os.pipe()
    except (OSError, ValueError):
        return
    os.dup2(write_end, 2)
    os.close(write_end)

    dropped = [0]

    def copy() -> None:
        with os.fdopen(read_end, "rb") as src:
            for line in src:
                text = line.decode(errors="replace").rstrip("\n")
                if NOISE.match(text):
                    continue
                if not xla_logs and XLA_LOG.match(text):
                    dropped[0] += 1
                    continue
                os.write(real, line)

    thread = threading.Thread(target=copy, name="lagom-jax-stderr", daemon=True)
    thread.start()

    def drain() -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(real, 2)  # closes the pipe's last write end: the thread sees EOF
        thread.join(timeout=5)
        if dropped[0]:
            os.write(real, f"lagom-jax: {dropped[0]} log line(s) of XLA's kept off the terminal "
                           "(--verbose shows them)\n".encode())

    atexit.register(drain)
