"""``NcclEnv``: the process-wide NCCL settings a cluster runs with, as the cost model sees them.

NCCL reads ``NCCL_ALGO``, ``NCCL_PROTO`` and ``NCCL_NVLS_ENABLE`` once per process and
restricts every collective's choice of (algorithm, protocol) to what they allow
(NVIDIA/nccl ``src/graph/tuning.cc``: ``parseList`` fills the enabled table that
``ncclTopoGetAlgoTime`` scans; ``src/transport/nvls.cc``: ``NCCL_NVLS_ENABLE=0`` removes
NVLS). They cannot be set per collective: XLA has no per-op NCCL field (only the tuner
plugin reaches one call), so they are what-ifs the cost model prices
(``predict_train_step_ms(nccl_env=...)``) and settings a user carries into a run, not
choices the search makes per collective.

Only what the model distinguishes is accepted: the algorithms ``ring``, ``tree``,
``nvls``, ``nvlstree`` (the model's ``nvls_tree``) and the protocols ``LL``, ``LL128``,
``Simple`` (NCCL's spelling is accepted in any case); ``NCCL_NVLS_ENABLE=0`` removes NVLS
and NVLSTree both. NCCL's other algorithms (CollNet, PAT) are accepted in a list but
price as nothing; a setting that leaves a collective no algorithm the model knows is a
ValueError, as is NCCL 2.24's per-collective syntax (``allreduce:tree``), not priced yet.

``NCCL_CTA_POLICY=2`` (NCCL 2.28's zero-CTA policy, ``NCCL_CTA_POLICY_ZERO``: "zero CTA
whenever it can", docs.nvidia.com/deeplearning/nccl ``api/flags``) hands the collectives
that only move data (``COPY_ENGINE_KINDS``) inside one NVLink domain to the copy engines,
which hold no SM; their time is assumed unchanged (no published copy-engine bandwidth
beside NCCL's). NCCL does this only on buffers registered as symmetric windows
(NVIDIA/nccl ``src/ce_coll.cc``: a symmetric receive window, CUDA driver 12.5+), which XLA
registers under ``--xla_gpu_experimental_enable_nccl_symmetric_buffers=true``
(``symmetric_buffers``). XLA never sets the policy itself: ``AsNcclConfig``
(openxla/xla ``xla/backends/gpu/collectives/nccl_collectives.cc``) sets only ``blocking``,
``splitShare`` and ``maxCTAs`` in every jaxlib this project reads (0.9.0 to 0.12.0.1; a
proposal to set it with symmetric buffers, openxla/xla PR #33613, was closed unmerged).
So the copy engines run only with both the XLA flag and the variable; either alone
moves no collective off the SMs. ``NCCL_CTA_POLICY=1`` (efficiency, ``efficiency``) acts
on registered buffers (XLA's user buffers): NCCL then runs the all-gathers and
reduce-scatters inside one node as NVLS on its registered CTAs (4-6 on 8 GPUs) instead of a
ring on tens, unless NCCL_ALGO or NCCL_PROTO is set (NVIDIA/nccl ``src/enqueue.cc``,
``ncclGetAlgoInfo``; ``cost.registered_nvls_applies``); without registered buffers it
changes nothing the model prices.

What a collective runs on (NVIDIA/nccl ``src/init.cc``, ``envConfigOverride`` and
``computeBuffSizes``; ``src/graph/connect.cc``, ``ncclTopoPostset``):

* ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS`` (and their deprecated names ``NCCL_MIN_NCHANNELS`` /
  ``NCCL_MAX_NCHANNELS``) bound the CTAs of every communicator, 1-64. They override the
  ``maxCTAs`` a program passes in ``ncclConfig_t``, which is how XLA applies
  ``--xla_gpu_nccl_collective_max_nchannels`` (``AsNcclConfig``): with ``NCCL_MAX_CTAS`` set,
  XLA's cap changes nothing. The tuner plugin's per-call channels (``nccl_tuner.conf``) act
  inside the communicator's CTAs, never above them, so a pin bounds what the search may
  choose (``channel_cap``); ``NCCL_MIN_CTAS`` raises the communicator's CTAs, but NCCL
  still cuts a small message's channels below it (``topoGetAlgoInfo``). Fewer CTAs: a slower collective and more SMs for the compute
  beside it, through the same terms as the search's own channel choices.
* ``NCCL_NTHREADS`` (64, 128, 256 or 512): threads per CTA of the LL and Simple protocols
  (LL128 and tree keep theirs). No tuner plugin sets threads per call.
* ``NCCL_BUFFSIZE``: the Simple protocol's buffer, 8 steps of which a ring chunk takes 4
  (4 MiB: 2 MiB chunks), so it bounds the chunk sizes a plan may ask for.
* ``NCCL_NVLS_NCHANNELS``: the CTAs of an NVLS collective (``nvlsCTAs``).

NCCL's other documented variables (the network, debugging, plugins, topology) are accepted
and change nothing the model prices (``unpriced``); a name NCCL does not document is an error.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping

from lagom_jax.cluster.params import ALGORITHMS, PROTOCOLS

__all__ = ["NcclEnv", "PRICED_VARIABLES", "UNPRICED_VARIABLES", "check_names", "pinned", "unpriced"]

PRICED_VARIABLES = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_CTA_POLICY", "NCCL_MIN_CTAS",
                    "NCCL_MAX_CTAS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS",
                    "NCCL_BUFFSIZE", "NCCL_NVLS_NCHANNELS")
# NCCL's documented variables (docs.nvidia.com/deeplearning/nccl user guide, "Environment
# Variables") that change nothing the cost model prices: how NCCL reaches the network and
# the peers, what it logs, which plugins it loads. Accepted, with a line saying so.
UNPRICED_VARIABLES = frozenset({
    "NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_WARN_ENABLE_DEBUG_INFO",
    "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD",
    "NCCL_SOCKET_RETRY_CNT", "NCCL_SOCKET_RETRY_SLEEP_MSEC", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE", "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_FIFO_TC", "NCCL_IB_RETURN_ASYNC_EVENTS", "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_CUDA_SUPPORT", "NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_AR_THRESHOLD", "NCCL_IB_ECE_ENABLE", "NCCL_IB_MERGE_NICS", "NCCL_IB_MERGE_VFS", "NCCL_IB_DISABLE",
    "NCCL_IB_USE_INLINE", "NCCL_IBEXT_DISABLE", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ", "NCCL_NET_GDR_C2C", "NCCL_NET_SHARED_BUFFERS", "NCCL_NET_SHARED_COMMS",
    "NCCL_NET_FORCE_FLUSH", "NCCL_NET_OVERHEAD", "NCCL_NET_DISABLE_INTRA", "NCCL_NETDEVS_POLICY",
    "NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_TOPO_FILE",
    "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_FILE", "NCCL_GRAPH_DUMP_FILE", "NCCL_GRAPH_MIXING_SUPPORT",
    "NCCL_GRAPH_REGISTER", "NCCL_LOCAL_REGISTER", "NCCL_LEGACY_CUDA_REGISTER", "NCCL_WIN_ENABLE",
    "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_P2P_READ_ENABLE", "NCCL_P2P_DIRECT_DISABLE",
    "NCCL_P2P_USE_CUDA_MEMCPY", "NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_NVL_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_PXN_LEVEL", "NCCL_PXN_DISABLE", "NCCL_PXN_C2C", "NCCL_SHM_DISABLE", "NCCL_SHM_USE_CUDA_MEMCPY",
    "NCCL_SHM_MEMCPY_MODE", "NCCL_SHM_LOCALITY", "NCCL_CROSS_NIC", "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_MIN_P2P_NCHANNELS", "NCCL_MAX_P2P_NCHANNELS", "NCCL_NVLS_CHUNKSIZE", "NCCL_NVLSTREE_MAX_CHUNKSIZE",
    "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_LL128_NTHREADS", "NCCL_CGA_CLUSTER_SIZE",
    "NCCL_LAUNCH_MODE", "NCCL_LAUNCH_ORDER_IMPLICIT", "NCCL_CHECKS_DISABLE", "NCCL_CHECK_POINTERS",
    "NCCL_COMM_BLOCKING", "NCCL_ASYNC_ERROR_HANDLING", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_IGNORE_DISABLED_P2P",
    "NCCL_SET_THREAD_NAME", "NCCL_SET_STACK_SIZE", "NCCL_WORK_FIFO_DEPTH", "NCCL_WORK_FIFO_BYTES",
    "NCCL_RUNTIME_CONNECT", "NCCL_COLLNET_ENABLE", "NCCL_COLLNET_NODE_THRESHOLD", "NCCL_MNNVL_ENABLE",
    "NCCL_MNNVL_UUID", "NCCL_MNNVL_CLIQUE_ID", "NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_DMABUF_ENABLE", "NCCL_HOSTID", "NCCL_CONF_FILE", "NCCL_SINGLE_RING_THRESHOLD", "NCCL_LL_THRESHOLD",
    "NCCL_TREE_THRESHOLD", "NCCL_NVB_DISABLE", "NCCL_NVB_PRECONNECT", "NCCL_PROXY_PROFILE",
    "NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE", "NCCL_RAS_ENABLE", "NCCL_RAS_ADDR", "NCCL_RAS_TIMEOUT_FACTOR",
    "NCCL_SPLIT_SHARE_RESOURCES", "NCCL_SHRINK_SHARE_RESOURCES", "NCCL_NVLS_ENABLE_FOR_COLLNET",
})
# NCCL's bounds (src/include/device.h MAXCHANNELS; the documented NCCL_NTHREADS values) and
# its Simple buffer (src/init.cc computeBuffSizes: 1 << 22; NCCL_STEPS 8, a ring chunk 4 steps).
MAX_CTAS = 64
NTHREADS_VALUES = (64, 128, 256, 512)
DEFAULT_BUFFSIZE = 4 << 20
_STEPS, _RING_CHUNK_STEPS = 8, 4
# Deprecated spellings NCCL still reads for the same settings (src/init.cc).
_CTA_ALIASES = {"NCCL_MIN_CTAS": "NCCL_MIN_NCHANNELS", "NCCL_MAX_CTAS": "NCCL_MAX_NCHANNELS"}
# Collectives that only move data, which NCCL's zero-CTA policy hands to the copy engines;
# reductions need SMs and keep their CTAs.
COPY_ENGINE_KINDS = ("all-gather", "all-to-all")
# NCCL's algorithm names (src/include/device.h ncclAlgoStr), lower case, and the model's
# name for those it prices.
_NCCL_ALGORITHMS = {"tree": "tree", "ring": "ring", "nvls": "nvls", "collnetdirect": None,
                    "collnetchain": None, "nvlstree": "nvls_tree", "pat": None}
_NCCL_PROTOCOLS = {p.lower(): p for p in PROTOCOLS}


@dataclasses.dataclass(frozen=True, order=True)
class NcclEnv:
    """Allowed algorithms and protocols (empty: NCCL's own set), whether NVLS is on, the CTA
    bounds, threads and buffer a user pinned (0: NCCL's own), and how XLA registers its
    collective buffers with NCCL."""

    algorithms: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    nvls: bool = True
    zero_cta: bool = False
    # XLA's --xla_gpu_experimental_enable_nccl_symmetric_buffers: collective buffers in
    # collective memory, registered as NCCL symmetric windows (not an NCCL variable).
    symmetric_buffers: bool = False
    min_ctas: int = 0
    max_ctas: int = 0
    nthreads: int = 0
    buffsize: int = 0
    nvls_ctas: int = 0
    # XLA's --xla_gpu_enable_nccl_user_buffers: collective buffers registered with NCCL
    # (ncclCommRegister), so NVLS reads and writes them in place (not an NCCL variable).
    user_buffers: bool = False
    # The maxCTAs XLA passes in ncclConfig_t (--xla_gpu_nccl_collective_max_nchannels; 0:
    # unset), which NCCL_MAX_CTAS overrides.
    config_max_ctas: int = 0
    # NCCL_CTA_POLICY=1 (NCCL_CTA_POLICY_EFFICIENCY).
    efficiency: bool = False
    # XLA's --xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel (default true): a ragged
    # all-to-all inside one host runs as XLA's own kernel, not through NCCL (not an NCCL variable).
    ragged_one_shot: bool = True

    def __post_init__(self) -> None:
        for a in self.algorithms:
            if a not in ALGORITHMS:
                raise ValueError(f"NCCL algorithm {a!r} is not one the model prices (known: {', '.join(ALGORITHMS)})")
        for p in self.protocols:
            if p not in PROTOCOLS:
                raise ValueError(f"NCCL protocol {p!r} is not one the model prices (known: {', '.join(PROTOCOLS)})")
        for name, value in (("NCCL_MIN_CTAS", self.min_ctas), ("NCCL_MAX_CTAS", self.max_ctas),
                            ("NCCL_NVLS_NCHANNELS", self.nvls_ctas),
                            ("xla_gpu_nccl_collective_max_nchannels", self.config_max_ctas)):
            if value and not 1 <= value <= MAX_CTAS:
                raise ValueError(f"{name}={value}: NCCL takes 1 to {MAX_CTAS} CTAs (unset it for NCCL's own)")
        if self.zero_cta and self.efficiency:
            raise ValueError("NCCL_CTA_POLICY is one value: zero-CTA (2) or efficiency (1), not both")
        if self.min_ctas and self.max_ctas and self.min_ctas > self.max_ctas:
            raise ValueError(f"NCCL_MIN_CTAS={self.min_ctas} is above NCCL_MAX_CTAS={self.max_ctas}: "
                             "NCCL would lower the minimum to the maximum; give MIN <= MAX")
        if self.nthreads and self.nthreads not in NTHREADS_VALUES:
            raise ValueError(f"NCCL_NTHREADS={self.nthreads}: NCCL takes {', '.join(map(str, NTHREADS_VALUES))}")
        if self.buffsize and self.buffsize < _STEPS * 1024:
            raise ValueError(f"NCCL_BUFFSIZE={self.buffsize}: at least {_STEPS * 1024} bytes (8 steps of 1 KiB); "
                             f"NCCL's default is {DEFAULT_BUFFSIZE}")

    @property
    def is_default(self) -> bool:
        return self == NcclEnv()

    def allows_algorithm(self, algorithm: str) -> bool:
        if algorithm in ("nvls", "nvls_tree") and not self.nvls:
            return False
        return not self.algorithms or algorithm in self.algorithms

    def allows_protocol(self, protocol: str) -> bool:
        return not self.protocols or protocol in self.protocols

    def ctas(self, default: int) -> int:
        """The CTAs of a communicator whose own count is ``default``: NCCL clamps it to
        [minCTAs, maxCTAs] (``ncclTopoPostset``), NCCL_MAX_CTAS taking precedence over the
        maxCTAs XLA passes (``envConfigOverride``)."""
        out = max(default, self.min_ctas) if self.min_ctas else default
        return min(out, self.channel_cap)

    @property
    def channel_cap(self) -> int:
        """The most channels any call may run under the pins (a tuner plugin's per-call
        channels act inside the communicator's CTAs; NCCL_MIN_CTAS raises the communicator's
        count but no call's floor: NCCL still cuts a small message's channels)."""
        return self.max_ctas or self.config_max_ctas or MAX_CTAS

    def threads(self, protocol: str, default: int) -> int:
        """Threads per CTA of ``protocol`` where NCCL's own is ``default``: the pin for LL
        and Simple, NCCL's own for LL128 (NCCL_LL128_NTHREADS, not priced)."""
        return self.nthreads if self.nthreads and protocol != "LL128" else default

    def simple_chunk(self, default: int, *, ring: bool) -> int:
        """The Simple protocol's chunk under the buffer size: ``default`` at NCCL's 4 MiB,
        scaled with NCCL_BUFFSIZE (a ring chunk is 4 of its 8 steps, other algorithms one)."""
        if not self.buffsize:
            return default
        return self.buffsize // _STEPS * (_RING_CHUNK_STEPS if ring else 1)

    @property
    def max_simple_chunk(self) -> int:
        """The largest Simple chunk NCCL runs (its buffer's 4 steps): what a tuner plugin's
        chunk is clamped to (``getChunkSize``, ``bufferMaxChunkSize``)."""
        return (self.buffsize or DEFAULT_BUFFSIZE) // _STEPS * _RING_CHUNK_STEPS

    @classmethod
    def from_environ(cls, env: Mapping[str, str], *, symmetric_buffers: bool = False,
                     user_buffers: bool = False, ragged_one_shot: bool = True) -> NcclEnv:
        """The settings of ``env`` (e.g. ``{"NCCL_PROTO": "^LL128"}``), on buffers XLA registers
        as symmetric windows where ``symmetric_buffers`` and with NCCL where ``user_buffers``;
        ValueError names a variable NCCL does not document or a value out of its range.
        Documented variables the model does not price are accepted (``unpriced`` says which)."""
        check_names(env)
        algorithms = _parse_list("NCCL_ALGO", env.get("NCCL_ALGO", ""), _NCCL_ALGORITHMS)
        protocols = _parse_list("NCCL_PROTO", env.get("NCCL_PROTO", ""), _NCCL_PROTOCOLS)
        nvls = env.get("NCCL_NVLS_ENABLE", "1").strip()
        if nvls not in ("0", "1", "2"):
            raise ValueError(f"NCCL_NVLS_ENABLE={nvls!r}: NCCL takes 0, 1 or 2 (2: on where supported)")
        policy = env.get("NCCL_CTA_POLICY", "0").strip()
        if policy not in ("0", "1", "2"):
            raise ValueError(f"NCCL_CTA_POLICY={policy!r}: NCCL takes 0 (default), 1 (efficiency) or 2 (zero-CTA)")
        made = cls(algorithms=algorithms, protocols=protocols, nvls=nvls != "0", zero_cta=policy == "2",
                   efficiency=policy == "1",
                   symmetric_buffers=symmetric_buffers, min_ctas=_cta_pin(env, "NCCL_MIN_CTAS"),
                   max_ctas=_cta_pin(env, "NCCL_MAX_CTAS"), nthreads=_integer(env, "NCCL_NTHREADS"),
                   buffsize=_integer(env, "NCCL_BUFFSIZE"), nvls_ctas=_integer(env, "NCCL_NVLS_NCHANNELS"),
                   user_buffers=user_buffers, ragged_one_shot=ragged_one_shot)
        if algorithms and not any(made.allows_algorithm(a) for a in ALGORITHMS):
            raise ValueError(f"NCCL_ALGO={env['NCCL_ALGO']!r} with NCCL_NVLS_ENABLE={nvls} leaves no "
                             "algorithm the model prices (ring, tree, nvls, nvlstree)")
        return made

    def as_environ(self) -> dict[str, str]:
        """The variables that give NCCL these settings (nothing for NCCL's defaults)."""
        out = {}
        if self.algorithms:
            out["NCCL_ALGO"] = ",".join(_NCCL_SPELLING[a] for a in self.algorithms)
        if self.protocols:
            out["NCCL_PROTO"] = ",".join(self.protocols)
        if not self.nvls:
            out["NCCL_NVLS_ENABLE"] = "0"
        if self.zero_cta:
            out["NCCL_CTA_POLICY"] = "2"
        if self.efficiency:
            out["NCCL_CTA_POLICY"] = "1"
        for name, value in (("NCCL_MIN_CTAS", self.min_ctas), ("NCCL_MAX_CTAS", self.max_ctas),
                            ("NCCL_NTHREADS", self.nthreads), ("NCCL_BUFFSIZE", self.buffsize),
                            ("NCCL_NVLS_NCHANNELS", self.nvls_ctas)):
            if value:
                out[name] = str(value)
        return out

    def copy_engine(self, kind: str, nodes: int) -> bool:
        """Whether a ``kind`` collective spanning ``nodes`` runs on the copy engines: the
        zero-CTA policy on symmetric windows, inside one node."""
        return self.zero_cta and self.symmetric_buffers and kind in COPY_ENGINE_KINDS and nodes <= 1

    def describe(self) -> str:
        text = " ".join(f"{k}={v}" for k, v in self.as_environ().items()) or "NCCL's defaults"
        registered = [what for what, on in (("XLA's symmetric buffers", self.symmetric_buffers),
                                            ("XLA's user buffers", self.user_buffers)) if on]
        cap = f" under XLA's maxCTAs {self.config_max_ctas}" if self.config_max_ctas and not self.max_ctas else ""
        ragged = "" if self.ragged_one_shot else ", XLA's ragged all-to-all through NCCL"
        return text + (" on " + " and ".join(registered) if registered else "") + cap + ragged


def pinned(base: NcclEnv, env: Mapping[str, str]) -> NcclEnv:
    """The settings of ``env`` on the buffers ``base`` registers and with its ragged exchange
    (XLA's flags, which no NCCL variable sets): what a user's ``--nccl-env`` makes of the
    cluster's settings."""
    return NcclEnv.from_environ(env, symmetric_buffers=base.symmetric_buffers, user_buffers=base.user_buffers,
                                ragged_one_shot=base.ragged_one_shot)


def check_names(env: Mapping[str, str]) -> None:
    """ValueError naming the first variable of ``env`` that NCCL does not document, with the
    nearest name it does."""
    known = set(PRICED_VARIABLES) | UNPRICED_VARIABLES
    for name in sorted(env):
        if name in known:
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.85)
        hint = f"did you mean {near[0]}?" if near else (
            "not an NCCL variable" if not name.startswith("NCCL_") else "not one NCCL documents")
        raise ValueError(f"unknown NCCL variable {name!r}: {hint} (priced: {', '.join(PRICED_VARIABLES)})")


def unpriced(env: Mapping[str, str]) -> tuple[str, ...]:
    """A line for each variable of ``env`` NCCL documents but the model does not price."""
    return tuple(f"{name}={env[name]} is accepted and changes nothing the cost model prices "
                 "(the network, logging, plugins or topology)" for name in sorted(env) if name in UNPRICED_VARIABLES)


def _integer(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "").strip()
    if not text:
        return 0
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"{name}={text!r}: not an integer") from None
    if value < 1:
        raise ValueError(f"{name}={value}: must be at least 1 (unset it for NCCL's own)")
    return value


