"""Publishing a view's or an extension's revision (:mod:`shardkit.format.derived`).

As every revision: the rows table under its content name, then
``manifest.json`` in one rename (the commit point: a reader, or a crash,
sees the old revision or the new one), then the rows table it replaced is
removed. No command replaces a dataset that is there without ``overwrite``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from shardkit.errors import DestinationError
from shardkit.format.derived import ROWS_PREFIX, ROWS_SUFFIX, DerivedManifest
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.atomic import atomic_write_bytes, remove_quietly
from shardkit.write.destination import holding_destination


def refuse_occupied(folder: str, *, overwrite: bool, command: str, ours: str | None = None) -> None:
    """Refuse a folder that holds a dataset (unless ``overwrite``) or other
    files; ``ours``: a work folder of this command inside it, which may be there.

    Raises:
        DestinationError: Naming what is there and what to do.
    """
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise DestinationError(f"{folder}: not a folder; choose another destination for the {command}", path=folder)
        return
    entries = [e for e in os.listdir(folder) if e != ours]
    if not entries:
        return
    if MANIFEST_NAME in entries:
        if overwrite:
            return
        raise DestinationError(
            f"{folder}: holds a dataset already; choose another destination, or pass --overwrite "
            f"(overwrite=True) to replace it with this {command}",
            path=folder,
        )
    raise DestinationError(
        f"{folder}: holds files of something else ({', '.join(sorted(entries)[:3])}...); a {command} is made in an "
        "empty folder: choose another destination",
        path=folder,
    )


@contextlib.contextmanager
def holding(folder: str, command: str) -> Iterator[None]:
    """Hold ``folder`` (made if missing) as a write holds its destination."""
    os.makedirs(folder, exist_ok=True)
    with holding_destination(folder, rerun=f"stop it and run {command} again", shared_with_children=True):
        yield


def publish_derived(folder: str, manifest: DerivedManifest, *, command: str = "view", held: bool = False) -> None:
    """Publish ``manifest`` in ``folder``: rows table, ``manifest.json``, then
    rows tables no longer named removed."""
    with contextlib.nullcontext() if held else holding(folder, command):
        files = manifest.to_files()
        for name, data in files:
            atomic_write_bytes(os.path.join(folder, name), data)
        keep = files[0][0]
        for entry in os.listdir(folder):
            if entry.startswith(ROWS_PREFIX) and entry.endswith(ROWS_SUFFIX) and entry != keep:
                remove_quietly(os.path.join(folder, entry))
