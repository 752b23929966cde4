"""The one way a change publishes a revision of a dataset.

:func:`revising` holds the dataset's folder (the lock ``shardkit write``
and ``shardkit index`` take, so no write, index or other change runs there
meanwhile) and gives the manifest the change starts from;
:func:`publish_revision` publishes the new one: the table under its content
name, then ``manifest.json`` in one rename (a reader, or a crash, sees the
old revision or the new one), then the tables no manifest names are
removed. Shards and offset indexes are never touched here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from shardkit.errors import DestinationError, UsageError
from shardkit.format.manifest import Manifest, load_manifest
from shardkit.io.urls import is_local, local_path, redact_url
from shardkit.write.destination import holding_destination
from shardkit.write.publish import publish_manifest


@contextlib.contextmanager
def revising(dest: str, *, command: str) -> Iterator[Manifest]:
    """Hold the local dataset folder ``dest`` and load its manifest.

    Args:
        dest: The dataset's folder.
        command: The change, for messages (``"remove"``).

    Raises:
        UsageError: ``dest`` is a URL.
        DestinationError: Another write, index or change holds the folder.
        ManifestError: No manifest there, or a damaged one.
    """
    if not is_local(str(dest)):
        raise UsageError(
            f"{redact_url(str(dest))}: {command} writes the dataset's manifest and shard table, so it works on a "
            "local folder: a dataset you wrote, or a local index of published shards (`shardkit index URL --out "
            f"DIR`, then `shardkit {command} DIR`)"
        )
    folder = local_path(str(dest))
    with holding_destination(folder, rerun=f"stop it and run {command} again", shared_with_children=True):
        yield load_manifest(folder)


def publish_revision(dest: str, base: Manifest, revised: Manifest) -> None:
    """Publish ``revised`` in ``dest`` (held by :func:`revising`), the
    revision after ``base``.

    Raises:
        DestinationError: ``dest``'s manifest is no longer ``base`` (changed
            by hand, or by a shardkit that takes no lock): nothing is written.
    """
    folder = local_path(str(dest))
    current = load_manifest(folder)
    if current.fingerprint != base.fingerprint:
        raise DestinationError(
            f"{folder}: the dataset changed while this change ran (fingerprint {base.fingerprint[:16]}... then, "
            f"{current.fingerprint[:16]}... now); nothing was published: run the change again",
            path=folder,
        )
    # The one table it replaces: base's (a format-1 manifest had none).
    replaces = os.path.basename(base.table.file) if base.table.file else ""
    publish_manifest(folder, revised, replaces=replaces)
