"""``s3://bucket/key`` objects: read with ranged GET requests on the same
urllib3 path as ``http(s)://`` (presigned by botocore), written with PutObject
or multipart uploads (boto3).

Endpoint, region and credentials come from boto3's standard configuration:
environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``,
``AWS_ACCESS_KEY_ID``...), ``~/.aws/config`` and ``~/.aws/credentials``,
instance roles. :class:`~shardkit.io.base.SourceOptions` may override
the endpoint and region (for S3-compatible stores); credentials are never
taken from URLs or options, and never logged.

boto3 is an optional dependency: ``pip install 'shardkit[s3]'``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from shardkit.errors import RemoteError
from shardkit.io.http import HttpFetcher
from shardkit.io.ranged import fatal_status, is_transient_status, make_backoff
from shardkit.io.retry import TransientFault, call_with_retry, retry_after_seconds
from shardkit.io.base import SourceOptions
from shardkit.io.urls import redact_url

_ERROR_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")
#: Most bytes of an error answer's body read for its ``<Code>``.
_ERROR_BODY_BYTES = 16 << 10
#: Lifetime of a presigned request URL: it is used once, at once.
PRESIGNED_EXPIRY_S = 900
_TRANSIENT_CODES = {
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "Throttling",
}
#: What to do about S3 error codes that no retry can fix (raised at once).
_CODE_HINTS = {
    "InvalidAccessKeyId": "the AWS access key id is not known to this store; check the credentials "
    "(AWS_PROFILE, ~/.aws/credentials, environment) and the endpoint",
    "SignatureDoesNotMatch": "the request signature was refused; check the secret access key, and the "
    "endpoint and region",
    "AccessDenied": "access denied; check that these credentials may read this bucket and key",
    "AllAccessDisabled": "access to this bucket is disabled; ask its owner",
    "ExpiredToken": "the session token has expired; refresh the credentials",
    "InvalidToken": "the session token is not valid; refresh the credentials",
    "TokenRefreshRequired": "the session token must be refreshed; refresh the credentials",
    "NoSuchBucket": "no such bucket; check the bucket name, the endpoint and the region",
    "NoSuchKey": "no such object; check the key and that the dataset was uploaded",
    "PermanentRedirect": "the bucket is in another region; set SourceOptions.s3_region or AWS_REGION",
    "AuthorizationHeaderMalformed": "the request was signed for the wrong region; set SourceOptions.s3_region "
    "or AWS_REGION",
}
logger = logging.getLogger(__name__)
_clients: dict[tuple, Any] = {}
_signers: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``.

    Raises:
        UsageError: No bucket in the URL.
    """
    from shardkit.errors import UsageError

    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise UsageError(f"{redact_url(url)}: an s3:// URL needs a bucket: s3://BUCKET/KEY")
    if "@" in bucket:
        raise UsageError(
            f"{redact_url(url)}: credentials in s3:// URLs are not accepted; configure them the usual "
            "AWS way (AWS_PROFILE, ~/.aws/credentials, environment, instance role)"
        )
    return bucket, key


def _settings_key(options: SourceOptions) -> tuple:
    """The settings that tell clients apart (a client keeps the credentials
    found when it was made). Not ``max_concurrent_requests``, which
    :meth:`SourceOptions.shared_by` changes in every DataLoader worker: a
    signer made by the parent must serve its workers."""
    return (
        options.s3_endpoint_url,
        options.s3_region,
        options.connect_timeout_s,
        options.read_timeout_s,
        options.s3_anonymous,
    )


def s3_client(options: SourceOptions) -> Any:
    """A botocore S3 client for this process, for requests made through it
    (uploads, listings; reads go through :class:`S3Fetcher`). Clients are
    never shared across a fork: their connection pools are not.

    Raises:
        RemoteError: boto3 is not installed.
    """
    key = (os.getpid(), options.max_concurrent_requests, *_settings_key(options))
    return _cached_client(
        _clients,
        key,
        options,
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        retries={"total_max_attempts": 1},  # shardkit retries, with resume
        max_pool_connections=max(10, 2 * options.max_concurrent_requests),
    )


def s3_signer(options: SourceOptions) -> Any:
    """A botocore S3 client that only presigns reads, sends nothing, and so
    holds no connection: one per endpoint, region, credentials mode and
    timeouts, shared by this process and the DataLoader workers it forks.

    The parent makes it when it reads the manifest, so forked workers neither
    import botocore nor build a client nor look credentials up (0.1-0.2 s of
    CPU each, which 8 workers on 2 cores pay before their first byte).
    Refreshable credentials (instance roles, assumed roles) refresh when a
    request is signed, in whichever process signs it.

    Raises:
        RemoteError: boto3 is not installed.
    """
    # SigV4: botocore presigns S3 with SigV2 unless told, which newer regions refuse.
    return _cached_client(_signers, _settings_key(options), options, signature_version="s3v4")


