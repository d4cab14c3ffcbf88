"""The HLO text parser: hand-written GPU-dialect fixtures and really compiled CPU modules."""

from __future__ import annotations

import pathlib
import re

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lagom_jax.cli import example_text
from lagom_jax.program import hlo

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hlo"


def fixture(name: str) -> hlo.Module:
    return hlo.parse((FIXTURES / name).read_text())


# ----------------------------------------------------------------------------- shapes


def test_tuple_shape_with_index_comments_and_layouts():
    m = hlo.parse(
        "HloModule m\n\nENTRY e {\n"
        "  p = (s32[], f32[2,3]{1,0}, /*index=2*/(bf16[4]{0}, pred[]), s4[3]) parameter(0)\n"
        "}\n"
    )
    s = m.entry.root.shape
    assert s.is_tuple and len(s.tuple_shapes) == 4
    assert [str(x) for x in s.leaves()] == ["s32[]", "f32[2,3]", "bf16[4]", "pred[]", "s4[3]"]
    assert s.tuple_shapes[1].layout == "{1,0}"
    # 4 + 24 + 8 + 1 + ceil(3*4 bits / 8) = 39
    assert s.bytes == 39 and s.elements == 1 + 6 + 4 + 1 + 3


def test_bounded_dynamic_dims_count_their_bound():
    m = hlo.parse("HloModule m\nENTRY e {\n  p = f32[<=8,4]{1,0} parameter(0)\n}\n")
    assert m.entry.root.shape.dims == (8, 4)


# ----------------------------------------------------------------------------- replica groups


