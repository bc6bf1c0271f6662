"""Listing directories as the job looks into them (issue 19): lazy, per directory, in
the background, never on the trio thread.

* A directory is listed when it is first looked into (a lookup, opendir or readdir),
  not at mount: the backend's ``list_dir`` runs in a worker thread and each page it
  returns is added to the namespace on the trio thread (one insert of <= 1,000 rows,
  ~5 ms).  A lookup waits for the first page; in a directory still being listed past
  that (a flat directory of 100k objects) a name not seen yet is asked of the remote
  directly (``probe``: HEAD, then a one-key LIST of NAME/) instead of waiting for the
  whole listing, and a "no" is remembered (``NEGATIVE_MAX``).  ``readdir`` streams:
  it serves the entries listed so far and waits only for the next page.
* Each directory has its own TTL.  A lookup or readdir in a directory whose listing is
  older than ``ttl`` starts a refresh in the background and answers from the old
  entries meanwhile (stale-while-revalidate).  The refresh lists the directory in a
  thread, compares it with the entries in chunks, and applies only what changed,
  telling the kernel about exactly those names and inodes.  A --writable mount's own
  changes win over a listing that does not show them yet (``WriteLayer.claims``).
* The subdirectories a readdir shows are listed ahead, ``CRAWL_AHEAD`` at a time (the
  next readdir of ``find``, ``ls -R`` or a loader's directory walk is then served
  from the table: one round trip per level of the tree instead of one per directory).
  A lookup waiting on a listing goes first: while one waits, the crawl starts no new
  listing (they parse in threads that share the GIL with the waiting one).
* Directories nobody used for ``IDLE_EVICT_S`` whose entries the kernel does not
  hold are evicted (their rows deleted; a later look lists them again), so the table
  follows the job rather than everything ever listed.
"""
from __future__ import annotations

import contextlib
import logging
import time

import lru
import trio
import xxhash

from ..backends.base import ObjectInfo
from ..errors import NotFound
from ..namespace import Namespace, Node

log = logging.getLogger(__name__)

# Worker threads listing at once (a LIST round trip each): as many as the old
# mount-time listing used (backends/s3.py LIST_WORKERS).
LIST_THREADS = 16
# Background refreshes at once: they parse listings in worker threads that share the
# GIL with the trio thread, and a directory with a short TTL must not make requests
# wait (namespace scenario, TTL 2 s over 81 directories: the longest stat() took
# 7.9 s with refreshes on the 16 listing threads).
REFRESH_THREADS = 2
# Subdirectories listed ahead of a readdir at once (a share of LIST_THREADS, so that
# a job's own listings always find a thread), when a listing waits on the network
# (S3, a network filesystem): the threads then mostly wait with the GIL released.
# A source on a local filesystem is listed by CPU in Python (scandir + a stat per
# entry, ~7 ms per 1,281-file directory), so parallel listings bring nothing and take
# the GIL from the trio thread: there it is CRAWL_AHEAD_LOCAL.  On the 1.28 M-file
# tree (`python -m bench.tools.million`: stat() of random files right after `ls
# train/` started the crawl of its 1,000 directories) ~100 stat()s took 200-650 ms
# behind 8 crawling threads, none with one (bench/RESULTS.md, eleventh sitting).  The
# crawl also starts nothing new while a lookup waits on a listing.
CRAWL_AHEAD = 8
CRAWL_AHEAD_LOCAL = 1
# Rows compared (or added) per step of a refresh, between which requests are served:
# ~2.5 ms of the trio thread each on an idle core (2,000 made the longest stat() during
# refreshes 80 ms on a busy 2-core machine: bench namespace, stat-refresh-max).
DIFF_CHUNK = 500
# Names a probe found missing, remembered until the directory's listing completes (a
# loader asking again and again for a file that is not there costs one HEAD).
NEGATIVE_MAX = 100_000
# A directory unused this long whose entries the kernel does not hold is evicted.
# An hour: longer than an epoch's pass over a directory on any dataset we measured,
# so a training job never re-lists what it reads every epoch.
IDLE_EVICT_S = 3600.0
EVICT_EVERY_S = 60.0


