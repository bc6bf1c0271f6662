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
            L.release(t)

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
            L.release(t1)
            L.release(t2)
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
        L.release(t1)
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
                L.release(t)

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
            L.release(first)
        live = [i for i in range(1000) if i % 7]
        prio = {i: (lim.DEMAND if i % 10 == 0 else (lim.PREFETCH, lim.READAHEAD)[i % 2])
                for i in live}
        assert order == sorted(live, key=lambda i: (prio[i], i))
        assert L.waiting == 0 and L.busy == 0

    trio.run(main)


def test_no_stale_entries_left_once_nobody_waits():
    async def main():
        L = lim.PriorityLimiter(total=1, reserved_for_demand=0)
        first = L.ticket(lim.DEMAND)
        await L.acquire(first)
        waiters = []

        async def job(prio):
            t = L.ticket(prio)
            waiters.append(t)
            await L.acquire(t)
            L.release(t)

        async with trio.open_nursery() as n:
            for _ in range(5):
                n.start_soon(job, lim.PREFETCH)
            await trio.sleep(0.01)
            for t in waiters:
                L.raise_priority(t, lim.READAHEAD)    # each leaves a stale entry
            L.release(first)
        assert L.waiting == 0 and L._heap == []

    trio.run(main)


def test_bytes_in_flight_are_bounded_and_some_kept_for_demand():
    """Many slots for small requests, few for large ones: a request starts when its
    bytes fit under the cap (or nothing else is in flight); speculative requests leave
    ``reserved_bytes`` to demand; a release returns its ticket's bytes; a cancelled
    waiter takes none."""
    MB = 1 << 20

    async def main():
        L = lim.PriorityLimiter(total=100, reserved_for_demand=1, byte_cap=32 * MB,
                                reserved_bytes=8 * MB)
        small = [L.ticket(lim.PREFETCH, 100_000) for _ in range(50)]
        for t in small:                                   # 5 MB: all fit
            await L.acquire(t)
        big = L.ticket(lim.PREFETCH, 20 * MB)             # 25 MB > 24 MB for speculation
        demand = L.ticket(lim.DEMAND, 20 * MB)            # 25 MB <= 32 MB
        async with trio.open_nursery() as n:
            n.start_soon(L.acquire, big)
            await trio.sleep(0.01)
            assert not big.granted and L.busy_bytes == 50 * 100_000
            with trio.move_on_after(0.05):
                await L.acquire(demand)
            assert demand.granted and L.busy_bytes == 50 * 100_000 + 20 * MB
            L.release(demand)
            assert not big.granted                        # still 5 MB + 20 MB > 24 MB
            for t in small:
                L.release(t)
            await trio.sleep(0.01)
            assert big.granted and L.busy == 1 and L.busy_bytes == 20 * MB
        huge = L.ticket(lim.PREFETCH, 64 * MB)            # larger than the cap
        gone = L.ticket(lim.PREFETCH, 1 * MB)
        async with trio.open_nursery() as n:
            n.start_soon(L.acquire, huge)
            await trio.sleep(0.01)                        # huge waits: 20 + 64 MB
            with trio.move_on_after(0.02):
                await L.acquire(gone)                     # queued behind huge: cancelled
            assert not gone.granted
            L.release(big)                                # nothing else in flight: huge starts
            await trio.sleep(0.01)
            assert huge.granted and L.busy_bytes == 64 * MB
        L.release(huge)
        assert L.busy == 0 and L.busy_bytes == 0 and L.waiting == 0

    trio.run(main)
