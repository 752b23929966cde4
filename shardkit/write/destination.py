"""The output directory: naming shards, refusing to clobber data, failing clearly.

``--overwrite`` only removes files that shardkit itself names (shards, their
indexes, the manifest, temporaries and the resume journal); a directory that
holds anything else is refused, so a mistyped DEST never deletes user data.
The dataset card, ``README.md``, is kept: publishing rewrites it if shardkit
wrote it and leaves a user's own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator

from shardkit.errors import DestinationError
from shardkit.format.brace import BraceList, is_pattern, split_patterns
from shardkit.format.location import path_under
from shardkit.io.atomic import TMP_SUFFIX
from shardkit.io.urls import is_local, local_path
from shardkit.write.occupant import CARD_NAME, INTERRUPTED_WRITE, JOURNAL_DIR, UNFINISHED_SHARDS, describe_occupant

SHARD_PATTERN = "shard-{:06d}.tar"
_OURS = re.compile(
    r"^(shard-\d{6,}\.(tar|idx)(\.tmp)?|manifest\.json(\.tmp)?|shards-[0-9a-f]{16}\.table(\.[^/]*)?|\.shardkit-journal|\.shardkit-append)$"
)


logger = logging.getLogger(__name__)

#: How long a write waits for DEST's lock before it refuses: the processes of
#: a write that was just killed take a moment to exit and let go of it.
LOCK_WAIT_S = 5.0


#: Lock descriptors a forked child lets go of at once (see ``shared_with_children``).
_PARENT_ONLY: set[int] = set()


def _drop_parent_only_locks() -> None:
    """In a child just forked: close the lock descriptors that belong to
    the parent alone, so the lock ends with the parent's hold on it."""
    for fd in _PARENT_ONLY:
        try:
            os.close(fd)
        except OSError:
            pass
    _PARENT_ONLY.clear()


os.register_at_fork(after_in_child=_drop_parent_only_locks)


