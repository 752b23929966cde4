"""Writing a dataset to a destination that is not a local folder (``s3://``, fsspec).

The writer makes each shard and index in a local staging directory and hands
it to the :class:`~shardkit.io.base.Destination` (from
:func:`shardkit.io.registry.open_destination`) as soon as it is complete. The
manifest goes last, so a reader that finds a manifest finds every shard it
lists. How a file is published whole (multipart upload, temporary name and
move) is the destination backend's business, not the writer's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardkit.errors import DestinationError, UsageError
from shardkit.format.index import index_path_for
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.base import Destination
from shardkit.write.publish import publish_manifest

logger = logging.getLogger(__name__)


def refuse_existing_dataset(destination: Destination, *, overwrite: bool) -> None:
    """Refuse a destination that already holds a dataset, unless ``overwrite``.

    Raises:
        DestinationError: A manifest is already there and ``overwrite`` is False.
        RemoteError: The store cannot be asked (denied, unreachable past the
            retry deadline).
    """
    if not overwrite and destination.exists(MANIFEST_NAME):
        raise DestinationError(
            f"{destination.url}: a dataset is already there ({MANIFEST_NAME} exists); "
            "pass --overwrite to replace it or choose another prefix",
            path=destination.url,
        )


def write_to_remote(
    source: str,
    destination: Destination,
    *,
    options: Any,
    progress: Callable[[Any], None] | None,
    write_local: Callable[..., Any],
    max_concurrent_uploads: int = 4,
    writer_uploads: bool = False,
) -> Any:
    """Write a dataset into a local staging directory and publish it at ``destination``.

    Each shard and its index are published (in background threads) as soon
    as the writer reports the shard finished, and removed from staging once
    they are; the manifest is published after every shard has arrived.

    Args:
        source: Input dataset, as for :func:`shardkit.write_dataset`.
        destination: The dataset folder (``s3://``, another fsspec URL).
        options: :class:`~shardkit.write.parallel.WriteOptions`.
        progress: Progress callback, as for :func:`shardkit.write_dataset`.
        write_local: The local writer (:func:`shardkit.write_dataset`).
        max_concurrent_uploads: Uploads in flight at once.
        writer_uploads: The writer publishes each shard itself (the Ray
            engine's tasks do, from their own nodes); only the manifest is
            published here.

    Returns:
        The writer's report, with the manifest located at the destination.

    Raises:
        UsageError: ``resume`` was asked for (not supported for remote
            destinations).
        DestinationError: A dataset exists there and ``overwrite`` is off.
        RemoteError: An upload failed for good; the manifest is then not
            published, so readers never see the partial dataset.
    """
    if options.resume:
        raise UsageError(f"{destination.url}: --resume is not supported for remote destinations; rerun without it")
    refuse_existing_dataset(destination, overwrite=options.overwrite)
    staging = tempfile.mkdtemp(prefix="shardkit-upload-")
    pending: list[Future[None]] = []

    def upload_pair(shard: str) -> None:
        for name in (shard, index_path_for(shard)):
            path = os.path.join(staging, name)
            destination.put_file(path, name)
            logger.debug("uploaded %s", destination.object_url(name))
            os.unlink(path)

    pool: ThreadPoolExecutor

    def on_progress(event: Any) -> None:
        for future in pending:  # stop writing early once an upload failed for good
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        if not writer_uploads:
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
        publish_manifest(destination, report.manifest)
        logger.info("dataset published at %s", destination.url)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # after every upload thread has stopped
    manifest = dataclasses.replace(report.manifest, location=destination.url)
    return dataclasses.replace(report, manifest=manifest)
