"""Cross-file prefetch scheduler: turns predictions into speculative block loads.

The predictor (``predictors.make_default_predictor``) sees every open
and read; after each open (and every ``PUMP_EVERY_READS`` reads) the scheduler asks it
for ranked predictions and starts loads for the first blocks not yet cached, most
urgent first (skipping files the predictor records as planned: ``note_planned`` /
``is_planned``, cleared by the predictor at each epoch boundary), while

* bytes of prefetch in flight stay under the Little's-law target (recent throughput x
  recent latency x SAFETY, at least ``MIN_INFLIGHT_BYTES``), and
* prefetched-but-unread bytes, those in flight included (each lands unread in the
  memory tier), stay under ``budget_bytes`` (a fraction of the memory tier), so
  prefetching never evicts data that will be needed sooner (``_full``); past it,
  loads are staged: stored in the disk tier and not kept in memory, while the disk's
  own budget lasts (BlockStore.stage_room).

Prefetches go through BlockStore with PREFETCH priority: demand reads always go first
and reserved slots stay free for them.  Nothing here can fail a read: every error is
logged and dropped.
"""
from __future__ import annotations

import collections
import logging
import time

from predictors.base import Catalog
from predictors.events import Event
from predictors.packed import DirSegment, PackedCatalog

from ..store import limiter as lim
from ..store.blocks import BlockStore, Pinned
from ..errors import UserError
from ..namespace import ROOT_INODE, Namespace

log = logging.getLogger(__name__)

