"""Telling a file source's kind from its shape, only where exactly one fits.

Four kinds are told apart by the shape of a file or folder (ImageFolder,
directory, JSONL, tar shards; tables are told by
:func:`~shardkit.write.sources.table.detect_table` first).
:func:`detect_format` picks one when ``--format`` is not given, and refuses,
naming the formats that would apply, whenever the shape leaves a doubt: tar
shards or JSONL files are never packed as sample fields unless the user
chose ``--format directory``.
"""

from __future__ import annotations

import os

from shardkit.errors import SourceError
from shardkit.format.brace import is_pattern
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.write.extensions import IMAGE_EXTENSIONS
from shardkit.write.sources.files import walk_files, walk_tree
from shardkit.write.sources.tar import TAR_SUFFIXES

#: Dataset-level files a folder of shards may hold beside them.
_DATASET_FILE_PREFIXES = ("README", "LICENSE", "CITATION")


def detect_format(source: str) -> str:
    """Tell a source's format from its shape, only where exactly one fits.

    A file: ``.jsonl`` or a tar shard by its name. A brace pattern: tar. A
    folder:

    * ``tar`` when it holds tar shards at its top level and nothing else
      but their sidecars (files named after a shard: img2dataset's
      ``00000.parquet`` and ``00000_stats.json``, ``00000.idx``) and
      dataset files (``manifest.json``, the shard table, ``README*``,
      ``LICENSE*``, ``*.md``), or when it holds ``manifest.json``;
    * ``imagefolder`` when it holds only class folders of images;
    * ``directory`` when no file in it is a tar shard or a ``.jsonl`` file
      (packing those as sample fields is never a guess: it takes
      ``--format directory``), and its folders are not class folders of
      images with other files beside them (an ImageFolder with a stray
      ``notes.txt``, or a tree to group by name? that takes ``--format``).
      Files named like an image in its folder (``a1.jpg``, ``a1.cls``), or
      a top-level folder with no image (``imgs/``, ``labels/``), tell a
      tree to group.

    Raises:
        SourceError: The path does not exist, or its shape fits no format or
            more than one; the message names the formats that would apply
            and ``--format``.
    """
    if is_pattern(source):
        return "tar"
    if not os.path.exists(source):
        raise SourceError(f"{source}: source does not exist", path=source)
    if os.path.isfile(source):
        if source.endswith(".jsonl"):
            return "jsonl"
        if source.endswith(TAR_SUFFIXES):
            return "tar"
        raise SourceError(
            f"{source}: cannot tell the format of this file (expected .jsonl, .tar, .tar.gz or .tar.zst); "
            "pass --format",
            path=source,
        )
    entries = [e for e in os.scandir(source) if not e.name.startswith(".")]
    if not entries:
        raise SourceError(f"{source}: source directory is empty", path=source)
    if any(e.name == MANIFEST_NAME for e in entries):
        return "tar"
    files = [e.name for e in entries if not e.is_dir()]
    shards = [name for name in files if name.endswith(TAR_SUFFIXES)]
    if shards:
        stems = {_shard_stem(name) for name in shards}
        others = [e.name + ("/" if e.is_dir() else "") for e in entries if e.is_dir() or not _beside_shards(e.name, stems)]
        if not others:
            return "tar"
        raise _ambiguous(
            source,
            f"it holds tar shards ({_some(shards)}) and other entries ({_some(others)})",
            {
                "tar": "to reshard the top-level shards, leaving the rest out",
                "directory": "to pack every file, the shards included, as sample fields",
            },
        )
    if all(e.is_dir() for e in entries):
        tars = jsonl = images = others = paired = 0
        example = other_example = ""
        with_images = set()  # top-level folders holding an image
        for folder, files_here in walk_tree(source):
            image_keys, other_keys = set(), []
            for entry in files_here:
                name = entry.name
                if name.endswith(TAR_SUFFIXES):
                    tars += 1
                    example = example or entry.path
                elif name.endswith(".jsonl"):
                    jsonl += 1
                    example = example or entry.path
                elif name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS:
                    images += 1
                    image_keys.add(name.partition(".")[0])
                else:
                    others += 1
                    other_example = other_example or entry.path
                    other_keys.append(name.partition(".")[0])
            if image_keys:
                with_images.add(folder.partition("/")[0])
            # a file named like an image beside it (a1.jpg, a1.cls) is one of its fields
            paired += sum(1 for key in other_keys if key in image_keys)
        if tars or jsonl:
            formats = {"tar": "on a folder of shards, or on a brace pattern naming them"} if tars else {}
            if jsonl:
                formats["jsonl"] = "on the .jsonl file itself"
            formats["directory"] = "to pack every file, shards and JSONL included, as sample fields"
            what = " and ".join(w for w, n in (("tar shards", tars), ("JSONL files", jsonl)) if n)
            raise _ambiguous(source, f"its folders hold {what} (e.g. {example})", formats)
        if images and not others:
            return "imagefolder"
        if images and not paired and with_images == {e.name for e in entries}:
            # Class folders that all hold images, and other files beside them.
            raise _ambiguous(
                source,
                f"its folders hold images and {others} other file(s) (e.g. {other_example})",
                {
                    "imagefolder": "for one sample per image, labelled by its class folder, the other files left out",
                    "directory": "to group every file by its name up to the first dot, with no labels",
                },
            )
        return "directory"
    jsonl_files = [name for name in files if name.endswith(".jsonl")]
    if jsonl_files:
        raise _ambiguous(
            source,
            f"it holds JSONL files ({_some(jsonl_files)}) beside other entries",
            {
                "jsonl": "on the .jsonl file itself",
                "directory": "to pack every file, the JSONL files included, as sample fields",
            },
        )
    for path in walk_files(source):
        if path.endswith(TAR_SUFFIXES):
            raise _ambiguous(
                source,
                f"a folder in it holds tar shards (e.g. {path})",
                {
                    "tar": "on that folder of shards, or on a brace pattern naming them",
                    "directory": "to pack every file, the shards included, as sample fields",
                },
            )
    return "directory"


def _shard_stem(name: str) -> str:
    for suffix in TAR_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _beside_shards(name: str, stems: set[str]) -> bool:
    """Whether a file in a folder of shards belongs with them: a shard, a
    shard's sidecar (``00000.parquet``, ``00000_stats.json``, ``00000.idx``),
    the shard table, or a dataset-level file (README, licence, Markdown)."""
    if name.endswith(TAR_SUFFIXES) or name.endswith(".md") or name.startswith(_DATASET_FILE_PREFIXES):
        return True
    if name.startswith("shards-") and name.endswith(".table"):
        return True
    for cut in range(len(name)):
        if name[cut] in "._" and name[:cut] in stems:
            return True
    return False


def _some(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _ambiguous(source: str, shape: str, formats: dict[str, str]) -> SourceError:
    choices = "; ".join(f"`--format {name}` (format={name!r}) {what}" for name, what in formats.items())
    return SourceError(
        f"{source}: cannot tell the source format: {shape}, so more than one format could apply. Pass {choices}",
        path=source,
    )
