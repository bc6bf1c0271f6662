"""Userspace WAN emulator: a TCP proxy that adds delay, a bandwidth cap, jitter and faults.

The kernel on this project's machines has no ``netem`` qdisc, so the benchmark link is
emulated here.  Model (per direction, client->upstream is "up", upstream->client "down"):

* **Delay.**  Every chunk read from one side is queued with a due time
  ``arrival + one_way_delay`` and written to the other side when due.  Reading never
  waits for delivery, so data is pipelined: throughput is not capped at buffer/RTT per
  connection, only by the in-flight window (``MAX_INFLIGHT`` bytes per direction and
  connection, far above the bandwidth-delay product of any link we emulate).
* **Connection set-up.**  The proxy accepts at once, but nothing the client sends is
  delivered before ``accept + RTT + one_way`` -- the SYN/SYN-ACK round trip a real
  client pays before its first byte.  So a request on a new connection costs two RTTs,
  on a kept-alive connection one RTT, as on a real WAN.
* **Bandwidth.**  One token bucket per direction, shared by all connections (like a
  real bottleneck link): a chunk leaves the bucket at ``max(now, link_free)`` +
  ``size/rate`` (burst ``BURST_S`` of line rate), then travels ``one_way`` seconds.
* **Jitter.**  Uniform in ``[-j, +j]`` added to each chunk's one-way delay (never
  below zero); order is kept (a TCP stream never reorders).
* **Faults** (seeded, so a run is reproducible): with ``--fault-unit request`` (default)
  each client request -- a burst of client bytes following a response -- is reset with
  probability ``reset_rate`` (client sees ECONNRESET, upstream is dropped) and its
  response stalled ``stall_s`` seconds with probability ``stall_rate``.  With
  ``--fault-unit connection`` the draw is made once per connection; a reset connection
  is reset after a random number (< 256 KiB) of downstream bytes.
* **Counters.**  Bytes delivered per direction, connections, resets, stalls.

Use it in-process (``WanProxy(...).start()``, runs its own event loop in a thread),
as a subprocess (``WanProxyProcess``, same API, counters via a control port -- what
the benchmark runner uses so the proxy never competes with workload threads for the
GIL), or from the command line::

    python -m bench.wan --listen 9000 --upstream 127.0.0.1:8333 --rtt-ms 60 [--mbit N]
        [--jitter-ms J] [--reset-rate R] [--stall-rate R] [--stall-s S] [--seed N]

Modules: ``core`` (the delaying proxy: pipes, connections, the bandwidth buckets,
``WanProxy``), ``faults`` (the seeded resets and stalls), ``process`` (the command line
and ``WanProxyProcess``, which runs it).
"""
from .core import WanProxy
from .faults import FaultConfig
from .process import WanProxyProcess, main

__all__ = ["WanProxy", "WanProxyProcess", "FaultConfig", "main"]
