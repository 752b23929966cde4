"""Looking at a device lock from outside its holder."""

from __future__ import annotations

import fcntl
import os

from shardkit.io.device import DeviceLock


def held_elsewhere(lock: DeviceLock) -> bool:
    """Whether some holder has the lock (tried from a fresh open file, which
    flock treats as another owner)."""
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
