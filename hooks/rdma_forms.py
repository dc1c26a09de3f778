"""The output forms of iproute2's ``rdma res show qp`` and ``rdma statistic qp show``, read
into plain field dicts (validated in :mod:`pulse.hooks.rdma_res`).

* plain text, the tool's default: one QP per line, ``link <dev>/<port> key value ...``; the
  port is ``-`` when none is assigned yet, and one release printed ``link mlx5_0/lqpn 1``
  (no port, no space); kernel owners are ``comm [ib_core]`` (or ``comm ib_core`` in the
  release that lost the brackets); ``-p`` puts driver details on indented lines after it;
* ``-j`` / ``-jp``: a JSON array of objects;
* the broken JSON some releases print with ``-jp -dd``: driver attributes after the QP
  object's closing brace (then a stray ``}``), or inside it as an unnamed nested object,
  or a trailing ``rdma: json_writer.c:...: Assertion ... failed.`` and ``Aborted``. The QP
  objects are recovered one by one; driver attributes are dropped (noted), tool messages
  noted, and an object that still cannot be read is flagged, never guessed at.

Real examples of each form: tests/hooks/fixtures/rdma/.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import orjson

from pulse.errors import DecodeError

_KEY = re.compile(r"[a-z][a-z0-9_-]*\Z")
_OUTSIDE_ATTR = re.compile(r'\s*"[^"]+"\s*:\s*[^,]+,?\s*\Z')
_TRAILING_COMMA = re.compile(r",(\s*)(?=[}\]])")


@dataclasses.dataclass
class Entry:
    """One record of the output: its fields, or the reason it cannot be read."""

    where: str
    fields: dict[str, Any] | None = None
    problem: str | None = None


@dataclasses.dataclass
class Read:
    form: str
    """``text``, ``json`` or ``json-broken``."""
    entries: list[Entry]
    notes: list[str] = dataclasses.field(default_factory=list)
    """What was dropped on purpose (driver attributes) or printed by the tool in error."""


def read(raw: str | bytes, where: str, *, text_record: str = "qp") -> Read:
    """Split ``rdma`` output into entries, whatever its form."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, (bytes, bytearray)) else raw
    head = text.lstrip()
    if head.startswith(("[", "{")):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return _salvage(text, where)
        return Read("json", _json_entries(data, where))
    return Read("text", _text_entries(text, where, text_record))


def _json_entries(data: Any, where: str) -> list[Entry]:
    if isinstance(data, dict):  # some builds wrap the list
        data = data.get("qp", data.get("res", data))
    if not isinstance(data, list):
        return [Entry(where, problem=f"{where}: expected a JSON list of QP objects, got {type(data).__name__}")]
    out = []
    for i, obj in enumerate(data):
        here = f"{where}: entry {i}"
        if isinstance(obj, dict):
            out.append(Entry(here, fields=obj))
        else:
            out.append(Entry(here, problem=f"{here}: expected an object, got {type(obj).__name__}"))
    return out


def _salvage(text: str, where: str) -> Read:
    """Recover the QP objects of broken ``-jp -dd`` output (see the module docstring)."""
    entries: list[Entry] = []
    notes: list[str] = []
    outside: list[str] = []
    depth = 0
    start = 0
    cuts: list[tuple[int, int]] = []
    nested: int | None = None
    nested_depth = 0
    in_str = esc = False
    last = ""
    stray = 0
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            if depth == 0:
                outside.append(ch)
            continue
        if ch == '"':
            in_str = True
            if depth == 0:
                outside.append(ch)
        elif ch == "{":
            if depth == 0:
                start, cuts = i, []
            elif nested is None and last in ",{":
                nested, nested_depth = i, depth  # an unnamed object inside an object
            depth += 1
        elif ch == "}":
            if depth == 0:
                stray += 1
            else:
                depth -= 1
                if nested is not None and depth == nested_depth:
                    cuts.append((nested, i + 1))
                    nested = None
                if depth == 0:
                    entries.append(_object(text, start, i + 1, cuts, f"{where}: object {len(entries)}", notes))
        elif depth == 0:
            outside.append(ch)
        if not ch.isspace():
            last = ch
    if depth > 0:
        entries.append(Entry(f"{where}: object {len(entries)}",
                             problem=f"{where}: object {len(entries)} is cut short (the output ends inside it)"))
    attrs = 0
    for line in "".join(outside).splitlines():
        body = line.strip().strip("[],").strip()
        if not body:
            continue
        if _OUTSIDE_ATTR.match(body):
            attrs += 1
        else:
            notes.append(f"tool message: {body[:200]}")
    if attrs:
        notes.append(f"{attrs} driver attribute(s) printed outside any QP object (dropped)")
    if stray:
        notes.append(f"{stray} unmatched closing brace(s)")
    return Read("json-broken", entries, notes)


