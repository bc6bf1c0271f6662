"""The trio-thread GET path (neuralcache/backends/s3trio.py) against a small HTTP server
of the test's own, for what a real S3 endpoint does only sometimes: a kept-alive
connection dropped, an answer in pieces, chunked or of the wrong length, no answer at
all.  tests/test_backends.py reads real bytes from SeaweedFS through it."""
import functools
import os
import socket
from types import SimpleNamespace

import pytest
import trio

from neuralcache.backends import s3native, s3trio

BODY = os.urandom(5000)
CREDS = SimpleNamespace(access_key="AK", secret_key="SK", token=None)


async def serve(nursery, answer, tls=None, host=None):
    """A server on a free port (TLS with ``tls``, an SSLContext; on every address, or
    ``host`` only): ``answer(request_head, stream, n)`` per request (n: the connection's
    number); returns (port, the connections accepted so far)."""
    accepted = []

    async def handle(stream):
        accepted.append(stream)
        n, buf = len(accepted), b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                if not await answer(head.decode(), stream, n):
                    await stream.aclose()
                    return
        except trio.BrokenResourceError:
            return
    if tls is None:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0,
                                                          host=host))
        return listeners[0].socket.getsockname()[1], accepted
    listeners = await nursery.start(trio.serve_ssl_over_tcp, handle, 0, tls)
    return listeners[0].transport_listener.socket.getsockname()[1], accepted


def ok_answer(head: str) -> bytes:
    rng = next(line for line in head.split("\r\n") if line.startswith("Range:"))
    a, b = (int(x) for x in rng.split("=")[1].split("-"))
    body = BODY[a:b + 1]
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + body


async def answer_ok(head, stream, n):
    """Every request answered with its range of BODY, the connection kept."""
    await stream.send_all(ok_answer(head))
    return True


def fake_lookups(monkeypatch, answers: dict) -> None:
    """trio.socket.getaddrinfo answers ``answers[host]`` (IPv4 addresses; the dict may
    change later) for a host in it, the real lookup for any other."""
    real = trio.socket.getaddrinfo

    async def fake(host, port, *a, **kw):
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                    for ip in answers[host]]
        return await real(host, port, *a, **kw)
    monkeypatch.setattr(trio.socket, "getaddrinfo", fake)


def run(answer, reads, tls=None):
    """``reads(gets, url)`` inside trio with a server answering by ``answer``."""
    out = {}

    async def main():
        async with trio.open_nursery() as n:
            port, accepted = await serve(n, answer, tls)
            gets = s3trio.TrioGets(on_retry=lambda: out.__setitem__(
                "retries", out.get("retries", 0) + 1))
            url = f"http://127.0.0.1:{port}" if tls is None else f"https://localhost:{port}"
            out["result"] = await reads(gets, url + "/bucket/k%20ey")
            out["accepted"] = len(accepted)
            out["gets"] = gets
            gets.close()
            n.cancel_scope.cancel()
    trio.run(main)
    return out


async def read(gets, url, off=0, length=100, version="v1"):
    return await gets.read(CREDS, "us-east-1", url, off, length, version)


def test_the_request_and_a_kept_alive_connection():
    seen = []

    async def answer(head, stream, n):
        seen.append(head)
        await stream.send_all(ok_answer(head))
        return True

    async def reads(gets, url):
        return [await read(gets, url, 0, 100), await read(gets, url, 100, 4900)]
    out = run(answer, reads)
    assert out["result"] == [BODY[:100], BODY[100:]]
    assert out["accepted"] == 1                        # the second GET reused it
    first = seen[0].split("\r\n")
    assert first[0] == "GET /bucket/k%20ey HTTP/1.1"
    assert "Range: bytes=0-99" in first and 'If-Match: "v1"' in first
    auth = next(x for x in first if x.startswith("Authorization:"))
    assert "Credential=AK/" in auth and "/us-east-1/s3/aws4_request" in auth
    assert "SignedHeaders=host;x-amz-content-sha256;x-amz-date," in auth


