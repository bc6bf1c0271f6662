"""Sizes, options and CLI input errors (no mount needed)."""
import pytest

from neuralcache.admin import cli
from neuralcache.admin.config import parse_o_options
from neuralcache.errors import UserError
from neuralcache.admin.sizes import format_size, parse_size


@pytest.mark.parametrize("text,value", [
    ("4096", 4096), ("512M", 512 << 20), ("20G", 20 << 30), ("1.5G", 3 << 29),
    ("8MiB", 8 << 20), ("1k", 1024), (" 2 T ", 2 << 40), ("64KB", 64 << 10),
])
def test_parse_size_good(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "G", "10X", "-5M", "1e9", "ten", "5 M B"])
def test_parse_size_bad_names_the_input(text):
    with pytest.raises(UserError) as e:
        parse_size(text, "cache size")
    assert "cache size" in str(e.value) and repr(text) in str(e.value)


def test_format_size():
    assert format_size(1536) == "1.5K"
    assert format_size(100) == "100"


def test_o_options_parse_and_ignore_fstab_words():
    got = parse_o_options("cache_size=10G,readahead=off,allow_other,_netdev,nofail,"
                          "memory-cache-size=256M,x-systemd.requires=network.target")
    assert got == {"cache_size": 10 << 30, "readahead": False, "allow_other": True,
                   "memory_cache_size": 256 << 20}


def test_every_mount8_word_and_a_comment_are_ignored():
    """fstab(5) lines carry mount(8)'s own options; README says they are ignored."""
    words = ("async,sync,dirsync,lazytime,nodiratime,strictatime,silent,loud,owner,"
             "group,iversion,mand,comment=nightly job,x-systemd.requires=network.target")
    assert parse_o_options("rw," + words) == {"writable": True}


def test_rw_turns_writes_on_and_ro_keeps_read_only(tmp_path):
    assert parse_o_options("rw,nofail") == {"writable": True}
    assert parse_o_options("ro") == {"writable": False}
    assert parse_o_options("writable,sync_close") == {"writable": True, "sync_close": True}
    args = cli.build_parser().parse_args(["mount", "/tmp", str(tmp_path)])
    assert cli.build_config(args).writable is False          # read-only by default
    args = cli.build_parser().parse_args(["mount", "/tmp", str(tmp_path), "--writable"])
    assert cli.build_config(args).writable is True


def test_mount_helper_ignores_the_rw_mount8_always_passes(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "main", lambda argv: seen.append(argv) or 0)
    cli.mount_helper(["s3://b", "/mnt", "-o", "rw,cache_size=1G"])
    cli.mount_helper(["s3://b", "/mnt", "-o", "rw"])
    cli.mount_helper(["s3://b", "/mnt", "-o", "rw,writable"])
    assert seen == [["mount", "s3://b", "/mnt", "-o", "cache_size=1G"],
                    ["mount", "s3://b", "/mnt"],
                    ["mount", "s3://b", "/mnt", "-o", "writable"]]


@pytest.mark.parametrize("text,word", [("bogus=1", "bogus"), ("cache_size", "needs a value"),
                                       ("readahead=maybe", "on or off"),
                                       ("metadata_ttl=-3", "negative")])
def test_o_options_errors(text, word):
    with pytest.raises(UserError) as e:
        parse_o_options(text)
    assert word in str(e.value)


@pytest.mark.parametrize("argv,word", [
    (["mount", "/tmp", "/tmp/x", "--cache-size", "lots"], "cache size"),
    (["mount", "/tmp", "/tmp/x", "--memory-cache-size", "1K"], "memory-cache-size"),
    (["mount", "/tmp", "/tmp/x", "-o", "nosuch=1"], "nosuch"),
    (["mount", "ftp://x/y", "/tmp/x", "--foreground"], "s3://"),
    (["mount", "/tmp", "/nonexistent/mnt", "--foreground"], "does not exist"),
    (["mount", "/nonexistent/src", "/tmp", "--foreground"], "does not exist"),
    (["mount", "/tmp", "/tmp/x", "--endpoint-url", "notaurl"], "http(s)://HOST"),
    (["mount", "/tmp", "/tmp/x", "--endpoint-url", "http://h:port"], "http(s)://HOST"),
    (["mount", "/tmp", "/tmp/x", "--shared-cache", "s3://c", "--shared-cache-endpoint",
      "c:9000"], "--shared-cache-endpoint"),
    (["umount", "/tmp"], "not mounted"),
    (["stats", "/tmp"], "not a NeuralCache mount"),
])
def test_cli_bad_input_is_one_line(argv, word, capsys, tmp_path):
    rc = cli.main(argv + (["--cache-dir", str(tmp_path)] if argv[0] == "mount" else []))
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("\n") == 1 and err.startswith("neuralcache: error:"), err
    assert word in err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["file", "no parent"])
