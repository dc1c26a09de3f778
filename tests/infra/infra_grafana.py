"""The InfluxQL queries of the provisioned dashboards, and Grafana's variable substitution."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra_compose import DASHBOARDS


@dataclass(frozen=True)
class Query:
    dashboard: str
    where: str
    text: str


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS.glob("*.json"))}


def _panels(panels: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])


def queries(name: str, dash: dict[str, Any]) -> Iterator[Query]:
    """Every InfluxQL statement Grafana would send for this dashboard."""
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            yield Query(name, f"variable {var['name']}", q if isinstance(q, str) else q["query"])
    for ann in dash.get("annotations", {}).get("list", []):
        if ann.get("query"):
            yield Query(name, f"annotation {ann['name']}", ann["query"])
    for p in _panels(dash.get("panels", [])):
        for t in p.get("targets") or []:
            yield Query(name, f"panel {p['title']!r} target {t['refId']}", t["query"])


def regex_escape(value: str) -> str:
    """Grafana's escaping of a variable value inside an InfluxQL /regex/."""
    return re.sub(r"([\\/^$.|?*+()\[\]{}-])", r"\\\1", value)


def substitute(query: str, *, start_ms: int, end_ms: int, interval: str,
               variables: dict[str, Sequence[str]]) -> str:
    """What Grafana sends: ``$timeFilter`` as an absolute range, ``$__interval``, and each
    multi-valued variable inside a regex as ``(a|b)`` of escaped values."""
    out = query.replace("$timeFilter", f"time >= {start_ms}ms and time <= {end_ms}ms")
    out = out.replace("$__interval", interval)

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        values = variables[name]
        escaped = [regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    out = re.sub(r"\$\{(\w+)\}|\$(\w+)", var, out)
    return out


def grafana_interval(start_ms: int, end_ms: int, max_points: int = 1000) -> str:
    """Grafana's $__interval for a range drawn on ~max_points pixels, at least 1 ms."""
    ms = max(1, (end_ms - start_ms) // max_points)
    return f"{ms}ms"


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))
