"""``pulse broker``: run the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from pathlib import Path
from types import FrameType

import click
import orjson

from pulse.broker import EmbeddedBroker, create_topics
from pulse.errors import ServiceError


async def roundtrip(bootstrap: str, *, timeout_s: float = 60.0) -> float:
    """Create a topic, produce one message, consume it back in a consumer group.

    Returns the seconds it took; raises :class:`ServiceError` if the message does not come
    back intact.
    """
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaError

    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:12]
    topic = f"pulse.check.{tag}"
    payload = f"pulse broker check {tag}".encode()
    try:
        await create_topics(bootstrap, {topic: 1}, timeout_s=timeout_s)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, payload, key=b"check")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"pulse-check-{tag}",
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    # Tansu holds a JoinGroup for about half the session
                                    # timeout; a short one keeps the check quick.
                                    session_timeout_ms=2000, heartbeat_interval_ms=500,
                                    rebalance_timeout_ms=2000)
        await consumer.start()
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    for m in messages:
                        if m.value == payload and m.key == b"check":
                            await consumer.commit()
                            return time.monotonic() - t0
                        raise ServiceError(f"broker check: read back {m.value!r}, sent {payload!r}")
        finally:
            await consumer.stop()
    except KafkaError as exc:
        raise ServiceError(f"broker check against {bootstrap} failed: {exc!r}") from None
    raise ServiceError(f"broker check: the message did not come back within {timeout_s:.0f} s")


@click.command("broker")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port on 127.0.0.1 (default: a free one).")
@click.option("--check", is_flag=True, help="Start, produce and consume one message, print OK, stop.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the broker's log here (default: a temporary file).")
@click.option("--json", "as_json", is_flag=True, help="Print the address (or check result) as JSON on stdout.")
def broker(port: int | None, check: bool, log_path: Path | None, as_json: bool) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory storage) on 127.0.0.1.

    Prints the bootstrap address on stdout once the broker answers Kafka metadata
    requests, then runs until Ctrl-C or SIGTERM. Data is kept in memory only.
    """
    from rich.console import Console

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    # A plain flag, not a threading.Event: the handler runs in the main thread between two
    # bytecodes, possibly inside Event.wait() holding the event's lock, and Event.set() would
    # then wait for that lock forever (a fresh-clone CI run: SIGTERM ignored for 30 s).
    stopping: list[bool] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(True)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    emb = EmbeddedBroker(port, log_path=log_path)
    try:
        emb.start()
        if check:
            seconds = asyncio.run(roundtrip(emb.bootstrap))
            if as_json:
                click.echo(orjson.dumps({"ok": True, "bootstrap": emb.bootstrap, "seconds": round(seconds, 3)}))
            else:
                click.echo("OK")
                err.print(f"broker at {emb.bootstrap}: produced and consumed one message in {seconds:.2f} s")
            return
        if as_json:
            click.echo(orjson.dumps({"bootstrap": emb.bootstrap, "pid": emb.pid, "log": str(emb.log_path)}))
        else:
            click.echo(emb.bootstrap)
        sys.stdout.flush()
        err.print(f"[bold]broker ready[/] at {emb.bootstrap} (memory storage, log {emb.log_path}); "
                  "Ctrl-C to stop")
        while not stopping:
            time.sleep(0.25)  # a signal ends the sleep; its handler runs right after
            if not emb.running:
                raise ServiceError(f"the broker exited on its own; {emb.log_hint()}")
        err.print("stopping the broker")
    finally:
        # Keep a temporary log when something failed: the error message points at it.
        failed_with_log = sys.exc_info()[0] is not None and emb.log_path.exists()
        if log_path is None and not failed_with_log:
            emb.cleanup()
        else:
            emb.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
