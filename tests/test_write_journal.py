"""The write path without a kernel: the journal (intent log + staging files), the
operation queue's ordering, and the uploader against an in-memory backend that can
fail on purpose."""
import errno
import json
import os
import threading
import time

import pytest
import trio

from neuralcache.backends.base import ObjectInfo
from neuralcache.errors import (JournalError, JournalFull, NotFound, PermissionDenied,
                                Unavailable)
from neuralcache.write import opqueue, uploader as upmod
from neuralcache.write.journal import Committer, Journal
from neuralcache.write.opqueue import Op, OpQueue
from neuralcache.write.uploader import Uploader, part_size_for, requests_for

MB = 1 << 20


def put(i, key, staging="s", size=1):
    return {"a": "put", "id": i, "key": key, "staging": staging, "size": size}


def rec(*acts):
    return {"t": 0, "what": "test", "acts": list(acts)}


# -- the intent log -----------------------------------------------------------------
def test_replay_keeps_what_is_not_done(tmp_path):
    j = Journal(str(tmp_path))
    assert j.open() == []
    j.append([rec(put(1, "a")), rec(put(2, "b"), {"a": "move", "id": 3, "src": "c", "dst": "d"})])
    j.append([rec({"a": "done", "id": 1}), rec({"a": "cancel", "id": 2},
                                                 {"a": "delete", "id": 4, "key": "e"})])
    j.close()
    j2 = Journal(str(tmp_path))
    pending = j2.open()
    assert [a["id"] for a in pending] == [3, 4] and j2.last_id == 4
    for line in open(j2.log_path):       # JSON lines
        assert set(json.loads(line)) == {"rec", "xxh"}


def test_torn_tail_and_damaged_line_are_skipped(tmp_path, caplog):
    j = Journal(str(tmp_path))
    j.open()
    j.append([rec(put(1, "a")), rec(put(2, "b")), rec(put(3, "c"))])
    j.close()
    lines = open(j.log_path, "rb").read().split(b"\n")
    lines[1] = lines[1].replace(b'"b"', b'"x"')          # checksum no longer matches
    open(j.log_path, "wb").write(b"\n".join(lines[:3]) + b"\n" + lines[2][:30])  # torn tail
    j2 = Journal(str(tmp_path))
    assert [a["key"] for a in j2.open()] == ["a", "c"]
    assert "damaged record at line 2" in caplog.text
    j2.append([rec(put(4, "d"))])                          # starts on a fresh line
    j2.close()
    assert [a["key"] for a in Journal(str(tmp_path)).open()] == ["a", "c", "d"]


