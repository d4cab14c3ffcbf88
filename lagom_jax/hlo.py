"""A parser of XLA's HLO text format into a small, read-only Module IR.

The text format is what ``compiled.as_text()`` prints, what ``--xla_dump_to`` writes on
GPUs, and what XLA's own tests use. We parse it ourselves (instead of going through
jaxlib's C++ parser) because we need GPU-pipeline modules dumped on machines we do not
have, must work without a GPU plugin, and want errors that point at a line and column.

The parser is line-oriented: XLA prints one instruction per line, so each line is cut
with precompiled regular expressions and a single bracket/string scan. Attribute values
are kept as raw text and only the few that later stages need (replica groups, backend
config, metadata, ...) are decoded, on demand, by methods of :class:`Instruction`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "Computation",
    "HloParseError",
    "Instruction",
    "Module",
    "Shape",
    "parse",
    "parse_replica_groups",
    "parse_source_target_pairs",
]


class HloParseError(ValueError):
    """Malformed HLO text. ``line`` and ``col`` are 1-based positions in the input."""

    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(f"line {line}, col {col}: {message}")
        self.line = line
        self.col = col
        self.reason = message


# Bits per element of every element type XLA prints (xla/xla_data.proto PrimitiveType).
_FIXED_BITS = {
    "pred": 8, "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "token": 0, "opaque": 0,
}  # fmt: skip


def dtype_bits(dtype: str) -> int | None:
    """Bits per element, or None for an element type XLA does not have."""
    bits = _FIXED_BITS.get(dtype)
    if bits is None and dtype.startswith("f8e"):
        return 8  # all fp8 variants (f8e4m3fn, f8e5m2, f8e8m0fnu, ...) are one byte
    return bits


@dataclasses.dataclass(frozen=True)
class Shape:
    """An array shape (``dtype``, ``dims``) or a tuple of shapes (``dtype == "tuple"``)."""

    dtype: str
    dims: tuple[int, ...] = ()
    tuple_shapes: tuple[Shape, ...] = ()
    layout: str = ""

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @functools.cached_property
    def elements(self) -> int:
        """Elements of an array; the sum over the leaves of a tuple."""
        if self.is_tuple:
            return sum(s.elements for s in self.tuple_shapes)
        return math.prod(self.dims)

    @functools.cached_property
    def bytes(self) -> int:
        """Bytes of the buffer (sub-byte types packed, rounded up per array)."""
        if self.is_tuple:
            return sum(s.bytes for s in self.tuple_shapes)
        return (self.elements * (dtype_bits(self.dtype) or 0) + 7) // 8

    def leaves(self) -> tuple[Shape, ...]:
        """The array shapes of a (possibly nested) tuple, in order."""
        if not self.is_tuple:
            return (self,)
        return tuple(leaf for s in self.tuple_shapes for leaf in s.leaves())

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


# Opcodes whose parenthesised "operands" are literal text, not instruction names.
_LITERAL_OPERAND_OPCODES = frozenset({"constant", "parameter"})
_CALL_ATTRS = (
    "calls", "to_apply", "condition", "body", "branch_computations",
    "true_computation", "false_computation",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class Instruction:
    """One HLO instruction. Attribute values are the raw printed text.

    Compared by identity (``eq=False``): two instructions with equal text in different
    places are different instructions, and hashing a whole attribute map would be waste.
    """

    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    attributes: Mapping[str, str]
    called_computations: tuple[str, ...] = ()
    is_root: bool = False
    # Raw text inside the parentheses for constant (the literal) and parameter (number).
    literal: str = ""
    line: int = 0
    source: str = dataclasses.field(default="", repr=False)

    def _error(self, key: str, message: str) -> HloParseError:
        col = self.source.find(key + "=") + 1 if key else 1
        return HloParseError(self.line, max(col, 1), f"{self.name}: {message}")

    def backend_config(self) -> dict:
        """``backend_config`` decoded as JSON ({} when absent)."""
        raw = self.attributes.get("backend_config")
        if raw is None:
            return {}
        if raw.startswith('"'):
            raw = _unquote(raw)
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise self._error("backend_config", f"backend_config is not JSON ({e})") from None
        if not isinstance(value, dict):
            raise self._error("backend_config", "backend_config is not a JSON object")
        return value

    def known_trip_count(self) -> int | None:
        """``backend_config.known_trip_count.n`` of a while loop, if XLA knew it."""
        n = self.backend_config().get("known_trip_count", {})
        n = n.get("n") if isinstance(n, dict) else None
        if n is None:
            return None
        try:
            count = int(n)
        except (TypeError, ValueError):
            raise self._error(
                "backend_config", f"known_trip_count {n!r} is not an integer"
            ) from None
        if count < 0:
            raise self._error("backend_config", f"known_trip_count {count} is negative")
        return count

    def metadata(self) -> dict[str, str]:
        """``metadata={op_name="..." source_file="..." ...}`` as a dict of strings."""
        return self._key_values("metadata")

    def frontend_attributes(self) -> dict[str, str]:
        """``frontend_attributes={_xla_stream_annotation="1",...}`` as a dict."""
        return self._key_values("frontend_attributes")

    def _key_values(self, key: str) -> dict[str, str]:
        raw = self.attributes.get(key)
        if raw is None:
            return {}
        if not (raw.startswith("{") and raw.endswith("}")):
            raise self._error(key, f"{key} must be {{k=v ...}}, got {raw[:40]!r}")
        out: dict[str, str] = {}
        for m in _KV_RE.finditer(raw, 1, len(raw) - 1):
            out[m.group(1)] = _unquote(m.group(2)) if m.group(2).startswith('"') else m.group(2)
        return out

    def replica_groups(self, num_devices: int = 0) -> tuple[tuple[int, ...], ...]:
        """Device groups of a collective in any printed form (``()`` when absent).

        An empty list ``{}`` means one group of all devices, which needs ``num_devices``.
        """
        raw = self.attributes.get("replica_groups")
        if raw is None:
            return ()
        try:
            groups = parse_replica_groups(raw)
        except ValueError as e:
            raise self._error("replica_groups", str(e)) from None
        if not groups and num_devices > 0:
            return (tuple(range(num_devices)),)
        return groups

    def source_target_pairs(self) -> tuple[tuple[int, int], ...]:
        raw = self.attributes.get("source_target_pairs")
        if raw is None:
            return ()
        try:
            return parse_source_target_pairs(raw)
        except ValueError as e:
            raise self._error("source_target_pairs", str(e)) from None

    def int_list(self, key: str) -> tuple[int, ...]:
        """An attribute printed as ``{1,2}`` (e.g. ``lhs_contracting_dims``)."""
        raw = self.attributes.get(key)
        if raw is None:
            return ()
        m = _INT_LIST_RE.fullmatch(raw)
        if m is None:
            raise self._error(key, f"{key} must be a list like {{0,1}}, got {raw[:40]!r}")
        return tuple(int(x) for x in m.group(1).split(",") if x.strip())


@dataclasses.dataclass(frozen=True, eq=False)
class Computation:
    """A named list of instructions; in a scheduled module the list order is the schedule."""

    name: str
    instructions: tuple[Instruction, ...]
    is_entry: bool = False

    @functools.cached_property
    def by_name(self) -> Mapping[str, Instruction]:
        return MappingProxyType({i.name: i for i in self.instructions})

    @property
    def root(self) -> Instruction:
        for inst in reversed(self.instructions):
            if inst.is_root:
                return inst
        return self.instructions[-1]

    @property
    def parameters(self) -> tuple[Instruction, ...]:
        """Parameters ordered by their parameter number."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return tuple(sorted(params, key=lambda i: int(i.literal)))


