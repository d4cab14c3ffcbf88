"""The user's fabric from the user's own nccl-tests logs.

Most clusters already have nccl-tests output (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``alltoall_perf``, ``sendrecv_perf``; NVIDIA/nccl-tests). ``read_dir``
reads every such log under a folder, at any node count, and ``fit`` fits a hardware preset's
collective terms to the times measured:

* across nodes: the network's saturated bus bandwidth (``net_busbw_gbps``), one channel's
  rate (``net_channel_gbps``) and the latency the network device adds to every hop
  (``net_latency_us``);
* inside one node: NVLink's (or PCIe's) bus bandwidth and one channel's rate, and NVLS's
  bandwidth where the box has it. The user's own single-node sweep then replaces the
  measured table the preset anchors to (that table was measured on another machine).

The fit minimises the mean squared log of predicted over measured time of NCCL's own choice
(``cost.default_time_us``) by coordinate descent, each term within 8x of the preset's; a
scope whose fit does not lower that error keeps the preset's terms. ``FabricFit.table``
gives the error per scope, kind and size band before and after; the profile is what
``--hardware`` takes.

Reading a log: the rank lines (``#  Rank  0 Group  0 Pid 1234 on host-a device  0 ...``) give
the ranks and, by their distinct host names, the nodes; without them the ranks come from the
ratio of bus to algorithm bandwidth (nccl-tests' ``2(n-1)/n`` or ``(n-1)/n``) and the nodes
from the preset's GPUs per node. The collective is named by the file (``all_reduce`` ...), by
the log's "Collective test starting" line, or by that ratio. Sizes are nccl-tests' own: the
gathered bytes of an all-gather, the reduced input of a reduce-scatter, as the cost model
counts them. The out-of-place time is used.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import statistics
from collections.abc import Iterable

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import cost

__all__ = ["FabricFit", "Sample", "fit", "parse", "read_dir", "errors"]

# nccl-tests binary stem -> the cost model's collective kind.
_TESTS = (("all_reduce", "all-reduce"), ("allreduce", "all-reduce"), ("all_gather", "all-gather"),
          ("allgather", "all-gather"), ("reduce_scatter", "reduce-scatter"), ("reducescatter", "reduce-scatter"),
          ("alltoall", "all-to-all"), ("all_to_all", "all-to-all"), ("sendrecv", "collective-permute"))
_RANK = re.compile(r"#\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)")
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
BANDS = ((1 << 20, "< 1 MiB"), (64 << 20, "1-64 MiB"), (math.inf, ">= 64 MiB"))
NET_FIELDS = ("net_busbw_gbps", "net_channel_gbps", "net_latency_us")
INTRA_FIELDS = ("intra_busbw_gbps", "intra_channel_gbps", "nvls_busbw_gbps")
# Sizes below this are timer resolution and launch jitter more than the fabric.
MIN_BYTES = 1024
MAX_FACTOR = 8.0
MIN_SIZES = 3


@dataclasses.dataclass(frozen=True)
class Sample:
    """One size of one nccl-tests run: the time of one collective, out of place."""

    kind: str
    nbytes: int
    ranks: int
    nodes: int
    time_us: float
    source: str = ""

    @property
    def busbw_gbps(self) -> float:
        return self.nbytes * cost.bus_factor(self.kind, "ring", self.ranks) / (self.time_us * 1e3)


def _kind_of_name(name: str) -> str | None:
    low = name.lower()
    return next((kind for stem, kind in _TESTS if stem in low), None)


def _ranks_from_ratio(ratio: float, kind: str) -> int | None:
    """n from busbw/algbw: 2(n-1)/n for all-reduce, (n-1)/n for the others (1 for sendrecv)."""
    if kind == "collective-permute":
        return None
    f = ratio / 2 if kind == "all-reduce" else ratio
    return round(1 / (1 - f)) if 0 < f < 1 else None


def parse(text: str, name: str = "", *, gpus_per_node: int = 8) -> list[Sample]:
    """The samples of one nccl-tests log (``name``: its file name, which may say the
    collective). Raises ValueError for a log it cannot place (no collective named and no
    ratio to infer it from); returns [] for text with no nccl-tests rows."""
    hosts: dict[int, str] = {}
    kind = _kind_of_name(pathlib.Path(name).name)
    rows: list[tuple[int, str, float, float, float]] = []  # size, redop, time, algbw, busbw
    for line in text.splitlines():
        if m := _RANK.search(line):
            hosts[int(m.group(1))] = m.group(2)
            continue
        if m := _STARTING.search(line):
            kind = kind or _kind_of_name(m.group(1))
            continue
        tok = line.split()
        if len(tok) < 6 or line.lstrip().startswith("#") or not (tok[0].isdigit() and tok[1].isdigit()):
            continue
        i = 3
        redop = ""
        while i < len(tok) and "." not in tok[i]:  # redop and root before the first time
            redop = redop or (tok[i] if not tok[i].lstrip("-").isdigit() else "")
            i += 1
        try:
            time_us, algbw, busbw = (float(t) for t in tok[i:i + 3])
        except ValueError:
            continue
        if time_us > 0:
            rows.append((int(tok[0]), redop, time_us, algbw, busbw))
    if not rows:
        return []
    big = max(rows, key=lambda r: r[0])
    ratio = big[4] / big[3] if big[3] > 0 else 0.0
    if kind is None:
        if abs(ratio - 1) < 0.02:
            kind = "collective-permute"
        elif ratio > 1.05:
            kind = "all-reduce"
        elif big[1] in ("sum", "prod", "max", "min", "avg"):
            kind = "reduce-scatter"
        else:
            raise ValueError(f"{name or 'log'}: cannot tell all-gather from all-to-all by the numbers; name the "
                             "file after the test (all_gather_perf.log, alltoall_perf.log)")
    ranks = len(hosts) or _ranks_from_ratio(ratio, kind)
    if not ranks or ranks < 2:
        raise ValueError(f"{name or 'log'}: no rank lines and no bus/algorithm bandwidth ratio to count the ranks "
                         "from; keep nccl-tests' header (its '#  Rank ... on HOST device' lines) in the log")
    nodes = len(set(hosts.values())) if hosts else max(1, ranks // gpus_per_node)
    return [Sample(kind, size, ranks, nodes, t, name) for size, _, t, _, _ in rows]


def read_dir(path: str | pathlib.Path, *, gpus_per_node: int = 8) -> tuple[list[Sample], list[str]]:
    """(samples, files skipped with why) of every nccl-tests log under ``path``."""
    root = pathlib.Path(path)
    if not root.exists():
        raise ValueError(f"nccl-tests folder {str(root)!r} does not exist")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    samples, skipped = [], []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError as e:
            skipped.append(f"{f}: {e.strerror}")
            continue
        try:
            got = parse(text, f.name, gpus_per_node=gpus_per_node)
        except ValueError as e:
            skipped.append(str(e))
            continue
        if got:
            samples.extend(got)
        else:
            skipped.append(f"{f.name}: no nccl-tests rows")
    if not samples:
        raise ValueError(f"no nccl-tests output under {str(root)!r} (looked at {len(files)} file(s): "
                         f"{'; '.join(skipped[:3])}{' ...' if len(skipped) > 3 else ''})")
    return samples, skipped


def _band(nbytes: int) -> str:
    return next(name for limit, name in BANDS if nbytes < limit)


def predicted_us(s: Sample, hw: HardwareProfile) -> float:
    return cost.default_time_us(s.kind, s.nbytes, s.ranks, s.nodes, hw.with_nodes(max(s.nodes, 1)))


def _ratios(samples: Iterable[Sample], hw: HardwareProfile) -> list[float]:
    """predicted / measured per sample, ``hw`` sized once per node count (the cost model's
    caches are keyed by the cluster)."""
    clusters: dict[int, HardwareProfile] = {}
    out = []
    for s in samples:
        sized = clusters.get(s.nodes) or clusters.setdefault(s.nodes, hw.with_nodes(max(s.nodes, 1)))
        out.append(cost.default_time_us(s.kind, s.nbytes, s.ranks, s.nodes, sized) / s.time_us)
    return out


def errors(samples: Iterable[Sample], hw: HardwareProfile) -> list[float]:
    """predicted / measured - 1 per sample."""
    return [r - 1 for r in _ratios(samples, hw)]


def _loss(samples: list[Sample], hw: HardwareProfile) -> float:
    return statistics.fmean(math.log(r) ** 2 for r in _ratios(samples, hw))


def _descend(samples: list[Sample], hw: HardwareProfile, fields: tuple[str, ...]) -> HardwareProfile:
    """Coordinate descent on ``fields`` of ``hw`` (each within MAX_FACTOR of its start)."""
    start = {f: getattr(hw, f) for f in fields}
    best = _loss(samples, hw)
    for _ in range(2):
        for f in fields:
            for step in (1.5, 1.15, 1.04):
                for direction in (step, 1 / step):
                    while True:
                        v = getattr(hw, f)
                        if f == "net_latency_us":  # may be 0: step from 1 us
                            v = v * direction if v >= 1 else (1.0 if direction > 1 else 0.0)
                            ok = v <= max(start[f], 1.0) * MAX_FACTOR
                        else:
                            v *= direction
                            ok = start[f] / MAX_FACTOR <= v <= start[f] * MAX_FACTOR
                        if not ok:
                            break
                        trial = dataclasses.replace(hw, **{f: v})
                        loss = _loss(samples, trial)
                        if loss >= best * (1 - 1e-3):
                            break
                        best, hw = loss, trial
    return hw


def _identifiable(samples: list[Sample], fields: tuple[str, ...]) -> tuple[str, ...]:
    """The fields the samples can tell apart: one channel's rate and the latency show only in
    how the time grows with the size, so they need MIN_SIZES sizes; else the saturated
    bandwidths alone."""
    if len({s.nbytes for s in samples}) >= MIN_SIZES:
        return fields
    return tuple(f for f in fields if f.endswith("busbw_gbps"))


@dataclasses.dataclass(frozen=True)
class BandError:
    scope: str  # "one node" or "across nodes"
    kind: str
    band: str
    samples: int
    before: float  # median |predicted / measured - 1|
    after: float


@dataclasses.dataclass(frozen=True)
class FabricFit:
    """The fitted profile, what changed, and the error it removes per scope, kind and band."""

    profile: HardwareProfile
    changed: tuple[tuple[str, float, float], ...]  # (field, preset's, fitted)
    bands: tuple[BandError, ...]
    kept: tuple[str, ...]  # scopes whose fit did not help: the preset's terms kept, with why

    def table(self) -> str:
        rows = ["| scope | collective | size | samples | error before | error after |",
                "|---|---|---|---:|---:|---:|"]
        rows += [f"| {b.scope} | {b.kind} | {b.band} | {b.samples} | {b.before:.1%} | {b.after:.1%} |"
                 for b in self.bands]
        return "\n".join(rows)


def _scope(s: Sample) -> str:
    return "across nodes" if s.nodes > 1 else "one node"


def fit(samples: list[Sample], hw: HardwareProfile) -> FabricFit:
    """Fit ``hw``'s collective terms to ``samples`` (see the module docstring)."""
    usable = [s for s in samples if s.nbytes >= MIN_BYTES and s.ranks >= 2]
    if not usable:
        raise ValueError(f"no sample to fit: every one of the {len(samples)} is under {MIN_BYTES} bytes "
                         "or of one rank")
    per_node = {s.ranks // max(s.nodes, 1) for s in usable if s.nodes > 1}
    if per_node - {hw.gpus_per_node}:
        raise ValueError(f"the logs ran {', '.join(map(str, sorted(per_node)))} ranks a node, {hw.name} has "
                         f"{hw.gpus_per_node} GPUs a node: start from a preset of the machine that ran them")
    profile, kept = hw, []
    intra = [s for s in usable if s.nodes == 1]
    if intra:
        fields = _identifiable(intra, tuple(f for f in INTRA_FIELDS if getattr(hw, f) > 0))
        own = _descend(intra, dataclasses.replace(hw, collective_table=""), fields)
        if _loss(intra, own) < _loss(intra, hw):
            profile = dataclasses.replace(profile, collective_table="", **{f: getattr(own, f) for f in fields})
        else:
            kept.append("one node: the preset's measured table predicts these logs better than a fit of its terms")
    net = [s for s in usable if s.nodes > 1]
    if net:
        fields = _identifiable(net, NET_FIELDS)
        own = _descend(net, profile, fields)
        if _loss(net, own) < _loss(net, profile):
            profile = dataclasses.replace(profile, network_assumption="", **{f: getattr(own, f) for f in fields})
        else:
            kept.append("across nodes: no change of the network's terms predicts these logs better")
    profile = dataclasses.replace(profile, name=f"{hw.name}-nccl-tests")
    changed = tuple((f, getattr(hw, f), getattr(profile, f)) for f in INTRA_FIELDS + NET_FIELDS
                    if getattr(hw, f) != getattr(profile, f))
    groups: dict[tuple[str, str, str], list[Sample]] = {}
    for s in usable:
        groups.setdefault((_scope(s), s.kind, _band(s.nbytes)), []).append(s)
    order = {name: i for i, (_, name) in enumerate(BANDS)}
    bands = tuple(
        BandError(scope, kind, band, len(ss), statistics.median(abs(e) for e in errors(ss, hw)),
                  statistics.median(abs(e) for e in errors(ss, profile)))
        for (scope, kind, band), ss in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])))
    return FabricFit(profile, changed, bands, tuple(kept))
