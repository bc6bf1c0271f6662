"""store/batches.py: disk calls combined into few worker-thread jobs (unit tests)."""
import threading
import time

import pytest
import trio

from neuralcache.store import batches


def test_calls_made_while_the_jobs_are_busy_go_together():
    """Calls arriving over time: at most two jobs run at once; a call made while both
    are busy goes with the others waiting into the next job, so there are fewer jobs
    than calls; each call gets its own result (in the order made, per job), on a
    worker thread; an exception is its call's alone."""
    lock, inside, most, ran, threads = threading.Lock(), [0], [0], [], set()

    def fn(x):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            ran.append(x)
        threads.add(threading.get_ident())
        time.sleep(0.01)
        with lock:
            inside[0] -= 1
        if x == 7:
            raise ValueError("seven")
        return x * 10

    c = batches.Combined(fn, 2, trio.CapacityLimiter(8))
    results = {}

    async def one(n, x):
        try:
            results[x] = await c.call(n, x)
        except ValueError as exc:
            results[x] = str(exc)

    async def main():
        async with trio.open_nursery() as n:
            for x in range(40):
                n.start_soon(one, n, x)
                await trio.sleep(0.002)
    trio.run(main)
    assert results == {x: ("seven" if x == 7 else x * 10) for x in range(40)}
    assert most[0] <= 2 and c.calls == 40 and c.batches < 30, (most, c.batches)
    assert ran == sorted(ran) or most[0] == 2          # (one job: strictly in order)
    assert threading.get_ident() not in threads


def test_a_batch_stops_at_its_byte_bound():
    """BATCH_MAX_BYTES of sizes per job: a reader who joins one call waits for a few
    ms of reads, not for BATCH_MAX_BLOCKS large ones."""
    sizes = []
    gate = threading.Event()

    def fn(x):
        gate.wait(5)
        return x

    c = batches.Combined(fn, 1, trio.CapacityLimiter(1))
    step = batches.BATCH_MAX_BYTES // 4

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(c.call, n, "first", step)
            await trio.sleep(0.05)                 # the one job is busy with "first"
            for i in range(12):
                n.start_soon(c.call, n, i, step)
            await trio.sleep(0.05)
            real = c._all
            c._all = lambda batch: (sizes.append(len(batch)), real(batch))
            gate.set()
    trio.run(main)
    assert sizes == [4, 4, 4]


def test_a_call_whose_caller_left_is_not_run():
    ran = []
    gate = threading.Event()

    def fn(x):
        if x == "first":
            gate.wait(5)
        ran.append(x)
        return x

    c = batches.Combined(fn, 1, trio.CapacityLimiter(1))

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(c.call, n, "first")
            await trio.sleep(0.05)                 # the one job is busy with "first"
            with trio.move_on_after(0.05):
                await c.call(n, "left")            # waits, then its caller leaves
            n.start_soon(c.call, n, "kept")
            await trio.sleep(0.01)
            gate.set()
    trio.run(main)
    assert ran == ["first", "kept"]


def test_a_job_cancelled_before_its_thread_answers_none():
    """At the unmount the nursery is cancelled: a job that had not begun answers its
    calls None (the block store then treats the block as not on disk), and the calls
    still waiting beyond its batch too: none is left waiting."""
    c = batches.Combined(lambda x: pytest.fail("ran"), 1, trio.CapacityLimiter(1))
    out = []

    async def hold(task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as jobs:
            task_status.started(jobs)
            await trio.sleep_forever()

    async def one(jobs, x):
        out.append(await c.call(jobs, x))

    async def main():
        async with trio.open_nursery() as n:
            jobs = await n.start(hold)
            for x in range(batches.BATCH_MAX_BLOCKS + 9):   # (callers not cancelled)
                n.start_soon(one, jobs, x)
            await trio.sleep(0)
            jobs.cancel_scope.cancel()               # the store's nursery, unmounting
            with trio.fail_after(5):
                while len(out) < batches.BATCH_MAX_BLOCKS + 9:
                    await trio.sleep(0.01)
    trio.run(main)
    assert out == [None] * (batches.BATCH_MAX_BLOCKS + 9)