# Predictions asked for per pump; the scheduler stops earlier when budgets are full.
MAX_PREDICTIONS = 256
# Predictions below this probability are not fetched.  Ordered predictors (hints,
# stride, repeated order) report their measured hit rate, so this cuts the weak ones; a
# shuffled epoch's unread members report the chance the working set is right (>= 0.5 x
# the classifier's confidence), and the byte budgets below bound what a wrong guess can
# cost (the offline simulator uses the same 0.05).
MIN_PROB = 0.05
# Re-plan after this many reads even without an open (long files, sequential tars).
PUMP_EVERY_READS = 16
# When a pump finds nothing to fetch (a warm epoch: everything is cached; or no
# prediction at all: every file of the epoch planned, a random reader, a job not yet
# classified), the next pumps are skipped, doubling up to this many events, until a read
# misses the cache (a cold open waiting on the remote plans at once).  An empty answer
# was not backed off when it only meant "not classified yet"; since the epoch-set
# predictor leaves out planned files it mostly means "all planned", and it was asked
# again at nearly every open of a small-file epoch (`python -m
# bench.breakdown --size 8M --files 3000`, "files disk": 3,000 opens; its "prefetch
# plans" line, the stats' prefetch_plans and prefetch_plans_empty, now 233 and 51; the
# "ahead" CPU 0.148 -> 0.120 ms per file, means of four alternating pairs,
# bench/RESULTS.md).
MAX_IDLE_SKIP = 64
# When a pump finds at least LEAD_MIN predictions in a row already cached or on their
# way before anything new to start, the job is that far behind the prefetch front: skip
# the next lead/LEAD_DIVISOR pumps (a miss re-plans at once). With hints every open
# used to re-plan 256 predictions to start one file (`python -m bench.micro
# prefetch-cpu`: 891 -> 116 us of CPU per file together with the limiter's heap).
LEAD_MIN = 32
LEAD_DIVISOR = 4
# Floor of prefetch bytes in flight: 160 files of ~100 KB (more measured no faster on
# the samples bench) ...
MIN_INFLIGHT_BYTES = 16 << 20
# ... and at least this many whole files of at most one block each (shards).  Early in
# an epoch the measured rate is still ramping up (Rate's 2 s half-life), and with the
# bytes floor alone (2 shards in flight) a shuffled shard epoch ran at 177/164 MB/s
# against 243/223 with 8 (hints 199/166 -> 281/250); 8 -> 16 took it from 206/215 to
# 232/223 (hints 254/253 -> 309/303), and 32 measured no faster than 16 (bench run
# --scenario shards --systems neuralcache,neuralcache-hints, alternating pairs).  16
# shards of 8 MiB are 128 MiB in flight, within the unread budget that bounds every
# prefetch (in flight included) when the memory tier is the default 1 GiB; a smaller
# tier gets fewer.  Not for larger files: their read-ahead starts at their open, and
# blocks of a large file guessed whole (a random reader's) would be that much waste.
MIN_INFLIGHT_LOADS = 16
SAFETY = 2.0
# The first open in a small directory -- a model checkpoint: config.json, weights,
# tokenizer files -- starts the first block of every sibling at once, so loading the
# directory costs about one round trip instead of one per file (cold TTFT in the maze
# bench went from 3 sequential GETs to 1). "Small": at most this many files, and the
# first blocks together at most SIBLINGS_MAX_BYTES; dataset directories (thousands of
# samples, or many large shards) are left to the predictor.
SIBLINGS_MAX_FILES = 16
# A predicted file up to this size found only in the disk tier is loaded into memory
# ahead of its open, so that the open pushes it into the kernel page cache (1 MiB:
# fs/push.py PUSH_MAX_BYTES; 1,000 x 100 KiB from the disk cache, bench.breakdown
# "files disk": 0.88/0.95 -> 0.67/0.77 ms per file).  A larger file is read from disk on
# demand with read-ahead: loading a 1 GiB file's blocks ahead as well queued the
# reader's own disk reads behind them (its disk-cache rate 1,003/862 -> 453/476 MB/s).
DISK_LOAD_MAX = 1 << 20
SIBLINGS_MAX_BYTES = 64 << 20
# Predictions staged on disk once memory's budget is full (store/speculative.py):
# only an unordered working set's (a shuffled epoch without hints), where a file read
# is a staged one with the odds staged / unread files left, so depth is the hit rate.
# An ordered source (hints, stride, successor) is followed in order within memory's
# budget, and deeper it reaches only the far future: with hints, the multinode bench's
# nodes would fetch the next epoch's share, files other nodes read this epoch.
STAGED_SOURCES = frozenset({"epochset"})
# The catalog is rebuilt at most this often while directories join it (a rebuild
# forgets what was planned in it) ...
CATALOG_EVERY_S = 2.0
# ... once it holds this many files; a smaller one is rebuilt as each directory joins
# (a plain catalog: ~1 us a file, 51 ms at 50,000 and 106 at 100,000 on an idle core,
# `python -m bench.tools.catcost`, several times that in wall time while listing
# threads share the GIL): with 20 class directories of 50 files each, waiting 2 s to
# add the directories opened after the first halved the cold small-file rate
# (breakdown's "files cold", 1000 files: 502 -> 240 files/s).  20,000: a plain rebuild
# takes ~20 ms.  A catalog this size or larger is packed (predictors/packed.py: ~40 B
# per file instead of ~200, a rebuild a sort of its directories, lookups slower: the
# ensemble's observe and predict cost 52-59 instead of 40-47 us per open over 50,000
# or 100,000 files, same tool).  At 100,000 the plain rebuilds on each listing stopped
# opens for 0.4-0.6 s each in the first seconds of the 1.28 M-file tree's crawl
# (py-spy of the daemon under `python -m bench.tools.scale ... epoch`).
CATALOG_CHEAP_FILES = 20_000
# Directories are packed for the catalog (the table's query and ~1 us a file) in steps,
# one per open or listing that finds some waiting: a step packs one directory, then
# more until this long has passed (a directory is never split: a flat one of a million
# files is one step); the catalog is rebuilt once none waits.  Packed at once, the
# first open after a walk of the 1.28 M-file tree through the mount (torchvision's
# ImageFolder lists every class before it reads a sample) packed its 1,000 directories
# in one go: 1.3 s, every request behind it (`python -m bench.tools.walkopen`).
CATALOG_STEP_S = 0.005
# Opens the kernel serves from its page cache ("warm": no READ will reach the daemon)
# are kept in a ring of this many and given to the predictor only when something needs
# it: the next cold open, a read, a hint or a plan.  Observing was a third of the trio
# thread's samples in a warm epoch (py-spy record --gil on the daemon during 8 s of
# warm re-reads of 3,000 x 100 KB files by 8 threads: EnsemblePredictor.observe 418 of
# 1,238 -- the successor, epoch and feature windows and the hint cursor), and a warm
# open plans nothing.  `python -m bench.micro warm-opens`: 15.6 -> 1.1 us of CPU per
# warm open in the prefetch path alone; `python -m bench.breakdown` pairs: 0.155 ->
# 0.105 ms of daemon CPU per warm file (bench/RESULTS.md).  A warm stretch longer than
# the ring loses its oldest opens to the predictor, which then resynchronises on the
# next ones it sees (the hint cursor finds the path in the order; a working set
# missing a few reads prefetches a few files again, within the byte budgets).  1,024
# opens is ~0.2 s of a warm epoch at 5,000 files/s and ~25 ms of observing when a cold
# open flushes them.
WARM_DEFER_MAX = 1024