def test_failed_append_is_cut_back_and_reported_as_full(tmp_path, monkeypatch):
    j = Journal(str(tmp_path))
    j.open()
    j.append([rec(put(1, "a"))])
    real_write = os.write

    def half_then_enospc(fd, data):
        if fd == j._fd and len(data) > 10:
            real_write(fd, bytes(data[:10]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_enospc)
    with pytest.raises(JournalFull):
        j.append([rec(put(2, "b"))])
    monkeypatch.setattr(os, "write", real_write)
    j.append([rec(put(3, "c"))])
    j.close()
    assert [a["id"] for a in Journal(str(tmp_path)).open()] == [1, 3]


def test_a_full_disk_gives_the_log_its_reserve_then_takes_it_back(tmp_path, monkeypatch):
    """Written data filled the disk: the log's next record still lands, in the space
    its reserve file held (an upload's "done" record must, or its staging file is never
    deleted), and the reserve comes back once a staging file is deleted."""
    from neuralcache.write.journal import LOG_RESERVE_BYTES

    j = Journal(str(tmp_path))
    j.open()
    assert os.path.getsize(j.reserve_path) == LOG_RESERVE_BYTES
    real_write, always = os.write, [False]

    def full_until_the_reserve_goes(fd, data):
        if fd == j._fd and (always[0] or os.path.exists(j.reserve_path)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_until_the_reserve_goes)
    j.append([rec(put(1, "a"))])                      # landed: the reserve went
    assert not os.path.exists(j.reserve_path)
    always[0] = True
    with pytest.raises(JournalFull):                  # no second reserve to give
        j.append([rec(put(2, "b"))])
    monkeypatch.setattr(os, "write", real_write)
    j.remove_staging("gone-already")                  # space came back
    assert os.path.getsize(j.reserve_path) == LOG_RESERVE_BYTES
    j.close()
    assert [a["id"] for a in Journal(str(tmp_path)).open()] == [1]


def test_compaction_keeps_only_pending(tmp_path):
    j = Journal(str(tmp_path))
    j.open()
    j.append([rec(put(i, f"k{i}")) for i in range(1, 50)])
    j.append([rec({"a": "done", "id": i}) for i in range(1, 49)])
    big = j.size()
    j.compact([put(49, "k49")])
    assert j.size() < big / 10
    j.append([rec(put(50, "k50"))])
    j.close()
    assert [a["id"] for a in Journal(str(tmp_path)).open()] == [49, 50]


def test_committer_writes_in_submit_order_and_groups(tmp_path):
    j = Journal(str(tmp_path))
    j.open()
    calls = []
    real = j.append
    j.append = lambda recs: (calls.append(len(recs)), real(recs))[1]

    async def main():
        c = Committer(j, lambda: [])
        async with trio.open_nursery() as n:
            await n.start(c.run)
            ps = [c.submit("w", [put(i, f"k{i}")]) for i in range(1, 21)]
            for p in ps:
                await p.wait()
            n.cancel_scope.cancel()

    trio.run(main)
    j.close()
    assert [a["id"] for a in Journal(str(tmp_path)).open()] == list(range(1, 21))
    assert len(calls) < 20            # batched: fewer fsyncs than records


# -- ordering ---------------------------------------------------------------------------
def test_queue_orders_related_keys_and_waits_for_durability_and_sealing():
    async def main():
        q = OpQueue()
        a1 = q.new("put", "a", staging="s1", durable=True)
        q.new("put", "a", staging="s2", durable=True)          # after a1: same key
        b = q.new("put", "b", staging="s3", durable=True)
        d = q.new("delete", "dir", durable=True)
        q.new("put", "dir/x", staging="s4", durable=True)      # after the delete of "dir"
        c = q.new("put", "c", staging="open")                  # not durable yet
        unsealed = {"open", "s3"}
        got = list(q.runnable(lambda s: s not in unsealed))
        assert got == [a1, d]
        unsealed.discard("s3")
        c.durable = True
        assert list(q.runnable(lambda s: s not in unsealed)) == [a1, b, d]
        unsealed.clear()
        assert c in list(q.runnable(lambda s: True))
        a1.running = True
        assert a1 not in list(q.runnable(lambda s: True))

    trio.run(main)


def test_a_delete_held_for_readers_waits_for_their_close_or_a_later_change():
    """A file unlinked while open for reading keeps its remote object until its last
    reader closes (opqueue.py); a barrier, an unmount or a later operation on a
    related key lets the delete run at once."""
    async def main():
        q = OpQueue()
        readers = {7: 1, 8: 1, 9: 1}
        q.reading = lambda inode: readers.get(inode, 0)
        d = q.new("delete", "a", durable=True, hold=7)
        other = q.new("put", "b", staging="s1", durable=True)
        assert list(q.runnable(lambda s: True)) == [other]
        assert q.stats()["upload_held_deletes"] == 1
        readers[7] = 0
        q.readers_closed(7)
        assert list(q.runnable(lambda s: True)) == [d, other]
        q.finish(d), q.finish(other)
        # a new file of that name, or under it as a directory: the delete goes first
        for key in ("c", "c/x"):
            held = q.new("delete", "c", durable=True, hold=8)
            assert held not in list(q.runnable(lambda s: True))
            later = q.new("put", key, staging="s2", durable=True)
            assert held in list(q.runnable(lambda s: True)) and held.hold is None
            q.finish(held), q.finish(later)
        # a reader that closed without telling (its count fell to 0): not held
        held = q.new("delete", "e", durable=True, hold=42)
        assert held in list(q.runnable(lambda s: True))
        q.finish(held)
        # a barrier does not wait for it, nor run it (it is journaled; a `neuralcache
        # umount` refused as busy ran it, review); unhold_all (unmount) runs it
        held = q.new("delete", "f", durable=True, hold=9)
        held.queued_at -= 3600
        with trio.fail_after(1):
            await q.wait([held])
        assert held.hold == 9 and held not in list(q.runnable(lambda s: True))
        assert q.stats()["upload_oldest_pending_s"] == 0.0      # held is not late
        q.unhold_all()
        assert held in list(q.runnable(lambda s: True))
        assert q.stats()["upload_held_deletes"] == 0
        assert q.stats()["upload_oldest_pending_s"] < 60        # its age counts from now

    trio.run(main)


def test_little_law_and_part_sizes():
    assert requests_for(0.2) == 8                 # 300 MB/s x 0.2 s / 8 MiB
    assert requests_for(0.001) == upmod.MIN_REQUESTS
    assert requests_for(10.0) == upmod.MAX_REQUESTS
    assert part_size_for(100 * MB) == 8 * MB
    assert part_size_for(200 << 30) == 21 * MB    # 10,000 parts at most
    assert 200 << 30 <= 21 * MB * upmod.MAX_PARTS


# -- the uploader -------------------------------------------------------------------------
class MemBackend:
    """Objects in a dict; ``fail`` maps a call name to errors raised in turn."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.uploads: dict[str, dict[int, bytes]] = {}
        self.fail: dict[str, list[Exception]] = {}
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def _maybe_fail(self, name):
        with self.lock:
            errs = self.fail.get(name)
            if errs:
                raise errs.pop(0)

    def _info(self, key):
        return ObjectInfo(key, len(self.objects[key]), f"v{hash(self.objects[key])}", 0.0)

    def put(self, key, data):
        self.calls.append(("put", key))
        self._maybe_fail("put")
        self.objects[key] = bytes(data)
        return self._info(key)

    def create_multipart(self, key):
        self.calls.append(("create", key))
        uid = f"u{len(self.uploads)}"
        self.uploads[uid] = {}
        return uid

    def upload_part(self, key, uid, n, off, data):
        self.calls.append(("part", n))
        self._maybe_fail("part")
        self.uploads[uid][n] = bytes(data)
        return f"t{n}"

    def complete_multipart(self, key, uid, parts, size):
        self.calls.append(("complete", key))
        assert [n for n, _ in parts] == list(range(1, len(parts) + 1))
        sent = self.uploads.pop(uid)
        self.objects[key] = b"".join(sent[n] for n, _ in parts)
        assert len(self.objects[key]) == size
        return self._info(key)

    def abort_multipart(self, key, uid):
        self.uploads.pop(uid, None)

    def copy(self, src, dst):
        self.calls.append(("copy", src, dst))
        if src not in self.objects:
            raise NotFound(src)
        self.objects[dst] = self.objects[src]
        return self._info(dst)

    def stat(self, key):
        if key not in self.objects:
            raise NotFound(key)
        return self._info(key)

    def delete(self, key):
        self.calls.append(("delete", key))
        self._maybe_fail("delete")
        self.objects.pop(key, None)


def run_ops(tmp_path, backend, setup, check=None, monkeypatch=None):
    """Run an uploader over a fresh journal; ``setup(q, j)`` queues operations."""
    j = Journal(str(tmp_path))
    j.open()
    q = OpQueue()
    done = []

    async def main():
        c = Committer(j, lambda: [])
        up = Uploader(backend, j, c, q, sealed=lambda s: True,
                      on_done=lambda op, info: done.append((op.id, info)))
        async with trio.open_nursery() as n:
            await n.start(c.run)
            await n.start(up.run)
            ops = setup(q, j)
            j.append([rec(*[op.act() for op in ops])])     # as the write layer records them
            for op in ops:
                op.durable = True
            q.notify()
            result = None
            try:
                await q.wait(ops)
            except Exception as exc:
                result = exc
            if check is not None:
                await check(q, ops, up)
            n.cancel_scope.cancel()
        return result, up

    res, up = trio.run(main)
    j.close()
    return res, up, done, Journal(str(tmp_path)).open()


def staged(j, data):
    name, fd = j.create_staging()
    os.write(fd, data)
    os.close(fd)
    return name


def test_uploads_moves_deletes_then_the_journal_is_empty(tmp_path, monkeypatch):
    monkeypatch.setattr(upmod, "PART_SIZE", 1 * MB)
    be = MemBackend()
    small, big = os.urandom(1000), os.urandom(3 * MB + 17)
    be.objects["old"] = b"old data"

    def setup(q, j):
        return [q.new("put", "small", staging=staged(j, small), size=len(small)),
                q.new("put", "big", staging=staged(j, big), size=len(big)),
                q.new("move", "new", src="old"),
                q.new("delete", "small")]

    err, up, done, pending = run_ops(tmp_path, be, setup)
    assert err is None and pending == []
    assert be.objects == {"big": big, "new": b"old data"}
    assert sum(1 for c in be.calls if c[0] == "part") == 4
    assert up.uploaded_bytes == len(small) + len(big) and up.uploaded_files == 2
    assert sorted(i for i, _ in done) == [1, 2, 3, 4]


def test_a_failed_part_is_resent_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(upmod, "PART_SIZE", 1 * MB)
    monkeypatch.setattr(upmod, "RETRY_BASE_S", 0.05)
    be = MemBackend()
    be.fail["part"] = [Unavailable("link reset")]
    data = os.urandom(4 * MB)
    err, up, done, pending = run_ops(
        tmp_path, be, lambda q, j: [q.new("put", "f", staging=staged(j, data), size=len(data))])
    assert err is None and be.objects["f"] == data and pending == []
    assert sum(1 for c in be.calls if c[0] == "part") == 5      # 4 parts + the one resent
    assert sum(1 for c in be.calls if c[0] == "create") == 1    # the same upload resumed
    assert up.errors == 1


def test_a_stream_sends_at_most_its_cap_of_parts_while_open_and_none_after_handover(
        tmp_path):
    """While its file is open a stream keeps STREAM_IN_FLIGHT parts going, each that
    finishes starts the next the writer has passed; once handed to the put after
    close it starts none (the put sends the rest at full width)."""
    from neuralcache.write import stream as stmod

    class Slow(MemBackend):
        now = peak = 0

        def upload_part(self, key, uid, n, off, data):
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            time.sleep(0.02)
            with self.lock:
                self.now -= 1
            return super().upload_part(key, uid, n, off, data)

    part, be = 64 * 1024, Slow()
    j = Journal(str(tmp_path))
    j.open()
    name = staged(j, os.urandom(10 * part))

    async def main():
        up = Uploader(be, j, Committer(j, lambda: []), OpQueue(), sealed=lambda s: True,
                      on_done=lambda op, info: None)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            s = up.streams.start("k", name, part)
            up.streams.feed(s, 6 * part + 5)          # the writer passed 6 parts
            assert s.inflight == stmod.STREAM_IN_FLIGHT
            await s.ready.wait()
            while s.inflight:
                await s.idle.wait()
            assert sorted(s.tags) == [1, 2, 3, 4, 5, 6] and s.sent_upto == 6 * part
            up.streams.feed(s, 10 * part)
            s.handed_over = True                      # closed: the put takes it over
            await s.idle.wait()
            cap = stmod.STREAM_IN_FLIGHT        # the parts started before the handover
            assert sorted(s.tags) == list(range(1, 7 + cap))
            n.cancel_scope.cancel()
        return s

    s = trio.run(main)
    j.close()
    assert be.peak == stmod.STREAM_IN_FLIGHT


def test_a_permanent_error_fails_the_barrier_at_once_and_the_data_stays(tmp_path):
    be = MemBackend()
    be.fail["put"] = [PermissionDenied("access denied")] * 100
    t0 = time.monotonic()
    err, up, done, pending = run_ops(
        tmp_path, be, lambda q, j: [q.new("put", "f", staging=staged(j, b"x"), size=1)])
    assert isinstance(err, Unavailable) and "access denied" in str(err)
    assert time.monotonic() - t0 < 5
    assert [a["key"] for a in pending] == ["f"]                 # still in the journal


def test_transient_errors_are_retried_until_they_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(upmod, "RETRY_BASE_S", 0.05)
    be = MemBackend()
    be.fail["delete"] = [Unavailable("down")] * 3
    be.objects["x"] = b"1"
    t0 = time.monotonic()
    err, up, done, pending = run_ops(tmp_path, be, lambda q, j: [q.new("delete", "x")])
    assert err is None and "x" not in be.objects and up.errors == 3 and pending == []
    # the backoff is kept (0.05 + 0.1 + 0.2 s), and not overshot (trio's clock is not
    # time.monotonic(): a deadline in the wrong clock waited ~30 s or spun)
    assert 0.3 < time.monotonic() - t0 < 5


def test_barrier_gives_up_on_an_outage_after_the_documented_time(tmp_path, monkeypatch):
    monkeypatch.setattr(upmod, "RETRY_BASE_S", 0.05)
    monkeypatch.setattr(upmod, "RETRY_MAX_S", 0.1)
    monkeypatch.setattr(opqueue, "BARRIER_GIVE_UP_S", 0.5)
    be = MemBackend()
    be.fail["delete"] = [Unavailable("down")] * 1000
    t0 = time.monotonic()
    err, *_ = run_ops(tmp_path, be, lambda q, j: [q.new("delete", "x")])
    assert isinstance(err, Unavailable) and 0.4 < time.monotonic() - t0 < 3


def test_a_replayed_move_that_already_happened_is_done(tmp_path):
    be = MemBackend()
    be.objects["dst"] = b"moved before the crash"
    err, up, done, pending = run_ops(tmp_path, be,
                                     lambda q, j: [q.new("move", "dst", src="src")])
    assert err is None and pending == [] and be.objects == {"dst": b"moved before the crash"}


# -- a read-only open racing the end of an upload (no kernel) ----------------------
def _layer_with_local_file(tmp_path):
    from neuralcache.namespace import Namespace
    from neuralcache.write.files import LocalFile
    from neuralcache.write.layer import WriteLayer

    ns = Namespace()
    node = ns.put_file("model.pt", 5, "v1", 0.0)
    layer = WriteLayer(ns, store=None, backend=MemBackend(), cache_subdir=str(tmp_path))
    layer.journal.open()
    name, fd = layer.journal.create_staging()
    os.write(fd, b"local")
    lf = LocalFile(node.inode, node.key, name, None, size=5, sealed=True)
    layer.files[node.inode] = lf
    return layer, node, lf


def _race_on_open(layer, what):
    """Run ``what`` once, between the open's look-up and its os.open (where the upload's
    end or a copy on write can land, since the open runs in a worker thread)."""
    path_of = layer.journal.staging_path
    fired = []

    def staging_path(name):
        if not fired:
            fired.append(name)
            what(name)
        return path_of(name)

    layer.journal.staging_path = staging_path


def test_read_open_racing_the_upload_s_end_reads_the_remote(tmp_path):
    layer, node, lf = _layer_with_local_file(tmp_path)

    def uploaded(name):                  # _uploaded() then the staging file's removal
        del layer.files[node.inode]
        layer.journal.remove_staging(name)

    _race_on_open(layer, uploaded)
    assert trio.run(layer.open, node, os.O_RDONLY, 1) is None   # the remote has it


def test_read_open_racing_a_copy_on_write_opens_the_new_staging(tmp_path):
    layer, node, lf = _layer_with_local_file(tmp_path)

    def replaced(name):
        new, fd = layer.journal.create_staging()
        os.write(fd, b"newer")
        os.close(fd)
        lf.staging = new
        layer.journal.remove_staging(name)

    _race_on_open(layer, replaced)
    h = trio.run(layer.open, node, os.O_RDONLY, 1)
    assert h.staging == lf.staging and os.pread(h.fd, 5, 0) == b"newer"
    os.close(h.fd)


def test_read_open_of_a_missing_staging_file_is_a_journal_error(tmp_path):
    from neuralcache.errors import JournalError

    layer, node, lf = _layer_with_local_file(tmp_path)
    _race_on_open(layer, layer.journal.remove_staging)
    with pytest.raises(JournalError):
        trio.run(layer.open, node, os.O_RDONLY, 1)


def test_a_closed_file_reopened_for_writing_reads_before_any_write(tmp_path):
    """fsx's close/reopen: written, closed (the descriptor is closed, the upload still
    pending), opened O_RDWR again and read before it is written."""
    layer, node, lf = _layer_with_local_file(tmp_path)

    async def main():
        h = await layer.open(node, os.O_RDWR, 1)
        assert await layer.read(h, 0, 100) == b"local"
        assert await layer.read(h, 2, 2) == b"ca"        # the descriptor is kept
        await layer.release(h)

    trio.run(main)
    assert lf.fd is None          # closed again with its last writer


def test_truncate_by_path_racing_the_upload_s_end_keeps_its_file(tmp_path):
    """pjdfstest truncate/00.t: truncate(2) of a file whose upload ends while the
    truncate waits for the file's gate.  The upload's end must not drop the LocalFile
    (and delete its staging file) under the copy on write: that was EIO."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.write.opqueue import Op

    layer, node, lf = _layer_with_local_file(tmp_path)
    layer._current[lf.staging] = lf
    staging = lf.staging
    held = lf.gate.held_exclusive

    def gate_after_the_upload_ends():
        layer._on_done(Op(1, "put", node.key, staging=staging),
                       ObjectInfo(node.key, 5, "etag-1", 0.0))
        if layer.files.get(node.inode) is not lf:       # dropped: as the uploader would
            layer.journal.remove_staging(staging)
        return held()

    async def nothing(*args, **kw):     # the journal record: no committer runs here
        pass

    lf.gate.held_exclusive = gate_after_the_upload_ends
    layer._commit_file = layer._settle = nothing
    out = trio.run(layer.setattr, node, 3, None, None)
    assert out.size == 3
    cur = layer.files[node.inode]
    assert cur.size == 3 and os.pread(os.open(layer.journal.staging_path(cur.staging),
                                              os.O_RDONLY), 10, 0) == b"loc"


