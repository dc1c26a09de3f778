#!/usr/bin/env python3
"""Writes the provisioned Grafana dashboards (infra/grafana/dashboards/*.json).

The JSON files are what Grafana loads; this script is their source, so the queries stay
consistent with the measurements the pipeline's InfluxDB sink writes (DESIGN.md "Wire
contracts": pulse_op, pulse_verdict, pulse_incident, pulse_pipeline). Edit here, run it, commit both:

    python infra/grafana/make_dashboards.py              # rewrite the JSON files
    python infra/grafana/make_dashboards.py --check      # exit 1 if they are out of date
    python infra/grafana/make_dashboards.py --out DIR    # write them elsewhere

Every query is raw InfluxQL (datasource uid ``pulse-influxdb``) using Grafana's
``$timeFilter``, ``$__interval`` and the ``$job`` / ``$node`` template variables, which come
from ``SHOW TAG VALUES``. tests/infra run every one of them against a real InfluxDB 1.x.
Stdlib only: it runs without Pulse installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "influxdb", "uid": "pulse-influxdb"}

OP = '"pulse_op"'
VERDICT = '"pulse_verdict"'
INCIDENT = '"pulse_incident"'
PIPELINE = '"pulse_pipeline"'
JOB = '"job" =~ /^$job$/'
NODE = '"node" =~ /^$node$/'
OPS_WHERE = f"$timeFilter AND {JOB} AND {NODE}"


def target(query: str, ref: str = "A", alias: str | None = None, fmt: str = "time_series") -> dict[str, Any]:
    t: dict[str, Any] = {"refId": ref, "datasource": DS, "query": query, "rawQuery": True, "resultFormat": fmt}
    if alias:
        t["alias"] = alias
    return t


class Layout:
    """Assigns panel ids and grid positions row by row (24 columns)."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        self.newline()
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def newline(self) -> None:
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel.setdefault("datasource", DS)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def timeseries(title: str, targets: list[dict[str, Any]], unit: str, description: str,
               *, draw: str = "line", overrides: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "type": "timeseries", "title": title, "description": description, "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"drawStyle": draw, "lineWidth": 1, "pointSize": 4,
                                                  "showPoints": "auto", "spanNulls": True}},
            "overrides": overrides or [],
        },
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def alarm_count(title: str, query: str, description: str | None = None) -> dict[str, Any]:
    """A stat that turns red from one: how many alarms the range holds."""
    panel: dict[str, Any] = {
        "type": "stat", "title": title, "targets": [target(query)],
        "fieldConfig": {"defaults": {"unit": "short", "color": {"mode": "thresholds"},
                                     "thresholds": {"mode": "absolute", "steps": [
                                         {"color": "green", "value": None}, {"color": "red", "value": 1}]}},
                        "overrides": []},
        "options": {"reduceOptions": {"calcs": ["sum"], "fields": "", "values": False}, "colorMode": "background"},
    }
    if description:
        panel["description"] = description
    return panel


def variables(measurement: str) -> dict[str, Any]:
    job = {
        "name": "job", "label": "job", "type": "query", "datasource": DS,
        "query": f'SHOW TAG VALUES FROM {measurement} WITH KEY = "job"',
        "definition": f'SHOW TAG VALUES FROM {measurement} WITH KEY = "job"',
        "refresh": 2, "sort": 1, "multi": False, "includeAll": False, "current": {}, "options": [],
        "hide": 0,
    }
    node = {
        "name": "node", "label": "node", "type": "query", "datasource": DS,
        "query": f'SHOW TAG VALUES FROM {OP} WITH KEY = "node" WHERE {JOB}',
        "definition": f'SHOW TAG VALUES FROM {OP} WITH KEY = "node" WHERE {JOB}',
        "refresh": 2, "sort": 3, "multi": True, "includeAll": True, "current": {}, "options": [],
        "hide": 0,
    }
    return {"list": [job, node]}


