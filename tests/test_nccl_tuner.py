"""The NCCL tuner plugin, driven through ctypes the way NCCL drives it, without a GPU.

The plugin is compiled once per module; each test loads a config through the environment
variable the plugin reads at init and calls the exported v3..v6 entry points with synthetic
cost tables, checking the result against the Python reading of the same config.
"""

from __future__ import annotations

import ctypes
import re
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_float,
    c_int,
    c_size_t,
    c_uint64,
    c_ulong,
    c_void_p,
)
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lagom_jax.cluster import params as params_lib
from lagom_jax.plan.nccl_tuner import (ALGORITHMS, CONFIG_ENV, CONFIG_HEADER, ConfigError, PROTOCOLS,
                                       TUNER_KINDS, TunerBuildError, TunerRule, build_tuner, match_rule,
                                       parse_config, render_config, tuner_env)

LOGGER = ctypes.CFUNCTYPE(None, c_int, c_ulong, c_char_p, c_int, c_char_p, c_char_p)
INIT_V3 = ctypes.CFUNCTYPE(c_int, c_size_t, c_size_t, LOGGER, POINTER(c_void_p))
INIT_V5 = ctypes.CFUNCTYPE(
    c_int, POINTER(c_void_p), c_uint64, c_size_t, c_size_t, LOGGER, c_void_p, c_void_p
)
COLL_V3 = ctypes.CFUNCTYPE(
    c_int, c_void_p, c_int, c_size_t, c_int, c_void_p, c_int, c_int, POINTER(c_int)
)
COLL_V4 = ctypes.CFUNCTYPE(
    c_int, c_void_p, c_int, c_size_t, c_int, c_void_p, c_int, c_int, c_int, POINTER(c_int)
)
FINALIZE = ctypes.CFUNCTYPE(c_int, c_void_p)
CHUNK = ctypes.CFUNCTYPE(
    c_int, c_void_p, c_int, c_size_t, c_int, c_int, c_int, POINTER(c_size_t)
)


class TunerV3(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("init", INIT_V3),
        ("getCollInfo", COLL_V3),
        ("destroy", FINALIZE),
    ]


class TunerV4(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("init", INIT_V3),
        ("getCollInfo", COLL_V4),
        ("destroy", FINALIZE),
    ]


class TunerV5(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("init", INIT_V5),
        ("getCollInfo", COLL_V4),
        ("finalize", FINALIZE),
    ]


class TunerV6(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("init", INIT_V5),
        ("getCollInfo", COLL_V4),
        ("finalize", FINALIZE),
        ("getChunkSize", CHUNK),
    ]


STRUCTS = {"v3": TunerV3, "v4": TunerV4, "v5": TunerV5, "v6": TunerV6}
VERSIONS = tuple(STRUCTS)
NUM_ALGO, NUM_PROTO = len(ALGORITHMS), len(PROTOCOLS)  # NCCL 2.30: 7 x 3 (tuner_v5.h)
NCCL_LOG_WARN, NCCL_TUNING = 2, 0x40
NO_LOGGER = LOGGER()
MESSAGE = re.compile(r"lagom-tuner: (.*):(\d+): (.*)")


class Tuner:
    """One exported interface version, called with NCCL's argument conventions."""

    def __init__(self, lib: ctypes.CDLL, version: str) -> None:
        self.version = version
        self.api = STRUCTS[version].in_dll(lib, f"ncclTunerPlugin_{version}")

    def init(self, nranks: int, nnodes: int, logger=NO_LOGGER) -> c_void_p:
        ctx = c_void_p()
        if self.version in ("v3", "v4"):
            rc = self.api.init(nranks, nnodes, logger, ctypes.byref(ctx))
        else:
            rc = self.api.init(ctypes.byref(ctx), 0x1234, nranks, nnodes, logger, None, None)
        assert rc == 0
        return ctx

    def coll_info(self, ctx: c_void_p, kind: str, nbytes: int, table: list[list[float]]):
        """(cost table, nChannels) after the call; nChannels starts at 0 as in NCCL."""
        cells = (c_float * (NUM_ALGO * NUM_PROTO))(*[c for row in table for c in row])
        nchannels = c_int(0)
        args = [ctx, TUNER_KINDS[kind], nbytes, 1, ctypes.addressof(cells), NUM_ALGO, NUM_PROTO]
        if self.version != "v3":
            args.append(0)  # regBuff
        assert self.api.getCollInfo(*args, ctypes.byref(nchannels)) == 0
        out = [[cells[a * NUM_PROTO + p] for p in range(NUM_PROTO)] for a in range(NUM_ALGO)]
        return out, nchannels.value

    def chunk_size(self, ctx, kind: str, nbytes: int, algo: int, proto: int, default: int) -> int:
        size = c_size_t(default)
        func = TUNER_KINDS[kind]
        assert self.api.getChunkSize(ctx, func, nbytes, algo, proto, 8, ctypes.byref(size)) == 0
        return size.value

    def destroy(self, ctx: c_void_p) -> None:
        end = self.api.destroy if self.version in ("v3", "v4") else self.api.finalize
        assert end(ctx) == 0