def test_an_upload_that_ends_after_a_copy_on_write_is_deleted_by_an_unlink(tmp_path):
    """fsmodel seed 8 at 200 steps: a new file written and closed (its upload runs),
    written again (copy on write: a new staging file), the upload ends, then it is
    unlinked.  The remote holds the upload, so the unlink must delete it; it came back
    at the next mount."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.write.opqueue import Op

    layer, node, lf = _layer_with_local_file(tmp_path)
    layer._current[lf.staging] = lf
    uploading = lf.staging
    assert not lf.remote_base                 # made here: the remote had nothing

    async def main():
        h = await layer.open(node, os.O_RDWR, 1)
        await layer.write(h, 0, b"L")         # sealed: copied to a new staging file
        assert lf.staging != uploading
        layer._on_done(Op(1, "put", node.key, staging=uploading),
                       ObjectInfo(node.key, 5, "etag-1", 0.0))
        assert lf.remote_base
        acts, _, new_ops, may_hold = layer._forget_file(node, delete_remote=True)
        assert may_hold and [(op.kind, op.key) for op in new_ops] == [("delete", node.key)]
        await layer.release(h)

    trio.run(main)


def test_writes_start_the_writeback_of_the_staging_file_every_step(tmp_path, monkeypatch):
    """Early writeback: every WRITEBACK_STEP bytes written, the write that crossed it
    asks the kernel to start writing the staging file out (so close()'s fsync finds
    little left); the bytes read back the same."""
    from neuralcache.write import files, layer as layer_mod

    fd = os.open(tmp_path / "x", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"dirty")
    assert files.start_writeback(fd) is True      # Linux: the call is there and works
    os.close(fd)
    monkeypatch.setattr(layer_mod, "WRITEBACK_STEP", 4 << 20)
    kicks = []
    real = files.start_writeback
    monkeypatch.setattr(files, "start_writeback", lambda fd: kicks.append(fd) or real(fd))
    layer, node, lf = _layer_with_local_file(tmp_path)
    chunk = os.urandom(1 << 20)

    async def main():
        h = await layer.open(node, os.O_RDWR, 1)
        for i in range(10):                       # 10 MiB in 1 MiB writes
            assert await layer.write(h, i << 20, chunk) == len(chunk)
        assert await layer.read(h, 9 << 20, 1 << 20) == chunk
        assert len(kicks) == 2                    # at 4 and 8 MiB
        assert lf.unkicked == 2 << 20

    trio.run(main)
    os.close(lf.fd)


# -- write-behind (write/behind.py; no kernel) ---------------------------------------
def _slow_landing(monkeypatch, first: bytes, seconds=0.3, fail=None):
    """A write whose bytes start with ``first`` takes ``seconds`` in its worker thread
    (or raises ``fail``); the rest land at once (trio starts the landings in any
    order, so the slow one is chosen by its bytes, not by its turn)."""
    import time as _time
    from neuralcache.write import behind

    real = behind._pwrite_own

    def pwrite_own(fd, data, off, kick):
        if data.startswith(first):
            if fail is not None:
                os.close(fd)
                raise fail
            _time.sleep(seconds)
        return real(fd, data, off, kick)

    monkeypatch.setattr(behind, "_pwrite_own", pwrite_own)


def test_overlapping_writes_land_in_the_order_they_were_answered(tmp_path, monkeypatch):
    """A write is answered before it lands; one that overlaps it waits for it (else the
    older bytes could land last), a disjoint one does not, and a read waits for both."""
    _slow_landing(monkeypatch, b"A")
    layer, node, lf = _layer_with_local_file(tmp_path)
    a, b, c = b"A" * 4096, b"B" * 4096, b"C" * 4096

    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            await layer.write(h, 0, a)                  # answered, lands in 0.3 s
            assert layer.behind.bytes == len(a)
            await layer.write(h, 4096, c)               # disjoint: does not wait
            assert (0, 4096) in lf.inflight.values()    # a has not landed yet
            await layer.write(h, 0, b)                  # overlaps a: after it lands
            assert await layer.read(h, 0, 8192) == b + c
            layer.behind.nursery = None
        assert layer.behind.bytes == 0 and not lf.inflight and lf.gate.shared == 0

    trio.run(main)
    os.close(lf.fd)


@pytest.mark.parametrize("fail", ["full", "toobig", "bug"])
def test_a_write_that_does_not_land_fails_the_file_until_truncated(tmp_path, monkeypatch,
                                                                   fail):
    """The disk refuses a write already answered: the file's next write and its
    close() fail with that error (it is not journaled), until a truncate below it.
    The same for a write past the journal filesystem's largest file (EFBIG:
    FileTooBig) or a bug in the landing, which killed the daemon through the write
    layer's nursery: they fail the file, never the daemon."""
    from neuralcache.errors import FileTooBig

    exc, want = {"full": (JournalFull("journal disk full"), JournalFull),
                 "toobig": (FileTooBig("larger than the journal's filesystem allows"),
                            FileTooBig),
                 "bug": (KeyError("a bug"), JournalError)}[fail]
    _slow_landing(monkeypatch, b"x", fail=exc)
    layer, node, lf = _layer_with_local_file(tmp_path)

    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            await layer.write(h, 0, b"x" * 100)         # answered; it will not land
            await layer.behind.drained(lf)
            assert layer.behind.failures == 1
            with pytest.raises(want):
                await layer.write(h, 100, b"y")
            with pytest.raises(want):
                await layer.flush(h)                    # close() fails: not journaled
            assert lf.dirty
            await layer.setattr(node, 0, None, h)       # O_TRUNC / ftruncate(0)
            assert lf.error is None
            await layer.write(h, 0, b"fine")
            assert await layer.read(h, 0, 10) == b"fine"
            layer.behind.nursery = None

    trio.run(main)                                      # (the nursery did not fail)
    os.close(lf.fd)


