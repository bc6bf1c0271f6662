"""bench.breakdown's py-spy summary and the write throttle's disk lookup (no mount)."""
import os

from bench.systems.throttle import _disk_of
from bench.tools.breakdown import report, spy_summary


def test_spy_summary_keeps_the_trio_threads_own_frames_without_plumbing(tmp_path):
    raw = tmp_path / "w.pyspy"
    raw.write_text(
        "main;run;unrolled_run;__Pyx_Coroutine_SendEx;Operations.read (ops.py:1);"
        "fuse_reply_buf;writev (libc.so.6) 3\n"
        "main;run;unrolled_run;epoll_wait (libc.so.6) 1\n"
        "worker;Thread._bootstrap;preadv64v2 (libc.so.6) 50\n")
    top = spy_summary(raw)          # (ties in any order)
    assert top[3] == " 25.0 %  epoll_wait"
    assert sorted(top[:3]) == [" 75.0 %  Operations.read", " 75.0 %  fuse_reply_buf",
                               " 75.0 %  writev"]


def test_report_gives_fetched_mib_and_the_umount_time():
    row = {"seconds": 1.0, "bytes": 1 << 30, "files": 1, "cpu": {"total": 1.0},
           "fuse_requests": {}, "fuse_read_sizes": {}, "bytes_fetched": 3 << 20,
           "proxy_cpu": 0.1, "minor_faults": 0, "umount_s": 7.6}
    assert "big: fetched over the link 3 MiB; the umount after it 7.6 s" in report(
        {"big": row})


def test_the_throttle_finds_the_disk_a_path_is_on(tmp_path):
    maj, mi = _disk_of(tmp_path).split(":")
    assert int(maj) >= 0 and int(mi) >= 0
    assert os.path.exists(f"/sys/dev/block/{maj}:{mi}")


def test_thread_cpu_counts_short_busy_threads():
    """Forty threads busy ~4 ms each: /proc's stat counted them in whole clock ticks
    (10 ms), mostly 0; their schedstat run time adds up to what they used."""
    import threading
    import time

    from bench.systems.cpu import thread_cpu

    done, ready = threading.Event(), []
    # a new thread's group: its comm (the interpreter's name) without digits
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        group = "".join(c for c in f.read().strip() if not c.isdigit()).strip()
    before = thread_cpu(os.getpid()).get(group, 0.0)

    def busy():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.004:
            pass
        ready.append(1)
        done.wait(30)
    threads = [threading.Thread(target=busy) for i in range(40)]
    for t in threads:
        t.start()
    while len(ready) < 40:
        time.sleep(0.01)
    try:
        assert thread_cpu(os.getpid()).get(group, 0.0) - before >= 0.12
    finally:
        done.set()
        for t in threads:
            t.join()


def test_report_names_the_cpu_the_thread_groups_leave_out():
    """The line says how much of the process total the groups miss (threads that
    exited)."""
    row = {"seconds": 1.0, "bytes": 1000, "files": 1000, "cpu": {"total": 1.3},
           "fuse_requests": {}, "fuse_read_sizes": {}, "bytes_fetched": 0,
           "proxy_cpu": 0.1, "minor_faults": 0, "umount_s": 0.3,
           "threads": {"trio loop (main)": 0.6, "trio workers": 0.1}}
    line = [x for x in report({"files": row}).splitlines() if "CPU by thread" in x][0]
    assert line.endswith("trio loop (main) 0.600, trio workers 0.100; not in these "
                         "(exited threads, the total's tick sampling) 0.600")


def test_report_gives_the_disk_writes_skipped_and_queued_late():
    row = {"seconds": 1.0, "bytes": 1000, "files": 1000, "cpu": {"total": 1.0},
           "fuse_requests": {}, "fuse_read_sizes": {}, "bytes_fetched": 5 << 20,
           "proxy_cpu": 0.1, "minor_faults": 0, "umount_s": 2.5,
           "disk_writes": {"disk_writes_skipped": 40, "disk_writes_late": 12}}
    assert "files: fetched over the link 5 MiB; disk writes skipped 40, queued late 12; " \
        "the umount after it 2.5 s" in report({"files": row})


def test_bigpair_names_this_process_the_reader_and_pools_by_role():
    from bench.tools.bigpair import cpu_by_role, proc_cpu

    a = proc_cpu(os.getpid())
    assert a[os.getpid()][0] == "reader"
    x = 0
    for i in range(2_000_000):      # some CPU of our own between the snapshots
        x += i
    b = proc_cpu(os.getpid())
    roles = cpu_by_role(a, b)
    assert roles.get("reader", 0) > 0
    # two processes of one role add up; a process that was not there before counts whole
    fake_a = {1: ("weed", 1.0), 2: ("weed", 2.0)}
    fake_b = {1: ("weed", 1.5), 2: ("weed", 2.25), 3: ("kworker", 0.5)}
    assert cpu_by_role(fake_a, fake_b) == {"weed": 0.75, "kworker": 0.5}


def test_bigpair_variants_split_mount_options_from_the_daemons_environment():
    from bench.tools.bigpair import split_variant

    assert split_variant("--readahead-size 64M NEURALCACHE_RCVLOWAT=0") == (
        ["--readahead-size", "64M"], {"NEURALCACHE_RCVLOWAT": "0"})
    assert split_variant("--mount-opt=x") == (["--mount-opt=x"], {})
    assert split_variant("") == ([], {})
