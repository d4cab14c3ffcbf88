"""The JAX a user already has, and whether lagom-jax can work with it.

lagom-jax decorates someone else's training step, so it lives in their environment: it
declares a range of JAX releases (``jax>=OLDEST_JAX``, no upper pin) and never brings a
second CUDA plugin. This module reads what is installed from the packages' metadata,
without starting JAX's backends or loading a plugin (a plugin built for another jaxlib
can abort the process when it loads), and says in one line per problem what to install:

- a JAX outside the tested range (a warning at import, :func:`range_warning`);
- a CUDA plugin whose version differs from jaxlib's, or whose PJRT half is missing or of
  another version;
- plugins of two CUDA majors side by side, or a plugin newer than the CUDA driver serves;
- no plugin at all when a deviceless compile is asked for.

The versions the test matrix passed on are in ``TESTED_JAX`` and docs/install.md.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections.abc import Callable, Mapping

from lagom_jax.program import jax_internals

__all__ = ["CUDA_MAJORS", "Environment", "JaxVersionWarning", "NEWEST_TESTED_JAX", "OLDEST_JAX", "Plugin", "TESTED_JAX",
           "bad_environment", "describe", "driver_cuda_version", "installed", "newest_tested_for_python", "parse_version",
           "problems", "range_warning"]

# Every release the smoke subset and jax_internals' checks passed on (docs/install.md).
TESTED_JAX = jax_internals.CHECKED_JAX
# The oldest of them is pyproject's lower bound; a minor release after the newest one is
# outside the tested range.
OLDEST_JAX = TESTED_JAX[0]
NEWEST_TESTED_JAX = TESTED_JAX[-1]
# The CUDA majors JAX ships plugins for; the extras of the same names bring one.
CUDA_MAJORS = (12, 13)



class JaxVersionWarning(UserWarning):
    """The installed JAX is outside the range lagom-jax was tested with."""


Versions = Mapping[str, "str | None"]


def parse_version(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``"0.9.0.1"`` -> (0, 9, 0, 1), ``"0.10.2rc1"``
    -> (0, 10, 2). Raises ValueError for a string with no leading number."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"cannot read version {version!r}")
    return tuple(int(p) for p in match.group(0).split("."))


def _same_release(a: str, b: str) -> bool:
    pa, pb = parse_version(a), parse_version(b)
    n = max(len(pa), len(pb))
    return pa + (0,) * (n - len(pa)) == pb + (0,) * (n - len(pb))


@dataclasses.dataclass(frozen=True)
class Plugin:
    """JAX's CUDA plugin of one CUDA major: its two packages and their versions (None: absent)."""

    cuda_major: int
    plugin: str | None
    pjrt: str | None

    @property
    def name(self) -> str:
        return f"jax-cuda{self.cuda_major}-plugin"

    @property
    def pjrt_name(self) -> str:
        return f"jax-cuda{self.cuda_major}-pjrt"


@dataclasses.dataclass(frozen=True)
class Environment:
    """What is installed: jax, jaxlib, the CUDA plugins, and the CUDA driver's version
    (``cuDriverGetVersion``: 12040 for 12.4; None where there is no driver)."""

    jax: str | None
    jaxlib: str | None
    plugins: tuple[Plugin, ...] = ()
    driver_cuda: int | None = None

    @classmethod
    def from_versions(cls, versions: Versions, driver_cuda: int | None = None) -> Environment:
        """From package name -> version (None or absent: not installed)."""
        plugins = tuple(Plugin(m, versions.get(f"jax-cuda{m}-plugin"), versions.get(f"jax-cuda{m}-pjrt"))
                        for m in CUDA_MAJORS)
        return cls(versions.get("jax"), versions.get("jaxlib"),
                   tuple(p for p in plugins if p.plugin or p.pjrt), driver_cuda)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver_cuda_version() -> int | None:
    """The CUDA version the installed driver serves (12040 for 12.4), None without one.

    ``cuDriverGetVersion`` needs no ``cuInit``: it touches no GPU.
    """
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return version.value or None


def installed(version_of: Callable[[str], str | None] = _distribution_version,
              driver: Callable[[], int | None] = driver_cuda_version) -> Environment:
    """The environment of this process, read from the installed packages' metadata."""
    names = ["jax", "jaxlib"] + [f"jax-cuda{m}-{part}" for m in CUDA_MAJORS for part in ("plugin", "pjrt")]
    return Environment.from_versions({n: version_of(n) for n in names}, driver())