def _feed(h, page: tuple[list[ObjectInfo], list[str]]) -> None:
    files, dirs = page
    text = "".join(sorted(f"{o.key}\0{o.version}\0{o.size}\n" for o in files))
    text += "".join(sorted(f"{name}/\n" for name in dirs))
    h.update(text.encode("utf-8", "surrogateescape"))


def objects_win(backend, key: str, page: tuple[list[ObjectInfo], list[str]]
                ) -> tuple[list[ObjectInfo], list[str]]:
    """``page`` of directory ``key``, less the subdirectories that are also an object of
    the page and hold no object (a store's leftover directory entry: the file is what
    is there).  A name that is both, with objects under it, stays a directory
    (namespace.add_listing).  Blocking (one LIST per such name): a listing thread's."""
    files, dirs = page
    check = getattr(backend, "has_objects_under", None)
    if check is None or not files or not dirs:
        return page
    names = {o.key.rpartition("/")[2] for o in files}
    empty = {n for n in dirs if n in names and not check(f"{key}/{n}" if key else n)}
    return (files, [n for n in dirs if n not in empty]) if empty else page


def fingerprint(pages) -> str:
    """What a listing shows, in 128 bits: a refresh that sees the same skips the diff
    (no work on the trio thread for a directory that did not change)."""
    h = xxhash.xxh3_128()
    for page in pages:
        _feed(h, page)
    return h.hexdigest()


class Listing:
    """One listing of one directory in progress."""

    def __init__(self, refresh: bool):
        self.refresh = refresh
        self.first_page = trio.Event()
        self.done = trio.Event()
        self.progress = trio.Event()    # replaced after each page
        self.error: BaseException | None = None


