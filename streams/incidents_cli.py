"""``pulse incidents``: open and recent incidents, read from the compacted incidents topic
with a plain Kafka consumer (no group, nothing committed), as a user's automation would."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from pulse.errors import DecodeError, ServiceError
from pulse.kafka_security import kafka_client_kwargs
from pulse.records import Incident, decode_incident
from pulse.settings import Settings

_CTX = {"help_option_names": ["-h", "--help"]}


def line(inc: Incident) -> str:
    """One line for a person."""
    when = datetime.fromtimestamp(inc.emitted_at / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S") if inc.emitted_at else "-"
    tail = f" ({inc.resolution})" if inc.state == "resolved" and inc.resolution else ""
    return f"{when} {inc.state.upper():8s} {inc.id} {inc.job}: {inc.summary}{tail}"


def latest(incidents: list[Incident]) -> dict[str, Incident]:
    """The latest state of each incident (what compaction keeps)."""
    out: dict[str, Incident] = {}
    for inc in incidents:
        cur = out.get(inc.id)
        if cur is None or (inc.emitted_at, inc.updates, inc.state == "resolved") >= (
                cur.emitted_at, cur.updates, cur.state == "resolved"):
            out[inc.id] = inc
    return out


async def _read(bootstrap: str, topic: str, follow: bool, as_json: bool, open_only: bool,
                idle_s: float, client: dict[str, Any]) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest", fetch_max_wait_ms=100, **client)
    try:
        await asyncio.wait_for(c.start(), 15.0)
    except (TimeoutError, KafkaError, OSError) as exc:
        raise ServiceError(f"cannot reach the broker at {bootstrap}: {exc!r}") from None
    bad = 0
    try:
        parts = c.partitions_for_topic(topic)
        if not parts:
            raise ServiceError(f"no topic {topic!r} on {bootstrap} (has a worker run with this topic prefix?)")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        seen: list[Incident] = []
        quiet_since = time.monotonic()
        printed: set[tuple[str, str, int]] = set()

        def show(inc: Incident) -> None:
            if open_only and inc.state == "resolved":
                return
            key = (inc.id, inc.state, inc.updates)
            if key in printed:
                return
            printed.add(key)
            if as_json:
                sys.stdout.write(inc.to_json().decode() + "\n")
                sys.stdout.flush()
            else:
                click.echo(line(inc), err=True)

        backlog_done = False
        while True:
            got = await c.getmany(*tps, timeout_ms=200)
            for msgs in got.values():
                for m in msgs:
                    try:
                        inc = decode_incident(m.value or b"", f"{topic}[{m.partition}]@{m.offset}")
                    except DecodeError as exc:
                        bad += 1
                        click.echo(f"pulse incidents: skipped a record: {exc}", err=True)
                        continue
                    seen.append(inc)
                    if backlog_done:
                        show(inc)
                    quiet_since = time.monotonic()
            if not backlog_done and time.monotonic() - quiet_since >= idle_s:
                backlog_done = True
                for inc in sorted(latest(seen).values(), key=lambda i: (i.state == "resolved", i.first_seen_ns)):
                    show(inc)
                if not follow:
                    return bad
    finally:
        await c.stop()


@click.command(context_settings=_CTX)
@click.option("--broker", help="Kafka bootstrap host:port (default PULSE_BROKER).")
@click.option("--topic-prefix", "prefix", help="Topic prefix (default PULSE_TOPIC_PREFIX or 'pulse').")
@click.option("--follow", "-f", is_flag=True, help="Keep printing state changes as they arrive (Ctrl-C stops).")
@click.option("--open", "open_only", is_flag=True, help="Only incidents that are not resolved.")
@click.option("--json", "as_json", is_flag=True, help="One incident record (JSON) per line on stdout.")
def incidents(broker: str | None, prefix: str | None, follow: bool, open_only: bool, as_json: bool) -> None:
    """List incidents (one per fault: open, updated, resolved) from the incidents topic: the
    latest state of each, open ones first; with --follow, every change after that."""
    s: Settings = Settings.from_env().override(broker=broker or None, topic_prefix=prefix or None)
    bs = s.bootstrap()
    try:
        asyncio.run(_read(bs, s.topics.incidents, follow, as_json, open_only, idle_s=1.0,
                          client=kafka_client_kwargs(s)))
    except KeyboardInterrupt:
        pass