def _cached_client(cache: dict[tuple, Any], key: tuple, options: SourceOptions, **config: Any) -> Any:
    """``cache[key]``, made first if need be: a client for ``options``'
    endpoint and region, unsigned with ``s3_anonymous``, ``config`` its
    botocore ``Config``."""
    client = cache.get(key)  # without the lock: a worker forked while another thread held it still goes on
    if client is not None:
        return client
    with _clients_lock:
        client = cache.get(key)
        if client is None:
            try:
                import botocore.session
                from botocore import UNSIGNED
                from botocore.config import Config
            except ImportError as exc:
                raise RemoteError("s3:// URLs need boto3: pip install 'shardkit[s3]'", url="s3://") from exc
            if options.s3_anonymous:
                config["signature_version"] = UNSIGNED
            client = botocore.session.Session().create_client(
                "s3", endpoint_url=options.s3_endpoint_url, region_name=options.s3_region, config=Config(**config)
            )
            cache[key] = client
        return client


def classify_s3_error(exc: BaseException, url: str, offset: int | None) -> BaseException:
    """Map a boto3/botocore exception to :class:`TransientFault` or :class:`RemoteError`."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        IncompleteReadError,
        NoCredentialsError,
        ParamValidationError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ClientError):
        meta = exc.response.get("ResponseMetadata", {})
        error = exc.response.get("Error", {})
        status = int(meta.get("HTTPStatusCode") or 0)
        code = str(error.get("Code", ""))
        if is_transient_status(status) or code in _TRANSIENT_CODES:
            return TransientFault(f"S3 {code or status}", status=status or None)
        if code.isdigit() and not status:
            status = int(code)
        return fatal_status(url, status or 400, code, offset=offset, hint=_CODE_HINTS.get(code))
    if isinstance(exc, NoCredentialsError):
        return RemoteError(
            f"{url}: no AWS credentials found; configure them the usual way (AWS_PROFILE, "
            "~/.aws/credentials, environment, or an instance role), or, for a public bucket, read it "
            "unsigned: SourceOptions(s3_anonymous=True), or --s3-anonymous on the command line",
            url=url,
            offset=offset,
        )
    if isinstance(exc, ParamValidationError):
        return RemoteError(f"{url}: invalid S3 request ({exc})", url=url, offset=offset)
    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError, OSError)):
        return TransientFault(f"S3 request failed ({type(exc).__name__})")
    if isinstance(exc, BotoCoreError):
        # Configuration and credential errors (a missing profile, a failed
        # credential provider, no region...): no retry fixes those.
        return RemoteError(
            f"{url}: cannot make the S3 request ({type(exc).__name__}: {exc}); fix the AWS configuration "
            "(AWS_PROFILE, ~/.aws/config and credentials, environment)",
            url=url,
            offset=offset,
        )
    try:
        from urllib3.exceptions import HTTPError
    except ImportError:  # pragma: no cover
        return exc
    if isinstance(exc, HTTPError):
        return TransientFault(f"S3 read failed ({type(exc).__name__})")
    return exc


class S3Fetcher(HttpFetcher):
    """One S3 object, read as :class:`~shardkit.io.http.HttpFetcher` reads
    an ``http(s)://`` one: ranged GETs on this process's urllib3 pool, each
    sent to a URL presigned for it (see :func:`s3_signer`).

    botocore works out the object's URL (endpoint, region, path-style or
    virtual-hosted addressing) and signs it (SigV4, or nothing with
    ``s3_anonymous``); nothing else of boto3 runs per request. The signature
    travels in the query string, which shardkit never logs nor puts in a
    message. S3's error code (``NoSuchKey``, ``AccessDenied``...) is read
    from the answer's body and named in the error with what to do.

    Args:
        url: ``s3://bucket/key``.
        options: Timeouts, endpoint, region and ``s3_anonymous``.

    Raises:
        UsageError: No bucket in the URL, or credentials in it.
    """

    def __init__(self, url: str, *, options: SourceOptions):
        self.bucket, self.key = split_s3_url(url)  # refuses credentials before anything keeps the URL
        super().__init__(url, options=options)

    def size(self) -> int | None:
        size = super().size()
        # An S3 object's version is its listing's ETag (`shardkit index`
        # reads it there); this answer's would be hashed as an http one's.
        self.validator = None
        return size

    def _request_url(self) -> str:
        try:
            return s3_signer(self.options).generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self.key}, ExpiresIn=PRESIGNED_EXPIRY_S
            )
        except RemoteError:
            raise
        except Exception as exc:  # no credentials, a bad bucket name, a broken AWS configuration
            raise classify_s3_error(exc, self.url, None) from None

    def _refused(self, response: Any, offset: int | None) -> Exception:
        return self._s3_error(response, offset)

    def _redirect_target(self, url: str, response: Any, offset: int | None) -> str:
        # S3 redirects a request sent to another region's endpoint (301
        # PermanentRedirect, 307 while a new bucket's name spreads): the
        # presigned URL is signed for this region and cannot follow.
        raise self._s3_error(response, offset)

    def _s3_error(self, response: Any, offset: int | None) -> Exception:
        """The error for an S3 answer that is not the object: its body's
        ``<Code>`` decides between a retry and a :class:`RemoteError` with
        that code's hint (the response is released here)."""
        try:
            body = response.read(_ERROR_BODY_BYTES, decode_content=False)
        except Exception:  # the status alone still says enough
            body = b""
        response.drain_conn()
        response.release_conn()
        match = _ERROR_CODE.search(body)
        code = match.group(1).decode("ascii", "replace") if match else ""
        status = response.status
        if is_transient_status(status) or code in _TRANSIENT_CODES:
            return TransientFault(
                f"S3 {code or status}", status=status, retry_after_s=retry_after_seconds(response.headers.get("Retry-After"))
            )
        hint = _CODE_HINTS.get(code)
        region = response.headers.get("x-amz-bucket-region")
        if 300 <= status < 400:
            hint = _CODE_HINTS["PermanentRedirect"]
        if region and hint and "s3_region" in hint:
            hint = f"{hint} (the bucket is in {region})"
        return fatal_status(self.url, status, code or response.reason or "", offset=offset, hint=hint)


