"""``LocalizeParams.group_verdicts``: off (network-only mode), a slow path between two nodes
is not concluded, while the node on every slow link still is."""

from __future__ import annotations

from pulse.localization.rules import hypotheses

from .findings import ep, evidence, observe


def _path_evidence(**params):  # type: ignore[no-untyped-def]
    ev, p = evidence(clock_skew_ns=0, **params)
    for k in (0, 1):
        observe(ev, ep("a", k), ep("b", k), [True] * 12)
        observe(ev, ep("b", k), ep("a", k), [True] * 12)
    for x, y in (("a", "c"), ("c", "b"), ("b", "d"), ("d", "a")):
        observe(ev, ep(x), ep(y), [False] * 12)
    return ev, p


def test_a_path_is_concluded_by_default_and_not_without_group_verdicts():
    ev, p = _path_evidence()
    assert ("path", ("a", "b")) in hypotheses(ev, p, set())
    ev, p = _path_evidence(group_verdicts=False)
    assert not [k for k in hypotheses(ev, p, set()) if k[0] == "path"]


def test_the_node_on_every_slow_link_is_still_named_without_group_verdicts():
    ev, p = evidence(clock_skew_ns=0, group_verdicts=False)
    observe(ev, ep("a"), ep("b"), [True] * 12)
    observe(ev, ep("c"), ep("a"), [True] * 12)
    assert ("network-slow", ("a",)) in hypotheses(ev, p, set())
