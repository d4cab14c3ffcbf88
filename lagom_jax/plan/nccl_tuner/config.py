"""The lagom tuner config: what the NCCL tuner plugin reads, as typed values and as text.

NCCL's tuner plugin interface is the only per-collective knob stock NCCL offers: for every
collective call it lets a plugin steer the algorithm and protocol (through the cost table),
the channel count and, from interface v6 (NCCL 2.30+), the chunk size
(NVIDIA/nccl ``src/include/plugin/tuner/tuner_v6.h``). The plugin (``lagom_tuner.c``) reads
its rules from a text file; this module renders and parses that file so that Python and C
agree on every rule and every error.

Format, version 1 (one rule per line, whitespace-separated)::

    # lagom-tuner-config v1
    # kind       min_bytes max_bytes nranks nnodes algorithm protocol nchannels chunk_bytes
    all-reduce   0         65536     8      1      ring      LL       4         0
    all-gather   1048576   *         *      *      tree      Simple   0         524288

- Line 1 must be the header exactly; a file without it is rejected as a whole.
- ``#`` starts a comment anywhere; blank lines are ignored.
- ``kind``: all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, reduce, or ``*``.
  Collective-permute is point-to-point, which NCCL never asks the tuner about.
- Bytes follow NCCL's nBytes convention (graph.py); the range is ``[min_bytes, max_bytes)``,
  ``*`` as max_bytes means unbounded.
- ``nranks``/``nnodes``: the communicator's size and node count, or ``*`` for any.
- ``algorithm``/``protocol``: NCCL's names (ring, tree, ... / LL, LL128, Simple), both ``*`` to
  keep NCCL's choice.
- ``nchannels`` 0 and ``chunk_bytes`` 0 keep NCCL's choice.
- The first rule that matches a call wins. Malformed lines are reported with their line
  number and ignored; the rest of the file still applies.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Protocol

from lagom_jax.cluster.params import MAX_CHANNELS, TUNER_KINDS

CONFIG_ENV = "LAGOM_TUNER_CONFIG"
CONFIG_HEADER = "# lagom-tuner-config v1"
FIELDS = (
    "kind",
    "min_bytes",
    "max_bytes",
    "nranks",
    "nnodes",
    "algorithm",
    "protocol",
    "nchannels",
    "chunk_bytes",
)
# Position = NCCL_ALGO_* / NCCL_PROTO_* index (src/include/plugin/nccl_tuner.h); lagom_jax.cluster.params'
# "ring"/"tree" and "LL"/"LL128"/"Simple" are the same spellings.
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
_U64_MAX = 2**64 - 1
# Tokens longer than this are shortened in messages, exactly as the C parser does.
_SHOWN_CHARS = 40
_SPACE = re.compile(r"[ \t\r\v\f]+")
_DIGITS = re.compile(r"[0-9]+")


class ParamsLike(Protocol):
    """What ``TunerRule.from_params`` reads: the tunable fields of ``params.CollectiveParams``."""

    algorithm: str
    protocol: str
    nchannels: int
    chunk_bytes: int


@dataclasses.dataclass(frozen=True)
class TunerRule:
    """One line of the config: which calls it matches and what it sets for them.

    ``None`` means "any" for the keys and "keep NCCL's choice" for algorithm/protocol;
    0 means "keep NCCL's choice" for nchannels and chunk_bytes. Not ordered: a config's
    order is its meaning (first match wins), so sorting rules would change what they do.
    """

    kind: str | None
    min_bytes: int = 0
    max_bytes: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    algorithm: str | None = None
    protocol: str | None = None
    nchannels: int = 0
    chunk_bytes: int = 0

    def __post_init__(self) -> None:
        if self.kind == "collective-permute":
            raise ValueError(
                "kind 'collective-permute' is point-to-point, which NCCL never asks the tuner "
                "about; leave it out of the tuner config"
            )
        if self.kind is not None and self.kind not in TUNER_KINDS:
            raise ValueError(f"unknown kind {self.kind!r} (known: {', '.join(TUNER_KINDS)}, None)")
        if not 0 <= self.min_bytes <= _U64_MAX:
            raise ValueError(f"min_bytes must be in [0, 2**64), got {self.min_bytes}")
        if self.max_bytes is not None and not self.min_bytes < self.max_bytes <= _U64_MAX:
            raise ValueError(
                f"max_bytes must be above min_bytes {self.min_bytes} (the range is "
                f"[min_bytes, max_bytes)) and below 2**64, got {self.max_bytes}; use None for "
                "no upper bound"
            )
        for name in ("nranks", "nnodes"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= _U64_MAX:
                raise ValueError(f"{name} must be positive or None (any), got {value}")
        if self.algorithm is not None and self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"unknown algorithm {self.algorithm!r} (known: {', '.join(ALGORITHMS)}, None)"
            )
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {self.protocol!r} (known: {', '.join(PROTOCOLS)}, None)"
            )
        if (self.algorithm is None) != (self.protocol is None):
            raise ValueError(
                "algorithm and protocol must both be set or both be None (NCCL accepts a "
                f"plugin's choice of both or neither), got {self.algorithm!r} and {self.protocol!r}"
            )
        if not 0 <= self.nchannels <= MAX_CHANNELS:
            raise ValueError(
                f"nchannels must be in [0, {MAX_CHANNELS}] (0 keeps NCCL's choice), "
                f"got {self.nchannels}"
            )
        if not 0 <= self.chunk_bytes <= _U64_MAX:
            raise ValueError(
                f"chunk_bytes must be >= 0 (0 keeps NCCL's choice), got {self.chunk_bytes}"
            )

    @classmethod
    def from_params(
        cls,
        kind: str | None,
        params: ParamsLike,
        *,
        min_bytes: int = 0,
        max_bytes: int | None = None,
        nranks: int | None = None,
        nnodes: int | None = None,
    ) -> TunerRule:
        """The rule that applies ``params`` to matching calls.

        nthreads is not carried: NCCL lets no plugin set threads per call, only the global
        NCCL_NTHREADS / NCCL_LL128_NTHREADS (NVIDIA/nccl ``src/graph/tuning.cc``; the
        plugin's ``getCollInfo`` in ``tuner_v6.h`` has no thread output). NVLS and NVLSTree
        run the communicator's NVLS CTAs and chunks whatever a call asks, so their rules keep
        NCCL's.
        """
        nvls = params.algorithm in ("nvls", "nvls_tree")
        return cls(
            kind=kind,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            nranks=nranks,
            nnodes=nnodes,
            algorithm=params.algorithm,
            protocol=params.protocol,
            nchannels=0 if nvls else params.nchannels,
            chunk_bytes=0 if nvls else params.chunk_bytes,
        )

    def matches(self, kind: str, nbytes: int, nranks: int, nnodes: int) -> bool:
        """Whether the plugin applies this rule to such a call (before first-match-wins)."""
        return (
            (self.kind is None or self.kind == kind)
            and nbytes >= self.min_bytes
            and (self.max_bytes is None or nbytes < self.max_bytes)
            and (self.nranks is None or self.nranks == nranks)
            and (self.nnodes is None or self.nnodes == nnodes)
        )

    def render(self) -> str:
        """This rule as one config line."""
        values = (
            _star(self.kind),
            str(self.min_bytes),
            _star(self.max_bytes),
            _star(self.nranks),
            _star(self.nnodes),
            _star(self.algorithm),
            _star(self.protocol),
            str(self.nchannels),
            str(self.chunk_bytes),
        )
        return " ".join(values)


@dataclasses.dataclass(frozen=True, order=True)
class ConfigError:
    """A config line the plugin ignores, and why."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _star(value: object) -> str:
    return "*" if value is None else str(value)


def match_rule(
    rules: Sequence[TunerRule], kind: str, nbytes: int, nranks: int, nnodes: int
) -> TunerRule | None:
    """The rule the plugin applies to one call: the first that matches, or None."""
    return next((r for r in rules if r.matches(kind, nbytes, nranks, nnodes)), None)


def render_config(rules: Iterable[TunerRule]) -> str:
    """The config file text for ``rules``, in order (the first match wins)."""
    lines = [CONFIG_HEADER, "# " + " ".join(FIELDS)]
    lines.extend(rule.render() for rule in rules)
    return "\n".join(lines) + "\n"


def parse_config(text: str) -> tuple[list[TunerRule], list[ConfigError]]:
    """Rules and errors of a config text, exactly as the C plugin reads it.

    Like the plugin, a wrong or missing header rejects the whole file, and a malformed line
    is reported with its 1-based number and skipped. The messages are the plugin's.
    """
    if text == "":
        return [], [ConfigError(1, f"empty file: expected '{CONFIG_HEADER}' on line 1")]
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    header = lines[0].rstrip(" \t\r\n\v\f")
    if header != CONFIG_HEADER:
        return [], [ConfigError(1, f"expected '{CONFIG_HEADER}' on line 1, got '{_shown(header)}'")]
    rules: list[TunerRule] = []
    errors: list[ConfigError] = []
    for number, line in enumerate(lines[1:], start=2):
        fields = [f for f in _SPACE.split(line.split("#", 1)[0]) if f]
        if not fields:
            continue
        result = _parse_rule(fields)
        if isinstance(result, TunerRule):
            rules.append(result)
        else:
            errors.append(ConfigError(number, result))
    return rules, errors


def _shown(token: str) -> str:
    return token if len(token) <= _SHOWN_CHARS else token[:_SHOWN_CHARS] + "..."


def _u64(token: str) -> int | None:
    if _DIGITS.fullmatch(token) is None:
        return None
    value = int(token)
    return value if value <= _U64_MAX else None


def _parse_rule(f: list[str]) -> TunerRule | str:
    """A rule, or the C parser's message for the first thing wrong with the line."""
    if len(f) != len(FIELDS):
        return f"expected {len(FIELDS)} fields ({' '.join(FIELDS)}), got {len(f)}"
    if f[0] != "*" and f[0] not in TUNER_KINDS:
        return f"unknown kind '{_shown(f[0])}' (known: {', '.join(TUNER_KINDS)}, *)"
    min_bytes = _u64(f[1])
    if min_bytes is None:
        return f"min_bytes: expected a non-negative integer, got '{_shown(f[1])}'"
    max_bytes = None if f[2] == "*" else _u64(f[2])
    if f[2] != "*" and max_bytes is None:
        return f"max_bytes: expected a non-negative integer or *, got '{_shown(f[2])}'"
    comm: list[int | None] = []
    for name, token in (("nranks", f[3]), ("nnodes", f[4])):
        value = None if token == "*" else _u64(token)
        if token != "*" and not value:
            return f"{name}: expected a positive integer or *, got '{_shown(token)}'"
        comm.append(value)
    if f[5] != "*" and f[5] not in ALGORITHMS:
        return f"unknown algorithm '{_shown(f[5])}' (known: {', '.join(ALGORITHMS)}, *)"
    if f[6] != "*" and f[6] not in PROTOCOLS:
        return f"unknown protocol '{_shown(f[6])}' (known: {', '.join(PROTOCOLS)}, *)"
    nchannels = _u64(f[7])
    if nchannels is None or nchannels > MAX_CHANNELS:
        return (
            f"nchannels: expected an integer in [0, {MAX_CHANNELS}] (0 keeps NCCL's choice), "
            f"got '{_shown(f[7])}'"
        )
    chunk_bytes = _u64(f[8])
    if chunk_bytes is None:
        return (
            "chunk_bytes: expected a non-negative integer (0 keeps NCCL's choice), "
            f"got '{_shown(f[8])}'"
        )
    if max_bytes is not None and min_bytes >= max_bytes:
        return f"empty byte range: min_bytes {min_bytes} >= max_bytes {max_bytes}"
    if (f[5] == "*") != (f[6] == "*"):
        return (
            "algorithm and protocol must both be * or both be set, "
            f"got '{_shown(f[5])}' and '{_shown(f[6])}'"
        )
    return TunerRule(
        kind=None if f[0] == "*" else f[0],
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        nranks=comm[0],
        nnodes=comm[1],
        algorithm=None if f[5] == "*" else f[5],
        protocol=None if f[6] == "*" else f[6],
        nchannels=nchannels,
        chunk_bytes=chunk_bytes,
    )
