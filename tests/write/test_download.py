"""The URL downloader against real servers on 127.0.0.1 with faults injected
(and moto for s3://): order, failure reasons, limits, politeness, secrets."""

from __future__ import annotations

import dataclasses

import logging
import socket
import threading
import time

import pytest

from shardkit.errors import UsageError
from shardkit.write.download import Downloader, DownloadOptions
from shardkit.write.manners import default_user_agent, opted_out
from tests.remote.remote_servers import without_aws_credentials
from tests.write.url_servers import Answer, ScriptedServer, server  # noqa: F401  (a fixture)

#: Quick to give up: tiny timeouts and backoff, so every fault ends within a test's time.
FAST = dict(connect_timeout_s=10.0, read_timeout_s=0.3, fetch_deadline_s=0.6, backoff_initial_s=0.01, backoff_max_s=0.05)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_results_come_in_input_order_when_the_first_url_finishes_last(server):
    first_may_answer = threading.Event()
    urls = [server.serve("/0", Answer(body=b"zero", hold_until=first_may_answer))]
    urls += [server.serve(f"/{i}", Answer(body=f"body {i}".encode())) for i in range(1, 12)]

    def release_when_others_served():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(server.hits(f"/{i}") for i in range(1, 6)) < 5:
            time.sleep(0.005)
        first_may_answer.set()

    releaser = threading.Thread(target=release_when_others_served)
    releaser.start()
    with Downloader(DownloadOptions(num_threads=4, **FAST)) as downloader:
        results = list(downloader.fetch_all(urls))
    releaser.join()
    assert [r.data for r in results] == [b"zero"] + [f"body {i}".encode() for i in range(1, 12)]
    assert all(r.ok and r.status == 200 and r.url == u for r, u in zip(results, urls))


def test_each_failure_is_a_result_with_its_reason(server):
    big = b"x" * 5000
    urls = {
        "ok": server.serve("/ok", Answer(body=b"fine")),
        "missing": server.serve("/missing", Answer(404, b"not here")),
        "empty": "",
        "not a url": "images/0001.jpg",
        "ftp": "ftp://127.0.0.1/a.jpg",
        "no host": "http:///a.jpg",
        "bad port": "http://127.0.0.1:99999999/a.jpg",
        "bad ipv6": "http://[::1/a.jpg",
        "control character": "http://127.0.0.1:1/a\r\nHost: evil.jpg",
        "space": server.serve("/a%20b.jpg", Answer(body=b"spaced")).replace("%20", " "),
        "loop": server.serve("/loop-a", Answer(302, headers={"Location": "/loop-b"})),
        "chain": server.serve("/hop0", Answer(302, headers={"Location": "/hop1"})),
        "to ftp": server.serve("/to-ftp", Answer(301, headers={"Location": "ftp://example.com/x"})),
        "noai": server.serve("/noai", Answer(body=b"secret art", headers={"X-Robots-Tag": "noindex, noai"})),
        "noimageai for us": server.serve("/ours", Answer(body=b"b", headers={"X-Robots-Tag": "shardkit: noimageai"})),
        "noai for another bot": server.serve("/other", Answer(body=b"kept", headers={"X-Robots-Tag": "otherbot: noai"})),
        "flaky": server.serve("/flaky", Answer(503), Answer(body=b"second time")),
        "always 500": server.serve("/500", Answer(500)),
        "wait an hour": server.serve("/429", Answer(429, headers={"Retry-After": "3600"})),
        "refused": f"http://127.0.0.1:{_closed_port()}/a.jpg",
        "hangs": server.serve("/hang", Answer(body=b"late", hold_s=10)),
        "trickles": server.serve("/trickle", Answer(body=b"y" * 200, trickle_s=0.05)),
        "too large": server.serve("/big", Answer(body=big)),
        "no body": server.serve("/nobody", Answer(body=b"")),
    }
    server.serve("/loop-b", Answer(302, headers={"Location": "/loop-a"}))
    for i in range(1, 8):
        server.serve(f"/hop{i}", Answer(302, headers={"Location": f"/hop{i + 1}"}))
    options = DownloadOptions(num_threads=8, max_attempts=2, max_redirects=3, max_bytes=4096, **FAST)
    started = time.monotonic()
    with Downloader(options) as downloader:
        results = dict(zip(urls, downloader.fetch_all(urls.values())))
    elapsed = time.monotonic() - started
    reasons = {name: r.reason for name, r in results.items()}
    assert reasons == {
        "ok": None,
        "missing": "http_404",
        "empty": "bad_url",
        "not a url": "bad_url",
        "ftp": "bad_url",
        "no host": "bad_url",
        "bad port": "bad_url",
        "bad ipv6": "bad_url",
        "control character": "bad_url",
        "space": None,  # sent as %20
        "loop": "redirect_loop",
        "chain": "too_many_redirects",
        "to ftp": "bad_redirect",
        "noai": "opt_out",
        "noimageai for us": "opt_out",
        "noai for another bot": None,
        "flaky": None,
        "always 500": "http_500",
        "wait an hour": "http_429",
        "refused": "connection",
        "hangs": "timeout",
        "trickles": "timeout",
        "too large": "too_large",
        "no body": "empty",
    }
    assert results["flaky"].data == b"second time" and server.hits("/flaky") == 2
    assert server.hits("/500") == 2  # max_attempts
    assert server.hits("/429") == 1  # an hour's Retry-After is not waited for
    assert "3600" in results["wait an hour"].detail and results["wait an hour"].status == 429
    assert results["missing"].status == 404 and results["missing"].data is None
    assert results["noai"].data is None and "noai" in results["noai"].detail
    assert "images/0001.jpg" in results["not a url"].detail
    # Bounded by the timeouts: two attempts of a hang at 0.3 s read timeout, not its 10 s.
    assert elapsed < 8


