"""NCCL's own log, read to tell whether an arm's NCCL settings and tuner plugin applied.

Each run of a bench arm starts with ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING``
and ``NCCL_DEBUG_FILE`` pointing into the run's own folder (``log_env``), the same for every
arm, so the logging costs every arm alike. A user who sets ``NCCL_DEBUG_FILE`` keeps it, and
the check then says the log was not read. What NCCL writes there (NVIDIA/nccl, 2.19-2.30):

- ``NCCL version 2.23.4+cuda12.6``: the library that ran;
- ``NCCL_CTA_POLICY set by environment to 2`` (``ncclGetEnv``'s INFO under ENV): a variable
  NCCL read; a variable of the arm's that NCCL did not log is reported not applied;
- ``TUNER/Plugin: Using <name> (v<N>)`` and ``Successfully loaded external tuner plugin
  <path>`` (``src/plugin/tuner.cc``, ``src/plugin/tuner/tuner_v*.cc``): the plugin loaded;
  ``External tuner plugin ... is unsupported``: it did not;
- lagom's plugin's own line through NCCL's logger: ``lagom-tuner: K of M rules apply to
  nranks=R nnodes=N`` per communicator, and its warnings (a config it could not read);
- the algorithm and protocol NCCL ran per call: ``Best tuning, algorithm, RING, protocol,
  SIMPLE`` (2.24 on) or ``<bytes> Bytes -> Algo 1 proto 2 time ...`` (rank 0, before).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections import Counter

__all__ = ["NcclLog", "check", "log_env", "read"]

# NCCL's enum order (src/include/nccl_common.h): NCCL_ALGO_* and NCCL_PROTO_*.
_ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
_PROTOS = ("LL", "LL128", "SIMPLE")
_VERSION = re.compile(r"NCCL version (\S+)")
_ENV = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (\S+)")
_USING = re.compile(r"TUNER/Plugin: Using (\S+) \((v\d+)\)")
_LOADED = re.compile(r"Successfully loaded external tuner plugin (\S+)")
_UNSUPPORTED = re.compile(r"External tuner plugin (\S+) is unsupported")
_RULES = re.compile(r"lagom-tuner: (\d+) of (\d+) rules apply to nranks=(\d+) nnodes=(\d+)")
_LAGOM_WARN = re.compile(r"(lagom-tuner: (?!\d+ of \d+ rules).*)")
_BEST = re.compile(r"Best tuning, algorithm, (\w+), protocol, (\w+)")
_OLD_BEST = re.compile(r"\d+ Bytes -> Algo (\d+) proto (\d+)")
FILE_PATTERN = "nccl.%h.%p.log"


def log_env(folder: pathlib.Path, environ: dict[str, str]) -> dict[str, str]:
    """The variables that make NCCL log what the check reads into ``folder`` (none that the
    user set already)."""
    out = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
           "NCCL_DEBUG_FILE": str(folder / FILE_PATTERN)}
    return {k: v for k, v in out.items() if k not in environ}


@dataclasses.dataclass(frozen=True)
class NcclLog:
    """What the logs of one run's processes say."""

    files: int
    versions: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # variables NCCL read, as it read them
    plugin: str = ""  # "name (vN)" of the tuner plugin NCCL loaded
    plugin_errors: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()  # lagom-tuner's "K of M rules apply to ..." per communicator shape
    picks: tuple[tuple[str, int], ...] = ()  # "ALGO/PROTO" -> calls

    def describe_picks(self) -> str:
        return ", ".join(f"{p} x{n}" for p, n in self.picks) or "no per-call line (NCCL_DEBUG_SUBSYS without TUNING)"


def parse(texts: list[str]) -> NcclLog:
    versions, env, errors, rules = set(), {}, [], set()
    plugin, picks = "", Counter()
    for text in texts:
        for line in text.splitlines():
            if m := _VERSION.search(line):
                versions.add(m.group(1))
            elif m := _ENV.search(line):
                env[m.group(1)] = m.group(2)
            elif m := _USING.search(line):
                plugin = f"{m.group(1)} ({m.group(2)})"
            elif m := _LOADED.search(line):
                plugin = plugin or m.group(1)
            elif m := _UNSUPPORTED.search(line):
                errors.append(f"external tuner plugin {m.group(1)} is unsupported by this NCCL")
            elif m := _RULES.search(line):
                rules.add(f"{m.group(1)} of {m.group(2)} rules apply to {m.group(3)} ranks on {m.group(4)} node(s)")
            elif m := _BEST.search(line):
                picks[f"{m.group(1).upper()}/{m.group(2).upper()}"] += 1
            elif m := _OLD_BEST.search(line):
                a, p = int(m.group(1)), int(m.group(2))
                picks[f"{_ALGOS[a] if a < len(_ALGOS) else a}/{_PROTOS[p] if p < len(_PROTOS) else p}"] += 1
            elif m := _LAGOM_WARN.search(line):
                errors.append(m.group(1).strip())
    return NcclLog(len(texts), tuple(sorted(versions)), tuple(sorted(env.items())), plugin,
                   tuple(dict.fromkeys(errors)), tuple(sorted(rules)), tuple(picks.most_common()))


def read(folder: pathlib.Path) -> NcclLog:
    """The logs NCCL wrote into ``folder`` (``files`` 0: none, as on a CPU job)."""
    texts = []
    for f in sorted(pathlib.Path(folder).glob("nccl.*.log")):
        try:
            texts.append(f.read_text(errors="replace"))
        except OSError:
            continue
    return parse(texts)


def check(expected: dict[str, str], log: NcclLog, *, tuner: bool, environ: dict[str, str] | None = None
          ) -> dict[str, str]:
    """Per NCCL variable of the arm (and ``NCCL tuner plugin`` when the arm runs one): what
    NCCL's log says of it. Empty when NCCL wrote no log here: a CPU job, or NCCL_DEBUG_FILE
    set by the user (then one entry says so)."""
    environ = os.environ if environ is None else environ
    ours = [k for k in expected if k.startswith("NCCL_")]
    if not log.files:
        if "NCCL_DEBUG_FILE" in environ and (ours or tuner):
            return {"NCCL's log": f"not read: NCCL_DEBUG_FILE is yours ({environ['NCCL_DEBUG_FILE']})"}
        return {}
    seen = dict(log.env)
    out = {}
    for name in ours:
        if seen.get(name) == expected[name]:
            out[name] = f"read by NCCL {', '.join(log.versions) or ''} (its log)".replace("  ", " ")
        elif name in seen:
            out[name] = f"not applied: NCCL read {name}={seen[name]}, not {expected[name]}"
        else:
            out[name] = f"not applied: NCCL's log does not show {name} read"
    if tuner:
        if log.plugin and not log.plugin_errors:
            said = "; ".join(log.rules) or "its rules line not logged"
            out["NCCL tuner plugin"] = f"loaded {log.plugin}: {said}; NCCL ran {log.describe_picks()}"
        else:
            why = "; ".join(log.plugin_errors) or "NCCL's log shows no tuner plugin loaded"
            out["NCCL tuner plugin"] = f"not applied: {why}"
    return out
