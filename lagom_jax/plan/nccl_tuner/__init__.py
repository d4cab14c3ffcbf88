"""The lagom-jax NCCL tuner plugin: its config format and the helper that builds it.

NCCL's tuner plugin is how a Plan's per-collective choices (algorithm, protocol, channels,
chunk size) reach stock NCCL; see README.md in this directory for turning it on.
"""

from __future__ import annotations

from .build import PLUGIN_FILE as PLUGIN_FILE
from .build import TunerBuildError as TunerBuildError
from .build import build_tuner as build_tuner
from .build import default_out_dir as default_out_dir
from .build import tuner_env as tuner_env
from .config import ALGORITHMS as ALGORITHMS
from .config import CONFIG_ENV as CONFIG_ENV
from .config import CONFIG_HEADER as CONFIG_HEADER
from .config import PROTOCOLS as PROTOCOLS
from .config import TUNER_KINDS as TUNER_KINDS
from .config import ConfigError as ConfigError
from .config import TunerRule as TunerRule
from .config import match_rule as match_rule
from .config import parse_config as parse_config
from .config import render_config as render_config

__all__ = [
    "ALGORITHMS",
    "CONFIG_ENV",
    "CONFIG_HEADER",
    "PLUGIN_FILE",
    "PROTOCOLS",
    "TUNER_KINDS",
    "ConfigError",
    "TunerBuildError",
    "TunerRule",
    "build_tuner",
    "default_out_dir",
    "match_rule",
    "parse_config",
    "render_config",
    "tuner_env",
]
