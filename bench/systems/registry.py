"""The systems a benchmark run compares, by name (``make_system``), each opened fresh with an
empty cache.

* ``link``                    not a filesystem: the emulator's ceiling (link.py: ``link_fetch``)
* ``local``                   the same files on local disk, page cache dropped before cold runs
* ``neuralcache``             ``neuralcache mount`` with default settings (CLI only)
* ``neuralcache-noprefetch``  ``--readahead off --prefetch off``
* ``neuralcache-hints``  default settings, and the workload hands each epoch's order to
  the mount first (neuralcache.hints.publish_order, what HintingSampler does)
* ``rclone``                  ``rclone mount`` with ``--vfs-cache-mode full``, read-ahead on
* ``s3fs``                    ``s3fs`` with ``use_cache`` and a raised ``parallel_count``
* the peers (peers.py): ``s3torchconnector``, ``mosaic``, ``litdata`` and their
  ``-tuned`` rows -- not mounts but *client* systems: libraries the workload calls

Mounts are read-only unless a scenario asks ``MountOptions(writable=True)`` (the
checkpoint scenario): neuralcache ``--writable``, rclone ``--vfs-cache-mode writes``
without ``--read-only``, s3fs without ``ro``; ``Mounted.sync()`` is then the system's own
barrier (``neuralcache sync MNT``), where it has one.

Every remote system reaches SeaweedFS through the same WAN proxy.  ``System.open()`` is
a context manager yielding a ``Mounted``: for a mount (``kind == "mount"``) its ``root``
and ``stats()``, for a client (``kind == "client"``) no root but ``client``, the object
a scenario asks for its own version of each workload.  It always unmounts / stops its
processes on exit, even on error or Ctrl-C.

The interface is base.py's (``System``, ``Mounted``, ``MountOptions``, ``SystemEnv``);
the mounts are mounts.py's, the clients peers.py's.  This module is the one that knows
them all, so neither base.py nor mounts.py imports peers.py.
"""
from __future__ import annotations

from bench.systems.base import System, SystemEnv
from bench.systems.mounts import LocalSystem, NeuralCacheSystem, RcloneSystem, S3fsSystem
from bench.systems.peers import ClientSystem

MOUNT_SYSTEMS = ["link", "local", "neuralcache", "neuralcache-hints", "neuralcache-noprefetch",
                 "rclone", "s3fs"]
# The client systems (bench/systems/peers.py, kept in step by tests/bench/test_peers.py).
PEER_SYSTEMS = ["s3torchconnector", "s3torchconnector-tuned", "mosaic", "mosaic-tuned",
                "litdata", "litdata-tuned"]
ALL_SYSTEMS = MOUNT_SYSTEMS + PEER_SYSTEMS


def make_system(name: str, env: SystemEnv) -> System:
    if name == "local":
        return LocalSystem(env)
    if name == "rclone":
        return RcloneSystem(env)
    if name == "s3fs":
        return S3fsSystem(env)
    if name == "neuralcache":
        return NeuralCacheSystem(env, prefetch=True)
    if name == "neuralcache-noprefetch":
        return NeuralCacheSystem(env, prefetch=False)
    if name == "neuralcache-hints":
        return NeuralCacheSystem(env, prefetch=True, hints=True)
    if name in PEER_SYSTEMS:
        return ClientSystem(env, name)
    raise KeyError(f"unknown system {name!r} (link is measured by the runner)")
