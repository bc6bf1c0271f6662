"""The multinode scenario's report: its own table (``table``), the issue's targets and
whether each is met (``targets``), and the runner's rows (``rows``), from ``measure``'s
result dict.
"""
from __future__ import annotations

from .nodes import DELTAS as COUNTERS
from .nodes import CACHE_MB, CKPT_CACHE_MB, CKPT_MEMORY_MB, MB, RECOVERY_WAIT_S

# The targets.
TARGET_WAN_X = 1.1             # WAN bytes over 3 epochs / dataset, with the shared tier
TARGET_LINK_X = 0.9            # slowest node's MB/s in epochs 2-3 / in-region link
TARGET_CKPT_ORIGIN_X = 1.2     # origin bytes / checkpoint, 4 nodes at once
TARGET_CKPT_TIME_X = 1.3       # slowest node's load time / one node alone
TARGET_FIRST_X = 0.9           # epoch 1 (a cold tier): slowest node with the tier / without
TARGET_DOWN_X = 0.9            # "single-node speed": tier down vs without the tier

LABELS = {"without": "4x neuralcache", "with": "4x nc --shared-cache",
          "rclone": "4x rclone", "s3fs": "4x s3fs"}


def summarize(rows: list[dict], epochs: int) -> dict:
    """The 'all' line of a 3-epoch run: WAN over the first ``epochs`` epochs."""
    first = rows[:epochs]
    return {"epoch": "all", "wan_x": sum(r["wan_x"] for r in first),
            "reads": sum(r["reads"] for r in first),
            "failed": sum(r["failed"] for r in first),
            "verify_errors": sum(r["verify_errors"] for r in first),
            "shared_hits": sum(r.get("shared_hits", 0) for r in first)}


def _low(rows: list[dict], epochs=(2, 3)) -> float | None:
    """The worst slowest-node MB/s over ``epochs``."""
    got = [r["min_mbps"] for r in rows if r["epoch"] in epochs]
    return min(got) if got else None


def _mean(rows: list[dict], epochs=(2, 3)) -> float | None:
    got = [r["min_mbps"] for r in rows if r["epoch"] in epochs]
    return sum(got) / len(got) if got else None


def targets(r: dict) -> list[dict]:
    """The issue's targets: [{"measure", "target", "value", "met"}]."""
    ep, link, f, ck = r["epochs"], r["link_mbps"]["in_region"], r["faults"], r["checkpoint"]
    n = r["params"]["epochs"]
    out = []
    wan = summarize(ep["with"], n)["wan_x"]
    out.append({"measure": f"WAN bytes over {n} epochs, 4 nodes, --shared-cache",
                "target": f"<= {TARGET_WAN_X}x dataset", "value": f"{wan:.2f}x",
                "met": wan <= TARGET_WAN_X})
    low = _low(ep["with"])
    x = low / link if low is not None else 0.0
    out.append({"measure": "per-node MB/s, epochs 2-3 (slowest node, worst epoch)",
                "target": f">= {TARGET_LINK_X} x in-region link",
                "value": f"{x:.2f} ({low or 0:.1f} / {link:.1f} MB/s)", "met": x >= TARGET_LINK_X})
    w1, wo1 = _low(ep["with"], (1,)), _low(ep["without"], (1,))
    if w1 is not None and wo1:
        out.append({"measure": "epoch 1, slowest node, with / without the tier",
                    "target": f">= {TARGET_FIRST_X}", "value": f"{w1 / wo1:.2f} ({w1:.1f} / "
                    f"{wo1:.1f} MB/s)", "met": w1 / wo1 >= TARGET_FIRST_X})
    if not f or not ck:              # --only epochs
        return out
    alone, w = ck["alone"], ck["with"]
    out.append({"measure": "4 nodes load one checkpoint: origin bytes",
                "target": f"<= {TARGET_CKPT_ORIGIN_X}x checkpoint",
                "value": f"{w['origin_x']:.2f}x", "met": w["origin_x"] <= TARGET_CKPT_ORIGIN_X})
    tx = w["max_s"] / alone["max_s"]
    out.append({"measure": "4 nodes load one checkpoint: each node's load time",
                "target": f"<= {TARGET_CKPT_TIME_X}x one node alone",
                "value": f"{tx:.2f}x ({w['max_s']:.2f} / {alone['max_s']:.2f} s)" + (
                    f"; {w['max_s'] / ck['alone, without']['max_s']:.2f}x without the tier"
                    if "alone, without" in ck else ""),
                "met": tx <= TARGET_CKPT_TIME_X and not w["verify_errors"]})
    v = f["volume_killed"]
    bad = v["failed"] + v["verify_errors"] + v.get("read_errors", 0)
    out.append({"measure": "volume server killed mid-epoch",
                "target": "no failed read, no wrong byte",
                "value": f"{v['reads']} reads, {v['failed']} failed, "
                         f"{v['verify_errors']} wrong",
                "met": bad == 0 and "fault_error" not in v})
    base = _mean(ep["without"])
    d = f["tier_down"]
    dx = d["min_mbps"] / base if base else 0.0
    g = f["gateway_killed"]
    out.append({"measure": "tier down: reads go on at single-node speed",
                "target": f">= {TARGET_DOWN_X} x without the tier, no failed read",
                "value": f"{dx:.2f} ({d['min_mbps']:.1f} / {base or 0:.1f} MB/s), "
                         f"{g['failed'] + d['failed']} failed, "
                         f"{g['verify_errors'] + d['verify_errors']} wrong",
                "met": dx >= TARGET_DOWN_X and not (g["failed"] + d["failed"]
                                                    + g["verify_errors"] + d["verify_errors"])})
    a = f["after_recovery"]
    rec = f["recovered_after_s"]
    opened = sum(x is not None for x in f.get("breakers", {}).get("opened_after_s", []))
    out.append({"measure": "tier back: used again by itself",
                "target": "shared hits > 0, no remount",
                "value": (f"{opened}/{r['params']['nodes']} breakers opened, all closed "
                          f"{rec:.1f} s after; {a.get('shared_hits', 0)} hits"
                          if rec is not None else
                          f"not within {RECOVERY_WAIT_S:.0f} s; {a.get('shared_hits', 0)} hits"),
                "met": rec is not None and a.get("shared_hits", 0) > 0})
    return out


