"""Fixtures for remote tests: servers on 127.0.0.1, started and stopped here."""

from __future__ import annotations

import os

import pytest

from remote_servers import FaultyHTTPServer


@pytest.fixture
def http_server():
    server = FaultyHTTPServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def serve_dataset(http_server):
    """``serve_dataset(manifest)`` publishes a local dataset's files on the HTTP
    server and returns the dataset's base URL."""

    def serve(manifest, prefix: str = "/data") -> str:
        for name in sorted(os.listdir(manifest.location)):
            with open(os.path.join(manifest.location, name), "rb") as f:
                http_server.add(f"{prefix}/{name}", f.read())
        return http_server.base_url + prefix

    return serve
