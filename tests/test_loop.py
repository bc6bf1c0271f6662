"""neuralcache/fs/loop.py: the stand-in pyfuse3's request loop waits through (the
mounts of the end-to-end tests run on it; these check its two parts alone)."""
import os

import pyfuse3
import trio
import trio.testing

from neuralcache.fs import loop


def test_the_lock_excludes_and_serves_waiters_in_order():
    order, inside = [], []

    async def main():
        lock = loop._Lock()

        async def one(i):
            async with lock:
                inside.append(i)
                assert len(inside) == 1, "two tasks inside the lock"
                await trio.sleep(0.01)
                order.append(i)
                inside.remove(i)

        async with trio.open_nursery() as n:
            for i in range(5):
                n.start_soon(one, i)
                await trio.testing.wait_all_tasks_blocked()
        assert not lock._held and not lock._lot

    trio.run(main)
    assert order == [0, 1, 2, 3, 4]


def test_a_free_lock_is_taken_without_a_scheduler_pass():
    async def main():
        lock = loop._Lock()
        ran = []

        async def other():
            ran.append(1)

        async with trio.open_nursery() as n:
            n.start_soon(other)
            async with lock:                # no checkpoint: `other` has not run yet
                assert ran == []
            await trio.testing.wait_all_tasks_blocked()
            assert ran == [1]

    trio.run(main)


def test_wait_readable_returns_when_data_is_there_and_waits_when_not():
    r, w = os.pipe()
    try:
        async def main():
            os.write(w, b"x")
            loop._ready_run = 0
            ran = []

            async def other():
                ran.append(1)

            async with trio.open_nursery() as n:
                n.start_soon(other)
                with trio.fail_after(1):
                    await loop._wait_readable(r)    # already readable: no pass
                assert ran == [], "a scheduler pass for a request already queued"
            os.read(r, 1)
            woke = []

            async def waiter():
                await loop._wait_readable(r)
                woke.append(1)

            async with trio.open_nursery() as n:
                n.start_soon(waiter)
                await trio.sleep(0.05)
                assert woke == [], "returned with nothing to read"
                os.write(w, b"y")
            assert woke == [1]

        trio.run(main)
    finally:
        os.close(r)
        os.close(w)


def test_install_gives_pyfuse3_the_stand_in_and_forwards_the_rest(monkeypatch):
    monkeypatch.setattr(pyfuse3, "trio", trio)
    monkeypatch.setattr(loop, "FAST_LOOP", True)
    assert loop.install()
    t = pyfuse3.trio
    assert t.Lock is loop._Lock
    assert t.lowlevel.wait_readable is loop._wait_readable
    assert t.open_nursery is trio.open_nursery
    assert t.ClosedResourceError is trio.ClosedResourceError
    assert t.lowlevel.notify_closing is trio.lowlevel.notify_closing
    monkeypatch.setattr(pyfuse3, "trio", trio)
    monkeypatch.setattr(loop, "FAST_LOOP", False)
    assert not loop.install() and pyfuse3.trio is trio


def test_ready_requests_let_other_tasks_run_every_batch():
    """Back-to-back requests skip the scheduler pass, but never more than
    READY_BATCH in a row: another task runs between each batch."""
    r, w = os.pipe()
    try:
        os.write(w, b"x")                   # stays readable: nothing reads it
        runs = []

        async def main():
            loop._ready_run = 0
            ticks = [0]

            async def other():
                while True:
                    ticks[0] += 1
                    await trio.sleep(0)

            async with trio.open_nursery() as n:
                n.start_soon(other)
                await trio.sleep(0)
                for _ in range(4 * loop.READY_BATCH):
                    before = ticks[0]
                    await loop._wait_readable(r)
                    runs.append(ticks[0] - before)
                n.cancel_scope.cancel()

        trio.run(main)
        # other ran only on the calls that closed a batch, and at every pass (trio
        # runs a batch of runnable tasks in random order: it may run just after the
        # caller resumed, and count toward the next batch's call)
        closing = [i % loop.READY_BATCH == loop.READY_BATCH - 1 for i in range(len(runs))]
        assert all(n == 0 for n, c in zip(runs, closing) if not c), runs
        assert sum(runs) >= 2, runs
    finally:
        os.close(r)
        os.close(w)


def test_a_cancelled_loop_stops_within_a_batch_while_requests_keep_coming():
    """The fast path must not outlive a cancellation (a part of the daemon failed):
    with the fd always readable, a loop of waits stops within READY_BATCH of them."""
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        served = []

        async def main():
            lock = loop._Lock()
            with trio.CancelScope() as scope:
                scope.cancel()
                for _ in range(10 * loop.READY_BATCH):
                    async with lock:
                        await loop._wait_readable(r)
                    served.append(1)

        trio.run(main)
        assert len(served) < loop.READY_BATCH
    finally:
        os.close(r)
        os.close(w)


def test_a_waiter_cancelled_while_parked_never_holds_the_lock():
    async def main():
        lock = loop._Lock()
        got = []

        async def waiter(scope_box):
            with trio.CancelScope() as scope:
                scope_box.append(scope)
                async with lock:
                    got.append("cancelled one")

        async def other():
            async with lock:
                got.append("other")

        async with trio.open_nursery() as n:
            async with lock:
                box = []
                n.start_soon(waiter, box)
                await trio.testing.wait_all_tasks_blocked()
                n.start_soon(other)
                await trio.testing.wait_all_tasks_blocked()
                box[0].cancel()
                await trio.testing.wait_all_tasks_blocked()
        assert got == ["other"]
        assert not lock._held and not lock._lot

    trio.run(main)
