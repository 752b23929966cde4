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

Shard and index paths are relative to the manifest's folder (or URL prefix).
The JSON is written with sorted keys and no timestamps, so the same dataset
gives the same manifest bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardkit.errors import ManifestError

FORMAT_NAME = "shardkit"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


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
            prefix); not serialized. Shard paths resolve against it.
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

    def resolve(self, relative: str) -> str:
        """Turn a manifest-relative path into a path or URL to open."""
        if self.location is None or "://" in relative or os.path.isabs(relative):
            return relative
        if "://" in self.location:
            return self.location.rstrip("/") + "/" + relative
        return os.path.join(self.location, relative)

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
    def from_dict(cls, data: Mapping[str, Any], *, location: str | None = None) -> Manifest:
        """Build a manifest from parsed JSON, checking format and totals.

        Raises:
            ManifestError: Wrong format or version, missing fields, or totals
                that disagree with the shard list.
        """
        where = location or "<manifest>"
        if data.get("format") != FORMAT_NAME:
            raise ManifestError(f"{where}: not a shardkit manifest (format={data.get('format')!r})", path=location)
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"{where}: manifest format_version {version!r} is not supported by this shardkit "
                f"(supports {FORMAT_VERSION}); upgrade shardkit or rewrite the dataset",
                path=location,
            )
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
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({exc!r})", path=location) from None
        for name in ("num_samples", "num_bytes", "num_shards"):
            if name in data and data[name] != getattr(manifest, name):
                raise ManifestError(
                    f"{where}: {name} is {data[name]} but the shard list adds up to {getattr(manifest, name)}",
                    path=location,
                )
        return manifest

    @classmethod
    def from_json(cls, text: str | bytes, *, location: str | None = None) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{location or '<manifest>'}: not valid JSON ({exc})", path=location) from None
        if not isinstance(data, dict):
            raise ManifestError(f"{location or '<manifest>'}: not a JSON object", path=location)
        return cls.from_dict(data, location=location)


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
        with open(file, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        raise ManifestError(
            f"{file}: no manifest here; write the dataset with `shardkit write` "
            "or pass the shard paths directly",
            path=file,
        ) from None
    return Manifest.from_json(text, location=os.path.dirname(os.path.abspath(file)))


def shard_offsets(shards: Sequence[ShardEntry]) -> list[int]:
    """Cumulative sample counts: shard ``i`` holds samples ``[out[i], out[i+1])``."""
    out = [0]
    for shard in shards:
        out.append(out[-1] + shard.num_samples)
    return out
