"""The ``lagom-jax`` command line: a thin shell over library functions.

Each subcommand is one ``_add_<name>(subparsers)`` function that declares its arguments
and one ``_run_<name>(args) -> int`` that does the work; adding a subcommand means adding
that pair and one line in :data:`_SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.resources
import json
import pathlib
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from lagom_jax import api, job, models, quiet, search
from lagom_jax.bench import launch as launch_lib, run as bench_run
from lagom_jax.advise import configtuner as advise, predict
from lagom_jax.cluster import hardware, nccl_env as nccl_env_lib
from lagom_jax.costs import calibrate, nccl_tests, profile
from lagom_jax.models import FAMILIES, pipeline
from lagom_jax.plan import nccl_tuner, report, trace
from lagom_jax.program import custom_calls, gpu_compile, graph, hlo

STRATEGY_CHOICES = ("lagom", "autoccl", "recipe", "xla-default", "exhaustive")

EXAMPLES = ("gpt_train_step",)


def example_text(name: str = "gpt_train_step") -> str:
    """HLO text of a built-in example module (``lagom_jax/data/example_<name>.hlo``)."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r} (known: {', '.join(EXAMPLES)})")
    return (importlib.resources.files("lagom_jax") / "data" / f"example_{name}.hlo").read_text()


class _UsageError(Exception):
    """A bad argument or input file: reported on stderr, exit status 2, no traceback."""


def _require_positive(args: argparse.Namespace, *names: str) -> None:
    """Every numeric option in ``names`` that was given is at least 1."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise _UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")


def _read_text(args: argparse.Namespace) -> str:
    """The HLO text named by PATH, ``-`` (stdin) or ``--example``."""
    if args.example is not None:
        if args.path is not None:
            raise _UsageError("give either PATH or --example, not both")
        return example_text(args.example)
    if args.path is None:
        raise _UsageError("missing PATH (an HLO text file, or - for stdin); or use --example")
    if args.path == "-":
        return sys.stdin.read()
    try:
        with open(args.path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise _UsageError(f"cannot read {args.path}: {e}") from None


def _where(args: argparse.Namespace) -> str:
    if args.example is not None:
        return f"example {args.example}"
    return "<stdin>" if args.path == "-" else str(args.path)


def _read_module(args: argparse.Namespace) -> hlo.Module:
    text = _read_text(args)
    try:
        return hlo.parse(text)
    except hlo.HloParseError as e:
        raise _UsageError(f"{_where(args)}: {e}") from None


def _parse_graph(text: str, args: argparse.Namespace) -> graph.StepGraph:
    try:
        return graph.from_hlo_text(text)
    except (hlo.HloParseError, ValueError) as e:
        raise _UsageError(f"{_where(args)}: {e}") from None


def _read_graph(args: argparse.Namespace) -> graph.StepGraph:
    return _parse_graph(_read_text(args), args)


def _compiled_module(args: argparse.Namespace, hw: hardware.HardwareProfile):
    """The module of PATH for the cluster: read as it is when XLA compiled it, compiled
    deviceless first when it is HLO before optimization (``job.HloSource``)."""
    _require_positive(args, "partitions")
    text = _read_text(args)
    _parse_graph(text, args)  # unreadable HLO: one line, exit 2
    try:
        return job.compile_source(job.HloSource(text, _where(args), args.partitions), hw, log=_log)
    except (ValueError, gpu_compile.DevicelessUnavailable) as err:
        raise _UsageError(f"{_where(args)}: {err}") from None


def _add_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="HLO text file, or - to read stdin (a module XLA compiled, "
                   "or one before optimization, which is compiled for the cluster first)")
    p.add_argument("--partitions", type=int, default=None, metavar="N",
                   help="devices a module before optimization runs on (default: from its replica groups)")
    p.add_argument("--example", nargs="?", const=EXAMPLES[0], choices=EXAMPLES,
                   help="use a built-in GPU-style example module instead of PATH")


def _add_hardware_args(p: argparse.ArgumentParser, *, default: str) -> None:
    p.add_argument("--hardware", default=default,
                   help=f"a preset ({', '.join(hardware.PRESETS)}), 'auto' (the devices "
                   f"this process sees), or a HardwareProfile JSON file (default {default})")
    p.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="number of nodes of the cluster (default: the preset's)")


def _hardware(args: argparse.Namespace, num_devices: int | None = None) -> hardware.HardwareProfile:
    """The cluster of --hardware/--nodes, grown to ``num_devices`` unless they fix its size."""
    _require_positive(args, "nodes")
    try:
        resolved = hardware.resolve_cluster(args.hardware, nodes=args.nodes, num_devices=num_devices)
    except (ValueError, OSError) as e:
        raise _UsageError(str(e)) from None
    if args.hardware == "auto":
        _stderr(f"lagom-jax: {resolved.note}")
    return resolved.hardware


# ----------------------------------------------------------------------------- analyze


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="list the collectives and compute totals of an HLO module",
        description="Parse HLO text (compiled.as_text() or an XLA dump) and report its "
        "collectives (kind, bytes, group size, loop trip count, async) and compute totals.",
    )
    _add_input_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs per node: adds how many nodes each collective's group spans")


def _run_analyze(args: argparse.Namespace) -> int:
    if args.gpus_per_node is not None and args.gpus_per_node <= 0:
        raise _UsageError(f"--gpus-per-node must be positive, got {args.gpus_per_node}")
    module = _read_module(args)
    try:
        result = report.analyze(module)
        nodes_of = None
        if args.gpus_per_node is not None:
            step = graph.from_module(module, unroll_loops=False)
            nodes_of = {t.name: step.shape(t, args.gpus_per_node).nodes for t in step.collectives}
    except hlo.HloParseError as e:
        raise _UsageError(f"{_where(args)}: {e}") from None
    if args.json:
        print(json.dumps(result))
    else:
        print(report.format_analysis(result, nodes_of=nodes_of))
    return 0


# ----------------------------------------------------------------------------- simulate


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay an HLO module on a hardware profile and print its timeline",
        description="Build the StepGraph of an HLO module and replay it with the unified cost "
        "model as XLA runs it with no flags (its combiners and scheduler, NCCL's own "
        "parameter choices; the xla-default baseline of `tune`): makespan, overlap bound, "
        "exposed communication per collective.",
    )
    _add_input_args(p)
    _add_hardware_args(p, default="h100-sxm-8")
    p.add_argument("--trace", metavar="OUT.json", help="write a Perfetto / Chrome trace")
    p.add_argument("--png", metavar="OUT.png", help="write a Gantt chart (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _run_simulate(args: argparse.Namespace) -> int:
    import importlib.util

    if args.png and importlib.util.find_spec("matplotlib") is None:
        raise _UsageError("--png needs matplotlib, an optional extra: pip install 'lagom-jax[plot]'")
    compiled = _compiled_module(args, _hardware(args))
    step, hw = _parse_graph(compiled.text, args), compiled.hardware
    # The step as XLA runs it with no flags: the xla-default baseline of `tune`, so that
    # both commands give one number for it.
    baseline = search.run_strategy("xla-default", step, hw)
    print(report.simulate_report(baseline.graph, hw, as_json=args.json, timeline=baseline.timeline))
    if args.trace:
        trace.write_perfetto(baseline.timeline, baseline.graph, args.trace)
    if args.png:
        trace.to_png(baseline.timeline, baseline.graph, args.png, title="predicted by the cost model, XLA defaults")
    return 0


# ----------------------------------------------------------------------------- tune


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The built-in model options shared by ``tune --model`` and ``predict --model``."""
    p.add_argument("--model", choices=sorted(FAMILIES), help="tune a built-in model instead of PATH")
    p.add_argument("--config", default=None,
                   help="model size: " + "; ".join(f"{m}: {' '.join(f.configs)}" for m, f in FAMILIES.items())
                   + "; or dimensions 'layers=80,d_model=8192,heads=64,kv_heads=8,d_ff=28672,vocab=128256' "
                   "(default: the smallest real size)")
    p.add_argument("--mesh", default="data=2,model=4",
                   help="mesh axes for --model: data, fsdp, context, model, stage, expert (default data=2,model=4)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--remat", default="none", choices=tuple(pipeline.REMAT_POLICIES),
                   help="rematerialisation policy of each layer, by MaxText's names (default none)")
    p.add_argument("--attention", default="xla", choices=("xla", "flash"),
                   help="xla: scores materialised; flash: the fused flash-attention kernel (llama, mixtral)")
    p.add_argument("--unroll", action="store_true", help="unroll the layers instead of a scan")
    _add_moe_args(p)
    _add_quantization_arg(p)