def annotations() -> dict[str, Any]:
    return {"list": [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
         "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        # One mark per incident state change on every time series panel (the rate panels
        # included): where a fault opened, and where it was resolved.
        {"name": "Incidents opened", "datasource": DS, "enable": True, "hide": False, "iconColor": "red",
         "query": (f'SELECT "summary", "kind", "nodes" FROM {INCIDENT} '
                   f"WHERE $timeFilter AND {JOB} AND \"state\" = 'open'"),
         "textColumn": "summary", "tagsColumn": "kind"},
        {"name": "Incidents resolved", "datasource": DS, "enable": True, "hide": False, "iconColor": "green",
         "query": (f'SELECT "summary", "kind", "resolution" FROM {INCIDENT} '
                   f"WHERE $timeFilter AND {JOB} AND \"state\" = 'resolved'"),
         "textColumn": "summary", "tagsColumn": "resolution"},
        {"name": "Pulse verdicts", "datasource": DS, "enable": False, "hide": False, "iconColor": "orange",
         "query": (f'SELECT "nodes", "kind", "level", "confidence" FROM {VERDICT} '
                   f"WHERE $timeFilter AND {JOB} AND \"status\" = 'anomaly'"),
         "textColumn": "nodes", "tagsColumn": "kind"},
    ]}


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              templating: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["pulse"],
        "editable": False, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "timezone": "",
        "timepicker": {}, "templating": templating, "annotations": annotations(),
        "links": [{"type": "dashboards", "tags": ["pulse"], "asDropdown": False, "title": "Pulse"}],
        "panels": panels,
    }