def _cta_pin(env: Mapping[str, str], name: str) -> int:
    """A CTA bound under its name or its deprecated one; both, differing, is an error."""
    alias = _CTA_ALIASES[name]
    value, old = _integer(env, name), _integer(env, alias)
    if value and old and value != old:
        raise ValueError(f"{name}={value} and {alias}={old} set the same bound differently: give one "
                         f"({alias} is its deprecated name)")
    return value or old


_NCCL_SPELLING = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS", "nvls_tree": "NVLSTree"}


def _parse_list(name: str, value: str, known: Mapping[str, str | None]) -> tuple[str, ...]:
    """NCCL's list syntax (``parseList``): comma-separated names, a leading ``^`` for all
    but these; the model's names of those it prices, in its own order."""
    text = value.strip()
    if not text:
        return ()
    if ";" in text or ":" in text:
        raise ValueError(f"{name}={value!r}: per-collective settings (NCCL 2.24's 'allreduce:tree') "
                         "are not priced yet; give one list for every collective")
    exclude = text.startswith("^")
    names = [n.strip().lower() for n in text.removeprefix("^").split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"{name}={value!r}: unknown {bad or 'empty list'} (NCCL knows: {', '.join(known)})")
    chosen = {known[n] for n in names} - {None}
    priced = [m for m in dict.fromkeys(known.values()) if m is not None]
    kept = [m for m in priced if (m not in chosen) == exclude]
    if not kept:
        raise ValueError(f"{name}={value!r} leaves nothing the model prices ({', '.join(priced)})")
    return tuple(kept)
