"""A parser of XLA's HLO text format into a small, read-only Module IR.

The text format is what ``compiled.as_text()`` prints, what ``--xla_dump_to`` writes on
GPUs, and what XLA's own tests use. We parse it ourselves (instead of going through
jaxlib's C++ parser) because we need GPU-pipeline modules dumped on machines we do not
have, must work without a GPU plugin, and want errors that point at a line and column.

The grammar is XLA's own, read over the whole text (see the parser section): an
instruction may span lines, carry comments, leave out its shape (XLA infers it; so do we
for the opcodes whose cost matters) or hold an operand written as an instruction.
Attribute values are kept as raw text and only the few that later stages need (replica
groups, backend config, metadata, ...) are decoded, on demand, by methods of
:class:`Instruction`.
"""

from __future__ import annotations

import bisect
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
#
# The grammar is XLA's (openxla/xla xla/hlo/parser/hlo_lexer.cc and hlo_parser.cc: the
# lexer skips whitespace and comments between any two tokens, and the parser descends
# module > computation > instruction > shape / operands / attributes). It is read over
# the whole text, not line by line, so an instruction or the module header may span
# lines. Regular expressions match the common forms in one step (an array shape, a list of
# plain operand names, a key=value attribute); everything else goes through the general
# rules below.

_NAME = r"[A-Za-z_$][\w.\-$]*"
_STRING = r'"(?:[^"\\]|\\.)*"'
_WS_RE = re.compile(r"(?:\s+|/\*.*?\*/|//[^\n]*)*", re.S)
_WS_START = frozenset(" \t\n\r\f\v/")
_MODULE_RE = re.compile(rf"HloModule\s+%?({_NAME}):?")
_NAME_RE = re.compile(_NAME)
_INST_HEAD_RE = re.compile(rf"(ROOT\s+)?%?({_NAME})\s*=\s*")
# The common instruction head in one match: name, an array shape with a plain layout, the
# opcode and its '('.
_FAST_HEAD_RE = re.compile(
    rf"(ROOT[ \t]+)?%?({_NAME})[ \t]*=[ \t]*([a-z][a-z0-9]*\[[\d,]*\](?:\{{[\d,]*\}})?)[ \t]+([a-z][\w\-]*)\("
)
_COMP_NAME_RE = re.compile(rf"(ENTRY\s+)?%?({_NAME})")
_ARRAY_SHAPE_RE = re.compile(r"([a-z][a-z0-9]*)[ \t]*\[([^\]\n]*)\]")
# A layout: minor-to-major dims, then tiles, element size and memory space after ':'
# (``{1,0:T(8,128)(2,1)S(1)}``); XLA allows a space before it.
_LAYOUT_RE = re.compile(r"[ \t]*\{[\d,:\sA-Za-z()*_+\-]*\}")
_OPCODE_RE = re.compile(r"([a-z][\w\-]*)\s*\(")
_SIMPLE_OPERANDS_RE = re.compile(rf"\(\s*((?:%?{_NAME}\s*,\s*)*%?{_NAME})?\s*\)")
_BARE_NAME_RE = re.compile(rf"%?({_NAME})")
_OPERAND_NAME_RE = re.compile(rf"%?({_NAME})(?!\s*\()")
_KEY_RE = re.compile(r"([\w\-.]+)\s*=")
# One key=value whose value is a string, a brace group without nested braces, or a bare
# word, ending where the next attribute, a comment, the line or the computation begins.
_FAST_ATTR_RE = re.compile(
    rf'([\w\-.]+)=({_STRING}|\{{(?:[^{{}}"\n]|{_STRING})*\}}|[^,{{}}\[\]()"\s]+)(?=[ \t]*(?:[,\n}}]|//|/\*|$))'
)
_BARE_VALUE_RE = re.compile(r'[^,{}\[\]()"\s]+')
_STRING_RE = re.compile(_STRING)
_TOKEN_RE = re.compile(rf'[(){{}}\[\]]|{_STRING}|/\*.*?\*/|//[^\n]*', re.S)
_SECTION_RE = re.compile(r"[A-Z][A-Za-z]*[ \t]*(?=\n|$)")
_DIM_RE = re.compile(r"\s*(<=)?(\d+|\?)\s*$")
_CLOSE = {")": "(", "}": "{", "]": "["}
_GOT_RE = re.compile(r"[^\s]{1,20}")


