"""Writing a dataset to a destination that is not a local folder (``s3://``, fsspec).

The driver scans and plans into a local staging folder
(:func:`remote_staging`); each shard is written into a staging folder of its
own and uploaded with its index where it is written
(:class:`~shardkit.write.publisher.ShardPublisher`); the manifest goes last
(:func:`publish_report`), so a reader that finds a manifest finds every shard
it lists.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from shardkit.errors import DestinationError, UsageError
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.base import Destination
from shardkit.write.publish import publish_manifest

logger = logging.getLogger(__name__)

R = TypeVar("R")


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


@contextmanager
def remote_staging(destination: Destination, *, resume: bool, overwrite: bool) -> Iterator[str]:
    """A local staging folder for a write to ``destination``, removed on exit.

    The write's work folder (scan, plan) lives there; each shard is staged
    and published by the run's :class:`~shardkit.write.publisher.ShardPublisher`.

    Raises:
        UsageError: ``resume`` was asked for (not supported for remote
            destinations).
        DestinationError: A dataset exists there and ``overwrite`` is off.
    """
    if resume:
        raise UsageError(f"{destination.url}: --resume is not supported for remote destinations; rerun without it")
    refuse_existing_dataset(destination, overwrite=overwrite)
    staging = tempfile.mkdtemp(prefix="shardkit-upload-")
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_report(destination: Destination, report: R) -> R:
    """Publish the manifest of a finished write (every shard is there) and
    return ``report`` with the manifest located at ``destination``."""
    publish_manifest(destination, report.manifest)  # type: ignore[attr-defined]
    logger.info("dataset published at %s", destination.url)
    manifest = dataclasses.replace(report.manifest, location=destination.url)  # type: ignore[attr-defined]
    return dataclasses.replace(report, manifest=manifest)  # type: ignore[type-var]
