"""Matmul FLOPs of a traced program, counted from its jaxpr (for hand counts in tests)."""

import math

import jax
import jax.extend


def dot_flops(jaxpr) -> float:
    """2 x output elements x contracted size, summed over every dot_general (scans times their length)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += dot_flops(sub) * (eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1)
    return total


def step_dot_flops(model: str, config: str, batch: int = 2, seq: int = 16) -> float:
    """Matmul FLOPs of one train step of a built-in model on one device."""
    from lagom_jax import models

    built = models.build(model, config, "dp", "data=1", batch_size=batch, seq_len=seq, devices=jax.devices()[:1])
    state, batch_ = built.abstract_inputs
    return dot_flops(jax.make_jaxpr(built.train_step)(state, batch_).jaxpr)
