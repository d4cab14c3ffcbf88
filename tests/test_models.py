"""Models under every sharding recipe: they train, agree with one device, and emit the
collectives their recipe implies (asserted on the HLO that XLA really compiled for CPU).

Each (model, recipe) is built and compiled once (module-scoped cache) and shared by the
training, agreement and HLO assertions, so the file stays within the suite's budget.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lagom_jax.models import FAMILIES, build, parse_mesh, parse_recipe
from lagom_jax.models.families import relative_position_bucket

MODELS = ("gpt2", "bert", "t5")
# (recipe, mesh) on the 8 fake CPU devices of tests/conftest.py.
RECIPES = (
    ("dp", "data=8"),
    ("fsdp", "fsdp=8"),
    ("tp", "model=4"),
    ("tp+sp", "model=4"),
    ("pp", "stage=2"),
    ("dp+pp+tp", "data=2,stage=2,model=2"),
)
CASES = [(m, r, mesh) for m in MODELS for r, mesh in RECIPES]
CASES += [("gpt2", "dp+tp", "data=2,model=4"), ("gpt2", "dp+pp", "data=2,stage=2")]
# CommFuse rings in the MLP (recipe part cf): same losses as the plain collectives.
CASES += [("gpt2", "tp+sp+cf", "model=4"), ("bert", "dp+tp+sp+cf", "data=2,model=4")]
STEPS = 3
# CPU code generation dominates compile time here; the SPMD partitioner, which places the
# collectives these tests check, runs the same at every backend optimisation level.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")

_runs: dict[tuple[str, str, str, str], tuple[list[float], str]] = {}


def run(model: str, recipe: str, mesh: str, remat: str = "none") -> tuple[list[float], str]:
    """Losses of STEPS steps on a fixed batch, and the compiled HLO text (cached)."""
    key = (model, recipe, mesh, remat)
    if key not in _runs:
        built = build(model, "tiny", recipe, mesh, batch_size=8, seq_len=16, learning_rate=1e-2, remat=remat)
        compiled = built.train_step.lower(*built.abstract_inputs).compile(FAST_COMPILE)
        state, batch = built.init(jax.random.key(0))
        losses = []
        for _ in range(STEPS):
            state, metrics = compiled(state, batch)
            losses.append(float(metrics["loss"]))
        _runs[key] = (losses, compiled.as_text())
    return _runs[key]


def loop_collectives(hlo: str) -> list[dict[str, int]]:
    """Collective counts of each while-loop body (the layer scans and the pipeline ticks)."""
    bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    out, current = [], None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$", line)
        if head:
            current = {k: 0 for k in KINDS} if head.group(1) in bodies else None
            if current is not None:
                out.append(current)
        elif current is not None:
            for k in KINDS:
                current[k] += len(re.findall(rf"\s{k}(?:-start)?\(", line))
    return out


def total(hlo: str, kind: str) -> int:
    return len(re.findall(rf"\s{kind}(?:-start)?\(", hlo))


@pytest.mark.parametrize("model,recipe,mesh", CASES)
def test_trains_and_matches_single_device(model: str, recipe: str, mesh: str) -> None:
    losses, _ = run(model, recipe, mesh)
    reference, _ = run(model, "dp", "data=1")
    assert all(np.isfinite(losses))
    assert losses[0] > losses[1] > losses[2], losses
    np.testing.assert_allclose(losses, reference, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("model,recipe,mesh", CASES)
def test_collectives_match_recipe(model: str, recipe: str, mesh: str) -> None:
    _, hlo = run(model, recipe, mesh)
    loops = loop_collectives(hlo)
    parts = parse_recipe(recipe)
    in_loops = {k: sum(1 for body in loops if body[k]) for k in KINDS}
    if parts == {"dp"}:
        # Gradients are all-reduced over data; weights are never gathered or passed on.
        assert total(hlo, "all-reduce") > 0
        assert total(hlo, "all-gather") == total(hlo, "collective-permute") == 0
    if "fsdp" in parts:
        # ZeRO-3: every layer gathers its weight shards inside the layer loop; the CPU
        # pipeline reduces gradients with all-reduce (GPU would emit reduce-scatter).
        assert in_loops["all-gather"] >= 2, loops
        assert total(hlo, "all-reduce") + total(hlo, "reduce-scatter") > 0
    if "tp" in parts:
        # Megatron row-parallel outputs are all-reduced in every layer, forward and backward.
        assert in_loops["all-reduce"] >= 2, loops
    if "sp" in parts:
        # The sequence-sharded residual stream is gathered before each tensor-parallel
        # sublayer inside the layer loops.
        assert in_loops["all-gather"] >= 2, loops
    if "pp" in parts:
        # Activations (forward) and their gradients (backward) move between stages.
        assert in_loops["collective-permute"] >= 2, loops
        if not parts & {"fsdp", "sp"}:
            # Each data rank runs its own rows of every microbatch: no tick gathers a microbatch
            # across data (a contiguous split did, and computed it on every data rank again).
            assert in_loops["all-gather"] == 0, loops
        if not parts & {"fsdp", "sp", "tp"}:
            # The ticks add their gradients to local sums, reduced over data once after the
            # loop (left to the partitioner, every tick reduced every layer's gradient).
            assert in_loops["all-reduce"] == 0 and total(hlo, "all-reduce") > 0, loops
    if "cf" in parts:
        # The MLP's all-gather and reduce-scatter became rings of permutes in the layer loops.
        assert in_loops["collective-permute"] >= 2, loops
    elif "pp" not in parts:
        assert total(hlo, "collective-permute") == 0


def test_bfloat16_compute_keeps_float32_master_weights() -> None:
    built = build("gpt2", "tiny", "tp", "model=4", dtype="bfloat16", learning_rate=1e-2)
    state, batch = built.init(jax.random.key(0))
    assert {p.dtype for p in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    assert "xbf16>" in built.lower().as_text()  # StableHLO: tensor<...xbf16>
    losses = []
    for _ in range(2):
        state, metrics = built.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert np.isfinite(losses).all() and losses[1] < losses[0]


def test_large_configs_build_abstractly_with_real_sizes() -> None:
    # Parameter counts of the published models (vocab padded to a multiple of 128).
    expected = {("gpt2", "124M"): 124e6, ("gpt2", "1.5B"): 1.56e9, ("bert", "large"): 335e6,
                ("t5", "base"): 223e6}
    for (model, config), count in expected.items():
        built = build(model, config, "fsdp", "fsdp=8", batch_size=8)
        assert abs(built.num_params - count) / count < 0.03, (model, config, built.num_params)
        state, batch = built.abstract_inputs
        leaves = jax.tree.leaves(state) + jax.tree.leaves(batch)
        assert all(isinstance(a, jax.ShapeDtypeStruct) and a.sharding is not None for a in leaves)
        embed = state.params["outer"]["shared" if model == "t5" else "wte"]["embedding"]
        assert embed.sharding.spec == P(None, "fsdp")


def test_tp_shards_heads_and_pp_shards_layers() -> None:
    built = build("gpt2", "tiny", "dp+pp+tp", "data=2,stage=2,model=2")
    params, opt_state = built.shardings[0].params, built.shardings[0].opt_state
    assert params["blocks"]["attn"]["wq"].spec == P("stage", None, "model", None)
    assert params["blocks"]["mlp"]["wo"].spec == P("stage", "model", None)
    # The batch is split over the stages too: the embedding and the head run on a stage's share.
    assert built.shardings[1]["inputs"].spec == P(("data", "stage"), None)
    # Adam moments are sharded like the parameters they belong to.
    specs = {s.spec for s in jax.tree.leaves(opt_state)}
    assert params["blocks"]["attn"]["wq"].spec in specs


@pytest.mark.parametrize("args,message", [
    (("gpt3", "tiny", "dp"), "known: bert, gpt2, llama, mixtral, t5"),
    (("gpt2", "2B", "dp"), "known: tiny, 124M, 355M, 774M, 1.5B, or dimensions"),
    (("bert", "tiny", "zero"), "known parts"),
    (("bert", "tiny", "sp", "model=2"), "tp+sp"),
    (("t5", "tiny", "dp+tp", "data=8"), "lacks ['model']"),
    (("t5", "tiny", "pp+tp+sp", "stage=2,model=2"), "cannot be combined with 'pp'"),
    (("gpt2", "tiny", "dp+pp", "data=2,stage=4"), "multiple of microbatches"),
    (("gpt2", "tiny", "dp", "data=16"), "needs 16 devices"),
    (("gpt2", "1.5B", "tp", "model=4"), "heads 25 not divisible by the model axis 4"),
    (("gpt2", "vocab=102", "tp", "model=4"), "cannot be split 4 ways"),
])
def test_bad_inputs_name_the_fix(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build(*args)


def test_parse_mesh() -> None:
    assert parse_mesh("data=2,stage=2,model=2") == {"data": 2, "stage": 2, "model": 2}
    assert list(parse_mesh("model=4,data=2")) == ["model", "data"]
    for bad in ("data=2,gpu=4", "data", "data=x", "data=2,data=2"):
        with pytest.raises(ValueError, match="mesh"):
            parse_mesh(bad)


def test_mesh_axes_are_auto() -> None:
    built = build("gpt2", "tiny", "dp+tp", "data=2,model=4")
    assert built.mesh.axis_names == ("data", "model")
    assert all(t == jax.sharding.AxisType.Auto for t in built.mesh.axis_types)


def test_t5_relative_position_buckets() -> None:
    rel = jnp.arange(-200, 201)
    both = relative_position_bucket(rel, True, 32, 128)
    causal = relative_position_bucket(rel, False, 32, 128)
    assert int(both.min()) == 0 and int(both.max()) == 31
    # Unidirectional: keys after the query all fall in bucket 0; farther back, larger bucket.
    assert (causal[rel >= 0] == 0).all()
    back = causal[rel <= 0][::-1]
    assert (jnp.diff(back) >= 0).all() and int(back[-1]) == 31
    # Half the buckets are exact small offsets; offsets beyond max_distance share the last.
    assert [int(b) for b in back[:16]] == list(range(16))
    assert int(back[16]) == 16 and int(back[17]) == 16
    assert int(causal[0]) == int(causal[200 - 128])


def test_every_family_has_a_tiny_config() -> None:
    assert all("tiny" in f.configs for f in FAMILIES.values())


def test_compiled_text_compiles_bf16_pipelines_on_cpu():
    # With XLA's defaults, jaxlib 0.10.2's CPU compiler aborts the process on this step.
    text = build("gpt2", "tiny", "dp+pp+tp", "data=2,stage=2,model=2",
                 dtype="bfloat16", seq_len=16).compiled_text()
    assert "collective-permute" in text and " all-reduce(" in text


def test_a_pipeline_applies_its_remat_policy():
    """GPipe's stages run their layers under the stack's remat policy (until 2026-11-27 it ran
    them unrematerialised whatever the policy): the same losses, another program."""
    losses, _ = run("gpt2", "pp", "stage=2")
    remat_losses, _ = run("gpt2", "pp", "stage=2", remat="full")
    np.testing.assert_allclose(remat_losses, losses, rtol=1e-5)

    def remats(remat: str) -> int:  # jax.checkpoint's primitive in the traced step (remat2; checkpoint in newer JAX)
        b = build("gpt2", "tiny", "pp", "stage=2", batch_size=8, seq_len=16, remat=remat)
        return len(re.findall(r"\b(?:remat2?|checkpoint)\[", str(jax.make_jaxpr(b.train_step)(*b.abstract_inputs))))

    assert remats("full") >= 1
    assert remats("none") == 0
