"""Writing a dataset to a remote destination: ``s3://`` or any fsspec URL.

The writer makes each shard and index locally (in a staging directory), then
hands it to :class:`RemoteDestination`, which uploads it as soon as it is
complete. The manifest goes last, so a reader that finds a manifest finds
every shard it lists.

No partial object is ever visible under a final name: S3 publishes a
``PutObject`` or multipart upload only when it completes, and on other
filesystems that are not object stores the upload goes to ``NAME.tmp`` and
is moved into place.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from shardkit.errors import DestinationError, RemoteError
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.ranged import make_backoff
from shardkit.io.retry import call_with_retry
from shardkit.io.base import SourceOptions
from shardkit.io.urls import redact_url, url_scheme

logger = logging.getLogger(__name__)

#: Files above this size go to S3 as multipart uploads of this part size.
MULTIPART_THRESHOLD_BYTES = 64 << 20
MULTIPART_PART_BYTES = 32 << 20

#: fsspec protocols whose uploads are atomic (object stores): no temp name.
ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})


def is_remote_destination(dest: str) -> bool:
    """Whether ``dest`` is a URL the writer must upload to (not a local path or ``file://``)."""
    return "://" in dest and not dest.startswith("file://")


class RemoteDestination:
    """A dataset location in an object store or fsspec filesystem.

    Args:
        url: ``s3://bucket/prefix`` or another fsspec URL of the dataset
            folder (shard names are appended to it).
        options: Timeouts, retry deadline, S3 endpoint and region.
        overwrite: Allow replacing a dataset already there (one with a
            manifest). Without it, such a destination is refused.

    Raises:
        DestinationError: A manifest already exists there and ``overwrite``
            is False.
    """

    def __init__(self, url: str, *, options: SourceOptions | None = None, overwrite: bool = False):
        self.url = url.rstrip("/")
        self.display_url = redact_url(self.url)
        self.options = options or SourceOptions()
        self.scheme = url_scheme(url)
        self._lock = threading.Lock()
        self.uploaded: list[str] = []
        if self.scheme == "s3":
            from shardkit.io.s3 import s3_client, split_s3_url

            self._client = s3_client(self.options)
            self.bucket, self.prefix = split_s3_url(self.url + "/")
        else:
            from shardkit.io.fsspec import url_to_fs

            self._fs, self._root = url_to_fs(self.url)
        if not overwrite and self.exists(MANIFEST_NAME):
            raise DestinationError(
                f"{self.display_url}: a dataset is already there ({MANIFEST_NAME} exists); "
                "pass --overwrite to replace it or choose another prefix",
                path=self.display_url,
            )

    def object_url(self, relative_name: str) -> str:
        """The URL of a file of the dataset."""
        return f"{self.display_url}/{relative_name}"

    def exists(self, relative_name: str) -> bool:
        """Whether ``relative_name`` exists at the destination (transient faults retried).

        Raises:
            RemoteError: The store cannot be asked (denied, unreachable past
                the retry deadline).
        """
        backoff = make_backoff(self.object_url(relative_name), self.options)
        return call_with_retry(lambda: self._exists(relative_name), backoff)

    def _exists(self, relative_name: str) -> bool:
        if self.scheme == "s3":
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                self._client.head_object(Bucket=self.bucket, Key=self.prefix + relative_name)
                return True
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise self._error(exc, relative_name) from None
            except BotoCoreError as exc:
                raise self._error(exc, relative_name) from None
        try:
            return bool(self._fs.exists(f"{self._root}/{relative_name}"))
        except Exception as exc:
            raise self._error(exc, relative_name) from None

    def _error(self, exc: BaseException, relative_name: str) -> BaseException:
        url = self.object_url(relative_name)
        if self.scheme == "s3":
            from shardkit.io.s3 import classify_s3_error

            return classify_s3_error(exc, url, None)
        from shardkit.io.fsspec import classify_fs_error

        return classify_fs_error(exc, url, None)

    def _put(self, local_path: str, relative_name: str) -> None:
        if not os.path.isfile(local_path):
            # A local problem, never worth retrying.
            raise FileNotFoundError(f"{local_path}: file to upload is missing")
        if self.scheme == "s3":
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                self._put_s3(local_path, self.prefix + relative_name)
            except (BotoCoreError, ClientError) as exc:
                raise self._error(exc, relative_name) from None
            return
        try:
            if self._fs.protocol and set(_protocols(self._fs)) & ATOMIC_PUT_PROTOCOLS:
                self._fs.put_file(local_path, f"{self._root}/{relative_name}")
            else:
                final = f"{self._root}/{relative_name}"
                self._fs.put_file(local_path, final + ".tmp")
                self._fs.mv(final + ".tmp", final)
        except RemoteError:
            raise
        except Exception as exc:
            raise self._error(exc, relative_name) from None

    def _put_s3(self, local_path: str, key: str) -> None:
        # One PutObject for small files; a multipart upload for large ones.
        # Either way S3 shows the object only once it is complete.
        size = os.path.getsize(local_path)
        with open(local_path, "rb") as f:
            if size <= MULTIPART_THRESHOLD_BYTES:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=f.read())
                return
            upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
            try:
                parts = []
                number = 1
                while data := f.read(MULTIPART_PART_BYTES):
                    answer = self._client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
                    )
                    parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                    number += 1
                self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
            except BaseException:
                try:
                    self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
                except Exception:  # the original error is the one to report
                    logger.debug("could not abort multipart upload of %s", key)
                raise

    def upload_file(self, local_path: str, relative_name: str) -> None:
        """Upload one finished file (a shard or an index), retrying transient faults.

        Safe to call from several threads at once.

        Raises:
            RemoteError: The upload failed for good.
        """
        backoff = make_backoff(self.object_url(relative_name), self.options)
        call_with_retry(lambda: self._put(local_path, relative_name), backoff)
        with self._lock:
            self.uploaded.append(relative_name)
        logger.debug("uploaded %s (%d bytes)", self.object_url(relative_name), os.path.getsize(local_path))

    def finish_manifest(self, data: bytes, *, staging_dir: str | None = None) -> None:
        """Upload the manifest, last: after it, readers may use the dataset.

        Args:
            data: The manifest JSON bytes.
            staging_dir: Where to write the temporary local copy (the system
                temp directory if None).

        Raises:
            RemoteError: The upload failed for good.
        """
        import tempfile

        fd, path = tempfile.mkstemp(prefix="shardkit-manifest-", suffix=".json", dir=staging_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.upload_file(path, MANIFEST_NAME)
        finally:
            os.unlink(path)
        logger.info("dataset published at %s", self.display_url)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def write_to_remote(
    source: str,
    dest: str,
    *,
    options: Any,
    progress: Callable[[Any], None] | None,
    write_local: Callable[..., Any],
    max_concurrent_uploads: int = 4,
) -> Any:
    """Write a dataset into a local staging directory and upload it to ``dest``.

    Each shard and its index are uploaded (in background threads) as soon as
    the writer reports the shard finished, and removed from staging once
    uploaded; the manifest is uploaded after every shard has arrived.

    Args:
        source: Input dataset, as for :func:`shardkit.write_dataset`.
        dest: ``s3://`` or other fsspec URL of the dataset folder.
        options: :class:`~shardkit.write.parallel.WriteOptions`.
        progress: Progress callback, as for :func:`shardkit.write_dataset`.
        write_local: The local writer (:func:`shardkit.write_dataset`).
        max_concurrent_uploads: Uploads in flight at once.

    Returns:
        The writer's report, with the manifest located at ``dest``.

    Raises:
        UsageError: ``resume`` was asked for (not supported for remote
            destinations).
        DestinationError: A dataset exists at ``dest`` and ``overwrite`` is off.
        RemoteError: An upload failed for good; the manifest is then not
            uploaded, so readers never see the partial dataset.
    """
    import dataclasses
    import shutil
    import tempfile
    from concurrent.futures import Future, ThreadPoolExecutor

    from shardkit.errors import UsageError
    from shardkit.format.index import index_path_for

    if options.resume:
        raise UsageError(f"{redact_url(dest)}: --resume is not supported for remote destinations; rerun without it")
    remote = RemoteDestination(dest, overwrite=options.overwrite)
    staging = tempfile.mkdtemp(prefix="shardkit-upload-")
    pending: list[Future[None]] = []

    def upload_pair(shard: str) -> None:
        for name in (shard, index_path_for(shard)):
            path = os.path.join(staging, name)
            remote.upload_file(path, name)
            os.unlink(path)

    pool: ThreadPoolExecutor

    def on_progress(event: Any) -> None:
        for future in pending:  # stop writing early once an upload failed for good
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        pending.append(pool.submit(upload_pair, event.shard))
        if progress is not None:
            progress(event)

    try:
        with ThreadPoolExecutor(max_workers=max_concurrent_uploads, thread_name_prefix="shardkit-upload") as pool:
            try:
                report = write_local(
                    source, staging, options=dataclasses.replace(options, overwrite=False), progress=on_progress
                )
                for future in pending:
                    future.result()
            finally:
                for future in pending:
                    future.cancel()
        remote.finish_manifest(report.manifest.to_json().encode(), staging_dir=staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # after every upload thread has stopped
    manifest = dataclasses.replace(report.manifest, location=remote.display_url)
    return dataclasses.replace(report, manifest=manifest)
