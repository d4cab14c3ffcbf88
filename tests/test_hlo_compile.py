"""HLO before XLA's optimizations: classify it, count its devices, compile it for abstract GPUs."""

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest
import xla_forms

from lagom_jax.cluster import hardware
from lagom_jax.program import gpu_compile, hlo, hlo_compile

HERE = pathlib.Path(__file__).parent / "fixtures" / "hlo"
UNOPT = HERE / "unoptimized"
XLA = HERE / "xla"

MLP8 = UNOPT / "jax_fsdp_mlp_8.after_spmd.hlo"
MLP8_GLOBAL = UNOPT / "jax_fsdp_mlp_8.before_optimizations.hlo"
SCAN16 = UNOPT / "jax_fsdp_scan_16.after_spmd.hlo"
REPLICAS2 = UNOPT / "xla_collective_ops_e2e_replicas_2.hlo"
LLAMA8B_CP = XLA / "hlo_llama3_8b_cp_bf16_1x4__0.hlo"
LLAMA70B = XLA / "hlo_llama31_70b_bf16_16x8__0.hlo"
LLAMA8B_OFFLOAD = XLA / "hlo_llama3_8b_bf16_activation_offloading_1x8__0.hlo"

_REASON = gpu_compile.unavailable_reason()
needs_gpu_compile = pytest.mark.skipif(_REASON is not None, reason=f"no deviceless GPU compile here: {_REASON}")

_ASYNC = re.compile(r"\s([a-z-]+)-start\(")


