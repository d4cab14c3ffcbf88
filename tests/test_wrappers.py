"""The decorator on the train steps users have: ``jax.jit``, ``eqx.filter_jit``, ``nnx.jit`` and a
wrapper in the style of haliax's ``named_jit``; one plan whatever the face."""

from __future__ import annotations

import json
import warnings
from unittest import mock

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import lagom_jax
from lagom_jax import api, cli
from lagom_jax.program import gpu_compile, step as step_lib

pytestmark = pytest.mark.skipif(gpu_compile.unavailable_reason() is not None,
                                reason=f"no deviceless GPU compile: {gpu_compile.unavailable_reason()}")

_OPT = optax.adamw(1e-2)


def _train_step(params, opt_state, batch):
    """A small sharded MLP train step with AdamW (tensor parallel over 'model', data over 'data')."""

    def loss(p):
        return jnp.mean((jnp.tanh(batch @ p["w1"]) @ p["w2"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = _OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def _init(mesh, model_axis="model"):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.device_put(jax.random.normal(k1, (64, 128)) * 0.1, NamedSharding(mesh, P(None, model_axis))),
              "w2": jax.device_put(jax.random.normal(k2, (128, 64)) * 0.1, NamedSharding(mesh, P(model_axis, None)))}
    batch = jax.device_put(jax.random.normal(k3, (32, 64)), NamedSharding(mesh, P("data", None)))
    # Every leaf committed to the mesh, as trainers place their state: the step's outputs come
    # back with its inputs' shardings. (optax's step count, left uncommitted on one device, comes
    # back replicated: jax.jit compiles the second step again, and so does the decorator.)
    replicated = NamedSharding(mesh, P())
    opt_state = jax.tree.map(lambda x: x if x.ndim else jax.device_put(x, replicated), _OPT.init(params))
    return params, opt_state, batch


def _run(fn, state, steps=3):
    params, opt_state, batch = state
    for _ in range(steps):
        params, opt_state, _ = fn(params, opt_state, batch)
    return params, opt_state


class _OwnSplitJit:
    """A wrapper in the style of haliax's ``named_jit``: a callable object with its own argument
    handling, whose ``lower`` lowers an inner ``jax.jit`` of its own split of the arguments."""

    def __init__(self, fn):
        self._fn = fn
        self._inner = jax.jit(lambda dynamic, static: fn(*dynamic["args"]), static_argnums=1)

    def __call__(self, *args):
        return self._inner({"args": args}, "static")

    def lower(self, *args):
        return self._inner.lower({"args": args}, "static")


WRAPPERS = {"jax.jit": jax.jit, "eqx.filter_jit": eqx.filter_jit, "nnx.jit": nnx.jit}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _choices(plan):
    return (plan.xla_flags(), sorted(plan.compiler_options().items()),
            [(c.kind, c.bytes, c.group_size, c.params) for c in plan.collectives])


def test_every_wrapper_is_tuned_from_its_cuda_lowering_with_one_plan(tmp_path, mesh):
    plans = {}
    for name, wrap in WRAPPERS.items():
        expected = _run(wrap(_train_step), _init(mesh))
        tuned = lagom_jax.tune(wrap(_train_step), hardware="h100-sxm-8", cache_dir=tmp_path / name)
        with mock.patch.object(step_lib, "lower", wraps=step_lib.lower) as lower, warnings.catch_warnings():
            warnings.simplefilter("error", api.TuningWarning)
            warnings.simplefilter("error", api.RetuneWarning)
            got = _run(tuned, _init(mesh))
            plans[name] = tuned.plan(*_init(mesh))
        assert "cuda" in [c.kwargs.get("platform") for c in lower.call_args_list], name
        assert tuned.tunes == 1, name
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        plan = plans[name]
        assert plan is not None and plan.collectives, name
        assert any("-start" in c.name for c in plan.collectives), "async pairs: XLA:GPU's module"
        assert any(d[0] == "structure search" for d in plan.decisions), "the full pipeline ran"
    first = plans["jax.jit"]
    for name, plan in plans.items():
        assert _choices(plan) == _choices(first), name
        # equinox's step also returns its marker (a constant int32): one more tiny kernel, a few us.
        assert abs(plan.makespan_us - first.makespan_us) < 5.0, name


def test_a_wrapper_that_splits_the_arguments_itself_gets_the_launch_file(tmp_path, mesh):
    wrapped = _OwnSplitJit(_train_step)
    expected = _run(wrapped, _init(mesh))
    tuned = lagom_jax.tune(wrapped, hardware="h100-sxm-8", cache_dir=tmp_path / "cache",
                           plan_dir=tmp_path / "plans")
    with pytest.warns(api.TuningWarning, match=r"own split of the step's arguments.*launch\.sh python train\.py") as w:
        got = _run(tuned, _init(mesh))
    assert len([x for x in w if x.category is api.TuningWarning]) == 1
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    plan = tuned.plan(*_init(mesh))
    assert plan is not None and tuned.tunes == 1
    (folder,) = (tmp_path / "plans").iterdir()
    launch = (folder / "launch.sh").read_text()
    assert (f'XLA_FLAGS="${{XLA_FLAGS:-}} {plan.xla_flags()}"' in launch) if plan.flags else "exec" in launch


@pytest.mark.parametrize("given", [lambda x: x * 2, type("Doubler", (), {"__call__": lambda self, x: x * 2})()],
                         ids=["function", "callable-object"])
def test_something_with_no_aot_stages_runs_as_given_with_one_warning(given):
    with pytest.warns(api.TuningWarning, match=r"no AOT stages.*jax\.jit") as w:
        tuned = lagom_jax.tune(given, hardware="h100-sxm-8")
    assert len(w) == 1
    np.testing.assert_array_equal(tuned(jnp.arange(4.0)), jnp.arange(4.0) * 2)
    assert tuned.plan(jnp.arange(4.0)) is None


def test_equivalent_shardings_are_one_signature_and_a_new_shape_says_why(tmp_path):
    mesh = jax.make_mesh((8, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    tuned = lagom_jax.tune(jax.jit(_train_step), hardware="h100-sxm-8", cache_dir=tmp_path, search="fast")
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.RetuneWarning)
        _run(tuned, _init(mesh), steps=1)
        # P(None, 'model') over a 'model' axis of size 1 is P(None): the same executable.
        _run(tuned, _init(mesh, model_axis=None), steps=1)
    assert tuned.tunes == 1
    params, opt_state, batch = _init(mesh)
    with pytest.warns(api.RetuneWarning, match=r"argument \[0\]\[2\]: float32\[32, 64\] -> float32\[16, 64\]"):
        tuned(params, opt_state, batch[:16])
    assert tuned.tunes == 2


def test_fast_search_says_what_it_left_out(tmp_path, mesh):
    with pytest.raises(ValueError, match="unknown search"):
        lagom_jax.tune(jax.jit(_train_step), search="quick")
    plan = lagom_jax.tune(jax.jit(_train_step), hardware="h100-sxm-8", cache_dir=tmp_path,
                          search="fast").plan(*_init(mesh))
    (said,) = [why for what, why in plan.decisions if what == "structure search"]
    assert "not run (search='fast')" in said and "overlap bound" in said


def test_the_decorators_plan_is_what_lagom_jax_tune_makes_of_its_module(tmp_path, mesh, capsys):
    tuned = lagom_jax.tune(eqx.filter_jit(_train_step), hardware="h100-sxm-8", cache_dir=tmp_path / "cache",
                           plan_dir=tmp_path / "plans")
    plan = tuned.plan(*_init(mesh))
    (folder,) = (tmp_path / "plans").iterdir()
    assert {"plan.json", "launch.sh", "step.hlo"} <= {p.name for p in folder.iterdir()}
    assert api.Plan.load(folder / "plan.json") == plan
    capsys.readouterr()
    assert cli.main(["tune", str(folder / "step.hlo"), "--hardware", "h100-sxm-8", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["makespan_us"] == pytest.approx(plan.makespan_us, rel=1e-9)
    assert made["xla_flags"] == plan.xla_flags()
    assert [(c["kind"], c["bytes"]) for c in made["collectives"]] == [(c.kind, c.bytes) for c in plan.collectives]
    assert [tuple(d) for d in made["decisions"]] == [d for d in plan.decisions]
