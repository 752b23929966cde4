"""The dataset manifest: ``manifest.json``, the contract between writer and reader.

``manifest.json`` is the dataset's small, human-readable entry point; the
per-shard metadata lives in a shard table beside it (see
:mod:`shardkit.format.table`)::

    {
      "format": "shardkit",
      "format_version": 2,
      "num_samples": 500, "num_bytes": 55308288, "num_shards": 4,
      "extensions": ["cls", "jpg"],
      "class_names": ["cat", "dog"],
      "source": {"format": "imagefolder", "path": "data/train"},
      "options": {"max_samples": 128, "max_bytes": null, "shuffle": true, ...},
      "seed": 0,
      "skipped": [{"path": "data/train/cat/x.jpg", "reason": "..."}],
      "fingerprint": "<sha256 of the shards' paths, checksums and counts>",
      "naming": {"shard": "shard-{:06d}.tar", "index": "shard-{:06d}.idx"},
      "table": {"path": "shards-0123456789abcdef.table", "num_bytes": 640, "sha256": "..."}
    }

``naming`` is present when every shard is named by its position as the
writer names them; the table then stores no path strings.

Format 1 (before the shard table) listed every shard in the JSON under
``"shards"``. It still loads, as slowly as ever, and logs once how to bring
it to format 2 (``shardkit upgrade DEST``); its fingerprint is computed as
format 1 did, so reader states saved before an upgrade still resume.

A dataset that records token counts (:mod:`shardkit.format.tokens`) names
its token fields, ``"token_fields": ["tokens.npy"]``, in the order of the
table's ``tokens`` column, as ``"format_version": 3`` (:data:`TOKENS_VERSION`),
which a shardkit from before token counts refuses by its version. Without
token fields the manifest stays format 2, byte for byte as before.

A dataset samples were removed from (``"format_version": 4``, ``"removed":
{...}``) is described in :mod:`shardkit.format.removed`; one grown by
appends (``"appended": [...]``, any version) in :mod:`shardkit.revise.append`.

A dataset written with ``compress_members`` also has ``"member_compression":
"gzip"`` (or ``"zstd"``): its text-like members are stored compressed, as
``KEY.txt.gz`` (see :mod:`shardkit.format.compression`).

When more inputs were left out than :data:`SKIPPED_LISTED`, ``"skipped"``
lists the first in source order and ``"skipped_counts"`` counts them all.

A manifest that ``shardkit index SOURCE --out DIR`` wrote beside no shards
also has ``"shards_base"``: the absolute folder or URL prefix of its shards
(:func:`~shardkit.format.location.check_shards_base`), which its shard
paths are relative to; its index paths are relative to its own folder.

Shard and index paths are relative to the manifest's folder (or URL prefix),
the dataset's base location, and must stay inside it (see
:mod:`shardkit.format.location`: no ``..``, no absolute path, no scheme of
their own unless the reader allows the location). A manifest is data from
wherever it was fetched, so loading one checks its size
(:data:`MAX_MANIFEST_BYTES`), its nesting (:data:`MAX_MANIFEST_DEPTH`, before
the JSON is parsed), the type and range of every field, and that the table
agrees with it. The JSON is written with sorted keys and no timestamps, so
the same dataset gives the same manifest and table bytes.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


from shardkit.errors import ManifestError
from shardkit.format.appended import Appended
from shardkit.format.location import check_shards_base, open_regular, redact_url, resolve_inside
from shardkit.format.format1 import table_from_list
from shardkit.format.manifest_checks import DERIVED_VERSION, FORMAT_NAME, MANIFEST_NAME, MAX_COUNT, appended_revisions, check_fields, json_depth_exceeds, short
from shardkit.format.table import (
    TABLE_ADVICE,
    Naming,
    ShardEntry,
    ShardTable,
    ShardView,
    check_totals,
    open_table,
    table_from_entries,
    table_name,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
#: The version of a manifest that records token counts (format 2 plus
#: ``token_fields`` and the table's ``tokens`` column).
TOKENS_VERSION = 3
#: The version of a manifest whose table lists removed samples (``shardkit
#: remove``, see :mod:`shardkit.format.removed`): format 2 or 3 plus
#: ``removed`` and the table's ``removed`` column. A shardkit from before it
#: refuses it by its version, rather than read the removed samples back.
REMOVED_VERSION = 4
#: Versions this shardkit reads (1: the shard list in the JSON).
SUPPORTED_VERSIONS = (1, 2, 3, 4)
#: Most earlier fingerprints a manifest lists (one per removal made).
MAX_EARLIER_FINGERPRINTS = 10_000

#: Largest manifest accepted, in bytes (1 GiB: millions of shards in format 1).
MAX_MANIFEST_BYTES = 1 << 30
#: Deepest nesting of JSON arrays and objects accepted in a manifest; a
#: shardkit manifest needs 3, ``source`` and ``options`` may add a few.
MAX_MANIFEST_DEPTH = 64

#: Opens a format-2 manifest's table: (manifest location, table reference,
#: naming, where for messages) -> table.
TableOpener = Callable[[str, Mapping[str, Any], "Naming | None", str], ShardTable]

_warned_upgrade: set[str] = set()
#: Marks the log record that says to run ``shardkit upgrade`` (which that
#: command itself filters out).
UPGRADE_HINT = "shardkit_upgrade_hint"


@dataclass(frozen=True)
class SkippedInput:
    """An input left out under ``on_error="skip"``, and why."""

    path: str
    reason: str


#: Most skipped inputs a manifest lists (the first in source order); all of
#: them are counted by reason (:attr:`Manifest.skipped_counts`). A table of
#: URLs at LAION's scale leaves out 10**8 rows or more: listed whole, they
#: would make manifest.json gigabytes, and the writer's memory grow with them.
SKIPPED_LISTED = 1000


def skip_category(reason: str) -> str:
    """The category a skip record's reason starts with (``http_404``,
    ``timeout``, ``not_image``...), or ``input`` for other skipped inputs."""
    head, colon, _ = reason.partition(":")
    return head if colon and head and head.replace("_", "").isalnum() and head.islower() else "input"


@dataclass(frozen=True)
class Manifest:
    """A written dataset: its shards in order and how it was made.

    Attributes:
        shards: Shard entries in dataset order: a read-only sequence over the
            shard table, each :class:`ShardEntry` built when accessed. Given
            a tuple of entries, the manifest builds its table from them.
        extensions: Field extensions present in the samples, sorted.
        class_names: Class names by label index (ImageFolder sources), or None.
        source: ``{"format": ..., "path": ...}`` of the input.
        options: Writer options that shape the output (not worker count).
        seed: Shuffle seed, or None when the order was kept.
        skipped: Inputs skipped under ``on_error="skip"``: all of them, or
            the first :data:`SKIPPED_LISTED` in source order when
            :attr:`skipped_counts` is set.
        skipped_counts: Every skipped input counted by category
            (:func:`skip_category`), when ``skipped`` lists only some; None
            when it lists them all.
        member_compression: ``"gzip"`` or ``"zstd"`` when the writer
            compressed members (``KEY.txt.gz``), else None.
        location: Where the manifest was loaded from (a directory or URL
            prefix); not serialized. Shard paths resolve inside it.
        origin: The manifest file or URL it was loaded from, for messages;
            not serialized.
        stored_fingerprint: The fingerprint a format-2 manifest records
            (None: computed from the table, see :attr:`fingerprint`).
        loaded_version: The format version it was loaded from (the current
            one for a manifest built in memory).
        shards_base: Where the shards are when they are not beside the
            manifest (an index written with ``--out``): an absolute folder or
            URL prefix; shard paths resolve inside it, index paths inside
            :attr:`base`. None: the shards are beside the manifest.
        token_fields: The fields whose token counts the table's ``tokens``
            column and the indexes' third array hold, in column order
            (empty: none recorded; see :mod:`shardkit.format.tokens`).
        earlier_fingerprints: The fingerprints the dataset had before each
            removal of samples from it, oldest first (see
            :mod:`shardkit.format.removed`).
        appended: Each revision before an append, oldest first
            (:class:`~shardkit.format.appended.Appended`).
    """

    shards: Sequence[ShardEntry]
    extensions: tuple[str, ...] = ()
    class_names: tuple[str, ...] | None = None
    source: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None
    skipped: tuple[SkippedInput, ...] = ()
    location: str | None = field(default=None, compare=False)
    member_compression: str | None = None
    origin: str | None = field(default=None, compare=False)
    stored_fingerprint: str | None = field(default=None, compare=False, repr=False)
    loaded_version: int = field(default=FORMAT_VERSION, compare=False, repr=False)
    shards_base: str | None = None
    skipped_counts: Mapping[str, int] | None = None
    token_fields: tuple[str, ...] = ()
    earlier_fingerprints: tuple[str, ...] = ()
    appended: tuple[Appended, ...] = ()

    @property
    def num_removed(self) -> int:
        """Samples removed from the shards (``shardkit remove``): not counted
        in :attr:`num_samples`, never read."""
        removed = self.table.removed
        return 0 if removed is None else len(removed)

    @property
    def num_skipped(self) -> int:
        """Inputs left out when the dataset was made (listed or not)."""
        return sum(self.skipped_counts.values()) if self.skipped_counts is not None else len(self.skipped)

    @property
    def skipped_by_category(self) -> dict[str, int]:
        """:attr:`num_skipped` by :func:`skip_category`."""
        if self.skipped_counts is not None:
            return dict(self.skipped_counts)
        return dict(collections.Counter(skip_category(s.reason) for s in self.skipped))

    def __post_init__(self) -> None:
        if isinstance(self.shards, ShardTable):
            object.__setattr__(self, "shards", ShardView(self.shards))
        elif not isinstance(self.shards, ShardView):
            object.__setattr__(self, "shards", ShardView(table_from_entries(self.shards)))
        tokens = self.table.tokens
        if len(self.token_fields) != (0 if tokens is None else tokens.shape[1]):
            where = self.table.file or self.name
            raise ManifestError(
                f"{where}: the shard table counts tokens of {0 if tokens is None else tokens.shape[1]} fields, the "
                f"manifest names {len(self.token_fields)} ({list(self.token_fields)[:4]}); {TABLE_ADVICE}",
                path=where,
            )

    @classmethod
    def from_table(cls, table: ShardTable, **fields: Any) -> Manifest:
        """A manifest over ``table``; ``fields`` as for the constructor."""
        return cls(shards=ShardView(table), **fields)

    @property
    def table(self) -> ShardTable:
        """The shard table (per-shard columns as arrays)."""
        return self.shards.table  # type: ignore[attr-defined]

    @property
    def num_samples(self) -> int:
        return self.table.num_samples

    @property
    def num_bytes(self) -> int:
        return self.table.total_bytes

    @property
    def num_shards(self) -> int:
        return self.table.num_shards

    @property
    def fingerprint(self) -> str:
        """A hash of the shards' paths, checksums and counts: identifies the
        dataset's content (stored in format 2; computed, looping over the
        shards, for a manifest built in memory or read from format 1)."""
        if self.stored_fingerprint is None:
            object.__setattr__(self, "stored_fingerprint", self.table.fingerprint())
        assert self.stored_fingerprint is not None
        return self.stored_fingerprint

    @property
    def base(self) -> str:
        """The dataset's base location: every shard and index resolves inside it.

        The folder or URL prefix the manifest was loaded from (the working
        directory for a manifest built in memory without a ``location``).
        """
        return self.location if self.location is not None else os.getcwd()

    @property
    def shard_base(self) -> str:
        """Where shard paths resolve: :attr:`shards_base` when the manifest
        declares one, else :attr:`base`."""
        return self.shards_base if self.shards_base is not None else self.base

    @property
    def name(self) -> str:
        """The manifest's file or URL (redacted), for messages."""
        if self.origin is not None:
            return redact_url(self.origin)
        if self.location is None:
            return "<manifest>"
        return redact_url(self.location.rstrip("/") + "/" + MANIFEST_NAME)

    def resolve(
        self, relative: str, *, allowed_prefixes: Sequence[str] = (), what: str = "path", shard: bool = False
    ) -> str:
        """Turn a manifest entry into the path or URL to open, inside :attr:`base`.

        Args:
            relative: The entry, relative to the manifest's folder (to
                :attr:`shard_base` with ``shard=True``).
            allowed_prefixes: Locations outside the dataset the reader trusts
                (``SourceOptions.allowed_prefixes``).
            what: Names the entry in messages (``"shard 3 path"``).
            shard: The entry is a shard path (resolved under
                :attr:`shard_base`), not an index or table.

        Raises:
            ManifestError: The entry leaves the dataset (see
                :func:`~shardkit.format.location.resolve_inside`).
        """
        base = self.shard_base if shard else self.base
        return resolve_inside(base, relative, allowed_prefixes=allowed_prefixes, what=f"{self.name}: {what}")

    # Confinement is checked on each access, with or without a naming
    # pattern: a generated name has no '/' or '..', but a local shard under
    # it may still be a symlink leading out of the dataset.
    def shard_url(self, shard: int, *, allowed_prefixes: Sequence[str] = ()) -> str:
        """The path or URL of shard number ``shard`` (see :meth:`resolve`)."""
        return self.resolve(
            self.table.path(shard), allowed_prefixes=allowed_prefixes, what=f"shard {shard} path", shard=True
        )

    def index_url(self, shard: int, *, allowed_prefixes: Sequence[str] = ()) -> str:
        """The path or URL of shard number ``shard``'s offset index (see :meth:`resolve`)."""
        return self.resolve(self.table.index_path(shard), allowed_prefixes=allowed_prefixes, what=f"shard {shard} index")

    def table_file(self) -> tuple[str, bytes]:
        """The table's file name and bytes, as :meth:`to_json` names them."""
        data = self.table.encode()
        return table_name(self.table.file_sha256()), data

    def to_dict(self) -> dict[str, Any]:
        """The format-2 JSON object (the table itself is :meth:`table_file`)."""
        name, data = self.table_file()
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "num_shards": self.num_shards,
            "extensions": list(self.extensions),
            "class_names": None if self.class_names is None else list(self.class_names),
            "source": dict(self.source),
            "options": dict(self.options),
            "seed": self.seed,
            "skipped": [asdict(s) for s in self.skipped],
            "fingerprint": self.fingerprint,
            "table": {"path": name, "num_bytes": len(data), "sha256": self.table.file_sha256()},
        }
        if self.table.naming is not None:
            out["naming"] = self.table.naming.to_dict()
        if self.member_compression is not None:
            out["member_compression"] = self.member_compression
        if self.shards_base is not None:
            out["shards_base"] = self.shards_base
        if self.skipped_counts is not None:
            out["skipped_counts"] = dict(sorted(self.skipped_counts.items()))
        if self.token_fields:
            out["token_fields"] = list(self.token_fields)
        if self.table.removed is not None:
            out["removed"] = {"num_samples": self.num_removed, "earlier_fingerprints": list(self.earlier_fingerprints)}
        if self.appended:
            out["appended"] = [a.to_dict() for a in self.appended]
        return out

    @property
    def format_version(self) -> int:
        """The format this manifest is written as: the oldest that holds it."""
        if self.table.removed is not None:
            return REMOVED_VERSION
        return TOKENS_VERSION if self.token_fields else FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    def to_format1_json(self) -> str:
        """The manifest as format 1 wrote it (every shard in the JSON): for
        tests and tools that make datasets of earlier shardkits."""
        if self.table.removed is not None:
            raise ValueError("format 1 cannot say which samples were removed")
        data = {k: v for k, v in self.to_dict().items() if k not in ("table", "naming", "fingerprint", "token_fields")}
        data["format_version"] = 1
        data["shards"] = [asdict(s) for s in self.shards]
        return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    def to_files(self) -> list[tuple[str, bytes]]:
        """The files that hold this manifest, in the order to publish them:
        the table first, ``manifest.json`` (the commit point) last."""
        name, data = self.table_file()
        return [(name, data), (MANIFEST_NAME, self.to_json().encode("utf-8"))]

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        location: str | None = None,
        origin: str | None = None,
        open_table: TableOpener | None = None,
    ) -> Manifest:
        """Build a manifest from parsed JSON, checking format, field types, ranges and totals.

        Args:
            data: The parsed JSON object.
            location: The folder or URL prefix the manifest came from.
            origin: The manifest file or URL, for messages.
            open_table: Opens a format-2 manifest's table (default: the
                local file beside the manifest, see :func:`open_local_table`).

        Raises:
            ManifestError: Wrong format or version, missing or mistyped fields,
                counts out of range, totals that disagree with the shard list
                or table, or a table that is missing or damaged.
        """
        where = redact_url(origin) if origin else (location.rstrip("/") + "/" + MANIFEST_NAME if location else "<manifest>")
        if data.get("format") != FORMAT_NAME:
            raise ManifestError(f"{where}: not a shardkit manifest (format={short(data.get('format'))})", path=location)
        version = data.get("format_version")
        if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
            raise ManifestError(
                f"{where}: manifest format_version {short(version)} is not supported by this shardkit "
                f"(supports {', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade shardkit or rewrite the dataset",
                path=location,
            )
        check_fields(data, where, location, version)
        shards_base = None
        if data.get("shards_base") is not None:
            shards_base = check_shards_base(data["shards_base"], manifest_location=location, where=where)
        if version == 1:
            table, fingerprint = table_from_list(data["shards"], where, location)
            if where not in _warned_upgrade:
                _warned_upgrade.add(where)
                dest = location if location is not None else "DEST"
                logger.warning(
                    "%s: dataset in manifest format 1 (opens slowly at many shards); run `shardkit upgrade %s` "
                    "to bring it to format %d", where, redact_url(dest), FORMAT_VERSION,
                    extra={UPGRADE_HINT: True},
                )
        else:
            naming = _naming(data.get("naming"), where, location)
            opener = open_table or open_local_table
            table = opener(location if location is not None else os.getcwd(), data["table"], naming, where)
            fingerprint = data["fingerprint"]
        try:
            manifest = cls.from_table(
                table,
                extensions=tuple(data.get("extensions", ())),
                class_names=None if data.get("class_names") is None else tuple(data["class_names"]),
                source=dict(data.get("source", {})),
                options=dict(data.get("options", {})),
                seed=data.get("seed"),
                skipped=tuple(SkippedInput(**s) for s in data.get("skipped", ())),
                skipped_counts=data.get("skipped_counts"),
                location=location,
                member_compression=data.get("member_compression"),
                origin=origin,
                stored_fingerprint=fingerprint,
                loaded_version=version,
                shards_base=shards_base,
                token_fields=tuple(data.get("token_fields", ())),
                earlier_fingerprints=tuple(data.get("removed", {}).get("earlier_fingerprints", ())),
                appended=appended_revisions(data, table.num_shards, where, location),
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(
                f"{where}: malformed manifest ({short(exc)}); rewrite it with `shardkit write`", path=location
            ) from None
        for name in ("num_samples", "num_bytes"):
            if getattr(manifest, name) > MAX_COUNT:
                raise ManifestError(f"{where}: the shards' {name} add up to more than 2**62; not a real dataset", path=location)
        if version == 1:
            for name in ("num_samples", "num_bytes", "num_shards"):
                if name in data and data[name] != getattr(manifest, name):
                    raise ManifestError(
                        f"{where}: {name} is {short(data[name])} but the shard list adds up to {getattr(manifest, name)}",
                        path=location,
                    )
        else:
            check_totals(table, num_shards=data["num_shards"], num_samples=data["num_samples"],
                         num_bytes=data["num_bytes"], where=where)
            stated = data["removed"]["num_samples"] if version == REMOVED_VERSION else None
            if stated != (None if table.removed is None else len(table.removed)):
                listed = "no removed samples" if table.removed is None else f"{len(table.removed):,} removed samples"
                raise ManifestError(
                    f"{where}: the manifest says {stated if stated is not None else 'no'} samples were removed, its "
                    f"shard table lists {listed}; {TABLE_ADVICE}",
                    path=location,
                )
        return manifest

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        location: str | None = None,
        origin: str | None = None,
        open_table: TableOpener | None = None,
    ) -> Manifest:
        """Parse a manifest, refusing oversized or absurdly nested JSON before parsing it.

        Raises:
            ManifestError: Larger than :data:`MAX_MANIFEST_BYTES`, nested
                deeper than :data:`MAX_MANIFEST_DEPTH`, not JSON, or not a
                valid manifest (see :meth:`from_dict`).
        """
        where = redact_url(origin) if origin else (location.rstrip("/") + "/" + MANIFEST_NAME if location else "<manifest>")
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        if len(raw) > MAX_MANIFEST_BYTES:
            raise _too_large(where, len(raw), location)
        depth = json_depth_exceeds(raw, MAX_MANIFEST_DEPTH)
        if depth:
            raise ManifestError(
                f"{where}: JSON nested deeper than {MAX_MANIFEST_DEPTH} levels; not a shardkit manifest "
                "(a damaged or hostile file). Rewrite it with `shardkit write`.",
                path=location,
            )
        try:
            data = json.loads(raw)
        except RecursionError:  # the scan above should have refused it
            raise ManifestError(f"{where}: JSON nested too deeply; not a shardkit manifest", path=location) from None
        except ValueError as exc:  # JSONDecodeError, an integer of too many digits, bad UTF-8
            raise ManifestError(f"{where}: not valid JSON ({short(exc, 200)})", path=location) from None
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: not a JSON object", path=location)
        if data.get("format_version") == DERIVED_VERSION:  # a view or an extension: its own document
            from shardkit.format.derived import DerivedManifest

            return DerivedManifest.from_dict(data, location=location, origin=origin, open_table=open_table)  # type: ignore[return-value]
        return cls.from_dict(data, location=location, origin=origin, open_table=open_table)


