"""Start one arm's job the way the cluster starts jobs, and collect what its process 0 wrote.

- ``local``: this host. The tool starts the processes itself (one per ``--processes``), each
  under the arm's ``launch.sh``, joined by ``jax.distributed`` through a coordinator on a free
  localhost port.
- ``srun``: SLURM. One ``srun`` of ``launch.sh python -m lagom_jax.bench.worker ...``; JAX's
  cluster detection gives every task its process id and the coordinator.
- ``mpirun``: Open MPI, likewise (``mpirun -np N``).

No transport of our own: the processes meet through ``jax.distributed``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from lagom_jax.bench import nccl_log, protocol, worker

__all__ = ["LAUNCHERS", "Launched", "command", "run_arm"]

LAUNCHERS = ("local", "srun", "mpirun")


@dataclasses.dataclass(frozen=True)
class Launched:
    """One arm's job: process 0's report, or the error and the last lines it printed."""

    result: dict[str, Any] | None
    error: str | None
    seconds: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def command(launcher: str, launch_sh: pathlib.Path, spec: pathlib.Path, processes: int,
            program: tuple[str, ...] = ()) -> list[str]:
    """The command line of one arm's job (for ``local``: of one of its processes): the built-in
    worker, or the user's ``program`` (which starts its own processes when run locally)."""
    worker_cmd = [str(launch_sh), *(program or (sys.executable, "-m", "lagom_jax.bench.worker", str(spec)))]
    if launcher == "local":
        return worker_cmd
    if launcher == "srun":
        return ["srun", f"--ntasks={processes}", *worker_cmd]
    if launcher == "mpirun":
        return ["mpirun", "-np", str(processes), *worker_cmd]
    raise ValueError(f"unknown launcher {launcher!r} (known: {', '.join(LAUNCHERS)})")


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_arm(launcher: str, launch_sh: pathlib.Path, spec: dict[str, Any], *, timeout_s: float,
            program: tuple[str, ...] = (), log_dir: pathlib.Path | None = None, tuner: bool = False,
            env: dict[str, str] | None = None) -> Launched:
    """Run one arm once; never raises for the job's own failure (it is reported). With
    ``program`` the user's command runs instead of the built-in worker; either reports its
    step times through ``protocol``. ``log_dir``: where NCCL writes its log (on a filesystem
    every host sees), read back to check the arm's NCCL settings and, with ``tuner``, that
    its tuner plugin loaded (``nccl_log``). ``env``: more of the protocol's variables (``PROFILE_ENV``)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lagom-bench-") as tmp:
        spec_path, times = pathlib.Path(tmp) / "spec.json", pathlib.Path(tmp) / "times.jsonl"
        spec_path.write_text(json.dumps(spec))
        processes = int(spec["processes"])
        cmd = command(launcher, launch_sh, spec_path, processes, program)
        env = {**os.environ, **(env or {}), protocol.TIMES_ENV: str(times),
               protocol.EXPECT_ENV: json.dumps(spec.get("expected", {}))}
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            for old in log_dir.glob("nccl.*.log"):  # a rerun of this (arm, round) reads its own logs only
                old.unlink()
            env.update(nccl_log.log_env(log_dir, os.environ))
        if program and launcher == "local":
            procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
            address = "the program's own"
        elif launcher == "local":
            address = f"localhost:{_free_port()}"
            procs = [subprocess.Popen(cmd, env={**env, worker.COORDINATOR_ENV: address, worker.PROCESS_ENV: str(i)}
                                      if processes > 1 else env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                     for i in range(processes)]
        else:
            address = "the address JAX's cluster detection found"
            procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
        errors, failed = [], None
        deadline = time.monotonic() + timeout_s
        for i, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                return Launched(None, f"the job took over {timeout_s:.0f} s (--timeout); killed",
                                time.perf_counter() - start)
            errors.append(err)
            if proc.returncode and failed is None:
                failed = i
        seconds = time.perf_counter() - start
        if failed is not None:
            err = errors[failed]
            if "DEADLINE_EXCEEDED" in err or "Barrier timed out" in err or "failed to connect" in err.lower():
                return Launched(None, (f"process {failed} did not reach the coordinator at {address} within "
                                       f"{spec.get('join_timeout_s', 120)} s: every process must reach that address "
                                       "(a port open between the hosts; --join-timeout to wait longer)\n"
                                       + _tail(err)), seconds)
            return Launched(None, f"process {failed} exited with status {procs[failed].returncode}:\n"
                            + _tail(err), seconds)
        got = protocol.read(str(times), int(spec.get("warmup", 0)))
        if got is None:
            fix = ("decorate its train step with @lagom_jax.tune (docs/bench.md), and run more steps than --warmup"
                   if program else "process 0 wrote nothing")
            return Launched(None, f"the program reported no step times after the warm-up: {fix}\n"
                            + _tail(errors[0] if errors else ""), seconds)
        if log_dir is not None and got["platform"] != "cpu":
            got["applied"].update(nccl_log.check(spec.get("expected", {}), nccl_log.read(log_dir), tuner=tuner))
        return Launched(got, None, seconds)