class _Parser:
    """State of one parse: the text, where its lines start, and a cache of shapes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.shape_cache: dict[str, Shape] = {}
        self.computations: dict[str, Computation] = {}
        # Computations written inline as an attribute value (``to_apply={...}``), waiting
        # to join the module ahead of the computation that holds them.
        self.pending: list[Computation] = []

    # -- positions and errors -------------------------------------------------
    def loc(self, pos: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.line_starts, pos) - 1
        return i + 1, pos - self.line_starts[i] + 1

    def error(self, pos: int, message: str) -> HloParseError:
        line, col = self.loc(min(pos, self.n))
        return HloParseError(line, col, message)

    def got(self, pos: int) -> str:
        m = _GOT_RE.match(self.text, pos)
        return repr(m.group(0)) if m else "end of input"

    def ws(self, pos: int) -> int:
        """The index of the next token: past whitespace and comments."""
        text = self.text
        if text[pos:pos + 1] not in _WS_START:
            return pos
        if text[pos] == " " and text[pos + 1:pos + 2] not in _WS_START:
            return pos + 1  # one space, as between most tokens
        return _WS_RE.match(text, pos).end()  # type: ignore[union-attr]

    def match_close(self, pos: int) -> int:
        """Index just past the bracket that closes the one at ``text[pos]``."""
        stack = []
        for m in _TOKEN_RE.finditer(self.text, pos):
            c = m.group(0)[0]
            if c in "({[":
                stack.append(c)
            elif c in ")}]":
                if not stack or stack[-1] != _CLOSE[c]:
                    raise self.error(m.start(), f"unbalanced {c!r}")
                stack.pop()
                if not stack:
                    return m.end()
        raise self.error(pos, f"{self.text[pos]!r} is never closed")

    # -- shapes ---------------------------------------------------------------
    def shape_at(self, pos: int) -> tuple[Shape, int]:
        """The shape starting at ``pos`` (no whitespace before it), and where it ends."""
        text = self.text
        if text.startswith("b(", pos):
            # A buffer of a shape, ``b(f32[16])``: costed as the shape it holds.
            shape, end = self.shape_at(self.ws(pos + 2))
            end = self.ws(end)
            if text[end:end + 1] != ")":
                raise self.error(end, f"expected ')' to close the buffer shape, got {self.got(end)}")
            return shape, end + 1
        if pos < self.n and text[pos] == "(":
            end = self.match_close(pos)
            key = text[pos:end]
            shape = self.shape_cache.get(key)
            if shape is None:
                shape = self.shape_cache[key] = self.tuple_shape(pos, end)
            return shape, end
        m = _ARRAY_SHAPE_RE.match(text, pos)
        if m is None:
            raise self.error(pos, f"expected shape, got {self.got(pos)}")
        end = m.end()
        lm = _LAYOUT_RE.match(text, end)
        if lm is not None:
            end = lm.end()
        key = text[pos:end]
        shape = self.shape_cache.get(key)
        if shape is None:
            shape = self.shape_cache[key] = self.array_shape(m, lm, pos)
        return shape, end

    def array_shape(self, m: re.Match, lm: re.Match | None, pos: int) -> Shape:
        dtype = m.group(1)
        if dtype_bits(dtype) is None:
            raise self.error(pos, f"unknown element type {dtype!r}")
        dims = []
        if m.group(2).strip():
            for d in m.group(2).split(","):
                dm = _DIM_RE.match(d)
                if dm is None:
                    raise self.error(pos, f"bad dimension {d.strip()!r} in {m.group(0)!r}")
                # An unbounded dynamic dimension ('?') has no size to cost: count it as 1.
                dims.append(1 if dm.group(2) == "?" else int(dm.group(2)))
        return Shape(dtype, tuple(dims), (), lm.group(0).strip() if lm else "")

    def tuple_shape(self, start: int, end: int) -> Shape:
        parts = []
        pos = self.ws(start + 1)
        if self.text[pos] != ")":
            while True:
                shape, pos = self.shape_at(pos)
                parts.append(shape)
                pos = self.ws(pos)
                c = self.text[pos]
                if c == ",":
                    pos = self.ws(pos + 1)
                    continue
                if c == ")":
                    break
                raise self.error(pos, f"expected ',' or ')' in tuple shape, got {self.got(pos)}")
        if pos + 1 != end:
            raise self.error(pos, "unbalanced parentheses in tuple shape")
        return Shape("tuple", (), tuple(parts))

    # -- attributes -----------------------------------------------------------
    def attributes(self, pos: int, owner: str = "") -> tuple[dict[str, str], int, dict[str, int]]:
        """``, key=value`` pairs from ``pos`` on; values as raw text. Returns them, the
        end of the last one (or ``pos``) and where each key starts.

        A computation written inline (``to_apply={ x = ... }``) is parsed and registered
        under the name ``<owner>.<key>``, which becomes the attribute's value."""
        text, n = self.text, self.n
        attrs: dict[str, str] = {}
        where: dict[str, int] = {}
        while True:
            q = self.ws(pos)
            if q >= n or text[q] != ",":
                return attrs, pos, where
            q = self.ws(q + 1)
            m = _FAST_ATTR_RE.match(text, q)
            if m is not None and not (m.group(2)[0] == "{" and m.group(1) in _CALL_ATTRS):
                key, value, end = m.group(1), m.group(2), m.end()
            else:
                key, value, end = self.attribute(q, owner)
            if key == "device_ids" and attrs.get("replica_groups", "").startswith("mesh["):
                # mesh[...], device_ids=(...) {axes}: one value split by its own comma.
                attrs["replica_groups"] += ", device_ids=" + value
            else:
                attrs[key] = value
                where[key] = q
            pos = end

    def attribute(self, pos: int, owner: str) -> tuple[str, str, int]:
        """(key, value, end) of the ``key=value`` at ``pos`` in any form the fast pattern
        leaves out: nested brackets, a value after a space, an inline computation."""
        text = self.text
        km = _KEY_RE.match(text, pos)
        if km is None:
            raise self.error(pos, f"expected attribute=value, got {self.got(pos)}")
        key, start = km.group(1), self.ws(km.end())
        if key in _CALL_ATTRS and text[start:start + 1] == "{" and _INST_HEAD_RE.match(text, self.ws(start + 1)):
            value, end = self.inline_computation(start, f"{owner or 'inline'}.{key}")
            return key, value, end
        end = self.value_end(start)
        if end == start:
            raise self.error(start, f"attribute {key} has no value")
        if key == "literal":  # ``literal=f32[] 0.1``: a shape, then its value
            end = self.value_end(self.ws(end))
        return key, text[start:end], end

    def value_end(self, pos: int) -> int:
        """End of the attribute value at ``pos``: strings, bracket groups and bare words
        written together, and a bracket group after a space (``mesh[...] {'a'}``)."""
        text, n = self.text, self.n
        while pos < n:
            c = text[pos]
            if c in "({[":
                pos = self.match_close(pos)
            elif c == '"':
                m = _STRING_RE.match(text, pos)
                if m is None:
                    raise self.error(pos, "unterminated string")
                pos = m.end()
            else:
                m = _BARE_VALUE_RE.match(text, pos)
                if m is None or text.startswith(("//", "/*"), pos):
                    return pos
                pos = m.end()
            if pos < n and text[pos] == " " and text[pos - 1] in ")]}":
                q = pos
                while q < n and text[q] == " ":
                    q += 1
                if q < n and text[q] in "{[(":
                    pos = q
        return pos

    # -- instructions ---------------------------------------------------------
    def instruction(self, pos: int, insts: list[Instruction], known: dict[str, Instruction]) -> int:
        """Parse the instruction at ``pos`` into ``insts`` (after any inline operand
        instructions it holds); return where it ends."""
        text = self.text
        shape: Shape | None = None
        fast = _FAST_HEAD_RE.match(text, pos)
        if fast is not None:  # name = array-shape opcode(, on one line: most instructions
            is_root, name, opcode = fast.group(1) is not None, fast.group(2), fast.group(4)
            shape = self.shape_cache.get(fast.group(3))
            if shape is None:
                shape, _ = self.shape_at(fast.start(3))
            open_pos = fast.end() - 1
        else:
            m = _INST_HEAD_RE.match(text, pos)
            if m is None:
                raise self.error(pos, f"expected instruction 'name = shape opcode(...)', got {self.got(pos)}")
            is_root, name = m.group(1) is not None, m.group(2)
            p = m.end()
            om = _OPCODE_RE.match(text, p) if text[p:p + 1] != "(" and not text.startswith("b(", p) else None
            if om is None:
                shape, p = self.shape_at(p)
                q = self.ws(p)
                om = _OPCODE_RE.match(text, q)
                if om is None:
                    raise self.error(p if q > p and text[p:q].count("\n") else q,
                                     f"expected opcode(, got {self.got(q)}")
            opcode = om.group(1)
            open_pos = om.end() - 1
        operands: tuple[str, ...] = ()
        literal = ""
        sm = _SIMPLE_OPERANDS_RE.match(text, open_pos) if opcode not in _LITERAL_OPERAND_OPCODES else None
        if sm is not None:
            close = sm.end()
            if sm.group(1):
                operands = tuple(_BARE_NAME_RE.findall(sm.group(1)))
        else:
            close, operands, literal = self.operands(open_pos, opcode, name, insts, known)
        attrs, end, where = self.attributes(close, name)
        called = []
        for key in _CALL_ATTRS:
            v = attrs.get(key)
            if v is not None:
                for c in v.strip("{}").split(","):
                    c = c.strip().lstrip("%")
                    if not _NAME_RE.fullmatch(c):
                        raise self.error(where[key], f"{key}= expects computation names, got {v[:40]!r}")
                    called.append(c)
        if shape is None:
            shape = self.infer(opcode, operands, attrs, called, known)
        line = bisect.bisect_right(self.line_starts, pos)
        inst = Instruction(name, opcode, shape, operands, attrs, tuple(called), is_root, literal,
                           line, text[self.line_starts[line - 1]:end])
        insts.append(inst)
        known.setdefault(name, inst)
        return end

    def operands(self, open_pos: int, opcode: str, parent: str, insts: list[Instruction],
                 known: dict[str, Instruction]) -> tuple[int, tuple[str, ...], str]:
        """(end, operand names, literal text) of ``opcode(...)`` at ``open_pos``.

        An operand is a name, a typed name (``f32[2] %x``) or an instruction written
        inline (``bf16[] constant(0)``), which becomes an instruction of its own."""
        text = self.text
        if opcode in _LITERAL_OPERAND_OPCODES:
            end = self.match_close(open_pos)
            literal = text[open_pos + 1:end - 1].strip()
            if opcode == "parameter" and not literal.isdigit():
                raise self.error(open_pos + 1, f"parameter number must be an integer, got {literal!r}")
            return end, (), literal
        names: list[str] = []
        p = self.ws(open_pos + 1)
        if text[p:p + 1] == ")":
            return p + 1, (), ""
        while True:
            start, shape = p, None
            if text[p:p + 1] == "(" or text.startswith("b(", p) or _ARRAY_SHAPE_RE.match(text, p):
                shape, p = self.shape_at(p)  # a typed operand: 'f32[2] %x' or 'f32[] constant(0)'
                p = self.ws(p)
            if shape is not None and text[p:p + 1] in (",", ")"):
                pass  # a type with no name is no operand (XLA's parser skips it too)
            elif _OPCODE_RE.match(text, p):
                p = self.inline(p, shape, f"{parent}.operand{len(names)}", insts, known)
                names.append(insts[-1].name)
            else:
                nm = _OPERAND_NAME_RE.match(text, p)
                if nm is None:
                    raise self.error(p if shape is not None else start, f"expected operand name, got {self.got(p)}")
                names.append(nm.group(1))
                p = nm.end()
            p = self.ws(p)
            c = text[p:p + 1]
            if c == ",":
                p = self.ws(p + 1)
                continue
            if c == ")":
                return p + 1, tuple(names), ""
            raise self.error(p, f"expected ',' or ')' after operand, got {self.got(p)}")

    def inline(self, pos: int, shape: Shape | None, name: str, insts: list[Instruction],
               known: dict[str, Instruction]) -> int:
        """An operand written as an instruction: parsed into ``insts`` under ``name``."""
        om = _OPCODE_RE.match(self.text, pos)
        assert om is not None
        opcode, open_pos = om.group(1), om.end() - 1
        end, operands, literal = self.operands(open_pos, opcode, name, insts, known)
        if shape is None:
            shape = self.infer(opcode, operands, {}, [], known)
        line_start = self.line_starts[bisect.bisect_right(self.line_starts, pos) - 1]
        inst = Instruction(name, opcode, shape, operands, {}, (), False, literal, self.loc(pos)[0],
                           self.text[line_start:end])
        insts.append(inst)
        known.setdefault(name, inst)
        return end

    # -- shapes XLA would infer -----------------------------------------------
    def infer(self, opcode: str, operands: tuple[str, ...], attrs: Mapping[str, str],
              called: list[str], known: Mapping[str, Instruction]) -> Shape:
        """The shape of an instruction printed without one, for the opcodes whose cost
        matters; ``Shape("unknown")`` (no bytes) for the rest."""
        ins = [known[o].shape for o in operands if o in known]
        if len(ins) != len(operands):
            return _UNKNOWN
        first = ins[0] if ins else _UNKNOWN
        try:
            if opcode == "get-tuple-element":
                return first.tuple_shapes[int(attrs["index"])] if first.is_tuple else _UNKNOWN
            if opcode == "tuple":
                return Shape("tuple", (), tuple(ins))
            if opcode in ("fusion", "call", "async-done") or opcode == "conditional":
                comp = self.computations.get(called[0]) if called else None
                return comp.root.shape if comp is not None else _UNKNOWN
            if opcode in ("while", "copy", "all-reduce", "all-reduce-start", "all-reduce-done",
                          "collective-permute", "collective-permute-done", "all-to-all", "negate",
                          "add", "subtract", "multiply", "divide", "maximum", "minimum", "abs",
                          "exponential", "log", "tanh", "sqrt", "rsqrt", "select", "clamp",
                          "optimization-barrier", "copy-done", "all-gather-done", "reduce-scatter-done"):
                return first if len(ins) == 1 or opcode not in ("all-reduce", "all-reduce-start") \
                    else Shape("tuple", (), tuple(ins))
            if opcode in ("all-gather", "reduce-scatter", "all-gather-start"):
                groups = parse_replica_groups(attrs.get("replica_groups", "{}"))
                k = len(groups[0]) if groups else 0
                dim = int(attrs.get("dimensions", "{0}").strip("{}") or 0)
                if not k or first.is_tuple:
                    return _UNKNOWN
                dims = list(first.dims)
                dims[dim] = dims[dim] * k if opcode != "reduce-scatter" else dims[dim] // k
                result = Shape(first.dtype, tuple(dims))
                return Shape("tuple", (), (first, result)) if opcode.endswith("-start") else result
            if opcode == "dot" and len(ins) == 2:
                lhs, rhs = ins

                def dims_of(key: str) -> list[int]:
                    raw = attrs.get(key, "{}").strip("{}")
                    return [int(x) for x in raw.split(",") if x.strip()]

                lb, lc, rb, rc = (dims_of(k) for k in ("lhs_batch_dims", "lhs_contracting_dims",
                                                       "rhs_batch_dims", "rhs_contracting_dims"))
                out = [lhs.dims[d] for d in lb]
                out += [s for d, s in enumerate(lhs.dims) if d not in lb and d not in lc]
                out += [s for d, s in enumerate(rhs.dims) if d not in rb and d not in rc]
                return Shape(lhs.dtype, tuple(out))
            if opcode == "slice":
                spans = re.findall(r"\[(\d+):(\d+)(?::(\d+))?\]", attrs.get("slice", ""))
                return Shape(first.dtype, tuple(-(-(int(b) - int(a)) // int(s or 1)) for a, b, s in spans))
        except (IndexError, KeyError, ValueError, AttributeError):
            return _UNKNOWN
        return _UNKNOWN

    # -- module ---------------------------------------------------------------
    def module(self) -> Module:
        text, n = self.text, self.n
        p = self.ws(0)
        if p >= n:
            raise HloParseError(1, 1, "empty input: expected 'HloModule <name>, ...'")
        m = _MODULE_RE.match(text, p)
        if m is None and re.match(rf"(ENTRY\s+)?%?{_NAME}\s*[({{]", text[p:p + 400]):
            # Computations without a module header, as XLA's own parser accepts them (some of
            # XLA's test and benchmark modules are written so): a module named "_".
            name, mod_attrs, where = "_", {}, {}
        elif m is None:
            raise self.error(p, f"expected 'HloModule <name>', got {self.got(p)}")
        else:
            name = m.group(1)
            mod_attrs, p, where = self.attributes(m.end())
        for key in ("replica_count", "num_partitions"):
            value = mod_attrs.get(key, "1")
            if not value.isdigit() or not 1 <= int(value) <= _MAX_DEVICES:
                raise self.error(where.get(key, 0), f"{key}={value} is not a device count in 1..{_MAX_DEVICES}")
        computations: list[Computation] = []
        entry: Computation | None = None
        p = self.ws(p)
        while p < n:
            sm = _SECTION_RE.match(text, p)
            if sm is not None and not text.startswith("ENTRY", p):
                # Debug-info tables (FileNames, StackFrames, ...) run to the next blank line.
                blank = re.compile(r"\n[ \t]*\n").search(text, p)
                p = self.ws(blank.end() if blank else n)
                continue
            comp, p = self.computation(p)
            computations += self.pending
            self.pending.clear()
            computations.append(comp)
            self.computations[comp.name] = comp
            if comp.is_entry:
                if entry is not None:
                    raise self.error(p - 1, f"second ENTRY computation {comp.name} (first: {entry.name})")
                entry = comp
            p = self.ws(p)
        if not computations:
            raise HloParseError(len(self.line_starts), 1, f"module {name} has no computations")
        module = Module(name, tuple(computations), entry or computations[-1], MappingProxyType(mod_attrs))
        _check_calls(module)
        return module

    def body(self, pos: int, name: str) -> tuple[list[Instruction], int]:
        """The instructions of computation ``name`` between the ``{`` at ``pos`` and its
        ``}``, and the index just past that brace."""
        text, n = self.text, self.n
        comp_line = self.loc(pos)[0]
        p = pos + 1
        insts: list[Instruction] = []
        known: dict[str, Instruction] = {}
        while True:
            p = self.ws(p)
            if p >= n:
                raise HloParseError(len(self.line_starts) - (text.endswith("\n")), 1,
                                    f"computation {name} (line {comp_line}) is never closed with '}}'")
            if text[p] == "}":
                p += 1
                break
            p = self.instruction(p, insts, known)
        if not insts:
            raise HloParseError(comp_line, 1, f"computation {name} has no instructions")
        return insts, p

    def inline_computation(self, pos: int, name: str) -> tuple[str, int]:
        """A computation written as an attribute value; returns its (unique) name and end."""
        unique, k = name, 1
        while unique in self.computations:
            unique, k = f"{name}.{k}", k + 1
        self.computations[unique] = Computation(unique, ())  # reserve the name
        insts, end = self.body(pos, unique)
        comp = Computation(unique, tuple(insts))
        _check_computation(comp)
        self.computations[unique] = comp
        self.pending.append(comp)
        return unique, end

    def computation(self, pos: int) -> tuple[Computation, int]:
        text = self.text
        hm = _COMP_NAME_RE.match(text, pos)
        if hm is None:
            raise self.error(pos, f"expected computation 'name (...) -> shape {{', got {self.got(pos)}")
        name, is_entry = hm.group(2), hm.group(1) is not None
        p = self.ws(hm.end())
        if text[p:p + 1] == "(":
            p = self.ws(self.match_close(p))
            if not text.startswith("->", p):
                raise self.error(p, f"expected '->' after the parameters of {name}, got {self.got(p)}")
            _, p = self.shape_at(self.ws(p + 2))
            p = self.ws(p)
        if text[p:p + 1] != "{":
            raise self.error(p, f"expected '{{' to open computation {name}, got {self.got(p)}")
        insts, p = self.body(p, name)
        _, p, _ = self.attributes(p)  # e.g. execution_thread="host" after the brace
        comp = Computation(name, tuple(insts), is_entry)
        _check_computation(comp)
        return comp, p


_UNKNOWN = Shape("unknown")


def _check_computation(comp: Computation) -> None:
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


def _check_calls(module: Module) -> None:
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
