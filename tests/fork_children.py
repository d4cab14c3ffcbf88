"""Children for tests/test_fork_server.py: ``_child(spec_path)`` does what the spec says."""

import json
import os
import sys
import time


def _child(spec_path: str) -> None:
    with open(spec_path) as fh:
        spec = json.load(fh)
    if spec["do"] == "abort":
        print("F1122 03:20:49.438142 18858 test.cc:1] the compiler gave up", file=sys.stderr, flush=True)
        os.abort()
    if spec["do"] == "sleep":
        time.sleep(60)
    with open(spec_path + ".out", "w") as fh:
        json.dump({"pid": os.getpid(), "xla_flags": os.environ.get("XLA_FLAGS"),
                   "jax_imported": "jax" in sys.modules, "cwd": os.getcwd()}, fh)
