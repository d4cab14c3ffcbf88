"""Compile the tuner plugin and name it in the environment NCCL reads.

The plugin is one C file with its own copy of NCCL's interface declarations, so a C compiler
is all a user needs; NCCL itself is only needed where the plugin is loaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .config import CONFIG_ENV

PLUGIN_FILE = "libnccl-tuner-lagom.so"
SOURCE = Path(__file__).with_name("lagom_tuner.c")
_COMPILERS = ("cc", "gcc", "clang")


class TunerBuildError(RuntimeError):
    """The plugin could not be compiled; the message says what to install or fix."""


def default_out_dir() -> Path:
    """Where ``build_tuner`` puts the plugin unless told otherwise: the user's cache dir."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "lagom-jax"


def find_compiler() -> str:
    """$CC if set, else the first of cc, gcc, clang on PATH."""
    wanted = os.environ.get("CC")
    candidates = (wanted,) if wanted else _COMPILERS
    for name in candidates:
        path = shutil.which(name)
        if path is not None:
            return path
    if wanted:
        raise TunerBuildError(f"CC={wanted!r} is not an executable on PATH; fix CC or unset it")
    raise TunerBuildError(
        f"no C compiler found on PATH (looked for {', '.join(_COMPILERS)}); install one "
        "(e.g. `apt-get install gcc`) or set CC to its path"
    )


def build_tuner(out_dir: str | os.PathLike[str] | None = None) -> Path:
    """Compile the plugin into ``out_dir`` (default: ``default_out_dir()``); return the .so.

    The new library is written beside the target and renamed over it, so a process that
    already loaded an older copy keeps a valid mapping.
    """
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    compiler = find_compiler()
    target = out / PLUGIN_FILE
    partial = out / f".{PLUGIN_FILE}.{os.getpid()}.tmp"
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise TunerBuildError(
            f"`{' '.join(command)}` failed with exit status {result.returncode}:\n{result.stderr}"
        )
    os.replace(partial, target)
    return target


def tuner_env(
    so_path: str | os.PathLike[str], config_path: str | os.PathLike[str]
) -> dict[str, str]:
    """The environment that makes every NCCL communicator of a process use the plugin.

    Paths are made absolute because NCCL and the plugin resolve them in the launched
    process, whose working directory may differ. Nothing here touches ``os.environ``.
    """
    return {
        "NCCL_TUNER_PLUGIN": os.path.abspath(so_path),
        CONFIG_ENV: os.path.abspath(config_path),
    }
