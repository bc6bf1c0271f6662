"""Userspace WAN emulator: a TCP proxy that adds delay, a bandwidth cap, jitter and faults.

The kernel on this project's machines has no ``netem`` qdisc, so the benchmark link is
emulated here.  Model (per direction, client->upstream is "up", upstream->client "down"):

* **Delay.**  Every read from one side is queued with a due time ``read + one_way``
  and written to the other side when due.  Reading never waits for delivery, so data is
  pipelined: throughput is not capped at buffer/RTT per connection, only by the in-flight
  window (``MAX_INFLIGHT`` = 32 MiB per direction and connection, far above the
  bandwidth-delay product of any link we emulate).  No byte is ever delivered before
  one way after the proxy read it, and the proxy cannot read it before the sender wrote
  it.
* **Connection set-up.**  The proxy accepts at once, but nothing the client sends is
  delivered before ``accept + RTT + one_way`` -- the SYN/SYN-ACK round trip a real
  client pays before its first byte.  So a request on a new connection costs two RTTs,
  on a kept-alive connection one RTT, as on a real WAN.
* **Bandwidth.**  One token bucket per direction, shared by all connections (like a
  real bottleneck link): a read is queued as pieces of ~1 ms of line time (>= 16 KiB);
  a piece leaves the bucket at ``max(now, link_free)`` + ``size/rate`` (burst
  ``BURST_S`` of line rate), then travels ``one_way`` seconds.
* **Jitter.**  Uniform in ``[-j, +j]`` added to each read's one-way delay (never
  below zero); order is kept (a TCP stream never reorders).
* **Faults** (seeded, so a run is reproducible): with ``--fault-unit request`` (default)
  each client request -- a burst of client bytes following a response -- is reset with
  probability ``reset_rate`` (client sees ECONNRESET, upstream is dropped) and its
  response stalled ``stall_s`` seconds with probability ``stall_rate``.  With
  ``--fault-unit connection`` the draw is made once per connection; a reset connection
  is reset after a random number (< 256 KiB) of downstream bytes (exactly that many are
  handed to the client first), a stalled one from its first response bytes on.
* **Counters.**  Bytes delivered per direction, connections, resets, stalls, and the
  emulator's own CPU: ``cpu_s`` (the proxy thread, or the whole ``python -m bench.wan``
  process since it started serving) and ``cpu_s_per_gib`` (that per GiB carried, both directions);
  ``cpu_note(after, before)`` words it as one line for a run's notes.

**How it is cheap** (issue 10: the emulator must not be what steals the CPU).  The bytes
never enter Python: ``os.splice`` moves them from the source socket into kernel pipes
when they arrive and from the pipes into the destination socket when they are due; the
proxy keeps only ``[due, nbytes, pipe]`` records (conn.py).  One epoll loop in one thread
serves all connections.  A quiet source is read when readable (a request, the first bytes
of a response: stamped on arrival); a busy one (a read >= 64 KiB) is read on a 1 ms grid
with one large splice per tick, and goes back to readiness events when a tick brings
< 16 KiB.  All features above (delay, set-up, bandwidth, jitter, faults) run on this one
path -- there is no slower exact mode.  Measured on the 2-core dev machine: 0.2-0.3 CPU-s
per GiB at link rate (about the kernel's own TCP cost of the extra loopback hop; the
asyncio proxy this replaced, which copied every chunk through Python, cost 0.5-1.0),
0.7-1.3 for 100 KiB request/response traffic (1.8-3.2 before), 0.7-0.9 with --mbit 800
(each ~1 ms piece is its own small delivery; 0.9-1.7 before).

**What it does not model.**  Packet loss and retransmission, TCP slow start and
congestion control (each leg is loopback TCP: after the set-up delay a new connection
moves at full speed at once, where a real WAN connection ramps up over several RTTs),
reordering, per-packet serialization.  Timing granularity: a busy source's bytes are
stamped when read on the 1 ms grid, up to ~1 ms after they arrived, and all bytes of one
read are released together; deliveries happen on the loop's millisecond timer, up to ~1
ms after they are due.  So the one-way delay of a byte is ``one_way`` + [0, ~2 ms] (more
when the machine is overloaded), never less.  Jitter is drawn per read (a readiness
event or one grid tick of bytes), not per TCP segment.  The client's ``connect()``
returns at once; an upstream that refuses shows as a reset after the accept.

Use it in-process (``WanProxy(...).start()``, runs its own event loop in a thread),
as a subprocess (``WanProxyProcess``, same API, counters via a control port -- what
the benchmark runner uses so the proxy never competes with workload threads for the
GIL), or from the command line::

    python -m bench.wan --listen 9000 --upstream 127.0.0.1:8333 --rtt-ms 60 [--mbit N]
        [--jitter-ms J] [--reset-rate R] [--stall-rate R] [--stall-s S] [--seed N]

Modules: ``core`` (the epoll loop, timers, counters, ``WanProxy``), ``conn`` (a
connection: its sockets, the splice delay lines, the bandwidth buckets), ``faults`` (the
seeded resets and stalls), ``process`` (the command line and ``WanProxyProcess``, which
runs it), ``ceiling`` (``python -m bench ceiling``: the proxy's own limit).  The arrows
run process -> core -> conn -> faults; faults imports nothing of the proxy.
"""
from .core import WanProxy
from .faults import FaultConfig
from .process import WanProxyProcess, cpu_note, main

__all__ = ["WanProxy", "WanProxyProcess", "FaultConfig", "cpu_note", "main"]
