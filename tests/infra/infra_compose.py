"""Reading infra/ the way Docker Compose does, for tests (Docker itself cannot run here).

Compose's variable substitution (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
``${VAR:?message}``, ``${VAR?message}``, ``$VAR``, ``$$``) is implemented here from the
compose specification, so tests can check what a service gets for a given env file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
COMPOSE = INFRA / "docker-compose.yml"
ENV_EXAMPLE = INFRA / ".env.example"
TOPICS_SCRIPT = INFRA / "kafka" / "create-topics.sh"
DBRP_SCRIPT = INFRA / "influxdb" / "init" / "10-dbrp.sh"
GRAFANA = INFRA / "grafana"
DASHBOARDS = GRAFANA / "dashboards"

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("named")
        op, arg = m.group("op"), m.group("arg") or ""
        value = env.get(name)
        unset_or_empty = value is None or value == ""
        if op == ":-":
            return arg if unset_or_empty else value  # type: ignore[return-value]
        if op == "-":
            return arg if value is None else value
        if op == ":?":
            if unset_or_empty:
                raise MissingVariable(f"{name}: {arg}")
            return value  # type: ignore[return-value]
        if op == "?":
            if value is None:
                raise MissingVariable(f"{name}: {arg}")
            return value
        return value or ""

    return _VAR.sub(sub, text)


def variables(text: str) -> set[str]:
    """Every variable name the text substitutes (``$$`` escapes excluded)."""
    return {m.group("braced") or m.group("named") for m in _VAR.finditer(text) if not m.group("escaped")}


def _walk(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(x, env) for x in node]
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    return node


def raw_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def load_compose(env: Mapping[str, str]) -> dict[str, Any]:
    """The compose model with every value substituted from ``env`` (YAML anchors and merge
    keys resolved by the YAML loader, as Compose does)."""
    return _walk(raw_compose(), env)


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    out: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if "=" not in s:
            raise ValueError(f"{path}:{lineno}: not NAME=value: {line!r}")
        k, _, v = s.partition("=")
        out[k.strip()] = v.strip()
    return out


def service_env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def uses_pulse_image(service: Mapping[str, Any]) -> bool:
    build = service.get("build")
    return isinstance(build, dict) and str(build.get("dockerfile", "")).endswith("infra/Dockerfile")