def table(r: dict) -> str:
    p, link = r["params"], r["link_mbps"]
    lo, hi = r["file_bytes"]
    lines = [
        f"multinode: {p['nodes']} nodes x {r['readers']} readers, {p['epochs']} epochs, "
        f"origin {p['rtt_ms']:.0f} ms away, shared tier = SeaweedFS cluster (master, 3 "
        f"volume servers, replication 001, filer, s3) behind 1 ms; {r['block'][:-1]} MiB blocks, "
        f"{r['cache_mb']} MiB disk + {r['cache_mb']} MiB memory cache per node",
        f"dataset: {p['files']} synthetic files of {lo / 1024:.0f}-{hi / 1024:.0f} KiB "
        f"({r['dataset_bytes'] / 1e6:.1f} MB; random bytes, neither the `samples` set "
        f"(80-120 KB files) nor the `shards` set (~8 MB tars)); each epoch a "
        f"DistributedSampler-style split; the several-MB case is the checkpoint: one "
        f"file of {r['ckpt_bytes'] / MB:.0f} MiB, loaded by fresh nodes with "
        f"{r.get('ckpt_cache_mb', [CKPT_CACHE_MB, CKPT_MEMORY_MB])[0]} MiB disk + "
        f"{r.get('ckpt_cache_mb', [CKPT_CACHE_MB, CKPT_MEMORY_MB])[1]} MiB memory cache "
        "(above the 64 MiB read-ahead)",
        f"links, one node's share, {r['readers']} GETs at a time: in-region (the cluster "
        f"via 1 ms) {link['in_region_alone']:.1f} MB/s alone, {link['in_region']:.1f} MB/s "
        f"per node with {p['nodes']} at once (= the in-region link row: 'x link'); WAN "
        f"(origin via {p['rtt_ms']:.0f} ms) {link['wan_alone']:.1f} MB/s alone",
        "",
        f"{'epochs':<38}{'WAN/dataset':>12}{'slowest MB/s':>14}{'x link':>8}"
        f"{'mean MB/s':>11}{'failed':>8}{'wrong':>7}"]
    for name in ("without", "with", *p["others"]):
        rows = r["epochs"].get(name)
        label = LABELS.get(name, name) + (" (each alone)" if name in p["others"] else "")
        if rows is None:
            err = r.get("errors", {}).get(name, "not run")
            lines.append(f"{label:<38}ERROR {err[:100]}")
            continue
        for e in rows:
            lines.append(f"{label + ', epoch ' + str(e['epoch']):<38}{e['wan_x']:>12.2f}"
                         f"{e['min_mbps']:>14.1f}{e['min_mbps'] / link['in_region']:>8.2f}"
                         f"{e['mean_mbps']:>11.1f}{e['failed']:>8}{e['verify_errors']:>7}")
        a = summarize(rows, p["epochs"])
        lines.append(f"{label + ', all':<38}{a['wan_x']:>12.2f}"
                     + (f"{'':22}shared hits {a['shared_hits']}" if name == "with" else ""))
    f = r["faults"]
    if not f:                        # --only epochs: the tier's counters instead
        lines += ["", "the tier's counters, summed over the nodes, per epoch with --shared-cache:"]
        for name in ("without", "with"):
            lines.append(f"CPU-s {name}: " + ", ".join(
                f"epoch {e['epoch']} daemons {e.get('daemon_cpu_s', 0):.2f} tier "
                f"{e.get('tier_cpu_s', 0):.2f} machine {e.get('machine_cpu_s', 0):.2f} "
                f"({e.get('machine_cpu_s', 0) / max(e['wall_s'], 1e-6):.2f} cores busy)"
                for e in r["epochs"][name]))
        for e in r["epochs"]["with"]:
            if e.get("daemon_cpu_by_thread"):
                lines.append(f"epoch {e['epoch']} daemons' CPU-s by thread: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in sorted(e["daemon_cpu_by_thread"].items(),
                                                      key=lambda kv: -kv[1])))
            lines.append(f"epoch {e['epoch']}: " + ", ".join(
                f"{k.removeprefix('shared_')} {e[k]}" for k in COUNTERS if e.get(k)))
        lines += [f"{t['measure']}: {t['value']} (target {t['target']})" for t in targets(r)]
        return "\n".join(lines)
    lines += ["", f"{'faults (the --shared-cache nodes go on)':<50}{'reads':>6}{'failed':>7}"
                  f"{'wrong':>6}{'WAN/dataset':>12}{'slowest MB/s':>13}{'shared hits':>12}"]
    down = f["tier_down"]
    for key, label in (("volume_killed", "epoch{s} {e}: volume server killed at {t}"),
                       ("gateway_killed", "epoch {e}: S3 gateway killed at {t}"),
                       ("tier_down", "epoch{s} {e}: the tier down" + (
                           "" if None not in f.get("breakers", {}).get("opened_after_s", [])
                           else " (breakers not all open)")),
                       ("after_recovery", "epoch {e}: gateway back, nodes untouched")):
        e = f[key]
        t = f"{e['fault_at_s']:.1f} s" if "fault_at_s" in e else "-"
        text = label.format(e=e["epoch"], t=t, s="s" if e.get("epochs", 1) > 1 else "")
        lines.append(f"{text:<50}{e['reads']:>6}{e['failed']:>7}{e['verify_errors']:>6}"
                     f"{e['wan_x']:>12.2f}{e['min_mbps']:>13.1f}{e.get('shared_hits', 0):>12}"
                     + (f"  FAULT FAILED {e['fault_error']}" if e.get("fault_error") else ""))
    g, br, rec = f["gateway_killed"], f.get("breakers", {}), f["recovered_after_s"]
    opened = [x for x in br.get("opened_after_s", []) if x is not None]
    dl = [x for x in br.get("deadline_ms", []) if x]
    lines.append(
        f"(volume server killed, then down {f['volume_killed'].get('down_s', 0):.0f} s: "
        f"{f['volume_killed'].get('shared_errors', 0)} shared-tier "
        f"errors, {f['volume_killed'].get('shared_timeouts', 0)} timeouts, "
        f"{f['volume_killed'].get('shared_misses', 0)} misses (each read from the origin); "
        "tier down: "
        f"{g.get('shared_errors', 0) + down.get('shared_errors', 0)} errors + "
        f"{g.get('shared_timeouts', 0) + down.get('shared_timeouts', 0)} timeouts, then the "
        f"breaker opened on {len(opened)} of {r['params']['nodes']} nodes"
        + (f" {min(opened):.1f}-{max(opened):.1f} s after the kill" if opened else "")
        + (f" (deadlines {min(dl):.0f}-{max(dl):.0f} ms)" if dl else "")
        + f" and skipped {down.get('shared_skipped', 0)} lookups; gateway restarted in "
        f"{f['gateway_restart_s']:.1f} s, every node used the tier again "
        + (f"{rec:.1f} s later, by itself)" if rec is not None
           else f"NOT within {RECOVERY_WAIT_S:.0f} s)"))
    lines += ["", f"{'checkpoint load':<38}{'origin/ckpt':>12}{'slowest s':>11}"
                  f"{'x alone':>9}{'lease waits':>13}{'failed':>8}{'wrong':>7}"]
    alone = r["checkpoint"]["alone"]["max_s"]
    for name, c in r["checkpoint"].items():
        label = f"{c['nodes']} node{'s' if c['nodes'] > 1 else ''}, {name}"
        lines.append(f"{label:<38}{c['origin_x']:>12.2f}{c['max_s']:>11.2f}"
                     f"{c['max_s'] / alone:>9.2f}{c['lease_waits']:>13}"
                     f"{c['read_errors']:>8}{c['verify_errors']:>7}")
    lines += ["", f"{'target (issue 13)':<56}{'goal':<42}{'measured':<53}met"]
    for t in targets(r):
        lines.append(f"{t['measure']:<56}{t['target']:<42}{t['value']:<52} "
                     f"{'yes' if t['met'] else 'NO'}")
    lines.append("('x link': slowest node's MB/s / the in-region link row; 'single-node "
                 "speed': the slowest node with the tier down / the slowest node of the same "
                 "4 nodes without --shared-cache, mean of epochs 2-3; rclone/s3fs cache "
                 f"{CACHE_MB} MiB like the nodes, but s3fs cannot start below "
                 "176 MiB, so it keeps the whole dataset)")
    return "\n".join(lines)


