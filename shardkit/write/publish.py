"""Publishing a manifest (its shard table, then ``manifest.json``) and ``shardkit upgrade``.

The table goes first, under its content name, and ``manifest.json`` last:
replacing ``manifest.json`` is the commit point, so a reader (or a crash)
sees the old dataset or the new one, never a manifest naming a missing
table. Tables no manifest names are removed afterwards (locally; on object
stores they are left, harmless, as the destination cannot delete).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.format.manifest import FORMAT_VERSION, UPGRADE_HINT, Manifest
from shardkit.format.manifest import logger as manifest_logger
from shardkit.format.table import TABLE_NAME
from shardkit.io.atomic import TMP_SUFFIX, atomic_write_bytes
from shardkit.io.base import Destination, SourceOptions
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_destination
from shardkit.io.urls import redact_url, url_scheme

logger = logging.getLogger(__name__)


def publish_manifest(destination: Destination | str, manifest: Manifest) -> None:
    """Write ``manifest``'s table and then ``manifest.json`` into a dataset folder.

    Args:
        destination: A local folder path, or a :class:`Destination`.
        manifest: The manifest to publish.
    """
    files = manifest.to_files()
    local = destination if isinstance(destination, str) else destination.local_dir
    if local is not None:
        for name, data in files:
            atomic_write_bytes(os.path.join(local, name), data)
        remove_stale_tables(local, keep=files[0][0])
    else:
        assert not isinstance(destination, str)
        for name, data in files:
            destination.put_bytes(name, data)


def remove_stale_tables(folder: str, *, keep: str) -> list[str]:
    """Remove shard tables (and their temporaries) other than ``keep`` from ``folder``."""
    removed = []
    for name in os.listdir(folder):
        stem = name[: -len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name
        if TABLE_NAME.match(stem) and name != keep:
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


@dataclass(frozen=True)
class UpgradeReport:
    """What ``shardkit upgrade`` did.

    Attributes:
        location: The dataset (redacted).
        from_version: The manifest's format version before.
        upgraded: False when it was already current (nothing changed).
        num_shards: Shards in the dataset.
        table_name: The shard table's file name.
        table_bytes: Its size.
        removed: Stray tables removed (left by an interrupted upgrade).
    """

    location: str
    from_version: int
    upgraded: bool
    num_shards: int
    table_name: str
    table_bytes: int
    removed: tuple[str, ...] = ()


def upgrade_dataset(dest: str, *, options: SourceOptions | None = None) -> UpgradeReport:
    """Bring a dataset's manifest to the current format in place; shards untouched.

    Atomic (the table is written under a new name, then ``manifest.json`` is
    replaced) and idempotent (a current dataset is left as it is, except
    that stray tables of an interrupted run are removed).

    Args:
        dest: The dataset folder: a local path, ``s3://`` or another writable URL.
        options: How to reach remote storage.

    Raises:
        UsageError: ``http(s)://`` (read-only).
        ManifestError: The manifest is missing or invalid.
    """
    if url_scheme(dest) in ("http", "https"):
        raise UsageError(
            f"{redact_url(dest)}: http(s) datasets are read-only; upgrade the dataset where it is stored "
            "(a local folder or s3://) and publish it again"
        )
    options = options or SourceOptions()
    destination = open_destination(dest, options=options)
    hint_filter = _DropUpgradeHint()
    manifest_logger.addFilter(hint_filter)  # the upgrade is running: no advice to run it
    try:
        manifest = fetch_manifest(dest, options=options)
    finally:
        manifest_logger.removeFilter(hint_filter)
    name, data = manifest.table_file()
    upgraded = manifest.loaded_version != FORMAT_VERSION
    if upgraded:
        publish_manifest(destination, manifest)
        removed: list[str] = []
        logger.info("%s: upgraded from format %d", destination.url, manifest.loaded_version)
    else:
        removed = remove_stale_tables(destination.local_dir, keep=name) if destination.local_dir else []
    return UpgradeReport(
        location=destination.url,
        from_version=manifest.loaded_version,
        upgraded=upgraded,
        num_shards=manifest.num_shards,
        table_name=name,
        table_bytes=len(data),
        removed=tuple(removed),
    )


class _DropUpgradeHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, UPGRADE_HINT, False)