#: Files above this size go to S3 as multipart uploads of this part size.
MULTIPART_THRESHOLD_BYTES = 64 << 20
MULTIPART_PART_BYTES = 32 << 20


class S3Destination:
    """A dataset folder under an ``s3://bucket/prefix``.

    An object appears only once its ``PutObject`` or multipart upload has
    completed, so no temporary names are needed; a failed multipart upload is
    aborted. Transient faults are retried up to ``options.retry_deadline_s``.

    Args:
        url: ``s3://bucket/prefix`` of the folder (file names are appended).
        options: Timeouts, retry deadline, S3 endpoint and region.

    Raises:
        UsageError: No bucket in the URL, or credentials in it.
    """

    local_dir = None

    def __init__(self, url: str, *, options: SourceOptions | None = None):
        self.options = options or SourceOptions()
        self.url = redact_url(url.rstrip("/"))
        self.bucket, self.prefix = split_s3_url(url.rstrip("/") + "/")

    @property
    def _client(self) -> Any:
        # Looked up at each use: s3_client keeps one client per process and
        # settings, made on first need (not when the destination is opened).
        return s3_client(self.options)

    def object_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def exists(self, name: str) -> bool:
        return self._retrying(name, lambda: self._exists(name))

    def put_file(self, local_path: str, name: str) -> None:
        if not os.path.isfile(local_path):  # a local problem, never worth retrying
            raise FileNotFoundError(f"{local_path}: file to upload is missing")
        self._retrying(name, lambda: self._put(local_path, name))

    def put_bytes(self, name: str, data: bytes) -> None:
        self._retrying(name, lambda: self._call(name, self._client.put_object, Bucket=self.bucket,
                                                Key=self.prefix + name, Body=data))

    def _retrying(self, name: str, attempt: Any) -> Any:
        return call_with_retry(attempt, make_backoff(self.object_url(name), self.options))

    def _call(self, name: str, method: Any, **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except Exception as exc:
            raise classify_s3_error(exc, self.object_url(name), None) from exc

    def _exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self.prefix + name)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise classify_s3_error(exc, self.object_url(name), None) from exc
        except Exception as exc:
            raise classify_s3_error(exc, self.object_url(name), None) from exc

    def _put(self, local_path: str, name: str) -> None:
        # One PutObject for small files; a multipart upload for large ones.
        key = self.prefix + name
        size = os.path.getsize(local_path)
        client = self._client
        with open(local_path, "rb") as f:
            if size <= MULTIPART_THRESHOLD_BYTES:
                self._call(name, client.put_object, Bucket=self.bucket, Key=key, Body=f.read())
                return
            upload_id = self._call(name, client.create_multipart_upload, Bucket=self.bucket, Key=key)["UploadId"]
            try:
                parts = []
                number = 1
                while data := f.read(MULTIPART_PART_BYTES):
                    answer = self._call(
                        name, client.upload_part,
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data,
                    )  # fmt: skip
                    parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                    number += 1
                self._call(
                    name, client.complete_multipart_upload,
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts},
                )  # fmt: skip
            except BaseException:
                try:
                    client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
                except Exception:  # the original error is the one to report
                    logger.debug("could not abort multipart upload of %s", self.object_url(name))
                raise