def _add_quantization_arg(p: argparse.ArgumentParser) -> None:
    """--model llama|mixtral options beyond the shape: fp8 and the attention layout."""
    p.add_argument("--quantization", default=None, choices=("fp8",),
                   help="--model llama|mixtral: the dense dots in fp8 with delayed scaling, as MaxText's "
                   "quantization=fp8 (XLA rewrites them into fp8 GEMMs; mixtral: --moe dropping only)")
    p.add_argument("--window", type=int, default=None,
                   help="--model llama|mixtral: sliding-window attention over this many positions (divides the "
                   "sequence)")
    p.add_argument("--global-every", type=int, default=None, metavar="K",
                   help="--model llama|mixtral with --window: every K-th layer global, the others windowed")
    p.add_argument("--global-kv-heads", type=int, default=None,
                   help="--model llama|mixtral with --global-every: the global layers' KV heads")
    p.add_argument("--embed-lookup", default=None, choices=("gather", "matmul"),
                   help="the token lookup: gather (default) or matmul, a one-hot times the table (MaxText's "
                   "use_iota_embed, Praxis' matmul lookup)")
    p.add_argument("--grad-clip", type=float, default=None, metavar="NORM",
                   help="clip the gradients to this global norm before the update (MaxText's "
                   "gradient_clipping_threshold; default: no clipping)")


def _add_moe_args(p: argparse.ArgumentParser) -> None:
    """--model mixtral's MoE options (docs/moe.md); not given: the config's own."""
    p.add_argument("--moe", default=None, choices=("dropless", "dropping", "grouped"),
                   help="--model mixtral: dropping (GShard capacity, MaxText's dense path; the default) or "
                   "dropless (sorted tokens, grouped GEMMs, MaxText's sparse path, which XLA:GPU compiles "
                   "to one dense dot over every expert) or grouped (the same on JAX's Pallas grouped-GEMM "
                   "kernels; Hopper)")
    p.add_argument("--moe-dispatch", default=None, choices=("ragged-all-to-all", "ring", "all-to-all"),
                   help="--model mixtral with --moe dropless or grouped and an expert axis: the token exchange, "
                   "XLA's ragged all-to-all (the default), a ring (tokens all-gathered over the expert axis, "
                   "capacity-factor buffers per shard, outputs reduce-scattered back) or all-to-all (fixed-capacity buffers per expert, one "
                   "all-to-all each way; rows past capacity dropped)")
    p.add_argument("--shared-experts", type=int, default=None,
                   help="--model mixtral: dense experts every token runs (DeepSeek: 1)")
    p.add_argument("--expert-ffn", type=int, default=None,
                   help="--model mixtral: each expert's FFN width (default the FFN width)")
    p.add_argument("--dense-layers", type=int, default=None,
                   help="--model mixtral: the first layers with a dense MLP (DeepSeek-V3: 3)")
    p.add_argument("--expert-imbalance", type=float, default=None,
                   help="--model mixtral: the busiest expert's load over the mean, >= 1 (default 1, "
                   "balanced)")