def test_a_length_past_the_journal_filesystems_largest_file_is_refused(tmp_path):
    """``largest_file`` measures it without writing data; the layer refuses a write or
    truncate past it with EFBIG at the syscall, as a local filesystem does."""
    from neuralcache.errors import FileTooBig
    from neuralcache.write.limits import largest_file

    limit = largest_file(str(tmp_path))
    assert (1 << 40) <= limit < 1 << 63 and not os.listdir(tmp_path)
    layer, node, lf = _layer_with_local_file(tmp_path / "j")

    async def main():
        await layer.measure_limits()
        assert layer.journal_max == largest_file(layer.journal.staging_dir)
        layer.journal_max = 1 << 20                     # as if its filesystem were tiny
        h = await layer.open(node, os.O_RDWR, 1)
        with pytest.raises(FileTooBig):
            await layer.write(h, (1 << 20) - 2, b"abc")
        with pytest.raises(FileTooBig):
            await layer.setattr(node, (1 << 20) + 1, None, h)
        assert await layer.write(h, (1 << 20) - 3, b"abc") == 3

    trio.run(main)
    os.close(lf.fd)


def test_a_filesystem_without_holes_is_not_measured(tmp_path, monkeypatch):
    """The binary search would write what it extends there (CI: the power-loss test's
    in-memory filesystem ran out of memory): such a filesystem stays unchecked."""
    from neuralcache.write import limits

    real = os.fstat

    class Allocated:                      # every attribute real but st_blocks
        def __init__(self, st):
            self.st = st

        def __getattr__(self, name):
            return 8 if name == "st_blocks" else getattr(self.st, name)

    monkeypatch.setattr(limits.os, "fstat", lambda fd: Allocated(real(fd)))
    assert limits.largest_file(str(tmp_path)) is None and not os.listdir(tmp_path)


def test_a_posix_source_keeps_the_holes_of_a_sparse_upload(tmp_path):
    """A sparse staging file (a truncate to 1 GiB, a few bytes at its end) lands in a
    POSIX source as sparse as it is; a hole over bytes an earlier try of the same part
    wrote is zeros there."""
    from neuralcache.backends.base import FileWindow
    from neuralcache.backends.posix import PosixBackend

    src = tmp_path / "src"
    src.mkdir()
    staging = tmp_path / "staging"
    with open(staging, "wb") as f:
        f.write(b"head")
        f.truncate(1 << 30)
        f.seek((1 << 30) - 4)
        f.write(b"tail")
    be = PosixBackend(str(src))
    be.measure_limits()
    assert be.max_object_size >= 1 << 40 and not os.listdir(src)
    fd = os.open(staging, os.O_RDONLY)
    try:
        up = be.create_multipart("sparse.bin")
        part = be.upload_part("sparse.bin", up, 1, 0, FileWindow(fd, 0, 1 << 30))
        be.complete_multipart("sparse.bin", up, [(1, part)], 1 << 30)
    finally:
        os.close(fd)
    out = src / "sparse.bin"
    st = out.stat()
    assert st.st_size == 1 << 30 and st.st_blocks * 512 < 1 << 20     # not 1 GiB of zeros
    with open(out, "rb") as f:
        assert f.read(4) == b"head"
        f.seek((1 << 30) - 4)
        assert f.read() == b"tail"
        f.seek(1 << 29)
        assert f.read(1 << 20) == bytes(1 << 20)
    # a part sent again over what an earlier try wrote: its holes are zeros there
    with open(staging, "wb") as f:
        f.truncate(3 << 20)
    fd = os.open(staging, os.O_RDONLY)
    try:
        up = be.create_multipart("again.bin")
        path = src / up
        path.write_bytes(b"\xff" * (2 << 20))            # the earlier try's bytes
        part = be.upload_part("again.bin", up, 1, 0, FileWindow(fd, 0, 3 << 20))
        be.complete_multipart("again.bin", up, [(1, part)], 3 << 20)
    finally:
        os.close(fd)
    assert (src / "again.bin").read_bytes() == bytes(3 << 20)


