"""Synthetic datasets of N shards for ``bench/bench_scale.py``, in each
reader's own format: one real shard written by the library's own writer, its
metadata entry repeated N times, each pointing at a hard link to that shard
(ext4 allows 65,000 links per file: more copies are made as needed). Opening
parses N real entries; reading reads real bytes."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Payload of each sample's ``bin`` field, bytes.
PAYLOAD_BYTES = 1000
#: Peers that are shardkit over a dataset of its own: its writer's names,
#: 7-digit names, names of no single pattern (all written as format 1, then upgraded).
SHARDKIT_PEERS = ("shardkit", "shardkit-wide", "shardkit-irregular")
#: Hard links per base copy (ext4's limit is 65,000; EMLINK also moves on).
LINKS_PER_COPY = 60_000


class Linker:
    """Hard-links one real file under many names, making another copy of it
    whenever a copy reaches its link limit."""

    def __init__(self, source: str, copies_dir: str):
        self.source = source
        self.copies_dir = copies_dir
        self.copy = -1
        self.links = LINKS_PER_COPY
        self.current = ""

    def _next_copy(self) -> None:
        self.copy += 1
        name = os.path.basename(self.source)
        self.current = os.path.join(self.copies_dir, f"{name}.{self.copy}")
        if not os.path.exists(self.current):
            os.makedirs(self.copies_dir, exist_ok=True)
            shutil.copyfile(self.source, self.current + ".tmp")
            os.rename(self.current + ".tmp", self.current)
        self.links = os.stat(self.current).st_nlink

    def link(self, dest: str) -> None:
        while True:
            if self.links >= LINKS_PER_COPY:
                self._next_copy()
                continue
            try:
                os.link(self.current, dest)
            except FileExistsError:
                return
            except OSError as exc:
                if exc.errno != errno.EMLINK:
                    raise
                self.links = LINKS_PER_COPY
                continue
            self.links += 1
            return


def write_listing(path: str, head: dict[str, Any], key: str, entry: Callable[[int], str], count: int) -> None:
    """Write JSON ``head`` with ``head[key]`` the ``count`` entries ``entry(i)``
    (JSON text each), streamed, atomically."""
    marker = "\x00LIST\x00"
    text = json.dumps({**head, key: marker}, sort_keys=True)
    before, after = text.split(json.dumps(marker))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(before + "[")
        step = 10_000
        for start in range(0, count, step):
            f.write(", ".join(entry(i) for i in range(start, min(count, start + step))))
            if start + step < count:
                f.write(", ")
        f.write("]" + after)
    os.rename(tmp, path)


class Format:
    """One metadata format: a real base dataset written by the library's own
    writer, and N-shard copies of its metadata over hard links."""

    name = ""
    #: Tells the datasets of formats that share a base apart (``-wide``).
    variant = ""
    metadata = "index.json"

    def __init__(self, root: str, samples_per_shard: int):
        self.samples = samples_per_shard
        self.base = os.path.join(root, "base", f"{self.name}-{samples_per_shard}")
        self.folder = os.path.join(root, f"{self.name}{self.variant}-{samples_per_shard}")

    def path(self, num_shards: int) -> str:
        return os.path.join(self.folder, str(num_shards))

    def ensure(self, num_shards: int) -> str:
        if not os.path.exists(os.path.join(self.base, self.metadata)):
            shutil.rmtree(self.base, ignore_errors=True)
            self.write_base()
        dest = self.path(num_shards)
        if not os.path.exists(os.path.join(dest, self.metadata)):
            os.makedirs(dest, exist_ok=True)
            for source, pattern in self.files():
                linker = Linker(os.path.join(self.base, source), os.path.join(self.base, "copies"))
                for i in range(num_shards):
                    name = self.file_name(pattern, i)
                    if "/" in name:
                        os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
                    linker.link(os.path.join(dest, name))
            self.write_metadata(dest, num_shards)
        return dest

    def samples_iter(self) -> Iterator[tuple[int, bytes, int]]:
        rng = random.Random(0)
        for i in range(self.samples):
            yield i, rng.randbytes(PAYLOAD_BYTES), i % 10

    def file_name(self, pattern: str, i: int) -> str:
        """Shard ``i``'s name for a pattern of :meth:`files`."""
        return pattern % i

    def write_base(self) -> None:
        raise NotImplementedError

    def files(self) -> list[tuple[str, str]]:
        """(base file, name pattern of its links with ``%d`` the shard)."""
        raise NotImplementedError

    def write_metadata(self, dest: str, num_shards: int) -> None:
        raise NotImplementedError

    def _base_json(self) -> dict[str, Any]:
        with open(os.path.join(self.base, self.metadata)) as f:
            return json.load(f)


