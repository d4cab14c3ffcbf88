"""Test setup: 8 fake CPU devices, set once before JAX's backend starts."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# LLVM's code generation at -O0 (XLA's DebugOptions.xla_backend_optimization_level; default 2):
# the tests' CPU executables and deviceless GPU kernels compile about 2-3x faster. It sets only
# how hard LLVM optimises the machine code of each kernel: the HLO XLA optimises, schedules and
# hands to the cost model, and what a test checks, are the same at every level.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# Caches (plans, advise answers, the flags the installed XLA accepted) in a folder of this
# run, not the user's ~/.cache/lagom-jax: each run checks against XLA afresh.
if "LAGOM_JAX_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["LAGOM_JAX_CACHE"] = tempfile.mkdtemp(prefix="lagom-jax-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LAGOM_JAX_CACHE"], True)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# Property tests draw the same examples on every run (CI must not fail at random); a law
# that breaks shows up on the next run too, and its example goes into the test. The smoke
# subset runs without hypothesis (.ci/smoke_matrix's CUDA 13 entry installs no test extra).
try:
    from hypothesis import settings
except ImportError:
    settings = None
if settings is not None:
    settings.register_profile("deterministic", derandomize=True, database=None)
    settings.load_profile("deterministic")


# The README runs the suite with pytest-xdist's ``-n auto --dist loadfile``: a file's tests share
# their module's compiled steps, so each file runs in one worker. Workers: one per CPU, but no
# more than one per 4 GiB of memory (a worker holds a few deviceless GPU compiles at a time).
@pytest.hookimpl(optionalhook=True)  # a hook only where pytest-xdist is installed (not the smoke subset's envs)
def pytest_xdist_auto_num_workers(config):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        return cpus
    return max(1, min(cpus, int(gib // 4)))


# Random order, to show no test leans on another's leftovers: LAGOM_TEST_SHUFFLE=SEED runs
# the collected tests shuffled by that seed (the header names it; rerun with it to repeat).
def pytest_report_header(config):
    seed = os.environ.get("LAGOM_TEST_SHUFFLE")
    return f"lagom-jax: tests shuffled with LAGOM_TEST_SHUFFLE={seed}" if seed else None


# Files with the most tests marked ``slow`` (each compiles for 20 s or more here) first: with
# ``--dist loadfile`` a worker takes the next file when it is free, so the long files start early
# and the short ones fill in at the end, instead of one worker running a long file alone last.
def pytest_collection_modifyitems(session, config, items):
    seed = os.environ.get("LAGOM_TEST_SHUFFLE")
    if seed:
        import random

        random.Random(seed).shuffle(items)
    import collections

    slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])  # stable: each file keeps its order
