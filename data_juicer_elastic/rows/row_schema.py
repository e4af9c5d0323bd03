"""The row schema: the JSON type of every key, joined over the whole input by the scans, so every shard is read
with the same types (the lattice, and why: docs/lossless.md).  Encoded as: a leaf is its kind's name, an object
``{"struct": [[key, type], ...]}``, an array ``{"list": type}``.  Observation order decides field order only.
"""

from __future__ import annotations

from typing import Any, Final

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

NULL: Final = "null"
BOOL: Final = "bool"
INT: Final = "int"
FLOAT: Final = "float"
STRING: Final = "string"
JSON: Final = "json"
# Values nested deeper than this are typed ``json`` (their column carries Python objects):
# it bounds this module's recursion (the row policy allows 512 levels) and Arrow's.
MAX_TYPED_DEPTH: Final = 64
# The shard-local row number every row carries through the operators: it tells the writer which input
# row an output row came from (rows an operator splits keep it; rows it makes from nothing have none),
# and quarantine which row failed.  Reserved (an input key of that name is refused); never written out.
ROW_COLUMN: Final = "__dj_elastic_row__"

# A type is a leaf name (str), a StructType (fields in first-seen order) or a ListType.


class StructType:
    """An object type.  ``partial``: some object of it lacked one of its keys (Arrow, and so operators under Ray,
    then see null there, where Data-Juicer's default executor shows the object as it is; the writer restores the
    absence either way)."""

    __slots__ = ("fields", "partial")

    def __init__(self, fields: dict[str, Any] | None = None, partial: bool = False):
        self.fields: dict[str, Any] = {} if fields is None else fields
        self.partial = partial


class ListType:
    __slots__ = ("item",)

    def __init__(self, item: Any = NULL):
        self.item = item


_SCALAR_KIND: Final = {str: STRING, bool: BOOL, float: FLOAT, type(None): NULL}
_NUMBERS: Final = frozenset({INT, FLOAT})


def join(a: Any, b: Any) -> Any:
    """The least type holding every value of ``a`` and of ``b`` (``a`` may be updated in place)."""
    if a is NULL or a == b and isinstance(a, str):
        return b
    if b is NULL:
        return a
    if a is JSON or b is JSON:
        return JSON
    if isinstance(a, str) and isinstance(b, str):
        return FLOAT if a in _NUMBERS and b in _NUMBERS else JSON
    if isinstance(a, StructType) and isinstance(b, StructType):
        if a.fields.keys() != b.fields.keys():
            a.partial = True
        a.partial |= b.partial
        for key, sub in b.fields.items():
            a.fields[key] = join(a.fields.get(key, NULL), sub)
        return a
    if isinstance(a, ListType) and isinstance(b, ListType):
        a.item = join(a.item, b.item)
        return a
    return JSON


def type_of(value: Any, depth: int = 0) -> Any:
    """The type of one JSON value ``depth`` levels below its row (a fresh node for objects and arrays)."""
    t = type(value)
    kind = _SCALAR_KIND.get(t)
    if kind is not None:
        return kind
    if t is int:
        return INT if INT64_MIN <= value <= INT64_MAX else _wide_int(value)
    if depth >= MAX_TYPED_DEPTH and (t is dict or t is list):
        return JSON
    if t is dict:
        node = StructType()
        _observe_fields(node.fields, value, depth + 1)
        return node
    if t is list:
        return ListType(_items_type(value, depth + 1))
    raise TypeError(f"not a JSON value: {t.__name__}")


def _wide_int(value: int) -> str:
    """An integer outside int64: a double holds it approximately (``float``) unless even the exponent overflows
    (``json``: then only a Python object carries it)."""
    try:
        float(value)
    except OverflowError:
        return JSON
    return FLOAT


def has_json(t: Any) -> bool:
    """Whether a ``json`` type occurs anywhere in ``t`` (its top-level column then holds Python objects)."""
    if isinstance(t, StructType):
        return any(has_json(sub) for sub in t.fields.values())
    if isinstance(t, ListType):
        return has_json(t.item)
    return t is JSON


def _observe_fields(fields: dict[str, Any], obj: dict[str, Any], depth: int = 1) -> None:
    """Join every value of ``obj`` (an object ``depth`` levels deep, a row is 1) into ``fields`` (the hot loop of
    prepare: a row per call)."""
    get = fields.get
    for key, value in obj.items():
        known = get(key)
        t = type(value)
        if known is not None and known.__class__ is str:
            kind = _SCALAR_KIND.get(t)
            if kind is known or (kind is NULL and known is not None):
                continue  # the common case: the same scalar kind again, or a null
            if t is int and INT64_MIN <= value <= INT64_MAX and known in _NUMBERS:
                continue  # an int into an int or float column
            if known is JSON:
                continue
        elif t is dict and known.__class__ is StructType:
            before = len(known.fields)
            _observe_fields(known.fields, value, depth + 1)
            if len(value) != len(known.fields) or len(known.fields) != before:
                known.partial = True  # this object lacks a key, or earlier ones lacked its new key
            continue
        elif t is list and known.__class__ is ListType:
            known.item = join(known.item, _items_type(value, depth + 1))
            continue
        fields[key] = join(NULL if known is None else known, type_of(value, depth))