def _config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields given as options (MoE, quantization), checked (one line, exit 2, for
    what does not fit)."""
    given = {k: getattr(args, k, None) for k in ("moe", "moe_dispatch", "shared_experts", "expert_ffn",
                                                  "dense_layers", "expert_imbalance")}
    given = {k: v for k, v in given.items() if v is not None}
    if given and args.model != "mixtral":
        raise _UsageError(f"--{next(iter(given)).replace('_', '-')} needs --model mixtral")
    for name in ("quantization", "window", "global_every", "global_kv_heads"):
        value = getattr(args, name, None)
        if value is None:
            continue
        if args.model not in ("llama", "mixtral"):
            raise _UsageError(f"--{name.replace('_', '-')} {value} needs --model llama or mixtral, not {args.model}")
        given[name] = value
    for name in ("embed_lookup", "grad_clip"):  # every family's step
        if getattr(args, name, None) is not None:
            given[name] = getattr(args, name)
    return given


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="tune an HLO module or a built-in model: plan, flags, predicted gain",
        description="Search the communication parameters of one training step with the "
        "chosen strategy and compare it with every baseline. The step is an HLO module "
        "(PATH) or a built-in model (--model), compiled by XLA's GPU pipeline for the "
        "cluster's GPUs without a GPU (deviceless; XLA:CPU on this machine's devices, with a "
        "warning, only where no CUDA compiler plugin is installed).",
    )
    _add_input_args(p)
    _add_model_args(p)
    p.add_argument("--recipe", default=None,
                   help="sharding recipe for --model (default: from the mesh axes, e.g. dp+tp; context=N "
                   "gives cp, context parallelism with all-gathered keys/values; cp+ring passes them "
                   "around a ring)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="global batch in sequences (default: one per data-parallel rank of the mesh, "
                   "times the micro-batches of a pipeline)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="sequence length (default: 512, or the model's maximum if shorter)")
    p.add_argument("--commfuse", default="auto", choices=("auto", "off", "on"),
                   help="with a tp+sp recipe: run the MLP's all-gather/reduce-scatter as CommFuse "
                   "rings (recipe part cf) when the cost model predicts it faster (auto), never, "
                   "or always (default auto)")
    _add_hardware_args(p, default="h100-sxm-8")
    _add_nccl_env_arg(p)
    p.add_argument("--strategy", default="lagom", choices=STRATEGY_CHOICES)
    _add_min_gain_arg(p)
    p.add_argument("--no-structures", action="store_true",
                   help="skip the structure search (the collective pipeliner, while-loop double "
                   "buffering, combine-by-dim, each priced by compiling the step with it; runs "
                   "for --model and HLO before optimization, a compile per candidate tried)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--out", metavar="DIR", help="write every artifact (plan, flags, env, "
                   "tuner config, LHS profile, trace) into DIR")


def _add_nccl_env_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nccl-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an NCCL variable the run uses (repeatable): " + ", ".join(nccl_env_lib.PRICED_VARIABLES)
                   + " are priced; NCCL's other documented variables are accepted and change nothing priced")


def _min_gain(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"a fraction in [0, 1), got {value}")
    return value


def _add_min_gain_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-gain", type=_min_gain, default=None, metavar="F",
                   help="change a collective's NCCL parameters only for a predicted gain above this "
                   "fraction of its own time (default: the cost model's measured error for its size "
                   "and span; 0 takes every predicted gain)")


class _Clock:
    """When the command started and when the last progress line was printed."""

    start = last = time.monotonic()

    @classmethod
    def reset(cls) -> None:
        cls.start = cls.last = time.monotonic()


def _stderr(line: str, stream: Any = None) -> None:
    """A line for the person watching: at a terminal wrapped to ``report.WIDTH`` columns (a
    hanging indent); into a file or a pipe one line, for grep."""
    stream = stream or sys.stderr
    print(report.wrap(line, indent="    ") if stream.isatty() else line, file=stream, flush=True)


def _log(message: str, stream: Any = None) -> None:
    """A progress line on stderr: seconds since the command started, and since the line
    before (how long the stage that line announced took)."""
    now = time.monotonic()
    _stderr(f"lagom-jax [{now - _Clock.start:.1f} s, +{now - _Clock.last:.1f} s]: {message}", stream)
    _Clock.last = now


def _model_source(args: argparse.Namespace):
    """The built-in model of ``--model`` and the cluster its mesh runs on (--hardware, --nodes:
    a mesh larger than one node fills mesh / gpus_per_node nodes unless they say otherwise)."""
    import math

    try:
        shape = models.parse_mesh(args.mesh)
        config = args.config or models.DEFAULT_CONFIG[args.model]
        given = _config_options(args)
        cfg = models.families.resolve_config(args.model, config)
        if args.model == "mixtral":
            predict.check_moe(experts=cfg.experts, top_k=cfg.top_k, expert_ways=shape.get("expert", 1),
                              expert_imbalance=given.get("expert_imbalance", cfg.expert_imbalance), layers=cfg.layers,
                              **{k: given.get(k, getattr(cfg, k)) for k in ("moe", "moe_dispatch", "shared_experts",
                                                                            "expert_ffn", "dense_layers")})
        if given:
            import dataclasses as _dc

            _dc.replace(cfg, **given)  # the config's own checks (e.g. fp8 with a dropless MoE)
            config = ",".join(f"{f.name}={given.get(f.name, getattr(cfg, f.name))}" for f in _dc.fields(cfg))
        batch = args.batch_size or models.default_batch(shape)
        source = job.ModelSource(args.model, config, shape, args.recipe, batch, args.seq_len,
                                 args.dtype, args.remat, not args.unroll, args.attention, args.commfuse)
        n = math.prod(shape.values())
        given = _hardware(args, n)
        hw = job.mesh_cluster(given, n, grow=args.nodes is None and ":" not in args.hardware)
    except ValueError as err:
        raise _UsageError(str(err)) from None
    if n < hw.gpus_per_node:
        _log(f"mesh {args.mesh} uses {n} of the {hw.gpus_per_node} GPUs of one {hw.name} node; "
             f"the plan is for those {n}")
    elif hw.nodes != given.nodes:
        _log(f"mesh {args.mesh} has {n} devices: {hw.name} grown to {hw.nodes} nodes of "
             f"{hw.gpus_per_node} GPUs")
    return source, hw


def _run_tune(args: argparse.Namespace) -> int:
    _require_positive(args, "batch_size", "seq_len")
    if args.out is not None and pathlib.Path(args.out).exists() and not pathlib.Path(args.out).is_dir():
        raise _UsageError(f"--out {args.out} exists and is not a directory")
    if args.model is not None:
        if args.path is not None or args.example is not None:
            raise _UsageError("give PATH, --example or --model, not several")
        source, hw = _model_source(args)
    else:
        text = _read_text(args)
        _parse_graph(text, args)  # unreadable HLO: one line, exit 2
        source, hw = job.HloSource(text, _where(args), args.partitions), _hardware(args)
    hw = _with_nccl_env(args, hw)
    try:
        tuned = job.run(source, hw, strategy=args.strategy, structures=not args.no_structures, log=_log,
                        space=search.Space(min_gain=args.min_gain))
    except (ValueError, gpu_compile.DevicelessUnavailable) as err:
        raise _UsageError(str(err)) from None
    for warning in tuned.compiled.warnings:
        _log(f"warning: {warning}.")
    plan, results = tuned.plan, tuned.planned.results
    env = api.nccl_env(plan)
    if args.json:
        print(json.dumps({
            "module": plan.module, "hardware": plan.hardware, "strategy": plan.strategy,
            "bound_us": plan.bound_us, "makespan_us": plan.makespan_us,
            "min_gain": plan.min_gain, "held_back_us": plan.held_back_us,
            "strategies": {name: {"makespan_us": r.makespan_us, "evaluations": r.evaluations,
                                  "search_time_s": r.search_time_s,
                                  "speedup": r.makespan_us and plan.speedup_over(name)}
                           for name, r in results.items()},
            "xla_flags": plan.xla_flags(), "nccl_env": env, "compiled_by": tuned.where,
            "verification": [list(v) for v in plan.verification],
            "decisions": [list(d) for d in plan.decisions],
            "collectives": plan.to_dict()["collectives"],
        }))
    else:
        # The XLA_FLAGS line, the NCCL environment and the launch command are pasted: whole, one a line.
        lines: list[str] = [f"module: {tuned.where}", plan.report()]
        if plan.flags:
            lines += ["", "XLA_FLAGS (checked by the installed XLA):", report.Paste(f"  XLA_FLAGS='{plan.xla_flags()}'")]
            if args.no_structures:
                lines.append("  (the structure search did not run: --no-structures)")
        elif args.no_structures:
            lines += ["", "XLA_FLAGS: none to set (the structure search did not run: --no-structures)"]
        else:
            lines += ["", "XLA_FLAGS: none to set (XLA's defaults are the best structure found)"]
        lines.append("NCCL environment (set before the first communicator):")
        lines += [report.Paste(f"  {k}={v}") for k, v in sorted(env.items())]
        if not env:
            lines.append("  none beyond the tuner plugin, which applies the per-collective choices")
        lines.append(f"predicted gain on {plan.cluster} (by the cost model, not measured): " + ", ".join(
            f"{plan.speedup_over(n):.3f}x over {n}" for n in results if n != plan.strategy))
        print(report.wrap(lines))
    if args.out:
        launch = tuned.write(args.out, _log)
        if not args.json:
            print(report.wrap(["", "to run with this plan:", report.Paste(f"  {launch} python train.py"),
                               "  (launch.sh sets XLA_FLAGS, the NCCL environment and the NCCL tuner plugin with "
                               "its config)"]))
    elif not args.json:
        print("\nto run with this plan: add --out DIR, then DIR/launch.sh python train.py")
    return 0


# ----------------------------------------------------------------------------- bench


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="measure the plan against XLA's defaults where the job runs",
        description="Plan a built-in model's step (the same flags as tune --model) for the cluster, then run "
        "each arm (XLA's defaults, the strategies asked for, any --plan folder) as a fresh job under its "
        "launch.sh, interleaved in rounds, and report each arm's median step with a 95%% interval beside "
        "the model's prediction (DIR/report.md, report.json, report.png). Rerun with the same --out to resume.")
    _add_model_args(p)
    p.add_argument("--recipe", default=None, help="sharding recipe (default: from the mesh axes)")
    p.add_argument("--batch-size", type=int, default=None, help="global batch in sequences")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length")
    _add_hardware_args(p, default="h100-sxm-8")
    p.add_argument("--arms", default=",".join(bench_run.STRATEGY_ARMS),
                   help="strategies to measure beside XLA's defaults, comma-separated (default: all of "
                   + ", ".join(bench_run.STRATEGY_ARMS) + ")")
    p.add_argument("--plan", action="append", default=[], metavar="DIR",
                   help="a plan folder (tune --out DIR) to measure as one more arm (repeatable)")
    p.add_argument("--processes", type=int, default=1, help="processes of the job (default 1)")
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="on a host without GPUs: fake CPU devices per process (default: mesh / processes)")
    p.add_argument("--launcher", default="local", choices=launch_lib.LAUNCHERS,
                   help="local: this host starts the processes; srun or mpirun: the cluster's launcher")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out before timing (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every arm, interleaved (default 3)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take (default 1800)")
    p.add_argument("--join-timeout", type=int, default=120,
                   help="seconds every process has to reach jax.distributed's coordinator (default 120)")
    p.add_argument("--search", type=int, default=0, metavar="K",
                   help="instead of --arms: measure the model's K best plans that set different things (structure "
                   "flags, NCCL settings, strategy) and write the fastest measured one as DIR/chosen")
    p.add_argument("--profile", action="store_true",
                   help="trace a few steps of lagom's arm (one more run, untimed) and fit the cluster's profile to "
                   "it (calibrate): DIR/calibrated.json")
    p.add_argument("--recalibrate", action="store_true",
                   help="with --profile's fit: plan lagom again on the calibrated profile and measure it as one more "
                   "arm (lagom-recalibrated)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the arms, measurements and report go")
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="after --: your own program (e.g. -- python train.py ...), whose @lagom_jax.tune step reports "
                   "its step times; the arms are XLA's defaults and each --plan folder")


def _run_bench(args: argparse.Namespace) -> int:
    import math

    program = tuple(args.program[1:] if args.program[:1] == ["--"] else args.program)
    platform = "gpu" if gpu_compile.has_cuda_driver() else "cpu"
    if program:
        if args.model is not None:
            raise _UsageError("give --model or a program after --, not both")
        source, hw, n = None, _hardware(args), args.processes
    else:
        if args.model is None:
            raise _UsageError("give a built-in model (--model ...) or your program after -- (-- python train.py ...)")
        args.commfuse = "off"
        source, hw = _model_source(args)
        n = math.prod(source.shape().values())
    per_process = args.devices_per_process or max(1, n // args.processes)
    try:
        setup = bench_run.BenchSetup(source, processes=args.processes, devices_per_process=per_process,
                                     steps=args.steps, warmup=args.warmup, rounds=args.rounds, launcher=args.launcher,
                                     timeout_s=args.timeout, join_timeout_s=args.join_timeout, program=program)
        if source is not None and platform == "cpu" and args.processes * per_process != n:
            raise ValueError(f"{args.processes} process(es) x {per_process} devices is not the mesh's {n} devices")
        strategies = tuple(a for a in args.arms.split(",") if a and a != "xla-default")
        made = bench_run.bench(setup, hw, args.out, plans=tuple(pathlib.Path(p) for p in args.plan),
                               strategies=strategies, platform=platform, log=_log, search_k=args.search,
                               profile=args.profile, recalibrate=args.recalibrate)
    except (ValueError, gpu_compile.DevicelessUnavailable) as err:
        raise _UsageError(str(err)) from None
    print(made.markdown())
    print(report.wrap(f"report: {pathlib.Path(args.out) / 'report.md'} (and report.json, report.png)"))
    return 0


# ----------------------------------------------------------------------------- build-tuner


def _add_build_tuner(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build-tuner", help="compile the NCCL tuner plugin",
                       description="Compile lagom-jax's NCCL tuner plugin (plain C, no NCCL "
                       "needed) and print the NCCL_TUNER_PLUGIN line to launch with.")
    p.add_argument("--out", metavar="DIR", help="where to put the plugin (default: ~/.cache/lagom-jax)")


def _run_build_tuner(args: argparse.Namespace) -> int:
    try:
        so = nccl_tuner.build_tuner(args.out)
    except nccl_tuner.TunerBuildError as err:
        raise _UsageError(str(err)) from None
    print(f"NCCL_TUNER_PLUGIN={so}")
    print(f"# and {nccl_tuner.CONFIG_ENV}=<plan's nccl_tuner.conf> (lagom-jax tune --out DIR writes it)")
    return 0


# ----------------------------------------------------------------------------- profile


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure this machine's GPU and write a HardwareProfile",
                       description="Measure GEMM and HBM throughput and the slowdown of a GEMM "
                       "beside a k-CTA copy kernel on the default backend, fit the cost model's "
                       "terms, and write hardware.json (use it as --hardware FILE) and raw.json. "
                       "On a CPU it measures CPU numbers and says so.")
    p.add_argument("--out", metavar="DIR", default="lagom-profile", help="output directory")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--base", default=None, metavar="PRESET",
                   help="preset to start from (default: from the GPU's name)")


def _run_profile(args: argparse.Namespace) -> int:
    try:
        path = profile.run_profile(args.out, quick=args.quick, base=args.base,
                                   progress=_stderr)
    except profile.ProfileError as err:
        raise _UsageError(str(err)) from None
    print(path)
    return 0


# ----------------------------------------------------------------------------- advise


def _add_advise(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("advise", help="recommend a parallel configuration for a model",
                       description="ConfigTuner-style advice, one search for every built-in model: the "
                       "meshes (data x fsdp x model x expert), per-device batch x gradient accumulation, remat "
                       "policies and attention that arithmetic does not rule out are screened in closed form, "
                       "the screen calibrated on the compiled steps as they come in; those it keeps are "
                       "compiled with XLA's GPU pipeline for the cluster's GPUs (deviceless), their memory read "
                       "from XLA and checked against the GPU's memory x XLA_PYTHON_CLIENT_MEM_FRACTION, and the "
                       "fitting ones ranked by predict_train_step_ms's prediction. All times are predicted.")
    p.add_argument("--model", required=True, choices=("llama", "mixtral", "gpt", "gpt2", "bert", "t5"))
    p.add_argument("--config", default=None, help="a named size (llama3-70b, mixtral-8x7b, 355M, large, ...) or "
                   "dimensions layers=80,d_model=8192,heads=64,kv_heads=8,ffn=28672,vocab=128256 "
                   "(default: the smallest real size)")
    p.add_argument("--devices", "--gpus", dest="devices", type=int, default=8, help="number of GPUs (default 8)")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--hardware", default="h100-sxm-8",
                   help="a preset, NAME:nodes=N, or a HardwareProfile JSON file")
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="share of GPU memory XLA gets (default: XLA_PYTHON_CLIENT_MEM_FRACTION, else JAX's 0.75)")
    p.add_argument("--mesh", default=None, help="your configuration's mesh, e.g. fsdp=32,model=8 (then "
                   "--per-device-batch, --grad-accum, --remat): evaluated and compared")
    p.add_argument("--per-device-batch", type=int, default=None,
                   help="your sequences per data x fsdp x expert rank per micro-step")
    p.add_argument("--grad-accum", type=int, default=None, help="your gradient-accumulation steps")
    p.add_argument("--remat", default="full", choices=tuple(pipeline.REMAT_POLICIES), help="your remat policy")
    p.add_argument("--attention", default=None, choices=("flash", "xla"), help="your attention")
    p.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: the CPU count)")
    p.add_argument("--top", type=int, default=10, help="rows shown (default 10)")
    p.add_argument("--mesh-finalists", type=int, default=advise.DEFAULT_MESH_FINALISTS,
                   help=f"meshes searched in full after the probe (default {advise.DEFAULT_MESH_FINALISTS})")
    p.add_argument("--max-probes", type=int, default=advise.DEFAULT_MAX_PROBES,
                   help=f"meshes probed, fastest by a closed-form screen first (default {advise.DEFAULT_MAX_PROBES})")
    p.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=None,
                   help="search pipeline stages (GPipe over a stage axis; default: on for gpt2, bert and t5, "
                   "off for llama, mixtral and gpt)")
    p.add_argument("--no-tune", action="store_true", help="skip tuning the best candidate with the pipeline")
    p.add_argument("--out", default=None, metavar="DIR", help="write the tuned plan's artifacts (launch.sh) here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _run_advise(args: argparse.Namespace) -> int:
    _require_positive(args, "devices", "global_batch", "seq_len", "top", "mesh_finalists", "max_probes", "jobs",
                      "per_device_batch", "grad_accum")
    current = None
    if args.mesh:
        current = {"mesh": models.parse_mesh(args.mesh), "per_device_batch": args.per_device_batch,
                   "grad_accum": args.grad_accum, "remat": args.remat}
        if args.attention:
            current["attention"] = args.attention
    try:
        result = advise.advise(
            args.model, args.config, gpus=args.devices, hardware=args.hardware, global_batch=args.global_batch,
            seq_len=args.seq_len, current=current, memory_fraction=args.memory_fraction, top=args.top,
            jobs=args.jobs, mesh_finalists=args.mesh_finalists, max_probes=args.max_probes, tune=not args.no_tune,
            pipeline=args.pipeline,
            progress=_stderr)
    except (ValueError, gpu_compile.DevicelessUnavailable) as err:
        raise _UsageError(str(err).splitlines()[0]) from None
    if args.out and result.tuned is not None:
        launch = result.tuned.write(args.out, log=_log)
        print(f"wrote {launch}", file=sys.stderr)
    print(result.to_json() if args.json else result.report(args.top))
    return 0


# ---------------------------------------------------------------------------- predict


# Without --model: a Megatron-LM GPT configuration (its ``hidden`` is --d-model).
_PREDICT_INTS = ("d_model", "heads", "layers", "seq_len", "vocab", "gpus", "tp", "dp", "pp",
                 "micro_batch", "global_batch")
# predict --model: the contract's arguments (lagom_jax.predict_train_step_ms).
_CONTRACT_INTS = ("layers", "d_model", "heads", "kv_heads", "ffn", "vocab", "seq_len", "global_batch",
                  "experts", "top_k")
# Each dimension's options (the first is its name) and help.
_DIMENSIONS = {
    "layers": (("--layers",), "transformer layers"),
    "d_model": (("--d-model", "--hidden"), "model width (Megatron's hidden size)"),
    "heads": (("--heads",), "attention heads"),
    "kv_heads": (("--kv-heads",), "--model: key/value heads (grouped-query attention; default --heads)"),
    "ffn": (("--ffn", "--ffn-hidden"), "FFN width (without --model, default 4 x --d-model)"),
    "vocab": (("--vocab",), "vocabulary size (without --model, default 51200)"),
    "seq_len": (("--seq-len",), "tokens per sequence"),
    "global_batch": (("--global-batch",), "sequences per step, all GPUs together"),
    "gpus": (("--gpus",), "without --model: GPUs of the job"),
    "tp": (("--tp",), "without --model: tensor-parallel ways"),
    "dp": (("--dp",), "without --model: data-parallel ways"),
    "pp": (("--pp",), "without --model: pipeline stages"),
    "micro_batch": (("--micro-batch",), "without --model: sequences per micro-batch"),
    "experts": (("--experts",), "--model mixtral: experts per MoE layer"),
    "top_k": (("--top-k",), "--model mixtral: experts each token is routed to"),
}


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict the step time of a Llama/Mixtral/GPT job, or of a "
                       "Megatron-LM GPT configuration",
                       description="With --model llama|mixtral|gpt: compile the family's training step "
                       "with XLA's GPU pipeline for the cluster (deviceless) and predict its step time "
                       "(lagom_jax.predict_train_step_ms). Without --model: milliseconds per iteration "
                       "of a GPT configuration in Megatron-LM's terms (tensor x data x pipeline "
                       "parallel, micro-batch, global batch), with its parts. Predicted by the cost "
                       "model, never measured.")
    p.add_argument("--model", choices=tuple(predict.FAMILY_MODELS),
                   help="predict a built-in family's step compiled for the cluster (the contract)")
    p.add_argument("--hlo", metavar="PATH", help="predict an HLO module's step (compiled for the cluster "
                   "first when it is HLO before optimization; lagom_jax.predict_hlo_step_ms)")
    p.add_argument("--nodes", type=int, default=None, help="--hlo: nodes of the cluster (default: from the module)")
    _add_moe_args(p)
    _add_quantization_arg(p)
    for name in dict.fromkeys(_PREDICT_INTS + _CONTRACT_INTS):
        flags, what = _DIMENSIONS[name]
        p.add_argument(*flags, dest=name, type=int, default=None, help=what)
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"))
    p.add_argument("--recompute", default="auto", choices=("auto", "none", "selective", "full"),
                   help="activation recomputation; auto: the cheapest that fits in memory")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism; with --model, the residual sharded over the model axis "
                   "(all-gather before and reduce-scatter after each tensor-parallel sublayer, as MaxText's "
                   "tensor parallelism runs)")
    p.add_argument("--mesh", help="--model: e.g. fsdp=16 or data=2,fsdp=8 (axes data, fsdp, context, model, expert)")
    p.add_argument("--context-parallel", default="all-gather", choices=("all-gather", "ring"),
                   help="--model llama with a context axis: keys/values all-gathered (MaxText's default) or "
                   "passed around a ring; needs --attention xla")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--remat", default="full", choices=tuple(pipeline.REMAT_POLICIES),
                   help="--model: remat policy by MaxText's name (default full)")
    p.add_argument("--attention", default="flash", choices=("flash", "xla"),
                   help="--model: flash, the fused kernel (default); xla, the score matrix materialised")
    p.add_argument("--xla-flag", action="append", default=[], metavar="NAME=VALUE",
                   help="--model: an XLA flag applied to the compile (repeatable)")
    _add_nccl_env_arg(p)
    p.add_argument("--strategy", default="xla-default", choices=("xla-default", "lagom"),
                   help="--model: the step as XLA compiles it, or as lagom-jax tunes it")
    p.add_argument("--hardware", default=None,
                   help="a preset, NAME:nodes=N, or a HardwareProfile JSON file (default a100-sxm-8; "
                   "with --model h100-sxm-8, nodes from the mesh)")
    p.add_argument("--rank", type=int, default=None, metavar="N",
                   help="without --model: leave out --tp/--dp/--pp/--micro-batch and list the N "
                   "fastest splits of --gpus that fit (micro-batch 1, 2, 4, 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _flag_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return int(low) if low.lstrip("-").isdigit() else text.strip()


def _run_predict(args: argparse.Namespace) -> int:
    if args.hlo is not None:
        return _run_predict_hlo(args)
    if args.model is not None:
        return _run_predict_model(args)
    if args.rank is not None:
        return _run_predict_rank(args)

    kw, options = _megatron_args(args, _PREDICT_INTS, "without --model, give ")
    try:
        step = advise.predict_step(**kw, **options)
    except (ValueError, OSError) as err:
        raise _UsageError(str(err)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(step) | {"config": kw}, indent=2))
    else:
        print(report.wrap(f"predicted {step.total_ms:.1f} ms per iteration on {kw['gpus']} GPUs of "
                          f"{options['hardware']}: {step.describe()}"))
    return 0


_SPLIT_INTS = ("tp", "dp", "pp", "micro_batch")


def _megatron_args(args: argparse.Namespace, names: tuple[str, ...] | list[str],
                   missing_says: str) -> tuple[dict[str, int], dict[str, Any]]:
    """The Megatron configuration's numbers ``names`` (vocab defaults to 51,200; any other
    left out is a usage error starting with ``missing_says``) and the options beside them."""
    missing = [n for n in names if n != "vocab" and getattr(args, n) is None]
    if missing:
        raise _UsageError(missing_says + ", ".join("--" + n.replace("_", "-") for n in missing))
    kw = {("hidden" if name == "d_model" else name): getattr(args, name) for name in names}
    kw["vocab"] = kw["vocab"] or 51200
    return kw, dict(hardware=args.hardware or "a100-sxm-8", schedule=args.schedule,
                    recompute=args.recompute, ffn_hidden=args.ffn,
                    sequence_parallel=args.sequence_parallel)


def _run_predict_rank(args: argparse.Namespace) -> int:
    given = [n for n in _SPLIT_INTS if getattr(args, n) is not None]
    if given:
        raise _UsageError("--rank searches " + ", ".join("--" + n.replace("_", "-") for n in _SPLIT_INTS)
                          + "; leave out " + ", ".join("--" + n.replace("_", "-") for n in given))
    if args.rank < 1:
        raise _UsageError(f"--rank must be at least 1, got {args.rank}")

    kw, options = _megatron_args(args, [n for n in _PREDICT_INTS if n not in _SPLIT_INTS], "--rank needs ")
    try:
        ranked = advise.rank_steps(**kw, **options)
    except (ValueError, OSError) as err:
        raise _UsageError(str(err)) from None
    top = ranked[:args.rank]
    if args.json:
        print(json.dumps([dataclasses.asdict(step) | {"config": kw | config} for config, step in top], indent=2))
        return 0
    print(report.wrap(f"{len(ranked)} splits of {kw['gpus']} GPUs run and fit (advise's meshes without fsdp: "
                      "tensor-parallel inside a node, priced by Megatron-LM's iteration model); the "
                      f"{len(top)} fastest (predicted):"))
    print(f"{'rank':>4} {'tp':>3} {'dp':>3} {'pp':>3} {'mb':>3} {'ms/iter':>9} {'vs best':>8}  "
          "recompute  GB/GPU  layers bound by")
    best = top[0][1].total_ms
    for i, (c, st) in enumerate(top, 1):
        bound = "host" if st.host_bound else "GPU"
        print(f"{i:>4} {c['tp']:>3} {c['dp']:>3} {c['pp']:>3} {c['micro_batch']:>3} {st.total_ms:>9.1f} "
              f"{st.total_ms / best - 1:>+8.1%}  {st.recompute:<9}  {st.memory_gb:>6.1f}  {bound}")
    return 0


def _name_values(items: list[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` arguments of a repeatable ``option``, by name."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise _UsageError(f"{option} {item!r}: expected NAME=VALUE")
        out[name.strip()] = value
    return out


def _xla_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {name: _flag_value(value) for name, value in _name_values(args.xla_flag, "--xla-flag").items()}


def _nccl_env(args: argparse.Namespace) -> dict[str, str]:
    """``--nccl-env`` by name; NcclEnv refuses a bad name or value where it is read."""
    return {name: value.strip() for name, value in _name_values(args.nccl_env, "--nccl-env").items()}


def _with_nccl_env(args: argparse.Namespace, hw: hardware.HardwareProfile) -> hardware.HardwareProfile:
    """``hw`` running the NCCL settings of ``--nccl-env``: the plan is searched inside them
    (a CTA cap bounds every collective's channels) and carries them into its environment."""
    env = _nccl_env(args)
    if not env:
        return hw
    try:
        pinned = nccl_env_lib.pinned(hw.nccl_env, env)
    except ValueError as err:
        raise _UsageError(str(err)) from None
    for line in nccl_env_lib.unpriced(env):
        _log(line)
    return dataclasses.replace(hw, nccl_env=pinned)


def _run_predict_hlo(args: argparse.Namespace) -> int:
    _require_positive(args, "nodes")
    flags, env = _xla_flags(args), _nccl_env(args)
    try:
        done = predict.hlo_step_job(args.hlo, hardware=args.hardware or "h100-sxm-8", nodes=args.nodes,
                                    xla_flags=flags, strategy=args.strategy, nccl_env=env)
    except (ValueError, OSError, gpu_compile.DevicelessUnavailable, hlo.HloParseError) as err:
        raise _UsageError(f"{args.hlo}: {err}") from None
    predict.warn_unpriced(done, args.hlo)
    ms, plan = done.predicted_ms(args.strategy), done.plan
    if args.json:
        print(json.dumps({"hlo": args.hlo, "hardware": plan.hardware, "nodes": plan.nodes,
                          "gpus_per_node": plan.gpus_per_node, "xla_flags": flags, "nccl_env": env,
                          "strategy": args.strategy, "predicted_ms": ms}, indent=2))
    else:
        print(report.wrap(f"predicted {ms:.3f} ms per step on {plan.cluster} ({args.hlo}, {args.strategy}; "
                          f"{done.where}; predicted by the cost model)"))
    return 0


def _run_predict_model(args: argparse.Namespace) -> int:
    need = ("layers", "d_model", "heads", "ffn", "vocab", "seq_len", "global_batch")
    missing = [n for n in need if getattr(args, n) is None]
    if missing or not args.mesh:
        raise _UsageError("--model needs " + ", ".join("--" + n.replace("_", "-") for n in (*missing, "mesh")
                                                       if n != "mesh" or not args.mesh))
    flags, env = _xla_flags(args), _nccl_env(args)
    kw = {n: getattr(args, n) for n in need}
    kw.update(kv_heads=args.kv_heads or args.heads, experts=args.experts or 0, top_k=args.top_k or 0)
    kw.update(_config_options(args))
    try:
        mesh = models.parse_mesh(args.mesh)
        done = predict.train_step_job(args.model, **kw, mesh=mesh, hardware=args.hardware or "h100-sxm-8",
                                      dtype=args.dtype, remat=args.remat, xla_flags=flags,
                                      strategy=args.strategy, nccl_env=env, attention=args.attention,
                                      context_parallel=args.context_parallel,
                                      sequence_parallel=args.sequence_parallel)
        ms = done.predicted_ms(args.strategy)
    except (ValueError, OSError, gpu_compile.DevicelessUnavailable) as err:
        raise _UsageError(str(err)) from None
    predict.warn_unpriced(done, args.model)
    if args.json:
        print(json.dumps({"family": args.model, **kw, "mesh": mesh, "hardware": args.hardware or "h100-sxm-8",
                          "dtype": args.dtype, "remat": args.remat, "attention": args.attention,
                          "xla_flags": flags, "nccl_env": env, "strategy": args.strategy, "predicted_ms": ms}, indent=2))
    else:
        print(report.wrap(f"predicted {ms:.1f} ms per step on {done.plan.cluster} ({args.model}, mesh {args.mesh}, "
                          f"{args.strategy}; compiled by XLA's GPU pipeline for the cluster, predicted by the cost "
                          "model)"))
    return 0


# -------------------------------------------------------------------------- calibrate


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="fit the cost model to a profiler trace of your step or to nccl-tests logs",
                       description="From a trace: read a JAX profiler trace (the *.xplane.pb jax.profiler.trace "
                       "writes) of a few steps of the module --hlo, match its ops to the module's "
                       "instructions, fit the hardware's matmul rate, HBM bandwidth and link "
                       "bandwidths to what was measured. From nccl-tests (--nccl-tests DIR): read every "
                       "all_reduce/all_gather/reduce_scatter/alltoall/sendrecv _perf log under DIR, at any node "
                       "count, and fit the preset's network and NVLink terms to them. Either way: report the "
                       "error before and after and write a HardwareProfile that --hardware accepts.")
    p.add_argument("trace_dir", metavar="TRACE_DIR", nargs="?", help="a profiler trace folder (or --nccl-tests)")
    p.add_argument("--hlo", metavar="MODULE",
                   help="the traced step's HLO text (compiled.as_text() or an XLA dump); needed with TRACE_DIR")
    p.add_argument("--nccl-tests", metavar="DIR", dest="nccl_tests",
                   help="a folder (or file) of nccl-tests output to fit the collective terms to")
    p.add_argument("--hardware", default="h100-sxm-8", help="the preset or profile to start from")
    p.add_argument("--out", default="profile.json", help="where to write the profile (default profile.json)")


