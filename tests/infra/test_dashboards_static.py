"""The provisioned dashboards' structure (their queries run live in test_dashboards_influx.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from infra_compose import GRAFANA
from infra_grafana import dashboards, queries

DS_FILE = GRAFANA / "provisioning" / "datasources" / "pulse.yaml"


def _ds_uid() -> str:
    return yaml.safe_load(DS_FILE.read_text())["datasources"][0]["uid"]


def _walk(node, path=""):  # type: ignore[no-untyped-def]
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
        if "datasource" in node and isinstance(node["datasource"], dict):
            yield path, node["datasource"]
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_dashboards_are_generated_from_their_source() -> None:
    r = subprocess.run([sys.executable, str(GRAFANA / "make_dashboards.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_datasource_is_referenced_by_uid() -> None:
    uid = _ds_uid()
    ds = yaml.safe_load(DS_FILE.read_text())["datasources"][0]
    assert ds["type"] == "influxdb" and ds["jsonData"]["version"] == "InfluxQL"
    for name, dash in dashboards().items():
        refs = [d for _, d in _walk(dash) if d.get("type") == "influxdb"]
        assert refs, name
        for d in refs:
            assert d == {"type": "influxdb", "uid": uid}, (name, d)
        assert not re.search(r'"datasource":\s*"', str(dash)), "datasource by name"


def test_job_and_node_variables_come_from_show_tag_values() -> None:
    for name, dash in dashboards().items():
        var = {v["name"]: v for v in dash["templating"]["list"]}
        assert {"job", "node"} <= set(var), name
        for key in ("job", "node"):
            assert re.fullmatch(rf'SHOW TAG VALUES FROM "pulse_\w+" WITH KEY = "{key}"( WHERE .*)?', var[key]["query"])
        assert "$job" in var["node"]["query"], "node choices follow the chosen job"
        assert var["node"]["multi"] and var["node"]["includeAll"]


def test_the_panels_the_issue_asks_for() -> None:
    d = dashboards()
    over = d["pulse-overview.json"]
    titles = " | ".join(p["title"] for p in over["panels"])
    for needle in ("Actual communication time per node", "volume per node", "duration vs ACT", "Verdicts",
                   "Incidents"):
        assert needle in titles, needle
    tables = {p["title"]: p["targets"][0]["query"] for p in over["panels"] if p["type"] == "table"}
    assert "pulse_verdict" in tables["Verdicts"] and "pulse_incident" in tables["Incidents"]
    assert '"summary"' in tables["Incidents"] and '"state"' in tables["Incidents"]
    anns = [a for a in over["annotations"]["list"] if "query" in a]
    assert any("pulse_verdict" in a["query"] and "'anomaly'" in a["query"] for a in anns)
    # incidents are marked on every time series panel (the rate panels included): opened, resolved
    on = {a["name"]: a["query"] for a in anns if a["enable"]}
    assert "'open'" in on["Incidents opened"] and "'resolved'" in on["Incidents resolved"]
    pipe = d["pulse-pipeline.json"]
    text = " ".join(q.text for q in queries("pulse-pipeline.json", pipe))
    for field in ("lag", "batches", "spool", "drops"):
        assert field in text, field


def test_every_query_is_raw_influxql_filtered_by_time_and_job() -> None:
    n = 0
    for name, dash in dashboards().items():
        for q in queries(name, dash):
            n += 1
            if q.where.startswith("variable"):
                continue
            assert "$timeFilter" in q.text, q
            if "pulse_op" in q.text or "pulse_verdict" in q.text:
                assert '"job" =~ /^$job$/' in q.text, q
            if "pulse_op" in q.text:
                assert '"node" =~ /^$node$/' in q.text, q
            # never group by high-cardinality values (DESIGN.md: no flow ids or seq in tags)
            assert not re.search(r'GROUP BY[^;]*"(seq|flow|rank)"', q.text), q
    assert n >= 15
