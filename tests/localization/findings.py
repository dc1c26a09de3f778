"""Hand-built findings and evidence for the per-rule-family tests: each test puts exactly
the evidence a rule reads into :class:`~pulse.localization.evidence.Evidence` (or the link
state) and calls the rule function itself."""

from __future__ import annotations

from pulse.localization.evidence import Evidence
from pulse.localization.finding import ACT, Finding, LinkObs
from pulse.localization.params import LocalizeParams

MS = 1_000_000


def ep(node: str, nic: int = 0) -> str:
    return f"{node}/mlx5_{nic}"


def finding(kind: str, node: str, *, comm: str = "c0", seq: int = 0, rank: int = 0, endpoint: str | None = None,
            value: float = 0.0, ref: float = 1.0, metric: str = "act_ns", start: int = 0, end: int = 0,
            to: tuple[str, ...] = ()) -> Finding:
    return Finding(kind, comm, seq, rank, node, endpoint or ep(node), float(value), float(ref), metric, start, end, to)


def slow_link(src: str, dst: str, n: int = 4, *, excess: float = 1.0, comm: str = "c0",
              t0: int = 0) -> list[Finding]:
    """``n`` slow ACT findings on the link src -> dst (endpoints), ``excess`` over the reference."""
    node = src.split("/", 1)[0]
    return [finding(ACT, node, comm=comm, seq=i, endpoint=src, value=1.0 + excess, ref=1.0,
                    start=t0 + i * MS, end=t0 + i * MS + MS // 2, to=(dst,)) for i in range(n)]


def evidence(**kw) -> tuple[Evidence, LocalizeParams]:
    p = LocalizeParams(**kw)
    return Evidence(p), p


def observe(ev: Evidence, src: str, dst: str, slow: list[bool], *, t0: int = 0, metric: str = "act_ns",
            consistent: bool = False) -> None:
    """Observations of one link, one per operator (1 ms apart), slow where asked (by
    ``metric``; ``consistent``: as its collective's consistent straggler)."""
    node = src.split("/", 1)[0]
    for i, s in enumerate(slow):
        f = finding(ACT, node, seq=i, endpoint=src, value=2.0, metric=metric, start=t0 + i * MS, end=t0 + i * MS + 1,
                    to=(dst,)) if s else None
        if f is not None:
            f.consistent = consistent
        ev.links.add(LinkObs(src, dst, s, f, t0 + i * MS + 1))