def _object(text: str, start: int, end: int, cuts: list[tuple[int, int]], here: str, notes: list[str]) -> Entry:
    parts = []
    pos = start
    for a, b in cuts:
        parts.append(text[pos:a])
        pos = b
    parts.append(text[pos:end])
    body = _TRAILING_COMMA.sub(r"\1", "".join(parts))
    if cuts:
        notes.append(f"{here}: unnamed nested object (driver attributes) dropped")
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return Entry(here, problem=f"{here}: not valid JSON even alone ({exc})")
    if not isinstance(obj, dict):
        return Entry(here, problem=f"{here}: expected an object")
    return Entry(here, fields=obj)


def _text_entries(text: str, where: str, record: str) -> list[Entry]:
    """Plain text: a record is a ``link ...`` line; indented lines after it belong to it
    (``-p`` driver details for QPs, counters and ``LQPN: <...>`` for statistic)."""
    out: list[Entry] = []
    cur: tuple[int, list[str]] | None = None

    def close() -> None:
        if cur is not None:
            n, lines = cur
            out.append(_text_record(lines, f"{where}: line {n}", record))

    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("link "):
            close()
            cur = (n, [line])
        elif line[:1].isspace() and cur is not None:
            cur[1].append(line)
        elif record == "stat" and cur is not None and not line.startswith(("$", "#")):
            cur[1].append(line)  # a counter line wrapped without indent (mail, narrow terminal)
        else:
            close()
            cur = None
            out.append(Entry(f"{where}: line {n}", problem=f"{where}: line {n}: not a 'link ...' record: {line[:80]!r}"))
    close()
    return out


def _text_record(lines: list[str], here: str, record: str) -> Entry:
    toks = lines[0].split()
    extra = [t for line in lines[1:] for t in line.split()]
    if len(toks) < 2:
        return Entry(here, problem=f"{here}: 'link' without a device")
    dev, slash, port = toks[1].partition("/")
    rest = toks[2:]
    if not slash or not dev:
        return Entry(here, problem=f"{here}: link {toks[1]!r} is not DEV/PORT")
    fields: dict[str, Any] = {"ifname": dev}
    if port.isdigit():
        fields["port"] = port
    elif port == "lqpn":  # "link mlx5_0/lqpn 1": the release that printed no port and no space
        rest = ["lqpn", *rest]
    elif port not in ("-", ""):
        return Entry(here, problem=f"{here}: port {port!r} is neither a number nor '-'")
    if record == "stat":
        rest = rest + extra
        lqpns = _lqpn_list(rest)
        if isinstance(lqpns, str):
            return Entry(here, problem=f"{here}: {lqpns}")
        rest, fields["lqpn"] = lqpns
    if len(rest) % 2:
        return Entry(here, problem=f"{here}: {len(rest)} words after the link: not key/value pairs")
    for key, value in zip(rest[::2], rest[1::2], strict=True):
        if not _KEY.match(key) or key in fields:
            return Entry(here, problem=f"{here}: {key!r} is not a field name here")
        fields[key] = value
    return Entry(here, fields=fields)


def _lqpn_list(toks: list[str]) -> tuple[list[str], list[int]] | str:
    """Split off statistic's ``LQPN: <178,179>`` (its QPs); the rest are fields."""
    try:
        at = toks.index("LQPN:")
    except ValueError:
        return toks, []
    spec = "".join(toks[at + 1:])
    if not (spec.startswith("<") and spec.endswith(">")):
        return f"LQPN list {spec[:40]!r} is not <n,...>"
    items = [x for x in spec[1:-1].split(",") if x]
    if not all(x.isdigit() for x in items):
        return f"LQPN list {spec[:40]!r} holds a non-number"
    return toks[:at], [int(x) for x in items]


def check_int(fields: dict[str, Any], key: str, here: str, text: bool) -> int | None:
    """An unsigned field: an int in JSON, digits in text."""
    v = fields.get(key)
    if v is None:
        return None
    if text and isinstance(v, str) and v.isdigit():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError(f"{here}: {key!r} must be an integer, got {v!r:.40}")
    if v < 0:
        raise DecodeError(f"{here}: {key!r}={v} is negative")
    return v
