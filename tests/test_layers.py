"""Imports go one way (DESIGN.md "Layout and import rules"): every module of every package
is parsed (``ast``: imports inside functions count, and so does
``importlib.import_module("...")`` with a literal name) and each import of another Pulse
package is checked against what its layer may import.

Layers, lowest first: the core ``pulse`` (contracts, codecs, settings, errors, broker;
its CLI modules may load anything, lazily); the sources ``pulse.nic``, ``pulse.hooks``,
``pulse.sim`` and the pure compute ``pulse.segmentation`` and ``pulse.localization``,
which import only the core (segmentation and localization stay independent of each
other); ``pulse.engine`` (drives segmentation then localization); ``pulse.producers``
(publishes what the sources give); ``pulse.streams`` (the Faust app: everything but the
apps); the apps ``pulse.lab`` and ``pulse.report`` (anything).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = "pulse"
SOURCES = {"pulse.nic", "pulse.hooks", "pulse.sim"}
APPS = {"pulse.lab", "pulse.report"}
ALL = "*"

ALLOWED: dict[str, set[str] | str] = {
    CORE: {CORE},
    "pulse.nic": {CORE},
    "pulse.hooks": {CORE},
    "pulse.sim": {CORE},
    "pulse.segmentation": {CORE},
    "pulse.localization": {CORE},
    # `pulse eval` simulates the scenario battery before it diagnoses it.
    "pulse.engine": {CORE, "pulse.segmentation", "pulse.localization", "pulse.sim"},
    "pulse.producers": {CORE, *SOURCES},
    "pulse.streams": {CORE, *SOURCES, "pulse.producers", "pulse.segmentation", "pulse.localization", "pulse.engine"},
    "pulse.lab": ALL,
    "pulse.report": ALL,
}
"""Pulse packages each package may import (its own always)."""

EXEMPT = {"pulse/cli.py", "pulse/_broker_cli.py"}
"""The CLI: registers every package's commands and loads them lazily when they run."""

SERVICES = {"faust", "aiokafka", "influxdb_client"}
PURE = {"pulse.nic", "pulse.hooks", "pulse.sim", "pulse.segmentation", "pulse.localization", "pulse.engine"}
"""Packages that never talk to Kafka, Faust or InfluxDB."""

KNOWN: dict[tuple[str, str], str] = {
    ("nic/cli.py", "pulse.producers"):
        "`pulse capture --publish` loads the producers' publisher; `pulse produce capture` does the same "
        "from the right layer",
}
"""Imports that break the rule today, each with its way out. An entry that no longer
matches an import fails :func:`test_known_exceptions_still_exist`: remove it."""


def packages() -> dict[str, str]:
    """package -> folder, from pyproject's package-dir."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(conf["tool"]["setuptools"]["package-dir"])


def owner(module: str, known: set[str]) -> str | None:
    """The Pulse package that holds ``module`` (the longest known prefix)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in known:
            return name
    return None


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``, wherever it is."""
    out: list[tuple[int, str]] = []
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pulse import segmentation` imports a package, not a name of the core
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names] or [(node.lineno, mod)]
        elif isinstance(node, ast.Call) and (name := _import_module_arg(node)) is not None:
            out.append((node.lineno, name))
    return out


def _import_module_arg(call: ast.Call) -> str | None:
    """The literal module name of an ``importlib.import_module("...")`` call."""
    func = call.func
    fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if fname != "import_module" or not call.args:
        return None
    arg = call.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def violations(pkg: str, rel: str, source: str, known: set[str], module: str,
               is_package: bool = False) -> list[tuple[str, str, str]]:
    """(file:line, imported package or service, why) for each import ``pkg`` may not make."""
    rule = ALLOWED.get(pkg)
    assert rule is not None, f"{pkg} has no import rule in tests/test_layers.py: add one"
    out: dict[tuple[str, str], str] = {}
    for line, name in imported_modules(ast.parse(source), module, is_package):
        target = owner(name, known)
        if target is not None and target != pkg and rule != ALL and target not in rule:
            out[(f"{rel}:{line}", target)] = f"{pkg} may import only {sorted(rule)}"
        top = name.split(".")[0]
        if pkg in PURE and top in SERVICES:
            out[(f"{rel}:{line}", top)] = f"{pkg} never talks to Kafka, Faust or InfluxDB"
    return [(where, target, why) for (where, target), why in out.items()]


def all_violations() -> list[tuple[str, str, str]]:
    pkgs = packages()
    known = set(pkgs)
    out = []
    for pkg, folder in sorted(pkgs.items()):
        base = ROOT / folder
        files = sorted(base.glob("*.py")) if pkg == CORE else sorted(base.rglob("*.py"))
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT:
                continue
            parts = path.relative_to(base).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            module = ".".join([pkg, *(parts[:-1] if is_package else parts)])
            # a subpackage of the core folder is its own package (e.g. a not-yet-moved app)
            pkg_of = owner(module, known) or pkg
            out += violations(pkg_of, rel, path.read_text(), known, module, is_package)
    return out


def test_every_package_has_a_rule() -> None:
    assert set(packages()) <= set(ALLOWED), "a package without an import rule: add it to ALLOWED"


def test_no_lower_layer_imports_a_higher_one() -> None:
    bad = [v for v in all_violations() if (v[0].split(":")[0], v[1]) not in KNOWN]
    assert not bad, "imports against the layering:\n" + "\n".join(f"{w}: imports {t} ({why})" for w, t, why in bad)


def test_known_exceptions_still_exist() -> None:
    seen = {(v[0].split(":")[0], v[1]) for v in all_violations()}
    stale = [k for k in KNOWN if k not in seen]
    assert not stale, f"these known exceptions are gone, remove them from KNOWN: {stale}"


KNOWN_PKGS = {CORE, "pulse.segmentation", "pulse.localization", "pulse.streams", "pulse.engine", "pulse.report"}


@pytest.mark.parametrize(("source", "want"), [
    ("import numpy as np\nfrom pulse.errors import PulseError\nfrom . import rows\n", []),
    ("def f():\n    from pulse.streams.state import X\n", [("seg.py:2", "pulse.streams")]),
    ("from pulse import localization\n", [("seg.py:1", "pulse.localization")]),
    ("from ..localization import robust\n", [("seg.py:1", "pulse.localization")]),
    ("import importlib\nm = importlib.import_module('pulse.report')\n", [("seg.py:2", "pulse.report")]),
    ("class A:\n    def g(self):\n        import faust\n", [("seg.py:3", "faust")]),
])
def test_the_check_sees_every_kind_of_import(source: str, want: list[tuple[str, str]]) -> None:
    got = violations("pulse.segmentation", "seg.py", source, KNOWN_PKGS, "pulse.segmentation.seg")
    assert [(w, t) for w, t, _ in got] == want


def test_apps_and_the_cli_may_import_anything() -> None:
    src = "def f():\n    from pulse.streams import app\n    from pulse.engine import Engine\n"
    assert violations("pulse.report", "r.py", src, KNOWN_PKGS, "pulse.report.r") == []
    assert violations(CORE, "pulse/x.py", src, KNOWN_PKGS, "pulse.x")  # the core may not
