"""bench_ingest's URL servers, through the Python server (the emulation needs
root and a network namespace): every kind of URL gives its fault, and
nothing is left listening afterwards."""

from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request

import pytest

from bench.ingest_servers import HTML_PAGE, URLServers, nginx_site_conf, write_site


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], b""


def test_each_kind_of_url_gives_its_fault_and_close_stops_all(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    photo = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 300 + b"\xff\xd9"
    (images / "000000.jpg").write_bytes(photo)
    site = write_site(str(tmp_path), str(images), html_rows=[2])

    with URLServers(site, per_connection_mbps=50, emulation=False) as servers:
        assert servers.describe()["kind"] == "python"
        assert get(servers.url("ok", 0)) == (200, "image/jpeg", photo)
        assert get(servers.url("html", 2)) == (200, "image/jpeg", HTML_PAGE)
        assert get(servers.url("missing", 1))[0] == 404
        assert servers.measure_per_connection([servers.url("ok", 0)]) > 0

        hang = urllib.parse.urlsplit(servers.url("hang", 3))
        for _ in range(2):  # before and after renew(): same port, connect works, no answer comes
            with socket.create_connection((hang.hostname, hang.port), timeout=0.2) as client:
                client.sendall(f"GET {hang.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                with pytest.raises(TimeoutError):
                    client.recv(1)
            servers.renew()
        fallback = servers.fallback
        assert fallback is not None

    assert fallback.poll() is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((hang.hostname, hang.port), timeout=1).close()


def test_nginx_conf_paces_jpg_answers_from_the_first_byte():
    conf = nginx_site_conf(20_000_000)
    assert "types { image/jpeg jpg; }" in conf
    # 2 ms of the cap per write: nginx waits 40000 * 1000 / 20e6 = 2 ms after each.
    assert "limit_rate 20000000; sendfile_max_chunk 40000;" in conf