def test_https_with_the_ca_bundle(tmp_path, monkeypatch):
    """Over TLS (the certificate checked against AWS_CA_BUNDLE, as on the urllib3 path):
    the bytes, a kept-alive connection; a certificate the bundle does not vouch for is
    a failure left to the thread path."""
    import shutil
    import ssl
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                    "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)

    async def answer(head, stream, n):
        await stream.send_all(ok_answer(head))
        return True

    async def reads(gets, url):
        return [await read(gets, url, 0, 3000), await read(gets, url, 3000, 2000)]
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    out = run(answer, reads, tls=server)
    assert out["result"] == [BODY[:3000], BODY[3000:]] and out["accepted"] == 1
    other = tmp_path / "other.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                    "2", "-subj", "/CN=localhost", "-keyout", str(tmp_path / "k2.pem"),
                    "-out", str(other)], check=True, capture_output=True)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(other))
    assert run(answer, read, tls=server)["result"] is s3trio.FAILED


def test_a_dropped_keep_alive_connection_is_replaced():
    async def answer(head, stream, n):
        await stream.send_all(ok_answer(head))
        return False                                   # closes after each answer

    async def reads(gets, url):
        return [await read(gets, url, 0, 100), await read(gets, url, 0, 200)]
    out = run(answer, reads)
    assert out["result"] == [BODY[:100], BODY[:200]]
    assert out["accepted"] == 2 and out["gets"].used == 2 and out["gets"]._fails == 0
    assert out["retries"] == 1     # sent again: the backend's retries count it (a reset
                                   # on a link shows there, not only a server's close)


def test_an_answer_in_one_byte_pieces():
    async def answer(head, stream, n):
        for b in ok_answer(head):
            await stream.send_all(bytes([b]))
        return True

    out = run(answer, lambda gets, url: read(gets, url, 7, 300))
    assert out["result"] == BODY[7:307]


