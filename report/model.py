"""The data behind every panel of a report: what :mod:`.assemble` computes and
:mod:`.draw` renders, kept apart so tests can check what a panel shows without reading
pixels."""

from __future__ import annotations

import dataclasses

import numpy as np

from pulse.records import Verdict

MAX_POINTS = 600
"""Rate curves are re-binned to at most this many points (multiples of the epoch)."""
FOCUS_OPS = 3
"""How many operators, from the verdict's first one, the rate panels cover."""
MAX_FLOW_CURVES = 16
MAX_EVIDENCE_ITEMS = 8
MAX_BARS = 16
REFERENCE_KEYS = ("peers_median", "reference", "median", "peers")
"""Keys of a per-operator finding in a verdict's evidence that hold the peers' value."""


@dataclasses.dataclass
class Curve:
    """A rate series: time from the window start on the node's own clock, and Gb/s."""

    label: str
    node: str
    t_ms: np.ndarray
    gbps: np.ndarray
    culprit: bool
    flow: int | None = None
    nic: str | None = None
    primary: bool = False
    """On the verdict's NIC(s) (or on a culprit node when the verdict names no NIC)."""


@dataclasses.dataclass
class Span:
    """One segmented operator on one rank, relative to the window start (ms)."""

    node: str
    rank: int
    comm_id: str
    seq: int
    t0_ms: float
    t1_ms: float
    culprit: bool
    complete: bool = True
    focus: bool = True
    """One of the focus operators (the others in the window are drawn lighter)."""


@dataclasses.dataclass
class RankBars:
    """Per (communicator, rank) of the peer operators: medians over those in the window."""

    labels: list[str]
    nodes: list[str]
    ranks: list[int]
    comms: list[str]
    act_us: np.ndarray
    duration_us: np.ndarray
    volume_mb: np.ndarray
    culprit: np.ndarray


@dataclasses.dataclass
class ReportData:
    job: str
    source: str
    verdict: Verdict | None
    """The main anomaly verdict (:func:`main_anomaly`; None when there is none)."""
    culprit_nodes: list[str]
    """The nodes highlighted in every panel (the verdict's nodes)."""
    comm_id: str | None
    seqs: list[int]
    """The focus operators' sequence numbers on ``comm_id``."""
    window_ns: tuple[int, int]
    """Start and end of the plotted window (ns, the culprit's clock where it has data)."""
    node_curves: list[Curve]
    flow_curves: list[Curve]
    spans: list[Span]
    bars: RankBars
    evidence: list[tuple[str, str]]
    rate_source: str
    """"epochs" (per-epoch bytes from the trace) or "operators" (one point per operator)."""
    verdicts: int = 0
    """How many verdicts the source holds."""

    @property
    def highlighted_nodes(self) -> list[str]:
        """Nodes drawn as culprits in the rate panel (what tests compare with the truth)."""
        return sorted({c.node for c in self.node_curves if c.culprit})

    @property
    def highlighted_bar_nodes(self) -> list[str]:
        return sorted({n for n, c in zip(self.bars.nodes, self.bars.culprit, strict=True) if c})

