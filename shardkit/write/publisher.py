"""Where a finished shard goes: the one place that stages and publishes a shard with its index.

A :class:`ShardPublisher` is chosen once per write, from DEST:

* a local folder: each shard is written in place (temporary name, fsync,
  rename: see :class:`~shardkit.write.shard.ShardFile`);
* an ``s3://`` or other fsspec URL: each shard is written into a temporary
  folder of the process (or Ray node) writing it, then the shard and its
  index are handed to the :class:`~shardkit.io.base.Destination` and the
  folder removed. How a file lands whole there (multipart upload, temporary
  name and move) is the destination backend's business.

It pickles small (a path and a URL), so a process pool or a Ray task carries
it to wherever the shard is written. The manifest is published last by the
driver (:func:`shardkit.write.publish.publish_manifest`), so a reader that
finds a manifest finds every shard it lists.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from shardkit.format.index import index_path_for
from shardkit.io.registry import open_destination

log = logging.getLogger(__name__)

R = TypeVar("R")

#: Prefix of the temporary folder a shard is staged in before its upload.
STAGE_PREFIX = "shardkit-stage-"


@dataclass(frozen=True)
class ShardPublisher:
    """Where a write's shards go.

    Attributes:
        folder: The local folder of the write: DEST itself, or for a remote
            DEST the driver's staging folder (its work folder lives there).
        url: The remote DEST (``s3://``, fsspec), or None for a local one.
    """

    folder: str
    url: str | None = None

    @property
    def remote(self) -> bool:
        """Whether shards are staged and uploaded (rather than written in place)."""
        return self.url is not None

    def publish(self, name: str, write: Callable[[str], R]) -> R:
        """Have ``write(folder)`` write shard ``name`` (and its index) into a
        folder, and publish both.

        Args:
            name: The shard's file name (``shard-000042.tar``).
            write: Writes the shard and its index into the folder it is given;
                its return value is returned.

        Raises:
            RemoteError: An upload failed for good (the shard is not at DEST).
            Whatever ``write`` raises.
        """
        if self.url is None:
            return write(self.folder)
        staging = tempfile.mkdtemp(prefix=STAGE_PREFIX)
        try:
            result = write(staging)
            destination = open_destination(self.url)
            for member in (name, index_path_for(name)):
                destination.put_file(os.path.join(staging, member), member)
                log.debug("uploaded %s", destination.object_url(member))
            return result
        finally:
            shutil.rmtree(staging, ignore_errors=True)
