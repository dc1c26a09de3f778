"""The rule families: each reads the accumulated evidence (:mod:`..evidence`) and returns
hypotheses (kind, nodes) -> incident. One module per family, each saying which physical
fact it relies on:

* :mod:`.stops` - network-stop / compute-stop: where the traffic stopped first.
* :mod:`.links` - network-slow / path / group: the node (or pair, or set) on every
  persistently slow link; it asks :mod:`.host` first.
* :mod:`.host` - host-contention: only the node's own sends are slow, on several NICs.
* :mod:`.rail` - network-slow from one NIC ending late against the node's other NICs.
* :mod:`.late` - compute-slow: persistently last into collectives with normal traffic.

:func:`hypotheses` is their precedence: stops and slow links first; rail skew only when
neither explains anything; lateness never for a node another rule already blames (its
peers wait for the blamed node, so they arrive late too).
"""

from __future__ import annotations

from ..decisions import Hypothesis, Key
from ..evidence import Evidence, node_of
from ..params import LocalizeParams
from .late import late_hypotheses
from .links import network_hypotheses
from .rail import rail_hypotheses
from .stops import stop_hypotheses

__all__ = ["hypotheses"]


def hypotheses(ev: Evidence, p: LocalizeParams, open_nodes: set[str],
               open_nics: set[str] | frozenset[str] = frozenset()) -> dict[Key, Hypothesis]:
    """Every rule family's hypotheses, given the nodes of the incidents already open and the
    NICs their network faults are on."""
    hyps = stop_hypotheses(ev, p)
    net = network_hypotheses(ev, p, frozenset(node_of(e) for e in open_nics))
    hyps.update(net)
    explained = {n for _k, nodes in net for n in nodes} | {n for _k, nodes in hyps for n in nodes}
    if not hyps:
        rail = rail_hypotheses(ev, p, explained, open_nics)
        hyps.update(rail)
        explained |= {n for _k, nodes in rail for n in nodes}
    hyps.update(late_hypotheses(ev, p, explained, open_nodes))
    if not p.group_verdicts:
        hyps = {k: h for k, h in hyps.items() if h.level != "group"}
    return hyps