def test_opt_out_is_stored_when_turned_off(server):
    url = server.serve("/noai", Answer(body=b"art", headers={"X-Robots-Tag": "noai"}))
    with Downloader(DownloadOptions(respect_opt_out=False, **FAST)) as downloader:
        assert downloader.fetch(url).data == b"art"
    assert opted_out(["NoImageAI"]) and not opted_out(["noindex, nofollow"]) and not opted_out([])


def test_retry_after_is_honoured_within_its_bound(server):
    url = server.serve("/busy", Answer(429, headers={"Retry-After": "0.3"}), Answer(body=b"now"))
    with Downloader(DownloadOptions(**FAST)) as downloader:
        started = time.monotonic()
        fetched = downloader.fetch(url)
        waited = time.monotonic() - started
    assert fetched.data == b"now" and waited >= 0.3  # not the 0.01 s backoff


def test_user_agent_names_shardkit(server):
    url = server.serve("/ua", Answer(body=b"x"))
    with Downloader(DownloadOptions(user_agent_contact="mailto:data@example.org", **FAST)) as downloader:
        downloader.fetch(url)
    agent = server.requests[0][1]["User-Agent"]
    assert agent.startswith("shardkit/") and agent.endswith("(+mailto:data@example.org)")
    assert default_user_agent() == agent.split(" ")[0]


def test_connections_per_host_are_capped(server):
    urls = [server.serve(f"/slow{i}", Answer(body=b"s", hold_s=0.05)) for i in range(8)]
    with Downloader(DownloadOptions(num_threads=8, max_connections_per_host=2, **FAST)) as downloader:
        assert all(r.ok for r in downloader.fetch_all(urls))
    assert server.most_in_flight == 2
    server.most_in_flight = 0
    with Downloader(DownloadOptions(num_threads=8, max_connections_per_host=8, **FAST)) as downloader:
        assert all(r.ok for r in downloader.fetch_all(urls))
    assert server.most_in_flight > 2  # the cap, not the thread pool, held it at 2