def cost_table(ignored: tuple[tuple[int, int], ...] = ((2, 0), (3, 1))) -> list[list[float]]:
    """Distinct positive costs in µs, as NCCL's model gives; `ignored` cells are -1.0."""
    table = [[100.0 + 10 * a + p for p in range(NUM_PROTO)] for a in range(NUM_ALGO)]
    for a, p in ignored:
        table[a][p] = -1.0
    return table


def nccl_pick(table: list[list[float]]) -> tuple[int, int]:
    """NCCL's choice: the cheapest entry that is not NCCL_ALGO_PROTO_IGNORE."""
    return min(
        ((a, p) for a in range(NUM_ALGO) for p in range(NUM_PROTO) if table[a][p] >= 0),
        key=lambda ap: table[ap[0]][ap[1]],
    )


def expected_coll_info(rule: TunerRule | None, table: list[list[float]]):
    """What the plugin must return for a call, given the rule Python says matches."""
    if rule is None:
        return table, 0
    if rule.algorithm is None:
        return table, rule.nchannels
    a, p = ALGORITHMS.index(rule.algorithm), PROTOCOLS.index(rule.protocol)
    if table[a][p] < 0:
        return table, 0
    changed = [row[:] for row in table]
    changed[a][p] = 0.0
    return changed, rule.nchannels


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    return ctypes.CDLL(str(build_tuner(tmp_path_factory.mktemp("tuner"))))


@pytest.fixture
def use_config(tmp_path, monkeypatch):
    """Write a config text, point the plugin at it, return its path."""

    def write(text: str | bytes) -> Path:
        path = tmp_path / "tuner.conf"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        monkeypatch.setenv(CONFIG_ENV, str(path))
        return path

    return write