@dataclasses.dataclass(frozen=True, eq=False)
class Module:
    """An HLO module: its computations (in printed order) and which one is the entry."""

    name: str
    computations: tuple[Computation, ...]
    entry: Computation
    attributes: Mapping[str, str]

    @functools.cached_property
    def by_name(self) -> Mapping[str, Computation]:
        return MappingProxyType({c.name: c for c in self.computations})

    def computation(self, name: str) -> Computation:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"module {self.name!r} has no computation {name!r}") from None

    @property
    def is_scheduled(self) -> bool:
        return self.attributes.get("is_scheduled") == "true"

    @property
    def num_devices(self) -> int:
        """replica_count × num_partitions (both default to 1)."""
        return _int_attr(self.attributes, "replica_count") * _int_attr(
            self.attributes, "num_partitions"
        )


def _int_attr(attrs: Mapping[str, str], key: str) -> int:
    return int(attrs.get(key, "1"))  # validated by the parser


# ----------------------------------------------------------------------------- helpers

_KV_RE = re.compile(r'([\w.\-]+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')
_INT_LIST_RE = re.compile(r"\{([\d,\s]*)\}")
_UNESCAPE_RE = re.compile(r"\\(.)")


def _unquote(s: str) -> str:
    """The body of a printed C string: strip the quotes, undo backslash escapes."""
    body = s[1:-1]
    if "\\" not in body:
        return body
    return _UNESCAPE_RE.sub(lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


_EXPLICIT_GROUPS_RE = re.compile(r"\{\s*(\{[\d,\s]*\}(?:\s*,\s*\{[\d,\s]*\})*)?\s*\}")
_IOTA_RE = re.compile(
    r"\[(\d+(?:,\d+)*)\]<=\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?"
)
_MESH_RE = re.compile(
    r"mesh\[([^\]]*)\](?:,\s*device_ids=\(([^()]*(?:\([\d,]*\))?)\))?\s*\{([^}]*)\}"
)
_DEVICE_IOTA_RE = re.compile(r"\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?")
_MESH_AXIS_RE = re.compile(r"'([^']+)'\s*=\s*(\d+)")
_AXIS_REF_RE = re.compile(r"'([^']+)'(?::\((\d+)\)(\d+))?")


# Larger device counts than any machine has are a corrupted file, not a cluster.
_MAX_DEVICES = 1 << 20


def _iota(reshape: tuple[int, ...], dims: tuple[int, ...], perm: tuple[int, ...] | None):
    """Device ids of XLA's iota tile assignment ``[reshape]<=[dims]T(perm)``.

    The ids 0..N-1 are laid out row-major in ``dims``, transposed by ``perm`` and then
    read row-major into ``reshape`` (xla/hlo/ir/tile_assignment.h, IotaTileAssignment).
    """
    n = math.prod(dims)
    if n > _MAX_DEVICES:
        raise ValueError(f"iota over {n} devices exceeds {_MAX_DEVICES}")
    if math.prod(reshape) != n:
        raise ValueError(f"iota reshape {list(reshape)} does not hold {n} devices")
    perm = perm if perm is not None else tuple(range(len(dims)))
    if sorted(perm) != list(range(len(dims))):
        raise ValueError(f"T{perm} is not a permutation of {len(dims)} dims")
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    tdims = [dims[p] for p in perm]
    tstrides = [strides[p] for p in perm]
    ids = []
    for flat in range(n):
        rem, dev = flat, 0
        for d in range(len(tdims) - 1, -1, -1):
            rem, idx = divmod(rem, tdims[d])
            dev += idx * tstrides[d]
        ids.append(dev)
    return ids


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(","))