def _hw(n):
    return hardware.get("h100-sxm-8", max(1, n // 8))


# ------------------------------------------------------------------------ classify


@pytest.mark.parametrize("path", [MLP8, MLP8_GLOBAL, SCAN16, REPLICAS2, LLAMA8B_CP, LLAMA70B, LLAMA8B_OFFLOAD],
                         ids=lambda p: p.name)
def test_modules_before_the_pipeline_are_unoptimized(path):
    unoptimized, why = hlo_compile.classify(path.read_text())
    assert unoptimized, why
    assert "has not run" in why


def test_a_module_compiled_by_xla_cpu_is_not_unoptimized():
    text = jax.jit(lambda x: jnp.tanh(x @ x.T) + 1).lower(jnp.ones((8, 8))).compile().as_text()
    unoptimized, why = hlo_compile.classify(text)
    assert not unoptimized and "is_scheduled" in why


def test_each_sign_of_the_pipeline_is_enough():
    base = MLP8.read_text()
    scheduled = base.replace("HloModule jit_train_step_mlp,", "HloModule jit_train_step_mlp, is_scheduled=true,", 1)
    assert hlo_compile.classify(scheduled) == (False, "the module is scheduled (is_scheduled=true): XLA's pipeline ran")
    # One async all-gather pair (and nothing else changed) makes it compiled.
    ag = re.search(r"  (%all-gather) = (bf16\[256,256\]\{1,0\}) all-gather\((%param)\), (.*)\n", base)
    pair = (f"  %ags = ((bf16[32,256]{{1,0}}), bf16[256,256]{{1,0}}) all-gather-start({ag.group(3)}), {ag.group(4)}\n"
            f"  {ag.group(1)} = {ag.group(2)} all-gather-done(%ags)\n")
    unoptimized, why = hlo_compile.classify(base.replace(ag.group(0), pair))
    assert not unoptimized and "%ags" not in why and "line" in why
    bitcast = base.replace(ag.group(0), ag.group(0) + "  %bc = bf16[65536]{0} bitcast(%all-gather)\n")
    assert hlo_compile.classify(bitcast)[0] is False
    # send/recv are JAX's too: they do not count.
    assert hlo_compile.classify(base)[0] is True


def test_classify_rejects_text_that_is_not_hlo():
    with pytest.raises(ValueError):
        hlo_compile.classify("HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0\n}\n")


# ------------------------------------------------------------------------ partitions


@pytest.mark.parametrize("path, n", [(MLP8, 8), (MLP8_GLOBAL, 8), (SCAN16, 16), (REPLICAS2, 2),
                                     (LLAMA8B_CP, 4), (LLAMA8B_OFFLOAD, 8), (LLAMA70B, 128)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_partitions(path, n):
    assert hlo_compile.partitions(path.read_text()) == n


def test_partitions_come_from_the_groups_when_the_header_says_nothing():
    text = LLAMA70B.read_text()
    header = text.split("\n", 1)[0]
    assert "num_partitions" not in header and "replica_count" not in header
    assert hlo_compile.partitions(text) == 128
    # A header smaller than the groups loses; an override wins over both.
    text8 = MLP8.read_text().replace("num_partitions=8", "num_partitions=2", 1)
    assert hlo_compile.partitions(text8) == 8
    assert hlo_compile.partitions(text8, 16) == 16
    with pytest.raises(ValueError):
        hlo_compile.partitions(text8, 0)


def test_layout_replicas_partitions_and_spmd():
    assert hlo_compile.layout(REPLICAS2.read_text()).replicas
    per_device = hlo_compile.layout(LLAMA70B.read_text())  # sharding= on parameters only
    assert (per_device.replicas, per_device.spmd_partitioning, per_device.devices) == (False, False, 128)
    assert "channel_id" in per_device.why
    global_view = hlo_compile.layout(MLP8_GLOBAL.read_text())
    assert global_view.spmd_partitioning and global_view.shardy and not global_view.replicas


def test_portable_text_rewrites_copies_and_mesh_groups_only():
    text, changes = hlo_compile.portable_text(MLP8.read_text())
    assert "mesh[" in MLP8.read_text() and "mesh[" not in text
    assert "replica_groups={{0,1,2,3,4,5,6,7}}" in text
    assert len(changes) == 1 and changes[0].endswith("mesh replica-group forms -> explicit lists")
    llama, changes = hlo_compile.portable_text(LLAMA8B_CP.read_text())
    assert changes == ("38 copy -> reshape", "12 stood-in custom calls' operand layouts unpinned")
    assert " copy(" not in llama and llama.count(" reshape(") == LLAMA8B_CP.read_text().count(" reshape(") + 38
    # Transformer Engine's calls lose their pinned layouts (jax 0.12 cannot serialize them for
    # the plugin); nothing else of their lines changes.
    assert LLAMA8B_CP.read_text().count("operand_layout_constraints=") == 12
    assert "operand_layout_constraints=" not in llama
    assert llama.count('custom_call_target="te_fused_attn_forward_ffi"') == 8
    assert llama.count("backend_config={attn_heads = 32 : i64") == 12


def test_portable_text_keeps_the_layouts_of_calls_that_have_a_handler():
    pinned = ("HloModule m\n\nENTRY e {\n  a = f32[4,4]{1,0} parameter(0)\n"
              "  ROOT c = f32[4,4]{1,0} custom-call(a), custom_call_target=\"TARGET\", "
              "operand_layout_constraints={f32[4,4]{0,1}}, api_version=API_VERSION_TYPED_FFI\n}\n")
    kept = pinned.replace("TARGET", "cusolver_getrf_ffi")  # jaxlib's: its column-major layout matters
    assert hlo_compile.portable_text(kept) == (kept, ())
    written = pinned.replace("TARGET", "acme_fused_gelu_ffi")
    vendor, changes = hlo_compile.portable_text(written)
    assert vendor == written.replace(", operand_layout_constraints={f32[4,4]{0,1}}", "")
    assert changes == ("1 stood-in custom calls' operand layouts unpinned",)


# ------------------------------------------------------------------------ compile


def _async_kinds(text):
    return set(_ASYNC.findall(text))


@needs_gpu_compile
@pytest.mark.parametrize("path, kinds", [
    (MLP8, {"all-gather", "all-reduce"}),
    (MLP8_GLOBAL, {"all-gather", "all-reduce"}),
    (SCAN16, {"all-gather", "all-reduce"}),
    (REPLICAS2, {"all-gather", "all-reduce", "collective-permute"}),
], ids=lambda v: getattr(v, "name", None))
def test_compile_makes_async_pairs_and_a_schedule(path, kinds):
    text = path.read_text()
    n = hlo_compile.partitions(text)
    compiled = hlo_compile.compile_unoptimized(text, _hw(n), isolated=False)
    assert kinds <= xla_forms.collective_kinds(compiled)
    assert _async_kinds(compiled) if not xla_forms.EVERY_COLLECTIVE_ASYNC else kinds <= _async_kinds(compiled)
    assert "is_scheduled=true" in compiled
    assert hlo_compile.classify(compiled)[0] is False
    if path is not REPLICAS2:  # the tiny XLA test module has nothing to fuse
        assert " fusion(" in compiled
    header = compiled.split("\n", 1)[0]
    assert (f"replica_count={n}" in header) if path is REPLICAS2 else (f"num_partitions={n}" in header)


@needs_gpu_compile
def test_a_compiled_module_is_unoptimized_no_more_and_is_refused():
    hw = hardware.get("h100-sxm-8")
    compiled = gpu_compile.compile_for_cluster(jax.jit(lambda x: jnp.tanh(x @ x.T)), (jnp.ones((64, 64)),), {}, hw)
    unoptimized, why = hlo_compile.classify(compiled)
    assert not unoptimized, why
    with pytest.raises(hlo_compile.HloCompileError, match="already compiled"):
        hlo_compile.compile_unoptimized(compiled, hw, isolated=False)


@needs_gpu_compile
def test_options_reach_xla():
    text = MLP8.read_text()
    default = hlo_compile.compile_unoptimized(text, _hw(8), isolated=False)
    # A combine threshold of 0 bytes reaches the GPU combiner: nothing is combined.
    uncombined = hlo_compile.compile_unoptimized(
        text, _hw(8), isolated=False, options={"xla_gpu_all_gather_combine_threshold_bytes": 0})
    assert uncombined.count("all-gather-start(") > default.count("all-gather-start(")


@needs_gpu_compile
def test_isolated_compile_matches_in_process():
    text = SCAN16.read_text()
    isolated = hlo_compile.compile_unoptimized(text, _hw(16))
    assert xla_forms.collective_kinds(isolated) >= {"all-gather", "all-reduce"} and "num_partitions=16" in isolated


def _one_line_error(text, hw, **kw):
    with pytest.raises(hlo_compile.HloCompileError) as info:
        hlo_compile.compile_unoptimized(text, hw, isolated=False, **kw)
    message = str(info.value)
    assert "\n" not in message and message
    return message


@needs_gpu_compile
def test_corrupt_modules_raise_one_line():
    text = MLP8.read_text()
    assert _one_line_error(text[: len(text) // 2], _hw(8)).startswith("not an HLO module")
    # Parses here, but XLA's verifier refuses the shapes: XLA's message, one line.
    bad = text.replace("bf16[256,256]{1,0} all-gather(%param)", "bf16[255,256]{1,0} all-gather(%param)", 1)
    assert bad != text
    message = _one_line_error(bad, _hw(8))
    assert "XLA cannot compile" in message and "255" in message
    # A custom call no handler serves, with the mock turned off: XLA names it.
    ffi = ("HloModule m, num_partitions=2\n\nENTRY e {\n  p = f32[8]{0} parameter(0)\n"
           "  ROOT c = f32[8]{0} custom-call(p), custom_call_target=\"lagom_no_such_kernel\", "
           "api_version=API_VERSION_TYPED_FFI\n}\n")
    no_mock = {"xla_gpu_mock_custom_calls": False}
    assert "lagom_no_such_kernel" in _one_line_error(ffi, _hw(2), options=no_mock)


@needs_gpu_compile
def test_device_count_must_fit_the_cluster():
    message = _one_line_error(MLP8.read_text(), hardware.get("h100-sxm-8", 2))
    assert "8 devices" in message


@needs_gpu_compile
@pytest.mark.slow
def test_xla_benchmark_module_needs_transformer_engine_unless_mocked():
    text = LLAMA8B_CP.read_text()
    message = _one_line_error(text, _hw(4), options={"xla_gpu_mock_custom_calls": False})
    assert "(it calls te_fused_attn_backward_ffi, te_fused_attn_forward_ffi, which no handler here serves)" in message
    # XLA's own reason, on every JAX (the calls' pinned layouts, which jax 0.12 could not
    # serialize for the plugin, are dropped first: portable_text).
    assert "No FFI handler" in message
    options, stood_in = hlo_compile.compile_options(hlo.parse(text), None)
    assert options == {"xla_gpu_mock_custom_calls": True}
    assert {s.target for s in stood_in} == {"te_fused_attn_forward_ffi", "te_fused_attn_backward_ffi"}
    compiled = hlo_compile.compile_unoptimized(text, _hw(4))  # mocked by itself
    assert "te_fused_attn_forward_ffi" in compiled and "is_scheduled=true" in compiled


@needs_gpu_compile
def test_isolated_compile_reports_errors_in_one_line():
    bad = MLP8.read_text().replace("bf16[256,256]{1,0} all-gather(%param)", "bf16[255,256]{1,0} all-gather(%param)", 1)
    with pytest.raises(hlo_compile.HloCompileError) as info:
        hlo_compile.compile_unoptimized(bad, _hw(8))
    assert "\n" not in str(info.value) and "XLA cannot compile" in str(info.value)


# -- wired into the pipeline: predict_hlo_step_ms, tune/simulate/predict on such modules ------------

_UNOPT = pathlib.Path(__file__).parent / "fixtures" / "hlo" / "unoptimized"


@needs_gpu_compile
def test_predict_hlo_step_ms_compiles_a_module_before_optimization():
    import lagom_jax

    path = _UNOPT / "jax_fsdp_scan_16.after_spmd.hlo"
    ms = lagom_jax.predict_hlo_step_ms(path)
    assert ms > 0
    assert lagom_jax.predict_hlo_step_ms(path, strategy="lagom") <= ms * (1 + 1e-9)
    with pytest.raises(ValueError, match="cannot be priced"):
        lagom_jax.predict_hlo_step_ms(path, xla_flags={"xla_gpu_graph_min_graph_size": 2})


@needs_gpu_compile
def test_flags_cannot_apply_to_a_compiled_module(tmp_path):
    import lagom_jax
    from lagom_jax import job
    from lagom_jax.cluster import hardware

    compiled = job.compile_source(job.HloSource((_UNOPT / "jax_fsdp_mlp_8.after_spmd.hlo").read_text()),
                                  hardware.get("h100-sxm-8"))
    path = tmp_path / "compiled.hlo"
    path.write_text(compiled.text)
    assert lagom_jax.predict_hlo_step_ms(path) > 0
    with pytest.raises(ValueError, match="already compiled"):
        lagom_jax.predict_hlo_step_ms(path, xla_flags={"xla_gpu_all_gather_combine_threshold_bytes": 0})


@needs_gpu_compile
def test_tune_compiles_verifies_and_refuses_in_one_line(capsys, tmp_path):
    from lagom_jax import cli

    assert cli.main(["tune", str(_UNOPT / "jax_fsdp_mlp_8.after_spmd.hlo"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compiled_by"].startswith("XLA:GPU deviceless compile of")
    assert out["verification"]  # recompiled with the plan's options
    bad = tmp_path / "bad.hlo"
    bad.write_text((_UNOPT / "jax_fsdp_mlp_8.after_spmd.hlo").read_text().replace(
        "bf16[256,256]{1,0} all-gather(%param)", "bf16[255,256]{1,0} all-gather(%param)", 1))
    assert cli.main(["tune", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "255" in err[-1] and err[-1].startswith("lagom-jax tune: error:")


def test_custom_partitioning_before_spmd_is_refused_in_one_line():
    text = ("HloModule m, num_partitions=4\n\nENTRY e {\n  p = f32[8]{0} parameter(0), sharding={devices=[4]<=[4]}\n"
            "  ROOT c = f32[8]{0} custom-call(p), custom_call_target=\"CustomSPMDPartitioning\", "
            "api_version=API_VERSION_STATUS_RETURNING, sharding={devices=[4]<=[4]}\n}\n")
    with pytest.raises(hlo_compile.HloCompileError, match="CustomSPMDPartitioning x1") as info:
        hlo_compile.compile_unoptimized(text, _hw(4))
    assert "\n" not in str(info.value) and "after SPMD partitioning" in str(info.value)


# ------------------------------------------------------------------------ a CPU host's HLO

CPU_DP8 = HERE / "cpu_dp_step_8.hlo"  # lowered.compile().as_text() on a CPU host: XLA:CPU's module
LOWERED_DP8 = UNOPT / "jax_dp_step_8.lowered.hlo"  # lowered.as_text(dialect="hlo") of the same step


def test_a_module_xla_cpu_compiled_is_recognised_and_no_gpu_module_is():
    for path in (CPU_DP8, HERE / "cpu_fsdp_mlp_step.hlo", HERE / "cpu_scan_mlp_step.hlo"):
        assert "XLA:CPU" in hlo_compile.cpu_compiled(path.read_text()), path.name
    text = jax.jit(lambda x: jnp.tanh(x @ x.T) + 1).lower(jnp.ones((64, 64))).compile().as_text()
    assert hlo_compile.cpu_compiled(text)  # this JAX's own XLA:CPU output
    gpu = [*HERE.glob("gpu_*.hlo"), *HERE.glob("jax-0.1*/*.hlo"), *(HERE / "xla_modules").glob("*.hlo")]
    assert len(gpu) >= 9
    for path in gpu:
        assert hlo_compile.cpu_compiled(path.read_text()) == "", path.name


def test_tune_and_predict_refuse_xla_cpus_module_in_one_line(capsys):
    from lagom_jax import cli

    for argv in (["tune", str(CPU_DP8)], ["predict", "--hlo", str(CPU_DP8)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "XLA:CPU compiled" in err[0] and "lowering_platforms=('cuda',)" in err[0]


def test_tune_refuses_a_step_lowered_for_the_cpu_and_says_how_to_dump_the_cuda_one(tmp_path, capsys):
    from lagom_jax import cli

    def step(key, w):  # dropout: JAX's threefry lowers differently for the CPU and CUDA
        return w * jax.random.bernoulli(key, 0.9, w.shape)

    args = (jax.random.key(0), jnp.ones((64, 64)))
    on_cpu = jax.jit(step).lower(*args).as_text(dialect="hlo")
    for_cuda = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
    assert "rolled loop" in hlo_compile.cpu_lowered(on_cpu)
    assert hlo_compile.cpu_lowered(for_cuda) == ""
    assert hlo_compile.cpu_lowered(LOWERED_DP8.read_text()) == "", "a CPU lowering equal to CUDA's passes"
    path = tmp_path / "step.hlo"
    path.write_text(on_cpu)
    assert cli.main(["tune", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lowered by JAX for the CPU" in err[0] and "lowering_platforms=('cuda',)" in err[0]


def test_a_lowered_step_counts_the_devices_its_shardings_name():
    text = LOWERED_DP8.read_text()
    header = text.split("\n", 1)[0]
    assert "num_partitions" not in header and "replica_groups" not in text
    assert hlo_compile.partitions(text) == 8
    # Each form alone: a tiled sharding (iota or explicit list, replicated last dim), a
    # maximal one, a Shardy mesh.
    one = "HloModule m\n\nENTRY e {{\n  ROOT p = f32[8]{{0}} parameter(0), sharding={}\n}}\n"
    assert hlo_compile.partitions(one.format("{devices=[4,1]<=[4]}")) == 4
    assert hlo_compile.partitions(one.format("{devices=[2,2]0,1,2,3}")) == 4
    assert hlo_compile.partitions(one.format("{devices=[1,1,16]<=[16] last_tile_dim_replicate}")) == 16
    assert hlo_compile.partitions(one.format("{maximal device=5}")) == 6
    assert hlo_compile.partitions(one.format("{replicated}")) == 1
    mesh = 'HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["data"=2, "model"=4]>}}\n'
    assert hlo_compile.partitions(mesh + one.format("{replicated}").split("\n", 1)[1]) == 8


@needs_gpu_compile
def test_tune_compiles_a_lowered_step_for_its_devices_and_names_the_cluster(capsys):
    from lagom_jax import cli

    assert cli.main(["tune", str(LOWERED_DP8), "--no-structures", "--hardware", "a100-sxm-8"]) == 0
    out = capsys.readouterr().out
    said = " ".join(out.split())  # prose wraps where the fixture's path length puts it
    assert "for 8x A100" in said and "1 node(s) x 8 GPUs" in said
    assert "all-reduce" in out and "no collectives" not in out
    # The plan's predictions (decision lines beneath them, e.g. an NCCL setting's "step A -> B ms
    # predicted", are of the same plan and cluster).
    lines = [line for line in out.splitlines() if line.startswith(("predicted", "speedup"))]
    assert lines and all("a100-sxm-8" in line for line in lines), lines
    assert cli.main(["predict", "--hlo", str(LOWERED_DP8), "--hardware", "a100-sxm-8"]) == 0
    assert "on a100-sxm-8 (1 node(s) x 8 GPUs)" in " ".join(capsys.readouterr().out.split())


@needs_gpu_compile
def test_symmetric_buffers_are_priced_as_xla_and_nccl_run_them():
    import warnings

    from lagom_jax.advise import predict

    flag = {"xla_gpu_experimental_enable_nccl_symmetric_buffers": True}
    policy = {"NCCL_CTA_POLICY": "2"}

    def job(**kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            done = predict.hlo_step_job(MLP8, **kw)
        return done, [w for w in caught if issubclass(w.category, predict.PricingWarning)]

    base, said = job()
    assert not said and not base.compiled.hardware.nccl_env.copy_engine("all-gather", 1)
    # Both: all-gathers inside the node run on the copy engines (no SM; the step can only
    # gain, where compute overlaps them: jax 0.12 runs this small module's all-gathers
    # synchronously, so there it gains nothing).
    both, said = job(xla_flags=flag, nccl_env=policy)
    assert not said and both.compiled.hardware.nccl_env.copy_engine("all-gather", 1)
    assert both.predicted_ms("xla-default") <= base.predicted_ms("xla-default")
    # The policy alone moves nothing off the SMs, and says so.
    alone, said = job(nccl_env=policy)
    assert said and not alone.compiled.hardware.nccl_env.copy_engine("all-gather", 1)
    assert alone.predicted_ms("xla-default") == pytest.approx(base.predicted_ms("xla-default"))
    # The flag alone: NCCL's symmetric kernels for the collectives inside the node, priced.
    sym, said = job(xla_flags=flag)
    assert not said and not sym.compiled.hardware.nccl_env.copy_engine("all-gather", 1)
    algorithms = {c.params.algorithm for c in sym.plan.collectives if c.nodes == 1 and c.group_size > 1
                  and c.kind in ("all-gather", "reduce-scatter", "all-reduce")}
    assert algorithms == {"symmetric"}