class Captured:
    """An NCCL-style logger that records what the plugin reports."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, str]] = []
        self.callback = LOGGER(self._log)

    def _log(self, level, flags, file, line, fmt, arg) -> None:
        assert fmt == b"%s"
        self.records.append((level, flags, arg.decode()))

    def warnings(self) -> list[str]:
        return [text for level, _, text in self.records if level == NCCL_LOG_WARN]


def c_errors(messages: list[str], path: Path) -> list[ConfigError]:
    errors = []
    for text in messages:
        found = MESSAGE.fullmatch(text)
        assert found is not None and found.group(1) == str(path), text
        errors.append(ConfigError(int(found.group(2)), found.group(3)))
    return errors


RULES = [
    TunerRule("all-reduce", 0, 65536, 8, 1, "ring", "LL", 4, 0),
    TunerRule("all-reduce", 65536, 1 << 24, None, None, "tree", "LL128", 0, 0),
    TunerRule("all-gather", 1 << 20, None, 8, None, "ring", "Simple", 12, 1 << 19),
    TunerRule("reduce-scatter", 0, None, 16, 2, "tree", "Simple", 24, 0),
    TunerRule(None, 1 << 30, None, None, None, None, None, 2, 1 << 18),
    TunerRule("broadcast", 0, 1024, None, None, "collnet_direct", "LL", 3, 0),
]


def test_exports_exactly_v3_to_v6(lib):
    for version in VERSIONS:
        api = Tuner(lib, version).api
        assert api.name == b"lagom"
        assert api.init and api.getCollInfo
    assert Tuner(lib, "v6").api.getChunkSize
    for gone in ("ncclTunerPlugin_v2", "ncclTunerPlugin_v1", "ncclTunerPlugin_v7"):
        with pytest.raises(ValueError):
            c_void_p.in_dll(lib, gone)


@pytest.mark.parametrize("version", VERSIONS)
def test_chooses_what_the_config_says(lib, use_config, version):
    use_config(render_config(RULES))
    tuner = Tuner(lib, version)
    ctx = tuner.init(8, 1)
    table = cost_table()
    for kind, nbytes, want_pick, want_nc in [
        ("all-reduce", 0, (1, 0), 4),
        ("all-reduce", 65535, (1, 0), 4),
        ("all-reduce", 65536, (0, 1), 0),
        ("all-gather", 1 << 20, (1, 2), 12),
        ("all-gather", 1 << 40, (1, 2), 12),
    ]:
        out, nchannels = tuner.coll_info(ctx, kind, nbytes, table)
        assert (nccl_pick(out), nchannels) == (want_pick, want_nc)
        a, p = want_pick
        cells = [(i, j) for i in range(NUM_ALGO) for j in range(NUM_PROTO)]
        assert [(i, j) for i, j in cells if out[i][j] != table[i][j]] == [(a, p)]
    tuner.destroy(ctx)


@pytest.mark.parametrize("version", VERSIONS)
def test_unmatched_calls_keep_nccl_choice(lib, use_config, version):
    use_config(render_config(RULES))
    tuner = Tuner(lib, version)
    table = cost_table()
    eight, sixteen_on_one_node = tuner.init(8, 1), tuner.init(16, 1)
    for ctx, kind, nbytes in [
        (eight, "all-reduce", 1 << 24),  # past every all-reduce range
        (eight, "all-gather", (1 << 20) - 1),  # below the all-gather range
        (eight, "all-to-all", 4096),  # no rule for the kind
        (eight, "reduce-scatter", 4096),  # rule is for 16 ranks on 2 nodes
        (sixteen_on_one_node, "reduce-scatter", 4096),
        (sixteen_on_one_node, "all-gather", 1 << 20),  # rule is for 8 ranks
    ]:
        assert tuner.coll_info(ctx, kind, nbytes, table) == (table, 0)
    tuner.destroy(eight)
    tuner.destroy(sixteen_on_one_node)


@pytest.mark.parametrize("version", VERSIONS)
def test_rule_for_a_combination_nccl_cannot_run_is_not_applied(lib, use_config, version):
    use_config(render_config(RULES))
    tuner = Tuner(lib, version)
    ctx = tuner.init(4, 1)
    runnable, not_runnable = cost_table(ignored=()), cost_table(ignored=((2, 0),))
    out, nchannels = tuner.coll_info(ctx, "broadcast", 512, runnable)
    assert (nccl_pick(out), nchannels) == ((2, 0), 3)
    assert tuner.coll_info(ctx, "broadcast", 512, not_runnable) == (not_runnable, 0)
    tuner.destroy(ctx)


@pytest.mark.parametrize("version", VERSIONS)
def test_wildcard_algorithm_sets_only_channels(lib, use_config, version):
    use_config(render_config(RULES))
    tuner = Tuner(lib, version)
    ctx = tuner.init(32, 4)
    table = cost_table()
    assert tuner.coll_info(ctx, "all-to-all", 1 << 30, table) == (table, 2)
    tuner.destroy(ctx)


def test_chunk_size_v6(lib, use_config):
    use_config(render_config(RULES))
    tuner = Tuner(lib, "v6")
    ctx = tuner.init(8, 1)
    ring, simple, tree, ll = 1, 2, 0, 0
    assert tuner.chunk_size(ctx, "all-gather", 1 << 21, ring, simple, default=1 << 21) == 1 << 19
    # NCCL runs another algorithm/protocol than the rule's: its chunk stays.
    assert tuner.chunk_size(ctx, "all-gather", 1 << 21, tree, simple, default=1 << 21) == 1 << 21
    # Rule with no chunk, and a call no rule matches.
    assert tuner.chunk_size(ctx, "all-reduce", 1024, ring, ll, default=4096) == 4096
    assert tuner.chunk_size(ctx, "reduce-scatter", 1024, ring, simple, default=4096) == 4096
    # Wildcard algorithm: the chunk applies to whatever NCCL runs.
    assert tuner.chunk_size(ctx, "all-reduce", 1 << 31, tree, ll, default=4096) == 1 << 18
    tuner.destroy(ctx)


@pytest.mark.parametrize(
    "content",
    [
        None,  # file missing
        b"",
        b"\x00\xff\xfe garbage \x01\n\n\x7f",
        b"# lagom-tuner-config v9\nall-reduce 0 * * * ring LL 4 0\n",
        ("# lagom-tuner-config v1\n" + "all-reduce 0 x\n" * 500 + "\xff" * 5000).encode("latin-1"),
    ],
)
@pytest.mark.parametrize("version", VERSIONS)
def test_bad_config_files_keep_nccl_choice(
    lib, use_config, tmp_path, monkeypatch, capfd, content, version
):
    if content is None:
        monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "does-not-exist.conf"))
    else:
        use_config(content)
    tuner = Tuner(lib, version)
    ctx = tuner.init(8, 1)
    table = cost_table()
    for kind in TUNER_KINDS:
        assert tuner.coll_info(ctx, kind, 4096, table) == (table, 0)
    if version == "v6":
        assert tuner.chunk_size(ctx, "all-reduce", 4096, 1, 2, default=777) == 777
    tuner.destroy(ctx)
    assert "lagom-tuner: " in capfd.readouterr().err


def test_unset_env_and_directory_path_keep_nccl_choice(lib, tmp_path, monkeypatch):
    tuner, table = Tuner(lib, "v6"), cost_table()
    for value in (None, "", str(tmp_path)):
        if value is None:
            monkeypatch.delenv(CONFIG_ENV, raising=False)
        else:
            monkeypatch.setenv(CONFIG_ENV, value)
        log = Captured()
        ctx = tuner.init(8, 1, log.callback)
        assert tuner.coll_info(ctx, "all-reduce", 64, table) == (table, 0)
        tuner.destroy(ctx)
        assert len(log.warnings()) == 1 and CONFIG_ENV in log.warnings()[0]


BAD_LINES = """\
# lagom-tuner-config v1
all-reduce 0 65536 8 1 ring LL 4 0      # fine
all-reduce 0 65536 8 1 ring LL 4
allreduce 0 * * * ring LL 4 0