def test_an_unlink_returns_once_its_staging_file_is_deleted(tmp_path):
    """CI: the file that filled the journal was unlinked, and a create right after it
    got ENOSPC because the staging file's deletion still waited in a worker thread.
    The deletion is slowed here; the unlink must not return before it."""
    import time as _time

    from neuralcache.namespace import ROOT_INODE

    layer, node, lf = _layer_with_local_file(tmp_path)
    layer._current[lf.staging] = lf
    path = layer.journal.staging_path(lf.staging)
    remove = layer.journal.remove_staging

    def slow_remove(name):
        _time.sleep(0.3)
        remove(name)

    layer.journal.remove_staging = slow_remove

    class Listed:                        # the root is listed already
        async def ready(self, node):
            pass

    layer.lister = Listed()

    async def main():
        async with trio.open_nursery() as n:
            await n.start(layer.run)
            assert os.path.exists(path)
            await layer.unlink(ROOT_INODE, "model.pt")
            assert not os.path.exists(path)
            n.cancel_scope.cancel()

    trio.run(main)


def fds_of(path):
    """This process's descriptors open on ``path``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in (path, path + " (deleted)"):
                found.append(int(fd))
        except OSError:
            pass
    return found


def _full_once(monkeypatch, times=1):
    """The first ``times`` landings of a write starting with b"x" find the disk full."""
    from neuralcache.errors import JournalFull
    from neuralcache.write import behind

    real, calls = behind._pwrite_own, []

    def pwrite_own(fd, data, off, kick):
        calls.append(bytes(data[:1]))
        if data.startswith(b"x") and calls.count(b"x") <= times:
            os.close(fd)
            raise JournalFull("journal disk full")
        return real(fd, data, off, kick)

    monkeypatch.setattr(behind, "_pwrite_own", pwrite_own)
    return calls


def _another_upload(layer):
    """A sealed file of another name waiting for its upload: its staging file goes
    when the upload ends."""
    name, fd = layer.journal.create_staging()
    os.write(fd, b"other")
    os.close(fd)
    return layer.queue.new("put", "other.bin", staging=name, size=5)


def _upload_ends(layer, op, after):
    """The other upload ends ``after`` seconds on: its staging file is deleted."""
    async def ends():
        await trio.sleep(after)
        layer.queue.finish(op)
        layer._release_staging(op.staging)
    return ends


def _open_for_writing(layer, lf):
    """``lf`` still being written (unsealed): a write needs no copy on write, whose
    deletion of the old staging file would free space by itself."""
    lf.sealed = False
    lf.fd = os.open(layer.journal.staging_path(lf.staging), os.O_RDWR)
    layer._current[lf.staging] = lf
    layer._unsealed.add(lf.staging)


@pytest.mark.parametrize("times", [1, 3])
def test_a_write_into_a_full_journal_waits_for_an_upload_to_free_space(tmp_path,
                                                                      monkeypatch, times):
    """A checkpoint written while the last one still uploads: its write finds the
    journal's disk full, waits until that upload ends and deletes its staging file,
    then lands (it used to fail the file with ENOSPC at once).  times=3: the disk
    still reports full right after the deletion, as tmpfs did for ~40 ms (kernel
    6.18): the write tries again every FREED_POLL_S instead of failing."""
    calls = _full_once(monkeypatch, times)
    layer, node, lf = _layer_with_local_file(tmp_path)
    _open_for_writing(layer, lf)
    op = _another_upload(layer)


    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = layer._nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            n.start_soon(_upload_ends(layer, op, 0.2))
            await layer.write(h, 0, b"x" * 100)          # answered; lands after 0.2 s
            await layer.behind.drained(lf)
            assert lf.error is None and layer.behind.full_waits == 1
            assert layer.behind.failures == 0
            assert await layer.read(h, 0, 200) == b"x" * 100
            assert not os.path.exists(layer.journal.staging_path(op.staging))
            layer.behind.nursery = layer._nursery = None

    trio.run(main)
    assert calls == [b"x"] * (times + 1)
    os.close(lf.fd)


@pytest.mark.parametrize("pending", ["upload", "unlinked"])
def test_a_write_into_a_full_journal_fails_after_its_wait(tmp_path, monkeypatch, pending):
    """upload: the remote is down (the other upload never ends): after
    JOURNAL_FULL_STALL_S the write fails the file with ENOSPC, as with nothing to wait
    for.  unlinked: a program keeps an unlinked file open, so its space comes back only
    when it closes it: the write fails after UNLINKED_RELEASE_WAIT_S, not after the
    minute an upload in flight would be given."""
    from neuralcache.errors import JournalFull
    from neuralcache.write import records

    _full_once(monkeypatch)
    monkeypatch.setattr(records, "JOURNAL_FULL_STALL_S" if pending == "upload"
                        else "UNLINKED_RELEASE_WAIT_S", 0.3)
    layer, node, lf = _layer_with_local_file(tmp_path)
    _open_for_writing(layer, lf)
    other = _another_upload(layer) if pending == "upload" else _unlinked_while_open(layer)

    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = layer._nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            t0 = trio.current_time()
            await layer.write(h, 0, b"x" * 100)
            await layer.behind.drained(lf)
            assert 0.25 < trio.current_time() - t0 < 5
            assert isinstance(lf.error, JournalFull) and layer.behind.failures == 1
            with pytest.raises(JournalFull):
                await layer.write(h, 100, b"y")
            layer.behind.nursery = layer._nursery = None

    trio.run(main)
    os.close(lf.fd)
    if pending == "unlinked":
        os.close(other.fd)


def _unlinked_while_open(layer):
    """Another file, unlinked while a descriptor still holds it: its staging file goes
    at that descriptor's RELEASE (``close()`` has returned before the kernel sends it)."""
    from neuralcache.write.files import LocalFile

    name, fd = layer.journal.create_staging()
    os.write(fd, b"gone")
    other = LocalFile(999, "gone.bin", name, fd, size=4, writers=1, unlinked=True)
    layer._current[name] = other
    return other


def test_a_write_into_a_full_journal_waits_for_a_late_release_of_an_unlinked_file(
        tmp_path, monkeypatch):
    """``close(); unlink()`` of the file that filled the journal, then a write to
    another: the RELEASE of the unlinked file may reach the daemon after the write
    found the disk full.  The write waits for it, then lands (it used to get ENOSPC:
    nothing else was pending)."""
    calls = _full_once(monkeypatch)
    layer, node, lf = _layer_with_local_file(tmp_path)
    _open_for_writing(layer, lf)
    other = _unlinked_while_open(layer)
    gone = layer.journal.staging_path(other.staging)

    async def late_release():
        await trio.sleep(0.2)
        other.writers = 0
        layer._forget_local(other)          # what release() does for an unlinked file

    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = layer._nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            n.start_soon(late_release)
            await layer.write(h, 0, b"x" * 100)
            await layer.behind.drained(lf)
            assert lf.error is None and layer.behind.full_waits == 1
            assert await layer.read(h, 0, 200) == b"x" * 100
            assert not os.path.exists(gone)
            layer.behind.nursery = layer._nursery = None

    trio.run(main)
    assert calls == [b"x", b"x"]
    os.close(lf.fd)