def test_an_unusable_cache_dir_is_one_line(kind, capsys, tmp_path):
    (tmp_path / "mnt").mkdir()
    bad = tmp_path / "afile"
    bad.write_text("x")
    if kind == "no parent":
        bad = bad / "sub"
    for fg in ([], ["--foreground"]):
        rc = cli.main(["mount", "/tmp", str(tmp_path / "mnt"), "--cache-dir", str(bad)] + fg)
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1, err
        assert "cannot use cache directory" in err and "--cache-dir" in err


def test_an_unwritable_log_file_is_one_line_that_does_not_point_at_it(tmp_path):
    """The daemon sets its log up after the fork: a log it cannot open is reported
    through the ready pipe, not as "see <that log>"."""
    import subprocess
    import sys
    (tmp_path / "mnt").mkdir()
    r = subprocess.run([sys.executable, "-m", "neuralcache", "mount", "/tmp",
                        str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c"),
                        "--log-file", "/proc/nope/x.log"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cannot write the log file" in r.stderr and "--log-file" in r.stderr


def test_a_dead_mount_on_the_mountpoint_is_busy_not_missing(monkeypatch, tmp_path):
    """A killed daemon's mount fails stat (ENOTCONN): the mount table says why."""
    from neuralcache import daemon
    from neuralcache.admin import mounts
    gone = tmp_path / "dead"                     # os.path.exists() is False, as there
    monkeypatch.setattr(mounts, "find_mount", lambda p: mounts.MountEntry(
        str(gone), "fuse.neuralcache", "neuralcache"))
    with pytest.raises(UserError) as e:
        daemon.check_mountpoint(str(gone))
    assert "busy" in str(e.value) and "neuralcache umount" in str(e.value)


@pytest.mark.parametrize("argv", [["stats", "/tmp", "--watch", "--interval", "0"],
                                  ["stats", "/tmp", "--interval", "-1"],
                                  ["warm", "/tmp", "-j", "0"]])
def test_numbers_that_must_be_positive_are_checked_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "invalid positive" in capsys.readouterr().err


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["mount", "--help"])
    out = capsys.readouterr().out
    for flag in ("--cache-dir", "--cache-size", "--memory-cache-size", "--endpoint-url",
                 "--region", "--metadata-ttl", "--allow-other", "--foreground", "-o"):
        assert flag in out


def test_the_cli_starts_without_the_daemon_s_imports():
    """`neuralcache mount` forks its daemon from the CLI process: that process must not
    have started a thread (numpy's BLAS pool) nor paid for pyfuse3/boto3 (0.5 s of
    every command), and the control directory's name it uses is the one served."""
    import subprocess
    import sys

    from neuralcache.admin.mounts import CONTROL_DIR
    from neuralcache.fs.control import DIRNAME

    assert CONTROL_DIR == DIRNAME
    code = ("import os, sys; from neuralcache.admin import cli; cli.build_parser(); "
            "print(len(os.listdir('/proc/self/task')), "
            "sorted(m for m in ('numpy', 'pyfuse3', 'boto3', 'botocore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=1)
    assert out == ["1", "[]\n"], out


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["stats", "--help"]])
def test_help_into_a_closed_pipe_exits_1_without_a_traceback(args):
    """`neuralcache --help | true`: argparse writes the text itself, into a pipe whose
    reader is gone (review: a BrokenPipeError traceback, or exit 120 with "Exception
    ignored"); and a usage error still exits 2."""
    import os
    import subprocess
    from conftest import NEURALCACHE
    p = subprocess.Popen(NEURALCACHE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 1 and "Traceback" not in err and "Exception" not in err
    bad = subprocess.run(NEURALCACHE + ["stats"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage:" in bad.stderr
