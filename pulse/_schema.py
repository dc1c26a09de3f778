"""A small typed-record machinery shared by the JSON wire records.

Each record is a frozen dataclass whose fields are described by :class:`Field`; decoding a
dict checks presence, type, range and allowed values, and rejects unknown keys, so a
message we do not understand is an error naming the field rather than silently wrong data.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import orjson

from pulse.errors import DecodeError, EncodeError

T = TypeVar("T", bound="Record")

INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)
NONNEG = (0, (1 << 63) - 1)


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "int", "float", "str", "bool", "list[int]", "list[str]", "list[list[int]]", "json"
    required: bool = True
    choices: Sequence[Any] | None = None
    bounds: tuple[int | float, int | float] | None = None
    check: Callable[[Any], str | None] | None = None
    since: int = 1
    """First wire version ``v`` that may carry the field (an older reader would reject it)."""
    optional_since: int | None = None
    """Required below this wire version, optional from it (``required`` must be False):
    a record that leaves the field out is written with at least this ``v``."""


def _type_ok(kind: str, v: Any) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
    if kind == "str":
        return isinstance(v, str)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "list[int]":
        return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    if kind == "list[str]":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "list[list[int]]":
        return isinstance(v, list) and all(_type_ok("list[int]", x) for x in v)
    if kind == "json":
        return True
    raise AssertionError(kind)


_KNOWN: dict[int, tuple[Sequence[Field], frozenset[str]]] = {}
_FAST = {"int": int, "str": str, "bool": bool}
"""Kinds whose check an exact ``type(v) is T`` settles (else the full check decides)."""


def _known(fields: Sequence[Field]) -> frozenset[str]:
    hit = _KNOWN.get(id(fields))
    if hit is not None and hit[0] is fields:
        return hit[1]
    names = frozenset(f.name for f in fields)
    if isinstance(fields, tuple):  # record tables are class-level tuples: cache them
        _KNOWN[id(fields)] = (fields, names)
    return names


def validate_fields(fields: Sequence[Field], data: dict[str, Any], where: str, err: type[Exception]) -> dict[str, Any]:
    known = _known(fields)
    if not known.issuperset(data):
        unknown = sorted(set(data) - known)
        raise err(f"{where}: unknown field(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for f in fields:
        v = data.get(f.name)
        if v is None:
            if f.required:
                raise err(f"{where}: missing field {f.name!r}")
            out[f.name] = None
            continue
        if type(v) is not _FAST.get(f.kind) and not _type_ok(f.kind, v):
            raise err(f"{where}: field {f.name!r} must be {f.kind}, got {type(v).__name__} {v!r:.60}")
        if f.choices is not None and v not in f.choices:
            raise err(f"{where}: field {f.name!r}={v!r} is not one of {', '.join(map(str, f.choices))}")
        if f.bounds is not None:
            lo, hi = f.bounds
            if isinstance(v, list):
                for x in v:
                    if not lo <= x <= hi:
                        raise err(f"{where}: field {f.name!r}={x!r} outside [{lo}, {hi}]")
            elif not lo <= v <= hi:
                raise err(f"{where}: field {f.name!r}={v!r} outside [{lo}, {hi}]")
        if f.check is not None:
            problem = f.check(v)
            if problem:
                raise err(f"{where}: field {f.name!r}: {problem}")
        out[f.name] = v
    return out


class _Decoding(threading.local):
    active = False
    """Set by ``from_dict`` around the constructor call it makes with values it has just
    validated, so that ``__post_init__`` does not validate them a second time."""


_decoding = _Decoding()
_REQUIRED = object()


@functools.cache
def _defaults(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, default, default is a factory) of a dataclass's fields."""
    out: list[tuple[str, Any, bool]] = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out.append((f.name, f.default, False))
        elif f.default_factory is not dataclasses.MISSING:
            out.append((f.name, f.default_factory, True))
        else:
            out.append((f.name, _REQUIRED, False))
    return tuple(out)


_VERSIONED: dict[int, tuple[Sequence[Field], tuple[Field, ...]]] = {}


def _versioned(fields: Sequence[Field]) -> tuple[Field, ...]:
    """The fields whose presence decides a record's wire version (cached per table)."""
    hit = _VERSIONED.get(id(fields))
    if hit is not None and hit[0] is fields:
        return hit[1]
    out = tuple(f for f in fields if f.since > 1 or f.optional_since is not None)
    if isinstance(fields, tuple):
        _VERSIONED[id(fields)] = (fields, out)
    return out


