"""Prometheus metrics: the counters of `neuralcache stats` plus histograms of read
latency as readers see it and of backend request latency.

Opt-in (``--metrics-port``), bound to 127.0.0.1 unless ``--metrics-addr`` says
otherwise.  Names follow Prometheus conventions (``neuralcache_`` prefix, ``_total``
for counters, base units: bytes and seconds).  The Grafana dashboard in
``neuralcache/grafana/dashboard.json`` queries only names listed in ``EXPORTED``
(a test checks this).
"""
from __future__ import annotations

import logging
from typing import Callable

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

# Read latency buckets: from a page-cache-speed hit (100 us) to a retried WAN fetch.
READ_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.075, 0.1,
                0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Backend buckets: around the 60 ms round trip, up to the 5 s read timeout and beyond.
BACKEND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                   2.5, 5.0, 10.0, 30.0)

# counter name -> (stats key, help)
COUNTERS = {
    "neuralcache_served_bytes_total": ("bytes_served", "Bytes returned to readers"),
    "neuralcache_fetched_bytes_total": ("bytes_fetched", "Bytes downloaded from the remote"),
    "neuralcache_reads_total": ("reads", "Read requests served"),
    "neuralcache_read_errors_total": ("read_errors", "Read requests that failed"),
    "neuralcache_opens_total": ("opens", "Files opened"),
    "neuralcache_readahead_fetched_bytes_total": ("readahead_bytes_fetched",
                                                  "Bytes fetched by in-file read-ahead"),
    "neuralcache_readahead_used_bytes_total": ("readahead_bytes_used",
                                               "Read-ahead bytes later read"),
    "neuralcache_prefetch_fetched_bytes_total": ("prefetch_bytes_fetched",
                                                 "Bytes fetched by cross-file prefetch"),
    "neuralcache_prefetch_used_bytes_total": ("prefetch_bytes_used",
                                              "Prefetched bytes later read"),
    "neuralcache_prefetch_staged_bytes_total": ("prefetch_bytes_staged",
                                                "Prefetched bytes stored on disk, not "
                                                "in memory (its budget full)"),
    "neuralcache_ahead_lost_memory_bytes_total": ("ahead_lost_memory_bytes",
                                                  "Read-ahead and prefetched bytes memory "
                                                  "let go unread, not kept on disk"),
    "neuralcache_ahead_lost_disk_bytes_total": ("ahead_lost_disk_bytes",
                                                "Read-ahead and prefetched bytes the disk "
                                                "tier let go unread"),
    "neuralcache_backend_requests_total": ("backend_requests", "Remote requests"),
    "neuralcache_backend_errors_total": ("backend_errors",
                                         "Remote requests failed after retries"),
    "neuralcache_backend_retries_total": ("backend_retries", "Remote attempts retried"),
    "neuralcache_corrupt_blocks_total": ("corrupt_blocks_dropped",
                                         "Disk blocks that failed their checksum"),
    "neuralcache_disk_writes_skipped_total": ("disk_writes_skipped",
                                              "Fetched blocks not queued for the disk "
                                              "tier on arrival (its write queue full)"),
    "neuralcache_disk_puts_declined_total": ("disk_puts_declined",
                                             "Blocks read this epoch the disk tier did "
                                             "not store: only blocks still to be read "
                                             "this epoch were left to evict"),
    "neuralcache_disk_writes_late_total": ("disk_writes_late",
                                           "Blocks in memory only (write skipped or "
                                           "failed) queued once their reader left them "
                                           "or as memory evicted them"),
    "neuralcache_gc_pause_seconds_total": ("gc_pause_total_s",
                                           "Time every thread of the daemon waited for "
                                           "the garbage collector (gcwatch.py)"),
    "neuralcache_hit_bytes_total": ("demand_hit_bytes",
                                    "Bytes served without waiting for the remote"),
    "neuralcache_pushed_files_total": ("pushed_files",
                                       "Small files put into the kernel page cache at "
                                       "open (no READ request follows)"),
    "neuralcache_pushed_bytes_total": ("pushed_bytes",
                                       "Bytes put into the kernel page cache at open"),
    # a --writable mount (0 on a read-only one); keys of write/layer.py stats()
    "neuralcache_written_bytes_total": ("written_bytes",
                                        "Bytes applications wrote into the journal"),
    "neuralcache_uploaded_bytes_total": ("uploaded_bytes", "Bytes uploaded to the remote"),
    "neuralcache_uploaded_files_total": ("uploaded_files", "Files uploaded to the remote"),
    "neuralcache_upload_streamed_bytes_total": ("upload_streamed_bytes",
                                                "Bytes sent while their file was still "
                                                "being written"),
    "neuralcache_upload_errors_total": ("upload_errors",
                                        "Failed attempts of uploads, renames and deletes "
                                        "(each is retried)"),
    # the shared tier (store/shared.py); 0 when --shared-cache is off
    "neuralcache_shared_read_bytes_total": ("shared_bytes_read",
                                            "Bytes read from the shared tier"),
    "neuralcache_shared_written_bytes_total": ("shared_bytes_written",
                                               "Bytes written through to the shared tier"),
    "neuralcache_shared_writes_skipped_total": ("shared_writes_skipped",
                                                "Blocks not written through (queue full "
                                                "or tier down)"),
    "neuralcache_shared_write_errors_total": ("shared_write_errors",
                                              "Write-throughs that failed"),
    "neuralcache_shared_errors_total": ("shared_errors", "Shared-tier requests that failed"),
    "neuralcache_shared_timeouts_total": ("shared_timeouts",
                                          "Shared-tier requests past their deadline"),
    "neuralcache_shared_corrupt_blocks_total": ("shared_corrupt_blocks",
                                                "Shared blocks that failed verification"),
    "neuralcache_shared_leases_total": ("shared_leases",
                                        "Leases taken to fetch a block from the origin"),
    "neuralcache_shared_lease_waits_total": ("shared_lease_waits",
                                             "Misses that waited on another node's lease"),
    "neuralcache_shared_lease_wait_seconds_total": ("shared_lease_wait_s",
                                                    "Time spent waiting on leases"),
}
GAUGES = {
    "neuralcache_cache_bytes": "Bytes held by a cache tier",
    "neuralcache_cache_limit_bytes": "Configured limit of a cache tier",
    "neuralcache_cache_blocks": "Blocks held by the disk tier",
    "neuralcache_open_handles": "Open file handles",
    "neuralcache_dataset_files": "Files in the mounted namespace",
    "neuralcache_disk_cache_writable": "1 while disk cache writes succeed",
    "neuralcache_shared_write_queue_bytes": "Bytes waiting to be written to the shared tier",
    "neuralcache_shared_available": "1 unless the shared tier is skipped (breaker open "
                                    "or not configured)",
}
# Write-path gauges: metric name -> (stats key, help); 0 on a read-only mount.
WRITE_GAUGES = {
    "neuralcache_upload_pending_bytes": ("upload_pending_bytes",
                                         "Bytes closed in the journal, not yet on the remote"),
    "neuralcache_upload_pending_files": ("upload_pending_files",
                                         "Files waiting for their upload"),
    "neuralcache_upload_oldest_pending_seconds": ("upload_oldest_pending_s",
                                                  "Age of the oldest pending remote "
                                                  "operation"),
    "neuralcache_upload_held_deletes": ("upload_held_deletes",
                                        "Deletes waiting for the last reader of their "
                                        "file to close"),
}
TIERED = {"neuralcache_cache_hits_total": "Block lookups by readers that hit a tier",
          "neuralcache_cache_misses_total": "Block lookups by readers that missed a tier"}
