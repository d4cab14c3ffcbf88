"""`lagom-jax calibrate` on real profiler traces of XLA:CPU (8 fake devices).

The accuracy claims are checked on a trace recorded once (tests/fixtures/calibrate_cpu_trace,
SOURCE.md says how): timings of real kernels depend on the machine's speed and load, so a
fresh trace is only checked for what does not."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from lagom_jax import cli
from lagom_jax.cluster import hardware
from lagom_jax.costs import calibrate


def _program():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))

    def step(x, w):
        h = jnp.tanh(x @ w)
        return jax.lax.psum(h @ w.T, "d") * 0.5 + 1.0

    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("d"), P()), out_specs=P()))
    return f, (jnp.ones((8 * 256, 512), jnp.float32), jnp.full((512, 512), 0.01, jnp.float32))


RECORDED = pathlib.Path(__file__).parent / "fixtures" / "calibrate_cpu_trace"


@pytest.fixture(scope="module")
def traced():
    """The recorded trace directory and its module's HLO text."""
    return RECORDED, RECORDED / "module.hlo"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A trace of the same program recorded now, on this machine."""
    f, args = _program()
    text = f.lower(*args).compile().as_text()
    d = tmp_path_factory.mktemp("trace")
    f(*args).block_until_ready()
    with jax.profiler.trace(str(d)):
        for _ in range(3):
            f(*args).block_until_ready()
    hlo_path = d / "module.hlo"
    hlo_path.write_text(text)
    return d, hlo_path


def test_a_real_trace_becomes_a_profile_that_predicts_it_better(traced):
    d, hlo_path = traced
    result = calibrate.calibrate(d, hlo_path.read_text(), hardware.get("h100-sxm-8"))
    assert result.matched >= 4 and result.steps >= 3
    names = {c.name for c in result.classes}
    assert {"gemm", "memory"} <= names and any(n.startswith("all-reduce") for n in names)
    # One factor per resource cannot fit every op of a class on a CPU (tanh is compute-bound
    # there, an add is not), but over all ops the fitted profile predicts far better.
    before = sum(c.error_before * c.ops for c in result.classes)
    after = sum(c.error_after * c.ops for c in result.classes)
    assert after < 0.8 * before, result.table()
    gemm = next(c for c in result.classes if c.name == "gemm")
    assert gemm.error_after < gemm.error_before and gemm.low <= gemm.factor <= gemm.high
    # A CPU is far slower than an H100: every resource came down.
    assert result.profile.achieved_tflops < hardware.get("h100-sxm-8").achieved_tflops / 10


def test_cli_writes_a_profile_that_hardware_accepts(traced, tmp_path, capsys):
    d, hlo_path = traced
    out = tmp_path / "me.json"
    assert cli.main(["calibrate", str(d), "--hlo", str(hlo_path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "error before" in text and f"--hardware {out}" in text
    hw = hardware.resolve(str(out))
    assert hw.name == "h100-sxm-8-calibrated"


def test_a_fresh_trace_calibrates(fresh):
    d, hlo_path = fresh
    result = calibrate.calibrate(d, hlo_path.read_text(), hardware.get("h100-sxm-8"))
    assert result.matched >= 4 and result.steps >= 3
    assert result.profile.achieved_tflops > 0 and result.profile.achieved_hbm_gbps > 0


def test_a_trace_of_another_module_is_refused(traced, tmp_path, capsys):
    d, _ = traced
    other = jax.jit(lambda a: jnp.sin(a) @ a.T + jnp.cos(a).sum()).lower(jnp.ones((64, 64))).compile().as_text()
    with pytest.raises(ValueError, match="does not match module"):
        calibrate.calibrate(d, other, hardware.get("h100-sxm-8"))
    assert cli.main(["calibrate", str(tmp_path / "nothing"), "--hlo", __file__]) == 2
    assert "error" in capsys.readouterr().err
