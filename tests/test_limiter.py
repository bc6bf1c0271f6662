"""Priority limiter: demand first, reserved slots, priority raise."""
import trio

from neuralcache import limiter as lim


def test_demand_goes_before_queued_prefetch_and_reserve_holds():
    order = []

    async def main():
        L = lim.PriorityLimiter(total=2, reserved_for_demand=1)
        hold = trio.Event()

        async def job(name, prio):
            t = L.ticket(prio)
            await L.acquire(t)
            order.append(name)
            await hold.wait()
            L.release()

        async with trio.open_nursery() as n:
            n.start_soon(job, "p1", lim.PREFETCH)
            await trio.sleep(0.01)
            n.start_soon(job, "p2", lim.PREFETCH)       # must wait: 1 slot reserved
            await trio.sleep(0.01)
            assert order == ["p1"]
            n.start_soon(job, "d1", lim.DEMAND)          # takes the reserved slot
            await trio.sleep(0.01)
            assert order == ["p1", "d1"]
            hold.set()
        assert order == ["p1", "d1", "p2"]

    trio.run(main)


def test_raise_priority_lets_waiter_through():
    async def main():
        L = lim.PriorityLimiter(total=2, reserved_for_demand=1)
        t1 = L.ticket(lim.PREFETCH)
        await L.acquire(t1)
        t2 = L.ticket(lim.PREFETCH)
        got = []

        async def wait2():
            await L.acquire(t2)
            got.append(1)

        async with trio.open_nursery() as n:
            n.start_soon(wait2)
            await trio.sleep(0.01)
            assert not got
            L.raise_priority(t2, lim.DEMAND)
            await trio.sleep(0.01)
            assert got == [1]
            L.release()
            L.release()
        assert L.busy == 0

    trio.run(main)


def test_cancelled_waiter_leaves_no_slot_behind():
    async def main():
        L = lim.PriorityLimiter(total=1, reserved_for_demand=0)
        t1 = L.ticket(lim.DEMAND)
        await L.acquire(t1)
        with trio.move_on_after(0.01):
            await L.acquire(L.ticket(lim.DEMAND))
        assert L.waiting == 0
        L.release()
        assert L.busy == 0

    trio.run(main)