@pytest.mark.parametrize(
    "raw, groups",
    [
        ("{{0,1},{2,3}}", ((0, 1), (2, 3))),
        ("{}", ()),
        ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("[2,4]<=[4,2]T(1,0)", ((0, 2, 4, 6), (1, 3, 5, 7))),
        ("[4,2]<=[2,2,2]T(2,1,0)", ((0, 4), (2, 6), (1, 5), (3, 7))),
        ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh['a'=4,'b'=1,'c'=2] {'a'}", ((0, 2, 4, 6), (1, 3, 5, 7))),
        ("mesh['a'=2,'b'=2,'c'=2] {'a','c'}", ((0, 1, 4, 5), (2, 3, 6, 7))),
        # 'b' (size 4) split as pre-size 2 × sub-axis 2: the sub-axis is b's minor half.
        ("mesh['a'=2,'b'=4] {'b':(2)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
        # As jax 0.10.2 prints it for a ("model", "data")-sharded embedding: position p of
        # the mesh holds device ([4,2]T(1,0))[p] = (0,2,4,6,1,3,5,7)[p].
        ("mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=4], device_ids=([4,2]T(1,0)) {'axis_2'}",
         ((0, 1), (2, 3), (4, 5), (6, 7))),
        ("mesh['axis_0'=1,'axis_1'=1,'axis_2'=4,'axis_3'=2], device_ids=([4,2]T(1,0)) {'axis_3'}",
         ((0, 2), (4, 6), (1, 3), (5, 7))),
        ("mesh['a'=2,'b'=2], device_ids=(3,2,1,0) {'a'}", ((3, 1), (2, 0))),
    ],
)
def test_replica_group_forms(raw, groups):
    assert hlo.parse_replica_groups(raw) == groups


@pytest.mark.parametrize(
    "raw", ["[2,4]<=[9]", "{{0,1},{2,x}}", "mesh['a'=2] {'z'}", "[2,2]<=[2,2]T(0,0)", "weird"]
)
def test_bad_replica_groups_raise(raw):
    with pytest.raises(ValueError):
        hlo.parse_replica_groups(raw)


def test_mesh_groups_with_device_ids_stay_one_attribute():
    m = hlo.parse(
        "HloModule m, num_partitions=8\n"
        "add {\n  a = f32[] parameter(0)\n}\n"
        "ENTRY e {\n  p = f32[8]{0} parameter(0)\n"
        "  r = f32[8]{0} all-reduce(p), channel_id=1, replica_groups=mesh['x'=4,'y'=2], "
        "device_ids=([2,4]T(1,0)) {'y'}, use_global_device_ids=true, to_apply=add\n}\n"
    )
    r = m.entry.by_name["r"]
    assert "device_ids" not in r.attributes and r.attributes["use_global_device_ids"] == "true"
    assert r.replica_groups() == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_source_target_pairs():
    assert hlo.parse_source_target_pairs("{{0,1},{1,2},{2,0}}") == ((0, 1), (1, 2), (2, 0))
    with pytest.raises(ValueError, match="pair"):
        hlo.parse_source_target_pairs("{{0,1,2}}")


# ----------------------------------------------------------------------------- GPU fixtures


def test_gpu_async_collectives_fixture():
    m = fixture("gpu_collectives.hlo")
    assert m.name == "jit_tp_step" and m.is_scheduled and m.num_devices == 8
    e = m.entry
    assert e.is_entry and e.name == "main.7" and e.root.name == "tuple"
    ops = [i.opcode for i in e.instructions]
    assert ops.count("all-reduce-start") == ops.count("all-reduce-done") == 1
    assert ops.count("async-start") == ops.count("async-done") == 1
    # Operands printed with their types resolve to names.
    ar = e.by_name["all-reduce-start"]
    assert ar.operands == ("partial",) and ar.called_computations == ("sum",)
    assert ar.replica_groups() == (tuple(range(8)),)
    assert ar.frontend_attributes() == {"_scheduling_group_id": "3", "_xla_stream_annotation": "1"}
    assert ar.backend_config()["collective_backend_config"]["is_sync"] is False
    cp = e.by_name["collective-permute-start"]
    assert cp.source_target_pairs()[:2] == ((0, 1), (1, 2)) and len(cp.shape.tuple_shapes) == 4
    a2a = e.by_name["all-to-all-start"]
    wrapped = m.computation(a2a.called_computations[0])
    assert wrapped.root.opcode == "all-to-all"
    assert wrapped.root.replica_groups() == ((0, 2, 4, 6), (1, 3, 5, 7))
    ag = e.by_name["all-gather-start"]
    assert ag.replica_groups() == ((0, 1), (2, 3), (4, 5), (6, 7))
    gemm = e.by_name["cublas-gemm.0"]
    assert gemm.attributes["custom_call_target"] == '"__cublas$lt$matmul"'
    dnums = gemm.backend_config()["gemm_backend_config"]["dot_dimension_numbers"]
    assert dnums["lhs_contracting_dimensions"] == ["1"]
    assert gemm.metadata() == {
        "op_name": "jit(step)/dot_general", "source_file": "/app/tp.py", "source_line": "12"
    }
    assert e.by_name["scaled"].attributes["control-predecessors"] == "{%all-gather-done}"


def test_bare_names_nested_while_and_convolution():
    m = fixture("gpu_bare_names.hlo")
    assert m.entry.name == "main" and m.num_devices == 4
    loop = m.entry.by_name["loop"]
    assert loop.called_computations == ("outer_cond", "outer_body")
    assert loop.known_trip_count() == 2
    inner = m.computation("outer_body").by_name["inner"]
    assert inner.known_trip_count() == 3 and inner.operands == ("init",)
    assert m.computation("add_f32").root.operands == ("a", "b")
    assert m.entry.by_name["conv"].attributes["dim_labels"] == "b01f_01io->b01f"
    assert [p.name for p in m.computation("inner_body").parameters] == ["ip"]


def test_example_module_parses_like_xla():
    """Our example is valid for XLA's own parser, and we see the same instructions."""
    from jaxlib import _hlo

    text = example_text()
    ours = hlo.parse(text)
    theirs = _hlo.hlo_module_from_text(text)
    assert _inventory_xla(theirs) == _inventory(ours)


# ----------------------------------------------------------------------------- real modules


# Enum names whose text spelling is not the kebab-case of the name (xla/hlo/ir/hlo_opcode.h).
_SPELLING = {"exp": "exponential", "expm1": "exponential-minus-one", "log1p": "log-plus-one"}


def _opcode_name(op) -> str:
    """jaxlib's ``HloOpcode.kAllReduce`` → the text format's ``all-reduce``."""
    name = re.sub(r"(?<!^)(?=[A-Z])", "-", op.name[1:]).lower()
    return _SPELLING.get(name, name)


def _inventory_xla(module) -> dict[str, list[tuple[str, str, tuple[str, ...]]]]:
    return {
        c.name: sorted((i.name, _opcode_name(i.opcode), tuple(o.name for o in i.operands()))
                       for i in c.instructions())
        for c in module.computations()
    }


def _inventory(module: hlo.Module) -> dict[str, list[tuple[str, str, tuple[str, ...]]]]:
    return {
        c.name: sorted((i.name, i.opcode, i.operands) for i in c.instructions)
        for c in module.computations
    }


def _mlp_step(params, x):
    def loss(p):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda a, g: a - 0.1 * g, params, grads), value