def rows(r: dict) -> list[dict]:
    """The runner's rows (bench/report/results.py): per epoch and checkpoint load, the slowest
    node's MB/s, WAN bytes as ``link_bytes_down``; a ``link`` row = the in-region link."""
    link = r["link_mbps"]["in_region"]
    base = {"scenario": "multinode"}
    out = [{**base, "system": "link", "phase": "link", "value": link, "unit": "MB/s",
            "mbps": link, "note": "in-region, per node, 4 at once"}]
    for name, eps in r["epochs"].items():
        for e in eps:
            out.append({**base, "system": LABELS.get(name, name), "phase": f"epoch{e['epoch']}",
                        "value": e["min_mbps"], "unit": "MB/s", "mbps": e["min_mbps"],
                        "bytes": e["bytes"], "seconds": e["wall_s"],
                        "verify_errors": e["verify_errors"],
                        "link_bytes_down": e["wan_bytes"],
                        "byte_hit_rate_est": max(0.0, 1 - e["wan_bytes"] / max(e["bytes"], 1))})
    phases = {"volume_killed": "vol-kill", "gateway_killed": "gw-kill",
              "tier_down": "tier-down", "after_recovery": "recovered"}
    for key in phases:
        if isinstance(e := r["faults"].get(key), dict):
            out.append({**base, "system": LABELS["with"], "phase": phases[key],
                        "value": e["min_mbps"], "unit": "MB/s", "mbps": e["min_mbps"],
                        "bytes": e["bytes"], "seconds": e["wall_s"],
                        "verify_errors": e["verify_errors"], "link_bytes_down": e["wan_bytes"],
                        "byte_hit_rate_est": max(0.0, 1 - e["wan_bytes"] / max(e["bytes"], 1)),
                        "fault": key})
    for name, err in r.get("errors", {}).items():
        out.append({**base, "system": LABELS.get(name, name), "phase": "-", "error": err})
    for name, c in r["checkpoint"].items():
        sysname = {
            "alone": "1x nc --shared-cache", "alone, without": "1x neuralcache",
            "with": LABELS["with"], "without": LABELS["without"],
            "with, leases off": "4x nc --shared, no lease"}[name]
        out.append({**base, "system": sysname, "phase": "ckpt", "value": c["max_s"],
                    "unit": "s load", "bytes": r["ckpt_bytes"], "seconds": c["max_s"],
                    "verify_errors": c["verify_errors"],
                    "link_bytes_down": int(c["origin_x"] * r["ckpt_bytes"])})
    return out
