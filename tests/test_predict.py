"""The prediction contract (lagom_jax.predict_train_step_ms) and `lagom-jax predict --model`."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import lagom_jax
from lagom_jax import cli
from lagom_jax.advise import predict
from lagom_jax.cluster import hardware
from lagom_jax.costs import cost

# A small Llama: compiles deviceless in a few seconds.
SMALL = dict(layers=2, d_model=256, heads=4, kv_heads=2, ffn=512, vocab=1024, seq_len=256, global_batch=16)


def _ms(**kw):
    return lagom_jax.predict_train_step_ms("llama", **{**SMALL, "mesh": {"fsdp": 16}, **kw})


@pytest.mark.slow
def test_the_contract_predicts_a_positive_step_that_grows_with_the_work():
    base = _ms()
    assert base > 0
    assert _ms(layers=4) > base  # twice the layers: more compute and more all-gathers
    assert _ms(global_batch=64) > base


def test_lagom_is_never_predicted_slower_than_xla_default():
    job = predict.train_step_job("llama", **SMALL, mesh={"fsdp": 16}, strategy="lagom")
    assert job.predicted_ms("lagom") <= job.predicted_ms("xla-default") * (1 + 1e-9)
    assert job.plan.hardware == "h100-sxm-8" and job.plan.nodes == 2  # 16 GPUs = 2 nodes of 8


def test_flags_are_priced_by_compiling_with_them_or_refused():
    # Combining every all-gather into one changes the compiled program, so the prediction.
    combined = _ms(xla_flags={"xla_gpu_all_gather_combine_threshold_bytes": 1 << 30})
    assert combined > 0
    with pytest.raises(ValueError, match="xla_gpu_graph_min_graph_size.*cannot be priced"):
        _ms(xla_flags={"xla_gpu_graph_min_graph_size": 2})
    # Command buffers change no compiled module: priced by the host's launches (costs/launch.py).
    assert _ms(xla_flags={"xla_gpu_enable_command_buffer": ""}) >= _ms()


@pytest.mark.slow
def test_the_nccl_channel_cap_is_priced_by_the_model():
    assert _ms(xla_flags={"xla_gpu_nccl_collective_max_nchannels": 1}) > _ms()


@pytest.mark.parametrize("kw,message", [
    (dict(global_batch=15), "global batch 15 not divisible by data x fsdp x expert = 16"),
    (dict(mesh={"fsdp": 8, "model": 4}, global_batch=16), "kv heads 2 not divisible by the model axis 4"),
    (dict(family="mixtral", experts=4, top_k=2, mesh={"fsdp": 2, "expert": 8}), "experts 4 not divisible by the expert axis 8"),
    (dict(family="mistral"), "unknown family 'mistral'"),
    (dict(remat="most"), "unknown remat policy 'most'"),
    (dict(mesh={"fsdp": 12}, global_batch=12), "12 GPUs are not whole nodes of h100-sxm-8"),
    (dict(mesh={"tensor": 8}), "unknown mesh axes \\['tensor'\\]"),
    (dict(family="llama", experts=8, top_k=2), "mixtral needs experts"),
])
def test_bad_input_names_the_numbers(kw, message):
    args = {**SMALL, "mesh": {"fsdp": 16}, **kw}
    family = args.pop("family", "llama")
    with pytest.raises(ValueError, match=message):
        lagom_jax.predict_train_step_ms(family, **args)


@pytest.mark.slow
def test_cli_mirrors_the_contract(capsys):
    argv = ["predict", "--model", "llama", "--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
            "--ffn", "512", "--vocab", "1024", "--seq-len", "256", "--global-batch", "16", "--mesh", "fsdp=16",
            "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_ms"] == pytest.approx(_ms())
    assert out["mesh"] == {"fsdp": 16} and out["strategy"] == "xla-default"


def test_cli_bad_input_is_one_line_and_exit_2(capsys):
    argv = ["predict", "--model", "llama", "--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
            "--ffn", "512", "--vocab", "1024", "--seq-len", "256", "--global-batch", "15", "--mesh", "fsdp=16"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lagom-jax predict: error: global batch 15 not divisible by data x fsdp x expert = 16"]


def test_a_group_across_nodes_shares_the_nodes_network():
    """Eight 2-rank all-reduces across two nodes (data parallelism beside FSDP in a node) each
    get an eighth of the network: a 1 GiB all-reduce takes about 8x as long as with all of it."""
    hw = hardware.get("h100-sxm-8", 2)
    assert cost.net_share(hw, 2, 2) == pytest.approx(1 / 8)
    assert cost.net_share(hw, 16, 2) == 1.0 and cost.net_share(hw, 8, 1) == 1.0
    one_rail = cost.default_time_us("all-reduce", 1 << 30, 2, 2, hw)
    all_rails = cost.default_time_us("all-reduce", 1 << 30, 2, 2, dataclasses.replace(hw, gpus_per_node=1))
    assert one_rail / all_rails == pytest.approx(8, rel=0.1)


def test_fused_attention_runs_at_the_measured_attention_rate():
    hw = hardware.get("h100-sxm-8")
    flops = 1e12
    matmul = cost.compute_time_us(flops, 0.0, hw) - hw.launch_us
    attention = cost.compute_time_us(flops, 0.0, hw, attention=True) - hw.launch_us
    assert attention / matmul == pytest.approx(hw.achieved_tflops / hw.attention_tflops, rel=1e-3)


def test_commands_print_no_cuda_start_up_noise(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": ""}
    env.pop("JAX_PLATFORMS")
    proc = subprocess.run([sys.executable, "-c", "from lagom_jax.cli import main; import sys; "
                           "sys.argv = ['lagom-jax', 'analyze', '--example']; sys.exit(main())"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "cudart_stub" not in proc.stderr and "absl::InitializeLog" not in proc.stderr
    assert "all-reduce" in proc.stdout


@pytest.mark.parametrize("family,kw", [
    ("mixtral", dict(experts=4, top_k=2, mesh={"fsdp": 8, "expert": 2})),
    ("gpt", dict(kv_heads=4, mesh={"data": 2, "fsdp": 8})),
])
def test_every_family_compiles_for_the_cluster_and_predicts(family, kw):
    args = {**SMALL, **kw}
    assert lagom_jax.predict_train_step_ms(family, **args) > 0


@pytest.mark.slow
def test_nccl_settings_are_priced_on_the_step_compiled_once(capsys):
    # NCCL_PROTO restricts NCCL's choice for every collective: no program changes, so the
    # step compiled once is predicted again, and the contract gives the same number.
    kw = {**SMALL, "mesh": {"fsdp": 8}}
    job = predict.train_step_job("llama", **kw, strategy="xla-default")
    base = job.predicted_ms("xla-default")
    assert predict.repredict_ms(job) == pytest.approx(base)
    ll128 = predict.repredict_ms(job, nccl_env={"NCCL_PROTO": "LL128"})
    assert ll128 != pytest.approx(base, rel=1e-4)
    assert lagom_jax.predict_train_step_ms("llama", **kw, nccl_env={"NCCL_PROTO": "LL128"}) == pytest.approx(ll128)
    argv = ["predict", "--model", "llama", "--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
            "--ffn", "512", "--vocab", "1024", "--seq-len", "256", "--global-batch", "16", "--mesh", "fsdp=8",
            "--nccl-env", "NCCL_PROTO=LL129"]
    assert cli.main(argv) == 2
    assert "NCCL_PROTO='LL129': unknown" in capsys.readouterr().err


def test_a_prediction_across_nodes_says_when_the_presets_network_is_an_assumption(capsys):
    import warnings

    # Measured networks say nothing; every preset whose network is a stand-in names what stands in.
    assumed = {name for name, hw in hardware.PRESETS.items() if hw.network_assumption}
    assert {"h200-sxm-8", "b200-sxm-8", "a3-mega", "a3-ultra", "a4", "gb200-nvl72", "p5"} <= assumed
    assert not {"h100-sxm-8", "a100-sxm-8", "dgx-h100", "nd-a100-v4", "a3"} & assumed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ms(hardware="h200-sxm-8")  # 16 GPUs: two nodes
        _ms(hardware="h100-sxm-8")
        lagom_jax.predict_train_step_ms("llama", **{**SMALL, "mesh": {"fsdp": 8}}, hardware="h200-sxm-8")  # one node
    notes = [str(w.message) for w in caught if w.category is lagom_jax.AssumedNetworkWarning]
    assert len(notes) == 1 and "h200-sxm-8's network numbers" in notes[0] and "InfiniBand NDR" in notes[0]
    # The CLI: the prediction, then one note line on stderr.
    args = ["predict", "--model", "llama", "--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
            "--ffn", "512", "--vocab", "1024", "--seq-len", "256", "--global-batch", "16", "--mesh", "fsdp=16",
            "--hardware", "a3-mega"]
    assert cli.main(args) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "network numbers" in line]
    assert len(err) == 1 and err[0].startswith("lagom-jax predict: note: llama: a3-mega's network numbers")


def test_windowed_einsum_is_priced_by_the_decomposition_pass_where_this_xla_cannot_compile_it(monkeypatch, tmp_path):
    from lagom_jax.program import gpu_compile, windowed_einsum

    flag = {windowed_einsum.FLAG: 0}
    assert windowed_einsum.asks_for_windowing(flag)
    assert not windowed_einsum.asks_for_windowing({windowed_einsum.FLAG: windowed_einsum.DEFAULT_MIB})
    # The probe compiles one collective matmul over 2 GPUs and is remembered per installed XLA.
    monkeypatch.setenv("LAGOM_JAX_CACHE", str(tmp_path))
    windowed_einsum.why_not.cache_clear()
    answer = windowed_einsum.why_not()
    # jaxlib 0.10 leaves the slice size at 0 (no window); 0.12 windows and fails its verifier.
    assert answer == "" or "windowed einsum" in answer or "slice size" in answer
    windowed_einsum.why_not.cache_clear()
    monkeypatch.setattr(gpu_compile, "run_isolated", lambda *a, **k: pytest.fail("asked twice"))
    assert windowed_einsum.why_not() == answer
    windowed_einsum.why_not.cache_clear()
    # Where the deviceless compile cannot window, the step compiles without the flag and every
    # all-gather + matmul pair inside one node runs as a ring beside partial matmuls: a
    # different step, said in a PricingWarning with why.
    monkeypatch.setattr(windowed_einsum, "why_not", lambda: windowed_einsum.NO_WINDOW)

    def job(mesh, **kw):
        return predict.train_step_job("llama", **SMALL, mesh=mesh, strategy="xla-default", **kw)

    plain = job({"fsdp": 8})
    with pytest.warns(predict.PricingWarning, match=f"{windowed_einsum.FLAG}=0 is not compiled in: .*slice size"):
        windowed = job({"fsdp": 8}, xla_flags=flag)
    assert windowed.compiled.windowed_by_flag and not plain.compiled.windowed_by_flag
    assert windowed.predicted_ms("xla-default") != plain.predicted_ms("xla-default")
    # XLA keeps a windowed loop inside its NVLink domain: FSDP rings over two nodes stay collectives.
    with pytest.warns(predict.PricingWarning):
        across = job({"fsdp": 16}, xla_flags=flag)
    assert across.predicted_ms("xla-default") == pytest.approx(job({"fsdp": 16}).predicted_ms("xla-default"))


def test_a_matmul_lookup_and_a_gradient_clip_are_work_the_step_is_priced_for():
    def job(**kw):
        return predict.train_step_job("llama", **SMALL, mesh={"fsdp": 16}, strategy="xla-default", **kw)

    def matmul_flops(j):
        return sum(t.flops * max(t.trip_count, 1) for t in j.compiled.graph().tasks if t.gemm)

    base = job()
    # The one-hot lookup is a dot each way (the table's gradient too): 2 x tokens x vocab x d_model,
    # tokens = 16 x 256 over 16 GPUs.
    tokens = SMALL["global_batch"] * SMALL["seq_len"] // 16
    extra = matmul_flops(job(embed_lookup="matmul")) - matmul_flops(base)
    assert extra == pytest.approx(2 * 2 * tokens * SMALL["vocab"] * SMALL["d_model"])
    # Clipping needs the global norm of every gradient (one more reduction over the FSDP shards)
    # before any update starts.
    assert job(grad_clip=1.0).predicted_ms("xla-default") > base.predicted_ms("xla-default")
    with pytest.raises(ValueError, match="embed_lookup must be one of gather, matmul"):
        job(embed_lookup="onehot")
    with pytest.raises(ValueError, match="grad_clip must be >= 0"):
        job(grad_clip=-1.0)


def test_cli_takes_the_lookup_and_the_clip_and_refuses_bad_values(capsys):
    argv = ["predict", "--model", "llama", "--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
            "--ffn", "512", "--vocab", "1024", "--seq-len", "256", "--global-batch", "16", "--mesh", "fsdp=16"]
    assert cli.main(argv + ["--grad-clip", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "lagom-jax predict: error: model config: grad_clip must be >= 0 (0: no clipping), got -1.0"]
    assert cli.main(argv + ["--embed-lookup", "matmul", "--grad-clip", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["embed_lookup"] == "matmul" and out["grad_clip"] == 1.0
    assert out["predicted_ms"] == pytest.approx(_ms(embed_lookup="matmul", grad_clip=1.0))


def test_sequence_parallelism_gathers_and_scatters_where_tensor_parallelism_all_reduces():
    """MaxText's tensor parallelism shards the residual over its tensor axis, so its sublayers
    all-gather before and reduce-scatter after, where Megatron's plain tensor parallelism
    all-reduces after each."""
    from lagom_jax.program.graph import collective_shape

    def tp_bytes(**kw):  # bytes moved over the model axis, by kind
        job = predict.train_step_job("llama", **SMALL, mesh={"fsdp": 4, "model": 2}, strategy="xla-default", **kw)
        g = job.compiled.graph()
        out: dict[str, float] = {}
        for t in g.collectives:
            if collective_shape(t, g.num_devices, 8)[2] == 2:
                out[t.kind] = out.get(t.kind, 0.0) + t.bytes * max(t.trip_count, 1)
        return out

    plain, sp = tp_bytes(), tp_bytes(sequence_parallel=True)
    # The same activations cross the axis: all-reduced in one, gathered and scattered in the other.
    assert plain["all-reduce"] > 10 * (plain.get("all-gather", 0) + plain.get("reduce-scatter", 0))
    assert sp["all-gather"] > 10 * sp.get("all-reduce", 0) and sp["reduce-scatter"] > 10 * sp.get("all-reduce", 0)
    with pytest.raises(ValueError, match="sequence_parallel.*no 'model' axis"):
        predict.train_step_source("llama", **SMALL, mesh={"fsdp": 8}, sequence_parallel=True)
