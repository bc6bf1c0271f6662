"""Priority limiter: demand first, reserved slots, priority raise."""
import trio

from neuralcache.store import limiter as lim


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


def test_many_waiters_go_in_priority_then_arrival_order():
    """1,000 queued waiters, some cancelled and some raised while waiting: grants follow
    (priority, arrival) exactly, and the waiting count ends at zero."""
    order = []

    async def main():
        L = lim.PriorityLimiter(total=1, reserved_for_demand=0)
        first = L.ticket(lim.DEMAND)
        await L.acquire(first)                      # hold the only slot
        tickets, scopes = {}, {}

        async def job(i, prio, task_status=trio.TASK_STATUS_IGNORED):
            with trio.CancelScope() as cs:
                scopes[i] = cs
                t = tickets[i] = L.ticket(prio)
                task_status.started()
                await L.acquire(t)
                order.append(i)
                L.release()

        async with trio.open_nursery() as n:
            for i in range(1000):
                await n.start(job, i, (lim.PREFETCH, lim.READAHEAD)[i % 2])
            await trio.sleep(0.01)
            assert L.waiting == 1000
            for i in range(0, 1000, 7):
                scopes[i].cancel()
            for i in range(0, 1000, 10):
                L.raise_priority(tickets[i], lim.DEMAND)
            await trio.sleep(0.01)
            L.release()
        live = [i for i in range(1000) if i % 7]
        prio = {i: (lim.DEMAND if i % 10 == 0 else (lim.PREFETCH, lim.READAHEAD)[i % 2])
                for i in live}
        assert order == sorted(live, key=lambda i: (prio[i], i))
        assert L.waiting == 0 and L.busy == 0

    trio.run(main)


def test_no_stale_entries_left_once_nobody_waits():
    async def main():
        L = lim.PriorityLimiter(total=1, reserved_for_demand=0)
        await L.acquire(L.ticket(lim.DEMAND))
        waiters = []

        async def job(prio):
            t = L.ticket(prio)
            waiters.append(t)
            await L.acquire(t)
            L.release()

        async with trio.open_nursery() as n:
            for _ in range(5):
                n.start_soon(job, lim.PREFETCH)
            await trio.sleep(0.01)
            for t in waiters:
                L.raise_priority(t, lim.READAHEAD)    # each leaves a stale entry
            L.release()
        assert L.waiting == 0 and L._heap == []

    trio.run(main)
