"""The command-line flag of each :class:`~shardkit.write.parallel.WriteOptions` field.

``shardkit write`` sets these fields from these flags (flags win over
``--config``), and the writer's messages name an option as both spell it
(``--download-threads (download_threads)``), whichever way it was given.
"""

from __future__ import annotations

#: WriteOptions field -> ``shardkit write`` flag.
WRITE_FLAGS = {
    "format": "--format",
    "max_samples": "--max-samples",
    "max_bytes": "--max-bytes",
    "shuffle": "--no-shuffle",
    "seed": "--seed",
    "workers": "--workers",
    "on_error": "--on-error",
    "compress_members": "--compress-members",
    "engine": "--engine",
    "ray_address": "--ray-address",
    "max_unpack_bytes": "--max-unpack-bytes",
    "files_root": "--files-root",
    "fields": "--field",
    "key_column": "--key",
    "resize": "--resize",
    "resize_mode": "--resize-mode",
    "image_format": "--image-format",
    "image_quality": "--image-quality",
    "download_threads": "--download-threads",
    "max_connections_per_host": "--max-connections-per-host",
    "connect_timeout_s": "--connect-timeout",
    "read_timeout_s": "--read-timeout",
    "download_retries": "--retries",
    "respect_opt_out": "--no-respect-opt-out",
    "user_agent_contact": "--user-agent-contact",
    "s3_anonymous": "--s3-anonymous",
}