def parse_replica_groups(raw: str) -> tuple[tuple[int, ...], ...]:
    """Replica groups from any of XLA's three printed forms.

    * explicit ``{{0,1},{2,3}}`` (``{}`` = all devices, returned as ``()``);
    * iota ``[2,4]<=[4,2]T(1,0)``: a [groups, group_size] array of device ids;
    * mesh axes ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}``: one group per index of the
      other axes, holding the devices that differ only along the named axes (mesh
      positions are numbered row-major; ``'a':(p)s`` names the sub-axis of size s after
      a pre-size p). An optional ``, device_ids=([4,2]T(1,0))`` (iota) or
      ``, device_ids=(0,2,...)`` says which device sits at each position; without it
      position i is device i.
    """
    raw = raw.strip()
    m = _EXPLICIT_GROUPS_RE.fullmatch(raw)
    if m:
        if not m.group(1):
            return ()
        return tuple(
            tuple(int(x) for x in g.split(",") if x.strip())
            for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))
        )
    m = _IOTA_RE.fullmatch(raw)
    if m:
        reshape = _ints(m.group(1))
        ids = _iota(reshape, _ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None)
        size = math.prod(reshape[1:])
        return tuple(tuple(ids[i : i + size]) for i in range(0, len(ids), size))
    m = _MESH_RE.fullmatch(raw)
    if m:
        groups = _mesh_groups(m.group(1), m.group(3))
        if m.group(2) is None:
            return groups
        ids = _device_ids(m.group(2))
        if len(ids) != sum(len(g) for g in groups):
            raise ValueError(
                f"device_ids=({m.group(2)}) does not list one device per mesh position"
            )
        return tuple(tuple(ids[p] for p in g) for g in groups)
    raise ValueError(
        f"replica_groups {raw[:60]!r} is in none of the forms {{{{0,1}},{{2,3}}}}, "
        "[2,4]<=[8] or mesh['a'=2,'b'=4] {'a'}"
    )


