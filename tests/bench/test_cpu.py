"""bench/systems/cpu.py: CPU by thread group, from /proc (no kernel mount)."""
import os
import threading
import time

from bench.systems.cpu import cpu_seconds, thread_cpu


def test_thread_cpu_groups_numbered_threads_and_names_the_daemon_s():
    done = threading.Event()
    spun = [threading.Event() for _ in range(2)]

    def spin(i):
        # the OS-level name, as trio sets it for its workers (Python 3.11 does not)
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(threading.current_thread().name)
        end = time.thread_time() + 0.15
        while time.thread_time() < end:
            pass
        spun[i].set()
        done.wait()

    threads = [threading.Thread(target=spin, args=(i,), name=f"Trio thread {n}")
               for i, n in enumerate((3, 12))]
    for t in threads:
        t.start()
    try:
        for e in spun:         # their CPU spent (a loaded machine takes longer than 0.3 s)
            assert e.wait(10)
        by = thread_cpu(os.getpid())
    finally:
        done.set()
        for t in threads:
            t.join()
    assert "trio workers" in by and "trio loop (main)" in by, by
    assert by["trio workers"] >= 0.2          # both threads' CPU in one group
    assert sum(by.values()) <= cpu_seconds(os.getpid()) + 0.05