def _run_calibrate(args: argparse.Namespace) -> int:
    if (args.trace_dir is None) == (args.nccl_tests is None):
        raise _UsageError("give a profiler trace (TRACE_DIR --hlo MODULE) or nccl-tests logs (--nccl-tests DIR), "
                          "one of them")
    if args.nccl_tests is not None:
        return _calibrate_nccl_tests(args)
    if args.hlo is None:
        raise _UsageError("a trace needs the traced step's HLO: --hlo MODULE")
    try:
        hw = hardware.resolve_cluster(args.hardware).hardware
        result = calibrate.calibrate(args.trace_dir, calibrate.module_text(args.hlo), hw)
    except (ValueError, hlo.HloParseError) as err:
        raise _UsageError(str(err)) from None
    result.profile.save(args.out)
    print(f"{result.matched} ops of the module matched over {result.steps} traced executions")
    print(result.table())
    print(f"wrote {args.out}: matmul {result.profile.achieved_tflops:.3g} TFLOP/s, HBM "
          f"{result.profile.achieved_hbm_gbps:.3g} GB/s, NVLink/PCIe bus "
          f"{result.profile.intra_busbw_gbps:.3g} GB/s; use it with --hardware {args.out}")
    return 0


def _calibrate_nccl_tests(args: argparse.Namespace) -> int:
    try:
        hw = hardware.resolve_cluster(args.hardware).hardware
        samples, skipped = nccl_tests.read_dir(args.nccl_tests, gpus_per_node=hw.gpus_per_node)
        runs = sorted({(s.kind, s.ranks, s.nodes) for s in samples})
        print(f"read {len(samples)} sizes of {len(runs)} nccl-tests run(s): "
              + ", ".join(f"{k} over {n} ranks on {nodes} node(s)" for k, n, nodes in runs))
        for why in skipped:
            print(f"skipped {why}")
        result = nccl_tests.fit(samples, hw)
    except ValueError as err:
        raise _UsageError(str(err)) from None
    result.profile.save(args.out)
    print(result.table())
    for why in result.kept:
        print(f"kept the preset's terms: {why}")
    changed = ", ".join(f"{f} {old:.3g} -> {new:.3g}" for f, old, new in result.changed) or "nothing"
    print(f"wrote {args.out} ({changed}); use it with --hardware {args.out}")
    return 0