class Rate:
    """Exponentially weighted bytes/s of demand reads (half-life ``HALF_LIFE_S``)."""
    HALF_LIFE_S = 2.0

    def __init__(self) -> None:
        self.rate = 0.0
        self._t = time.monotonic()

    def add(self, nbytes: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        dt = max(now - self._t, 1e-6)
        self._t = now
        decay = 0.5 ** (dt / self.HALF_LIFE_S)
        self.rate = self.rate * decay + (1 - decay) * (nbytes / dt)


class Prefetcher:
    def __init__(self, ns: Namespace, store: BlockStore, predictor, *,
                 budget_bytes: int, enabled: bool = True):
        self.ns = ns
        self.store = store
        self.predictor = predictor
        self.budget = budget_bytes
        self.enabled = enabled
        self._reads = 0
        self.hints_set = 0
        self.rate = Rate()
        # warm opens not yet given to the predictor (WARM_DEFER_MAX), and how many
        # fell off the ring unseen
        self._deferred: collections.deque = collections.deque(maxlen=WARM_DEFER_MAX)
        self.warm_opens_unseen = 0
        self.plans = 0            # times the predictor was asked (stats: prefetch_plans)
        self.plans_empty = 0      # ... and answered nothing
        self._skip = 0          # pumps to skip (backoff while there is nothing to do)
        self._backoff = 0
        self._misses_seen = 0
        self._last_target = 0   # the in-flight target of the last file planned
        self._warmed_dirs: set[str] = set()
        # The catalog (the files predictors may name) is the directories the job reads:
        # a directory joins it once a file in it is opened and its listing is complete.
        self._catalog_dirs: set[int] = set()    # directories in the catalog
        # ... their files, packed once (with the directory's next_seq then)
        self._segments: dict[int, tuple[DirSegment, int]] = {}
        self._to_pack: set[int] = set()         # ... to pack (CATALOG_STEP_S)
        self._wanted_dirs: set[int] = set()     # opened in, waiting for their listing
        self._catalog_at = 0.0
        self._catalog_stale = False
        self._catalog_files = 0
        # Parents of catalog directories: their other subdirectories (the other classes
        # of an ImageNet-style tree) are listed ahead and join the catalog as they are.
        self._dataset_roots: set[int] = set()
        self.lister = None       # meta/lister.py: lists a directory a prediction is in
        self._listing_for_prediction: set[int] = set()

    def listed(self, dir_inode: int) -> None:
        """meta/lister.py: a directory's listing completed (or was refreshed)."""
        if dir_inode in self._listing_for_prediction:     # its predictions can go now
            self._listing_for_prediction.discard(dir_inode)
            self._skip = self._backoff = 0
            self._pump()
        if dir_inode in self._wanted_dirs or dir_inode in self._catalog_dirs:
            self._segments.pop(dir_inode, None)           # listed again: packed again
            self._wanted_dirs.discard(dir_inode)
            self._catalog_dirs.add(dir_inode)
            self._to_pack.add(dir_inode)
            self._catalog_stale = True
            self._rebuild_catalog()

    def _catalog_dir(self, parent: int, siblings: bool = True) -> None:
        if parent in self._catalog_dirs or parent in self._wanted_dirs:
            return
        d = self.ns.dirs.get(parent)
        if d is not None and d.complete:
            self._catalog_dirs.add(parent)
            self._to_pack.add(parent)
            self._catalog_stale = True
        else:
            self._wanted_dirs.add(parent)
        # The first directory read under a parent brings its siblings (one level, not
        # their subtrees): an epoch over a class-per-directory dataset is predicted
        # from its first files, as when the whole source was listed at mount.  Not
        # when that parent is the mount's root: there the siblings are usually other
        # datasets (fio's random readers, with the shards dataset beside them in the
        # bucket, had 317 MB prefetched and 84 MB read, 58 MB alone; rand128k 175 ->
        # 268 MB/s without it); a mount of one class-per-directory split (s3://b/train)
        # is predicted from the directories it opens.
        node = self.ns.get(parent) if siblings and self.enabled else None
        root = node.parent if node is not None else 0
        if root and root != ROOT_INODE and root not in self._dataset_roots:
            self._dataset_roots.add(root)
            for sib in self.ns.children_dirs(root):
                self._catalog_dir(sib, siblings=False)
            if self.lister is not None:
                self.lister.crawl(root)          # lists them, CRAWL_AHEAD at a time

    def _rebuild_catalog(self) -> None:
        """The predictors' catalog is rebuilt whole (forgetting what was planned) once
        the directories that joined it are packed (a step per call): at once while it
        is small, then at most every CATALOG_EVERY_S, so that directories joining a
        big one are batched."""
        if not self._catalog_stale or not self._pack_step():
            return
        now = time.monotonic()
        if now - self._catalog_at < CATALOG_EVERY_S and \
                self._catalog_files >= CATALOG_CHEAP_FILES:
            return
        self._catalog_stale, self._catalog_at = False, now
        try:
            cat = PackedCatalog(self._packed_dirs())
            self._catalog_files = len(cat)
            if len(cat) < CATALOG_CHEAP_FILES:   # plain (faster lookups), sorted by path
                cat = Catalog(sorted(cat.entries()))
            self.predictor.set_catalog(cat)
        except Exception:       # never a request's failure (this runs inside opens)
            log.exception("building the predictors' catalog failed; prefetch disabled")
            self.enabled = False
        self._warmed_dirs.clear()

    def _pack_step(self) -> bool:
        """Pack a waiting directory, then more until CATALOG_STEP_S has passed; True
        once none waits."""
        end = time.perf_counter() + CATALOG_STEP_S
        try:
            while self._to_pack:                 # (at least one a step)
                self._pack(self._to_pack.pop())
                if time.perf_counter() >= end:
                    break
        except Exception:       # as in _rebuild_catalog; no rebuild on top of it
            log.exception("packing the predictors' catalog failed; prefetch disabled")
            self.enabled, self._to_pack, self._catalog_stale = False, set(), False
            return False
        return not self._to_pack

    def _packed_dirs(self) -> list[DirSegment]:
        """The catalog directories' segments (``_pack``)."""
        return [s for s in map(self._pack, self._catalog_dirs) if s is not None]

    def _pack(self, ino: int) -> DirSegment | None:
        """A catalog directory's segment, packed once: again only when it was listed
        again (``listed``), renamed or grew; None for a directory removed or whose
        listing the table let go (it joins again when listed)."""
        d, node = self.ns.dirs.get(ino), self.ns.get(ino)
        if d is None or node is None or node.removed or not d.complete:
            self._segments.pop(ino, None)
            return None
        prefix = f"{d.key}/" if d.key else ""
        seg, seq = self._segments.get(ino, (None, 0))
        if seg is None or seg.prefix != prefix or seq != d.next_seq:
            seg = DirSegment(prefix, self.ns.names_in_dir(ino)[1])
            self._segments[ino] = (seg, d.next_seq)
        return seg

    # -- events ------------------------------------------------------------------
    def on_open(self, key: str, size: int, pid: int, parent: int | None = None,
                warm: bool = False) -> None:
        """An open; ``warm``: the kernel already holds the file's pages (its read will
        not reach the daemon), so nothing is planned on it (planning was 18 % of the
        daemon's samples in a warm epoch, py-spy) and the predictor learns from it only
        when something next needs the predictor (WARM_DEFER_MAX).  Reads and cold opens
        still plan."""
        if parent is not None:
            self._catalog_dir(parent)
        if warm:                  # the predictor sees it when something needs it
            if len(self._deferred) == WARM_DEFER_MAX:
                self.warm_opens_unseen += 1
            self._deferred.append(Event(time.monotonic(), "open", key, 0, 0, pid, size))
            return
        self._rebuild_catalog()
        self._observe("open", key, 0, 0, pid, size)
        if self.enabled:
            self._warm_siblings(key)
        self._pump()

    def _warm_siblings(self, key: str) -> int:
        """First open in a small directory: start block 0 of each sibling; returns how
        many loads started."""
        parent = key.rpartition("/")[0]
        if parent in self._warmed_dirs:
            return 0
        inflight, unread, _ = self._pending()
        if self._full(inflight, unread, 0, self.inflight_target()):
            return 0             # the same budgets as every other prefetch, for memory
                                 # (these loads are never staged; not warmed: the next
                                 # open in it tries again)
        self._warmed_dirs.add(parent)
        d = self.ns.by_path(parent)
        if d is None or not d.is_dir:
            return 0
        ds = self.ns.dirs.get(d.inode)
        if ds is None or not ds.complete:
            return 0
        siblings = self.ns.page(d.inode, 0, SIBLINGS_MAX_FILES + 1)
        if not siblings or len(siblings) > SIBLINGS_MAX_FILES:
            return 0
        budget, started = SIBLINGS_MAX_BYTES, 0
        for n in sorted(siblings, key=lambda r: r.name):
            k = f"{parent}/{n.name}" if parent else n.name
            if n.dir or n.removed or n.size == 0 or k == key:
                continue
            pinned = Pinned(k, n.version, n.size)
            nbytes = self.store.block_range(pinned, 0)[1]
            if nbytes > budget:
                break
            if not self.store.cached(pinned, 0) and self.store.prefetch(pinned, 0, lim.PREFETCH):
                budget -= nbytes
                started += 1
        return started

    def on_read(self, key: str, off: int, length: int, size: int, pid: int) -> None:
        self._observe("read", key, off, length, pid, size)
        self._reads += 1
        self.rate.add(length)
        if self._reads % PUMP_EVERY_READS == 0:
            self._pump()

    def reading(self) -> None:
        """A READ reached the daemon: the opens deferred as warm may not have been (a
        file's pages dropped since its last open: between epochs, or under memory
        pressure), so the predictor gets them now, before the read takes its block.
        The disk tier asks the epoch tracker whether the file was read this epoch
        (predictors/epoch.py ``spent``) when the read takes the block from memory
        (``DiskTier.taken``) or its load stores it; told after, the answer was "not
        yet", the block stayed at the back of the eviction order (or went there), and
        evictions took blocks still to be read.  `python -m bench.tools.epochs` (3,000
        x 100 KB, a 150 MiB disk cache), this against its parent, new old old new:
        epochs 2-4 fetched 143.2-145.2 MiB (the ideal order, dataset less cache: 143)
        against 148.4-178.7, at 405-423 files/s against 365-390, for 5.5-5.8 CPU-s per
        epoch against 5.1-5.5 (more of it read from the disk cache: 2,217-2,234 disk
        hits against 2,068-2,160).  The first read of such a file gave them to the
        predictor anyway, after the load (``on_read``)."""
        self._flush_deferred()

    def _observe(self, *ev) -> None:
        self._flush_deferred()
        try:
            self.predictor.observe(Event(time.monotonic(), *ev))
        except Exception:
            log.exception("predictor failed to observe an event; prefetch disabled")
            self.enabled = False

    def _flush_deferred(self) -> None:
        """Give the predictor the warm opens it has not seen yet, in order."""
        if not self._deferred:
            return
        try:
            self._rebuild_catalog()
            while self._deferred:
                self.predictor.observe(self._deferred.popleft())
        except Exception:
            self._deferred.clear()
            log.exception("predictor failed to observe an event; prefetch disabled")
            self.enabled = False

    # -- hints ---------------------------------------------------------------------
    def set_hints(self, paths) -> int:
        """Install an upcoming order: a list of paths, or a predictors.order.PackedOrder
        (the control file's); an empty one clears the hints."""
        self._flush_deferred()
        try:
            if len(paths):
                self.predictor.set_hints(paths)
            else:
                self.predictor.clear_hints()
        except ValueError as exc:
            raise UserError(f"hints refused: {exc}") from None
        self.hints_set = len(paths)
        self._skip = self._backoff = 0        # plan the new order now
        self._pump()
        return len(paths)

    # -- scheduling ----------------------------------------------------------------
    def inflight_target(self) -> int:
        lat = self.store.latency_estimate()
        return max(MIN_INFLIGHT_BYTES, int(self.rate.rate * lat * SAFETY))

    def _pending(self) -> tuple[int, int, int]:
        """Speculative bytes in flight; unread in memory: loaded and not read yet, or
        in flight for memory with no reader waiting for them (BlockStore counts both);
        and the bytes staged loads may still bring to the disk tier."""
        return (self.store.spec.inflight,
                self.store.speculative_unread_bytes(), self.store.stage_room())

    def _full(self, inflight: int, unread: int, room: int, target: int) -> bool:
        """Whether no prefetch may start: ``target`` bytes in flight, or the unread
        budget reached and no ``room`` for staged loads (which go to the disk tier
        instead: a shuffled epoch larger than memory is prefetched onto the disk at
        link speed, store/speculative.py STAGE_FRACTION); ``unread`` counts the bytes
        in flight no reader waits for (``_pending``): they land in the memory tier
        unread.  (Counted apart, each pump started up to the budget again while the
        last pump's loads were still in flight: a mount whose memory tier is below the
        in-flight floor -- the multinode bench's 4 MiB nodes -- started 16 MiB of
        loads at an epoch's start, into the next epoch's share, evicted before they
        were read: 1.6-1.8x the dataset from the WAN in epoch 1, and with
        --shared-cache those loads' claims made other nodes' readers wait 0.5-0.9 s
        each; bench/RESULTS.md.)"""
        return inflight >= target or (unread >= self.budget and room <= 0)

    def _pump(self) -> None:
        if not self.enabled:
            return
        misses = self.store.stats.disk_misses
        if misses != self._misses_seen:      # a reader waited on the remote: plan now
            self._misses_seen = misses
            self._skip = self._backoff = 0
        if self._skip > 0:
            self._skip -= 1
            return
        inflight, unread, room = self._pending()
        floor = self.inflight_target()
        if self._full(inflight, unread, room, max(floor, self._last_target)):
            return      # budgets full: not even worth asking the predictor
        self._flush_deferred()
        try:
            preds = self.predictor.predict(MAX_PREDICTIONS)
        except Exception:
            log.exception("predictor failed; prefetch disabled")
            self.enabled = False
            return
        self.plans += 1
        self.plans_empty += not preds
        started = 0
        lead = 0            # predictions already cached/planned before the first start
        target = floor
        for p in preds:
            if p.prob < MIN_PROB:
                continue
            staged = p.source in STAGED_SOURCES
            if self._full(inflight, unread, room if staged else 0, target):
                break
            if p.offset == 0 and self.predictor.is_planned(p.path):
                if not started:
                    lead += 1
                continue         # the whole file is already cached or on its way
            node, unlisted = self.ns.resolve(p.path)
            if node is None:
                if unlisted is not None and self.lister is not None:
                    self._listing_for_prediction.add(unlisted)
                    self.lister.want(unlisted)    # a hinted path in a directory not seen
                continue
            if node.is_dir or node.removed:
                continue
            whole = p.offset == 0 and (p.length <= 0 or p.length >= node.size)
            target = max(floor, MIN_INFLIGHT_LOADS * node.size) \
                if whole and node.size <= self.store.block_size else floor
            self._last_target = target
            if self._full(inflight, unread, room if staged else 0, target):
                break
            pinned = Pinned(node.key, node.version, node.size)
            bs = self.store.block_size
            length = p.length if p.length > 0 else node.size
            first = p.offset // bs
            last = min(self.store.nblocks(pinned) - 1, (p.offset + max(length, 1) - 1) // bs)
            for i in range(first, last + 1):
                stage = unread >= self.budget        # memory's budget full: to disk
                n = self.store.block_range(pinned, i)[1]
                if stage and room < n:
                    break                            # (a block the disk has no room for)
                # Past memory's budget a block on disk is nothing to stage: the file
                # counts as planned (below) and its open reads it from disk.  Not left
                # unplanned to load into memory once the budget frees (a review's
                # proposal): each pump then looked at every such file again; with a
                # 64 MiB memory tier, 3,000 cached files read at 554/616 files/s
                # against 1,241/1,104, 1.7-1.8 CPU-ms per file against 0.7-0.8
                # (bench.breakdown --size 8M --files 3000, bench/RESULTS.md).
                if self.store.in_memory(pinned, i) or ((stage or node.size > DISK_LOAD_MAX)
                                                       and self.store.cached(pinned, i)):
                    continue
                if self.store.prefetch(pinned, i, lim.PREFETCH, stage):
                    started += 1
                    inflight += n
                    if stage:
                        room -= n
                    else:
                        unread += n
                if self._full(inflight, unread, room if staged else 0, target):
                    break
            else:
                if whole and last == self.store.nblocks(pinned) - 1:
                    if not started:
                        lead += 1
                    self.predictor.note_planned(p.path)   # every block cached or on its way
        if started:
            self._backoff = 0
        else:
            self._backoff = min(MAX_IDLE_SKIP, max(1, self._backoff * 2))
            self._skip = self._backoff
        if lead >= LEAD_MIN:
            self._skip = max(self._skip, lead // LEAD_DIVISOR)
