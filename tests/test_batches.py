"""store/batches.py: disk calls combined into few worker-thread jobs (unit tests)."""
import threading
import time

import pytest
import trio

from neuralcache.store import batches


def test_calls_made_while_the_jobs_are_busy_go_together():
    """Two jobs at most; the calls made meanwhile run in the next job, each answered its
    own result, in order, on worker threads; an exception is its call's alone."""
    threads = set()

    def fn(x):
        threads.add(threading.get_ident())
        time.sleep(0.02)
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
            for x in range(20):
                n.start_soon(one, n, x)
    trio.run(main)
    assert results == {x: ("seven" if x == 7 else x * 10) for x in range(20)}
    assert c.calls == 20 and c.batches <= 4, c.batches
    assert threading.get_ident() not in threads


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
    calls None (the block store then treats the block as not on disk)."""
    c = batches.Combined(lambda x: pytest.fail("ran"), 1, trio.CapacityLimiter(1))
    out = []

    async def hold(task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as jobs:
            task_status.started(jobs)
            await trio.sleep_forever()

    async def main():
        async with trio.open_nursery() as n:
            jobs = await n.start(hold)
            jobs.cancel_scope.cancel()               # the store's nursery, unmounting
            out.append(await c.call(jobs, "x"))      # (a caller not cancelled itself)
    trio.run(main)
    assert out == [None]
