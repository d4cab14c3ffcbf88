"""The bench reads NCCL's own log to say whether an arm's NCCL settings and tuner plugin applied."""

from __future__ import annotations

import sys
import textwrap

from lagom_jax.bench import launch, nccl_log

# Lines as NCCL 2.2x writes them under NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING.
RANK0 = """\
gpu-a:4101:4101 [0] NCCL INFO NCCL_CTA_POLICY set by environment to 2
gpu-a:4101:4101 [0] NCCL INFO NCCL version 2.23.4+cuda12.6
gpu-a:4101:4101 [0] NCCL INFO NCCL_TUNER_PLUGIN set by environment to /plans/lagom/libnccl-tuner-lagom.so
gpu-a:4101:4101 [0] NCCL INFO TUNER/Plugin: Using lagom (v4)
gpu-a:4101:4101 [0] NCCL INFO Successfully loaded external tuner plugin /plans/lagom/libnccl-tuner-lagom.so
gpu-a:4101:4101 [0] NCCL INFO lagom-tuner: 3 of 5 rules apply to nranks=16 nnodes=2
gpu-a:4101:4180 [0] NCCL INFO Best tuning, algorithm, RING, protocol, SIMPLE
gpu-a:4101:4180 [0] NCCL INFO Best tuning, algorithm, RING, protocol, SIMPLE
gpu-a:4101:4180 [0] NCCL INFO Best tuning, algorithm, NVLS_TREE, protocol, SIMPLE
"""
OLDER = "gpu-b:77:77 [0] NCCL INFO 1048576 Bytes -> Algo 0 proto 1 time 35.100000\n"


def test_the_log_says_what_nccl_read_loaded_and_ran():
    log = nccl_log.parse([RANK0, OLDER])
    assert log.versions == ("2.23.4+cuda12.6",)
    assert dict(log.env)["NCCL_CTA_POLICY"] == "2"
    assert log.plugin == "lagom (v4)" and not log.plugin_errors
    assert log.rules == ("3 of 5 rules apply to 16 ranks on 2 node(s)",)
    assert log.picks == (("RING/SIMPLE", 2), ("NVLS_TREE/SIMPLE", 1), ("TREE/LL128", 1))


def test_a_setting_nccl_did_not_read_is_not_applied():
    log = nccl_log.parse([RANK0])
    got = nccl_log.check({"NCCL_CTA_POLICY": "2", "NCCL_NTHREADS": "256", "xla_gpu_foo": "1"}, log, tuner=True)
    assert got["NCCL_CTA_POLICY"].startswith("read by NCCL 2.23.4")
    assert got["NCCL_NTHREADS"] == "not applied: NCCL's log does not show NCCL_NTHREADS read"
    assert got["NCCL tuner plugin"].startswith("loaded lagom (v4): 3 of 5 rules apply")
    assert "RING/SIMPLE x2" in got["NCCL tuner plugin"]
    assert "xla_gpu_foo" not in got  # XLA's flags are the protocol's to check


def test_a_plugin_that_did_not_load_is_not_applied():
    broken = ("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
              "h:1:1 [0] NCCL WARN lagom-tuner: LAGOM_TUNER_CONFIG is not set; NCCL keeps its own choices\n")
    got = nccl_log.check({}, nccl_log.parse([broken]), tuner=True)
    assert got["NCCL tuner plugin"] == ("not applied: lagom-tuner: LAGOM_TUNER_CONFIG is not set; "
                                        "NCCL keeps its own choices")
    none = nccl_log.check({}, nccl_log.parse(["h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"]), tuner=True)
    assert none["NCCL tuner plugin"] == "not applied: NCCL's log shows no tuner plugin loaded"


def test_no_log_no_verdict_unless_the_user_took_the_log_file():
    empty = nccl_log.parse([])
    assert nccl_log.check({"NCCL_CTA_POLICY": "2"}, empty, tuner=True, environ={}) == {}
    said = nccl_log.check({"NCCL_CTA_POLICY": "2"}, empty, tuner=False, environ={"NCCL_DEBUG_FILE": "/x/%h.log"})
    assert said == {"NCCL's log": "not read: NCCL_DEBUG_FILE is yours (/x/%h.log)"}
    assert nccl_log.log_env(nccl_log.pathlib.Path("/r"), {"NCCL_DEBUG": "WARN"}) == {
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING", "NCCL_DEBUG_FILE": "/r/nccl.%h.%p.log"}


def test_a_run_on_gpus_is_checked_against_the_log_its_processes_wrote(tmp_path):
    """The launcher points NCCL_DEBUG_FILE into the run's folder and reads it back: here a
    program stands in for a GPU job, writing what NCCL would and reporting its steps."""
    program = tmp_path / "fake_gpu_job.py"
    program.write_text(textwrap.dedent(f"""\
        import json, os, socket
        path = os.environ["NCCL_DEBUG_FILE"].replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
        with open(path, "w") as f:
            f.write({RANK0!r})
        with open(os.environ["LAGOM_BENCH_TIMES"], "a") as f:
            f.write(json.dumps({{"platform": "gpu", "applied": {{}}}}) + "\\n")
            f.writelines(json.dumps({{"ms": ms}}) + "\\n" for ms in (5.0, 4.0, 4.1))
        """))
    sh = tmp_path / "launch.sh"
    sh.write_text("#!/usr/bin/env bash\nexport NCCL_CTA_POLICY=2\nexec \"$@\"\n")
    sh.chmod(0o755)
    spec = {"processes": 1, "warmup": 1, "expected": {"NCCL_CTA_POLICY": "2", "NCCL_NTHREADS": "256"}}
    got = launch.run_arm("local", sh, spec, timeout_s=60, program=(sys.executable, str(program)),
                         log_dir=tmp_path / "logs", tuner=True)
    assert got.error is None, got.error
    assert got.result["times_ms"] == [4.0, 4.1]
    applied = got.result["applied"]
    assert applied["NCCL_CTA_POLICY"].startswith("read by NCCL")
    assert applied["NCCL_NTHREADS"].startswith("not applied")
    assert applied["NCCL tuner plugin"].startswith("loaded lagom (v4)")
    assert len(list((tmp_path / "logs").glob("nccl.*.log"))) == 1