# FUSE requests by operation (label "op": lookup, getattr, open, read, ...).
FUSE_REQUESTS = "neuralcache_fuse_requests_total"
HISTOGRAMS = ("neuralcache_read_duration_seconds", "neuralcache_backend_request_duration_seconds")


def exported_names() -> set[str]:
    """Every series name a scrape can contain (histograms with their suffixes)."""
    names = set(COUNTERS) | set(GAUGES) | set(WRITE_GAUGES) | set(TIERED) | {FUSE_REQUESTS}
    for h in HISTOGRAMS:
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    return names


class _Collector:
    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot

    def collect(self):
        try:
            s = self._snapshot()
        except Exception:  # a scrape must never take anything down
            log.exception("metrics snapshot failed")
            return
        for name, (key, help_text) in COUNTERS.items():
            yield CounterMetricFamily(name[:-len("_total")], help_text, value=s.get(key, 0))
        hits = CounterMetricFamily("neuralcache_cache_hits", TIERED["neuralcache_cache_hits_total"],
                                   labels=["tier"])
        hits.add_metric(["memory"], s["mem_hits"])
        hits.add_metric(["disk"], s["disk_hits"])
        hits.add_metric(["shared"], s.get("shared_hits", 0))
        yield hits
        misses = CounterMetricFamily("neuralcache_cache_misses",
                                     TIERED["neuralcache_cache_misses_total"], labels=["tier"])
        misses.add_metric(["memory"], s["mem_misses"])
        misses.add_metric(["disk"], s["disk_misses"])
        misses.add_metric(["shared"], s.get("shared_misses", 0))
        yield misses
        ops = CounterMetricFamily(FUSE_REQUESTS[:-len("_total")], "FUSE requests by operation",
                                  labels=["op"])
        for op, n in sorted(s.get("fuse_requests", {}).items()):
            ops.add_metric([op], n)
        yield ops
        g = GaugeMetricFamily("neuralcache_cache_bytes", GAUGES["neuralcache_cache_bytes"],
                              labels=["tier"])
        g.add_metric(["memory"], s["cache_mem_bytes"])
        g.add_metric(["disk"], s["cache_disk_bytes"])
        yield g
        g = GaugeMetricFamily("neuralcache_cache_limit_bytes",
                              GAUGES["neuralcache_cache_limit_bytes"], labels=["tier"])
        g.add_metric(["memory"], s["cache_mem_limit"])
        g.add_metric(["disk"], s["cache_disk_limit"])
        yield g
        yield GaugeMetricFamily("neuralcache_cache_blocks", GAUGES["neuralcache_cache_blocks"],
                                value=s["cache_disk_blocks"])
        yield GaugeMetricFamily("neuralcache_open_handles", GAUGES["neuralcache_open_handles"],
                                value=s.get("open_handles", 0))
        yield GaugeMetricFamily("neuralcache_dataset_files", GAUGES["neuralcache_dataset_files"],
                                value=s.get("files", 0))
        yield GaugeMetricFamily("neuralcache_disk_cache_writable",
                                GAUGES["neuralcache_disk_cache_writable"],
                                value=1 if s.get("disk_cache_writable", True) else 0)
        for name, (key, help_text) in WRITE_GAUGES.items():
            yield GaugeMetricFamily(name, help_text, value=s.get(key, 0))
        yield GaugeMetricFamily("neuralcache_shared_write_queue_bytes",
                                GAUGES["neuralcache_shared_write_queue_bytes"],
                                value=s.get("shared_write_queue_bytes", 0))
        yield GaugeMetricFamily("neuralcache_shared_available",
                                GAUGES["neuralcache_shared_available"],
                                value=1 if s.get("shared_available", False) else 0)


class Metrics:
    """Histograms fed by the read path, and the HTTP endpoint."""

    def __init__(self, snapshot: Callable[[], dict]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.read_seconds = Histogram("neuralcache_read_duration_seconds",
                                      "Read request latency as the reader sees it",
                                      buckets=READ_BUCKETS, registry=self.registry)
        self.backend_seconds = Histogram("neuralcache_backend_request_duration_seconds",
                                         "Remote request latency (successful requests)",
                                         buckets=BACKEND_BUCKETS, registry=self.registry)
        self.registry.register(_Collector(snapshot))
        self.server = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        self.server, _ = start_http_server(port, addr=addr, registry=self.registry)
        log.info("Prometheus metrics on http://%s:%d/metrics", addr, port)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
