"""Publishing a manifest (its shard table, then ``manifest.json``, then a
dataset card) and ``shardkit upgrade``.

The table goes first, under its content name, and ``manifest.json`` last:
replacing ``manifest.json`` is the commit point, so a reader (or a crash)
sees the old dataset or the new one, never a manifest naming a missing
table. Tables no manifest names are removed afterwards (locally; on object
stores they are left, harmless, as the destination cannot delete).

The dataset card, ``README.md``, tells the Hugging Face Hub and the
``datasets`` library where the samples are: without it
``datasets.load_dataset(folder)`` picks its JSON loader for
``manifest.json`` and returns the manifest as one row. The card's YAML
front matter names the tar shards as the ``train`` split's ``data_files``,
so ``load_dataset`` and the Hub's viewer read them as webdataset. A
``README.md`` shardkit did not write (one without :data:`CARD_MARKER`) is
never replaced.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.format.manifest import FORMAT_VERSION, UPGRADE_HINT, Manifest
from shardkit.format.manifest import logger as manifest_logger
from shardkit.format.table import TABLE_NAME, TABLE_PREFIX
from shardkit.io.atomic import TMP_SUFFIX, atomic_write_bytes, remove_quietly
from shardkit.io.base import Destination, SourceOptions
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_destination
from shardkit.io.urls import is_local, local_path, redact_url, url_scheme
from shardkit.write.destination import CARD_NAME, holding_destination

logger = logging.getLogger(__name__)


def publish_manifest(
    destination: Destination | str, manifest: Manifest, *, table_in_place: bool = False, replaces: str | None = None
) -> None:
    """Write ``manifest``'s table and then ``manifest.json`` into a dataset
    folder, then its dataset card (see :func:`write_dataset_card`).

    Args:
        destination: A local folder path, or a :class:`Destination`.
        manifest: The manifest to publish.
        table_in_place: The table file is already there under its name (a
            table written piece by piece, as ``shardkit index`` does): only
            ``manifest.json`` and the card are written.
        replaces: The table file of the revision this one replaces, the one
            stale table then (a revision's publishing need not list a folder
            of 10^6 shards to find it); None: every table but the new one
            is looked for and removed.
    """
    files = manifest.to_files()
    table_file = files[0][0]
    if table_in_place:
        files = files[1:]
    local = destination if isinstance(destination, str) else destination.local_dir
    if local is not None:
        for name, data in files:
            atomic_write_bytes(os.path.join(local, name), data)
        if replaces is None:
            remove_stale_tables(local, keep=table_file)
        elif replaces and replaces != table_file:
            remove_quietly(os.path.join(local, replaces))
    else:
        assert not isinstance(destination, str)
        for name, data in files:
            destination.put_bytes(name, data)
    write_dataset_card(destination, manifest)


#: The line that marks a card as shardkit's: a README.md holding it may be
#: rewritten; without it the file is the user's and is left alone.
CARD_MARKER = (
    "<!-- shardkit dataset card: `shardkit write` and `shardkit index` rewrite this file while this line "
    "is here; delete the line to keep your own edits. -->"
)
_FORMAT_FIELD = re.compile(r"\{[^{}]*\}")


def card_data_files(manifest: Manifest, *, folder: str | None = None) -> list[str]:
    """Glob patterns that match the dataset's plain tar shards: the naming
    pattern with its number as ``*`` (``shard-*.tar``), else ``*.tar`` in
    each folder that holds shards. Compressed shards are left out
    (``datasets`` reads plain tars only).

    The patterns are relative to the card's folder when the shards are in
    it or under it. Shards elsewhere (an index written with ``--out``,
    declaring its ``shards_base``) keep that base: an absolute local path,
    which ``datasets.load_dataset`` reads on this machine (the Hub cannot:
    the files are not in the repository), or a URL, which ``datasets``
    globs through fsspec (where the server lists the folder).

    Args:
        manifest: The dataset's manifest.
        folder: The local folder the card goes into (None: not local).
    """
    table = manifest.table
    if table.num_shards == 0:
        return []
    base = ""
    if manifest.shards_base is not None:
        shards_base = manifest.shards_base.rstrip("/")
        base = shards_base + "/"
        if folder is not None and is_local(shards_base):
            inside = os.path.relpath(os.path.abspath(local_path(shards_base)), os.path.abspath(folder))
            if inside == os.curdir:
                base = ""
            elif inside != os.pardir and not inside.startswith(os.pardir + os.sep):
                base = inside.replace(os.sep, "/") + "/"
    if table.naming is not None:
        pattern = _FORMAT_FIELD.sub("*", table.naming.shard)
        return [base + pattern] if pattern.endswith(".tar") else []
    patterns: dict[str, None] = {}  # in first-seen order
    for shard in range(table.num_shards):
        name = table.path(shard)
        if name.endswith(".tar"):
            parent = posixpath.dirname(name)
            patterns[base + (f"{parent}/*.tar" if parent else "*.tar")] = None
    return list(patterns)


def dataset_card(manifest: Manifest, *, data_files: Sequence[str]) -> str:
    """The ``README.md`` text for a dataset whose shards ``data_files`` match."""
    quoted = "\n".join(f"    - {json.dumps(pattern)}" for pattern in data_files)
    fields = ", ".join(f"`{ext}`" for ext in manifest.extensions) or "none recorded"
    return (
        "---\n"
        "configs:\n"
        "- config_name: default\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path:\n"
        f"{quoted}\n"
        "tags:\n"
        "- webdataset\n"
        "- shardkit\n"
        "---\n"
        f"{CARD_MARKER}\n\n"
        "# WebDataset shards\n\n"
        f"{manifest.num_samples} samples in {manifest.num_shards} WebDataset-format tar shards "
        f"({manifest.num_bytes} bytes), with a shardkit manifest. Fields: {fields}.\n\n"
        "Read it with shardkit (streaming, split across ranks and DataLoader workers, resumable):\n\n"
        "```python\n"
        "import shardkit\n"
        'dataset = shardkit.ShardDataset("path/to/this/folder")\n'
        "```\n\n"
        "or with Hugging Face `datasets`, which reads the shards as webdataset:\n\n"
        "```python\n"
        "import datasets\n"
        'dataset = datasets.load_dataset("path/to/this/folder", split="train")\n'
        "```\n\n"
        "`manifest.json` and its `shards-*.table` describe the shards (sample counts, offsets, checksums) "
        "for shardkit; the `.idx` files are per-shard offset indexes.\n"
    )


def write_dataset_card(
    destination: Destination | str, manifest: Manifest, *, data_files: Sequence[str] | None = None
) -> bool:
    """Write the dataset card (``README.md``) beside ``manifest.json``.

    A ``README.md`` that shardkit did not write (without
    :data:`CARD_MARKER`) is kept as it is, and so is any ``README.md`` in a
    folder shardkit cannot read back (object stores): there only a missing
    card is written.

    Args:
        destination: A local folder path, or a :class:`Destination`.
        manifest: The published manifest.
        data_files: Glob patterns of the shards, relative to the folder (or
            URLs); default :func:`card_data_files`.

    Returns:
        Whether the card was written (False: the user's README was kept, or
        no plain tar shard to name).
    """
    local = destination if isinstance(destination, str) else destination.local_dir
    patterns = card_data_files(manifest, folder=local) if data_files is None else list(data_files)
    if not patterns:
        logger.debug("no plain tar shards: no dataset card written")
        return False
    if local is not None:
        path = os.path.join(local, CARD_NAME)
        if os.path.exists(path) and not _is_shardkit_card(path):
            logger.info("%s: a README.md shardkit did not write; left as it is (no dataset card)", path)
            return False
        atomic_write_bytes(path, dataset_card(manifest, data_files=patterns).encode())
        return True
    assert not isinstance(destination, str)
    if destination.exists(CARD_NAME):
        logger.info("%s: README.md exists; left as it is", destination.object_url(CARD_NAME))
        return False
    destination.put_bytes(CARD_NAME, dataset_card(manifest, data_files=patterns).encode())
    return True


def _is_shardkit_card(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(64 * 1024)  # the marker is near the top; a long README is the user's
    return CARD_MARKER.encode() in head


def remove_stale_tables(folder: str, *, keep: str) -> list[str]:
    """Remove shard tables (and their temporaries) other than ``keep`` from ``folder``."""
    removed = []
    with os.scandir(folder) as entries:  # one name at a time: an index's folder holds an offset index per shard
        names = [entry.name for entry in entries if entry.name.startswith(TABLE_PREFIX)]
    for name in names:
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
    if destination.local_dir is None or not os.path.isdir(destination.local_dir):
        return _upgrade(dest, destination, options)  # remote, or no folder: refused there, none made
    # A write or index publishing into the folder meanwhile would have its new table taken for a stale one.
    with holding_destination(destination.local_dir, rerun="run the upgrade once it has ended"):
        return _upgrade(dest, destination, options)


def _upgrade(dest: str, destination: Destination, options: SourceOptions) -> UpgradeReport:
    """:func:`upgrade_dataset` once ``destination`` is open (and held, when local)."""
    hint_filter = _DropUpgradeHint()
    manifest_logger.addFilter(hint_filter)  # the upgrade is running: no advice to run it
    try:
        manifest = fetch_manifest(dest, options=options)
    finally:
        manifest_logger.removeFilter(hint_filter)
    name, data = manifest.table_file()
    upgraded = manifest.loaded_version < FORMAT_VERSION  # 3: format 2 with token counts
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
