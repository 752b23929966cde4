"""Crash-safe file output: write under a temporary name, fsync, rename.

A reader (or ``--resume``) never sees a half-written file under its final
name: the rename is the commit point, and the directory is fsynced after it so
the rename itself survives a power loss.
"""

from __future__ import annotations

import os
import shutil

TMP_SUFFIX = ".tmp"


def fsync_dir(path: str) -> None:
    """Flush a directory entry change (a rename) to disk."""
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp_path: str, final_path: str) -> None:
    """Rename a fully written and fsynced temporary file to its final name."""
    os.replace(tmp_path, final_path)
    fsync_dir(os.path.dirname(final_path))


def atomic_write_bytes(path: str, data: bytes, *, sync_dir: bool = True, sync: bool = True) -> None:
    """Write ``data`` to ``path`` so that it appears whole or not at all.

    Args:
        sync_dir: fsync the directory after the rename. A caller that renames
            another file in the same directory right after (and syncs then)
            can pass False to save one flush.
        sync: fsync the file before the rename. False for a file whose loss or
            tearing at a power cut is found and made again (a scan's spill
            summary: torn, it does not parse, and the partition is scanned
            again), never for what a reader relies on.
    """
    tmp = path + TMP_SUFFIX
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        remove_quietly(tmp)  # a full disk leaves no half temporary behind
        raise
    if sync_dir:
        commit(tmp, path)
    else:
        os.replace(tmp, path)


def atomic_copy_file(src: str, path: str, *, sync_dir: bool = True) -> None:
    """Copy the file ``src`` to ``path`` so that it appears whole or not at all.

    On failure (a full disk, say) the temporary copy is removed and the
    error raised.
    """
    tmp = path + TMP_SUFFIX
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 8 << 20)
            fout.flush()
            os.fsync(fout.fileno())
    except BaseException:
        remove_quietly(tmp)
        raise
    if sync_dir:
        commit(tmp, path)
    else:
        os.replace(tmp, path)


def remove_quietly(path: str) -> None:
    """Remove ``path`` if it exists; errors are ignored (cleanup after a failure)."""
    try:
        os.unlink(path)
    except OSError:
        pass
