"""Search strategies: behaviour on small synthetic steps (no wall-clock assertions)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from lagom_jax import hardware, search
from lagom_jax.synthetic import benchmark_graphs, random_graph

HW = hardware.get("h100-sxm-8")
BASELINES = ("xla-default", "recipe", "autoccl")


def test_unknown_strategy_names_the_known_ones():
    with pytest.raises(ValueError, match="known: xla-default, recipe, autoccl, lagom, exhaustive"):
        search.run_strategy("lagoom", random_graph(2), HW)


def test_results_are_frozen_and_cached_by_content():
    g = random_graph(3, seed=7)
    a = search.run_strategy("lagom", g, HW)
    b = search.run_strategy("lagom", random_graph(3, seed=7), HW)
    assert a is b
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.evaluations = 0  # type: ignore[misc]
    assert search.fingerprint(g) != search.fingerprint(random_graph(3, seed=8))


def test_baselines_pick_what_they_claim():
    g = random_graph(4, seed=3)
    default = search.run_strategy("xla-default", g, HW)
    autoccl = search.run_strategy("autoccl", g, HW)
    ev = search._Evaluator(g, HW, search.Space())
    for t in default.graph.collectives:
        assert default.param_map[t.id] == ev.default(t)
    for t in autoccl.graph.collectives:
        best = min(ev.time(t, p) for p in ev.candidates(t))
        assert ev.time(t, autoccl.param_map[t.id]) == pytest.approx(best)
    assert not default.structure.latency_hiding
    recipe = search.run_strategy("recipe", g, HW)
    assert recipe.structure.latency_hiding and recipe.thresholds["all-reduce"] == 1 << 30


@pytest.mark.parametrize("name", list(benchmark_graphs(8)))
def test_lagom_never_worse_than_baselines(name):
    g = benchmark_graphs(8)[name]
    lagom = search.run_strategy("lagom", g, HW)
    for base in BASELINES:
        assert lagom.makespan_us <= search.run_strategy(base, g, HW).makespan_us * (1 + 1e-9)
    assert lagom.makespan_us >= lagom.bound_us * (1 - 1e-9)


def test_lagom_strictly_better_where_compute_and_communication_contend():
    g = benchmark_graphs(8)["contended"]
    lagom = search.run_strategy("lagom", g, HW)
    best_baseline = min(search.run_strategy(b, g, HW).makespan_us for b in BASELINES)
    assert lagom.makespan_us < best_baseline * 0.99


def test_lagom_explains_every_collective():
    r = search.run_strategy("lagom", benchmark_graphs(8)["contended"], HW)
    assert len(r.explanations) == len(r.graph.collectives)
    assert all(e.reason and e.time_us > 0 for e in r.explanations)
    # Somewhere the fastest-alone choice lost to one that slows the compute less.
    assert any("slow the overlapped compute" in e.reason for e in r.explanations)


def test_lagom_evaluations_grow_linearly():
    ratios = []
    for n in (5, 10, 20, 40):
        g = random_graph(n, seed=n)
        r = search.run_strategy("lagom", g, HW)
        ev = search._Evaluator(g, HW, search.Space())
        k = max(len(ev.candidates(t)) for t in g.collectives)
        ratios.append(r.evaluations / (n * k))
    assert max(ratios) <= 2.0


def test_exhaustive_refuses_large_instances():
    with pytest.raises(ValueError, match="exhaustive search .* needs .* evaluations .* use strategy 'lagom'"):
        search.run_strategy("exhaustive", random_graph(12), HW)


def test_gap_to_exhaustive_on_small_graphs():
    space = search.Space(max_candidates=3, tune_structure=False)
    gaps = []
    for seed in range(12):
        g = random_graph(2 + seed % 3, seed=100 + seed, intensity=(0.5, 1.0, 2.0)[seed % 3])
        opt = search.run_strategy("exhaustive", g, HW, space).makespan_us
        got = search.run_strategy("lagom", g, HW, space).makespan_us
        assert got >= opt * (1 - 1e-9)  # exhaustive is the optimum of the same space
        gaps.append(got / opt - 1)
    assert statistics.median(gaps) <= 0.01 and max(gaps) <= 0.03


def test_tune_report_text_and_json():
    g = random_graph(3, seed=11)
    text = search.tune_report(g, HW)
    for name in search.STRATEGIES:
        assert name in text
    assert "bound" in text and "why" in text
    data = json.loads(search.tune_report(g, HW, strategy="autoccl", as_json=True))
    assert set(data["strategies"]) == set(search.STRATEGIES)
    for name in BASELINES + ("lagom",):
        entry = data["strategies"][name]
        assert entry["makespan_us"] > 0 and entry["evaluations"] >= 1
    assert data["bound_us"] > 0 and len(data["collectives"]) >= 1
    with pytest.raises(ValueError, match="unknown strategy"):
        search.tune_report(g, HW, strategy="nope")
