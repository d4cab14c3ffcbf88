"""One process of one bench arm: ``python -m lagom_jax.bench.worker SPEC``.

Started under an arm's ``launch.sh`` (its XLA_FLAGS and NCCL environment), once per process
of the job. It joins ``jax.distributed`` when the job has several processes: with the
coordinator the local launcher gives it (``LAGOM_BENCH_COORDINATOR``, ``LAGOM_BENCH_PROCESS``),
else by JAX's own cluster detection (SLURM's ``srun``, Open MPI's ``mpirun``). On CPU devices
(this machine, CI) each process has ``devices_per_process`` of them and the collectives run
on gloo. It builds the built-in model's step on every device of the job, runs ``warmup``
steps, then times ``steps`` steps one by one (each waited for), and process 0 reports them
through ``protocol`` (the platform, what of the arm applied, the step times).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any

COORDINATOR_ENV = "LAGOM_BENCH_COORDINATOR"
PROCESS_ENV = "LAGOM_BENCH_PROCESS"


def _join(spec: dict[str, Any]) -> None:
    import jax

    processes = int(spec["processes"])
    if spec.get("platform", "cpu") == "cpu":
        jax.config.update("jax_num_cpu_devices", int(spec["devices_per_process"]))
        if processes > 1:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if processes <= 1:
        return
    timeout = int(spec.get("join_timeout_s", 120))
    address = os.environ.get(COORDINATOR_ENV)
    if address:  # started by the local launcher: process i drives its own devices_per_process GPUs
        pid, per = int(os.environ[PROCESS_ENV]), int(spec["devices_per_process"])
        local = None if spec.get("platform", "cpu") == "cpu" else list(range(pid * per, (pid + 1) * per))
        jax.distributed.initialize(coordinator_address=address, num_processes=processes, process_id=pid,
                                   local_device_ids=local, initialization_timeout=timeout)
    else:  # srun / mpirun: JAX detects the cluster
        jax.distributed.initialize(initialization_timeout=timeout)


def _profile(built: Any, state: Any, batch: Any, folder: pathlib.Path) -> None:
    """``protocol.PROFILE_STEPS`` steps under ``jax.profiler.trace`` (each process in a folder of
    its own), and the module they ran (``step.hlo``, from process 0), for ``calibrate``."""
    import jax

    from lagom_jax.bench import protocol

    with jax.profiler.trace(str(folder / f"process{jax.process_index()}")):
        for _ in range(protocol.PROFILE_STEPS):
            state, metrics = built.train_step(state, batch)
            jax.block_until_ready((state, metrics))
    if jax.process_index() == 0:
        (folder / "step.hlo").write_text(built.train_step.lower(state, batch).compile().as_text())


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    import lagom_jax  # noqa: F401 - before JAX starts (no CUDA plugin traceback on a CPU host)

    _join(spec)
    import jax

    from lagom_jax import models
    from lagom_jax.bench import protocol

    src = spec["model"]
    built = models.build(src["model"], src["config"], src["recipe"], src["mesh"], batch_size=src["batch_size"],
                         seq_len=src["seq_len"], dtype=src["dtype"], remat=src["remat"], scan=src["scan"],
                         attention=src["attention"], devices=jax.devices())
    state, batch = built.init(jax.random.key(0))  # placed on the job's global mesh
    times = []
    for _ in range(int(spec["warmup"]) + int(spec["steps"])):  # the bench leaves the warm-up out
        start = time.perf_counter()
        state, metrics = built.train_step(state, batch)
        jax.block_until_ready((state, metrics))
        times.append((time.perf_counter() - start) * 1e3)
    if spec.get("profile_dir"):  # after the timed steps: the trace never slows them
        _profile(built, state, batch, pathlib.Path(spec["profile_dir"]))
    protocol.write(os.environ[protocol.TIMES_ENV], protocol.head(jax.devices()[0].platform),
                   *({"ms": t} for t in times))
    if jax.process_count() > 1:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