class Record:
    """Mixin for frozen dataclasses with a ``FIELDS`` table and a ``TYPE`` tag.

    Wire versions: a record is written with the lowest ``v`` that can carry it (``v=1``
    unless it uses a field added later, or leaves out one that became optional later), so
    readers of an older version keep reading every record they can understand and reject
    the others with a clear error; a reader accepts ``v`` from 1 to ``VERSION``."""

    FIELDS: ClassVar[tuple[Field, ...]]
    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if _decoding.active:
            # from_dict validated these very values a moment ago (with its own `where`);
            # subclasses' cross-field checks after this still run.
            _decoding.active = False
            return
        validate_fields(self.FIELDS, {f.name: getattr(self, f.name) for f in self.FIELDS},
                        f"{self.TYPE} record", EncodeError)

    @classmethod
    def trusted(cls: type[T], **values: Any) -> T:
        """Build a record from values this program computed itself from already validated
        data, without per-field validation (which costs tens of µs per record on the hot
        path). Missing optional fields take their defaults. Never use it for anything
        decoded from outside: that goes through ``from_dict``/the decoders, which validate."""
        obj = object.__new__(cls)
        d = obj.__dict__
        for name, default, factory in _defaults(cls):  # type: ignore[arg-type]  # classes hash by identity
            if name in values:
                d[name] = values[name]
            elif default is not _REQUIRED:
                d[name] = default() if factory else default
            else:
                raise TypeError(f"{cls.__name__}.trusted() missing field {name!r}")
        if not d.keys() >= values.keys():
            raise TypeError(f"{cls.__name__}.trusted(): unknown field(s) {sorted(set(values) - set(d))}")
        return obj

    def wire_version(self) -> int:
        """The ``v`` this record is written with (see the class docstring)."""
        v = 1
        for f in _versioned(self.FIELDS):
            if getattr(self, f.name) is None:
                if f.optional_since is not None:
                    v = max(v, f.optional_since)
            else:
                v = max(v, f.since)
        return v

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "v": self.wire_version() if _versioned(self.FIELDS) else 1}
        for f in self.FIELDS:
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = v
        return out

    def to_json(self) -> bytes:
        # numpy scalars and arrays are common in free-form fields (a verdict's evidence).
        try:
            return orjson.dumps(self.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError as exc:
            raise EncodeError(f"{self.TYPE} record: cannot be written as JSON ({exc})") from None

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any], where: str | None = None) -> T:
        where = where or f"{cls.TYPE} record"
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected a JSON object, got {type(data).__name__}")
        body = dict(data)
        if body.pop("type", cls.TYPE) != cls.TYPE:
            raise DecodeError(f"{where}: type {data.get('type')!r} is not {cls.TYPE!r}")
        version = body.pop("v", None)
        if type(version) is not int or not 1 <= version <= cls.VERSION:  # not True, not 1.0
            reads = "v=1" if cls.VERSION == 1 else f"v=1..{cls.VERSION}"
            raise DecodeError(f"{where}: unsupported version v={version!r} (this Pulse reads {reads})")
        for f in _versioned(cls.FIELDS):
            if version < f.since and f.name in body:
                raise DecodeError(f"{where}: unknown field(s) {f.name} (in v={version}; it needs v>={f.since})")
            if f.optional_since is not None and version < f.optional_since and body.get(f.name) is None:
                raise DecodeError(f"{where}: missing field {f.name!r}")
        values = validate_fields(cls.FIELDS, body, where, DecodeError)
        _decoding.active = True
        try:
            return cls(**values)
        except EncodeError as exc:  # cross-field checks in __post_init__
            raise DecodeError(str(exc)) from None
        finally:
            _decoding.active = False


    @classmethod
    def from_dicts(cls: type[T], items: list[Any]) -> list[T] | None:
        """Many records at once, each checked exactly as :meth:`from_dict` checks it, but
        field by field over the whole list (a packed message's records repeat the same
        few names and kinds, checked once per distinct value); None when any record would
        fail (or has fields whose presence decides its version): decode those one by one
        to get the error that names it."""
        known = _known(cls.FIELDS)
        if not items:
            return None
        versioned = _versioned(cls.FIELDS)
        allowed = known | {"type", "v"}
        for d in items:
            if type(d) is not dict or not allowed.issuperset(d):
                return None
            if d.get("type", cls.TYPE) != cls.TYPE:
                return None
            v = d.get("v")
            if type(v) is not int or not 1 <= v <= cls.VERSION:
                return None
            for f in versioned:  # a field its version does not have, or lacks: one by one
                if (v < f.since and f.name in d) or (
                        f.optional_since is not None and v < f.optional_since and d.get(f.name) is None):
                    return None
        cols: dict[str, list[Any]] = {}
        for f in cls.FIELDS:
            col = [d.get(f.name) for d in items]
            if not _column_ok(f, col):
                return None
            cols[f.name] = col
        names = list(cols)
        # what the dataclass constructor does (set every field, then __post_init__), without
        # its keyword call per record; a class with fields outside FIELDS takes the call
        direct = [f[0] for f in _defaults(cls)] == names  # type: ignore[arg-type]
        post = cls.__post_init__  # type: ignore[attr-defined]
        out: list[T] = []
        for values in zip(*cols.values(), strict=True):
            _decoding.active = True
            try:
                if direct:
                    obj = object.__new__(cls)
                    obj.__dict__.update(zip(names, values, strict=True))
                    post(obj)
                else:
                    obj = cls(**dict(zip(names, values, strict=True)))
                out.append(obj)
            except (EncodeError, DecodeError):  # cross-field checks in __post_init__: from_dict says it
                return None
            finally:
                _decoding.active = False
        return out