STRATEGIES = {
    # name: (w1 spec, w2 spec); x is always batch-sharded over "data".
    "dp": (P(), P()),
    "fsdp": (P("data", None), P(None, "data")),
    "tp": (P(None, "model"), P("model", None)),
}


@pytest.fixture(scope="module")
def compiled_steps():
    """{strategy: compiled MLP train step} on a (4, 2) ("data", "model") mesh of 8 CPUs."""
    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(auto, auto))
    out = {}
    for name, (s1, s2) in STRATEGIES.items():
        params = {
            "w1": jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, s1)),
            "w2": jax.ShapeDtypeStruct((128, 64), jnp.float32, sharding=NamedSharding(mesh, s2)),
        }
        x = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
        out[name] = jax.jit(_mlp_step).lower(params, x).compile()
    return out


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_real_cpu_modules_match_jaxlib_structure(compiled_steps, strategy):
    compiled = compiled_steps[strategy]
    ours = hlo.parse(compiled.as_text())
    (theirs,) = compiled.runtime_executable().hlo_modules()
    assert ours.is_scheduled and ours.num_devices == 8
    assert _inventory(ours) == _inventory_xla(theirs)


def test_real_modules_print_mesh_groups_that_match_explicit_ones(compiled_steps):
    """jax 0.10.2 prints mesh-axes groups; decoding them gives the mesh's real groups."""
    data_groups = ((0, 2, 4, 6), (1, 3, 5, 7))  # devices sharing a "model" index
    model_groups = ((0, 1), (2, 3), (4, 5), (6, 7))
    seen = set()
    for compiled in compiled_steps.values():
        m = hlo.parse(compiled.as_text())
        for inst in m.entry.instructions:
            raw = inst.attributes.get("replica_groups")
            if raw is None:
                continue
            seen.add(raw.split("[")[0][:4])
            assert inst.replica_groups() in (data_groups, model_groups), raw
    assert "mesh" in seen  # the mesh-axes form really occurs


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "body, line, col, message",
    [
        ("  a = foo[2] parameter(0)", 3, 7, "unknown element type 'foo'"),
        ("  a = f32[2] parameter(0)\n  b = f32[2] negate(c)", 4, 21, "operand 'c' is not defined"),
        # An instruction may continue on the next line: the '}' closing the computation
        # is where the missing ')' is found.
        ("  a = f32[2] parameter(0)\n  b = f32[2] negate(a", 5, 1, "expected ',' or ')' after operand, got '}'"),
        ("  a = 12 parameter(0)", 3, 7, "expected shape, got '12'"),
        ("  a = f32[2] parameter(0), sharding", 3, 28, "expected attribute=value"),
        ("  a = f32[2]", 3, 13, "expected opcode("),
        ("  b = f32[2] negate(a)\n  a = f32[2] parameter(0)", 3, 21, "used before its definition"),
    ],
)
def test_errors_name_line_and_column(body, line, col, message):
    with pytest.raises(hlo.HloParseError) as info:
        hlo.parse(f"HloModule m\nENTRY e {{\n{body}\n}}\n")
    err = info.value
    assert (err.line, err.col) == (line, col), str(err)
    assert message in str(err)
    assert str(err).startswith(f"line {line}, col {col}: ")