def test_a_staging_file_is_deleted_only_once_no_write_in_flight_holds_it(tmp_path,
                                                                         monkeypatch):
    """CI: the file that filled the journal was unlinked, and a create right after got
    ENOSPC: its writes still waiting to land held duplicates of its descriptor, and an
    unlinked file's space comes back only at its last close.  The deletion now waits
    for them, so no descriptor of the file is open when it is deleted."""
    import time as _time

    from neuralcache.write import behind

    real = behind._pwrite_own

    def slow(fd, data, off, kick):
        _time.sleep(0.3)
        return real(fd, data, off, kick)

    monkeypatch.setattr(behind, "_pwrite_own", slow)
    layer, node, lf = _layer_with_local_file(tmp_path)
    path = layer.journal.staging_path(lf.staging)
    for fd in fds_of(path):              # the helper's own descriptor
        os.close(fd)
    _open_for_writing(layer, lf)
    remove, held = layer.journal.remove_staging, []

    def remove_staging(name):
        held.extend(fds_of(path))
        remove(name)

    layer.journal.remove_staging = remove_staging

    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = layer._nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            await layer.write(h, 0, b"y" * 100)       # answered; lands in 0.3 s
            assert lf.inflight
            lf.writers = 0
            layer._forget_local(lf)                    # what an unlink does
            await layer.staging_removed()
            assert not os.path.exists(path) and not lf.inflight
            layer.behind.nursery = layer._nursery = None

    trio.run(main)
    assert held == []


def test_a_write_retries_after_a_deletion_while_another_upload_is_pending(tmp_path,
                                                                        monkeypatch):
    """Review: the retry after a deletion was skipped while any other upload was still
    queued, so a write whose space came back a moment late waited for the next upload
    (up to JOURNAL_FULL_STALL_S) instead of landing."""
    from neuralcache.write import records

    monkeypatch.setattr(records, "JOURNAL_FULL_STALL_S", 3.0)
    _full_once(monkeypatch, times=2)
    layer, node, lf = _layer_with_local_file(tmp_path)
    _open_for_writing(layer, lf)
    op = _another_upload(layer)
    _another_upload(layer)                 # a slow remote: never ends here


    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = layer._nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            n.start_soon(_upload_ends(layer, op, 0.2))
            t0 = trio.current_time()
            await layer.write(h, 0, b"x" * 100)
            await layer.behind.drained(lf)
            assert lf.error is None and trio.current_time() - t0 < 1.5
            assert layer.behind.full_waits == 1
            layer.behind.nursery = layer._nursery = None

    trio.run(main)
    os.close(lf.fd)


def test_a_file_unlinked_and_closed_while_its_write_waits_for_room(tmp_path, monkeypatch):
    """Review: the file's last close (it was unlinked while open) came while its write
    waited for journal room; the write then duplicated a closed descriptor (TypeError)
    and took the daemon's write tasks down.  Now the write ends, the staging file goes,
    and nothing is raised."""
    _full_once(monkeypatch, times=1000)
    layer, node, lf = _layer_with_local_file(tmp_path)
    _open_for_writing(layer, lf)
    op = _another_upload(layer)
    path = layer.journal.staging_path(lf.staging)


    async def main():
        async with trio.open_nursery() as n:
            layer.behind.nursery = layer._nursery = n
            h = await layer.open(node, os.O_RDWR, 1)
            n.start_soon(_upload_ends(layer, op, 0.1))
            await layer.write(h, 0, b"x" * 100)
            lf.unlinked = True                 # what an unlink while open leaves
            del layer.files[lf.inode]
            await trio.sleep(0.3)              # the write retries (FREED_LAG_S)
            t0 = trio.current_time()
            await layer.release(h)
            await layer.behind.drained(lf)
            await layer.staging_removed()
            assert trio.current_time() - t0 < 1 and not os.path.exists(path)
            layer.behind.nursery = layer._nursery = None

    trio.run(main)


def test_a_read_only_descriptor_reads_what_another_descriptor_wrote_since(tmp_path):
    """fsmodel seed 979: a descriptor opened read-only, then another one writes (a copy
    on write: a new staging file) and extends the file.  The first one reads the new
    bytes, as on a local disk (it read its own, old staging file: 0 bytes past the old
    end).  The descriptor it moved off is closed once no read of it is in flight."""
    layer, node, lf = _layer_with_local_file(tmp_path)
    old = layer.journal.staging_path(lf.staging)
    for fd in fds_of(old):               # the helper's own descriptor
        os.close(fd)

    async def main():
        r = await layer.open(node, os.O_RDONLY, 1)
        assert await layer.read(r, 0, 100) == b"local"
        w = await layer.open(node, os.O_RDWR, 2)
        await layer.write(w, 3, b"AL and more")
        assert layer.journal.staging_path(lf.staging) != old   # copied on write
        assert await layer.read(r, 0, 100) == b"locAL and more"
        assert await layer.read(r, 8, 4) == b"d mo"
        assert r.spent == [] and fds_of(old) == []       # the old one is closed
        await layer.release(r)

    trio.run(main)


class _RemoteAt:
    """A store holding one version of the file (a read of another fails the test)."""

    def __init__(self, version: str, data: bytes):
        self.version, self.data = version, data

    async def read(self, p, off, size):
        assert p.version == self.version, f"read {p.version}, the remote has {self.version}"
        return self.data[off:off + size]