def overview() -> dict[str, Any]:
    lay = Layout()
    lay.row("Communication per node")
    lay.add(timeseries(
        "Actual communication time per node (ACT)",
        [target(f'SELECT mean("act_us") FROM {OP} WHERE {OPS_WHERE} GROUP BY time($__interval), "node" fill(none)',
                alias="$tag_node")],
        "µs", "Mean ACT per operator: active epochs x epoch length, gaps excluded. A network straggler's "
              "ACT stands out; its peers only wait."), 12, 8)
    lay.add(timeseries(
        "Communication volume per node",
        [target(f'SELECT sum("volume_bytes") FROM {OP} WHERE {OPS_WHERE} GROUP BY time($__interval), "node" fill(none)',
                alias="$tag_node")],
        "bytes", "Bytes the node's send flows carried, per interval (all its operators)."), 12, 8)
    lay.add(timeseries(
        "Active rate per node",
        [target(f'SELECT mean("rate_gbps") FROM {OP} WHERE {OPS_WHERE} GROUP BY time($__interval), "node" fill(none)',
                alias="$tag_node")],
        "Gbits", "Volume / ACT: the rate a node's flows reach while they are active."), 12, 8)
    lay.add(timeseries(
        "Volume / expected volume per node",
        [target(f'SELECT sum("volume_bytes") / sum("expected_bytes") FROM {OP} WHERE {OPS_WHERE} '
                f'GROUP BY time($__interval), "node" fill(none)', alias="$tag_node")],
        "percentunit", "Above 1: headers, control traffic, retransmissions (loss). Below 1: operators "
                       "that never completed (fail-stop)."), 12, 8)
    lay.row("The blind spot: operator duration vs ACT")
    lay.add(timeseries(
        "Operator duration vs ACT per node",
        [target(f'SELECT mean("duration_us") FROM {OP} WHERE {OPS_WHERE} GROUP BY time($__interval), "node" fill(none)',
                ref="A", alias="duration $tag_node"),
         target(f'SELECT mean("act_us") FROM {OP} WHERE {OPS_WHERE} GROUP BY time($__interval), "node" fill(none)',
                ref="B", alias="ACT $tag_node")],
        "µs", "Durations of a collective are the same on every rank (healthy peers wait for the "
              "straggler): what operator-level tools see. ACT differs: what Pulse sees.",
        overrides=[{"matcher": {"id": "byRegexp", "options": "^duration .*"},
                    "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}]),
        12, 9)
    lay.add(timeseries(
        "ACT / duration per node",
        [target(f'SELECT mean("act_us") / mean("duration_us") FROM {OP} WHERE {OPS_WHERE} '
                f'GROUP BY time($__interval), "node" fill(none)', alias="$tag_node")],
        "percentunit", "Share of an operator's time a node actually communicates. The straggler is "
                       "near 1, its waiting peers lower."), 12, 9)
    lay.add({
        "type": "bargauge", "title": "Mean ACT per node (time range)",
        "description": "Over the selected range; the culprit of a network fault has the longest bar.",
        "targets": [target(f'SELECT mean("act_us") AS "act_us" FROM {OP} WHERE {OPS_WHERE} GROUP BY "node"',
                           alias="$tag_node")],
        "fieldConfig": {"defaults": {"unit": "µs", "min": 0}, "overrides": []},
        "options": {"orientation": "horizontal", "displayMode": "gradient",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
    }, 12, 8)
    lay.add({
        "type": "bargauge", "title": "Mean operator duration per node (time range)",
        "description": "Nearly equal for every node under a network fault: the blind spot.",
        "targets": [target(f'SELECT mean("duration_us") AS "duration_us" FROM {OP} WHERE {OPS_WHERE} GROUP BY "node"',
                           alias="$tag_node")],
        "fieldConfig": {"defaults": {"unit": "µs", "min": 0}, "overrides": []},
        "options": {"orientation": "horizontal", "displayMode": "gradient",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
    }, 12, 8)
    lay.row("Incidents")
    lay.add(alarm_count("Incidents opened", f"SELECT count(\"confidence\") FROM {INCIDENT} WHERE $timeFilter "
                        f"AND {JOB} AND \"state\" = 'open'",
                        "Faults found in the range (one incident per fault, however long it lasts)."), 6, 8)
    lay.add({
        "type": "table", "title": "Incidents",
        "description": "Every state change of every incident: opened, updated (what it names changed), "
                       "resolved (evidence stopped, or the job ended). The summary says which node and NIC, "
                       "which metric and how far from its peers.",
        "targets": [target(f'SELECT "state", "kind", "level", "nodes", "nics", "summary", "confidence", "ops", '
                           f'"resolution", "id" FROM {INCIDENT} WHERE $timeFilter AND {JOB} '
                           f"ORDER BY time DESC LIMIT 200", fmt="table")],
        "fieldConfig": {"defaults": {}, "overrides": [
            {"matcher": {"id": "byName", "options": "state"},
             "properties": [{"id": "custom.cellOptions", "value": {"type": "color-text"}},
                            {"id": "mappings", "value": [{"type": "value", "options": {
                                "open": {"color": "red", "index": 0},
                                "updated": {"color": "orange", "index": 1},
                                "resolved": {"color": "green", "index": 2}}}]}]}]},
        "options": {"showHeader": True, "sortBy": [{"displayName": "Time", "desc": True}]},
    }, 18, 8)
    lay.row("Verdicts")
    lay.add(alarm_count("Anomaly verdicts", f"SELECT count(\"confidence\") FROM {VERDICT} WHERE $timeFilter "
                        f"AND {JOB} AND \"status\" = 'anomaly'"), 6, 8)
    lay.add({
        "type": "table", "title": "Verdicts",
        "description": "Every verdict of the job: anomalies (repeated while they persist), cleared, healthy.",
        "targets": [target(f'SELECT "status", "kind", "level", "nodes", "ranks", "nics", "confidence" '
                           f"FROM {VERDICT} WHERE $timeFilter AND {JOB} ORDER BY time DESC LIMIT 500",
                           fmt="table")],
        "fieldConfig": {"defaults": {}, "overrides": [
            {"matcher": {"id": "byName", "options": "status"},
             "properties": [{"id": "custom.cellOptions", "value": {"type": "color-text"}},
                            {"id": "mappings", "value": [{"type": "value", "options": {
                                "anomaly": {"color": "red", "index": 0},
                                "cleared": {"color": "green", "index": 1},
                                "healthy": {"color": "green", "index": 2},
                                "insufficient-data": {"color": "orange", "index": 3}}}]}]}]},
        "options": {"showHeader": True, "sortBy": [{"displayName": "Time", "desc": True}]},
    }, 18, 8)
    return dashboard("pulse-overview", "Pulse — job overview",
                     "Per-node communication, operator duration vs ACT, and Pulse's verdicts.",
                     lay.panels, variables(OP))


def pipeline() -> dict[str, Any]:
    # Fields of the worker's pipeline record (pulse.streams: Pipeline.pipeline_record), one
    # point per worker per second; the counters are cumulative, hence the derivatives.
    lay = Layout()
    by = 'GROUP BY time($__interval), "worker" fill(none)'
    rate = "non_negative_derivative(max(\"{}\"), 1s)"
    lay.row("Pipeline health")
    lay.add(timeseries("Consumer lag", [
        target(f'SELECT max("lag_ms_segment") FROM {PIPELINE} WHERE $timeFilter {by}', "A", "segment $tag_worker"),
        target(f'SELECT max("lag_ms_localize") FROM {PIPELINE} WHERE $timeFilter {by}', "B", "localize $tag_worker"),
    ], "ms", "Age of the newest message each agent handled (wall clock minus the Kafka timestamp)."), 12, 8)
    lay.add(timeseries("Throughput", [
        target(f"SELECT {rate.format('batches')} FROM {PIPELINE} WHERE $timeFilter {by}", "A", "batches/s $tag_worker"),
        target(f"SELECT {rate.format('op_metrics')} FROM {PIPELINE} WHERE $timeFilter {by}", "B",
               "operators/s $tag_worker"),
        target(f"SELECT {rate.format('verdicts')} FROM {PIPELINE} WHERE $timeFilter {by}", "C", "verdicts/s $tag_worker"),
    ], "short", "Epoch batches consumed, operator metrics emitted and verdicts sent per second."), 12, 8)
    lay.add(timeseries("Epoch rows per second", [
        target(f"SELECT {rate.format('rows')} FROM {PIPELINE} WHERE $timeFilter {by}", "A", "$tag_worker"),
    ], "short", "Per-flow epoch rows segmented per second."), 12, 8)
    lay.add(timeseries("Spool and queues", [
        target(f'SELECT max("spool_bytes") FROM {PIPELINE} WHERE $timeFilter {by}', "A", "spool $tag_worker"),
    ], "bytes", "Bytes waiting in a producer's disk spool (the broker was unreachable); producers "
                "that report to InfluxDB appear here."), 12, 8)
    lay.add(timeseries("Drops and dead letters", [
        target(f'SELECT max("drops") FROM {PIPELINE} WHERE $timeFilter {by}', "A", "late/lost batches $tag_worker"),
        target(f'SELECT max("dead_letters") FROM {PIPELINE} WHERE $timeFilter {by}', "B", "dead letters $tag_worker"),
        target(f'SELECT max("influx_dropped") FROM {PIPELINE} WHERE $timeFilter {by}', "C",
               "InfluxDB points dropped $tag_worker"),
    ], "short", "Cumulative: batches lost (gaps in batch_seq) or too late, messages sent to the "
                "dead-letter topic, points the InfluxDB sink gave up on."), 12, 8)
    lay.add(timeseries("Assigned partitions", [
        target(f'SELECT last("assigned") FROM {PIPELINE} WHERE $timeFilter {by}', "A", "$tag_worker"),
    ], "short", "Partitions each worker holds; a drop means a rebalance."), 12, 8)
    lay.row("Output")
    lay.add(timeseries(
        "Operators segmented per node",
        [target(f'SELECT count("act_us") FROM {OP} WHERE {OPS_WHERE} GROUP BY time($__interval), "node" fill(none)',
                alias="$tag_node")],
        "short", "Operator-metric records written per interval; a node that stops reporting drops to 0."), 12, 8)
    lay.add(timeseries(
        "Verdicts by status",
        [target(f'SELECT count("confidence") FROM {VERDICT} WHERE $timeFilter AND {JOB} '
                f'GROUP BY time($__interval), "status" fill(none)', alias="$tag_status")],
        "short", "Verdicts written per interval.", draw="bars"), 12, 8)
    return dashboard("pulse-pipeline", "Pulse — pipeline health",
                     "Lag, throughput, spool and drops of the Pulse pipeline.", lay.panels, variables(OP))


DASHBOARDS = {"pulse-overview.json": overview, "pulse-pipeline.json": pipeline}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=Path(__file__).name,
        description="Write the provisioned Grafana dashboards (JSON) from their source, this script.")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1, naming them, if the files in the output directory "
                         "differ from what this script generates")
    ap.add_argument("--out", type=Path, default=OUT, metavar="DIR",
                    help=f"output directory (default: {OUT.relative_to(OUT.parents[2])})")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # --help and bad arguments exit here, before anything is written
    out: Path = args.out
    stale = []
    for name, build in DASHBOARDS.items():
        path = out / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date in {out}: {', '.join(stale)} (run {Path(__file__).name})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
