"""Ratios, the printed table and the PNG plots of a benchmark run."""
from __future__ import annotations

from pathlib import Path

WINDOWED = ("train", "train-files", "maze")   # rows with per-window samples/s


def within(windows: list[dict], target: float, frac: float = 0.05) -> int | None:
    """First batch index whose window rate is within ``frac`` of ``target`` (None: never)."""
    for w in windows:
        if w["samples_per_s"] >= (1 - frac) * target:
            return w["batch"]
    return None


def annotate(rows: list[dict]) -> list[dict]:
    """Add ``x_local`` (value / local's value, same scenario+phase), ``x_link`` (MB/s /
    link MB/s, same scenario) and, for train, ``within5_batch``."""
    local = {(r["scenario"], r["phase"]): r for r in rows
             if r["system"] == "local" and "value" in r}
    link = {r["scenario"]: r for r in rows if r["system"] == "link" and "mbps" in r}
    for r in rows:
        if "value" not in r:
            continue
        lo = local.get((r["scenario"], r["phase"]))
        if lo and lo["value"]:
            r["x_local"] = r["value"] / lo["value"]
        li = link.get(r["scenario"])
        if li and li["mbps"] and r["system"] != "link" and r.get("mbps"):
            r["x_link"] = r["mbps"] / li["mbps"]
        if (r["scenario"] in WINDOWED and lo and lo is not r and "windows" in r
                and "windows" in lo):
            steady = sorted(w["samples_per_s"] for w in lo["windows"][1:-1] or lo["windows"])
            target = steady[len(steady) // 2]
            r["local_steady_samples_per_s"] = target
            r["within5_batch"] = within(r["windows"], target)
    return rows


def _fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def _hit(r: dict) -> str:
    if r.get("hit_rate") is not None:
        return f"{r['hit_rate']:.2f}"
    if r.get("served_by_page_cache"):
        return "pgc"
    return "-"


# Below these a row's host control is not worth a note: 64 MB carried (the emulator's
# CPU per GiB is noise on less), 0.1 s of steal (a tick or two on 2 cores).
HOST_NOTE_MIN_BYTES = 64e6
HOST_NOTE_MIN_STEAL_S = 0.1


def _host_note(r: dict) -> list[str]:
    """The row's host control (harness.measure): the WAN emulator's CPU per GiB it
    carried, and the VM's steal time, when there is enough of either to read."""
    out = []
    carried = r.get("link_bytes_down", 0) + r.get("link_bytes_up", 0)
    if r.get("proxy_cpu_s") is not None and carried >= HOST_NOTE_MIN_BYTES:
        out.append(f"WAN emu {r['proxy_cpu_s'] / (carried / (1 << 30)):.2f} s/GiB")
    if r.get("steal_s", 0) >= HOST_NOTE_MIN_STEAL_S:
        out.append(f"steal {r['steal_s']:.1f} s")
    return out


def table(rows: list[dict], meta: dict, notes: list[str] | None = None) -> str:
    head = (f"{'scenario':11} {'phase':9} {'system':23} {'throughput':>17} {'MB/s':>8} "
            f"{'x local':>8} {'x link':>7} {'hit':>5} {'~hit':>5} {'pf prec':>7} {'link MB':>8} "
            f"{'cpu s':>6} note")
    out = [f"# python -m bench {' '.join(meta.get('argv', [])[1:])}",
           f"# RTT {meta.get('rtt_ms')} ms, bandwidth "
           f"{str(meta.get('mbit')) + ' Mbit/s' if meta.get('mbit') else 'unlimited'}, "
           f"{'quick' if meta.get('quick') else 'full'}, {meta.get('cpus')} cpus"
           + (f", jitter {meta['jitter_ms']} ms" if meta.get("jitter_ms") else "")
           + (f", resets {meta['reset_rate']}/request" if meta.get("reset_rate") else "")
           + (f", stalls {meta['stall_rate']}/request x {meta.get('stall_s')} s"
              if meta.get("stall_rate") else ""),
           head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            out.append(f"{r['scenario']:11} {r['phase']:9} {r['system']:23} "
                       f"ERROR {r['error'][:110]}")
            continue
        note = []
        if r.get("verify_errors"):
            note.append(f"VERIFY ERRORS {r['verify_errors']}")
        if r.get("within5_batch") is not None or ("windows" in r
                                                   and r["system"] not in ("link", "local")):
            note.append(f"within 5% of local at batch {r.get('within5_batch') or 'never'}")
        if r.get("accuracy_after") is not None:
            note.append(f"accuracy {r['accuracy_before']:.0%} -> {r['accuracy_after']:.0%}")
        if r.get("same_bytes_as_local") is not None and r["system"] != "local":
            note.append("bytes == local" if r["same_bytes_as_local"] else "BYTES DIFFER")
        if r.get("loss_max_diff") is not None and r["system"] != "local":
            note.append(f"loss max diff {r['loss_max_diff']:.2g}")
        if r.get("stall_fraction") is not None:
            note.append(f"stall {r['stall_fraction']:.0%}")
        if r.get("mount", {}).get("page_cache_drop") and r["phase"] in ("cold", "epoch1"):
            note.append(f"cache drop: {r['mount']['page_cache_drop']}")
        if r.get("workers") and r["scenario"] == "train-files":
            note.append(f"{r['workers']} workers")
        if r.get("readers"):
            note.append(f"{r['readers']} readers")
        conv = r.get("conversion")
        if conv and r["phase"] in ("cold", "epoch1"):
            note.append(f"converted copy {conv['converted_bytes'] / 1e6:.0f} MB "
                        f"({conv['converted_bytes'] / max(conv['original_bytes'], 1):.2f}x, "
                        f"{conv['objects']} objects"
                        + (f" of <= {conv['shard_mb']} MB" if conv.get("shard_mb") else "")
                        + f") made in {conv['convert_s']:.0f} s "
                        f"+ upload {conv.get('upload_s', 0):.0f} s, not counted")
        note += _host_note(r)
        thr = f"{r['value']:.1f} {r['unit']}"
        out.append(
            f"{r['scenario']:11} {r['phase']:9} {r['system']:23} {thr:>17} "
            f"{_fmt(r.get('mbps'), '8.1f'):>8} {_fmt(r.get('x_local'), '8.2f'):>8} "
            f"{_fmt(r.get('x_link'), '7.2f'):>7} {_hit(r):>5} "
            f"{_fmt(r.get('byte_hit_rate_est'), '5.2f'):>5} "
            f"{_fmt(r.get('prefetch_precision'), '7.2f'):>7} "
            f"{r.get('link_bytes_down', 0) / 1e6:8.1f} {_fmt(r.get('cpu_s'), '6.1f'):>6} "
            f"{'; '.join(note)}")
    out.append("hit: the system's own hit rate (neuralcache: demand-hit bytes / bytes served; "
               "pgc = all reads served by the kernel page cache); ~hit: 1 - link bytes / "
               "bytes read, for every remote system; pf prec: used / fetched read-ahead + "
               "prefetch bytes; cpu s: CPU seconds of every process involved (the benchmark "
               "process, its loader workers, the filesystem daemon; not the proxy or "
               "SeaweedFS); WAN emu: the emulator's CPU per GiB it carried in that row, "
               "the same work for every system, and steal: CPU the host took from this VM "
               "during the row; either high against its neighbours marks a slow minute "
               "of the machine, not of the system.")
    out += [f"note: {n}" for n in notes or []]
    return "\n".join(out)


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path


def windows_plot(path: Path, series: list[tuple[str, list[dict]]], title: str,
                 xlabel: str = "batch") -> Path:
    """samples/s per batch window, one line per (label, windows); a window is
    ``{"batch": last batch, "samples_per_s": ...}`` (train and maze rows)."""
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    for label, windows in series:
        ax.plot([w["batch"] for w in windows], [w["samples_per_s"] for w in windows],
                marker=".", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("samples/s (per window)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plots(rows: list[dict], out: Path) -> list[Path]:
    made = []
    scen = []
    for r in rows:
        if r["scenario"] not in scen:
            scen.append(r["scenario"])
    for s in scen:
        rs = [r for r in rows if r["scenario"] == s and "value" in r]
        if not rs:
            continue
        if s == "maze":
            continue   # bench/scenarios/maze/scenario.py draws its own throughput and loss plots
        if s in ("checkpoint", "multinode"):
            continue   # seconds and MB/s rows share no axis: the table says it all
        path = Path(out) / f"{s}.png"
        if s == "train":
            made.append(windows_plot(path, [(r["system"], r["windows"]) for r in rs
                                            if "windows" in r],
                                     "train: samples/s per batch window (cold)"))
            continue
        if s == "train-files":          # one plot per epoch: the warm-up, then epoch 2
            for ph in sorted({r["phase"] for r in rs if "windows" in r}):
                made.append(windows_plot(
                    Path(out) / f"{s}-{ph}.png",
                    [(r["system"], r["windows"]) for r in rs
                     if "windows" in r and r["phase"] == ph],
                    f"train-files {ph}: samples/s per window of batches"))
            continue
        phases = []
        for r in rs:
            if r["system"] != "link" and r["phase"] not in phases:
                phases.append(r["phase"])
        systems = []
        for r in rs:
            if r["system"] != "link" and r["system"] not in systems:
                systems.append(r["system"])
        fig, ax = pyplot().subplots(figsize=(min(14, max(6, 1.3 * len(systems) + 2)), 4.5))
        width = 0.8 / max(len(phases), 1)
        for i, ph in enumerate(phases):
            vals = []
            for sy in systems:
                m = [r for r in rs if r["system"] == sy and r["phase"] == ph]
                vals.append(m[0]["value"] if m else 0)
            ax.bar([j + i * width for j in range(len(systems))], vals, width, label=ph)
        link = [r for r in rs if r["system"] == "link"]
        unit = rs[0]["unit"]
        if link:
            ax.axhline(link[0]["value"], color="k", ls="--", lw=1,
                       label=f"link ceiling {link[0]['value']:.0f} {link[0]['unit']}")
        ax.set_xticks([j + width * (len(phases) - 1) / 2 for j in range(len(systems))])
        ax.set_xticklabels(systems, rotation=15)
        ax.set_ylabel(unit)
        ax.set_yscale("log")
        ax.set_title(f"{s}: throughput per system")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        made.append(save_figure(fig, path))
    return made