def test_structural_errors():
    with pytest.raises(hlo.HloParseError, match="empty input"):
        hlo.parse("  \n")
    with pytest.raises(hlo.HloParseError, match="never closed"):
        hlo.parse("HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n")
    with pytest.raises(hlo.HloParseError, match="unknown computation 'nope'"):
        hlo.parse("HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n"
                  "  b = f32[] call(a), to_apply=%nope\n}\n")
    with pytest.raises(hlo.HloParseError, match="num_partitions"):
        hlo.parse("HloModule m, num_partitions=0\nENTRY e {\n  a = f32[] parameter(0)\n}\n")
    assert issubclass(hlo.HloParseError, ValueError)


def test_lazy_attribute_errors_are_parse_errors():
    m = hlo.parse("HloModule m\nENTRY e {\n  a = f32[] parameter(0), backend_config={bad json}\n}\n")
    with pytest.raises(hlo.HloParseError, match="line 3, col 27: a: backend_config is not JSON"):
        m.entry.root.backend_config()


# ----------------------------------------------------------------------------- fuzzing

# Hand-written GPU modules and real CPU ones (compiled by jax 0.10.2 on 8 devices and
# stored: an FSDP+TP MLP step and a scanned one with a while loop).
_CORPUS = [example_text()] + [
    (FIXTURES / name).read_text()
    for name in ("gpu_collectives.hlo", "gpu_bare_names.hlo", "cpu_fsdp_mlp_step.hlo",
                 "cpu_scan_mlp_step.hlo")
]
_NOISE = st.text(alphabet="{}[]()<>=,%\"'/* \n0123456789abcfsTx:.-_", min_size=1, max_size=6)


@st.composite
def _mutated(draw):
    text = draw(st.sampled_from(_CORPUS))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["truncate", "delete", "insert", "swap_lines"]))
        if action == "truncate":
            text = text[:pos]
        elif action == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 8)) :]
        elif action == "insert":
            text = text[:pos] + draw(_NOISE) + text[pos:]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, max(0, len(lines) - 2)))
            lines[i : i + 2] = lines[i : i + 2][::-1]
            text = "\n".join(lines)
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_modules_raise_only_parse_errors(text):
    from lagom_jax.program import graph

    try:
        module = hlo.parse(text)
    except hlo.HloParseError as e:
        assert e.line >= 1 and e.col >= 1
        return
    # Whatever parses must also build a graph or fail with a located parse error.
    try:
        graph.from_module(module, unroll_loops=False)
    except hlo.HloParseError as e:
        assert e.line >= 1 and e.col >= 1


def test_omitted_shapes_are_inferred_from_the_right_operand_parts():
    """XLA prints instructions without shapes in its tests and pre-optimization modules; the
    reader infers them. Tuple elements of different shapes catch an index read wrongly."""
    text = """
HloModule infer

ENTRY main {
  a = f32[8,16] parameter(0)
  b = bf16[4] parameter(1)
  t = tuple(a, b)
  first = get-tuple-element(t), index=0
  second = get-tuple-element(t), index=1
  ag = all-gather(b), replica_groups={{0,1,2,3}}, dimensions={0}
  rs = reduce-scatter(a), replica_groups={{0,1}}, dimensions={1}, to_apply=add
  d = dot(a, a), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT r = tuple(first, second, ag, rs, d)
}

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
"""
    from lagom_jax.program import hlo

    shapes = {i.name: i.shape for i in hlo.parse(text).entry.instructions}
    assert (shapes["first"].dtype, shapes["first"].dims) == ("f32", (8, 16))
    assert (shapes["second"].dtype, shapes["second"].dims) == ("bf16", (4,))
    assert shapes["ag"].dims == (16,)
    assert shapes["rs"].dims == (8, 8)
    assert shapes["d"].dims == (16, 16)


def test_computations_without_a_module_header_parse_as_xla_does():
    # Some of XLA's benchmark modules (u4_all_gather_1x8.hlo) are a bare computation.
    module = hlo.parse("e {\n  a = u4[1024,512]{1,0:E(4)} parameter(0)\n"
                       "  b = u4[1024,4096]{1,0:E(4)} all-gather(a), dimensions={1}\n}\n")
    assert module.name == "_" and module.entry.name == "e"
    assert [i.opcode for i in module.entry.instructions] == ["parameter", "all-gather"]
    with pytest.raises(hlo.HloParseError, match="expected 'HloModule <name>'"):
        hlo.parse("foo bar")
