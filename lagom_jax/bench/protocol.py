"""How a run of a bench arm says what it measured: the protocol between ``lagom-jax bench`` and
the step it times (the built-in ``worker``, or a user's program whose step is decorated).

The bench starts every run with, in the environment:

- ``LAGOM_BENCH_TIMES``: a file; process 0 appends one JSON object per line to it: first
  ``{"platform": ..., "applied": {...}}``, then ``{"ms": ...}`` per step;
- ``LAGOM_BENCH_EXPECT``: the arm's settings as JSON (XLA flag or NCCL variable -> value), for
  the applied check.

Under ``LAGOM_BENCH_TIMES`` a ``lagom_jax.tune`` step does not tune: the arm's ``launch.sh``
is the treatment. It times each call as the interval since the previous call returned, which
with JAX's asynchronous dispatch is the step time once the queue is full (the first intervals,
compiling included, are the bench's warm-up). A user's program needs nothing else.

``LAGOM_BENCH_PROFILE`` (a folder; the bench's ``--profile``, a run of its own, not timed): the
decorated step traces calls ``PROFILE_AFTER + 1`` to ``PROFILE_AFTER + PROFILE_STEPS`` under
``jax.profiler`` (each process in ``processN`` of the folder), and process 0 writes the module
they ran as ``step.hlo``, for ``calibrate``.
Ground floor: imports no other module of the project.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

__all__ = ["EXPECT_ENV", "PROFILE_AFTER", "PROFILE_ENV", "PROFILE_STEPS", "TIMES_ENV", "StepReporter", "applied",
           "head", "read", "write"]

TIMES_ENV = "LAGOM_BENCH_TIMES"
EXPECT_ENV = "LAGOM_BENCH_EXPECT"
PROFILE_ENV = "LAGOM_BENCH_PROFILE"
PROFILE_AFTER = 2  # calls left out before the trace: the compile and one warm step
PROFILE_STEPS = 3


def applied(platform: str, expected: dict[str, str]) -> dict[str, str]:
    """What of the arm's settings (``expected``: XLA flag or NCCL variable -> value) this process
    started with and the platform uses. XLA parses ``XLA_FLAGS`` at its first compile and aborts
    the process on one it rejects, so a flag present here was accepted; NCCL reads its variables
    only on a GPU job. A setting absent or with another value did not apply."""
    given = dict(flag.lstrip("-").split("=", 1) for flag in os.environ.get("XLA_FLAGS", "").split() if "=" in flag)
    out = {}
    for name, value in expected.items():
        if name.startswith("NCCL_"):
            here = os.environ.get(name)
            out[name] = (f"not applied: {name}={here} in the environment, not {value}" if here != value else
                         "NCCL: not used on this platform" if platform == "cpu" else
                         "set before the first communicator")
        elif given.get(name) != value:
            out[name] = f"not applied: XLA_FLAGS has {given.get(name)!r}, not {value!r}"
        else:
            out[name] = ("parsed by XLA at start; XLA:CPU does not use it"
                         if platform == "cpu" and name.startswith("xla_gpu_") else "parsed by XLA at start")
    return out


def write(path: str, *records: dict) -> None:
    """Append ``records`` to the run's file, from process 0 only (one writer per job)."""
    import jax

    if jax.process_index() == 0:
        with open(path, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)


def head(platform: str) -> dict:
    """The first record of a run: its platform and what of the arm applied."""
    return {"platform": platform, "applied": applied(platform, json.loads(os.environ.get(EXPECT_ENV, "{}")))}


class StepReporter:
    """Process 0's side of the protocol for a decorated step: a line per call; under
    ``PROFILE_ENV``, every process traces a few calls and process 0 writes their module."""

    def __init__(self, path: str, profile_dir: str = "") -> None:
        self._path = path
        self._last: float | None = None
        self._profile_dir = profile_dir
        self._calls = 0

    @classmethod
    def from_environ(cls) -> StepReporter | None:
        path = os.environ.get(TIMES_ENV)
        return cls(path, os.environ.get(PROFILE_ENV, "")) if path else None

    def before(self) -> None:
        """Before a call: the trace starts before the first traced call."""
        if self._profile_dir and self._calls == PROFILE_AFTER:
            import jax

            jax.profiler.start_trace(os.path.join(self._profile_dir, f"process{jax.process_index()}"))

    def called(self, out: object = None, module: Callable[[], str] | None = None) -> None:
        """After a call that returned ``out``; ``module``: the text of the module it ran."""
        self._calls += 1
        if self._profile_dir and self._calls == PROFILE_AFTER + PROFILE_STEPS:
            import jax

            jax.block_until_ready(out)
            jax.profiler.stop_trace()
            if jax.process_index() == 0 and module is not None:
                with open(os.path.join(self._profile_dir, "step.hlo"), "w", encoding="utf-8") as fh:
                    fh.write(module())
        now = time.perf_counter()
        if self._last is None:
            import jax

            write(self._path, head(jax.devices()[0].platform))
        else:
            write(self._path, {"ms": (now - self._last) * 1e3})
        self._last = now


def read(path: str, warmup: int) -> dict | None:
    """What a run reported: its step times after ``warmup`` steps, platform and applied check;
    None when it reported no step at all."""
    try:
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return None
    head = next((r for r in records if "applied" in r), {"platform": "?", "applied": {}})
    times = [r["ms"] for r in records if "ms" in r][warmup:]
    if not times:
        return None
    return {"times_ms": times, "platform": head["platform"], "applied": head["applied"]}