class ShardkitFormat(Format):
    name = "shardkit"
    metadata = "manifest.json"

    def write_base(self) -> None:
        from shardkit import ShardWriter

        with ShardWriter(self.base, max_samples=self.samples, max_bytes=None, overwrite=True) as writer:
            for i, payload, label in self.samples_iter():
                writer.write({"__key__": f"k{i:08d}", "bin": payload, "cls": label})

    def _base_json(self) -> dict[str, Any]:
        """The base's manifest as format 1 writes it (every shard in the
        JSON): the listing is repeated in that form, then upgraded (see
        :func:`prepare`). The writer writes the current format."""
        from shardkit.format.manifest import load_manifest

        return json.loads(load_manifest(self.base).to_format1_json())

    def _entry(self) -> dict[str, Any]:
        (entry,) = self._base_json()["shards"]
        return entry

    #: Shard names: ``%06d`` the shard's position (a ``%s`` stands for :meth:`stem`).
    stem_pattern = "shard-%06d"

    def stem(self, i: int) -> str:
        """Shard ``i``'s name without ``.tar``."""
        return self.stem_pattern % i

    def file_name(self, pattern: str, i: int) -> str:
        return pattern % self.stem(i)

    def files(self) -> list[tuple[str, str]]:
        entry = self._entry()
        return [(entry["path"], "%s.tar"), (entry["index"], "%s.idx")]

    def write_metadata(self, dest: str, num_shards: int) -> None:
        head = self._base_json()
        entry = self._entry()
        head.update(
            num_shards=num_shards,
            num_samples=num_shards * entry["num_samples"],
            num_bytes=num_shards * entry["num_bytes"],
        )
        template = json.dumps({**entry, "path": "@.tar", "index": "@.idx"}, sort_keys=True).replace("@", "%s")
        write_listing(
            os.path.join(dest, self.metadata), head, "shards", lambda i: template % (self.stem(i), self.stem(i)), num_shards
        )


class WideShardkitFormat(ShardkitFormat):
    """Shards named by position, with 7 digits (``shard-0000000.tar``):
    not the writer's 6, still one naming pattern (issue #42)."""

    variant = "-wide"
    stem_pattern = "shard-%07d"


class IrregularShardkitFormat(ShardkitFormat):
    """Shards whose names follow no single pattern (issue #42): a word and
    a hash in one of 256 subfolders, ``c3/lemon-5f1e0c9a2b7d4e68.tar``; the
    table stores every path."""

    variant = "-irregular"
    WORDS = ("apple", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "lemon", "maple")

    def stem(self, i: int) -> str:
        digest = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).hexdigest()
        return f"{digest[:2]}/{self.WORDS[i % len(self.WORDS)]}-{digest}"


class LitdataFormat(Format):
    name = "litdata"

    def write_base(self) -> None:
        from litdata.streaming.writer import BinaryWriter

        writer = BinaryWriter(self.base, chunk_size=self.samples)
        for i, payload, label in self.samples_iter():
            writer.add_item(i, {"bin": payload, "cls": label})
        writer.done()
        writer.merge()

    def files(self) -> list[tuple[str, str]]:
        (chunk,) = self._base_json()["chunks"]
        return [(chunk["filename"], "chunk-0-%d.bin")]

    def write_metadata(self, dest: str, num_shards: int) -> None:
        head = self._base_json()
        (chunk,) = head["chunks"]
        template = json.dumps({**chunk, "filename": "chunk-0-@.bin"}, sort_keys=True).replace("@", "%d")
        write_listing(os.path.join(dest, self.metadata), head, "chunks", lambda i: template % i, num_shards)


class MosaicFormat(Format):
    name = "mosaic"

    def write_base(self) -> None:
        from streaming import MDSWriter

        columns = {"bin": "bytes", "cls": "int"}
        with MDSWriter(out=self.base, columns=columns, size_limit=1 << 30) as writer:
            for _, payload, label in self.samples_iter():
                writer.write({"bin": payload, "cls": label})

    def files(self) -> list[tuple[str, str]]:
        (shard,) = self._base_json()["shards"]
        return [(shard["raw_data"]["basename"], "shard.%06d.mds")]

    def write_metadata(self, dest: str, num_shards: int) -> None:
        head = self._base_json()
        (shard,) = head["shards"]
        entry = {**shard, "raw_data": {**shard["raw_data"], "basename": "shard.@.mds"}}
        template = json.dumps(entry, sort_keys=True).replace("@", "%06d")
        write_listing(os.path.join(dest, self.metadata), head, "shards", lambda i: template % i, num_shards)


def shardkit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardkit", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
    )


def has_upgrade() -> bool:
    return "upgrade" in shardkit_cli("--help").stdout


def manifest_format(path: str) -> int | None:
    """The ``format_version`` of a manifest (read without parsing its shard list)."""
    with open(os.path.join(path, "manifest.json"), "rb") as f:
        head = f.read(1 << 16).decode(errors="replace")
    marker = '"format_version": '
    at = head.find(marker)
    if at < 0:
        return None
    digits = head[at + len(marker) :].split(",")[0].split("}")[0].strip()
    return int(digits) if digits.isdigit() else None


def prepare(root: str, peer: str, samples: int, num_shards: int, *, upgrade: bool) -> dict[str, Any]:
    """Make (or reuse) the dataset a peer reads; returns its path and, for
    shardkit, the format measured."""
    started = time.perf_counter()
    if peer == "shardkit" or peer == "webdataset":
        path = ShardkitFormat(root, samples).ensure(num_shards)
    elif peer == "shardkit-wide":
        path = WideShardkitFormat(root, samples).ensure(num_shards)
    elif peer == "shardkit-irregular":
        path = IrregularShardkitFormat(root, samples).ensure(num_shards)
    elif peer == "litdata":
        path = LitdataFormat(root, samples).ensure(num_shards)
    elif peer == "mosaic":
        path = MosaicFormat(root, samples).ensure(num_shards)
    else:
        raise ValueError(f"unknown peer {peer!r}")
    info: dict[str, Any] = {"path": path}
    if peer in SHARDKIT_PEERS:
        if upgrade and manifest_format(path) == 1:
            proc = shardkit_cli("upgrade", path)
            if proc.returncode != 0:
                info["upgrade_error"] = (proc.stderr or proc.stdout)[-2000:]
        info["format_version"] = manifest_format(path)
    info["prepare_s"] = time.perf_counter() - started
    return info
