"""The output directory: naming shards and refusing to clobber data.

``--overwrite`` only removes files that shardkit itself names (shards, their
indexes, the manifest, temporaries and the resume journal); a directory that
holds anything else is refused, so a mistyped DEST never deletes user data.
"""

from __future__ import annotations

import os
import re
import shutil

from shardkit.errors import DestinationError

SHARD_PATTERN = "shard-{:06d}.tar"
JOURNAL_DIR = ".shardkit-journal"
_OURS = re.compile(r"^(shard-\d{6,}\.(tar|idx)(\.tmp)?|manifest\.json(\.tmp)?|\.shardkit-journal)$")


def shard_name(index: int) -> str:
    """File name of shard number ``index``: ``shard-000042.tar``."""
    return SHARD_PATTERN.format(index)


def prepare_destination(dest: str, *, overwrite: bool, resume: bool) -> None:
    """Make sure ``dest`` is a directory we may write into.

    Args:
        dest: Output directory.
        overwrite: Remove an earlier shardkit output found there.
        resume: Keep what is there (the writer checks it shard by shard).

    Raises:
        DestinationError: ``dest`` is a file, or is not empty and neither
            ``overwrite`` nor ``resume`` was given, or ``overwrite`` would
            remove files shardkit did not write.
    """
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise DestinationError(f"{dest}: destination exists and is not a directory", path=dest)
    os.makedirs(dest, exist_ok=True)
    entries = sorted(os.listdir(dest))
    if not entries or resume:
        return
    if not overwrite:
        raise DestinationError(
            f"{dest}: destination is not empty ({len(entries)} entries, e.g. {entries[0]!r}); "
            "pass --resume to finish an interrupted write, --overwrite to replace it, "
            "or choose an empty directory",
            path=dest,
        )
    foreign = [e for e in entries if not _OURS.match(e)]
    if foreign:
        raise DestinationError(
            f"{dest}: --overwrite refuses to delete files shardkit did not write "
            f"(e.g. {foreign[0]!r}); move them or choose another directory",
            path=dest,
        )
    for entry in entries:
        path = os.path.join(dest, entry)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
