"""A Plan's artifacts in one folder, and ``launch.sh``, which applies all of them.

``plan.json``, ``report.txt``, ``xla_flags.txt``, ``nccl_env.sh``, ``nccl_tuner.conf``,
``lhs_profile.pbtxt``, the NCCL tuner plugin (built when a C compiler is there),
``trace.json`` and ``timeline.png`` (predicted, by the plan's own timeline).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from lagom_jax.plan import nccl_tuner, trace
from lagom_jax.plan.schema import Plan
from lagom_jax.search import SearchResult

__all__ = ["write"]


def write(out: pathlib.Path, plan: Plan, result: SearchResult | None, log: Callable[[str], None]) -> pathlib.Path:
    """Every artifact of a plan in ``out``, and ``launch.sh``, which applies all of them
    (the predicted trace and timeline only with the search ``result`` behind the plan).

    The tuner plugin is built into ``out`` too (when a C compiler is there), so the folder
    can be copied to the cluster as it is: ``launch.sh`` finds the plugin and its config
    beside itself. Returns the path of ``launch.sh``.
    """
    out.mkdir(parents=True, exist_ok=True)
    plan.save(out / "plan.json")
    (out / "report.txt").write_text(plan.report(top=10_000, width=None) + "\n")
    (out / "xla_flags.txt").write_text(plan.xla_flags() + "\n" if plan.flags else "")
    (out / "nccl_tuner.conf").write_text(plan.nccl_tuner_config())
    (out / "lhs_profile.pbtxt").write_text(plan.lhs_profile())
    try:
        plugin = nccl_tuner.build_tuner(out)
        plugin_note = ""
    except nccl_tuner.TunerBuildError as err:
        plugin = None
        plugin_note = f"the NCCL tuner plugin was not built ({str(err).splitlines()[0]}); " \
                      "per-collective choices are not applied"
        log(plugin_note)
    env = plan.nccl_env(config_path=out / "nccl_tuner.conf", plugin_path=plugin or out / "missing.so")
    env.pop("NCCL_TUNER_PLUGIN", None)
    env.pop(nccl_tuner.CONFIG_ENV, None)
    (out / "nccl_env.sh").write_text(
        "# NCCL environment of this plan, for every rank, before the first communicator:\n"
        + ("".join(f"export {k}={v}\n" for k, v in sorted(env.items())) or "# (none beyond the tuner plugin)\n"))
    launch = out / "launch.sh"
    lines = ["#!/usr/bin/env bash",
             f"# lagom-jax plan: {plan.module} on {plan.hardware} ({plan.nodes} node(s) x {plan.gpus_per_node} "
             f"GPUs), strategy {plan.strategy}, predicted step {plan.makespan_us / 1e3:.3f} ms (cost model).",
             "# Usage, on every rank: ./launch.sh python train.py ...",
             "set -euo pipefail",
             'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']
    if plan.flags:
        lines.append(f'export XLA_FLAGS="${{XLA_FLAGS:-}} {plan.xla_flags()}"')
    lines += [f"export {k}={v}" for k, v in sorted(env.items())]
    if plugin is not None:
        lines += [f'export NCCL_TUNER_PLUGIN="$here/{plugin.name}"',
                  f'export {nccl_tuner.CONFIG_ENV}="$here/nccl_tuner.conf"']
    else:
        lines.append(f"# {plugin_note}")
    lines.append('exec "$@"')
    launch.write_text("\n".join(lines) + "\n")
    launch.chmod(0o755)
    if result is not None:
        trace.write_perfetto(result.timeline, result.graph, out / "trace.json")
        try:
            trace.to_png(result.timeline, result.graph, out / "timeline.png",
                         title=f"predicted by the cost model: {plan.strategy} plan")
        except ImportError as err:
            log(f"no timeline.png ({err})")
    log(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    return launch
