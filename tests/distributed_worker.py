"""One process of the two-process test in test_distributed.py (run as a script).

It joins ``jax.distributed`` on localhost with 4 CPU devices (gloo collectives), tunes a
DP x TP step over the global 2x4 mesh, and writes its Plan and how many searches it ran.
"""

import json
import os
import sys

process_id, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=process_id)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import lagom_jax  # noqa: E402
from lagom_jax import api

searches = []
_run = api.search_lib.run_strategy
api.search_lib.run_strategy = lambda *a, **k: (searches.append(a[0]), _run(*a, **k))[1]

mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def step(w, x):
    def loss(w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    value, grad = jax.value_and_grad(loss)(w)
    return w - 0.1 * grad, value


w = jax.make_array_from_callback((32, 64), NamedSharding(mesh, P(None, "model")),
                                 lambda idx: np.full((32, 64), 0.01, np.float32)[idx])
x = jax.make_array_from_callback((16, 32), NamedSharding(mesh, P("data", None)),
                                 lambda idx: (np.arange(512, dtype=np.float32).reshape(16, 32) / 512)[idx])
tuned = lagom_jax.tune(jax.jit(step), hardware="h100-sxm-8", use_cache=False)
_, loss = tuned(w, x)
plan = tuned.plan(w, x)
with open(out, "w") as f:
    json.dump({"plan": plan.to_json() if plan else None, "searches": len(searches),
               "loss": float(loss)}, f)
jax.distributed.shutdown()
