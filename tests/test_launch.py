"""Command buffers (XLA's CUDA graphs) as the cost model prices them (lagom_jax.costs.launch)."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax.cluster import hardware
from lagom_jax.costs import launch, simulate
from lagom_jax.program.graph import StepGraph, Task

H100 = hardware.get("h100-sxm-8")


def _small_kernels(n: int = 200) -> StepGraph:
    """``n`` elementwise fusions of 1 MB each (about 1 us on an H100): a step of short kernels."""
    tasks = tuple(Task(id=i, name=f"f{i}", kind="compute", bytes=1e6, opcode="fusion", deps=(i - 1,) if i else ())
                  for i in range(n))
    return StepGraph("small", tasks, num_devices=8)


def test_flag_syntax_as_xla_reads_it():
    assert launch.parse("") == ()
    assert launch.parse("FUSION,CUSTOM_CALL") == ("CUSTOM_CALL", "FUSION")
    assert launch.parse("+COLLECTIVES") == tuple(sorted(hardware.DEFAULT_COMMAND_BUFFER + ("COLLECTIVES",)))
    assert launch.parse("-CUDNN,-CUBLAS") == ("CUBLASLT", "CUSTOM_CALL", "DYNAMIC_SLICE_FUSION", "FUSION")
    with pytest.raises(ValueError, match="unknown type"):
        launch.parse("FUSIONS")
    with pytest.raises(ValueError, match="only \\+/- changes"):
        launch.parse("FUSION,+COLLECTIVES")


def test_command_buffers_remove_the_launch_gaps_of_short_kernels():
    g = _small_kernels()
    on = simulate.simulate(g, H100)
    off = simulate.simulate(g, dataclasses.replace(H100, command_buffer=()))
    assert on.compute_us == off.compute_us  # the kernels themselves are the same
    assert off.host_us == pytest.approx(200 * launch.THUNK_US)
    assert on.host_us < off.host_us / 5
    assert off.makespan_us == pytest.approx(off.host_us)
    assert off.makespan_us > 1.5 * on.makespan_us


def test_long_kernels_hide_their_launches():
    gemm = Task(id=0, name="gemm", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2, opcode="fusion",
                gemm=(1, 8192, 8192, 8192))
    g = StepGraph("gemm", (gemm,), num_devices=8)
    off = dataclasses.replace(H100, command_buffer=())
    assert simulate.makespan_us(g, off) == simulate.makespan_us(g, H100)


def test_collectives_captured_in_a_graph_lose_their_overlap():
    ag = Task(id=0, name="ag", kind="all-gather", bytes=512 << 20, groups=(tuple(range(8)),), is_async=True)
    gemm = Task(id=1, name="gemm", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2, opcode="fusion",
                gemm=(1, 8192, 8192, 8192))
    g = StepGraph("gemm+ag", (ag, gemm), num_devices=8)
    base = simulate.simulate(g, H100)
    captured = simulate.simulate(g, dataclasses.replace(H100, command_buffer=launch.parse("+COLLECTIVES")))
    spans = {iv.task_id: iv for iv in captured.intervals}
    assert spans[1].start >= spans[0].end  # the GEMM waits for the captured all-gather
    assert captured.makespan_us > 1.3 * base.makespan_us
