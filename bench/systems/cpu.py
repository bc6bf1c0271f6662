"""CPU seconds of every process a measurement involves, summed over process trees.

A phase's CPU is the benchmark process itself (the workload's threads, and in-process
clients such as s3torchconnector's native threads), every process it started for the
workload (DataLoader workers, a streaming library's helpers: the *client* tree), and
the filesystem daemon serving the mount (rclone, s3fs, the neuralcache daemon and their
children: the *daemon* tree).  The WAN proxy and SeaweedFS stand for the network and the
remote store: they are excluded.

Processes come and go during a phase (DataLoader workers live one epoch), so
``CpuMeter`` combines two sources:

* ``getrusage``: ``RUSAGE_SELF`` (this process, all threads) and ``RUSAGE_CHILDREN``
  (every child this process reaped during the phase, with what they reaped);
* ``/proc/PID/stat`` (utime + stime + cutime + cstime) of the live processes of the two
  trees at the start and at the end: a process alive at both counts its delta, one born
  during the phase its whole CPU, and one that was alive at the start and gone at the end
  (reaped, so inside ``RUSAGE_CHILDREN`` or its parent's cutime) has its CPU from before
  the phase subtracted.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Callable, Iterable

# /proc counts CPU time in these clock ticks per second.
TICK = os.sysconf("SC_CLK_TCK")


def processes():
    """(pid, comm, the stat fields after "(comm)") of every process on the machine,
    skipping one that exits while it is read."""
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            with open(f"/proc/{d.name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        cut = raw.rfind(b")")
        yield (int(d.name), raw[raw.find(b"(") + 1:cut].decode(errors="replace"),
               raw[cut + 2:].split())


def proc_table() -> dict[int, tuple[int, float]]:
    """{pid: (ppid, CPU seconds incl. reaped children)} of every process on the machine."""
    out = {}
    for pid, _, rest in processes():
        try:   # fields after "(comm)": state ppid ... utime(11) stime cutime cstime
            out[pid] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / TICK)
        except (IndexError, ValueError):
            continue
    return out


def _machine_ticks() -> list[int]:
    """/proc/stat's "cpu" line: user nice system idle iowait irq softirq steal ..."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def machine_busy() -> float:
    """CPU seconds every core of the machine has spent busy so far (/proc/stat: all
    but idle and iowait), whoever spent them."""
    fields = _machine_ticks()
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK   # user..steal, minus idle, iowait


def machine_total() -> float:
    """CPU seconds every core of the machine has counted so far, busy or idle (the
    denominator of ``machine_busy``: user..steal)."""
    return sum(_machine_ticks()[:8]) / TICK


def machine_steal() -> float:
    """CPU seconds the hypervisor has taken from this VM's cores so far (/proc/stat's
    steal column): time a row's processes wanted a core and the host gave it to another
    guest.  A row with steal ran on a slower machine than its neighbours."""
    fields = _machine_ticks()
    return fields[7] / TICK if len(fields) > 7 else 0.0


def _stat(path: str) -> list[str]:
    """The fields of a /proc stat file after "(comm)": state ppid ... minflt(7) ...
    utime(11) stime(12)."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """The process's own CPU seconds so far (utime + stime; not its reaped children)."""
    fields = _stat(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / TICK


# Thread groups of the neuralcache daemon, named for a reader: its trio loop runs in
# the main thread; trio's worker threads are named "Trio thread N".
THREAD_LABELS = {"main": "trio loop (main)", "Trio thread": "trio workers"}


def thread_cpu(pid: int) -> dict[str, float]:
    """The process's CPU seconds so far by thread group: its threads' names (``comm``)
    with digits dropped, so "Trio thread 12" and "Trio thread 3" add up, and tokio's
    runtime workers (obstore) are one group.  A thread that exited is not counted.
    Each thread's time is its ``schedstat`` run time (ns): /proc's stat counts whole
    clock ticks per thread, and a hundred worker threads busy a few ms each showed a
    tenth of what they used (bench/RESULTS.md, thirty-eighth sitting)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "".join(c for c in f.read().strip() if not c.isdigit()).strip()
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    secs = int(f.read().split()[0]) / 1e9
            except (OSError, IndexError, ValueError):     # a kernel without it
                fields = _stat(f"/proc/{pid}/task/{tid}/stat")
                secs = (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            continue
        name = THREAD_LABELS.get("main" if tid == str(pid) else name, name)
        out[name] = out.get(name, 0.0) + secs
    return out


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (each first touch of a fresh page)."""
    return int(_stat(f"/proc/{pid}/stat")[7])


def minor_faults_of(pids: Iterable[int]) -> dict[int, int]:
    """``minor_faults`` of each of ``pids`` still alive."""
    out = {}
    for pid in pids:
        try:
            out[pid] = minor_faults(pid)
        except (OSError, IndexError, ValueError):
            pass
    return out


def descendants(table: dict[int, tuple[int, float]], roots: Iterable[int],
                stop: set[int] = frozenset()) -> set[int]:
    """``roots`` and everything below them, not entering the subtrees of ``stop``."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in table and r not in stop]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo += [c for c in kids.get(p, ()) if c not in stop]
    return seen


def find_pids(marker: str, name: str) -> list[int]:
    """Pids whose command line has an argument equal to ``marker`` and one containing
    ``name`` (e.g. the daemon serving mountpoint ``marker``)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd and any(name.encode() in c for c in cmd):
            out.append(int(d.name))
    return out


def _rusage() -> tuple[float, float]:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


class CpuMeter:
    """CPU of the client tree (this process and its children, minus ``exclude`` and the
    daemon trees) and of the daemon trees (``daemon_pids()``) between start and stop."""

    def __init__(self, daemon_pids: Callable[[], list[int]] = list,
                 exclude: Callable[[], list[int]] = list):
        self.daemon_pids = daemon_pids
        self.exclude = exclude
        self.me = os.getpid()

    def _trees(self) -> tuple[dict[int, float], dict[int, float]]:
        t = proc_table()
        daemons = [p for p in self.daemon_pids() if p]
        stop = set(p for p in self.exclude() if p) | set(daemons)
        client = descendants(t, [self.me], stop) - {self.me}
        daemon = descendants(t, daemons, set(p for p in self.exclude() if p))
        return ({p: t[p][1] for p in client}, {p: t[p][1] for p in daemon})

    def start(self) -> "CpuMeter":
        self.r0 = _rusage()
        self.c0, self.d0 = self._trees()
        return self

    def stop(self) -> dict:
        c1, d1 = self._trees()
        r1 = _rusage()
        self_s = r1[0] - self.r0[0]
        reaped = r1[1] - self.r0[1]
        kids = (sum(c1[p] - self.c0.get(p, 0.0) for p in c1)
                - sum(v for p, v in self.c0.items() if p not in c1))
        daemon = (sum(d1[p] - self.d0.get(p, 0.0) for p in d1)
                  - sum(v for p, v in self.d0.items() if p not in d1))
        client = self_s + reaped + kids
        return {"cpu_s": round(client + max(daemon, 0.0), 3),
                "cpu_client_s": round(client, 3), "cpu_daemon_s": round(max(daemon, 0.0), 3),
                "cpu_procs": len(c1) + len(d1) + 1}