@pytest.mark.parametrize("reply,expect", [
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", None),
    (b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n", None),
    (b"HTTP/1.1 206 Partial\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" + BODY[:100]
     + b"\r\n0\r\n\r\n", None),
    (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", None),
    (b"HTTP/1.1 206 Partial\r\nContent-Length: 99\r\n\r\n" + BODY[:99], s3trio.FAILED),
    (b"HTTP/1.1 206 Partial\r\nContent-Length: 100\r\n\r\n" + BODY[:50], s3trio.FAILED),
    (b"garbage\r\n\r\n", s3trio.FAILED),
])
def test_answers_left_to_the_thread_path(reply, expect):
    """The object's own answer (404, 412) is None, not a failure; another answer this
    path does not take (chunked, 403) is None and a failure toward its rest; a wrong
    length or a cut answer is FAILED (a transport failure, counted as a retry)."""
    async def answer(head, stream, n):
        await stream.send_all(reply)
        return False

    out = run(answer, read)
    assert out["result"] is expect
    assert out["gets"]._fails == (0 if b" 404 " in reply or b" 412 " in reply else 1)
    assert out["gets"].fell_back == 1


def test_no_answer_times_out_and_the_path_rests(monkeypatch):
    monkeypatch.setattr(s3trio, "TIMEOUT_S", 0.2)

    async def answer(head, stream, n):
        await trio.sleep_forever()

    async def reads(gets, url):
        got = [await read(gets, url) for _ in range(s3native.FAILS_BEFORE_PAUSE + 1)]
        return got, gets.resting()
    out = run(answer, reads)
    got, resting = out["result"]
    assert got == [s3trio.FAILED] * s3native.FAILS_BEFORE_PAUSE + [None]
    assert resting and out["accepted"] == s3native.FAILS_BEFORE_PAUSE


def test_an_old_idle_connection_is_not_reused(monkeypatch):
    monkeypatch.setattr(s3trio, "IDLE_MAX_S", 0.0)

    async def answer(head, stream, n):
        await stream.send_all(ok_answer(head))
        return True

    async def reads(gets, url):
        return [await read(gets, url), await read(gets, url)]
    out = run(answer, reads)
    assert out["result"] == [BODY[:100]] * 2 and out["accepted"] == 2


def test_an_origin_no_longer_asked_has_its_idle_connections_closed(monkeypatch):
    """After a region switch no GET goes to the old origin again: its idle connections
    are closed once they are IDLE_MAX_S old, by a GET to another origin."""
    monkeypatch.setattr(s3trio, "IDLE_MAX_S", 0.05)

    async def answer(head, stream, n):
        await stream.send_all(ok_answer(head))
        return True

    async def main():
        async with trio.open_nursery() as n:
            (port_a, _), (port_b, _) = await serve(n, answer), await serve(n, answer)
            gets = s3trio.TrioGets()
            assert await read(gets, f"http://127.0.0.1:{port_a}/bucket/k") == BODY[:100]
            (old,) = gets._idle[("http", "127.0.0.1", port_a)]
            await trio.sleep(0.1)
            assert await read(gets, f"http://127.0.0.1:{port_b}/bucket/k") == BODY[:100]
            assert not gets._idle[("http", "127.0.0.1", port_a)]
            assert old.sock.fileno() == -1                       # closed
            assert len(gets._idle[("http", "127.0.0.1", port_b)]) == 1
            gets.close()
            n.cancel_scope.cancel()
    trio.run(main)


def test_warmed_connections_serve_the_first_gets_without_a_handshake():
    """warm(url, n) opens n connections (no request on them) and keeps them idle: the
    next n GETs at once open none; an origin that refuses is 0 warmed, no error."""
    async def main():
        async with trio.open_nursery() as n:
            port, accepted = await serve(n, answer_ok)
            gets = s3trio.TrioGets()
            url = f"http://127.0.0.1:{port}/bucket/k"
            assert await gets.warm(f"http://127.0.0.1:{port}/bucket", 4) == 4
            await trio.sleep(0.05)
            assert len(accepted) == 4
            got = []

            async def one(off):
                got.append((off, await read(gets, url, off, 10)))
            async with trio.open_nursery() as readers:
                for off in range(0, 40, 10):
                    readers.start_soon(one, off)
            assert sorted(got) == [(off, BODY[off:off + 10]) for off in range(0, 40, 10)]
            assert len(accepted) == 4                     # no connection opened for them
            with trio.socket.socket() as s:               # a port nobody listens on
                await s.bind(("127.0.0.1", 0))
                closed = s.getsockname()[1]
            assert await gets.warm(f"http://127.0.0.1:{closed}", 3) == 0
            gets.close()
            n.cancel_scope.cancel()
    trio.run(main)


def test_a_name_is_looked_up_once_per_ttl_and_its_addresses_taken_in_turn(monkeypatch):
    """New connections share one lookup of the host name per DNS_TTL_S (a lookup each
    was a worker thread and a DNS query) and take its addresses in turn; an address
    that refuses drops the entry and the connection is made by name."""
    answer_with = {"localhost": ["127.0.0.1", "127.0.0.2"]}
    fake_lookups(monkeypatch, answer_with)

    async def main():
        async with trio.open_nursery() as n:
            port, accepted = await serve(n, answer_ok)
            gets = s3trio.TrioGets()
            url = f"http://localhost:{port}/bucket"
            assert await gets.warm(url, 4) == 4 and gets.lookups == 1   # one for four
            await trio.sleep(0.05)
            assert sorted(s.socket.getsockname()[0] for s in accepted) == \
                ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"]     # in turn
            assert await read(gets, url + "/k") == BODY[:100]
            monkeypatch.setattr(s3trio, "DNS_TTL_S", 0.0)
            gets._addrs[("localhost", port)][0] = 0.0          # the entry expired
            for _ in range(2):
                assert await gets.warm(url, 1) == 1
            assert gets.lookups == 3                 # past the TTL: looked up again
            gets.close()
            # only 127.0.0.1 listens: the name's 127.0.0.2 refuses and leaves the
            # entry, that connection is made by name; the next ones take 127.0.0.1
            monkeypatch.setattr(s3trio, "DNS_TTL_S", 30.0)
            port1, accepted1 = await serve(n, answer_ok, host="127.0.0.1")
            gets = s3trio.TrioGets()
            answer_with["localhost"] = ["127.0.0.2", "127.0.0.1"]
            url1 = f"http://localhost:{port1}/bucket"
            assert await gets.warm(url1, 1) == 1     # refused, then made by name
            assert gets._addrs[("localhost", port1)][1] == ["127.0.0.1"]
            assert await gets.warm(url1, 3) == 3 and gets.lookups == 1
            answer_with["localhost"] = ["127.0.0.2"]
            gets._addrs[("localhost", port1)][0] = 0.0           # expired
            assert await gets.warm(url1, 1) == 1     # the last address gone: no entry
            assert ("localhost", port1) not in gets._addrs and gets.lookups == 2
            await trio.sleep(0.05)
            assert len(accepted1) == 5
            gets.close()
            n.cancel_scope.cancel()
    trio.run(main)


def test_an_address_that_does_not_answer_leaves_the_rotation(monkeypatch):
    """A name's address whose SYNs go unanswered (here: a listener whose accept queue is
    full) costs one connection DIRECT_CONNECT_S, then that connection is made by name
    and the address is not taken again."""
    monkeypatch.setattr(s3trio, "DIRECT_CONNECT_S", 0.2)
    fake_lookups(monkeypatch, {"localhost": ["127.0.0.2", "127.0.0.1"]})

    async def main():
        async with trio.open_nursery() as n:
            port, accepted = await serve(n, answer_ok, host="127.0.0.1")
            stuck = socket.socket()
            stuck.bind(("127.0.0.2", port))
            stuck.listen(0)
            fill = []
            for _ in range(3):                       # the accept queue, full
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex(("127.0.0.2", port))
                fill.append(c)
            try:
                gets = s3trio.TrioGets()
                t0 = trio.current_time()
                assert await gets.warm(f"http://localhost:{port}/bucket", 1) == 1
                assert trio.current_time() - t0 < 2.0
                assert gets._addrs[("localhost", port)][1] == ["127.0.0.1"]
                t0 = trio.current_time()
                assert await gets.warm(f"http://localhost:{port}/bucket", 3) == 3
                assert trio.current_time() - t0 < 0.15   # no wait on the dead address
                assert await read(gets, f"http://localhost:{port}/bucket/k") == BODY[:100]
                gets.close()
            finally:
                for c in fill + [stuck]:
                    c.close()
            n.cancel_scope.cancel()
    trio.run(main)


def test_a_failed_lookup_fails_everyone_waiting_on_it_at_once(monkeypatch):
    """Connections waiting on one lookup of a name all fail when it fails, together,
    not one lookup after another."""
    calls = []

    async def fake(host, port, *a, **kw):
        calls.append(host)
        await trio.sleep(0.2)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(trio.socket, "getaddrinfo", fake)

    async def main():
        gets = s3trio.TrioGets()
        t0 = trio.current_time()
        assert await gets.warm("http://nowhere.invalid:80/bucket", 8) == 0
        assert trio.current_time() - t0 < 0.6 and calls == ["nowhere.invalid"]
        assert await read(gets, "http://nowhere.invalid:80/bucket/k") is s3trio.FAILED
        assert len(calls) == 2                           # no entry: looked up again
    trio.run(main)


def test_signature_matches_botocore():
    """The same GET signed by botocore's S3SigV4Auth (unsigned payload, same headers,
    same instant) carries the same signature."""
    import datetime as dt
    from unittest import mock

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials

    now = dt.datetime(2026, 12, 6, 12, 0, 0, tzinfo=dt.timezone.utc)
    for token in (None, "TOKEN/+="):
        creds = SimpleNamespace(access_key="AKIDEXAMPLE", secret_key="SECRET", token=token)
        ours = s3trio.Signer().headers(creds, "eu-west-1", "h.example:9000",
                                       "/b/a%20b/c.bin", now)
        ours = dict(line.split(": ", 1) for line in ours.strip().split("\r\n"))
        req = AWSRequest(method="GET", url="https://h.example:9000/b/a%20b/c.bin")
        req.context["client_config"] = Config(s3={"payload_signing_enabled": False})
        with mock.patch("botocore.auth.get_current_datetime",
                        return_value=now.replace(tzinfo=None)):
            S3SigV4Auth(Credentials("AKIDEXAMPLE", "SECRET", token), "s3",
                        "eu-west-1").add_auth(req)
        assert req.headers["X-Amz-Date"] == ours["x-amz-date"]
        assert req.headers["Authorization"] == ours["Authorization"]


@pytest.mark.parametrize("head", ["HTTP/1.1 206 Partial\r\nConnection: close",
                                  "HTTP/1.0 206 Partial"])
def test_an_answer_that_closes_is_not_reused(head):
    async def answer(req, stream, n):
        body = ok_answer(req).split(b"\r\n\r\n", 1)[1]
        await stream.send_all(f"{head}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                              + body)
        return True

    async def reads(gets, url):
        return [await read(gets, url, 0, 100), await read(gets, url, 100, 100)]
    out = run(answer, reads)
    assert out["result"] == [BODY[:100], BODY[100:200]] and out["accepted"] == 2


def test_a_large_answer_is_a_view_a_small_or_long_headed_one_a_copy():
    """A body of VIEW_MIN or more is handed on as a view of its buffer (no copy); a
    smaller one, or one whose long head made the buffer grow, as bytes (the memory
    tier counts only the body's length)."""
    big = os.urandom(100_000)
    heads = iter(["", "x-amz-meta-note: " + "v" * 3000 + "\r\n", ""])

    async def answer(head, stream, n):
        rng = next(line for line in head.split("\r\n") if line.startswith("Range:"))
        a, b = (int(x) for x in rng.split("=")[1].split("-"))
        await stream.send_all((f"HTTP/1.1 206 Partial Content\r\n{next(heads)}"
                               f"Content-Length: {b + 1 - a}\r\n\r\n").encode()
                              + big[a:b + 1])
        return True

    async def reads(gets, url):
        return [await read(gets, url, 0, 100_000), await read(gets, url, 0, 100_000),
                await read(gets, url, 5, s3trio.VIEW_MIN - 1)]
    out = run(answer, reads)
    view, grown, small = out["result"]
    assert view == big and type(view) is memoryview and view.nbytes == 100_000
    assert grown == big and type(grown) is bytes
    assert small == big[5:5 + s3trio.VIEW_MIN - 1] and type(small) is bytes


def test_a_long_head_content_encoding_and_the_host_header():
    """A head longer than the buffer's slack; Content-Encoding is the object's own
    metadata (S3 answers the stored bytes); Host carries no default port."""
    seen = []

    async def answer(req, stream, n):
        seen.append(req)
        head, body = ok_answer(req).split(b"\r\n\r\n", 1)
        await stream.send_all(head + b"\r\nContent-Encoding: gzip\r\nx-amz-meta-pad: "
                              + b"p" * 3000 + b"\r\n\r\n" + body)
        return True

    out = run(answer, lambda gets, url: read(gets, url, 10, 50))
    assert out["result"] == BODY[10:60]
    assert "Host: 127.0.0.1:" in seen[0]
    gets = s3trio.TrioGets()

    async def host_of(url):
        with trio.move_on_after(0.01):          # (only the parsed origin is wanted)
            await read(gets, url)
        return gets._origins[url.rsplit("/", 2)[0]][1]
    assert trio.run(host_of, "http://h.invalid:80/b/k") == "h.invalid"
    assert trio.run(host_of, "https://h.invalid:443/b/k") == "h.invalid"
    assert trio.run(host_of, "http://h.invalid:9000/b/k") == "h.invalid:9000"


def test_a_range_answered_whole_is_not_taken_past_offset_0():
    async def answer(req, stream, n):
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
                              + BODY[:100])
        return True

    async def reads(gets, url):
        return [await read(gets, url, 0, 100), await read(gets, url, 1000, 100)]
    out = run(answer, reads)
    assert out["result"] == [BODY[:100], None] and out["gets"]._fails == 1


def test_a_416_is_the_objects_answer():
    async def answer(req, stream, n):
        await stream.send_all(b"HTTP/1.1 416 Range Not Satisfiable\r\n"
                              b"Content-Length: 0\r\n\r\n")
        return True

    out = run(answer, read)
    assert out["result"] is None and out["gets"]._fails == 0


def test_a_slow_answer_that_keeps_moving_is_not_cut_off(monkeypatch):
    """TIMEOUT_S bounds the time without a byte, not the whole answer."""
    monkeypatch.setattr(s3trio, "TIMEOUT_S", 0.3)

    async def answer(req, stream, n):
        whole = ok_answer(req)
        for i in range(0, len(whole), len(whole) // 8 + 1):
            await stream.send_all(whole[i:i + len(whole) // 8 + 1])
            await trio.sleep(0.1)
        return True

    out = run(answer, lambda gets, url: read(gets, url, 0, 4000))
    assert out["result"] == BODY[:4000]


def test_cancelled_mid_answer_the_connection_is_closed_not_pooled():
    """A reader that stops waiting (a hedge answered, the unmount) in the middle of a
    body: the connection, with unread bytes in it, must not serve the next GET."""
    async def answer(req, stream, n):
        whole = ok_answer(req)
        await stream.send_all(whole[:len(whole) // 2])
        await trio.sleep(0.3)
        await stream.send_all(whole[len(whole) // 2:])
        return True

    async def reads(gets, url):
        with trio.move_on_after(0.1):
            await read(gets, url, 0, 4000)
        return await read(gets, url, 4000, 1000)
    out = run(answer, reads)
    assert out["result"] == BODY[4000:] and out["accepted"] == 2