def _naming(value: object, where: str, location: str | None) -> Naming | None:
    if value is None:
        return None
    try:
        if not isinstance(value, dict) or set(value) != {"shard", "index"}:
            raise ValueError(value)
        return Naming(shard=value["shard"], index=value["index"])
    except ValueError:
        raise ManifestError(
            f"{where}: 'naming' must be {{'shard': 'NAME-{{:06d}}.tar', 'index': ...}} of plain file names, "
            f"not {short(value)}; the manifest is damaged. Rewrite it or rerun `shardkit upgrade`.",
            path=location,
        ) from None


def table_location(location: str, ref: Mapping[str, Any]) -> str:
    """The table file or URL a checked table reference names (beside the manifest)."""
    return location.rstrip("/") + "/" + ref["path"] if "://" in location else os.path.join(location, ref["path"])


def open_local_table(location: str, ref: Mapping[str, Any], naming: Naming | None, where: str) -> ShardTable:
    """Open the table a local format-2 manifest names, checking its size and SHA-256."""
    return open_table(
        table_location(location, ref), naming=naming, expected_size=ref["num_bytes"], expected_sha256=ref["sha256"]
    )


def _too_large(where: str, size: int, location: str | None) -> ManifestError:
    return ManifestError(
        f"{where}: {size} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES}); not a shardkit "
        "manifest (a damaged or hostile file)",
        path=location,
    )