def _column_ok(f: Field, col: list[Any]) -> bool:
    """Whether every value of one field's column passes :func:`validate_fields`'s checks."""
    types = set(map(type, col))
    if type(None) in types:
        if f.required:
            return False
        col = [v for v in col if v is not None]
        types.discard(type(None))
        if not col:
            return True
    fast = _FAST.get(f.kind)
    if fast is not None and types == {fast}:
        pass
    elif f.kind == "float" and types <= {int, float}:
        if any(v != v for v in col):  # NaN
            return False
    elif not all(_type_ok(f.kind, v) for v in col):
        return False
    if f.kind in ("int", "float", "str", "bool"):
        if f.bounds is not None:
            lo, hi = f.bounds
            if not (lo <= min(col) and max(col) <= hi):
                return False
        if f.choices is None and f.check is None:
            return True
        distinct = set(col)
        if f.choices is not None and not distinct.issubset(f.choices):
            return False
        return f.check is None or all(f.check(v) is None for v in distinct)
    for v in col:  # lists and free-form values: as validate_fields checks them
        if f.choices is not None and v not in f.choices:
            return False
        if f.bounds is not None:
            lo, hi = f.bounds
            if not all(lo <= x <= hi for x in v):
                return False
        if f.check is not None and f.check(v) is not None:
            return False
    return True


MAX_MESSAGE_BYTES = 16 << 20
"""Largest message any decoder accepts (``Settings.max_message_bytes``, PULSE_MAX_MESSAGE_BYTES,
has the same default): checked before parsing, so a huge message costs nothing but its read.
Nesting is bounded by orjson itself (1024 levels; deeper is a decode error)."""


def check_size(raw: bytes | bytearray | memoryview | str, where: str, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
    n = memoryview(raw).nbytes if not isinstance(raw, str) else len(raw)
    if n > max_bytes:
        raise DecodeError(f"{where}: message of {n} bytes, over the limit of {max_bytes} (PULSE_MAX_MESSAGE_BYTES)")


def loads(raw: bytes | bytearray | memoryview | str, where: str, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    check_size(raw, where, max_bytes)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"{where}: not valid JSON ({exc})") from None


def unpack(data: dict[str, Any], where: str, *, what: str, key: str, limit: int,
           decode: Callable[[Any, str], T], same: str,
           decode_all: Callable[[list[Any]], list[T] | None] | None = None) -> list[T]:
    """The records of a packed message ``{"type": ..., "v": 1, key: [...]}`` (the caller
    checked the type), each decoded with ``decode(item, where)`` (or all at once by
    ``decode_all``, None when one would fail); all or nothing, and every
    record must share the first one's ``same`` attribute (one node's events, one job's
    metrics)."""
    version = data.get("v")
    if type(version) is not int or version != 1:
        raise DecodeError(f"{where}: packed {what}: unsupported version v={version!r} (this Pulse reads v=1)")
    unknown = sorted(set(data) - {"type", "v", key})
    if unknown:
        raise DecodeError(f"{where}: packed {what}: unknown field(s) {', '.join(map(str, unknown))}")
    items = data.get(key)
    if not isinstance(items, list) or not items:
        raise DecodeError(f"{where}: packed {what}: '{key}' must be a non-empty list")
    if len(items) > limit:
        raise DecodeError(f"{where}: packed {what}: {len(items)} {key}, at most {limit}")
    out = decode_all(items) if decode_all is not None else None
    if out is None:  # one by one: the first bad item's error names it
        out = [decode(item, f"{where} {key}[{i}]") for i, item in enumerate(items)]
    first = getattr(out[0], same)
    for i, rec in enumerate(out):
        if getattr(rec, same) != first:
            raise DecodeError(f"{where} {key}[{i}]: {same} {getattr(rec, same)!r} in a pack of {same} {first!r}")
    return out
