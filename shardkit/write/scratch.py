"""Scratch folders that a killed process does not leave behind for long.

A dry run's spills and plan, and ``shardkit index``'s listing and results,
live in a scratch folder that their process removes when it ends. A process
killed by ``SIGKILL`` or ``SIGTERM`` cannot; so each scratch folder holds an
exclusive ``flock`` on its lock file for its owner's lifetime, and the next
process to make a folder of that kind removes those whose lock nobody holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

_LOCK_NAME = "owner.lock"

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def scratch_folder(prefix: str, parent: str | None = None) -> Iterator[str]:
    """A new folder named ``prefix...`` under ``parent`` (default: the
    temporary directory), removed on exit; it holds an exclusive ``flock``
    on its lock file until then, so that :func:`remove_orphans` can tell it
    from one whose owner was killed. Orphans of the same prefix there are
    removed first."""
    remove_orphans(prefix, parent)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent) as folder:
        # Locked under another name, then renamed: a sweep never finds the
        # lock file before it is held.
        unnamed = os.path.join(folder, ".owner.lock.new")
        fd = os.open(unnamed, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(unnamed, os.path.join(folder, _LOCK_NAME))
            yield folder
        finally:
            os.close(fd)


def remove_orphans(prefix: str, parent: str | None = None) -> list[str]:
    """Remove the folders named ``prefix...`` under ``parent`` (the temporary
    directory) that this user owns and whose lock no process holds: their
    owners were killed. A folder without its lock file is left alone (its
    owner may be about to lock it). Returns the folders removed."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(entry.path, _LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its owner is still running
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    if removed:
        logger.info("removed %d scratch folder(s) left by killed runs under %s", len(removed), parent)
    return removed
