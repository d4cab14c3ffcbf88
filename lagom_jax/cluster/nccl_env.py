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
``nvls`` and the protocols ``LL``, ``LL128``, ``Simple`` (NCCL's spelling is accepted in
any case). NCCL's other algorithms (CollNet, NVLSTree, PAT) are accepted in a list but
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
moves no collective off the SMs. Policy 1 (efficiency) is not priced: the model has no
account of how NCCL trims CTAs under it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lagom_jax.cluster.params import ALGORITHMS, PROTOCOLS

__all__ = ["NcclEnv", "PRICED_VARIABLES"]

PRICED_VARIABLES = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_CTA_POLICY")
# Collectives that only move data, which NCCL's zero-CTA policy hands to the copy engines;
# reductions need SMs and keep their CTAs.
COPY_ENGINE_KINDS = ("all-gather", "all-to-all")
# NCCL's algorithm names (src/include/device.h ncclAlgoStr), lower case, and the model's
# name for those it prices.
_NCCL_ALGORITHMS = {"tree": "tree", "ring": "ring", "nvls": "nvls", "collnetdirect": None,
                    "collnetchain": None, "nvlstree": None, "pat": None}
_NCCL_PROTOCOLS = {p.lower(): p for p in PROTOCOLS}


@dataclasses.dataclass(frozen=True, order=True)
class NcclEnv:
    """Allowed algorithms and protocols (empty: NCCL's own set) and whether NVLS is on."""

    algorithms: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    nvls: bool = True
    zero_cta: bool = False
    # XLA's --xla_gpu_experimental_enable_nccl_symmetric_buffers: collective buffers in
    # collective memory, registered as NCCL symmetric windows (not an NCCL variable).
    symmetric_buffers: bool = False

    def __post_init__(self) -> None:
        for a in self.algorithms:
            if a not in ALGORITHMS:
                raise ValueError(f"NCCL algorithm {a!r} is not one the model prices (known: {', '.join(ALGORITHMS)})")
        for p in self.protocols:
            if p not in PROTOCOLS:
                raise ValueError(f"NCCL protocol {p!r} is not one the model prices (known: {', '.join(PROTOCOLS)})")

    @property
    def is_default(self) -> bool:
        return self == NcclEnv()

    def allows_algorithm(self, algorithm: str) -> bool:
        if algorithm == "nvls" and not self.nvls:
            return False
        return not self.algorithms or algorithm in self.algorithms

    def allows_protocol(self, protocol: str) -> bool:
        return not self.protocols or protocol in self.protocols

    @classmethod
    def from_environ(cls, env: Mapping[str, str], *, symmetric_buffers: bool = False) -> NcclEnv:
        """The settings of ``env`` (e.g. ``{"NCCL_PROTO": "^LL128"}``), on buffers XLA registers
        as symmetric windows where ``symmetric_buffers``; ValueError names a variable or value
        the model cannot price."""
        unknown = sorted(set(env) - set(PRICED_VARIABLES))
        if unknown:
            raise ValueError(f"NCCL settings {unknown} cannot be priced (priced: {', '.join(PRICED_VARIABLES)})")
        algorithms = _parse_list("NCCL_ALGO", env.get("NCCL_ALGO", ""), _NCCL_ALGORITHMS)
        protocols = _parse_list("NCCL_PROTO", env.get("NCCL_PROTO", ""), _NCCL_PROTOCOLS)
        nvls = env.get("NCCL_NVLS_ENABLE", "1").strip()
        if nvls not in ("0", "1", "2"):
            raise ValueError(f"NCCL_NVLS_ENABLE={nvls!r}: NCCL takes 0, 1 or 2 (2: on where supported)")
        policy = env.get("NCCL_CTA_POLICY", "0").strip()
        if policy not in ("0", "2"):
            raise ValueError(f"NCCL_CTA_POLICY={policy!r}: priced are 0 (default) and 2 (zero-CTA); "
                             "1 (efficiency) is not priced")
        made = cls(algorithms=algorithms, protocols=protocols, nvls=nvls != "0", zero_cta=policy == "2",
                   symmetric_buffers=symmetric_buffers)
        if algorithms and not any(made.allows_algorithm(a) for a in ALGORITHMS):
            raise ValueError(f"NCCL_ALGO={env['NCCL_ALGO']!r} with NCCL_NVLS_ENABLE={nvls} leaves no "
                             "algorithm the model prices (ring, tree, nvls)")
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
        return out

    def copy_engine(self, kind: str, nodes: int) -> bool:
        """Whether a ``kind`` collective spanning ``nodes`` runs on the copy engines: the
        zero-CTA policy on symmetric windows, inside one node."""
        return self.zero_cta and self.symmetric_buffers and kind in COPY_ENGINE_KINDS and nodes <= 1

    def describe(self) -> str:
        text = " ".join(f"{k}={v}" for k, v in self.as_environ().items()) or "NCCL's defaults"
        return text + (" on XLA's symmetric buffers" if self.symmetric_buffers else "")


_NCCL_SPELLING = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS"}


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
