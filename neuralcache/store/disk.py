"""The persistent disk tier, bounded in bytes: blocks of at most ``PACK_MAX`` bytes
are records appended to shared segment files (``segments.py``), larger ones have a
file each (``blockfiles.py``).  Both are whole 4 KiB pages ending in a trailer with the
data's length and xxh3 checksum, written with O_DIRECT from page-aligned buffers and
read in one call into recycled (``read_buffers``) or fresh ones (the page cache where
the filesystem refuses O_DIRECT).

Every read verifies length and checksum; a bad block is dropped from the index (and
its space given back) and reported as a miss.  Any OSError is a miss plus a log line
(at most one warning per kind of failure), never an error to the reader; a failed
write turns writing off for ``WRITE_RETRY_S`` with one warning.

The disk tier is synchronous; callers run it in worker threads, and one lock guards
the index (block name -> location, in LRU order) and the segments' bookkeeping.  The
index is rebuilt on start from the block files' names and the segments' logs, well
under a second for 100k blocks (tests/test_cache.py measures it).  Eviction is per
block whatever its home (LRU, or the epoch-aware rank when set): a block file is
deleted, a record's pages are punched out of its segment, and a segment with no live
record left is deleted.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import heapq
import logging
import operator
import os
import threading
import time
from typing import Callable

from .. import buffers, cpuacct
from . import segments as sg
from .blockfiles import (AlignedBuffers, checksum, file_location, read_checked,
                         scan_files, write_file)
from .memory import BlockKey

log = logging.getLogger(__name__)

ALIGN = sg.ALIGN
# Blocks of at most this many bytes go into segments: every block at the default 8 MiB
# block size (store/blocks.py).  Creating a file costs 0.5-0.8 ms of CPU here whatever
# its size (open(O_CREAT) alone, thread CPU clock), renaming and deleting it more:
# `python -m bench.micro disk-put` puts 100 KB blocks for 0.10-0.11 ms of CPU into
# segments against 0.21-0.48 with a file each, and `python -m bench.breakdown --size 1G
# --files 0` measured 0.28 / 0.33 CPU-s per GiB of disk writes with 8 MiB blocks packed
# against 0.50 / 0.60 with a file each (two pairs).  Larger blocks (--block-size over
# 8M) keep a file each: a segment holds at least 8 records of this size.
PACK_MAX = 8 << 20
# Page-aligned write buffers kept for reuse (the disk writer runs 2 tasks; a third
# concurrent writer allocates one and frees it).
WRITE_BUFFERS_KEPT = 2
# How many least-recently-used disk blocks the eviction policy looks at to choose a
# victim when an eviction ranking is set (epoch-aware eviction): a small window keeps
# eviction O(1) while letting "consumed this epoch" blocks go first.
EVICT_SCAN = 64
# After a failed write (disk full, read-only, I/O error) the disk tier serves reads
# but stops writing for this long before trying again, so a full disk costs one
# warning and one failed write per interval instead of one per block.
WRITE_RETRY_S = 5.0
# Names of declined blocks kept so that no path queues their write again (``settled``);
# one forgotten costs a declined put.  ~100 bytes each (a guess, not measured).
DECLINED_KEPT = 4096


class DiskTier:
    """Blocks under ``root/blocks``; thread-safe (a lock guards the index)."""

    def __init__(self, root: str, limit_bytes: int, write_retry_s: float = WRITE_RETRY_S,
                 *, pack_max: int = PACK_MAX, segment_bytes: int = sg.SEGMENT_BYTES):
        self.root = os.path.join(root, "blocks")
        self.write_retry_s = write_retry_s
        self.limit = limit_bytes
        self.used = 0
        # block name -> length (block file) or segments.loc(...) (record), LRU order
        self._index: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._owner: dict[str, str] = {}   # block name -> object key (known this run)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.writable = True
        # Set by the daemon for epoch-aware eviction: object key -> rank (lower is
        # evicted first); None means plain LRU.
        self.evict_rank: Callable[[str], float] | None = None
        # ... and whether a block of this object just read or stored goes to the front
        # of the order (predictors/epoch.py ``spent``: consumed this epoch), where
        # ``_pick_victim`` looks.  At the back, behind every block still to be read
        # this epoch, none was in reach and the order was LRU's: a shuffled epoch over
        # a dataset twice the tier hit 0.18 of its blocks instead of 0.50 (a disk tier,
        # the tracker and 2,000 one-block files, no FUSE: tests/test_cache.py).
        self.spent: Callable[[str], bool] | None = None
        self.corrupt_blocks = 0
        self.write_errors = 0
        self.declined = 0        # puts declined (``put``), and the names of the latest
        self._declined: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._retry_at = 0.0
        self.direct = True       # O_DIRECT writes until the filesystem refuses them
        self.read_buffers = None  # a buffers.Recycler block files are read into (daemon)
        self._buffers = AlignedBuffers(WRITE_BUFFERS_KEPT)
        self.pack_max = pack_max
        self.pack = pack_max > 0  # off where holes cannot be punched
        self._segs = sg.Segments(self._lock, segment_bytes, self._not_direct)

    # -- start-up ---------------------------------------------------------------
    def load(self) -> int:
        """Create the directory (0700), delete partial writes, index existing blocks.
        Returns the number of blocks indexed."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(os.path.dirname(self.root), 0o700)
        files, junk, old_format = scan_files(self.root)
        if old_format:
            log.info("disk cache: dropped %d blocks of an older layout (refetched when "
                     "read)", len(old_format))
        segs, seg_junk, torn = sg.scan(os.path.join(self.root, sg.DIRNAME))
        for path in junk + old_format + seg_junk:
            sg.unlink(path)
        for path, length in torn:          # so that appended entries stay aligned
            try:
                os.truncate(path, length)
            except OSError:
                pass
        files.sort()
        with self._lock:
            added = [self._segs.add(sg.Segment(0, path, size, sealed=True))
                     for path, _, _, size, _ in segs]
            index, older = self._index, []
            # each block in store order, one at a time: the newest copy wins, at its
            # place in the LRU order; older ones die once all are counted (a segment
            # may look empty halfway: a file's mtime between two records' estimates)
            for _, name, v in heapq.merge(files, sg.records(segs, added),
                                          key=operator.itemgetter(0)):
                if sg.loc_sid(v):
                    self._segs.by_id[sg.loc_sid(v)].live += 1
                old = index.pop(name, None)
                if old is not None:
                    self.used -= sg.loc_len(old)
                    older.append((name, old))
                index[name] = v
                self.used += sg.loc_len(v)
            dead = [self._dead(name, v) for name, v in older]
            dead += [self._segs.settle(seg) for seg in list(self._segs.by_id.values())]
        self._release(dead)
        self._evict_to(self.limit)
        return len(self._index)

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name[:2], name)

    def _warn(self, kind: str, msg: str, *args) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(msg, *args)
        else:
            log.debug(msg, *args)

    # -- lookups ------------------------------------------------------------------
    def contains(self, bk: BlockKey) -> bool:
        with self._lock:
            return bk.name() in self._index

    def settled(self, bk: BlockKey) -> bool:
        """The tier holds ``bk``, or declined it (``put``) and its file is still
        ``spent`` (a later epoch may store it): no write of it should be queued."""
        name = bk.name()
        with self._lock:
            if name in self._index:
                return True
            declined = name in self._declined
        return declined and self.spent is not None and self.spent(bk.key)

    def get(self, bk: BlockKey) -> bytes | None:
        t0 = cpuacct.clock()
        try:
            return self._get(bk)
        finally:
            cpuacct.charge("disk_read", t0)

    def taken(self, bk: BlockKey) -> None:
        """A reader took ``bk`` from the memory tier: its copy here (stored unread at
        the back of the order, or read here an epoch ago) goes to the front if its
        file is ``spent``, as a read here would.  Otherwise it stayed where it was, as
        if still to be read, and the eviction took blocks still to be read before it,
        to be fetched again: `python -m bench.tools.epochs`, epochs 2-4 fetched
        158-178 MiB against 185-204, at 351-371 files/s against 328-345."""
        if self.spent is not None and self.spent(bk.key):
            name = bk.name()
            with self._lock:
                if name in self._index:
                    self._index.move_to_end(name, last=False)

    def _get(self, bk: BlockKey) -> bytes | None:
        name = bk.name()
        front = self.spent is not None and self.spent(bk.key)
        with self._lock:
            v = self._index.get(name)
            if v is None:
                return None
            self._index.move_to_end(name, last=not front)
            self._owner[name] = bk.key
        data, why = self._read(name, v)
        if data is None:
            return self._corrupt(name, v, why)
        return data

    def _read(self, name: str, v: int):
        """(data, "") for a block whose trailer and checksum hold, else (None, why);
        an OSError is logged and reported as why = "" ."""
        seg = None
        take = self.read_buffers.take if self.read_buffers is not None else \
            buffers.fresh_view
        try:
            if sg.loc_sid(v):
                with self._lock:
                    s = self._segs.by_id.get(sg.loc_sid(v))
                if s is None or not self._segs.use(s, self.direct):
                    return None, ""                # the segment went meanwhile
                seg = s
                length = sg.loc_len(v)
                nbytes = sg.record_size(length)
                view = take(nbytes)
                got = os.preadv(seg.fd, [view], sg.loc_page(v) * ALIGN)
                return sg.check(view[:got], length, bytes.fromhex(name), checksum)
            # ``v`` is the data length (or an upper bound within ALIGN of it): the file
            # is read whole in one call and the data returned without a copy
            return read_checked(self._path(name), v, self.direct, take)
        except OSError as exc:
            self._warn("read", "disk cache read failed (%s); treating as a miss", exc)
            return None, ""
        finally:
            if seg is not None:
                self._segs.unref(seg)

    def _corrupt(self, name: str, v: int, why: str) -> None:
        """Drop a block that could not be read (``why`` empty: an I/O error) unless it
        was evicted or replaced meanwhile: either way a miss."""
        with self._lock:
            if self._index.get(name) != v:
                return None
            del self._index[name]
            self._owner.pop(name, None)
            self.used -= sg.loc_len(v)
            if why:
                self.corrupt_blocks += 1
            # an unreadable block is only forgotten (the error may pass: the next
            # start finds it), a corrupt one is deleted
            action = self._dead(name, v, free=bool(why))
        if why:
            log.warning("disk cache block %s is corrupt (%s): dropped, will refetch",
                        name, why)
        self._release([action])
        return None

    # -- writes ---------------------------------------------------------------------
    def put(self, bk: BlockKey, data: bytes, unread: bool = False) -> bool:
        """Store a block; False if it was not stored (a failure logs a line).
        ``unread``: fetched ahead and not read yet (read-ahead, prefetch): it goes to
        the back of the eviction order even if its file is ``spent`` (consumed this
        epoch: a prefetch of the next epoch's files before the epoch's boundary went
        to the front and was evicted unread, to be fetched again, bench.tools.epochs).
        A ``spent`` block (read this epoch) takes only a spent block's room, else is
        declined (``settled``): blocks still to be read are wanted sooner (Belady).
        Bytes fetched do not move (bench.tools.epochs, two pairs: 160-177 MiB either
        way; stored, the next put evicted it); 200-700 writes per epoch are saved."""
        t0 = cpuacct.clock()
        try:
            return self._put(bk, data, unread)
        finally:
            cpuacct.charge("disk_write", t0)

    def _put(self, bk: BlockKey, data: bytes, unread: bool = False) -> bool:
        n = len(data)
        if n > self.limit:
            return False
        name = bk.name()
        seg = failed = None
        with self._lock:
            # Whether this write is the retry that may turn caching back on. A write that
            # began while writes still worked and finished after another thread's failure
            # must not flip the state back (that made one outage log twice).
            retrying = not self.writable
            if retrying and time.monotonic() < self._retry_at:
                return False
            if name in self._index:
                return True
        packed = self.pack and n <= self.pack_max
        front = not unread and self.spent is not None and self.spent(bk.key)  # (unlocked)
        if packed and self._segs.spare is None and self._segs.rotates(sg.record_size(n)):
            try:
                self._segs.make_spare(self._new_segment)
            except OSError as exc:
                self._failed(0, exc)
                return False
        with self._lock:
            if name in self._index:
                return True
            # Reserve the space under the lock: concurrent writers each evicting "to the
            # limit minus my block" and then adding overshot the limit (CI soak test).
            # a spent block (``front``) takes only spent blocks' room (``put``)
            actions, room = self._take_victims(self.limit - n, spent_only=front)
            if not room:
                self.declined += 1
                self._declined[name] = None
                if len(self._declined) > DECLINED_KEPT:
                    self._declined.popitem(last=False)
            else:
                self.used += n
                if packed and self.pack:
                    try:
                        seg, page = self._segs.reserve(sg.record_size(n), actions,
                                                       self._new_segment)
                    except OSError as exc:
                        failed = exc
        self._release(actions)
        if not room:
            return False
        if failed is None:
            try:
                if seg is not None:
                    self._write_record(seg, page, name, data)
                else:
                    self._write_block_file(name, data)
            except OSError as exc:
                failed = exc
        if failed is not None:
            if seg is not None:
                self._unwritten(seg, page, n)
            self._failed(n, failed)
            return False
        action = None
        with self._lock:
            resumed = retrying and not self.writable
            if resumed:
                self.writable = True
            if name in self._index:                # another thread stored it meanwhile
                self.used -= n
                if seg is not None:
                    seg.live += 1
                    seg.pending -= 1
                    action = self._dead(name, sg.loc(seg.sid, page, n))
            else:
                # its bytes were reserved above
                self._index[name] = n if seg is None else sg.loc(seg.sid, page, n)
                self._declined.pop(name, None)
                if front:
                    self._index.move_to_end(name, last=False)
                if seg is not None:
                    seg.live += 1
                    seg.pending -= 1
            self._owner[name] = bk.key
        if seg is not None:
            self._segs.unref(seg)
        self._release([action])
        if resumed:
            log.warning("disk cache writes succeed again; caching resumed")
        return True

    def _failed(self, n: int, exc: OSError) -> None:
        with self._lock:
            self.used -= n                         # give the reservation back
            self.write_errors += 1
            self._retry_at = time.monotonic() + self.write_retry_s
            first = self.writable
            self.writable = False
        if first:
            log.warning("disk cache write failed (%s); reading through without "
                        "caching, retrying every %.0f s", exc, self.write_retry_s)

    def _write_block_file(self, name: str, data) -> None:
        path = self._path(name)
        tmp = f"{path}.{threading.get_ident()}.tmp"
        try:
            self._write_file(tmp, data)
        except FileNotFoundError:         # first block in this sub-directory
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            self._write_file(tmp, data)
        os.replace(tmp, path)

    def _write_file(self, tmp: str, data) -> None:
        direct = self.direct
        if not write_file(tmp, data, self._buffers, direct) and direct:
            self._not_direct()

    def _not_direct(self) -> None:
        if self.direct:
            self.direct = False       # e.g. tmpfs before Linux 6.6: no O_DIRECT
            log.info("disk cache: %s does not take O_DIRECT writes; writing through "
                     "the page cache", self.root)

    # -- segments -------------------------------------------------------------------
    def _new_segment(self) -> sg.Segment | None:
        """A new empty segment, descriptors open; None (and packing off) if holes
        cannot be punched where it lives."""
        dirpath = os.path.join(self.root, sg.DIRNAME)
        try:
            path, fd, lfd, direct = sg.create(dirpath, self.direct)
        except FileNotFoundError:
            os.makedirs(dirpath, mode=0o700, exist_ok=True)
            path, fd, lfd, direct = sg.create(dirpath, self.direct)
        if not direct:
            self._not_direct()
        seg = sg.Segment(0, path)              # its id comes with Segments.add
        seg.fd, seg.lfd = fd, lfd
        try:
            sg.punch_hole(fd, 0, ALIGN)       # can this filesystem give pages back?
        except OSError as exc:
            sg.discard(seg)
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            self.pack = False
            log.info("disk cache: %s cannot punch holes; one file per block", self.root)
            return None
        return seg

    def _write_record(self, seg: sg.Segment, page: int, name: str, data) -> None:
        h = bytes.fromhex(name)
        buf = self._buffers.take(sg.record_size(len(data)))
        try:
            nbytes = sg.fill(buf, data, h, checksum)
            view = memoryview(buf)[:nbytes]
            try:
                try:
                    done = os.pwrite(seg.fd, view, page * ALIGN)
                except OSError as exc:
                    if exc.errno != errno.EINVAL or not self._drop_direct(seg.fd):
                        raise
                    done = os.pwrite(seg.fd, view, page * ALIGN)
                if done != nbytes:
                    raise OSError(errno.ENOSPC, "short write to a segment")
            finally:
                view.release()
        finally:
            self._buffers.give(buf)
        os.write(seg.lfd, sg.log_entry(h, page, len(data), sg.STORED))

    def _drop_direct(self, fd: int) -> bool:
        """Turn O_DIRECT off on ``fd`` after an EINVAL; False if it was not on."""
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if not flags & os.O_DIRECT:
            return False
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        self._not_direct()
        return True

    def _unwritten(self, seg: sg.Segment, page: int, n: int) -> None:
        """A record write failed: give its pages back, end its reservation."""
        try:
            sg.punch_hole(seg.fd, page * ALIGN, sg.record_size(n))
        except OSError:
            pass
        with self._lock:
            seg.pending -= 1
            action = self._segs.settle(seg)
        self._segs.unref(seg)
        self._release([action])

    # -- eviction ---------------------------------------------------------------------
    def _dead(self, name: str, v: int, free: bool = True):
        """A block left the index (lock held): what to do with its bytes after the
        lock is released (``_release``); nothing unless ``free`` or its segment has
        no live record left."""
        sid = sg.loc_sid(v)
        if not sid:
            return ("file", name) if free else None
        seg = self._segs.by_id.get(sid)
        if seg is None:
            return None
        seg.live -= 1
        gone = self._segs.settle(seg)
        if gone is not None:
            return gone
        if not free:
            return None
        return ("record", seg, name, v)

    def _release(self, actions) -> None:
        """Unlink block files and dropped segments, mark dead records in their logs
        and punch their pages out (outside the lock)."""
        for a in actions:
            if a is None:
                continue
            if a[0] == "file":
                sg.unlink(self._path(a[1]))
            elif a[0] == "segment":
                sg.unlink(a[1].path)
                sg.unlink(a[1].log_path)
            else:
                _, seg, name, v = a
                page, n = sg.loc_page(v), sg.loc_len(v)
                try:
                    if not self._segs.use(seg, self.direct):
                        continue                   # the whole segment went meanwhile
                except OSError:
                    continue                       # its pages stay until the segment goes
                try:
                    os.write(seg.lfd, sg.log_entry(bytes.fromhex(name), page, n, sg.DEAD))
                    sg.punch_hole(seg.fd, page * ALIGN, sg.record_size(n))
                except OSError as exc:
                    self._warn("punch", "disk cache: could not free an evicted record "
                               "(%s); its space returns with its segment", exc)
                    if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                        self.pack = False
                finally:
                    self._segs.unref(seg)

    def _pick_victim(self) -> str | None:
        if not self._index:
            return None
        rank = self.evict_rank
        if rank is None:
            return next(iter(self._index))
        best, best_rank = None, None
        for i, name in enumerate(self._index):
            if i >= EVICT_SCAN:
                break
            owner = self._owner.get(name)
            r = rank(owner) if owner is not None else float("-inf")
            if best is None or r < best_rank:
                best, best_rank = name, r
        return best

    def _take_victims(self, target: int, spent_only: bool = False) -> tuple[list, bool]:
        """Drop index entries until ``used <= target``; the caller holds the lock and
        passes the returned actions to ``_release`` after releasing it; (actions, True).
        ``spent_only``: (actions, False) at the first victim known and not ``spent``
        (those taken before it were the next victims anyway: their room stays free)."""
        actions = []
        while self.used > target:
            name = self._pick_victim()
            if name is None:
                break
            if spent_only:
                owner = self._owner.get(name)
                if owner is not None and not self.spent(owner):
                    return actions, False
            v = self._index.pop(name)
            self.used -= sg.loc_len(v)
            self._owner.pop(name, None)
            actions.append(self._dead(name, v))
        return actions, True

    def _evict_to(self, target: int) -> None:
        with self._lock:
            actions, _ = self._take_victims(target)
        self._release(actions)

    # -- maintenance ------------------------------------------------------------------
    def verify_all(self) -> tuple[int, int]:
        """Check every indexed block's checksum, dropping bad ones: (good, bad)."""
        good = bad = 0
        with self._lock:
            entries = list(self._index.items())
        for name, v in entries:
            data, why = self._read(name, v)
            if data is not None:
                good += 1
            else:
                bad += 1
                self._corrupt(name, v, why or "unreadable")
        return good, bad

    def drop(self, bk: BlockKey) -> None:
        name = bk.name()
        with self._lock:
            v = self._index.pop(name, None)
            self._owner.pop(name, None)
            if v is None:
                action = ("file", name)
            else:
                self.used -= sg.loc_len(v)
                action = self._dead(name, v)
        self._release([action])

    def locate(self, bk: BlockKey) -> tuple[str, int, int] | None:
        """Where a stored block's data is: (file, offset, length), or None.  For tests
        and tools that inspect or damage the cache; ``stored_blocks`` lists them all."""
        with self._lock:
            v = self._index.get(bk.name())
            seg = self._segs.by_id.get(sg.loc_sid(v)) if v is not None else None
        if v is None:
            return None
        if seg is not None:
            return seg.path, sg.loc_page(v) * ALIGN, sg.loc_len(v)
        return file_location(self._path(bk.name()))

    def __len__(self) -> int:
        return len(self._index)


def stored_blocks(root: str) -> list[tuple[str, int, int]]:
    """Every block a DiskTier over ``root`` (a cache sub-directory, the one holding
    ``blocks/``) would index at start, as (file, offset, length) of its data, without
    changing anything: for tests and tools that inspect or damage the cache."""
    blocks = os.path.join(root, "blocks")
    out = [file_location(os.path.join(blocks, name[:2], name))
           for _, name, _ in scan_files(blocks)[0]]
    for path, _, _, size, log in sg.scan(os.path.join(blocks, sg.DIRNAME))[0]:
        out += [(path, page * ALIGN, length) for _, page, length in sg.read_log(log, size)]
    return out

