"""The HLO reader on modules written by XLA's authors (tests/fixtures/hlo/xla, see SOURCE.md).

Every fixture is accepted by XLA's own parser in jaxlib 0.10.2; ``expected.json`` holds the
collectives that parser finds in it. Ours must read every one and find the same.
"""

from __future__ import annotations

import collections
import json
import pathlib

import pytest

from lagom_jax.program import graph, hlo

CORPUS = pathlib.Path(__file__).parent / "fixtures" / "hlo" / "xla"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
COLLECTIVES = frozenset({
    "all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter", "all-to-all",
    "collective-permute", "collective-permute-start", "collective-broadcast", "ragged-all-to-all",
})  # fmt: skip
# ``<op>-start`` of an op without a start opcode of its own is XLA's short form of an
# async-start wrapping ``<op>``; XLA's parser makes the wrapped instruction, we keep the
# short form (graph.py reads it as that collective).
SHORT_FORMS = {"reduce-scatter-start": "reduce-scatter", "all-to-all-start": "all-to-all",
               "ragged-all-to-all-start": "ragged-all-to-all",
               "collective-broadcast-start": "collective-broadcast"}


def fixture(name: str) -> hlo.Module:
    return hlo.parse((CORPUS / name).read_text())


def jaxlib_collectives(name: str) -> collections.Counter:
    """Collectives per opcode in XLA's parse, one per instruction (an async-start counted
    by its wrapped instruction only)."""
    counts = collections.Counter(EXPECTED[name]["collectives"])
    counts.subtract(EXPECTED[name].get("async_start_wrapped_roots", {}))
    return +collections.Counter({k: v for k, v in counts.items() if k in COLLECTIVES})


def test_the_corpus_is_what_source_md_lists():
    files = sorted(p.name for p in CORPUS.glob("*.hlo"))
    assert files == sorted(EXPECTED) and len(files) >= 200
    listed = (CORPUS / "SOURCE.md").read_text()
    assert all(f"`{f}`" in listed for f in files)


def test_every_xla_module_is_read_with_xla_collectives():
    wrong = {}
    for name in sorted(EXPECTED):
        try:
            module = hlo.parse((CORPUS / name).read_text())
        except hlo.HloParseError as err:
            wrong[name] = str(err)
            continue
        ours = collections.Counter(
            SHORT_FORMS.get(i.opcode, i.opcode) for c in module.computations for i in c.instructions)
        ours = +collections.Counter({k: v for k, v in ours.items() if k in COLLECTIVES})
        if ours != jaxlib_collectives(name):
            wrong[name] = f"ours {dict(ours)}, XLA {dict(jaxlib_collectives(name))}"
    assert not wrong, wrong


def test_every_module_with_collectives_becomes_a_step_graph():
    for name in sorted(EXPECTED):
        if jaxlib_collectives(name):
            g = graph.from_module(fixture(name))
            assert g.tasks, name


def test_instruction_over_several_lines():
    module = fixture("alias_info__19.hlo")
    ra2a = module.entry.by_name["ra2a"]
    assert ra2a.opcode == "ragged-all-to-all" and len(ra2a.operands) == 6
    assert ra2a.shape == hlo.Shape("f32", (24, 56, 119))


def test_shapes_xla_infers_are_inferred():
    # bfloat16_propagation_test.cc: shape-less call, tuple, get-tuple-element and dot, and
    # computations written inline as the value of to_apply= and calls=.
    module = fixture("bfloat16_propagation__0.hlo")
    entry = module.entry
    call = entry.by_name["call.0"]
    assert call.shape.is_tuple and [str(s) for s in call.shape.tuple_shapes] == ["f32[4,4]", "f32[4,4]"]
    (body,) = call.called_computations
    assert module.computation(body).root.name == "fusion.0"
    fused = module.computation(entry.by_name["fusion.1"].called_computations[0])
    assert fused.by_name["gte.1"].shape == hlo.Shape("f32", (4, 4))
    assert fused.root.opcode == "dot" and fused.root.shape == hlo.Shape("f32", (4, 4))
    # Every called computation is in the module, ahead of the one that calls it.
    order = [c.name for c in module.computations]
    assert order.index(body) < order.index(entry.name)


