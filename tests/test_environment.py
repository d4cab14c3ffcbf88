"""The user's JAX environment: the supported range, the CUDA plugins, one line per problem."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

from lagom_jax.program import environment as env_lib
from lagom_jax.program.environment import Environment, Plugin

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(jaxlib="0.10.2", driver=None, **plugins):
    """An Environment with jax == jaxlib and the given ``jax-cudaN-plugin``/``-pjrt`` versions
    (keyword ``cuda12=("0.10.2", "0.10.2")`` for (plugin, pjrt))."""
    versions = {"jax": jaxlib, "jaxlib": jaxlib}
    for name, (plugin, pjrt) in plugins.items():
        major = int(name.removeprefix("cuda"))
        versions[f"jax-cuda{major}-plugin"], versions[f"jax-cuda{major}-pjrt"] = plugin, pjrt
    return Environment.from_versions(versions, driver)


@pytest.mark.parametrize("text, parsed", [("0.9.0", (0, 9, 0)), ("0.9.0.1", (0, 9, 0, 1)),
                                          ("0.10.2rc1", (0, 10, 2)), ("0.11.2.dev20260101", (0, 11, 2))])
def test_parse_version(text, parsed):
    assert env_lib.parse_version(text) == parsed


def test_parse_version_names_the_bad_input():
    with pytest.raises(ValueError, match="'abc'"):
        env_lib.parse_version("abc")


def test_a_sound_environment_has_no_problems():
    assert env_lib.problems(_env(cuda12=("0.10.2", "0.10.2"))) == ()
    assert env_lib.problems(_env(cuda13=("0.10.2", "0.10.2")), deviceless=True) == ()
    assert env_lib.problems(_env("0.9.0.1", cuda12=("0.9.0.1", "0.9.0.1")), deviceless=True) == ()
    # A GPU host whose driver serves CUDA 13 runs either major.
    assert env_lib.problems(_env(cuda12=("0.10.2", "0.10.2"), driver=13000)) == ()
    assert env_lib.bad_environment(_env(cuda13=("0.10.2", "0.10.2"), driver=13000)) is None


@pytest.mark.parametrize("plugins, expected", [
    ({"cuda12": ("0.9.2", "0.9.2")},
     "jax-cuda12-plugin 0.9.2 does not match jaxlib 0.10.2: "
     "pip install 'jax-cuda12-plugin==0.10.2' 'jax-cuda12-pjrt==0.10.2'"),
    ({"cuda12": ("0.10.2", "0.10.1")},
     "jax-cuda12-plugin 0.10.2 does not match jax-cuda12-pjrt 0.10.1: "
     "pip install 'jax-cuda12-plugin==0.10.2' 'jax-cuda12-pjrt==0.10.2'"),
    ({"cuda13": ("0.10.2", None)},
     "jax-cuda13-plugin 0.10.2 is installed without jax-cuda13-pjrt: "
     "pip install 'jax-cuda13-plugin==0.10.2' 'jax-cuda13-pjrt==0.10.2'"),
    ({"cuda13": (None, "0.10.2")},
     "jax-cuda13-pjrt 0.10.2 is installed without jax-cuda13-plugin: "
     "pip install 'jax-cuda13-plugin==0.10.2' 'jax-cuda13-pjrt==0.10.2'"),
])
def test_a_plugin_of_another_version_gets_one_line_naming_the_install(plugins, expected):
    assert env_lib.problems(_env(**plugins)) == (expected,)


def test_plugins_of_two_cuda_majors_name_the_one_to_remove():
    (line,) = env_lib.problems(_env(cuda12=("0.10.2", "0.10.2"), cuda13=("0.10.2", "0.10.2")))
    assert "two majors" in line and line.endswith("pip uninstall -y jax-cuda13-plugin jax-cuda13-pjrt")
    (line,) = env_lib.problems(_env(cuda12=("0.10.2", "0.10.2"), cuda13=("0.10.2", "0.10.2"), driver=13020))
    assert line.endswith("pip uninstall -y jax-cuda12-plugin jax-cuda12-pjrt")


def test_a_plugin_newer_than_the_driver_names_the_plugin_to_install():
    (line,) = env_lib.problems(_env(cuda13=("0.10.2", "0.10.2"), driver=12040))
    assert line == ("jax-cuda13-plugin needs a CUDA 13 driver, this one serves CUDA 12.4: pip uninstall -y "
                    "jax-cuda13-plugin jax-cuda13-pjrt && pip install 'jax[cuda12]==0.10.2'")


def test_no_plugin_is_a_problem_only_when_a_deviceless_compile_is_asked_for():
    assert env_lib.problems(_env()) == ()
    assert env_lib.bad_environment(_env()) is None
    (line,) = env_lib.problems(_env("0.9.2"), deviceless=True)
    assert "pip install 'lagom-jax[deviceless]'" in line and "jax-cuda12-plugin==0.9.2" in line


def test_bad_environment_joins_the_lines():
    bad = env_lib.bad_environment(_env(cuda12=("0.9.2", "0.9.2"), cuda13=(None, "0.10.2")))
    assert bad is not None and bad.count("pip install") == 2 and "\n" not in bad


@pytest.mark.parametrize("version, warns", [
    (env_lib.OLDEST_JAX, False), (env_lib.NEWEST_TESTED_JAX, False), ("0.9.0.1", False),
    ("0.8.3", True), ("0.4.38", True), ("99.0.0", True),
])
def test_range_warning_outside_the_tested_range(version, warns):
    message = env_lib.range_warning(version)
    assert (message is not None) is warns
    if warns:
        assert env_lib.OLDEST_JAX in message and version in message and "pip install" in message


@pytest.mark.parametrize("python, newest", [((3, 11), "0.10.2"), ((3, 12), "0.12.0.1"), ((3, 13), "0.12.0.1")])
def test_the_warning_names_a_jax_this_python_can_install(python, newest):
    # pip serves jax 0.11 and newer only to Python 3.12+: a 3.11 user is pointed at 0.10.2.
    assert env_lib.newest_tested_for_python(python) == newest


def test_the_tested_versions_lie_in_the_declared_range():
    oldest = env_lib.parse_version(env_lib.OLDEST_JAX)
    assert env_lib.OLDEST_JAX in env_lib.TESTED_JAX and env_lib.NEWEST_TESTED_JAX in env_lib.TESTED_JAX
    assert all(env_lib.range_warning(v) is None for v in env_lib.TESTED_JAX)
    assert min(map(env_lib.parse_version, env_lib.TESTED_JAX)) == oldest
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"jax>={env_lib.OLDEST_JAX}"' in text and f'"jaxlib>={env_lib.OLDEST_JAX}"' in text
    assert '"jax==' not in text and '"jaxlib==' not in text


def test_installed_reads_this_process():
    import jax
    import jaxlib

    found = env_lib.installed()
    assert found.jax == jax.__version__ and found.jaxlib == jaxlib.__version__
    assert env_lib.describe(found).startswith(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}")


def test_installed_from_a_metadata_reader():
    versions = {"jax": "0.9.2", "jaxlib": "0.9.2", "jax-cuda13-plugin": "0.9.2", "jax-cuda13-pjrt": "0.9.2"}
    found = env_lib.installed(versions.get, lambda: 13000)
    assert found == Environment("0.9.2", "0.9.2", (Plugin(13, "0.9.2", "0.9.2"),), 13000)
    assert env_lib.describe(found) == ("jax 0.9.2, jaxlib 0.9.2, jax-cuda13-plugin 0.9.2 (pjrt 0.9.2), "
                                       "CUDA driver 13.0")


def test_import_warns_outside_the_range_and_once():
    """A subprocess whose JAX claims another version: importing lagom_jax warns once, naming
    the range, and nothing breaks."""
    code = ("import warnings, jax\n"
            "jax.__version__ = '0.8.1'\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import lagom_jax\n"
            "print([str(w.message) for w in caught if 'lagom-jax is tested with' in str(w.message)])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    (message,) = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert "0.8.1" in message and env_lib.OLDEST_JAX in message


def test_the_decorator_runs_untuned_in_a_bad_environment(monkeypatch):
    import jax
    import jax.numpy as jnp

    import lagom_jax
    from lagom_jax import api

    bad = "jax-cuda12-plugin 0.9.2 does not match jaxlib 0.10.2: pip install 'jax-cuda12-plugin==0.10.2'"
    monkeypatch.setattr(env_lib, "bad_environment", lambda env=None: bad)
    step = jax.jit(lambda x: jnp.tanh(x) * 2)
    tuned = lagom_jax.tune(step, hardware="h100-sxm-8", use_cache=False)
    x = jnp.arange(8.0)
    with pytest.warns(api.TuningWarning, match="does not match jaxlib.*running the step untuned"):
        out = tuned(x)
    assert tuned.plan(x) is None
    assert (out == step(x)).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.TuningWarning)
        tuned(x)  # decided once per signature


def _pip_dry_run(spec: str) -> list[dict]:
    """What ``pip install spec`` would install into this environment (pip's report)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                           spec],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0 and ("Could not find a version" in proc.stderr or "network" in proc.stderr.lower()):
        pytest.skip(f"pip cannot resolve here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["install"]


@pytest.mark.slow
def test_installing_beside_the_users_jax_changes_no_jax_package():
    """``pip install lagom-jax`` (and its deviceless extra, where this environment's plugin
    is CUDA 12's) into an environment holding a supported JAX installs no JAX package."""
    found = env_lib.installed()
    specs = [str(ROOT)]
    if any(p.cuda_major == 12 and p.plugin for p in found.plugins):
        specs.append(f"{ROOT}[deviceless]")
    for spec in specs:
        names = {item["metadata"]["name"].lower() for item in _pip_dry_run(spec)}
        assert not {n for n in names if n == "jax" or n.startswith(("jaxlib", "jax-cuda"))}, (spec, names)
