"""The deviceless XLA:GPU compile against the real one, on one GPU.

Run on a machine with one NVIDIA GPU::

    python -m benchmarks.gpu_compile_check --out DIR

1. **Same step, two compiles.** GPT-2 (tiny, 124M) under ``dp`` on a mesh of one device is
   compiled on the real GPU (dumping its gemm autotuning results with
   ``xla_gpu_dump_autotune_results_to``) and deviceless for one abstract GPU of the preset
   (``lagom_jax.gpu_compile``), once with XLA's defaults and once loading the real
   autotuning results (``xla_gpu_load_autotune_results_from``). The modules are compared by
   what the cost model reads: gemms by implementation (cuBLAS custom-call or Triton fusion,
   with the Triton tile), fusion kinds, opcode counts, and whether the texts are identical
   once metadata and the module name are removed.
2. **Flags on a real compile.** In a child process the real GPU is multiplied into 8 mock
   devices (``jax_mock_gpu_topology``; compile only), and GPT-2 tiny ``dp+tp`` is compiled
   with XLA's defaults, ``xla_gpu_enable_latency_hiding_scheduler=false`` and
   ``xla_gpu_threshold_for_windowed_einsum_mib=0``; the same three compiles run deviceless
   for 8 abstract GPUs. Each variant says whether it changed the module.

Writes ``gpu_compile_check.json`` (and the tiny modules, for fixtures) to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import subprocess
import sys
import traceback
from typing import Any

PRESET = "h100-sxm-8"
FLAG_VARIANTS = {
    "default": {},
    "lhs_off": {"xla_gpu_enable_latency_hiding_scheduler": False},
    "windowed_einsum_0": {"xla_gpu_threshold_for_windowed_einsum_mib": 0},
}


def normalise(text: str) -> str:
    """The module without metadata, the module name line and backend-config ids that
    differ between otherwise identical compiles."""
    text = re.sub(r",? metadata=\{[^}]*\}", "", text)
    text = re.sub(r"^HloModule \S+", "HloModule m", text, flags=re.M)
    return text


# A Triton gemm fusion and its tile config (deviceless: XLA's default tiles; real: autotuned).
_TRITON_GEMM = re.compile(r'"kind":"(__triton_gemm|__triton_nested_gemm_fusion)",?(.*?)\}\},')


def summary(text: str) -> dict[str, Any]:
    """Gemms by implementation, fusion kinds and opcode counts of one module."""
    ops: collections.Counter[str] = collections.Counter()
    for m in re.finditer(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*? ([a-z][\w\-]*)\(", text, re.M):
        ops[m.group(1)] += 1
    fusion_kinds = collections.Counter(re.findall(r"kind=(k\w+)", text))
    cublas = re.findall(r'custom_call_target="(__cublas[^"]*)"', text)
    triton = [config for _, config in _TRITON_GEMM.findall(text)]
    return {"opcodes": dict(ops.most_common()), "fusion_kinds": dict(fusion_kinds),
            "cublas_gemms": len(cublas), "cublas_targets": sorted(set(cublas)),
            "triton_gemms": len(triton), "triton_configs": triton,
            "lines": text.count("\n")}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    same_tiles = sum((collections.Counter(a["triton_configs"]) & collections.Counter(b["triton_configs"])).values())
    return {"same_gemm_split": (a["cublas_gemms"], a["triton_gemms"]) == (b["cublas_gemms"], b["triton_gemms"]),
            "triton_tiles_in_common": same_tiles,
            "fusion_kinds_equal": a["fusion_kinds"] == b["fusion_kinds"],
            "opcode_diff": {k: (a["opcodes"].get(k, 0), b["opcodes"].get(k, 0))
                            for k in sorted(set(a["opcodes"]) | set(b["opcodes"]))
                            if a["opcodes"].get(k, 0) != b["opcodes"].get(k, 0)}}


def same_step_two_compiles(out: pathlib.Path, configs: tuple[str, ...]) -> dict[str, Any]:
    import jax

    from lagom_jax import gpu_compile, hardware, models

    hw = hardware.get(PRESET)
    abstract = gpu_compile.devices(hw, 1)
    results = {}
    for config in configs:
        seq = None if config == "tiny" else 512
        tune_file = out / f"autotune_{config}.textproto"

        def build(devices):
            return models.build("gpt2", config, "dp", "data=1", devices=devices, dtype="bfloat16",
                                batch_size=8, seq_len=seq)

        real = build(jax.devices()[:1]).compiled_text({"xla_gpu_dump_autotune_results_to": str(tune_file)})
        deviceless = build(abstract).compiled_text()
        loaded = (build(abstract).compiled_text({"xla_gpu_load_autotune_results_from": str(tune_file)})
                  if tune_file.exists() else None)
        s_real, s_dl = summary(real), summary(deviceless)
        r = {"real": s_real, "deviceless": s_dl, "deviceless_vs_real": compare(s_dl, s_real),
             "identical": normalise(real) == normalise(deviceless),
             "autotune_file_written": tune_file.exists()}
        if loaded is not None:
            s_ld = summary(loaded)
            r.update(deviceless_autotuned=s_ld, autotuned_vs_real=compare(s_ld, s_real),
                     autotuned_identical=normalise(real) == normalise(loaded))
        if config == "tiny":
            (out / "real_tiny.hlo").write_text(real)
            (out / "deviceless_tiny.hlo").write_text(loaded or deviceless)
        results[config] = r
        print(f"compile {config}: real {s_real['cublas_gemms']} cuBLAS + {s_real['triton_gemms']} Triton gemms; "
              f"deviceless {s_dl['cublas_gemms']} + {s_dl['triton_gemms']}; identical={r['identical']}; "
              f"autotuned identical={r.get('autotuned_identical')}", flush=True)
    return results


def _flag_effects(build_devices: Any) -> dict[str, Any]:
    from lagom_jax import graph, models

    built = models.build("gpt2", "tiny", "dp+tp", "data=4,model=2", devices=build_devices, dtype="bfloat16",
                         batch_size=8)
    texts = {name: built.compiled_text(opts) for name, opts in FLAG_VARIANTS.items()}
    base = normalise(texts["default"])
    out = {}
    for name, text in texts.items():
        step = graph.from_hlo_text(text)
        out[name] = {"changed_module": normalise(text) != base,
                     "collectives": dict(collections.Counter(t.kind for t in step.collectives)),
                     "windowed_loop": bool(re.search(r"while\(", text)) and "collective-permute" in text}
    return out


def _mock_child() -> None:
    import jax

    jax.config.update("jax_mock_gpu_topology", "1x8x1")
    devices = jax.devices()
    if len(devices) != 8:
        raise SystemExit(f"mock topology gave {len(devices)} devices, not 8")
    print(json.dumps(_flag_effects(devices)))


def flags_real_and_deviceless() -> dict[str, Any]:
    from lagom_jax import gpu_compile, hardware

    result: dict[str, Any] = {"deviceless": _flag_effects(gpu_compile.devices(hardware.get(PRESET)))}
    child = subprocess.run([sys.executable, "-m", "benchmarks.gpu_compile_check", "--mock-child"],
                           capture_output=True, text=True, timeout=400)
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
    if child.returncode or not lines:
        result["real_mock_8"] = {"error": (child.stderr or child.stdout)[-2000:]}
    else:
        result["real_mock_8"] = json.loads(lines[-1])
    for where in ("deviceless", "real_mock_8"):
        r = result[where]
        if "error" not in r:
            print(f"flags ({where}): " + ", ".join(f"{k} changed={v['changed_module']}" for k, v in r.items()),
                  flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=False, default="gpu_compile_check")
    ap.add_argument("--configs", default="tiny,124M")
    ap.add_argument("--parts", default="compile,flags")
    ap.add_argument("--mock-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mock_child:
        _mock_child()
        return 0
    import jax

    if jax.default_backend() != "gpu":
        print("gpu_compile_check: needs a GPU (the real compile is half of the comparison)", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    parts = {"compile": lambda: same_step_two_compiles(out, tuple(args.configs.split(","))),
             "flags": flags_real_and_deviceless}
    for name in args.parts.split(","):
        try:
            report[name] = parts[name]()
        except Exception:  # noqa: BLE001 - one part's failure is a result too
            report[name] = {"error": traceback.format_exc()[-3000:]}
            print(f"{name}: FAILED\n{report[name]['error']}", flush=True)
    (out / "gpu_compile_check.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
