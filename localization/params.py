"""Parameters of the localizer and the baseline, with their defaults and why."""

from __future__ import annotations

import dataclasses

from pulse.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LocalizeParams:
    window_ops: int = 12
    """Operators (per node, across its communicators) a suspicion is judged over. Twelve
    covers a couple of training steps' worth of collectives on one rail at the default
    simulator size, short enough that a verdict comes within the first step or two."""
    persist_ops: int = 4
    """Outlier operators needed inside the window before alarming. One slow operator is
    jitter (a retransmission, a late kernel); four out of twelve is a pattern."""
    persist_frac: float = 0.5
    """...and at least this fraction of the node's judged operators in the window must be
    outliers, so a node that is an outlier only now and then stays quiet."""
    timing_persist_frac: float = 0.75
    """...and this fraction when the link's slow operators are slow by their ACT alone
    (beyond the job's reference) rather than by bytes resent, a grouped operator's rate, or
    as the consistent straggler of its collective (evidence with a test of its own). A
    rank's ACT also rises when its inputs trickle in: a ring rank downstream of a late
    starter, a tree relay whose subtree issued late, sends its chunks as they arrive,
    spread over more epochs. The buckets of one step share the ranks' issue order, so such
    a rank stays slow for the whole step, and a window of twelve operators at four buckets
    a step holds only three draws: healthy sweep jobs had links slow in 0.58 of their
    window (109 #7, a 22-rank ring at 128 us epochs) and 0.67 (111 #19, a 23-rank tree at
    32 us), both named as culprits. A fault that throttles a link slows every operator
    crossing it (every culprit link of the battery and of those sweeps was slow in its
    whole window at its verdict): three quarters asks for more than two steps in three."""
    clear_ops: int = 8
    """Consecutive clean operators of an alarmed node before a ``cleared`` verdict."""
    repeat_every: int = 8
    """An ongoing anomaly is repeated every this many judged operators of the culprit."""
    healthy_every: int = 64
    """Closed operators of the job between two ``healthy`` verdicts while nothing alarms."""
    hypotheses_every_ns: int = 2_000_000
    """Trace time between two evaluations of the hypotheses while evidence is held (each
    scans every link window; a 64-GPU job closes an operator every ~0.3 ms). 2 ms is <1 %
    of the median time to a verdict; the end of the data always evaluates."""
    min_ranks: int = 3
    """Ranks with data an operator needs to be compared: with two ranks the median is not
    robust and cannot say which side is odd (two-rank P2P operators feed the link view
    and the start-delay view only)."""
    close_lag: int = 4
    """An operator of a communicator is judged once an operator this many sequence
    numbers later has data (or at ``finish``): later ranks' records may still be on the
    way until then, and a rank still missing after that is missing."""

    clock_skew_ns: int = 1_000_000
    """The largest difference between two nodes' clocks the rules tolerate. Every rule that
    compares a time taken on one node with one taken on another moves its bound by this, in
    the direction that keeps a healthy node from being blamed (``docs/localization.md``,
    "Clock skew"); the rest compare times of one node only. Default 1 ms: five times the
    two-node difference of PTP-synchronised clocks (+-100 us each, DESIGN.md). For
    NTP-synchronised clusters (1-10 ms) set it to the largest offset difference expected
    between two nodes."""

    # -- network fail-slow (ACT) ------------------------------------------------------
    act_ratio: float = 1.30
    """An operator is slow when a rank's ACT exceeds the job-wide reference ACT of
    operators of the same shape (kind, bytes, ranks) by this factor. Healthy operators of
    one shape stay within a few percent (an epoch of quantisation, chunk rounding); the
    mildest battery faults (capacity x0.5, 0.5 % loss, a path at x0.5) stretch the
    throttled operators' ACT by far more."""
    vol_excess: float = 0.02
    """A record that carried this fraction more bytes than expected retransmitted: its
    links lose packets (go-back-N resends whole windows), a network signal on its own."""
    ref_min: int = 16
    """Records of a shape needed before its reference exists. The reference is the 25th
    percentile of the last 512 (robust even when half of the shape's operators run
    through a faulty node, e.g. a PCIe fault slows all eight rails of one stage)."""
    ref_size: int = 512
    """Records kept per shape for its reference (the newest): enough that the records of
    one faulty node's operators cannot become the reference, few enough that the
    reference follows a legitimate change of pace."""
    ref_percentile: int = 25
    """Percentile of those records that is the reference ACT: below the median, so it stays
    the healthy pace while up to half of the shape's records run through a faulty node."""
    ref_base_ops: int = 8
    """Complete operators of each communicator of a shape (kind, bytes, ranks) whose ACTs
    are the shape's healthy stretch: the longest of their records over their reference
    percentile. A record that sends to several peers (a tree relay, paced by what its
    subtree hands it) is slow only when its ACT is longer than that stretch of the
    reference too. Where the operator lasts a few epochs, healthy relays reach twice the
    reference (sweep 23 #11: 4 MB buckets at 96 us epochs in a 12-rank tree, records of 2
    to 8 epochs before the fault, a 25th percentile of 4), while the quantisation bound
    (:func:`.observations.slow_act_bound`) sits at 7.5 epochs. The
    first operators are the job's healthy history as far as it is known: a fault present
    from the start widens the stretch and is missed, never blamed on a healthy node."""
    ref_percentile_grouped: int = 50
    """Percentile for GroupP2P rates (rank-level rate, not ACT): a rate has no
    one-sided fault bias the way ACT has (expert imbalance moves it both ways), so the
    median."""
    act_top_frac: float = 0.01
    """Inside a slow operator, the ranks whose ACT is within max(one epoch, this fraction
    of the largest ACT) of the largest carry the blame (the ranks sending out of, or into,
    the bottleneck stay busiest; their neighbours in a throttled ring differ from them by
    well under 1 %)."""
    straggler_alpha: float = 1e-3
    """Chance, per window of ``window_ops`` operators of a communicator, that a healthy
    symmetric collective shows a consistent straggler (:mod:`.stragglers`): with ranks alike,
    each is the clear slowest of an operator at most 1/n of the time, and a rank must be so
    in as many of the window as keeps the binomial tail, over all n ranks, below this
    (4 ranks: 10 of 12; 8 ranks: 8 of 12; 3 ranks: 11 of 12)."""
    rate_ratio: float = 0.80
    """GroupP2P (custom collectives): a rank whose rank-level active rate is below this
    fraction of its peers' median is slow. Rate, not volume, so expert imbalance (ranks
    legitimately sending more or less) does not alarm."""
    ceiling_ops: int = 8
    """Capacity ceilings (:mod:`.ceilings`): a rank's recent ceiling is the busiest epoch of
    its last this many complete records of a communicator (two steps of four buckets at the
    default size), against the busiest of its first ``late_base_ops``; it is capped below
    ``rate_ratio`` of that and of the operator's median ratio. 0: off."""
    rate_blame: bool = False
    """Whether a GroupP2P rank below ``rate_ratio`` of its peers marks its links slow. Off
    by default: a NIC that lost capacity in both directions slows every peer's sends into
    it more than its own (three senders share its halved downlink), so in an all-to-all
    the culprit has the *highest* rank-level rate and a low rate names a victim. GroupP2P
    records then only clear links (rate normal); the node's collectives and
    point-to-point sends on the same NIC carry the blame."""
    grouped_resent: bool = False
    """Whether a GroupP2P record that carried ``vol_excess`` more bytes than expected marks
    its links as losing packets, as collectives' records do. Off by default: a grouped
    call's expected bytes (declared per peer) need not count what the wire adds. Network-
    only mode turns it on: there an inferred record's expected bytes are what its rail
    siblings carried (engine/netonly.py)."""
    host_min_nics: int = 2
    """Host contention needs slow sends on at least this many NICs of the node (one
    starved proxy thread serves them all; a single NIC is a NIC fault)."""
    host_in_frac: float = 0.5
    """Host contention: the slowdown of traffic into the node may be at most this fraction
    of its own sends' slowdown (measured: a starved proxy slows its point-to-point sends by
    x1.8-x8 and what it receives by x1.0-x2.5; NIC and PCIe faults slow both alike)."""
    path_min_links: int = 2
    """Slow NIC-to-NIC links needed before a path or group verdict: a single slow link
    with clean traffic around it fits a NIC fault as well as a path, so wait for more."""
    max_group: int = 4
    """Largest group reported when no single node explains the slow links."""
    group_verdicts: bool = True
    """Whether path / group verdicts are made. Off in network-only mode: a NIC's sending
    rate there is bound to its links by where its bytes went, an inference that can say a
    node is on every slow link but not which of its links were slow and which clean."""
    clean_max_slow_frac: float = 0.25
    """A link counts as clean evidence when at most this fraction of its observations
    since the slowness began are slow: a healthy link has an occasional jitter outlier,
    a faulty one is slow in most of its operators (``persist_frac`` and more)."""

    # -- rail skew (one NIC stalls: flaps, pauses) ---------------------------------------------
    rail_late_ns: int = 2_000_000
    """A record is rail-late when it ends this much after the median end of the same
    operator on the node's other NICs (same node clock, so no offset is involved). Healthy
    siblings end within an epoch or two (measured max 32 us at 32 us epochs); a GPU or
    host straggler delays every NIC of its node alike. 2 ms is 60x that."""
    rail_issue_ns: int = 1_000_000
    """...compared only with records of the same operator issued within this of it (same
    node clock): parallel communicators that run one after another are not siblings."""
    rail_min_siblings: int = 3
    """Other NICs' records of the same operator needed for the comparison."""
    rail_persist: int = 3
    """Rail-late records (naming the same culprit) needed before a verdict."""
    rail_nic_frac: float = 0.75
    """...and this fraction of the culprit's own rail-late records must be on one NIC (a
    NIC fault stalls one rail; a starved host delays whichever NIC it reaches last)."""
    rail_keep_ns: int = 2_000_000_000
    """Rail-late records older than this (trace time) no longer count, so an incident
    clears after the NIC recovered."""
    rail_alive_min: int = 2
    """Silent intervals in which one end was seen alive (and the other never) needed
    before the node-level answer."""
    rail_max_records: int = 64
    """Rail-late records kept (the newest; older ones also expire after ``rail_keep_ns``).
    A stalling NIC yields one per operator on its rail, so 64 is many times
    ``rail_persist`` and bounds the intersection of their member sets."""
    rail_siblings_max: int = 50_000
    """Operators (per node, kind, seq, bytes, members) whose per-NIC end times are kept
    for the sibling comparison; beyond this the oldest ``rail_siblings_drop`` are dropped.
    A record is compared with siblings issued within ``rail_issue_ns`` of it, i.e. recent
    operators only: the bound is memory, far above the operators in flight at once."""
    rail_siblings_drop: int = 25_000
    """...dropped at once (half: the cost of trimming a dict is paid rarely)."""
    alive_max: int = 512
    """Wire times kept per NIC to tell which end of a silent link was up (the newest;
    beyond this the oldest ``alive_drop`` go). Up to three points per record (first and
    last epoch, a grant), and the silent intervals asked about are recent."""
    alive_drop: int = 256
    """...dropped at once (half)."""

    # -- fail-stop -----------------------------------------------------------------------
    stop_frac: float = 0.5
    """A stall is a stop once some stalled record sent at most this fraction of its
    expected bytes (a throttled-but-moving operator cut off at the end sent far more)."""
    stall_ns: int = 200_000_000
    """An incomplete record is a stall when its node's data goes on this long after its
    last byte (batch runs; a streaming segmenter reports incomplete only after a stall)."""
    stop_absent_majority: int = 2
    """Absences name the stopped node when they all name it, or when it is named more
    than this many times as often as every other node together: a hung rank is absent
    from every operator of its peers, a pipeline partner only from the few it waits in."""

    # -- compute / host ------------------------------------------------------------------
    late_min_ns: int = 5_000_000
    """Compute fail-slow: a rank's span from issuing a collective to its end (its own
    clock) must be this much shorter than its peers' median: they waited that long for it.
    Healthy compute jitter makes ranks arrive up to ~2 ms apart, sometimes for several
    steps; the mildest GPU slowdown (x1.2) delays its node by tens of ms per step. 5 ms
    is 50x the clock-offset bound, so no decision hangs on sub-offset timing."""
    late_base_ops: int = 8
    """Lateness against the rank's own history: a rank's *issue lag* (its issue time minus
    its peers' median, clocks as read) over its first this many judged operators of a
    communicator is its baseline - the offset of its clock from its peers' plus any lag its
    place in the job gives it, both constant - and later operators are judged by how far
    their issue lag rose above it, which no clock offset enters (``late_spread_k``). A
    fault present from the first operators is in the baseline: the absolute rule
    (``late_min_ns``) is the one that sees it."""
    late_spread_k: float = 6.0
    """...a rise counts as late when it exceeds this many robust sigmas (MAD x 1.4826) of
    the job's healthy spread, per communicator shape (ranks, collective or all-to-all): the
    larger of how far its ranks' issue lags strayed from their own baselines over the
    baseline operators, and of their recent rises (step-to-step drift, which a baseline of
    two steps cannot show). With persistence (``late_frac`` of ``late_window`` in ``late_comm_frac`` of
    the node's communicators) a healthy rank would have to sit six sigmas out for most of
    four steps."""
    late_floor_epochs: float = 2.0
    """...and at least this many epochs: a rank's end is known to an epoch, so the
    compute-gap veto (:func:`.rules.late.late_explained`) cannot weigh a lateness below
    that, however quiet the job."""
    late_spread_size: int = 512
    """Baseline deviations, and recent rises, kept per communicator shape for the spread."""
    late_spread_min: int = 16
    """Baseline deviations of a shape needed before its spread is trusted: two ranks'
    baselines at the default ``late_base_ops``."""
    late_window: int = 16
    """Operators of one communicator over which a node's lateness is judged (four
    gradient buckets per step at the default size: four steps). Buckets of one step are
    late together, so persistence is measured over steps, not buckets."""
    late_frac: float = 0.75
    """Fraction of that window in which the node must be late (and the window at least
    ``late_min_fill`` full)."""
    late_min_fill: float = 0.5
    """Fraction of ``late_window`` (rounded down) a communicator's window must hold before
    its lateness counts: a couple of steps, so a node is not blamed from its first
    bucket."""
    late_comm_frac: float = 0.75
    """Fraction of the node's communicators that must be persistently late: a GPU or
    host straggler delays all of them."""
    late_weak_sigmas: float = 2.0
    """...where a communicator also counts as late when the node's issue lag rose above its
    baseline by this many sigmas of the job's healthy spread in as many operators of its
    window as a healthy rank would reach with chance ``straggler_alpha``, taking one such
    rise's chance to be ``late_weak_chance``; and at least one whole communicator's window
    must be late by the full threshold. A straggler delays each operator by the compute it
    did since the last synchronisation, so operators issued right after another one show
    little of it (sweep 127 #18: a GPU at x1.47 under MoE, 1.2-2.6 ms late into every
    all-to-all, 0.24-0.74 ms - 3 to 7 sigmas - into every data-parallel bucket issued after
    the step's last all-to-all, where six sigmas caught 5 of 16). A communicator whose
    steps the node is consistently the latest arrival of
    (:attr:`.late_stragglers.LateStragglers.latest`, the binomial test without the cost
    floor ``late_step_frac``) counts alike (sweep 131 #10: a GPU at x1.30 under MoE, 1 ms
    late into every all-to-all and the latest of every data-parallel step by 0.13-0.5 ms,
    where the job's spread of those buckets had grown to 1 ms)."""
    late_weak_chance: float = 1.0 / 6.0
    """...the chance assumed for one healthy rise of ``late_weak_sigmas``: a normal spread
    gives it 1 time in 44; a sixth leaves room for the heavy tails of real jitter."""
    late_straggler_steps: int = 8
    """Steps of a communicator over which a rank that arrives last at most of them is a
    consistent late straggler (:mod:`.late_stragglers`), at ``straggler_alpha``: 3 or 4
    ranks must be the latest in all 8, 8 ranks in 6 of 8; two ranks cannot show one this
    way (each is the later one half the time). Every step kept, up to twice as many, is
    tested as well (:data:`.late_stragglers.LONG_WINDOWS`: 4 ranks 12 of 16)."""
    late_step_frac: float = 0.05
    """...and its lateness in each of those steps at least this fraction of the step
    period: a straggler found by consistency alone is named when it costs the job a
    twentieth of every step (the lab's rank at 0.3 of a core: 36-99 ms of 240 ms steps).
    Smaller consistent lags are the job's own structure: in the simulator's healthy and
    congested jobs a rank of a pipeline stage can be the latest of its ring for many steps
    by 0.3-1.5 ms of 170-290 ms steps."""
    late_overrides_act: bool = True
    """In an operator where some rank arrived late by ``late_override_ns``, ACT outliers of
    its peers are waiting, not network (found in the lab: a CPU-starved receiver, ~300 ms
    late, stalls its TCP sender, whose ACT then grows by x1.3-1.4); and a peer's stall that
    began before that rank issued the (collective) operator is waiting, not network-stop
    (the same receiver 1.9 s late stalls its sender for longer than ``stall_ns``)."""
    late_override_ns: int = 50_000_000
    """...late by at least this (and ``late_min_ns``). A node whose own downlink is
    congested also arrives late (its pipeline receives are slow), by a few ms at the
    battery's worst (6.5 ms measured): its ring's ACT outliers are real network evidence.
    Waiting dwarfs the operator's own length (a few ms) only at tens of ms."""
    late_ratio: float = 0.0
    """...and by at least this fraction of the peers' median span (0: off)."""
    late_min_ranks: int = 2
    """Ranks with records a collective needs for the lateness comparison. Two suffice: the
    rank that arrived later has the shorter issue-to-end span (its peer waited), and the
    per-node persistence over communicators decides (data parallelism of two)."""
    late_gap_frac: float = 0.5
    """...and its own compute gap (this operator's issue minus the end of its previous
    operator of the communicator, one node's clock) must exceed its peers' median gap by
    this fraction of the lateness. A rank whose previous operator ended late (it sits
    behind a slow link in the ring) issues late after a normal gap: a victim, not a
    compute straggler (0: off)."""

    waits_per_window: int = 4
    """Point-to-point waits (issue to first byte of a send) kept per node, in multiples of
    ``window_ops``: the node's median wait, compared with the job's, must span several
    steps so one slow micro-batch does not make a straggler pass for a pipeline victim."""
    job_waits_window: int = 1024
    """Point-to-point waits kept job-wide (the newest) for the usual wait a node's own is
    compared with: a sample of many nodes' sends, so no single node dominates it."""

    # -- path / group ----------------------------------------------------------------------
    link_min_obs: int = 3
    """Observations of a link needed before it counts as clean evidence that a node's
    other traffic is fine (used to tell a path from a NIC, a host from a NIC)."""

    # -- confidence --------------------------------------------------------------------------
    conf_base: float = 0.5
    """Confidence of an anomaly is ``conf_base + conf_per_op`` per distinct operator of the
    culprit's own findings, at most ``conf_max``: an anomaly rests on at least
    ``persist_ops`` operators (0.7 at the default), and every further operator that shows
    it makes a coincidence less likely."""
    conf_per_op: float = 0.05
    """...per distinct operator."""
    conf_max: float = 0.99
    """...capped below certainty: the evidence is statistical."""

    # -- missing data --------------------------------------------------------------------------
    missing_ops: int = 3
    """Closed operators in which a member node has no record while its peers completed,
    before that node is reported as insufficient-data."""

    # -- derived from the clock-skew bound ----------------------------------------------------

    @property
    def rail_alive_margin_ns(self) -> int:
        """When the rail-late records (or the first stalls) leave the two ends of one stalled
        link, an end whose NIC moved bytes with a third party (a record's first or last
        epoch, or a credit grant it received) while the link was silent - or after the
        traffic stopped - was up, so the other end is the culprit. The activity is on one
        node's clock and the silence on the other's, so it must lie ``clock_skew_ns``
        inside the silent interval."""
        return self.clock_skew_ns

    @property
    def stall_first_ns(self) -> int:
        """Stalls (and absences) ending within this of the earliest one are where the stop
        began: a dead NIC stops all its flows at one instant (within an epoch), seen on the
        clocks of the nodes that sent them, so up to ``clock_skew_ns`` apart; a hung job's
        later stalls are its victims, milliseconds later. A stop's victims that stall within
        the skew of it cannot be told from it by time."""
        return self.clock_skew_ns

    def __post_init__(self) -> None:
        for name in ("window_ops", "persist_ops", "clear_ops", "repeat_every", "healthy_every",
                     "min_ranks", "missing_ops", "link_min_obs", "ref_min", "late_window", "host_min_nics",
                     "max_group", "rail_min_siblings", "rail_persist", "late_min_ranks", "late_base_ops",
                     "late_spread_size", "late_spread_min", "ref_base_ops", "late_straggler_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"LocalizeParams.{name}={getattr(self, name)}: must be >= 1")
        if self.ceiling_ops < 0:
            raise ConfigError(f"LocalizeParams.ceiling_ops={self.ceiling_ops}: must be >= 0 (0: off)")
        if self.persist_ops > self.window_ops:
            raise ConfigError(f"LocalizeParams.persist_ops={self.persist_ops} exceeds window_ops={self.window_ops}")
        if self.close_lag < 0:
            raise ConfigError("LocalizeParams.close_lag must be >= 0")
        if self.hypotheses_every_ns < 0 or self.clock_skew_ns < 0 or self.rail_alive_min < 1:
            raise ConfigError("LocalizeParams: hypotheses_every_ns and clock_skew_ns must be >= 0, "
                              "rail_alive_min >= 1")
        if not 0 < self.persist_frac <= 1:
            raise ConfigError("LocalizeParams.persist_frac must be in (0, 1]")
        if not self.persist_frac <= self.timing_persist_frac <= 1:
            raise ConfigError("LocalizeParams.timing_persist_frac must be in [persist_frac, 1]")
        if not 0 <= self.late_step_frac < 1:
            raise ConfigError("LocalizeParams.late_step_frac must be in [0, 1)")
        if not 0 < self.late_weak_chance < 1 or self.late_weak_sigmas <= 0:
            raise ConfigError("LocalizeParams.late_weak_chance must be in (0, 1) and late_weak_sigmas > 0")
        if self.late_spread_k <= 0 or self.late_floor_epochs < 0:
            raise ConfigError("LocalizeParams.late_spread_k must be > 0 and late_floor_epochs >= 0")
        if self.act_ratio <= 1.0:
            raise ConfigError("LocalizeParams.act_ratio must be > 1")
        if not 0 < self.straggler_alpha < 1:
            raise ConfigError("LocalizeParams.straggler_alpha must be in (0, 1)")
        if not 0 < self.rate_ratio < 1 or not 0 < self.stop_frac < 1:
            raise ConfigError("LocalizeParams.rate_ratio and stop_frac must be in (0, 1)")
        for name in ("ref_size", "rail_max_records", "rail_siblings_max", "rail_siblings_drop", "alive_max",
                     "alive_drop", "waits_per_window", "job_waits_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"LocalizeParams.{name}={getattr(self, name)}: must be >= 1")
        for name in ("ref_percentile", "ref_percentile_grouped"):
            if not 0 <= getattr(self, name) <= 100:
                raise ConfigError(f"LocalizeParams.{name}={getattr(self, name)}: must be in [0, 100]")
        for name in ("clean_max_slow_frac", "late_min_fill"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"LocalizeParams.{name}={getattr(self, name)}: must be in [0, 1]")
        if self.act_top_frac < 0 or self.stop_absent_majority < 0 or self.conf_per_op < 0:
            bad = next(n for n in ("act_top_frac", "stop_absent_majority", "conf_per_op") if getattr(self, n) < 0)
            raise ConfigError(f"LocalizeParams.{bad}={getattr(self, bad)}: must be >= 0")
        if not 0 < self.conf_base <= self.conf_max <= 1:
            raise ConfigError(f"LocalizeParams.conf_base={self.conf_base}, conf_max={self.conf_max}: "
                              "need 0 < conf_base <= conf_max <= 1")
        if self.rail_siblings_drop > self.rail_siblings_max:
            raise ConfigError(f"LocalizeParams.rail_siblings_drop={self.rail_siblings_drop} exceeds "
                              f"rail_siblings_max={self.rail_siblings_max}")
        if self.alive_drop > self.alive_max:
            raise ConfigError(f"LocalizeParams.alive_drop={self.alive_drop} exceeds alive_max={self.alive_max}")
        if self.rail_persist > self.rail_max_records:
            raise ConfigError(f"LocalizeParams.rail_persist={self.rail_persist} exceeds "
                              f"rail_max_records={self.rail_max_records}: rail skew could never be reported")
