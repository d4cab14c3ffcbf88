"""Many processes, one Plan: two jax.distributed processes on localhost tune the same step."""

import json
import pathlib
import socket
import subprocess
import sys

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_reach_one_plan(tmp_path):
    port = _free_port()
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(i), str(port), str(outs[i])],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    r0, r1 = (json.loads(o.read_text()) for o in outs)
    assert r0["plan"] is not None and r0["plan"] == r1["plan"]
    assert r0["loss"] == r1["loss"]
    # Process 0 searched; process 1 read process 0's Plan from the key-value store.
    assert r0["searches"] > 0 and r1["searches"] == 0
