"""The options of a write (:func:`~shardkit.write.parallel.write_dataset`,
``shardkit write``): one frozen dataclass, checked when made, that
``configs/*.yaml`` loads into and the command line's flags override."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardkit.errors import UsageError
from shardkit.format.compression import COMPRESSIONS, Compression
from shardkit.write.fieldmap import FieldMap
from shardkit.write.limits import DEFAULT_MAX_BYTES, ShardLimits
from shardkit.write.sources.base import DEFAULT_MAX_UNPACK_BYTES, PARTITION_BYTES
from shardkit.write.sources.table import IngestOptions, ingest_options

ON_ERROR_POLICIES = ("raise", "skip")
ENGINES = ("local", "ray")


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """Options of :func:`write_dataset` (and of ``shardkit write``).

    An option only some source kinds use (``max_unpack_bytes``,
    ``partition_bytes``, ``files_root``, the table options) set for a source
    of another kind is refused before scanning, naming it (see
    :func:`~shardkit.write.sources.check_options`).

    Attributes:
        format: Source format, or None to detect it.
        max_samples: Most samples per shard.
        max_bytes: Most bytes per shard file: its real tar size, headers and
            padding included. Only a single sample larger than the limit
            exceeds it, in a shard of its own, with a warning.
        shuffle: Globally shuffle samples before cutting shards.
        seed: Shuffle seed.
        workers: Scanning and writer processes; None means all cores. With
            ``engine="ray"``: scan tasks, then shard tasks, in flight at once
            (None: two per CPU of the cluster). Output does not depend on it.
        on_error: ``"raise"`` or ``"skip"`` for unusable inputs; None (the
            default) raises for unreadable inputs and skips rows of a table
            whose fields could not be downloaded or are not images (recorded
            in the manifest with their reason, as img2dataset does).
        resume: Keep finished shards of an interrupted run and write the rest.
        overwrite: Replace an earlier output in ``dest``.
        compress_members: ``"gzip"`` or ``"zstd"`` to compress the members
            whose extension compresses well (text, JSON, ``npy``...; see
            :data:`~shardkit.format.compression.COMPRESSIBLE_EXTENSIONS`;
            never images or other compressed media), stored as ``KEY.txt.gz``
            / ``KEY.txt.zst`` (webdataset's convention) with a fixed level
            and no timestamps, so shards stay byte-reproducible; None (the
            default) stores members as they are. ``max_bytes`` is planned
            with the uncompressed sizes, so such shards come out smaller.
        engine: ``"local"`` (a process pool on this machine) or ``"ray"``
            (one Ray task per partition to scan, then one per shard, on a
            Ray cluster whose nodes all see the source by the same path;
            needs ``pip install 'shardkit[ray]'``). The output does not
            depend on it. See :mod:`shardkit.write.scan_ray` and
            :mod:`shardkit.write.engine_ray`.
        ray_address: With ``engine="ray"``: ``"auto"`` (the running
            cluster), ``HOST:PORT`` of its head, or None for Ray's default
            (``RAY_ADDRESS``, a running cluster, else a local one).
        ray_max_retries: With ``engine="ray"``: how often a failed shard
            task is run again (a lost worker or node, or an error) before
            the write stops.
        max_unpack_bytes: Most temporary bytes the plain copies of input
            shards compressed whole (``.tar.gz``, ``.tar.zst``) may take, all
            together, in DEST's work folder (``DEST/.shardkit-journal/unpack``): 64 GiB
            by default (:data:`~shardkit.write.sources.base.DEFAULT_MAX_UNPACK_BYTES`),
            None for no limit but the folder's free space. Past it the write
            stops before writing anything, naming the input and the limit.
            The copies go when the write ends; those of a write that was
            killed go when the next write on the same DEST starts (or with
            DEST).
        partition_bytes: Length of one JSONL partition, the unit a scanning
            worker takes (64 MiB by default). The output does not depend on it.
        files_root: The folder a JSONL source's or a table's rows may name
            files in (None: the JSONL file's or the table's own). A row naming
            a file outside it, by an absolute path or ``..``, is refused, so a
            JSONL from elsewhere cannot copy ``~/.ssh`` into a dataset you publish.
        resize, resize_mode, image_format, image_quality: How image fields
            are stored, for every source (a table's as they are downloaded;
            any other's, and what a ``map`` returns, in the map stage);
            ``resize_mode`` needs ``resize`` and ``image_quality`` a re-encode.
        fields, key_column, download_threads, max_connections_per_host,
        connect_timeout_s, read_timeout_s, download_retries, respect_opt_out,
        user_agent_contact, s3_anonymous:
            Table sources only: columns to fields, downloads (see
            :class:`~shardkit.write.sources.table.IngestOptions`, which they make).
        first_shard: The number of the first shard (``shard-000000.tar``
            by default); :func:`shardkit.append` numbers the shards it adds
            after the dataset's last.
    """

    format: str | None = None
    max_samples: int | None = None
    max_bytes: int | None = DEFAULT_MAX_BYTES
    shuffle: bool = True
    seed: int = 0
    workers: int | None = None
    on_error: str | None = None
    resume: bool = False
    overwrite: bool = False
    compress_members: Compression | None = None
    engine: str = "local"
    ray_address: str | None = None
    ray_max_retries: int = 3
    max_unpack_bytes: int | None = DEFAULT_MAX_UNPACK_BYTES
    partition_bytes: int = PARTITION_BYTES
    files_root: str | None = None
    fields: tuple[str, ...] = ()
    key_column: str | None = None
    resize: int | None = None
    resize_mode: str = "keep_ratio"
    image_format: str | None = None
    image_quality: int = 95
    download_threads: int = 16
    max_connections_per_host: int = 4
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0
    download_retries: int = 2
    respect_opt_out: bool = True
    user_agent_contact: str | None = None
    s3_anonymous: bool = False
    first_shard: int = 0

    def __post_init__(self) -> None:
        if type(self.first_shard) is not int or self.first_shard < 0:
            raise UsageError(f"first_shard must be an integer >= 0, got {self.first_shard!r}")
        if type(self.partition_bytes) is not int or self.partition_bytes < 1:
            raise UsageError(f"partition_bytes must be a positive integer, got {self.partition_bytes!r}")
        if self.max_unpack_bytes is not None and (type(self.max_unpack_bytes) is not int or self.max_unpack_bytes < 1):
            raise UsageError(f"max_unpack_bytes must be a positive integer or None, got {self.max_unpack_bytes!r}")
        if self.engine not in ENGINES:
            raise UsageError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError("ray_address is only used with engine='ray'; pass --engine ray")
        if not isinstance(self.ray_max_retries, int) or self.ray_max_retries < 0:
            raise UsageError(f"ray_max_retries must be a non-negative integer, got {self.ray_max_retries!r}")
        if self.compress_members is not None and self.compress_members not in COMPRESSIONS:
            raise UsageError(
                f"compress_members must be one of {COMPRESSIONS} or None, got {self.compress_members!r}"
            )
        if self.on_error is not None and self.on_error not in ON_ERROR_POLICIES:
            raise UsageError(f"on_error must be one of {ON_ERROR_POLICIES}, got {self.on_error!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise UsageError(f"workers must be a positive integer, got {self.workers!r}")
        if not isinstance(self.seed, int):
            raise UsageError(f"seed must be an integer, got {self.seed!r}")
        if self.resume and self.overwrite:
            raise UsageError("resume and overwrite exclude each other")
        ShardLimits(max_samples=self.max_samples, max_bytes=self.max_bytes)  # validates
        self.field_map()
        self.ingest_options()
        if self.resize is None and self.image_format is None:  # nothing is re-encoded: they would do nothing
            if self.resize_mode != "keep_ratio":
                raise UsageError("--resize-mode (resize_mode) applies with --resize only; add --resize N")
            if self.image_quality != 95:
                raise UsageError(
                    "--image-quality (image_quality) applies to re-encoded images only; add --resize N or --image-format"
                )

    @property
    def input_errors(self) -> str:
        """The policy for unreadable inputs (``on_error``, default raise)."""
        return self.on_error or "raise"

    @property
    def download_errors(self) -> str:
        """The policy for table rows that could not be fetched (``on_error``, default skip)."""
        return self.on_error or "skip"

    def shard_arguments(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~shardkit.write.shard_task.write_shard` these options set."""
        return {
            "on_error": self.input_errors,
            "compress_members": self.compress_members,
            "ingest": self.ingest_options(),
            "download_errors": self.download_errors,
        }

    def field_map(self) -> FieldMap:
        """The table column mapping (``fields`` and ``key_column``)."""
        return FieldMap.parse(self.fields, key_column=self.key_column)

    def ingest_options(self) -> IngestOptions:
        """How shard writers fetch and prepare table fields."""
        return ingest_options(self)

    def recorded(self) -> dict:
        """The options that shape the output, as stored in the manifest."""
        recorded = {
            "max_samples": self.max_samples,
            "max_bytes": self.max_bytes,
            "shuffle": self.shuffle,
            "on_error": self.input_errors,
        }
        if self.fields or self.key_column is not None:  # table sources only: absent otherwise
            recorded.update(fields=list(self.fields), key_column=self.key_column)
        if self.resize is not None or self.image_format is not None:
            recorded.update(resize=self.resize, resize_mode=self.resize_mode, image_format=self.image_format,
                            image_quality=self.image_quality)  # fmt: skip
        if self.compress_members is not None:  # absent otherwise: older manifests stay as they were
            recorded["compress_members"] = self.compress_members
        return recorded
