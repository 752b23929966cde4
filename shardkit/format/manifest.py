"""The dataset manifest: ``manifest.json``, the contract between writer and reader.

A manifest lists the shards in order with their sample counts, sizes and
checksums, plus what a reader or a rerun needs to know about the dataset::

    {
      "format": "shardkit",
      "format_version": 1,
      "num_samples": 500, "num_bytes": 55308288, "num_shards": 4,
      "extensions": ["cls", "jpg"],
      "class_names": ["cat", "dog"],
      "source": {"format": "imagefolder", "path": "data/train"},
      "options": {"max_samples": 128, "max_bytes": null, "shuffle": true, ...},
      "seed": 0,
      "skipped": [{"path": "data/train/cat/x.jpg", "reason": "..."}],
      "shards": [
        {"path": "shard-000000.tar", "index": "shard-000000.idx",
         "num_samples": 128, "num_bytes": 14157824, "sha256": "..."},
        ...
      ]
    }

A dataset written with ``compress_members`` also has ``"member_compression":
"gzip"`` (or ``"zstd"``): its text-like members are stored compressed, as
``KEY.txt.gz`` (see :mod:`shardkit.format.compression`). The key is optional
and absent otherwise, so older manifests load unchanged and the format
version stays 1.

Shard and index paths are relative to the manifest's folder (or URL prefix),
the dataset's base location, and must stay inside it (see
:mod:`shardkit.format.location`: no ``..``, no absolute path, no scheme of
their own unless the reader allows the location). A manifest is data from
wherever it was fetched, so loading one checks its size
(:data:`MAX_MANIFEST_BYTES`), its nesting (:data:`MAX_MANIFEST_DEPTH`, before
the JSON is parsed) and the type and range of every field.
The JSON is written with sorted keys and no timestamps, so the same dataset
gives the same manifest bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.location import open_regular, redact_url, resolve_inside

FORMAT_NAME = "shardkit"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"

#: Largest manifest accepted, in bytes (1 GiB: millions of shards).
MAX_MANIFEST_BYTES = 1 << 30
#: Deepest nesting of JSON arrays and objects accepted in a manifest; a
#: shardkit manifest needs 3, ``source`` and ``options`` may add a few.
MAX_MANIFEST_DEPTH = 64
#: Largest count or byte size a manifest may state, per shard and in total
#: (2**62: every sum stays within a 64-bit integer).
MAX_COUNT = 1 << 62


@dataclass(frozen=True)
class ShardEntry:
    """One shard as recorded in the manifest.

    Attributes:
        path: Shard path relative to the manifest.
        num_samples: Samples in the shard.
        num_bytes: Size of the tar file in bytes.
        sha256: Hex SHA-256 of the tar file.
        index: Offset-index path relative to the manifest.
    """

    path: str
    num_samples: int
    num_bytes: int
    sha256: str
    index: str


@dataclass(frozen=True)
class SkippedInput:
    """An input left out under ``on_error="skip"``, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    """A written dataset: its shards in order and how it was made.

    Attributes:
        shards: Shard entries in dataset order.
        extensions: Field extensions present in the samples, sorted.
        class_names: Class names by label index (ImageFolder sources), or None.
        source: ``{"format": ..., "path": ...}`` of the input.
        options: Writer options that shape the output (not worker count).
        seed: Shuffle seed, or None when the order was kept.
        skipped: Inputs skipped under ``on_error="skip"``.
        member_compression: ``"gzip"`` or ``"zstd"`` when the writer
            compressed members (``KEY.txt.gz``), else None.
        location: Where the manifest was loaded from (a directory or URL
            prefix); not serialized. Shard paths resolve inside it.
        origin: The manifest file or URL it was loaded from, for messages;
            not serialized.
    """

    shards: tuple[ShardEntry, ...]
    extensions: tuple[str, ...] = ()
    class_names: tuple[str, ...] | None = None
    source: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None
    skipped: tuple[SkippedInput, ...] = ()
    location: str | None = field(default=None, compare=False)
    member_compression: str | None = None
    origin: str | None = field(default=None, compare=False)

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def fingerprint(self) -> str:
        """A hash of the shard checksums: identifies the dataset's content."""
        digest = hashlib.sha256()
        for shard in self.shards:
            digest.update(f"{shard.path}\0{shard.sha256}\0{shard.num_samples}\n".encode())
        return digest.hexdigest()

    @property
    def base(self) -> str:
        """The dataset's base location: every shard and index resolves inside it.

        The folder or URL prefix the manifest was loaded from (the working
        directory for a manifest built in memory without a ``location``).
        """
        return self.location if self.location is not None else os.getcwd()

    @property
    def name(self) -> str:
        """The manifest's file or URL (redacted), for messages."""
        if self.origin is not None:
            return redact_url(self.origin)
        if self.location is None:
            return "<manifest>"
        return redact_url(self.location.rstrip("/") + "/" + MANIFEST_NAME)

    def resolve(self, relative: str, *, allowed_prefixes: Sequence[str] = (), what: str = "path") -> str:
        """Turn a manifest entry into the path or URL to open, inside :attr:`base`.

        Args:
            relative: The entry, relative to the manifest's folder.
            allowed_prefixes: Locations outside the dataset the reader trusts
                (``SourceOptions.allowed_prefixes``).
            what: Names the entry in messages (``"shard 3 path"``).

        Raises:
            ManifestError: The entry leaves the dataset (see
                :func:`~shardkit.format.location.resolve_inside`).
        """
        return resolve_inside(self.base, relative, allowed_prefixes=allowed_prefixes, what=f"{self.name}: {what}")

    def shard_url(self, shard: int, *, allowed_prefixes: Sequence[str] = ()) -> str:
        """The path or URL of shard number ``shard`` (see :meth:`resolve`)."""
        return self.resolve(self.shards[shard].path, allowed_prefixes=allowed_prefixes, what=f"shard {shard} path")

    def index_url(self, shard: int, *, allowed_prefixes: Sequence[str] = ()) -> str:
        """The path or URL of shard number ``shard``'s offset index (see :meth:`resolve`)."""
        return self.resolve(self.shards[shard].index, allowed_prefixes=allowed_prefixes, what=f"shard {shard} index")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "num_shards": self.num_shards,
            "extensions": list(self.extensions),
            "class_names": None if self.class_names is None else list(self.class_names),
            "source": dict(self.source),
            "options": dict(self.options),
            "seed": self.seed,
            "skipped": [asdict(s) for s in self.skipped],
            "shards": [asdict(s) for s in self.shards],
        }
        if self.member_compression is not None:
            data["member_compression"] = self.member_compression
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, location: str | None = None, origin: str | None = None
    ) -> Manifest:
        """Build a manifest from parsed JSON, checking format, field types, ranges and totals.

        Args:
            data: The parsed JSON object.
            location: The folder or URL prefix the manifest came from.
            origin: The manifest file or URL, for messages.

        Raises:
            ManifestError: Wrong format or version, missing or mistyped fields,
                counts out of range, or totals that disagree with the shard list.
        """
        where = redact_url(origin) if origin else (location.rstrip("/") + "/" + MANIFEST_NAME if location else "<manifest>")
        if data.get("format") != FORMAT_NAME:
            raise ManifestError(f"{where}: not a shardkit manifest (format={_short(data.get('format'))})", path=location)
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"{where}: manifest format_version {_short(version)} is not supported by this shardkit "
                f"(supports {FORMAT_VERSION}); upgrade shardkit or rewrite the dataset",
                path=location,
            )
        _check_fields(data, where, location)
        try:
            shards = tuple(ShardEntry(**s) for s in data["shards"])
            manifest = cls(
                shards=shards,
                extensions=tuple(data.get("extensions", ())),
                class_names=None if data.get("class_names") is None else tuple(data["class_names"]),
                source=dict(data.get("source", {})),
                options=dict(data.get("options", {})),
                seed=data.get("seed"),
                skipped=tuple(SkippedInput(**s) for s in data.get("skipped", ())),
                location=location,
                member_compression=data.get("member_compression"),
                origin=origin,
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(
                f"{where}: malformed manifest ({_short(exc)}); rewrite it with `shardkit write`", path=location
            ) from None
        for name in ("num_samples", "num_bytes"):
            if getattr(manifest, name) > MAX_COUNT:
                raise ManifestError(f"{where}: the shards' {name} add up to more than 2**62; not a real dataset", path=location)
        for name in ("num_samples", "num_bytes", "num_shards"):
            if name in data and data[name] != getattr(manifest, name):
                raise ManifestError(
                    f"{where}: {name} is {_short(data[name])} but the shard list adds up to {getattr(manifest, name)}",
                    path=location,
                )
        return manifest

    @classmethod
    def from_json(cls, text: str | bytes, *, location: str | None = None, origin: str | None = None) -> Manifest:
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
            raise ManifestError(f"{where}: not valid JSON ({_short(exc, 200)})", path=location) from None
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: not a JSON object", path=location)
        return cls.from_dict(data, location=location, origin=origin)


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (values from a manifest may be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _too_large(where: str, size: int, location: str | None) -> ManifestError:
    return ManifestError(
        f"{where}: {size} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES}); not a shardkit "
        "manifest (a damaged or hostile file)",
        path=location,
    )


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_DEPTH_BLOCK = 1 << 20


def json_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects deeper than
    ``limit``, found without recursion: brackets outside strings are
    counted in blocks (a broken string makes the count high, never low)."""
    brackets = _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", raw))
    if len(brackets) <= limit:
        return False
    codes = np.frombuffer(brackets, dtype=np.uint8)
    depth = 0
    for lo in range(0, len(codes), _DEPTH_BLOCK):
        block = codes[lo : lo + _DEPTH_BLOCK]
        steps = np.where((block == ord("[")) | (block == ord("{")), 1, -1).astype(np.int64)
        running = np.cumsum(steps) + depth
        if int(running.max()) > limit:
            return True
        depth = int(running[-1])
    return False


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _check_fields(data: Mapping[str, Any], where: str, location: str | None) -> None:
    """Check the type and range of every field a reader relies on."""

    def bad(field_name: str, wanted: str, value: object) -> ManifestError:
        return ManifestError(
            f"{where}: {field_name} must be {wanted}, not {_short(value)}; the manifest is damaged or was "
            "not written by shardkit. Rewrite it with `shardkit write`.",
            path=location,
        )

    shards = data.get("shards")
    if not isinstance(shards, list):
        raise bad("'shards'", "a list of shard entries", shards)
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict):
            raise bad(f"shard {i}", "an object", entry)
        for key in ("path", "index", "sha256"):
            if key in entry and not isinstance(entry[key], str):
                raise bad(f"shard {i} {key}", "a string", entry[key])
        for key in ("num_samples", "num_bytes"):
            if key in entry and not _is_count(entry[key]):
                raise bad(f"shard {i} {key}", "a whole number from 0 to 2**62", entry[key])
    for key in ("num_samples", "num_bytes", "num_shards"):
        if key in data and not _is_count(data[key]):
            raise bad(f"'{key}'", "a whole number from 0 to 2**62", data[key])
    for key in ("extensions", "skipped"):
        if not isinstance(data.get(key, []), list):
            raise bad(f"'{key}'", "a list", data[key])
    if not all(isinstance(e, str) for e in data.get("extensions", [])):
        raise bad("'extensions'", "a list of strings", data["extensions"])
    if not all(isinstance(s, dict) for s in data.get("skipped", [])):
        raise bad("'skipped'", "a list of objects", data["skipped"])
    names = data.get("class_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad("'class_names'", "a list of strings or null", names)
    for key in ("source", "options"):
        if not isinstance(data.get(key, {}), dict):
            raise bad(f"'{key}'", "an object", data[key])
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or abs(seed) > MAX_COUNT):
        raise bad("'seed'", "a whole number or null", seed)
    compression = data.get("member_compression")
    if compression is not None and not isinstance(compression, str):
        raise bad("'member_compression'", "a string or null", compression)


def manifest_file(path: str) -> str:
    """The manifest file for a dataset directory or a manifest path."""
    return path if path.endswith(".json") else os.path.join(path, MANIFEST_NAME)


def load_manifest(path: str) -> Manifest:
    """Load ``manifest.json`` from a local dataset directory or file path.

    Raises:
        ManifestError: Missing or invalid manifest.
    """
    file = manifest_file(path)
    try:
        f, size = open_regular(file, what="manifest")
    except FileNotFoundError:
        raise ManifestError(
            f"{file}: no manifest here; write the dataset with `shardkit write` "
            "or pass the shard paths directly",
            path=file,
        ) from None
    with f:
        if size > MAX_MANIFEST_BYTES:
            raise _too_large(file, size, file)
        text = f.read(size + 1)  # the size fstat gave (a read of the limit would allocate it)
    return Manifest.from_json(text, location=os.path.dirname(os.path.abspath(file)), origin=file)


def shard_offsets(shards: Sequence[ShardEntry]) -> list[int]:
    """Cumulative sample counts: shard ``i`` holds samples ``[out[i], out[i+1])``."""
    out = [0]
    for shard in shards:
        out.append(out[-1] + shard.num_samples)
    return out