@contextlib.contextmanager
def holding_destination(
    dest: str, *, rerun: str = "stop it and rerun with --resume", shared_with_children: bool = True
) -> Iterator[None]:
    """Hold local directory ``dest`` (made if missing) for one write, index
    or upgrade, or for the life of a
    :class:`~shardkit.write.writer.ShardWriter`: an exclusive ``flock`` on
    the directory itself, so no file is added for it.

    Two writes into one folder at once (a job started again while the first
    still runs) would write the same shard names and remove each other's
    temporary files; two indexes would share one journal, and a write and an
    index would each publish their own manifest. The second is refused
    instead, once it has waited :data:`LOCK_WAIT_S` for the lock. The
    processes a write or an index forks share the lock and hold it until
    they end. Where the file system has no ``flock`` for directories (some
    network file systems) the work goes on unlocked.

    Args:
        dest: The folder.
        rerun: What the refusal tells the user to do about the other run,
            after "wait for it to end, or".
        shared_with_children: Whether processes forked meanwhile hold the
            lock too (an ``flock`` belongs to the open file, which a fork
            shares) until they end. False for a hold that is this process's
            alone (a ``ShardWriter``): DataLoader workers forked while it is
            open would otherwise keep the folder locked after it closed.

    Raises:
        DestinationError: Another of them holds ``dest``.
    """
    try:
        os.makedirs(dest, exist_ok=True)
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise output_error(exc, dest, resume_hint=False) from exc
    if not shared_with_children:
        _PARENT_ONLY.add(fd)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    logger.debug("%s: no lock for this write (%s)", dest, exc)
                    break
                if time.monotonic() >= deadline:
                    raise DestinationError(
                        f"{dest}: another shardkit write or index into this folder is running (it holds the "
                        f"folder's lock); wait for it to end, or {rerun}",
                        path=dest,
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        _PARENT_ONLY.discard(fd)
        os.close(fd)


def check_outside_source(dest: str, source: str, format: str | None) -> None:
    """Refuse a ``dest`` where the write would read its own output or
    replace its own input.

    A folder ``source`` (other than tar shards) is scanned whole, so
    ``dest`` may not be it or lie inside it: it would be scanned as one more
    (empty) class of an ImageFolder, or as files to pack. Tar shards are read
    at their folder's top level only, so a folder inside theirs is no harm,
    but their folder itself is: the write's ``shard-NNNNNN.tar`` would
    replace inputs of the same names as it goes, and ``--overwrite`` would
    remove them all before reading one. The same holds for the folders a
    shard path, a brace pattern or ``::``-joined patterns read from.

    Raises:
        DestinationError: ``dest`` is such a folder.
    """
    real_dest = os.path.realpath(dest)
    if os.path.isdir(source):
        real_source = os.path.realpath(source)
        if format == "tar" and real_dest == real_source:
            raise DestinationError(
                f"{dest}: the destination is the folder of the source shards, where the write's shards would "
                "replace them (and --overwrite would remove them first); choose a destination outside it",
                path=dest,
            )
        if format != "tar" and path_under(real_dest, real_source):
            raise DestinationError(
                f"{dest}: the destination is inside the source {source}, so the write would read its own output "
                "(as one more class folder, or as files to pack); choose a destination outside it",
                path=dest,
            )
        return
    for folder in _input_folders(source):
        if os.path.realpath(folder) == real_dest:
            raise DestinationError(
                f"{dest}: the source {source} is read from this folder, where the write's shards would replace "
                "its files (and --overwrite would remove them first); choose a destination outside it",
                path=dest,
            )


#: Most folders of a pattern's folder part looked at for :func:`check_outside_source`.
_MAX_INPUT_FOLDERS = 10_000


def _input_folders(source: str) -> set[str]:
    """The local folders a file, a brace pattern or ``::``-joined patterns read from."""
    folders: set[str] = set()
    for part in split_patterns(source):
        if not is_local(part):
            continue
        folder = os.path.dirname(local_path(part)) or "."
        if not is_pattern(folder):
            folders.add(folder)
            continue
        try:
            names = BraceList(folder)  # lazy: a range of 10^10 folders costs nothing
        except ValueError:
            continue  # nested braces, which braceexpand alone reads, and would expand whole
        folders.update(names[i] for i in range(min(len(names), _MAX_INPUT_FOLDERS)))
    return folders


def is_shardkit_name(name: str) -> bool:
    """Whether ``name`` (in DEST) is a file or folder shardkit itself writes."""
    return _OURS.match(name) is not None


def shard_name(index: int) -> str:
    """File name of shard number ``index``: ``shard-000042.tar``."""
    return SHARD_PATTERN.format(index)


#: How the command line spells the options a refused destination advises.
CLI_FLAGS = ("--resume", "--overwrite")


def check_destination(
    dest: str, *, overwrite: bool, resume: bool, keep: str | None = None, flags: tuple[str | None, str] = CLI_FLAGS
) -> None:
    """Refuse a ``dest`` that :func:`prepare_destination` would refuse, changing nothing
    (``keep``: an entry that does not count; ``flags``: how the caller spells
    resume and overwrite in its advice, resume None where it has none).

    Raises:
        DestinationError: As :func:`prepare_destination`.
    """
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise DestinationError(f"{dest}: destination exists and is not a directory", path=dest)
    if not os.path.exists(dest):
        return
    try:
        entries = sorted(e for e in os.listdir(dest) if e != keep)
    except OSError as exc:
        raise output_error(exc, dest, resume_hint=False) from exc
    if not entries or resume:
        return
    resume_flag, overwrite_flag = flags
    if not overwrite:
        held = describe_occupant(dest) or f"{len(entries)} entries (e.g. {entries[0]!r})"
        # What each spelling of resume finishes: `shardkit write`'s journal, a ShardWriter's shards.
        finishes = INTERRUPTED_WRITE if resume_flag == CLI_FLAGS[0] else UNFINISHED_SHARDS
        same = " (the same source and options)" if resume_flag == CLI_FLAGS[0] else ""
        finish = f"pass {resume_flag} to finish it{same}, " if resume_flag and held.startswith(finishes) else ""
        raise DestinationError(
            f"{dest}: holds {held}; {finish}pass {overwrite_flag} to replace it, or choose an empty directory",
            path=dest,
        )
    foreign = [e for e in entries if not _OURS.match(e) and e != CARD_NAME]
    if foreign:
        raise DestinationError(
            f"{dest}: {overwrite_flag} refuses to delete files shardkit did not write "
            f"(e.g. {foreign[0]!r}); move them or choose another directory",
            path=dest,
        )


def prepare_destination(
    dest: str, *, overwrite: bool, resume: bool, keep: str | None = None, flags: tuple[str | None, str] = CLI_FLAGS
) -> None:
    """Make sure ``dest`` is a directory we may write into.

    Args:
        dest: Output directory.
        overwrite: Remove an earlier shardkit output found there.
        resume: Keep what is there (the writer checks it shard by shard).
        keep: An entry ``overwrite`` leaves in place (the write's own work
            folder, made before).

    Raises:
        DestinationError: ``dest`` is a file, or is not empty and neither
            ``overwrite`` nor ``resume`` was given, or ``overwrite`` would
            remove files shardkit did not write.
    """
    check_destination(dest, overwrite=overwrite, resume=resume, keep=keep, flags=flags)
    try:
        os.makedirs(dest, exist_ok=True)
        entries = sorted(os.listdir(dest))
    except OSError as exc:
        raise output_error(exc, dest, resume_hint=False) from exc
    if resume:
        return
    for entry in entries:
        if entry in (CARD_NAME, keep):
            continue
        path = os.path.join(dest, entry)
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError as exc:
            raise output_error(exc, path, resume_hint=False) from exc


#: What a user can do about a failed write, by errno.
_ADVICE = {
    errno.ENOSPC: "no space left on the device; free space",
    errno.EDQUOT: "disk quota exceeded; free space or raise the quota",
    errno.EROFS: "the file system is read-only; remount it read-write or choose another DEST",
    errno.EACCES: "permission denied; make DEST writable or choose another DEST",
    errno.EPERM: "operation not permitted; make DEST writable or choose another DEST",
    errno.EIO: "I/O error from the device; check the disk",
}


def output_error(exc: OSError, path: str, *, resume_hint: bool = True) -> DestinationError:
    """A one-line :class:`DestinationError` for a failed write of ``path``.

    Args:
        exc: The error the operating system gave.
        path: The output file or directory being written.
        resume_hint: Whether finished shards are kept, so that ``--resume``
            saves work (False before any shard was written).

    Returns:
        The error to raise (``from exc``), with ``path`` set.
    """
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else path
    if where.endswith(TMP_SUFFIX):  # name the file the user knows; the temporary is gone
        where = where[: -len(TMP_SUFFIX)]
    advice = _ADVICE.get(exc.errno or 0, f"{exc.strerror or exc}; fix the cause")
    rerun = "then rerun with --resume" if resume_hint else "then rerun"
    return DestinationError(f"{where}: cannot write: {advice}, {rerun}", path=where)


def check_free_space(dest: str, file_sizes: Iterable[int]) -> None:
    """Refuse to start when the files a plan will write cannot fit in ``dest``.

    Each file is counted in whole blocks of the file system, as it will be
    stored.

    Args:
        dest: An existing local output directory.
        file_sizes: Sizes in bytes of the files to write (shards, indexes,
            journal records, the manifest).

    Raises:
        DestinationError: The file system holding ``dest`` has less space
            free for this user than needed; both numbers are in the message.
    """
    try:
        stats = os.statvfs(dest)
    except (OSError, AttributeError):  # no statvfs here: cannot tell, so try
        return
    block = max(stats.f_frsize, 1)
    required = sum(-(-size // block) * block for size in file_sizes)
    free = stats.f_bavail * stats.f_frsize
    if required > free:
        raise DestinationError(
            f"{dest}: not enough free space: the plan needs {required} bytes ({_mb(required)}) "
            f"and {free} bytes ({_mb(free)}) are free; free space or choose another DEST, then rerun",
            path=dest,
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
