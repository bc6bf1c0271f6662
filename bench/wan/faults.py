"""Fault injection for the WAN proxy: seeded connection resets and response stalls.

With ``unit="request"`` (default) each client request -- a burst of client bytes
following a response -- is reset with probability ``reset_rate`` (the client sees
ECONNRESET, the upstream connection is dropped) and its response stalled ``stall_s``
seconds with probability ``stall_rate``.  With ``unit="connection"`` the draws are made
once per connection; a reset connection is reset after a random number (<
``CONN_RESET_MAX_BYTES``) of downstream bytes (exactly that many reach the client), a
stalled one stalls from its first response bytes on.  Every draw comes from the
connection's own seeded generator, so a run is reproducible.

A connection (conn.py) calls ``ConnFaults`` when a new request starts, when response
bytes arrive from upstream, before it delivers response bytes (``down_budget``) and
after; the faults act through the connection's ``reset()`` and ``down.stall(seconds)``
(``Conn``: all this module asks of one, so that it imports nothing of the proxy).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

# With connection-unit resets, the reset comes after a uniform number of bytes below this.
CONN_RESET_MAX_BYTES = 256 << 10
UNITS = ("request", "connection")


class Conn(Protocol):
    """What the faults act through: a proxied connection (conn.py's ``_Conn``)."""

    core: Any        # its ProxyCore: ``core.stats.stalls`` counts the stalls
    down: Any        # its downstream delay line: ``down.stall(seconds)``

    def reset(self, count: bool = True) -> None: ...


@dataclass(frozen=True)
class FaultConfig:
    reset_rate: float = 0.0     # probability of a reset per request (or connection)
    stall_rate: float = 0.0     # probability of a stalled response per request (or connection)
    stall_s: float = 1.0        # stall length
    unit: str = "request"       # "request" or "connection"

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError("fault_unit must be 'request' or 'connection'")


class ConnFaults:
    """The faults of one connection (connection-unit draws happen here, at set-up)."""

    def __init__(self, cfg: FaultConfig, rng: random.Random):
        self.cfg = cfg
        self.rng = rng
        self.reset_after: int | None = None  # connection-unit reset: after N down bytes
        self.down_total = 0
        self.conn_stall = False
        if cfg.unit == "connection":
            if cfg.reset_rate and rng.random() < cfg.reset_rate:
                self.reset_after = rng.randrange(CONN_RESET_MAX_BYTES)
            self.conn_stall = bool(cfg.stall_rate and rng.random() < cfg.stall_rate)

    def new_request(self, conn: Conn) -> bool:
        """A client request starts: draw the request-unit faults; True if ``conn`` was reset."""
        c = self.cfg
        if c.unit != "request":
            return False
        if c.reset_rate and self.rng.random() < c.reset_rate:
            conn.reset()
            return True
        if c.stall_rate and self.rng.random() < c.stall_rate:
            conn.core.stats.stalls += 1
            conn.down.stall(c.stall_s)
        return False

    def response_bytes(self, conn: Conn) -> None:
        """Response bytes arrived from upstream: a connection-unit stall starts here."""
        if self.conn_stall:
            self.conn_stall = False
            conn.core.stats.stalls += 1
            conn.down.stall(self.cfg.stall_s)

    def down_budget(self) -> int | None:
        """Response bytes that may still reach the client before the connection-unit
        reset (None = no reset pending); at 0 the core resets the connection."""
        if self.reset_after is None:
            return None
        return self.reset_after - self.down_total

    def delivered_down(self, conn: Conn, n: int) -> None:
        """``n`` response bytes reached the client."""
        self.down_total += n