class Lister:
    def __init__(self, ns: Namespace, backend, *, ttl: float):
        self.ns = ns
        self.backend = backend
        self.ttl = ttl                      # 0 or less: never refresh
        self.writes = None                  # a --writable mount's WriteLayer
        # Set by the FUSE edge: tell the kernel a name or an inode changed.
        self.invalidate_entry = lambda parent, name: None
        self.invalidate_inode = lambda inode: None
        self._threads = trio.CapacityLimiter(LIST_THREADS)
        self._refresh_threads = trio.CapacityLimiter(REFRESH_THREADS)
        self._crawl = trio.CapacityLimiter(
            CRAWL_AHEAD if getattr(backend, "lists_over_network", True) else CRAWL_AHEAD_LOCAL)
        self._nursery: trio.Nursery | None = None
        self._negative = lru.LRU(NEGATIVE_MAX)
        self._waiting = 0                   # lookups waiting on a listing now
        self._quiet = trio.Event()          # set while none waits (the crawl may go on)
        self._quiet.set()
        self.on_listed = None               # callback(dir_inode): a listing completed,
                                            # or a refresh that changed its entries
        # counters (stats.json: metadata_*)
        self.listings = 0
        self.refreshes = 0
        self.pages = 0
        self.probes = 0
        self.evictions = 0
        self.errors = 0

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self._nursery = n
            task_status.started()
            while True:
                await trio.sleep(EVICT_EVERY_S)
                await self.evict_idle(time.monotonic() - IDLE_EVICT_S)

    def stats(self) -> dict:
        ns = self.ns
        return {"metadata_entries": len(ns), "metadata_db_bytes": ns.rows.file_bytes(),
                "metadata_cache_limit": ns.rows.cache_bytes,
                "metadata_dirs_listed": sum(1 for d in ns.dirs.values() if d.complete),
                "metadata_listings": self.listings, "metadata_refreshes": self.refreshes,
                "metadata_pages": self.pages, "metadata_probes": self.probes,
                "metadata_evictions": self.evictions, "metadata_errors": self.errors}

    # -- what the edge asks --------------------------------------------------------------
    async def lookup(self, parent: Node, name: str) -> Node | None:
        """The entry ``name`` of directory ``parent``, listing it first if needed."""
        d = self.ns.dirs[parent.inode]
        d.used_at = time.monotonic()
        if d.complete:
            self._maybe_refresh(parent.inode)
            return self.ns.child(parent.inode, name)
        node = self.ns.child(parent.inode, name)
        if node is not None:
            return node
        listing = self._start(parent.inode)
        with self._job_waits():
            await listing.first_page.wait()
        node = self.ns.child(parent.inode, name)
        if node is not None or d.complete:
            return node
        if listing.error is not None:
            raise listing.error
        return await self._probe(parent, name)

    async def ready(self, node: Node) -> None:
        """Until ``node``'s entries are all in the table (a --writable mount changes
        a directory only once it knows all of it)."""
        d = self.ns.dirs.get(node.inode)
        if d is None:
            return
        d.used_at = time.monotonic()
        if not d.complete:
            listing = self._start(node.inode)
            await listing.done.wait()
            if listing.error is not None and not d.complete:
                raise listing.error

    async def ready_tree(self, node: Node) -> None:
        """Everything under ``node`` listed (before a directory is renamed)."""
        todo = [node]
        while todo:
            n = todo.pop()
            await self.ready(n)
            todo.extend(c for c in self.ns.children(n) if c.is_dir)

    async def more(self, dir_inode: int, from_seq: int) -> bool:
        """readdir has served the entries before ``from_seq``: wait until the listing
        adds more or ends; False once nothing more will come."""
        d = self.ns.dirs.get(dir_inode)
        if d is None:
            return False
        d.used_at = time.monotonic()
        if d.complete:
            self._maybe_refresh(dir_inode)
            return False
        listing = self._start(dir_inode)
        await listing.progress.wait()
        if listing.error is not None and not d.complete:
            raise listing.error          # readdir fails (EIO), not an empty directory
        return True

    def want(self, dir_inode: int) -> None:
        """Something (the prefetcher, for a hinted path) needs this directory listed:
        start listing it if nobody has, without waiting."""
        d = self.ns.dirs.get(dir_inode)
        if d is not None and not d.complete and d.listing is None \
                and self._nursery is not None:
            self._start(dir_inode)

    def crawl(self, dir_inode: int) -> None:
        """A readdir of this directory is under way: list its subdirectories ahead."""
        if self._nursery is not None:
            for n in self.ns.children_dirs(dir_inode):
                d = self.ns.dirs.get(n)
                if d is not None and not d.complete and d.listing is None:
                    self._nursery.start_soon(self._crawl_one, n)

    @contextlib.contextmanager
    def _job_waits(self):
        """A job's lookup waits on a listing: the crawl starts no new one meanwhile."""
        self._waiting += 1
        if self._waiting == 1:
            self._quiet = trio.Event()
        try:
            yield
        finally:
            self._waiting -= 1
            if self._waiting == 0:
                self._quiet.set()

    async def _crawl_one(self, dir_inode: int) -> None:
        async with self._crawl:
            while self._waiting:             # a lookup waits on a listing: it goes first
                await self._quiet.wait()
            d = self.ns.dirs.get(dir_inode)
            if d is not None and not d.complete:
                await self._start(dir_inode).done.wait()

    # -- listing ------------------------------------------------------------------------
    def _start(self, dir_inode: int, refresh: bool = False) -> Listing:
        d = self.ns.dirs[dir_inode]
        if d.listing is None:
            d.listing = Listing(refresh)
            assert self._nursery is not None, "Lister.run is not running"
            self._nursery.start_soon(self._list if not refresh else self._refresh,
                                     dir_inode, d.listing)
        return d.listing

    def _maybe_refresh(self, dir_inode: int) -> None:
        d = self.ns.dirs[dir_inode]
        if self.ttl > 0 and d.listing is None and \
                time.monotonic() - d.listed_at > self.ttl:
            self._start(dir_inode, refresh=True)

    async def _list(self, dir_inode: int, listing: Listing) -> None:
        """First listing: each page goes into the table as it comes."""
        d = self.ns.dirs[dir_inode]
        key, started = d.key, time.monotonic()
        self.listings += 1

        ended = False

        def finished() -> None:
            nonlocal ended
            ended = True
            d.complete, d.listed_at, d.foreign = True, started, 0
            self._negative_clear(dir_inode)
            self._prune_if_empty(dir_inode, d)

        def apply(page: tuple[list[ObjectInfo], list[str]], last: bool) -> None:
            if self.ns.dirs.get(dir_inode) is not d:
                return                       # removed meanwhile
            self.ns.add_listing(dir_inode, page[0], page[1], started)
            self.pages += 1
            if last:     # complete (or pruned) before anyone wakes up: a reader of
                finished()   # this directory then never sees its parent unpruned
            listing.first_page.set()
            listing.progress.set()
            listing.progress = trio.Event()

        def pages() -> None:
            # One page of look-ahead, so that the last page is known as the last when
            # it is added (a lookup woken by it must not probe a complete directory).
            it = iter(self.backend.list_dir(key))
            page = next(it, None)
            fp = xxhash.xxh3_128()
            while page is not None:
                nxt = next(it, None)
                _feed(fp, page)
                if nxt is None:
                    d.fingerprint = fp.hexdigest()
                trio.from_thread.run_sync(apply, objects_win(self.backend, key, page),
                                          nxt is None)
                page = nxt

        try:
            await trio.to_thread.run_sync(pages, limiter=self._threads)
            if not ended:                    # no page came (or it was removed meanwhile)
                finished()
            if self.on_listed is not None:
                self.on_listed(dir_inode)
        except Exception as exc:  # the waiting lookups get it (-> errno), the rest logs
            self.errors += 1
            listing.error = exc if not isinstance(exc, NotFound) else None
            if isinstance(exc, NotFound):     # gone: an empty directory until refreshed
                d.complete, d.listed_at = True, started
            else:
                log.warning("listing %s/ failed: %s", key, exc)
                if self.ns.rows.has_children(dir_inode):
                    d.foreign += 1            # the next listing meets these pages again
        finally:
            d.listing = None
            listing.first_page.set()
            listing.done.set()
            listing.progress.set()

    async def _refresh(self, dir_inode: int, listing: Listing) -> None:
        """A listing older than the TTL: list again in the background, apply changes."""
        d = self.ns.dirs[dir_inode]
        key, started = d.key, time.monotonic()
        self.refreshes += 1

        def collect() -> tuple[dict[str, ObjectInfo | None] | None, str]:
            pages = list(self.backend.list_dir(key))
            fp = fingerprint(pages)
            if fp == d.fingerprint:
                return None, fp               # the remote shows what it showed before
            now: dict[str, ObjectInfo | None] = {}
            for files, dirs in (objects_win(self.backend, key, p) for p in pages):
                for o in files:
                    now.setdefault(o.key.rpartition("/")[2], o)
                for name in dirs:
                    now[name] = None          # a directory (wins over an object)
            return now, fp

        try:
            remote, fp = await trio.to_thread.run_sync(collect, limiter=self._refresh_threads)
            if self.ns.dirs.get(dir_inode) is d:
                if remote is not None:
                    kept = await self._apply_diff(dir_inode, d, remote, started)
                    d.fingerprint = fp if not kept else None
                d.listed_at = started
        except Exception as exc:  # keep serving the old entries
            self.errors += 1
            log.warning("re-listing %s/ failed (%s); keeping the old entries", key, exc)
            d.listed_at = time.monotonic() - self.ttl / 2     # try again in half a TTL
        finally:
            d.listing = None
            listing.first_page.set()
            listing.done.set()
            listing.progress.set()

    async def _apply_diff(self, dir_inode: int, d, remote: dict, started: float) -> int:
        """Make the directory's entries what ``remote`` (name -> ObjectInfo, or None for
        a directory) says, a chunk at a time.  Entries this mount changed since the
        listing began (``checked`` later than ``started``) or still holds in its
        journal (``claimed_keys``, asked again before each chunk) are left alone;
        returns how many were (then the next refresh compares again)."""
        ns = self.ns
        gone = changed = added = kept = 0
        seq = 0
        while True:
            rows = ns.page(dir_inode, seq, DIFF_CHUNK)
            claims = self._claims(started)
            for r in rows:
                new = remote.pop(r.name, "absent")
                if new is not None and new != "absent" and not r.dir and \
                        new.version == r.version and new.size == r.size:
                    continue                                  # unchanged: the usual case
                if new is None and r.dir:
                    continue
                if r.checked > started or claims(f"{d.key}/{r.name}" if d.key else r.name):
                    kept += 1
                    continue
                node = ns.get(r.ino)
                if new == "absent" or (new is None) != bool(r.dir):
                    ns.remove(node)
                    self.invalidate_entry(dir_inode, r.name)
                    gone += 1
                    if new != "absent":
                        remote[r.name] = new          # replaced by another kind: re-add
                elif new is not None and (new.version != r.version or new.size != r.size):
                    ns.update_object(node, new)
                    log.info("%s changed on the remote (new version %s)", node.key,
                             new.version)
                    self.invalidate_inode(r.ino)
                    changed += 1
            if len(rows) < DIFF_CHUNK:
                break
            seq = rows[-1].seq + 1
            await trio.sleep(0)
        items = list(remote.items())
        for i in range(0, len(items), DIFF_CHUNK):
            claims = self._claims(started)
            part = [(n, o) for n, o in items[i:i + DIFF_CHUNK]
                    if not claims(f"{d.key}/{n}" if d.key else n)]
            kept += len(items[i:i + DIFF_CHUNK]) - len(part)
            d.foreign += 1                     # names may exist (made here meanwhile)
            added += ns.add_listing(dir_inode, [o for _, o in part if o is not None],
                                    [n for n, o in part if o is None], started)
            d.foreign -= 1
            for name, _ in part:
                self.invalidate_entry(dir_inode, name)    # a cached "no such entry"
            await trio.sleep(0)
        if gone or changed or added:
            log.info("re-listed %s/: %d new, %d gone, %d changed", d.key, added, gone,
                     changed)
            if self.on_listed is not None:    # the predictors' catalog packs it again
                self.on_listed(dir_inode)
        return kept

    def _prune_if_empty(self, dir_inode: int, d) -> None:
        """A prefix with nothing valid under it (only keys that cannot be paths, or a
        store's leftover directory entry: SeaweedFS keeps one after its last object is
        deleted) is not a directory: it goes once listed.  On a --writable mount it
        stays, as an empty directory of this mount: the job saw it (its mkdir said
        EEXIST) and may be about to create files in it (fsmodel seed 15)."""
        if dir_inode == 1 or self.ns.rows.has_children(dir_inode) or \
                self._claims(0.0)(d.key):
            return
        if self.writes is not None:
            self.writes.keep_dir(d.key)
            return
        node = self.ns.get(dir_inode)
        if node is not None and not node.removed:
            parent = node.parent
            self.ns.remove(node)
            self.invalidate_entry(parent, node.name)

    def _claims(self, since: float):
        if self.writes is None:
            return lambda key: False
        return self.writes.claimed_keys(since).__contains__

    # -- a name in a directory still being listed -------------------------------------------
    async def _probe(self, parent: Node, name: str) -> Node | None:
        if (parent.inode, name) in self._negative:
            return None
        d = self.ns.dirs[parent.inode]
        key = f"{d.key}/{name}" if d.key else name
        self.probes += 1
        info, is_dir = await trio.to_thread.run_sync(self.backend.probe, key,
                                                     limiter=self._threads)
        node = self.ns.child(parent.inode, name)     # the listing may have got there
        if node is not None or self.ns.dirs.get(parent.inode) is not d:
            return node
        if info is None and not is_dir:
            if not d.complete:
                self._negative[(parent.inode, name)] = True
            return None
        return self.ns.add_found(parent.inode, name, info, is_dir)

    def _negative_clear(self, dir_inode: int) -> None:
        if len(self._negative):
            for k in [k for k in self._negative.keys() if k[0] == dir_inode]:
                del self._negative[k]

    # -- eviction -----------------------------------------------------------------------------
    async def evict_idle(self, before: float) -> int:
        """Drop the entries of directories unused since ``before`` (monotonic) that
        the kernel does not hold and that hold no listed subdirectory; returns how
        many directories."""
        ns, n = self.ns, 0
        for ino, d in list(ns.dirs.items()):
            if not d.complete or d.listing is not None or d.used_at >= before or ino == 1:
                continue
            if ns.rows.held_below(ino) or self._pinned(d.key):
                continue
            subs = ns.children_dirs(ino)
            if any(ns.dirs.get(s) is not None and (ns.dirs[s].complete or
                                                  ns.rows.has_children(s)) for s in subs):
                continue                      # leaves first: a later sweep takes it
            ns.evict_listing(ino)
            n += 1
            await trio.sleep(0)
        self.evictions += n
        if n:
            log.info("evicted the listings of %d idle directories", n)
        return n

    def _pinned(self, key: str) -> bool:
        return self.writes is not None and key in self.writes.claimed_keys(0.0)