def _items_type(items: list[Any], depth: int) -> Any:
    if not items:
        return NULL
    kinds = set(map(type, items))
    if len(kinds) == 1:  # homogeneous arrays (embeddings, token ids, tags) without a per-item call
        (t,) = kinds
        kind = _SCALAR_KIND.get(t)
        if kind is not None:
            return kind
        if t is int and INT64_MIN <= min(items) and max(items) <= INT64_MAX:
            return INT
    result: Any = NULL
    for value in items:
        result = join(result, type_of(value, depth))
    return result


class RowSchema:
    """The join of the types of every row observed (rows are JSON objects)."""

    __slots__ = ("_row",)

    def __init__(self) -> None:
        self._row = StructType()

    @property
    def fields(self) -> dict[str, Any]:
        """Top-level key -> type, in first-seen order (do not modify)."""
        return self._row.fields

    def observe(self, row: dict[str, Any]) -> None:
        _observe_fields(self._row.fields, row)

    def observe_all(self, rows: list[dict[str, Any]]) -> None:
        fields = self._row.fields
        for row in rows:
            _observe_fields(fields, row)

    def merge(self, other: RowSchema) -> None:
        """Join ``other`` (observed on rows that come after ours) into this schema."""
        join(self._row, _decode(_encode(other._row)))  # a copy: join updates its argument's nodes

    def to_json(self) -> list[list[Any]]:
        """``[[key, type], ...]`` in first-seen order (the manifest's ``row_schema``)."""
        return _encode(self._row)["struct"]

    @classmethod
    def from_json(cls, data: Any) -> RowSchema:
        schema = cls()
        schema._row = _decode({"struct": data})
        return schema

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowSchema) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"RowSchema({self.to_json()!r})"


def _encode(t: Any) -> Any:
    if isinstance(t, StructType):
        body: dict[str, Any] = {"struct": [[k, _encode(v)] for k, v in t.fields.items()]}
        if t.partial:
            body["partial"] = True
        return body
    if isinstance(t, ListType):
        return {"list": _encode(t.item)}
    return t


# the module's own string objects: types compare with `is`
_LEAF: Final = {name: name for name in (NULL, BOOL, INT, FLOAT, STRING, JSON)}


def _decode(data: Any) -> Any:
    if isinstance(data, str) and data in _LEAF:
        return _LEAF[data]
    if isinstance(data, dict) and set(data) == {"list"}:
        return ListType(_decode(data["list"]))
    if isinstance(data, dict) and isinstance(data.get("struct"), list) and set(data) <= {"struct", "partial"}:
        if data.get("partial", True) is not True:
            raise ValueError(f"bad struct flag {data['partial']!r}")
        fields: dict[str, Any] = {}
        for pair in data["struct"]:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)) or pair[0] in fields:
                raise ValueError(f"bad struct field {pair!r}")
            fields[pair[0]] = _decode(pair[1])
        return StructType(fields, "partial" in data)
    raise ValueError(f"bad row schema type {data!r}")


def operator_view_notes(schema: RowSchema) -> list[str]:
    """Where operators see this input differently than under Data-Juicer's default executor (the written output
    keeps every untouched value either way; docs/lossless.md)."""
    partial: list[str] = []

    def walk(t: Any, path: str) -> None:
        if isinstance(t, StructType):
            if t.partial and path:
                partial.append(path)
            for key, sub in t.fields.items():
                walk(sub, f"{path}.{key}" if path else key)
        elif isinstance(t, ListType):
            walk(t.item, f"{path}[]")

    walk(schema._row, "")
    mixed = [key for key, t in schema.fields.items() if has_json(t)]
    notes = []
    if partial:
        notes.append(
            f"objects at {', '.join(partial[:8])} lack some of their keys in some rows: operators see such a key "
            "as null (as under Data-Juicer's ray executor), the default executor shows the object as it is"
        )
    if mixed:
        notes.append(
            f"column(s) {', '.join(mixed[:8])} mix JSON types (e.g. numbers and strings): operators get the rows' "
            "own Python values, as under the default executor, but Ray re-types what an operator returns batch by "
            "batch, so a later operator may see an integer of such a column as a float"
        )
    return notes
