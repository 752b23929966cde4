"""Fixtures for remote tests: servers on 127.0.0.1, started and stopped here."""

from __future__ import annotations

import os

import pytest

from tests.remote.remote_servers import moto_environment


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


@pytest.fixture
def s3_server(moto_s3_server, monkeypatch) -> str:
    """The session's moto S3 server on 127.0.0.1 (tests/conftest.py), with
    throwaway credentials in the environment (the standard boto3
    configuration path) for this test's duration; returns its URL."""
    host, port = moto_s3_server
    for name, value in moto_environment(host, port).items():
        monkeypatch.setenv(name, value)
    return f"http://{host}:{port}"


@pytest.fixture
def s3_options(s3_server):
    from shardkit.io.base import SourceOptions

    return SourceOptions(
        part_bytes=128 << 10,
        chunk_bytes=64 << 10,
        retry_deadline_s=3.0,
        backoff_initial_s=0.01,
        backoff_max_s=0.1,
    )


_bucket_numbers = __import__("itertools").count()


@pytest.fixture
def s3_bucket(s3_server, request):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    import re

    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"shardkit-{next(_bucket_numbers)}-{name}"[:63].rstrip("-")
    client.create_bucket(Bucket=bucket)
    yield client, bucket