def test_an_upload_from_here_repins_the_opens_of_the_remote_file(tmp_path):
    """A read-only open of the remote file made before this mount wrote it, and an
    O_RDWR open that never wrote, read the file as it is now once the upload ends
    (they were re-pinned lazily from ``WriteLayer.made``, one entry per file
    uploaded: review).  The upload's end re-pins them at once, with the upload's
    size; opens of other files keep their pins, and nothing is kept per upload."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.fs.operations import FileHandle, Operations
    from neuralcache.fs.trace import TraceRing
    from neuralcache.meta.lister import Lister
    from neuralcache.stats import Stats
    from neuralcache.store.blocks import Pinned
    from neuralcache.write.files import WriteHandle

    layer, node, lf = _layer_with_local_file(tmp_path)
    other = layer.ns.put_file("other.pt", 3, "o1", 0.0)
    edge = Operations(layer.ns, Lister(layer.ns, None, ttl=60), None, None, Stats(),
                      metadata_ttl=60, readahead_bytes=0, trace=TraceRing(0),
                      controls=None, writes=layer)      # wires the repin hook
    ro = FileHandle(node, Pinned(node.key, "v1", 5), None, 1)
    rw = WriteHandle(node.inode, None, Pinned(node.key, "v1", 5), 1, False)
    elsewhere = FileHandle(other, Pinned(other.key, "o1", 3), None, 1)
    for h in (ro, rw, elsewhere):
        edge._new_fh(h)
    edge._reading.update({node.inode: 1, other.inode: 1})     # as open() counts them
    layer._lazy[node.inode] = {rw}                  # as layer.open() keeps them
    held = lambda: {k: len(v) for k, v in vars(layer).items() if isinstance(v, dict)}
    before = held()
    info = ObjectInfo(node.key, 7, "v2", 0.0)
    lf.uploaded = info
    layer._uploaded(lf, info)
    assert node.version == "v2" and node.size == 7
    assert ro.pinned == rw.pinned == Pinned(node.key, "v2", 7)
    assert elsewhere.pinned == Pinned(other.key, "o1", 3)
    after = held()
    assert all(after[k] <= n for k, n in before.items()), (before, after)


def test_a_rename_moves_the_opens_of_the_renamed_file_only(tmp_path):
    """Review: a rename's copy re-pinned every handle pinned to the old key, also one
    of another file unlinked from that name before (it would read the renamed
    file's bytes).  Now a handle of a file unlinked since keeps its pin."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.fs.operations import FileHandle, Operations
    from neuralcache.fs.trace import TraceRing
    from neuralcache.meta.lister import Lister
    from neuralcache.stats import Stats
    from neuralcache.store.blocks import Pinned

    layer, node, lf = _layer_with_local_file(tmp_path)
    edge = Operations(layer.ns, Lister(layer.ns, None, ttl=60), None, None, Stats(),
                      metadata_ttl=60, readahead_bytes=0, trace=TraceRing(0),
                      controls=None, writes=layer)
    old = layer.ns.put_file("a.pt", 3, "y1", 0.0)       # opened, then unlinked
    gone = FileHandle(old, Pinned("a.pt", "y1", 3), None, 1)
    layer.ns.remove(old)
    moved = FileHandle(node, Pinned("a.pt", "x1", 5), None, 1)   # renamed a.pt -> here
    edge._new_fh(gone)
    edge._new_fh(moved)
    edge._repin(ObjectInfo(node.key, 5, "x2", 0.0), key="a.pt")
    assert moved.pinned == Pinned(node.key, "x2", 5)
    assert gone.pinned == Pinned("a.pt", "y1", 3)


def _closed_journal_file(tmp_path):
    """A journal file no writer holds open (closed, waiting for its upload) and the
    path of its staging file."""
    layer, node, lf = _layer_with_local_file(tmp_path)
    path = layer.journal.staging_path(lf.staging)
    for fd in fds_of(path):              # the helper's own descriptor
        os.close(fd)
    lf.fd = None
    return layer, node, lf, path


def test_a_full_journal_takes_back_the_deleted_staging_files_readers_hold(tmp_path):
    """A read-only descriptor keeps its own descriptor on the staging file it read,
    after the upload deleted it (so a file unlinked after its upload stays readable),
    and a reader left open held that space until it closed, while a full journal's
    writes waited for it (review).  Now a write that finds the disk full first makes
    readers give up the deleted files nothing needs them to hold: one whose file the
    remote has (it reads the remote's copy next), one a copy on write left behind (it
    reads the current copy next), and, with a read in flight, once that read ends.
    The last copy of a file unlinked while open keeps its space, as on a local disk."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.write.files import LocalFile

    layer, node, lf, path = _closed_journal_file(tmp_path / "a")
    name, wfd = layer.journal.create_staging()       # a file being written meanwhile
    other = LocalFile(node.inode + 1, "other.pt", name, wfd, size=0)

    async def main():
        r1 = await layer.open(node, os.O_RDONLY, 1)
        r2 = await layer.open(node, os.O_RDONLY, 1)
        assert await layer.read(r1, 0, 100) == b"local"
        info = ObjectInfo(node.key, 5, "v2", 0.0)
        lf.uploaded = info
        layer._uploaded(lf, info)
        layer.store = _RemoteAt("v2", b"REMOT")
        assert await layer.read(r1, 0, 100) == b"local"   # kept while there is room
        assert len(fds_of(path)) == 2
        r2.reading += 1                  # a read of r2 still in its worker thread
        assert await layer._journal_room(other)           # retried at once
        assert fds_of(path) == [r2.spent[0]]              # r1's closed, r2's waits
        r2.reading -= 1
        assert await layer.read(r2, 0, 100) == b"REMOT" and fds_of(path) == []
        assert await layer.read(r1, 1, 3) == b"EMO"
        await layer.release(r1)
        await layer.release(r2)
        assert layer.readers == set()

    trio.run(main)

    layer, node, lf, path = _closed_journal_file(tmp_path / "b")   # unlinked after upload

    async def unlinked():
        r = await layer.open(node, os.O_RDONLY, 1)
        info = ObjectInfo(node.key, 5, "v2", 0.0)
        lf.uploaded = info
        layer._uploaded(lf, info)
        layer.ns.rows.add_lookups(node.inode, 1)      # the kernel still holds it
        layer.ns.remove(node)
        layer.store = _RemoteAt("gone", b"")
        assert not layer._let_readers_go() and len(fds_of(path)) == 1
        assert await layer.read(r, 0, 100) == b"local"
        await layer.release(r)

    trio.run(unlinked)

    layer, node, lf, s1 = _closed_journal_file(tmp_path / "c")   # a copy on write since

    async def copied():
        r = await layer.open(node, os.O_RDONLY, 1)
        name, fd = layer.journal.create_staging()
        os.write(fd, b"newer")
        os.close(fd)
        lf.staging = name
        layer._current[name] = lf
        os.unlink(s1)                                 # the old copy, released
        assert len(fds_of(s1)) == 1
        assert layer._let_readers_go() and fds_of(s1) == []
        assert await layer.read(r, 0, 100) == b"newer"
        await layer.release(r)

    trio.run(copied)


def test_a_reader_that_gave_its_copy_up_follows_a_rename_and_an_unlink(tmp_path):
    """Review: a reader that gave its staging file up under a full journal reads the
    remote's copy; a rename of the file whose copy on the remote ended while that
    read waited (the old key deleted: NotFound) now reads the copy under the new key.
    Once the file is unlinked it reads the copy it read last: the write queue counts
    it as a reader (``counting``), so the delete waits for its close, as for a reader
    of the remote's copy (fs/operations.py).  It read ENOENT before, and the delete
    ran under it."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.errors import NotFound
    from neuralcache.namespace import ROOT_INODE

    layer, node, lf, _ = _closed_journal_file(tmp_path)

    class MovedMeanwhile:
        def __init__(self):
            self.keys = []

        async def read(self, p, off, size):
            self.keys.append((p.key, p.version))
            if p.key == "model.pt":               # the move's copy ends meanwhile
                layer._moved(Op(1, "move", "ckpt.pt", src="model.pt"),
                             ObjectInfo("ckpt.pt", 5, "v3", 0.0))
                raise NotFound("model.pt: 404 NoSuchKey")
            return b"MOVED"[off:off + size]

    async def main():
        r = await layer.open(node, os.O_RDONLY, 1)
        info = ObjectInfo(node.key, 5, "v2", 0.0)
        lf.uploaded = info
        layer._uploaded(lf, info)
        assert layer._let_readers_go()
        layer.ns.move(node, layer.ns.get(ROOT_INODE), "ckpt.pt")   # rename pending
        layer.moved["ckpt.pt"] = "model.pt"
        layer.store = MovedMeanwhile()
        assert await layer.read(r, 0, 100) == b"MOVED"
        assert layer.store.keys == [("model.pt", "v2"), ("ckpt.pt", "v3")]
        edge = {}                                     # the FUSE edge's own readers
        layer.queue.reading = layer.counting(edge)
        assert layer.queue.reading(node.inode) == 1
        layer.ns.rows.add_lookups(node.inode, 1)      # the kernel still holds it
        layer.ns.remove(node)
        held = layer.queue.new("delete", "ckpt.pt", hold=node.inode)
        held.durable = True                           # (journaled)
        assert await layer.read(r, 1, 3) == b"OVE"     # the copy it read last
        assert layer.store.keys[-1] == ("ckpt.pt", "v3")
        def runs():
            return held in list(layer.queue.runnable(lambda s: True))
        assert not runs()                             # held for it
        edge[node.inode] = 1                          # a reader at the edge too
        await layer.release(r)
        assert layer.queue.reading(node.inode) == 1 and not runs()
        edge.clear()
        layer.queue.readers_closed(node.inode)        # the edge's last close
        assert runs()

    trio.run(main)

    layer, node, lf, _ = _closed_journal_file(tmp_path / "never")

    async def never_read():    # gave it up, unlinked before any read of the remote
        r = await _reader_gave_its_copy_up(layer, node, lf)
        layer.ns.rows.add_lookups(node.inode, 1)
        layer.ns.remove(node)
        layer.store = _RemoteAt("v2", b"REMOT")
        assert await layer.read(r, 0, 100) == b"REMOT"
        await layer.release(r)

    trio.run(never_read)


class _Remote:
    """key -> (version, bytes): a read of another version is VersionChanged, of a
    missing key NotFound, as the backend's."""

    def __init__(self, objs):
        self.objs, self.keys = dict(objs), []

    async def read(self, p, off, size):
        from neuralcache.errors import NotFound, VersionChanged
        self.keys.append((p.key, p.version))
        if p.key not in self.objs:
            raise NotFound(p.key)
        v, data = self.objs[p.key]
        if v != p.version:
            raise VersionChanged(f"{p.key}: {p.version} -> {v}")
        return data[off:off + size]


async def _reader_gave_its_copy_up(layer, node, lf):
    """A read-only open of ``node`` whose journal copy then uploaded as v2 and which
    gave that copy up to a full journal (``_let_readers_go``): it reads the remote's."""
    from neuralcache.backends.base import ObjectInfo
    r = await layer.open(node, os.O_RDONLY, 1)
    lf.uploaded = ObjectInfo(node.key, 5, "v2", 0.0)
    layer._uploaded(lf, lf.uploaded)
    assert layer._let_readers_go() and r.fd is None
    return r


def _unlink(layer, node) -> list:
    """What WriteLayer.unlink does to ``node`` that the kernel still holds: its new ops."""
    layer.ns.rows.add_lookups(node.inode, 1)
    _, _, ops, _ = layer._forget_file(node, delete_remote=True)
    layer.ns.remove(node)
    return ops


def test_a_reader_that_gave_its_copy_up_reads_the_file_as_it_was_at_its_unlink(tmp_path):
    """Review of the held delete for readers that gave their copy up: each reads what
    the file was on the remote when it was unlinked, or, where the journal held newer
    data, nothing; none is counted (its delete held) for nothing.
    * renamed, unlinked, then the rename's copy ends (its source deleted) before any
      read: it reads the copy (it read the deleted source: ENOENT, its delete held);
    * written and uploaded again (v3) by another descriptor, then unlinked: it reads
      v3 (it read v2: ESTALE, or v2's bytes from the block cache);
    * after a copy on write, unlinked while a writer has it open: not counted, it reads
      the journal's copy (its delete was held and, once it reopened the copy, never
      let go at its close)."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.namespace import ROOT_INODE
    from neuralcache.write.files import LocalFile

    def runs(layer, op):
        op.durable = True
        return op in list(layer.queue.runnable(lambda s: True))

    layer, node, lf, _ = _closed_journal_file(tmp_path / "moved")

    async def moved():
        r = await _reader_gave_its_copy_up(layer, node, lf)
        assert r.pin.key == "model.pt"
        layer.queue.reading = layer.counting({})
        layer.ns.move(node, layer.ns.get(ROOT_INODE), "ckpt.pt")      # rename pending
        layer.moved["ckpt.pt"] = "model.pt"
        ops = _unlink(layer, node)
        assert ops[0].hold == node.inode and not runs(layer, ops[0])
        layer._moved(Op(1, "move", "ckpt.pt", src="model.pt"),
                     ObjectInfo("ckpt.pt", 5, "v3", 0.0))
        layer.store = _Remote({"ckpt.pt": ("v3", b"MOVED")})          # source deleted
        assert await layer.read(r, 0, 100) == b"MOVED"
        await layer.release(r)
        assert runs(layer, ops[0])

    trio.run(moved)

    layer, node, lf, _ = _closed_journal_file(tmp_path / "again")

    async def written_again():
        r = await _reader_gave_its_copy_up(layer, node, lf)
        assert r.pin.version == "v2"
        name, fd = layer.journal.create_staging()
        os.write(fd, b"third")
        os.close(fd)
        lf2 = LocalFile(node.inode, node.key, name, None, size=5, sealed=True)
        layer.files[node.inode] = lf2
        lf2.uploaded = ObjectInfo(node.key, 5, "v3", 0.0)
        layer._uploaded(lf2, lf2.uploaded)
        layer.queue.reading = layer.counting({})
        ops = _unlink(layer, node)
        assert ops[0].hold == node.inode
        layer.store = _Remote({"model.pt": ("v3", b"third")})
        assert await layer.read(r, 0, 100) == b"third"
        await layer.release(r)

    trio.run(written_again)

    layer, node, lf, _ = _closed_journal_file(tmp_path / "cow")

    async def copy_on_write():
        r = await layer.open(node, os.O_RDONLY, 1)
        name, fd = layer.journal.create_staging()
        os.write(fd, b"newer")
        lf.staging, lf.fd, lf.writers, lf.remote_base = name, fd, 1, True
        layer._current[name] = lf
        assert layer._let_readers_go() and r.fd is None and r.pin is None
        layer.queue.reading = layer.counting({})
        ops = _unlink(layer, node)
        assert ops[0].hold is None and layer.queue.reading(node.inode) == 0
        assert await layer.read(r, 0, 100) == b"newer"
        await layer.release(r)

    trio.run(copy_on_write)


def test_a_read_only_descriptor_follows_the_file_across_uploads_and_a_failed_copy(
        tmp_path):
    """Review: a reader whose file was uploaded, then written and uploaded again by
    another descriptor before it read again, read its first staging file (stale); one
    that had moved onto a copy from the remote that then failed read the partly
    filled staging file (empty).  Both read the remote's current version now, and a
    reader of the staging file that is exactly what the remote has reads it locally."""
    from neuralcache.backends.base import ObjectInfo
    from neuralcache.write.files import LocalFile

    layer, node, lf = _layer_with_local_file(tmp_path)

    async def main():
        r = await layer.open(node, os.O_RDONLY, 1)
        assert await layer.read(r, 0, 100) == b"local"
        info = ObjectInfo(node.key, 5, "v2", 0.0)            # uploaded
        lf.uploaded = info
        layer._uploaded(lf, info)
        layer.store = _RemoteAt("v2", b"REMOTE")             # not read: same bytes
        assert await layer.read(r, 0, 100) == b"local"
        node.version = "v3"                                  # written, uploaded again
        layer.store = _RemoteAt("v3", b"NEWal")
        assert await layer.read(r, 0, 100) == b"NEWal"
        name, fd = layer.journal.create_staging()            # a copy from the remote
        lf2 = LocalFile(node.inode, node.key, name, fd, size=0)
        layer.files[node.inode], layer._current[name] = lf2, lf2
        await layer.read(r, 0, 100)                          # r moves onto it
        layer._forget_local(lf2)                             # the copy failed
        assert await layer.read(r, 0, 100) == b"NEWal"
        await layer.release(r)

    trio.run(main)


def test_a_remote_read_only_open_follows_what_this_mount_writes(tmp_path, monkeypatch):
    """A read-only open of a remote file (fs/operations.py FileHandle) once this mount
    wrote it: two first reads racing each other make one reader of the journal's copy
    (review: the other leaked, its descriptor holding the staging file's space); once
    the journal dropped, a handle that never read meanwhile is told to read the
    remote as pinned (None: the upload's end re-pins it, the test above; a version
    made elsewhere leaves the pin alone, old bytes or ESTALE: tests/test_e2e.py)."""
    from neuralcache.fs.operations import FileHandle
    from neuralcache.store.blocks import Pinned

    layer, node, lf = _layer_with_local_file(tmp_path)
    path = layer.journal.staging_path(lf.staging)
    for fd in fds_of(path):              # the helper's own descriptor
        os.close(fd)
    real = layer.open_reader

    async def slow_open(node):
        await trio.sleep(0.1)
        return await real(node)

    monkeypatch.setattr(layer, "open_reader", slow_open)
    h = FileHandle(node, Pinned(node.key, "v1", 5), None, 1)

    async def main():
        got = []

        async def read():
            got.append(await layer.follow_remote(h, 0, 100))

        async with trio.open_nursery() as n:
            n.start_soon(read)
            n.start_soon(read)
        assert got == [b"local", b"local"] and fds_of(path) == [h.journal.fd]
        await layer.release(h.journal)
        assert fds_of(path) == []

        h2 = FileHandle(node, Pinned(node.key, "v1", 5), None, 1)
        del layer.files[node.inode]                 # uploaded as v2 and forgotten
        node.version = "v3"                         # changed by another node
        assert await layer.follow_remote(h2, 0, 100) is None and h2.journal is None

    trio.run(main)