def _device_ids(raw: str) -> list[int]:
    """The device at each mesh position: ``[4,2]T(1,0)`` (iota) or ``0,2,4,...``."""
    m = _DEVICE_IOTA_RE.fullmatch(raw.strip())
    if m:
        dims = _ints(m.group(1))
        return _iota((math.prod(dims),), dims, _ints(m.group(2)) if m.group(2) else None)
    try:
        return [int(x) for x in raw.split(",")]
    except ValueError:
        raise ValueError(f"device_ids=({raw}) is neither [dims]T(perm) nor a list of ids") from None


def _mesh_groups(axes_text: str, refs_text: str) -> tuple[tuple[int, ...], ...]:
    axes = [(n, int(s)) for n, s in _MESH_AXIS_RE.findall(axes_text)]
    if not axes or len(axes) != axes_text.count("="):
        raise ValueError(f"bad mesh axes [{axes_text}]")
    names = [n for n, _ in axes]
    # Split every referenced axis into (major, sub, minor) pieces so a sub-axis is an axis.
    split: list[tuple[str, int, bool]] = []  # (axis, size, in_group)
    refs: dict[str, tuple[int, int] | None] = {}
    for ref in _AXIS_REF_RE.finditer(refs_text):
        if ref.group(1) not in names:
            raise ValueError(f"mesh axis {ref.group(1)!r} is not in [{axes_text}]")
        refs[ref.group(1)] = (int(ref.group(2)), int(ref.group(3))) if ref.group(2) else None
    if refs_text.strip() and not refs:
        raise ValueError(f"bad mesh axis list {{{refs_text}}}")
    for name, size in axes:
        if name not in refs:
            split.append((name, size, False))
        elif refs[name] is None:
            split.append((name, size, True))
        else:
            pre, sub = refs[name]
            if pre * sub == 0 or size % (pre * sub):
                raise ValueError(f"sub-axis ({pre}){sub} does not divide axis {name!r}={size}")
            split += [(name, pre, False), (name, sub, True), (name, size // (pre * sub), False)]
    sizes = [s for _, s, _ in split]
    n = math.prod(sizes)
    if n > _MAX_DEVICES:
        raise ValueError(f"mesh of {n} devices exceeds {_MAX_DEVICES}")
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    outer = [i for i, (_, _, g) in enumerate(split) if not g]
    inner = [i for i, (_, _, g) in enumerate(split) if g]

    def ids(dims: list[int]) -> list[int]:
        out = [0]
        for d in dims:
            out = [base + k * strides[d] for base in out for k in range(sizes[d])]
        return out

    groups = tuple(tuple(o + i for i in ids(inner)) for o in ids(outer))
    assert sum(len(g) for g in groups) == n
    return groups


def parse_source_target_pairs(raw: str) -> tuple[tuple[int, int], ...]:
    """``{{0,1},{1,2}}`` → ((0, 1), (1, 2))."""
    m = _EXPLICIT_GROUPS_RE.fullmatch(raw.strip())
    if m is None:
        raise ValueError(f"source_target_pairs {raw[:60]!r} must look like {{{{0,1}},{{1,2}}}}")
    pairs = []
    for g in re.findall(r"\{([\d,\s]*)\}", m.group(1) or ""):
        ids = [int(x) for x in g.split(",") if x.strip()]
        if len(ids) != 2:
            raise ValueError(f"source_target_pairs entry {{{g}}} is not a (source,target) pair")
        pairs.append((ids[0], ids[1]))
    return tuple(pairs)


# ----------------------------------------------------------------------------- parser

_NAME = r"[A-Za-z_$][\w.\-$]*"
_INST_HEAD_RE = re.compile(rf"\s*(ROOT\s+)?%?({_NAME})\s*=\s*")
_COMP_HEAD_RE = re.compile(rf"(ENTRY\s+)?%?({_NAME})\s*(\(.*\)\s*->.*?)?\s*\{{\s*$")
_MODULE_RE = re.compile(rf"HloModule\s+%?({_NAME})\s*(?:,\s*(.*))?$")
_ARRAY_SHAPE_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")
_OPCODE_RE = re.compile(r"\s*([a-z][\w\-]*)\(")
_TOKEN_RE = re.compile(r'[(){}\[\],]|"(?:[^"\\\n]|\\.)*"|/\*.*?\*/')
_OPERAND_NAME_RE = re.compile(rf"%?({_NAME})$")
_ATTR_KEY_RE = re.compile(r"\s*([\w\-.]+)=")
_ATTR_HEAD_RE = re.compile(r"\s*,\s*([\w\-.]+)=")
_STRING = r'"(?:[^"\\\n]|\\.)*"'
# One attribute whose value is a string, a brace group without nested braces (strings
# inside allowed), or a bare word, followed by the next comma or the end of the line.
_FAST_ATTR_RE = re.compile(
    rf'\s*,\s*([\w\-.]+)=({_STRING}|\{{(?:[^{{}}"\n]|{_STRING})*\}}|[^,{{}}\[\]()"\s]+)\s*(?=,|$)'
)
_BARE_NAME_RE = re.compile(rf"%?({_NAME})")
_SIMPLE_OPERANDS_RE = re.compile(rf"\(\s*((?:%?{_NAME}\s*,\s*)*%?{_NAME})?\s*\)")
_COMMENT_RE = re.compile(r"/\*.*?\*/")
_SECTION_RE = re.compile(r"[A-Z][A-Za-z]*$")
_DIM_RE = re.compile(r"\s*(<=)?(\d+)\s*$")
_CLOSE = {")": "(", "}": "{", "]": "["}
_OPENERS = {"(": ")", "{": "}", "[": "]"}


class _Parser:
    """State of one parse: the lines, and caches for shapes that repeat thousands of times."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.shape_cache: dict[str, Shape] = {}

    # -- shapes ---------------------------------------------------------------
    def shape_at(self, text: str, pos: int, lineno: int) -> tuple[Shape, int]:
        """Parse the shape starting at ``text[pos]``; return it and the end position."""
        if pos < len(text) and text[pos] == "(":
            end = self.match_close(text, pos, lineno)
            key = text[pos:end]
            shape = self.shape_cache.get(key)
            if shape is None:
                shape = self.tuple_shape(text, pos, end, lineno)
                self.shape_cache[key] = shape
            return shape, end
        m = _ARRAY_SHAPE_RE.match(text, pos)
        if m is None:
            got = text[pos : pos + 20].split(" ")[0] or "end of line"
            raise HloParseError(lineno, pos + 1, f"expected shape, got {got!r}")
        key = m.group(0)
        shape = self.shape_cache.get(key)
        if shape is None:
            shape = self.array_shape(m, lineno, pos)
            self.shape_cache[key] = shape
        return shape, m.end()

    def array_shape(self, m: re.Match, lineno: int, pos: int) -> Shape:
        dtype = m.group(1)
        if dtype_bits(dtype) is None:
            raise HloParseError(lineno, pos + 1, f"unknown element type {dtype!r}")
        dims_text = m.group(2)
        dims = []
        if dims_text.strip():
            for d in dims_text.split(","):
                dm = _DIM_RE.match(d)
                if dm is None:
                    # Unbounded dynamic dims ('?') have no size we could cost.
                    raise HloParseError(
                        lineno, pos + 1, f"bad dimension {d.strip()!r} in {m.group(0)!r}"
                    )
                dims.append(int(dm.group(2)))
        return Shape(dtype, tuple(dims), (), m.group(3) or "")

    def tuple_shape(self, text: str, start: int, end: int, lineno: int) -> Shape:
        parts = []
        pos = start + 1
        while True:
            pos = _skip_space_comments(text, pos, lineno)
            if text[pos] == ")" and not parts:
                break
            shape, pos = self.shape_at(text, pos, lineno)
            parts.append(shape)
            pos = _skip_space_comments(text, pos, lineno)
            if text[pos] == ",":
                pos += 1
                continue
            if text[pos] == ")":
                break
            raise HloParseError(
                lineno, pos + 1, f"expected ',' or ')' in tuple shape, got {text[pos]!r}"
            )
        if pos + 1 != end:
            raise HloParseError(lineno, pos + 1, "unbalanced parentheses in tuple shape")
        return Shape("tuple", (), tuple(parts))

    # -- brackets -------------------------------------------------------------
    def match_close(self, text: str, pos: int, lineno: int) -> int:
        """Index just past the bracket that closes the one at ``text[pos]``."""
        stack = []
        for m in _TOKEN_RE.finditer(text, pos):
            tok = m.group(0)
            c = tok[0]
            if c in "({[":
                stack.append(c)
            elif c in ")}]":
                if not stack or stack[-1] != _CLOSE[c]:
                    raise HloParseError(lineno, m.start() + 1, f"unbalanced {c!r}")
                stack.pop()
                if not stack:
                    return m.end()
        raise HloParseError(lineno, pos + 1, f"{text[pos]!r} is never closed")

    # -- instructions ---------------------------------------------------------
    def instruction(self, line: str, lineno: int) -> Instruction:
        m = _INST_HEAD_RE.match(line)
        if m is None:
            got = line.strip().split(" ")[0]
            raise HloParseError(
                lineno, 1, f"expected instruction 'name = shape opcode(...)', got {got!r}"
            )
        is_root, name = m.group(1) is not None, m.group(2)
        shape, pos = self.shape_at(line, m.end(), lineno)
        om = _OPCODE_RE.match(line, pos)
        if om is None:
            got = line[pos : pos + 20].strip().split(" ")[0] or "end of line"
            raise HloParseError(lineno, pos + 2, f"expected opcode(, got {got!r}")
        opcode = om.group(1)
        open_pos = om.end() - 1
        # Fast path: plain operand names "(%a, %b)" (the usual case); anything else
        # (typed operands, literals, comments) goes through the bracket scanner.
        operands: tuple[str, ...] = ()
        literal = ""
        sm = _SIMPLE_OPERANDS_RE.match(line, open_pos)
        if sm is not None and opcode not in _LITERAL_OPERAND_OPCODES:
            close_pos = sm.end() - 1
            if sm.group(1):
                operands = tuple(_BARE_NAME_RE.findall(sm.group(1)))
        else:
            close_pos, operands, literal = self.operands(line, open_pos, opcode, lineno)
        attrs = self.attributes(line, close_pos + 1, lineno) if close_pos + 1 < len(line) else {}
        called = []
        for key in _CALL_ATTRS:
            v = attrs.get(key)
            if v is not None:
                for c in v.strip("{}").split(","):
                    c = c.strip().lstrip("%")
                    if not re.fullmatch(_NAME, c):
                        raise HloParseError(
                            lineno, line.find(key + "=") + 1, f"{key}= expects computation names, got {v[:40]!r}"
                        )
                    called.append(c)
        return Instruction(
            name, opcode, shape, operands, attrs, tuple(called), is_root, literal, lineno, line
        )

    def operands(self, line: str, open_pos: int, opcode: str, lineno: int):
        """(index of the closing paren, operand names, literal text) of ``opcode(...)``."""
        operand_cuts: list[int] = []
        close_pos = -1
        closers: list[str] = []  # the closing bracket each open bracket expects
        for tm in _TOKEN_RE.finditer(line, open_pos):
            tok = tm.group()
            if tok == ",":
                if len(closers) == 1:
                    operand_cuts.append(tm.start())
            elif tok in _OPENERS:
                closers.append(_OPENERS[tok])
            elif tok in _CLOSE:
                if not closers or closers.pop() != tok:
                    raise HloParseError(lineno, tm.start() + 1, f"unbalanced {tok!r}")
                if not closers:
                    close_pos = tm.start()
                    break
        if closers:
            raise HloParseError(
                lineno, len(line) + 1, f"unclosed {_CLOSE[closers[-1]]!r} at end of line"
            )
        inner = line[open_pos + 1 : close_pos]
        if opcode in _LITERAL_OPERAND_OPCODES:
            literal = inner.strip()
            if opcode == "parameter" and not literal.isdigit():
                raise HloParseError(
                    lineno, open_pos + 2, f"parameter number must be an integer, got {literal!r}"
                )
            return close_pos, (), literal
        names = []
        if inner.strip():
            start = open_pos + 1
            for cut in operand_cuts + [close_pos]:
                piece = _COMMENT_RE.sub("", line[start:cut]).strip()
                nm = _OPERAND_NAME_RE.search(piece)
                if nm is None or (nm.start() > 0 and piece[nm.start() - 1] not in " %"):
                    raise HloParseError(
                        lineno, start + 1, f"expected operand name, got {piece[:30]!r}"
                    )
                if nm.start() > 0:
                    # A typed operand: check the type is a shape.
                    self.shape_at(piece[: nm.start()].rstrip(" %"), 0, lineno)
                names.append(nm.group(1))
                start = cut + 1
        return close_pos, tuple(names), ""

    def attributes(self, line: str, pos: int, lineno: int) -> dict[str, str]:
        """``, key=value, ...`` from ``pos`` to the end of the line, values as raw text."""
        attrs: dict[str, str] = {}
        n = len(line)
        while pos < n:
            m = _FAST_ATTR_RE.match(line, pos)
            if m is not None:
                key, value, pos = m.group(1), m.group(2), m.end()
            else:
                km = _ATTR_HEAD_RE.match(line, pos)
                if km is None:
                    rest = line[pos:]
                    if not rest.strip():
                        break
                    if rest.lstrip().startswith(","):
                        col = pos + 1 + len(rest) - len(rest.lstrip(" ,"))
                        raise HloParseError(
                            lineno, col, f"expected attribute=value, got {rest.strip(' ,')[:30]!r}"
                        )
                    col = pos + 1 + len(rest) - len(rest.lstrip())
                    raise HloParseError(
                        lineno, col, f"expected ', attribute=value', got {rest.strip()[:30]!r}"
                    )
                end = self.value_end(line, km.end(), lineno)
                key, value, pos = km.group(1), line[km.end() : end].strip(), end
                if not value:
                    raise HloParseError(lineno, km.end() + 1, f"attribute {key} has no value")
            if key == "device_ids" and attrs.get("replica_groups", "").startswith("mesh["):
                # mesh[...], device_ids=(...) {axes}: one value split by its own comma.
                attrs["replica_groups"] += ", device_ids=" + value
                continue
            attrs[key] = value
        return attrs

    @staticmethod
    def value_end(line: str, pos: int, lineno: int) -> int:
        """Index of the comma that ends the attribute value starting at ``pos`` (or EOL)."""
        closers: list[str] = []
        for tm in _TOKEN_RE.finditer(line, pos):
            tok = tm.group()
            if tok == ",":
                if not closers:
                    return tm.start()
            elif tok in _OPENERS:
                closers.append(_OPENERS[tok])
            elif tok in _CLOSE:
                if not closers or closers.pop() != tok:
                    raise HloParseError(lineno, tm.start() + 1, f"unbalanced {tok!r}")
        if closers:
            raise HloParseError(
                lineno, len(line) + 1, f"unclosed {_CLOSE[closers[-1]]!r} at end of line"
            )
        return len(line)

    # -- module ---------------------------------------------------------------
    def module(self) -> Module:
        lines = self.lines
        n = len(lines)
        i = 0
        while i < n and not lines[i].strip():
            i += 1
        if i == n:
            raise HloParseError(1, 1, "empty input: expected 'HloModule <name>, ...'")
        m = _MODULE_RE.match(lines[i].strip())
        if m is None:
            raise HloParseError(
                i + 1, 1, f"expected 'HloModule <name>', got {lines[i].strip()[:30]!r}"
            )
        name = m.group(1)
        mod_attrs = self.split_attrs(m.group(2) or "", i + 1, lines[i].find(",") + 2)
        for key in ("replica_count", "num_partitions"):
            value = mod_attrs.get(key, "1")
            if not value.isdigit() or not 1 <= int(value) <= _MAX_DEVICES:
                raise HloParseError(
                    i + 1, lines[i].find(key) + 1, f"{key}={value} is not a device count in 1..{_MAX_DEVICES}"
                )
        i += 1
        computations: list[Computation] = []
        entry: Computation | None = None
        while i < n:
            raw = lines[i]
            stripped = raw.strip()
            if not stripped or stripped.startswith("//"):
                i += 1
                continue
            if _SECTION_RE.match(stripped):
                # Debug-info tables (FileNames, StackFrames, ...) run to the next blank line.
                i += 1
                while i < n and lines[i].strip():
                    i += 1
                continue
            hm = _COMP_HEAD_RE.match(stripped)
            if hm is None:
                raise HloParseError(
                    i + 1, 1, f"expected computation 'name (...) -> shape {{', got {stripped[:30]!r}"
                )
            if hm.group(3):
                self.match_close(hm.group(3), 0, i + 1)
            comp_line = i + 1
            i += 1
            insts: list[Instruction] = []
            while True:
                if i >= n:
                    raise HloParseError(
                        n, 1, f"computation {hm.group(2)} (line {comp_line}) is never closed with '}}'"
                    )
                body = lines[i]
                s = body.strip()
                if s == "}":
                    break
                if s and not s.startswith("//"):
                    insts.append(self.instruction(body, i + 1))
                i += 1
            i += 1
            if not insts:
                raise HloParseError(comp_line, 1, f"computation {hm.group(2)} has no instructions")
            comp = Computation(hm.group(2), tuple(insts), hm.group(1) is not None)
            self.check_computation(comp)
            computations.append(comp)
            if comp.is_entry:
                if entry is not None:
                    raise HloParseError(
                        comp_line, 1, f"second ENTRY computation {comp.name} (first: {entry.name})"
                    )
                entry = comp
        if not computations:
            raise HloParseError(n, 1, f"module {name} has no computations")
        module = Module(
            name, tuple(computations), entry or computations[-1], MappingProxyType(mod_attrs)
        )
        self.check_calls(module)
        return module

    def split_attrs(self, text: str, lineno: int, col0: int) -> dict[str, str]:
        out: dict[str, str] = {}
        if not text.strip():
            return out
        wrapped = "(" + text + ")"
        self.match_close(wrapped, 0, lineno)
        cuts = [-1]
        depth = 0
        for tm in _TOKEN_RE.finditer(text):
            c = tm.group(0)
            if c in ("(", "{", "["):
                depth += 1
            elif c in (")", "}", "]"):
                depth -= 1
            elif c == "," and depth == 0:
                cuts.append(tm.start())
        cuts.append(len(text))
        for a, b in zip(cuts, cuts[1:]):
            am = _ATTR_KEY_RE.match(text, a + 1, b)
            if am is None:
                raise HloParseError(
                    lineno, col0 + a + 1, f"expected key=value, got {text[a + 1 : b].strip()[:30]!r}"
                )
            out[am.group(1)] = text[am.end() : b].strip()
        return out

    @staticmethod
    def check_computation(comp: Computation) -> None:
        names = comp.by_name
        if len(names) != len(comp.instructions):
            seen: set[str] = set()
            for inst in comp.instructions:
                if inst.name in seen:
                    raise HloParseError(
                        inst.line, 1, f"instruction name {inst.name!r} defined twice"
                    )
                seen.add(inst.name)
        if sum(inst.is_root for inst in comp.instructions) > 1:
            inst = [x for x in comp.instructions if x.is_root][1]
            raise HloParseError(inst.line, 1, f"second ROOT in computation {comp.name}")
        numbers = set()
        defined: set[str] = set()
        for inst in comp.instructions:
            for op in inst.operands:
                if op not in defined:
                    col = _name_col(inst.source, op, inst.source.find("(", inst.source.find("=")))
                    problem = "is used before its definition" if op in names else f"is not defined in {comp.name}"
                    raise HloParseError(inst.line, col, f"operand {op!r} {problem}")
            defined.add(inst.name)
            if inst.opcode == "parameter":
                if inst.literal in numbers:
                    raise HloParseError(
                        inst.line, 1, f"parameter({inst.literal}) defined twice in {comp.name}"
                    )
                numbers.add(inst.literal)

    @staticmethod
    def check_calls(module: Module) -> None:
        known = module.by_name
        for comp in module.computations:
            for inst in comp.instructions:
                for c in inst.called_computations:
                    if c not in known:
                        col = _name_col(inst.source, c, 0)
                        raise HloParseError(
                            inst.line, col, f"{inst.name} calls unknown computation {c!r}"
                        )
        # Calls must form a DAG: the graph builder walks into called computations.
        state: dict[str, int] = {}

        def visit(comp: Computation) -> None:
            state[comp.name] = 1
            for inst in comp.instructions:
                for c in inst.called_computations:
                    if state.get(c) == 1:
                        raise HloParseError(
                            inst.line, 1, f"{inst.name} calls {c!r}, which calls back into {comp.name}"
                        )
                    if c not in state:
                        visit(known[c])
            state[comp.name] = 2

        for comp in module.computations:
            if comp.name not in state:
                visit(comp)


def _name_col(line: str, name: str, start: int) -> int:
    """1-based column of the name ``name`` (as a whole word) in ``line`` after ``start``."""
    m = re.compile(rf"(?<![\w.\-$]){re.escape(name)}(?![\w.\-$])").search(line, max(start, 0))
    return m.start() + 1 if m else 1


def _skip_space_comments(text: str, pos: int, lineno: int) -> int:
    n = len(text)
    while pos < n:
        if text[pos] == " ":
            pos += 1
        elif text.startswith("/*", pos):
            end = text.find("*/", pos + 2)
            if end < 0:
                raise HloParseError(lineno, pos + 1, "unclosed comment")
            pos = end + 2
        else:
            return pos
    raise HloParseError(lineno, pos + 1, "unexpected end of line in shape")


def parse(text: str) -> Module:
    """Parse HLO text (``compiled.as_text()``, an XLA dump, a test fixture) into a Module.

    Raises :class:`HloParseError` (a ValueError) naming the line and column of the first
    problem; no other exception escapes for any input string.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse() takes HLO text as str, got {type(text).__name__}")
    try:
        return _Parser(text).module()
    except HloParseError:
        raise
    except RecursionError:
        raise HloParseError(1, 1, "shape nesting too deep") from None