def range_warning(jax_version: str) -> str | None:
    """One line when ``jax_version`` is outside the tested range, else None."""
    try:
        v = parse_version(jax_version)
    except ValueError:
        return None
    if v >= parse_version(OLDEST_JAX) and v[:2] <= parse_version(NEWEST_TESTED_JAX)[:2]:
        return None
    newest = ".".join(map(str, parse_version(NEWEST_TESTED_JAX)[:2]))
    return (f"lagom-jax is tested with jax {OLDEST_JAX} to {newest}.x, not {jax_version}: JAX internals it "
            f"uses may have moved (tuning then falls back with a TuningWarning) and XLA may emit collectives "
            f"its HLO reader does not price (docs/install.md). A tested JAX: pip install "
            f"'jax[cuda12]=={newest_tested_for_python()}'")


# JAX's wheels from 0.11 on need Python 3.12 (pip serves 0.10.2 at most to Python 3.11).
_PYTHON_FOR_JAX = (((0, 11), (3, 12)),)


def newest_tested_for_python(python: tuple[int, int] | None = None) -> str:
    """The newest release in TESTED_JAX that pip installs on ``python`` (default: this one)."""
    import sys

    python = python or sys.version_info[:2]

    def installable(version: str) -> bool:
        return all(python >= needs for since, needs in _PYTHON_FOR_JAX if parse_version(version)[:2] >= since)

    return max((v for v in TESTED_JAX if installable(v)), key=parse_version, default=OLDEST_JAX)


def _plugin_problems(env: Environment) -> list[str]:
    out = []
    jaxlib = env.jaxlib or "?"
    for p in env.plugins:
        want = f"pip install '{p.name}=={jaxlib}' '{p.pjrt_name}=={jaxlib}'"
        if p.plugin is None:
            out.append(f"{p.pjrt_name} {p.pjrt} is installed without {p.name}: {want}")
        elif p.pjrt is None:
            out.append(f"{p.name} {p.plugin} is installed without {p.pjrt_name}: {want}")
        elif env.jaxlib and not _same_release(p.plugin, env.jaxlib):
            out.append(f"{p.name} {p.plugin} does not match jaxlib {env.jaxlib}: {want}")
        elif not _same_release(p.plugin, p.pjrt):
            out.append(f"{p.name} {p.plugin} does not match {p.pjrt_name} {p.pjrt}: {want}")
    both = [p for p in env.plugins if p.plugin]
    if len(both) > 1:
        keep = _driver_major(env) or 12
        drop = " ".join(f"{p.name} {p.pjrt_name}" for p in both if p.cuda_major != keep)
        out.append(f"CUDA plugins of two majors are installed ({', '.join(f'{p.name} {p.plugin}' for p in both)}) "
                   f"and both claim the 'cuda' platform: pip uninstall -y {drop}")
    driver = _driver_major(env)
    if driver is not None:
        for p in both:
            if p.cuda_major > driver:
                out.append(f"{p.name} needs a CUDA {p.cuda_major} driver, this one serves CUDA "
                           f"{env.driver_cuda // 1000}.{env.driver_cuda % 1000 // 10}: pip uninstall -y "
                           f"{p.name} {p.pjrt_name} && pip install 'jax[cuda{driver}]=={env.jax or jaxlib}'")
    return out


def _driver_major(env: Environment) -> int | None:
    return None if env.driver_cuda is None else env.driver_cuda // 1000


def problems(env: Environment, *, deviceless: bool = False) -> tuple[str, ...]:
    """One line per problem of ``env``, each naming what to install; empty when it is sound.

    ``deviceless``: a compile for abstract GPUs is asked for, so a CUDA plugin must exist.
    """
    out = _plugin_problems(env)
    if deviceless and not any(p.plugin for p in env.plugins):
        version = env.jaxlib or "<jaxlib version>"
        out.append(f"no JAX CUDA plugin is installed, so nothing here can compile for GPUs: "
                   f"pip install 'lagom-jax[deviceless]' (jax-cuda12-plugin=={version}; "
                   f"'lagom-jax[cuda13]' for CUDA 13; needs Python >= 3.11 on Linux)")
    return tuple(out)


def bad_environment(env: Environment | None = None) -> str | None:
    """The problems that make tuning unsafe in this process (a plugin JAX should not load),
    joined into one message; None when there are none. A missing plugin is not one of them:
    the decorator then tunes XLA:CPU's module and says so."""
    found = problems(installed() if env is None else env)
    return "; ".join(found) if found else None


def describe(env: Environment) -> str:
    """One line: the JAX packages installed, e.g. ``jax 0.10.2, jaxlib 0.10.2,
    jax-cuda12-plugin 0.10.2 (pjrt 0.10.2)``."""
    parts = [f"jax {env.jax or '-'}", f"jaxlib {env.jaxlib or '-'}"]
    parts += [f"{p.name} {p.plugin or '-'} (pjrt {p.pjrt or '-'})" for p in env.plugins]
    if env.driver_cuda:
        parts.append(f"CUDA driver {env.driver_cuda // 1000}.{env.driver_cuda % 1000 // 10}")
    return ", ".join(parts)
