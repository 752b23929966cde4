"""Secrets stay secret, and data written by others cannot hold a reader up
(issue #26, items 7 and 9).

Real servers on 127.0.0.1: an HTTP server that wants Basic auth, one that
redirects to a second server on another port, one that answers 401/403 or 503
for ever, and moto's S3 server for ``-v``. Whole commands run in a child
process (:func:`tests.hostile.conftest.run_entry`, or ``python -m shardkit``)
so that everything they print is seen.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import shardkit
from shardkit.cli import main, shown
from shardkit.errors import LOCATION_ATTRIBUTES, CorruptShardError, RemoteError, redact_text, redact_url
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source
from shardkit.io.retry import Backoff, TransientFault, stopping_on
from tests.hostile.conftest import ROOT, run_entry
from tests.remote.remote_servers import Faults, FaultyHTTPServer, QuietDisconnects, _Handler, moto_environment
from tests.test_errors import EXAMPLES as ERROR_EXAMPLES

USER, PASSWORD = "al@ice", "pa:ss/w0rd-s3cret"
#: The password as it appears in a URL (percent-encoded), and as sent.
QUOTED_USERINFO = "al%40ice:pa%3Ass%2Fw0rd-s3cret"
SECRETS = (PASSWORD, "pa%3Ass%2Fw0rd-s3cret", "w0rd-s3cret")

FAST = SourceOptions(
    connect_timeout_s=2.0,
    read_timeout_s=2.0,
    retry_deadline_s=5.0,
    backoff_initial_s=0.01,
    backoff_max_s=0.1,
)


def with_userinfo(url: str, userinfo: str = QUOTED_USERINFO) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{userinfo}@{rest}"


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"secret {secret!r} leaked in: {text[:2000]}"


def read_all(url: str, options: SourceOptions = FAST) -> bytes:
    return b"".join(open_source(url, options=options).iter_range(0, None, chunk_bytes=1 << 16))


# ------------------------------------------------------------------ servers


class _AuthHandler(_Handler):
    """The faulty server's handler, behind HTTP Basic auth; records every
    request's Authorization header."""

    def do_GET(self):
        sent = self.headers.get("Authorization")
        with self.server.lock:
            self.server.authorizations.append(sent)
        if sent != self.server.expected:
            body = b"credentials, please"
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="data"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()


class AuthServer(FaultyHTTPServer):
    def __init__(self, user: str, password: str) -> None:
        super().__init__()
        self.RequestHandlerClass = _AuthHandler
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.authorizations: list[str | None] = []


class _RedirectHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        with self.server.lock:
            self.server.seen.append((self.path, self.headers.get("Authorization")))
        target = self.server.target(self.path)
        if target is None:  # served here: hand over to the faulty server's handler
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()


class RedirectServer(QuietDisconnects, ThreadingHTTPServer):
    """Answers every GET with a redirect to ``target(path)``."""

    daemon_threads = True

    def __init__(self, target) -> None:
        super().__init__(("127.0.0.1", 0), _RedirectHandler)
        self.target = target
        self.seen: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def auth_server():
    server = AuthServer(USER, PASSWORD).start()
    try:
        yield server
    finally:
        server.close()


# ------------------------------------------------------------ redaction