_SUBCOMMANDS: dict[str, tuple[Callable, Callable[[argparse.Namespace], int]]] = {
    "analyze": (_add_analyze, _run_analyze),
    "simulate": (_add_simulate, _run_simulate),
    "tune": (_add_tune, _run_tune),
    "build-tuner": (_add_build_tuner, _run_build_tuner),
    "profile": (_add_profile, _run_profile),
    "advise": (_add_advise, _run_advise),
    "predict": (_add_predict, _run_predict),
    "calibrate": (_add_calibrate, _run_calibrate),
    "bench": (_add_bench, _run_bench),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lagom-jax",
        description="Contention-aware tuning of communication/computation overlap for JAX.",
    )
    parser.add_argument("--verbose", action="store_true",
                        help="also show XLA's own log lines (kept off the terminal by default)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in _SUBCOMMANDS.values():
        add(sub)
    return parser


def _note(command: str, message: Any, category: type[Warning], filename: str, lineno: int,
          file: Any = None, line: str | None = None) -> None:
    """lagom-jax's own warnings (an assumed network, unpriced calls, settings priced as nothing)
    as one line each on stderr; any other warning as Python shows it."""
    ours = (predict.AssumedNetworkWarning, predict.PricingWarning, custom_calls.UnpricedWarning, api.TuningWarning)
    if issubclass(category, ours):
        print(f"lagom-jax {command}: note: {message}", file=file or sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), file=file or sys.stderr, end="")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lagom-jax``; returns the exit status (2 for bad input)."""
    args = build_parser().parse_args(argv)
    _Clock.reset()
    if argv is None:  # the console script: a process of its own, whose stderr we may filter
        quiet.filter_stderr(xla_logs=args.verbose)
    if argv is None and hasattr(signal, "SIGPIPE"):
        # `lagom-jax ... | head` should end quietly, like other command-line tools.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = functools.partial(_note, args.command)
            return _SUBCOMMANDS[args.command][1](args)
    except _UsageError as e:
        print(f"lagom-jax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lagom-jax {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
