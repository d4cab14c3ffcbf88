"""The expert exchange as XLA runs it on one 8-GPU B200 node: ragged all-to-all against a ring.

marin-community/marin measured one MoE step on 8 B200 with two expert-parallel exchanges
(`.agents/logbooks/7012-b200-moe-mfu.md` @0717914d, entries B200MFU-017/-018): a 26-layer,
64-expert top-4 MoE (d_model 2560, batch 128 x 4096, full recompute) took 51.0 / 27.3 / 15.6 s
a step at EP 2 / 4 / 8 with `jax.lax.ragged_all_to_all` (XLA's one-shot kernel, its default
inside one host), against 3.73 / 3.69 / 3.85 s with a ring (all-gather + psum_scatter over
the expert axis, a grouped GEMM locally). A profile put 297 ms on each one-shot call at EP 2.

Here the mixtral family builds that step (`moe_dispatch` "ragged-all-to-all" and "ring",
`moe="grouped"`), compiles it deviceless for 8 B200 and predicts it under XLA's defaults.
The one-shot kernel is priced at the B200's `ragged_one_shot_gbps`, which comes from that
EP 2 profile (a kernel measurement, not a step time); EP 4 and EP 8 are predicted by how
the kernel's time scales (each peer's block, one CTA a peer, all peers at once). Recorded:
predicted steps and the ragged / ring step ratio beside the measured one, and what the step
is predicted at with XLA's flag that sends the exchange through NCCL instead.

Dimensions not in the logbook entries are those of the same team's 26-layer MoE on 8 H100
(`.agents/logbooks/7079-fp8-loss-val.md`, FP8VAL-001: 20 heads, experts of width 1280, one
shared expert of 1280, vocab 128256), and the 20 KV heads assumed there.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

from ..common import machine_line, write_section

LOGBOOK = "marin-community/marin .agents/logbooks/7012-b200-moe-mfu.md (B200MFU-017/-018)"
STEP = dict(family="mixtral", layers=26, d_model=2560, heads=20, kv_heads=20, ffn=1280, vocab=128256,
            experts=64, top_k=4, shared_experts=1, expert_ffn=1280, seq_len=4096, global_batch=128,
            hardware="b200-sxm-8", remat="full", moe="grouped")
# Both runs' local expert GEMMs were Pallas-Triton ``ragged_dot`` (B200MFU-017), which marin
# measured about 1.6x slower than the QuACK/cuDNN grouped GEMMs on GB200 (marin issue #8311): the
# grouped GEMMs' stand-in is priced at the B200's QuACK rate over that.
PALLAS_TRITON_SLOWDOWN = 1.6
# EP -> measured step (s): ragged all-to-all (XLA's one-shot kernel), ring.
MEASURED_S = {2: (51.0, 3.73), 4: (27.3, 3.69), 8: (15.6, 3.85)}
TOLERANCE = 0.25  # issue 78's goal: each ratio within 25% of the measured one
NCCL_INSTEAD = {"xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel": False}
# The same logbook's control without expert parallelism (B200MFU-017: "ctl sonic_cute EP1 15.14 % /
# 3.28 s"): FSDP over the 8 GPUs, QuACK grouped GEMMs, no exchange. Its GPU kernel time by category
# (B200MFU-007, same dimensions): attention 30.3 %, MoE 24.0 %, backward other than attention 27.6 %
# (mostly the recomputed forward), optimizer 4.4 %, NCCL about 10 %; about 9 % of the step idle
# (B200MFU-012).
CONTROL_S = 3.28
CONTROL_ATTENTION_SHARE = 0.303
CONTROL_IDLE_SHARE = 0.09


def predict_pair(ep: int) -> dict[str, Any]:
    """Predicted steps (s) of the ragged and ring exchanges at expert parallelism ``ep``."""
    import dataclasses

    from lagom_jax.advise import predict
    from lagom_jax.cluster import hardware

    b200 = hardware.get(STEP["hardware"])
    hw = dataclasses.replace(b200, grouped_gemm_tflops=b200.grouped_gemm_tflops / PALLAS_TRITON_SLOWDOWN)
    mesh = {"data": 8 // ep, "expert": ep} if ep < 8 else {"expert": 8}
    out: dict[str, Any] = {"ep": ep}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the grouped GEMMs' stand-in calls are named in the notes
        for dispatch in ("ragged-all-to-all", "ring"):
            print(f"[moe_exchange] EP {ep}: {dispatch} ...", file=sys.stderr, flush=True)
            job = predict.train_step_job(**{**STEP, "hardware": hw}, mesh=mesh, moe_dispatch=dispatch,
                                         strategy="xla-default")
            out[dispatch] = job.predicted_ms("xla-default") / 1e3
            if dispatch == "ragged-all-to-all":
                out["calls"], out["call_ms"] = _exchange_calls(job)
                out["nccl"] = predict.repredict_ms(job, xla_flags=NCCL_INSTEAD) / 1e3
    out["seconds"] = time.perf_counter() - start
    return out


def predict_control() -> dict[str, Any]:
    """The EP 1 control predicted: the step (s) and its attention kernels' time (s) in the
    replay (the flash-attention ``pallas_call``s; on B200 the grouped GEMMs are FFI calls)."""
    from lagom_jax.advise import predict

    print("[moe_exchange] EP 1 control (FSDP 8, QuACK grouped GEMMs) ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = predict.train_step_job(**STEP, mesh={"fsdp": 8}, strategy="xla-default")
    result = job.planned.results["xla-default"]
    names = {t.id: t.name for t in result.graph.tasks if t.opcode == "custom-call"}
    attention = sum(iv.end - iv.start for iv in result.timeline.intervals
                    if names.get(iv.task_id, "").startswith("pallas_call"))
    return {"step": job.predicted_ms("xla-default") / 1e3, "attention": attention / 1e6,
            "seconds": time.perf_counter() - start}


def _exchange_calls(job: Any) -> tuple[int, float]:
    """(calls a step, the largest call's time alone in ms) of the step's ragged exchanges."""
    from lagom_jax.costs import cost
    from lagom_jax.program.graph import RAGGED_ALL_TO_ALL

    graph, hw = job.compiled.graph(), job.compiled.hardware
    unrolled = any(t.iteration > 0 for t in graph.tasks)
    calls, longest = 0, 0.0
    for t in graph.collectives:
        shape = graph.shape(t, hw.gpus_per_node)
        if shape.kind != RAGGED_ALL_TO_ALL:
            continue
        calls += 1 if unrolled else max(t.trip_count, 1)
        longest = max(longest, cost.default_time_us(*shape, hw) / 1e3)
    return calls, longest


def section(rows: list[dict[str, Any]], control: dict[str, Any] | None = None) -> str:
    lines = [
        "## moe_exchange (XLA's ragged all-to-all against a ring on 8 B200, predicted beside measured)",
        "",
        f"Machine: {machine_line()}. `python -m benchmarks.measured.moe_exchange`. {LOGBOOK}'s 26-layer, 64-expert "
        "top-4 MoE (d_model 2560, batch 128 x 4096, full recompute) compiled deviceless for 8 B200 with each "
        "exchange (`moe_dispatch`; locally the grouped GEMMs' stand-in at the Pallas-Triton `ragged_dot` rate "
        "both runs used, the B200's QuACK rate / 1.6, marin issue #8311), predicted under XLA's defaults. The "
        "one-shot kernel's rate (2.26 GB/s a peer) comes from the EP 2 profile (297 ms a call), so the EP 2 ratio "
        "is not independent of the measurement; EP 4 and 8 are predicted by the kernel's scaling. 'Through NCCL': "
        "the same ragged step with `xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel=false`, which "
        "no measurement covers.",
        "",
        "| EP | ragged step | ring step | ratio predicted | ratio measured | error | one-shot calls a step, "
        "ms each | ragged through NCCL |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ragged_m, ring_m = MEASURED_S[r["ep"]]
        ratio, measured = r["ragged-all-to-all"] / r["ring"], ragged_m / ring_m
        lines.append(f"| {r['ep']} | {r['ragged-all-to-all']:.2f} s ({ragged_m:.1f}) | {r['ring']:.2f} s ({ring_m:.2f}) "
                     f"| {ratio:.2f}x | {measured:.2f}x | {ratio / measured - 1:+.1%} | {r['calls']}, "
                     f"{r['call_ms']:.1f} | {r['nccl']:.2f} s |")
    errors = [abs((r["ragged-all-to-all"] / r["ring"]) / (MEASURED_S[r["ep"]][0] / MEASURED_S[r["ep"]][1]) - 1)
              for r in rows]
    verdict = "met" if max(errors) <= TOLERANCE else "not met"
    ragged = [r["ragged-all-to-all"] / MEASURED_S[r["ep"]][0] - 1 for r in rows]
    ring = [r["ring"] / MEASURED_S[r["ep"]][1] - 1 for r in rows]
    lines += ["", f"Steps: predicted (measured). Ragged steps within {max(map(abs, ragged)):.1%} of the measured; ring "
              f"steps {min(ring):+.1%} to {max(ring):+.1%}. Goal: every ratio within {TOLERANCE:.0%} of the measured "
              f"one: {verdict} (largest error {max(errors):.1%}). Wall time {sum(r['seconds'] for r in rows):.0f} s."]
    if control:
        attention_s = CONTROL_ATTENTION_SHARE * CONTROL_S * (1 - CONTROL_IDLE_SHARE)  # of the kernel time
        rest_s = CONTROL_S - control["step"] - (attention_s - control["attention"])
        lines += ["", f"Where the ring's miss is: the logbook's control without expert parallelism (FSDP 8, QuACK "
                  f"grouped GEMMs, no exchange; B200MFU-017) is predicted {control['step']:.2f} s against "
                  f"{CONTROL_S:.2f} s measured ({control['step'] / CONTROL_S - 1:+.1%}), the same miss as the ring "
                  "steps': it is in the step's other work, not in the exchange. Attention: predicted "
                  f"{control['attention']:.2f} s against about {attention_s:.2f} s "
                  f"({CONTROL_ATTENTION_SHARE:.1%} of the kernel time, B200MFU-007, the step less its "
                  f"{CONTROL_IDLE_SHARE:.0%} idle, B200MFU-012; FA4's CuTe kernels there, a Pallas flash stand-in "
                  f"here). The rest of the miss, about {rest_s:.1f} s, sits in the recomputed forward, the MuonH "
                  "optimizer (AdamW here) and the idle time, which the logbook gives as shares only; a per-op "
                  "profile of the ring arm would settle it."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, nargs="+", default=sorted(MEASURED_S), choices=sorted(MEASURED_S))
    parser.add_argument("--no-record", action="store_true", help="print the section without writing it")
    args = parser.parse_args(argv)
    rows = [predict_pair(ep) for ep in args.ep]
    text = section(rows, predict_control())
    print(text)
    if not args.no_record:
        write_section("moe_exchange", text)


if __name__ == "__main__":
    main()
