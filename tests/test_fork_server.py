"""Compile children forked from a server with JAX imported: isolated, timed, with the caller's
environment of the moment, and a plain process where no server runs."""

import os
import time

import pytest

from lagom_jax.program import fork_server, gpu_compile


def test_each_child_is_a_fresh_process_with_the_imports_done_and_the_environment_of_the_moment(
        monkeypatch, tmp_path):
    monkeypatch.setenv("XLA_FLAGS", "--xla_first=1")
    first = gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=60)
    monkeypatch.setenv("XLA_FLAGS", "--xla_second=1")
    monkeypatch.chdir(tmp_path)
    second = gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=60)
    assert second["cwd"] == str(tmp_path) != first["cwd"]
    assert (first["xla_flags"], second["xla_flags"]) == ("--xla_first=1", "--xla_second=1")
    assert first["pid"] != second["pid"] and os.getpid() not in (first["pid"], second["pid"])
    assert first["jax_imported"] and second["jax_imported"]  # the server's imports, before the child ran


def test_a_child_that_aborts_costs_only_itself_and_says_why():
    with pytest.raises(gpu_compile.ChildAborted, match="the compiler gave up") as err:
        gpu_compile.run_isolated("fork_children", {"do": "abort"}, timeout_s=60)
    assert err.value.status < 0  # killed by its signal
    assert gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=60)["pid"]


def test_a_child_past_its_time_is_killed():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="over 2 s"):
        gpu_compile.run_isolated("fork_children", {"do": "sleep"}, timeout_s=2)
    assert time.monotonic() - t0 < 20


def test_without_a_server_the_child_is_a_new_interpreter(monkeypatch):
    def gone(*args, **kwargs):
        raise fork_server.ServerGone("no server here")

    monkeypatch.setattr(fork_server, "run_child", gone)
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__))
    out = gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=120)
    assert out["pid"] != os.getpid()
    with pytest.raises(gpu_compile.ChildAborted, match="the compiler gave up"):
        gpu_compile.run_isolated("fork_children", {"do": "abort"}, timeout_s=120)


def test_a_server_that_died_is_started_again():
    gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=60)
    for server in fork_server._servers.values():
        server._proc.kill()
        server._proc.wait()
    deadline = time.monotonic() + 10
    while any(s.alive for s in fork_server._servers.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=60)["pid"]


def test_the_childrens_peak_memory_is_known():
    gpu_compile.run_isolated("fork_children", {"do": "echo"}, timeout_s=60)
    assert fork_server.largest_child_rss_bytes() > 50 * 2 ** 20  # a child with JAX imported