def manifest_file(path: str) -> str:
    """The manifest file for a dataset directory or a manifest path."""
    return path if path.endswith(".json") else os.path.join(path, MANIFEST_NAME)


def no_manifest_error(file: str, folder: str, *, remote: bool = False) -> ManifestError:
    """The error for a folder (or URL prefix) with no ``manifest.json``: how
    to read the shards it may hold, published without one."""
    index = f"`shardkit index {folder}/ --out DIR`, then open DIR" if remote else (
        f"`shardkit index {folder}` (offsets and a manifest beside them, or in --out), then open {folder}"
    )
    return ManifestError(
        f"{file}: no manifest here. To read the shards where they are, index them once with {index}; or read "
        f"them at shard granularity with mode='exact' or 'infinite' and their {'URLs' if remote else 'paths'}",
        path=file,
    )


def load_manifest(path: str) -> Manifest:
    """Load ``manifest.json`` from a local dataset directory or file path.

    Raises:
        ManifestError: Missing or invalid manifest.
    """
    file = manifest_file(path)
    try:
        f, size = open_regular(file, what="manifest")
    except FileNotFoundError:
        folder = os.path.dirname(file) or "."
        if not os.path.isdir(folder):
            raise ManifestError(f"{path}: no such dataset (the path does not exist)", path=path) from None
        raise no_manifest_error(file, folder) from None
    with f:
        if size > MAX_MANIFEST_BYTES:
            raise _too_large(file, size, file)
        text = f.read(size + 1)  # the size fstat gave (a read of the limit would allocate it)
    return Manifest.from_json(text, location=os.path.dirname(os.path.abspath(file)), origin=file)


def shard_offsets(shards: Sequence[ShardEntry]) -> list[int]:
    """Cumulative sample counts: shard ``i`` holds samples ``[out[i], out[i+1])``."""
    if isinstance(shards, ShardView):
        return shards.table.starts.tolist()
    out = [0]
    for shard in shards:
        out.append(out[-1] + shard.num_samples)
    return out