def test_credentials_go_to_their_origin_only_and_are_never_reported(server, caplog):
    other = ScriptedServer()
    try:
        elsewhere = other.serve("/img", Answer(body=b"cdn"))
        url = server.serve("/start", Answer(302, headers={"Location": elsewhere}))
        secret_url = url.replace("http://", "http://alice:hunter2@") + "?sig=TOPSECRET"
        missing = server.serve("/gone", Answer(410)).replace("http://", "http://alice:hunter2@") + "?sig=TOPSECRET"
        with caplog.at_level(logging.DEBUG), Downloader(DownloadOptions(**FAST)) as downloader:
            fetched = downloader.fetch(secret_url)
            failed = downloader.fetch(missing)
        assert fetched.data == b"cdn" and fetched.final_url == elsewhere
        assert "Authorization" in server.requests[0][1]
        assert "Authorization" not in other.requests[0][1]
        assert failed.reason == "http_410"
        shown = f"{fetched} {failed} {caplog.text}"
        assert "hunter2" not in shown and "alice" not in shown
        assert "TOPSECRET" not in failed.detail and "TOPSECRET" not in caplog.text
    finally:
        other.close()


def test_close_ends_waits_at_once(server):
    url = server.serve("/busy", Answer(503, headers={"Retry-After": "20"}))
    downloader = Downloader(DownloadOptions(max_retry_after_s=30, **FAST))
    results = []
    worker = threading.Thread(target=lambda: results.append(downloader.fetch(url)))
    worker.start()
    deadline = time.monotonic() + 5
    while server.hits("/busy") == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    started = time.monotonic()
    downloader.close()
    worker.join(timeout=5)
    assert results and results[0].reason == "cancelled" and time.monotonic() - started < 2


def test_options_are_checked():
    with pytest.raises(UsageError, match="num_threads"):
        DownloadOptions(num_threads=0)
    with pytest.raises(UsageError, match="read_timeout_s"):
        DownloadOptions(read_timeout_s=0)


def test_s3_urls_are_read_through_the_s3_source(s3_bucket, s3_server):
    client, bucket = s3_bucket
    client.put_object(Bucket=bucket, Key="imgs/a.jpg", Body=b"jpeg bytes")
    options = DownloadOptions(s3_endpoint_url=s3_server, **FAST)
    with Downloader(options) as downloader:
        found, missing, no_bucket = downloader.fetch_all(
            [f"s3://{bucket}/imgs/a.jpg", f"s3://{bucket}/imgs/missing.jpg", "s3:///key"]
        )
    assert found.ok and found.data == b"jpeg bytes" and found.status == 200
    assert missing.reason == "http_404" and missing.data is None
    assert no_bucket.reason == "bad_url"


def test_s3_urls_of_a_public_bucket_are_read_unsigned(s3_bucket, s3_server, monkeypatch, tmp_path):
    from shardkit.write.parallel import WriteOptions
    from shardkit.write.sources.table import ingest_options

    client, bucket = s3_bucket
    client.put_object(Bucket=bucket, Key="imgs/a.jpg", Body=b"public jpeg", ACL="public-read")
    without_aws_credentials(monkeypatch, tmp_path)
    url = f"s3://{bucket}/imgs/a.jpg"
    # As `shardkit write --s3-anonymous` makes them.
    anonymous = ingest_options(WriteOptions(s3_anonymous=True, read_timeout_s=3.0)).download
    with Downloader(dataclasses.replace(anonymous, s3_endpoint_url=s3_server, **FAST)) as downloader:
        (found,) = downloader.fetch_all([url])
    assert found.ok and found.data == b"public jpeg"
    signed = DownloadOptions(s3_endpoint_url=s3_server, **{**FAST, "connect_timeout_s": 10.5})  # a client of its own
    with Downloader(signed) as downloader:
        (refused,) = downloader.fetch_all([url])
    assert not refused.ok and refused.data is None and "s3_anonymous" in refused.detail


from tests.remote.conftest import s3_bucket, s3_server  # noqa: E402,F401  (moto fixtures)