all-gather -1 * * * ring LL 4 0
all-gather 0 1e6 * * ring LL 4 0
all-gather 0 * 0 * ring LL 4 0
all-gather 0 * * two ring LL 4 0
all-gather 0 * * * Ring LL 4 0
all-gather 0 * * * ring ll 4 0
all-gather 0 * * * ring LL 65 0
all-gather 0 * * * ring LL 4 -5
all-gather 100 100 * * ring LL 4 0
all-gather 0 * * * ring * 4 0
all-gather 0 99999999999999999999 * * ring LL 4 0
collective-permute 0 * * * ring LL 4 0
reduce-scatter 0 * * * * * 0 0 extra
  \t   # only a comment
broadcast 0 * * * pat Simple 0 0
"""


def test_malformed_lines_reported_with_line_numbers_as_python_reports_them(lib, use_config, capfd):
    path = use_config(BAD_LINES)
    rules, errors = parse_config(BAD_LINES)
    assert [e.line for e in errors] == [3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]
    assert rules == [
        TunerRule("all-reduce", 0, 65536, 8, 1, "ring", "LL", 4, 0),
        TunerRule("broadcast", 0, None, None, None, "pat", "Simple", 0, 0),
    ]
    tuner = Tuner(lib, "v5")
    capfd.readouterr()
    ctx = tuner.init(8, 1)  # no logger: the plugin writes to stderr
    stderr_lines = capfd.readouterr().err.splitlines()
    assert c_errors(stderr_lines, path) == errors
    log = Captured()
    ctx_logged = tuner.init(8, 1, log.callback)
    assert c_errors(log.warnings(), path) == errors
    assert all(flags == NCCL_TUNING for _, flags, _ in log.records)
    # The good lines around the bad ones still apply.
    out, nchannels = tuner.coll_info(ctx, "all-reduce", 100, cost_table())
    assert (nccl_pick(out), nchannels) == ((1, 0), 4)
    tuner.destroy(ctx)
    tuner.destroy(ctx_logged)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty file: expected '# lagom-tuner-config v1' on line 1"),
        ("\n", "expected '# lagom-tuner-config v1' on line 1, got ''"),
        (
            "all-reduce 0 * * * ring LL 4 0\n",
            "expected '# lagom-tuner-config v1' on line 1, got 'all-reduce 0 * * * ring LL 4 0'",
        ),
        ("# lagom-tuner-config v1 \r\n", None),
        ("# lagom-tuner-config v1", None),
    ],
)
def test_header_checked_like_the_plugin(lib, use_config, text, message):
    path = use_config(text)
    expected = [] if message is None else [ConfigError(1, message)]
    assert parse_config(text) == ([], expected)
    log = Captured()
    Tuner(lib, "v4").destroy(Tuner(lib, "v4").init(8, 1, log.callback))
    assert c_errors(log.warnings(), path) == expected


TOKENS = st.sampled_from(
    ["*", "0", "1", "8", "64", "65", "4096", "-3", "x", "ring", "tree", "nvls", "LL", "LL128"]
    + ["Simple", "ll", "all-reduce", "all-gather", "reduce", "all-to-all", "#", "a" * 50]
    + [str(2**64)]
)
LINES = st.lists(TOKENS, max_size=11).map(" ".join) | st.text(
    alphabet=" \t*#0123456789abcLS-", max_size=30
)


FIXTURES_OK = [HealthCheck.function_scoped_fixture]  # use_config rewrites one file per example


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES_OK)
@given(lines=st.lists(LINES, max_size=12))
def test_c_and_python_parsers_agree(lib, use_config, lines):
    text = CONFIG_HEADER + "\n" + "\n".join(lines) + "\n"
    path = use_config(text)
    rules, errors = parse_config(text)
    log = Captured()
    tuner = Tuner(lib, "v6")
    ctx = tuner.init(8, 1, log.callback)
    assert c_errors(log.warnings(), path) == errors
    table = cost_table()
    for kind in TUNER_KINDS:
        for nbytes in (0, 1, 8, 64, 4096, 1 << 40):
            rule = match_rule(rules, kind, nbytes, 8, 1)
            assert tuner.coll_info(ctx, kind, nbytes, table) == expected_coll_info(rule, table)
    tuner.destroy(ctx)


SIZES = st.sampled_from([0, 1, 1000, 1 << 10, 1 << 16, 1 << 20, 3 << 20, 1 << 30])


@st.composite
def rules_strategy(draw) -> TunerRule:
    algorithm = draw(st.sampled_from((None,) + ALGORITHMS))
    min_bytes = draw(SIZES)
    upper = draw(st.none() | SIZES.filter(lambda s: s > min_bytes))
    return TunerRule(
        kind=draw(st.sampled_from((None,) + tuple(TUNER_KINDS))),
        min_bytes=min_bytes,
        max_bytes=upper,
        nranks=draw(st.sampled_from((None, 2, 8))),
        nnodes=draw(st.sampled_from((None, 1, 2))),
        algorithm=algorithm,
        protocol=None if algorithm is None else draw(st.sampled_from(PROTOCOLS)),
        nchannels=draw(st.integers(0, 64)),
        chunk_bytes=draw(st.sampled_from((0, 1 << 17, 1 << 21))),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES_OK)
@given(
    rules=st.lists(rules_strategy(), max_size=8),
    nranks=st.sampled_from((2, 8)),
    nnodes=st.sampled_from((1, 2)),
)
def test_render_config_round_trips_through_the_plugin(lib, use_config, rules, nranks, nnodes):
    text = render_config(rules)
    assert parse_config(text) == (rules, [])
    use_config(text)
    tuner = Tuner(lib, "v6")
    log = Captured()
    ctx = tuner.init(nranks, nnodes, log.callback)
    assert log.warnings() == []
    table = cost_table(ignored=((3, 1),))
    for kind in TUNER_KINDS:
        for nbytes in (0, 1, 1000, 1 << 16, (1 << 20) + 1, 1 << 30, 1 << 40):
            rule = match_rule(rules, kind, nbytes, nranks, nnodes)
            assert tuner.coll_info(ctx, kind, nbytes, table) == expected_coll_info(rule, table)
            for algo, proto in ((1, 2), (0, 0)):
                want = 5
                if rule is not None and rule.chunk_bytes and (
                    rule.algorithm is None
                    or (ALGORITHMS.index(rule.algorithm), PROTOCOLS.index(rule.protocol))
                    == (algo, proto)
                ):
                    want = rule.chunk_bytes
                assert tuner.chunk_size(ctx, kind, nbytes, algo, proto, default=5) == want
    tuner.destroy(ctx)


def test_concurrent_calls_from_eight_threads(lib, use_config):
    use_config(render_config(RULES))
    tuners = [Tuner(lib, v) for v in VERSIONS]
    shared = {t.version: t.init(8, 1) for t in tuners}
    table = cost_table()
    queries = [(k, n) for k in TUNER_KINDS for n in (0, 100, 65536, 1 << 20, 1 << 30)]
    expected = {q: expected_coll_info(match_rule(RULES, q[0], q[1], 8, 1), table) for q in queries}
    failures: list[str] = []
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        tuner = tuners[worker % len(tuners)]
        own = tuner.init(8, 1)  # inits race with other threads' calls too
        start.wait()
        for i in range(1000):
            query = queries[(worker + i) % len(queries)]
            ctx = shared[tuner.version] if i % 2 else own
            got = tuner.coll_info(ctx, *query, table)
            if got != expected[query]:
                failures.append(f"worker {worker} call {i} {query}: {got} != {expected[query]}")
        tuner.destroy(own)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    for tuner in tuners:
        tuner.destroy(shared[tuner.version])


def test_rule_from_collective_params_uses_plan_spellings():
    # Every algorithm a plan names reaches the plugin, except NCCL's symmetric kernels, which
    # NCCL runs before it asks any tuner, and XLA's one-shot kernel, which is not NCCL's (a plan
    # leaves both out of the config).
    assert set(params_lib.ALGORITHMS) - {"symmetric", "one_shot"} <= set(ALGORITHMS)
    assert set(params_lib.PROTOCOLS) == set(PROTOCOLS)
    params = params_lib.CollectiveParams("tree", "LL128", nchannels=6, chunk_bytes=1 << 18)
    rule = TunerRule.from_params("all-gather", params, min_bytes=1024, max_bytes=1 << 20, nranks=8)
    assert rule == TunerRule("all-gather", 1024, 1 << 20, 8, None, "tree", "LL128", 6, 1 << 18)
    assert parse_config(render_config([rule])) == ([rule], [])
    # NVLS and NVLSTree run their communicator's NVLS CTAs and chunks: the rule keeps NCCL's (0).
    tree = TunerRule.from_params("all-reduce", params_lib.CollectiveParams("nvls_tree", "Simple", 16, 128 << 10),
                                 nranks=16, nnodes=2)
    assert (tree.algorithm, tree.nchannels, tree.chunk_bytes) == ("nvls_tree", 0, 0)
    assert parse_config(render_config([tree])) == ([tree], [])


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"kind": "collective-permute"}, "point-to-point"),
        ({"kind": "allreduce"}, "unknown kind"),
        ({"min_bytes": 10, "max_bytes": 10}, "max_bytes must be above"),
        ({"algorithm": "ring"}, "both be set"),
        ({"nchannels": 65}, "nchannels must be in [0, 64]"),
        ({"nranks": 0}, "nranks must be positive"),
        ({"algorithm": "ring", "protocol": "simple"}, "unknown protocol 'simple'"),
    ],
)
def test_rule_validation_names_the_bad_input(fields, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        TunerRule(**{"kind": "all-reduce", **fields})


def test_tuner_env_gives_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = tuner_env("build/libnccl-tuner-lagom.so", "plan/tuner.conf")
    assert env == {
        "NCCL_TUNER_PLUGIN": str(tmp_path / "build/libnccl-tuner-lagom.so"),
        CONFIG_ENV: str(tmp_path / "plan/tuner.conf"),
    }


def test_build_without_a_compiler_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(TunerBuildError, match="CC='no-such-compiler-xyz'"):
        build_tuner(tmp_path)
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TunerBuildError, match="no C compiler found on PATH"):
        build_tuner(tmp_path)