@pytest.mark.parametrize(
    "param", ["X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "Signature", "sig", "token"]
)
def test_redaction_drops_signed_query_parameters_and_userinfo(param):
    url = f"https://u:{PASSWORD}@host:8443/a/b.tar?{param}=SECRETVALUE&x=1"
    assert redact_url(url) == "https://host:8443/a/b.tar"
    text = redact_text(f"cannot read {url}: HTTP 403 (also {url}).")
    assert text == "cannot read https://host:8443/a/b.tar: HTTP 403 (also https://host:8443/a/b.tar)."


def test_every_shardkit_error_message_is_redacted_whoever_formats_it():
    error = CorruptShardError(f"http://u:{PASSWORD}@h/x.tar?sig=abc: truncated", path="x")
    assert str(error) == "http://h/x.tar: truncated"
    assert_no_secret(repr(error))


@pytest.mark.parametrize("cls", sorted(ERROR_EXAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_an_error_holds_no_secret_in_its_attributes_repr_or_pickle(cls):
    """Every location attribute (``path``, ``url``, ``first``, ``second``)
    built from a URL with a password and a signature keeps neither."""
    signed = f"http://{QUOTED_USERINFO}@host/x.tar?X-Amz-Signature=SIGSECRET&X-Amz-Security-Token=TOKSECRET"
    args, attributes = ERROR_EXAMPLES[cls]
    located = {k: signed if k in LOCATION_ATTRIBUTES else v for k, v in attributes.items()}
    error = cls(f"cannot read {signed}", **located)
    copy = pickle.loads(pickle.dumps(error))
    for shown_as in (str(error), repr(error), repr(vars(error)), str(pickle.dumps(error)), repr(vars(copy))):
        assert_no_secret(shown_as)
        assert "SIGSECRET" not in shown_as and "TOKSECRET" not in shown_as
    for name in LOCATION_ATTRIBUTES & set(located):
        assert getattr(error, name) == getattr(copy, name) == "http://host/x.tar"
    # Set after construction, too (a reader naming the shard where it is first known).
    error.path = signed
    assert error.path == "http://host/x.tar"
    assert CorruptShardError("x", path="/data/a@b:c/s.tar").path == "/data/a@b:c/s.tar"  # a path stays as it is


# ---------------------------------------------------------------- Basic auth


def test_userinfo_in_an_http_url_is_sent_as_basic_auth(auth_server):
    data = os.urandom(200_000)
    url = auth_server.add("/x.tar", data)
    assert read_all(with_userinfo(url)) == data
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert auth_server.authorizations and set(auth_server.authorizations) == {expected}
    # The userinfo is not part of what was requested.
    assert all("@" not in path and "s3cret" not in path for _, path, _ in auth_server.requests)


def test_a_refused_password_fails_at_once_and_is_not_printed(auth_server):
    url = auth_server.add("/x.tar", b"x" * 1000)
    patient = SourceOptions(retry_deadline_s=120.0)  # the default: a retried 401 would take minutes
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        read_all(with_userinfo(url, "al%40ice:wrong-s3cret"), patient)
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert info.value.status == 401 and "check the user name and password" in message
    assert "wrong-s3cret" not in message and url in message
    assert len(auth_server.authorizations) == 1  # not retried


@pytest.mark.parametrize("status", [401, 403, 404])
def test_statuses_no_retry_can_fix_fail_well_within_the_deadline(http_server, status):
    url = http_server.add("/x.tar", b"x" * 1000)
    http_server.faults["/x.tar"] = Faults(statuses=[status] * 100)
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        read_all(url, SourceOptions(retry_deadline_s=120.0))
    assert time.monotonic() - started < 10
    assert info.value.status == status and not info.value.retryable
    assert any(hint in str(info.value) for hint in ("credentials", "access denied", "check the URL"))
    assert len(http_server.gets("/x.tar")) == 1


def test_reading_a_dataset_behind_basic_auth(make_shards, auth_server):
    manifest = make_shards([3, 2])
    for name in sorted(os.listdir(manifest.location)):
        with open(os.path.join(manifest.location, name), "rb") as f:
            auth_server.add(f"/ds/{name}", f.read())
    url = with_userinfo(auth_server.base_url + "/ds/")
    keys = [s["__key__"] for s in shardkit.ShardDataset(url, shuffle=False, source_options=FAST)]
    assert len(keys) == 5
    assert None not in auth_server.authorizations


def test_a_corrupt_shard_behind_basic_auth_is_reported_without_the_password(make_shards, auth_server):
    manifest = make_shards([3, 2])
    for name in sorted(os.listdir(manifest.location)):
        with open(os.path.join(manifest.location, name), "rb") as f:
            data = f.read()
        if name == os.path.basename(manifest.shards[1].path):
            data = data[:700]  # cut inside a member
        auth_server.add(f"/ds/{name}", data)
    outcome = run_entry("stream", with_userinfo(auth_server.base_url + "/ds/"), timeout_s=120)
    assert outcome.outcome == "error", outcome
    assert "shard-000001.tar" in outcome.message
    assert_no_secret(outcome.message + outcome.child_output)


# ------------------------------------------------------------------ redirects


def test_redirect_within_the_origin_keeps_the_credentials(auth_server):
    data = os.urandom(5000)
    auth_server.add("/real.tar", data)

    class Moved(_AuthHandler):
        def do_GET(self):
            if self.path == "/old.tar":
                with self.server.lock:
                    self.server.authorizations.append(self.headers.get("Authorization"))
                self.send_response(301)
                self.send_header("Location", "/real.tar")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

    auth_server.RequestHandlerClass = Moved
    assert read_all(with_userinfo(auth_server.base_url + "/old.tar")) == data
    assert None not in auth_server.authorizations


def test_cross_origin_redirect_is_refused_unless_allowed_and_never_gets_credentials(http_server):
    data = os.urandom(5000)
    elsewhere = http_server.add("/x.tar", data)
    redirector = RedirectServer(lambda path: elsewhere + "?X-Amz-Signature=SIGSECRET")
    try:
        url = with_userinfo(redirector.base_url + "/x.tar")
        with pytest.raises(RemoteError) as info:
            read_all(url)
        message = str(info.value)
        assert redirector.base_url + "/x.tar" in message and elsewhere in message
        assert "allow_cross_origin_redirects=True" in message
        assert "SIGSECRET" not in message
        assert_no_secret(message)
        assert http_server.requests == []  # the second server was never contacted
        assert redirector.seen and all(auth is not None for _, auth in redirector.seen)

        allowed = SourceOptions(retry_deadline_s=5.0, backoff_initial_s=0.01, allow_cross_origin_redirects=True)
        assert read_all(url, allowed) == data
        assert http_server.gets("/x.tar")
        # Followed, but the Authorization header stayed with the origin it was meant for.
        with http_server.lock:
            paths = [p for _, p, _ in http_server.requests]
        assert all("SIGSECRET" in p for p in paths)  # the Location's own query is sent as given
    finally:
        redirector.close()


def test_cross_origin_redirect_sends_no_authorization_header(auth_server):
    seen: list[str | None] = []

    class Recording(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = b"hello"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    other = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    other.daemon_threads = True
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        target = f"http://127.0.0.1:{other.server_address[1]}/y.tar"

        class Away(_AuthHandler):
            def do_GET(self):
                with self.server.lock:
                    self.server.authorizations.append(self.headers.get("Authorization"))
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

        auth_server.RequestHandlerClass = Away
        allowed = SourceOptions(retry_deadline_s=5.0, backoff_initial_s=0.01, allow_cross_origin_redirects=True)
        assert read_all(with_userinfo(auth_server.base_url + "/x.tar"), allowed) == b"hello"
        assert seen and all(h is None for h in seen)
        assert auth_server.authorizations and None not in auth_server.authorizations
    finally:
        other.shutdown()
        other.server_close()


def test_allow_cross_origin_redirects_must_be_a_bool():
    with pytest.raises(ValueError, match="allow_cross_origin_redirects"):
        SourceOptions(allow_cross_origin_redirects="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------- the command line


def run_cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    child_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "shardkit", *argv], capture_output=True, text=True, timeout=120, cwd=ROOT, env=child_env
    )


def test_write_from_a_url_with_a_password_never_prints_it(auth_server, tmp_path):
    url = with_userinfo(auth_server.base_url + "/x.tar")
    outcome = run_entry("write", url, options={"dest": str(tmp_path / "out")})
    assert outcome.exit_code == 2
    assert "reads local sources only" in outcome.stderr
    assert_no_secret(outcome.stdout + outcome.stderr + outcome.child_output)
    for flags in (["-v"], ["-v", "--debug-wire"]):
        done = run_cli(*flags, "write", url, str(tmp_path / "out2"))
        assert done.returncode == 2 and "Traceback" in done.stderr
        assert_no_secret(done.stdout + done.stderr)


def test_info_over_http_with_a_password_never_prints_it(make_shards, auth_server):
    manifest = make_shards([2])
    for name in sorted(os.listdir(manifest.location)):
        with open(os.path.join(manifest.location, name), "rb") as f:
            auth_server.add(f"/ds/{name}", f.read())
    done = run_cli("-v", "info", with_userinfo(auth_server.base_url + "/ds"))
    assert done.returncode == 0, done.stderr
    assert f"dataset:    {auth_server.base_url}/ds" in done.stdout
    assert_no_secret(done.stdout + done.stderr)
    done = run_cli("-v", "info", with_userinfo(auth_server.base_url + "/missing", "al%40ice:wrong-s3cret"))
    assert done.returncode == 2 and "HTTP 401" in done.stderr
    assert "wrong-s3cret" not in done.stdout + done.stderr


@pytest.fixture(scope="module")
def moto_server():
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield moto_environment(host, port)
    finally:
        server.stop()


def test_verbose_with_an_s3_source_prints_no_credentials(make_shards, moto_server):
    import boto3

    key_id, secret, token = "AKIAVERYSECRETKEYID7", "wJalrSECRETACCESSKEYvalue", "SESSIONTOKENs3cretvalue"
    env = {**moto_server, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": token}
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
    )
    client.create_bucket(Bucket="secrets")
    manifest = make_shards([2, 1])
    for name in sorted(os.listdir(manifest.location)):
        client.upload_file(os.path.join(manifest.location, name), "secrets", f"ds/{name}")
    done = run_cli("-v", "verify", "-q", "s3://secrets/ds", env=env)
    assert done.returncode == 0, done.stderr
    for secret_value in (key_id, secret, token):
        assert secret_value not in done.stdout + done.stderr
    # The switch that shows the wire logs shows the key id (which is why -v leaves them out), and warns.
    done = run_cli("--debug-wire", "verify", "-q", "s3://secrets/ds", env=env)
    assert done.returncode == 0, done.stderr
    assert "contain credentials" in done.stderr and key_id in done.stderr


def test_debug_wire_is_documented():
    done = run_cli("write", "--help")
    assert "--debug-wire" in done.stdout and "credentials" in done.stdout
    with open(os.path.join(ROOT, "docs", "writing.md")) as f:
        assert "--debug-wire" in f.read()


# ------------------------------------------------------- threads stop with their iterator


def shardkit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("shardkit")}


def serve_failing(make_shards, http_server, status: int = 503) -> str:
    manifest = make_shards([3, 3, 3], payload_bytes=20_000)
    for name in sorted(os.listdir(manifest.location)):
        with open(os.path.join(manifest.location, name), "rb") as f:
            http_server.add(f"/ds/{name}", f.read())
        if name.endswith(".tar"):
            http_server.faults[f"/ds/{name}"] = Faults(statuses=[status] * 100_000)
    return http_server.base_url + "/ds/"


def shard_gets(http_server) -> int:
    with http_server.lock:
        return sum(1 for m, p, _ in http_server.requests if m == "GET" and p.endswith(".tar"))


def assert_reads_stop(http_server, before: set[threading.Thread]) -> None:
    deadline = time.monotonic() + 5
    while shardkit_threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not shardkit_threads() - before, [t.name for t in shardkit_threads() - before]
    count = shard_gets(http_server)
    time.sleep(0.5)
    assert shard_gets(http_server) == count  # the server hears no more requests


def test_closing_the_iterator_stops_reads_that_are_retrying(make_shards, http_server):
    url = serve_failing(make_shards, http_server)
    before = shardkit_threads()
    options = SourceOptions(retry_deadline_s=120.0, backoff_initial_s=0.05, backoff_max_s=0.2, part_bytes=16 << 10)
    samples = iter(shardkit.ShardDataset(url, shuffle=False, source_options=options))
    assert http_server.wait_for(lambda: shard_gets(http_server) >= 3, timeout_s=30)  # retrying now
    started = time.monotonic()
    samples.close()
    del samples
    assert_reads_stop(http_server, before)
    assert time.monotonic() - started < 6


def test_an_iterator_that_raised_leaves_no_thread_retrying(make_shards, http_server):
    url = serve_failing(make_shards, http_server)
    # The first shard is refused for good (fails at once), the next ones answer 503 for ever.
    first = sorted(p for p in http_server.objects if p.endswith(".tar"))[0]
    http_server.faults[first] = Faults(statuses=[403] * 100)
    before = shardkit_threads()
    options = SourceOptions(retry_deadline_s=120.0, backoff_initial_s=0.05, backoff_max_s=0.2)
    started = time.monotonic()
    with pytest.raises(RemoteError, match="HTTP 403"):
        for _ in shardkit.ShardDataset(url, shuffle=False, source_options=options, read_ahead_bytes=1 << 20):
            pass
    assert time.monotonic() - started < 10
    assert_reads_stop(http_server, before)


def test_a_retry_wait_ends_when_its_reader_stops():
    stop = threading.Event()
    with stopping_on(stop):
        backoff = Backoff("http://h/x", deadline_s=120.0, initial_s=60.0, max_s=60.0)
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(RemoteError, match="the reader was closed"):
        backoff.fault(TransientFault("HTTP 503"), offset=0)
    assert time.monotonic() - started < 5


# ------------------------------------------------------------ info escapes


def test_info_escapes_control_characters_from_the_manifest(make_shards, capsys):
    manifest = make_shards([2])
    path = os.path.join(manifest.location, MANIFEST_NAME)
    with open(path) as f:
        data = json.load(f)
    data["class_names"] = ["cat\x1b[2J", "dog\r\x07", "\u202egpj.exe", "ok"]
    data["source"] = {"format": "imagefolder", "path": "/data/\x1b]0;pwned\x07\x9b31m"}
    with open(path, "w") as f:
        json.dump(data, f)
    assert main(["info", manifest.location, "--shards"]) == 0
    out = capsys.readouterr().out
    for raw in ("\x1b", "\r", "\x07", "\u202e", "\x9b"):
        assert raw not in out
    assert "cat\\x1b[2J" in out and "dog\\r\\x07" in out and "\\u202egpj.exe" in out
    assert "/data/\\x1b]0;pwned\\x07\\x9b31m" in out


def test_shown_keeps_ordinary_text():
    assert shown("classes: chat, chien, 猫, é") == "classes: chat, chien, 猫, é"
    assert shown("a\\x1b") == "a\\\\x1b"  # an escaped-looking name stays distinguishable from an escaped one


# ------------------------------------------------- other errors no retry fixes


@pytest.mark.parametrize(
    ("url", "code", "hint"),
    [
        ("s3://no-such-bucket-here/x.tar", "NoSuchBucket", "check the bucket name"),
        ("s3://secrets/no/such/key.tar", "NoSuchKey", "check the key"),
    ],
)
def test_s3_errors_no_retry_fixes_fail_at_once(moto_server, monkeypatch, url, code, hint):
    import boto3

    for name, value in moto_server.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=moto_server["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(
        Bucket="secrets"
    )
    options = SourceOptions(s3_endpoint_url=moto_server["AWS_ENDPOINT_URL"], retry_deadline_s=120.0)
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        read_all(url, options)
    assert time.monotonic() - started < 10
    assert not info.value.retryable and (code in str(info.value) or "404" in str(info.value))
    assert hint in str(info.value) or "no such object" in str(info.value)


def test_s3_credential_configuration_errors_fail_at_once():
    from botocore.exceptions import PartialCredentialsError, ProfileNotFound

    from shardkit.io.s3 import classify_s3_error

    for exc in (ProfileNotFound(profile="nope"), PartialCredentialsError(provider="env", cred_var="x")):
        error = classify_s3_error(exc, "s3://b/k", 0)
        assert isinstance(error, RemoteError) and "fix the AWS configuration" in str(error)


def test_huggingface_offline_mode_and_refusals_are_known_without_huggingface_hub():
    from shardkit.io.fsspec import classify_fs_error
    from shardkit.io.retry import TransientFault

    # huggingface_hub's classes, as far as shardkit looks at them: their names.
    class OfflineModeIsEnabled(ConnectionError):
        pass

    class GatedRepoError(OSError):
        pass

    error = classify_fs_error(OfflineModeIsEnabled("offline"), "hf://datasets/x/y/a.tar", None)
    assert isinstance(error, RemoteError) and "HF_HUB_OFFLINE" in str(error)
    assert classify_fs_error(GatedRepoError("gated"), "hf://d/a.tar", 0).status == 403

    class Refused(OSError):  # requests' HTTPError carries the answer as .response
        def __init__(self, status: int):
            super().__init__("refused")
            self.response = type("Response", (), {"status_code": status})()

    assert classify_fs_error(Refused(401), "https://h/a.tar", 0).status == 401
    assert isinstance(classify_fs_error(Refused(503), "https://h/a.tar", 0), TransientFault)
    assert isinstance(classify_fs_error(PermissionError(13, "denied"), "x://a", 0), RemoteError)
    assert isinstance(classify_fs_error(FileNotFoundError(2, "gone"), "x://a", 0), RemoteError)
