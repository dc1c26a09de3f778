"""Turn a scenario and a severity into physical parameters, and say who the culprit is."""

from __future__ import annotations

import dataclasses

import numpy as np
from pulse.sim.engine import Anomaly
from pulse.sim.kernel_state import BURST_BLOCK_NS, BURST_LEFT
from pulse.sim.workload import Job, rail


@dataclasses.dataclass
class Culprit:
    nodes: list[int]
    gpus: list[tuple[int, int]]  # (node, gpu) whose ranks are the culprit ranks
    nics: list[tuple[int, int]]  # (node, nic)
    detail: dict


def build_anomaly(job: Job, rng: np.random.Generator, onset_ns: int, t_limit_ns: int) -> tuple[Anomaly, Culprit]:
    rc = job.rc
    cfg = rc.cfg
    name = rc.sc.name
    sev = rc.severity
    an = Anomaly.none(job, onset_ns, t_limit_ns)
    K, G, N = cfg.nics_per_node, cfg.gpus_per_node, cfg.nodes
    node = int(rng.integers(N))
    k = int(rng.integers(K))
    nic = node * K + k
    gpus_on_nic = [(node, g) for g in range(G) if rail(rc, g) == k]
    all_gpus = [(node, g) for g in range(G)]
    all_nics = [(node, j) for j in range(K)]
    if name == "healthy":
        return an, Culprit([], [], [], {})
    if name in ("nic-slow", "moe-slow-nic"):
        an.nic_tx_f[nic] = an.nic_rx_f[nic] = sev
        return an, Culprit([node], gpus_on_nic, [(node, k)], {"capacity_factor": sev})
    if name == "nic-down":
        an.nic_tx_f[nic] = an.nic_rx_f[nic] = 0.0
        return an, Culprit([node], gpus_on_nic, [(node, k)], {})
    if name == "nic-flap":
        down = int(sev * 1e6)
        an.nic_flap[nic] = True
        an.flap_down_ns = down
        an.flap_period_ns = max(100_000_000, 4 * down)
        return an, Culprit([node], gpus_on_nic, [(node, k)],
                           {"down_ns": down, "period_ns": an.flap_period_ns})
    if name == "packet-loss":
        an.nic_loss[nic] = sev
        return an, Culprit([node], gpus_on_nic, [(node, k)], {"loss_rate": sev})
    if name == "pcie-slow":
        an.nic_tx_f[node * K:(node + 1) * K] = sev
        an.nic_rx_f[node * K:(node + 1) * K] = sev
        return an, Culprit([node], all_gpus, all_nics, {"bandwidth_factor": sev})
    if name == "congestion":
        # incast bursts from other tenants into the node's downlinks (every rail); while one
        # is on, the switch port serves our traffic 1/8 of the time
        an.nic_burst[node * K:(node + 1) * K] = sev
        return an, Culprit([node], all_gpus, all_nics, _burst_detail(sev))
    if name == "gpu-slow":
        g = int(rng.integers(G))
        # tensor parallelism inside the node synchronises its GPUs every layer: the node
        # computes at the pace of its slowest GPU
        an.node_cf[node] = sev
        return an, Culprit([node], [(node, g)], [], {"compute_factor": sev, "gpu": g})
    if name == "gpu-hang":
        g = int(rng.integers(G))
        # the hung rank never reaches its next TP collective, so its TP peers block too
        an.node_hang[node] = True
        return an, Culprit([node], [(node, g)], [], {"gpu": g})
    if name == "cpu-contention":
        share = sev / (1.0 - sev)
        an.node_cpu[node] = True
        an.post_mean_ns = 20_000.0 * share
        an.host_mean_ns = 300_000.0 * share
        return an, Culprit([node], all_gpus, [], {"cpu_lost": sev, "post_delay_mean_ns": an.post_mean_ns,
                                                  "launch_delay_mean_ns": an.host_mean_ns})
    if name == "path-slow":
        dp = rc.dp
        stage, d = divmod(node, dp)
        other = stage * dp + (d + 1) % dp
        a, b = sorted((node, other))
        # one path per rail and direction; background traffic on it leaves s x one NIC's line
        # rate to all of our connections on it. In a healthy ring they fill the whole NIC, so
        # even the mild end (0.5) halves A<->B's rate
        hit = ((job.conn_src_node == a) & (job.conn_dst_node == b)) | ((job.conn_src_node == b) & (job.conn_dst_node == a))
        keys = job.conn_src_nic[hit] * (N * K) + job.conn_dst_nic[hit]
        uniq, grp = np.unique(keys, return_inverse=True)
        an.conn_grp[hit] = grp
        an.grp_cap = np.full(len(uniq), sev)
        return an, Culprit([a, b], [(a, g) for g in range(G)] + [(b, g) for g in range(G)],
                           [(a, j) for j in range(K)] + [(b, j) for j in range(K)], {"capacity_factor": sev})
    if name == "switch-congestion":
        leaf = int(rng.integers(N // 2))
        a, b = 2 * leaf, 2 * leaf + 1
        # background incast through the leaf into the downlinks of both its nodes (every rail):
        # it contends with our traffic into a and b, wherever that traffic comes from
        an.nic_burst[a * K:(a + 1) * K] = sev
        an.nic_burst[b * K:(b + 1) * K] = sev
        return an, Culprit([a, b], [(a, g) for g in range(G)] + [(b, g) for g in range(G)],
                           [(a, j) for j in range(K)] + [(b, j) for j in range(K)],
                           {**_burst_detail(sev), "leaf_nodes": 2})
    raise AssertionError(name)


def _burst_detail(duty: float) -> dict:
    return {"burst_duty": duty, "burst_block_ns": BURST_BLOCK_NS, "share_left_in_burst": BURST_LEFT,
            "mean_capacity_left": 1.0 - duty * (1.0 - BURST_LEFT)}