def test_inline_operands_become_instructions():
    # reshape_mover_test.cc: rng(f32[] constant(0), f32[] constant(1)).
    (comp,) = [c for c in fixture("reshape_mover__1.hlo").computations if "rng" in c.by_name]
    rng = comp.by_name["rng"]
    assert [comp.by_name[o].opcode for o in rng.operands] == ["constant", "constant"]
    assert [comp.by_name[o].literal for o in rng.operands] == ["0", "1"]
    # The form XLA:GPU prints for a broadcast zero, which an earlier reader refused.
    text = ("HloModule m\nENTRY e {\n  p = bf16[8,128] parameter(0)\n"
            "  z = bf16[8,128] broadcast(bf16[] constant(0)), dimensions={}\n"
            "  ROOT a = bf16[8,128] add(p, z)\n}\n")
    entry = hlo.parse(text).entry
    (zero,) = entry.by_name["z"].operands
    assert entry.by_name[zero].opcode == "constant" and entry.by_name[zero].shape == hlo.Shape("bf16")


def test_attributes_after_a_computation_and_comments():
    module = fixture("hlo_ordering__6.hlo")
    assert len(module.computations) >= 2
    module = fixture("alias_info__7.hlo")  # '// BEGIN OF 0' comments inside a tuple shape
    start = module.entry.by_name["all-to-all-start.1"]
    assert start.shape.is_tuple and str(start.shape.tuple_shapes[1]) == "f32[8,4,1]"
    assert str(start.shape.tuple_shapes[0]) == "((f32[8,4,1], (f32[8,4,1], u32[], u32[])))"


def test_layouts_with_tiles_memory_space_and_a_space_before_them():
    entry = fixture("async_collective_creator__11.hlo").entry
    assert entry.by_name["input"].shape == hlo.Shape("f32", (64, 8, 128), layout="{2,1,0:T(8,128)}")
    assert entry.by_name["output"].shape.layout == "{2,1,0:T(8,128)S(1)}"
    (ar,) = [i for c in fixture("collective_pipeliner__73.hlo").computations for i in c.instructions
             if i.name == "all-reduce.5832"][:1]
    assert ar.shape.dims == (1, 128) and ar.shape.layout == "{1,0}"


def test_buffer_shapes_literal_attributes_and_module_name_colon():
    b0 = fixture("custom_call__1.hlo").entry.by_name["b0"]
    assert b0.opcode == "custom-call" and b0.shape == hlo.Shape("s32", (2,))
    root = fixture("hlo_parser__39.hlo").entry.root
    assert root.attributes["literal"] == "f32[] 0.1"
    assert fixture("hlo_parser__273.hlo").name == "multiline_comment"


def test_a_string_may_span_lines():
    inst = [i for c in fixture("hlo_value_semantics_analysis__1.hlo").computations for i in c.instructions
            if "sparse_dense_matmul_config" in i.attributes.get("backend_config", "")]
    assert inst and "\n" in inst[0].attributes["backend_config"]


def test_errors_inside_an_inline_computation_keep_line_and_column():
    text = "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  c = call(p), to_apply={\n    a = f32[2] parameter(0)\n    ROOT n = f32[2] negate(q)\n  }\n}\n"
    with pytest.raises(hlo.HloParseError, match="line 6, col 28: operand 'q' is not defined"):
        hlo.parse(text)


def test_ragged_all_to_all_is_an_all_to_all_of_its_input_buffer():
    # A dropless MoE's token exchange: read as an all-to-all of the most it can send.
    g = graph.from_module(fixture("ragged_all_to_all_canonicalizer__1.hlo"))
    (a2a,) = [t for t in g.tasks if t.is_collective]
    assert a2a.kind == "all-to-all" and a2a.bytes == 16 * 2
    # Its async form (an async-start wrapping it, as XLA:GPU emits it) too.
    text = """HloModule m, num_partitions=8

ra2a_body {
  input = bf16[1024,256] parameter(0)
  output = bf16[4096,256] parameter(1)
  io = s64[8] parameter(2)
  ss = s64[8] parameter(3)
  oo = s64[8] parameter(4)
  rs = s64[8] parameter(5)
  ROOT ra2a = bf16[4096,256] ragged-all-to-all(input, output, io, ss, oo, rs), replica_groups={{0,1,2,3,4,5,6,7}}
}

ENTRY main {
  input = bf16[1024,256] parameter(0)
  output = bf16[4096,256] parameter(1)
  io = s64[8] parameter(2)
  ss = s64[8] parameter(3)
  oo = s64[8] parameter(4)
  rs = s64[8] parameter(5)
  start = ((bf16[1024,256], bf16[4096,256], s64[8], s64[8], s64[8], s64[8]), bf16[4096,256]) async-start(input, output, io, ss, oo, rs), calls=ra2a_body
  ROOT done = bf16[4096,256] async-done(start)
}
"""
    (a2a,) = [t for t in graph.from_hlo_text(text).tasks if t.is_collective]
    assert a2a.kind == "all-to-all" and a2a.is_async and a2a.bytes == 1024 * 256 * 2 and len(a2a.groups[0]) == 8
