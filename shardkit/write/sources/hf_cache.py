"""A Hugging Face ``datasets`` dataset named by its Hub name, found in the local ``datasets`` cache.

``shardkit write user/name DEST --format hf`` writes the dataset that
``datasets.load_dataset("user/name")`` loaded (and cached) earlier. The name
is looked up offline only, always: this module reads the cache's folders and
never imports ``datasets`` or opens a connection, so a name that is not
cached is an error saying how to cache it, not a download.

The SOURCE is ``NAME``, ``NAME:SPLIT`` or ``NAME:CONFIG:SPLIT`` (split
``train`` and the only cached config, or ``default``, when left out).

Where the cache is: as ``datasets`` finds it, ``$HF_DATASETS_CACHE``, else
``$HF_HOME/datasets``, else ``$XDG_CACHE_HOME/huggingface/datasets``
(``~/.cache/huggingface/datasets``). Its layout, as ``datasets`` writes it
when it prepares a dataset::

    <cache>/<namespace>___<snake_case_name>/<config>/<version>/<revision hash>/
        dataset_info.json                      (config_name, splits)
        <snake_case_name>-<split>.arrow        or, several files,
        <snake_case_name>-<split>-00000-of-00003.arrow ...

Of several cached revisions the most recently written one is taken (as
``datasets`` does offline). Its Arrow files are Arrow streams, read by
:mod:`shardkit.write.sources.table_reader` like those of a ``save_to_disk`` folder.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass

from shardkit.errors import SourceError

_UPPER_THEN_WORD = re.compile(r"([A-Z]+)([A-Z][a-z])")
_LOWER_THEN_UPPER = re.compile(r"([a-z\d])([A-Z])")
_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_SPLIT = re.compile(r"^\w+(\.\w+)*$")


@dataclass(frozen=True)
class CachedDataset:
    """One split of a cached dataset.

    Attributes:
        name: The Hub name (``user/name``).
        config, split: Which of its configs and splits.
        folder: The cache folder of the revision taken.
        files: Its Arrow files of ``split``, in order.
    """

    name: str
    config: str
    split: str
    folder: str
    files: tuple[str, ...]


def datasets_cache_dir() -> str:
    """The folder ``datasets`` caches prepared datasets in (see the module docs)."""
    found = os.environ.get("HF_DATASETS_CACHE")
    if found:
        return os.path.expanduser(found)
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "datasets")


def looks_like_name(source: str) -> bool:
    """Whether ``source`` reads as ``NAME[:CONFIG][:SPLIT]`` rather than a path."""
    return not os.path.exists(source) and bool(_NAME.match(source.split(":", 1)[0]))


def _snake_case(name: str) -> str:
    return _LOWER_THEN_UPPER.sub(r"\1_\2", _UPPER_THEN_WORD.sub(r"\1_\2", name)).lower()


def _how_to_cache(name: str, cache: str) -> str:
    return (
        f"load it once where the Hub can be reached (python -c \"import datasets; datasets.load_dataset('{name}')\") "
        f"or point HF_DATASETS_CACHE (or HF_HOME) at the cache that holds it; looked in {cache}"
    )


def find_cached(source: str, *, cache_dir: str | None = None) -> CachedDataset:
    """The cached Arrow files of ``source`` (``NAME[:SPLIT]`` or ``NAME:CONFIG:SPLIT``).

    Args:
        source: The SOURCE as given.
        cache_dir: The ``datasets`` cache (default :func:`datasets_cache_dir`).

    Raises:
        SourceError: Not a name, not cached (the message says how to cache
            it), or the config or split is not there (names those that are).
    """
    cache = cache_dir or datasets_cache_dir()
    name, *rest = source.split(":")
    if len(rest) > 2 or not _NAME.match(name) or ".." in name:
        raise SourceError(
            f"{source}: not a datasets name; with --format hf give a save_to_disk folder, "
            "or NAME, NAME:SPLIT or NAME:CONFIG:SPLIT (e.g. user/name:train)",
            path=source,
        )
    config = rest[0] if len(rest) == 2 else None
    split = rest[-1] if rest else "train"
    if not _SPLIT.match(split) or (config is not None and not _SPLIT.match(config.replace("-", "_"))):
        raise SourceError(f"{source}: {split!r} is not a split name (letters, digits, _ and .)", path=source)
    parts = name.split("/")
    parts[-1] = _snake_case(parts[-1])
    root = os.path.join(cache, "___".join(parts))
    revisions = [path for path in glob.glob(os.path.join(glob.escape(root), "*", "*", "*")) if os.path.isdir(path)]
    if not revisions:
        raise SourceError(
            f"{name}: no such folder, and not in the datasets cache; {_how_to_cache(name, cache)}", path=source
        )
    configs = sorted({os.path.basename(os.path.dirname(os.path.dirname(path))) for path in revisions})
    if config is None:
        config = "default" if "default" in configs or len(configs) != 1 else configs[0]
    if config not in configs:
        raise SourceError(
            f"{name}: config {config!r} is not in the datasets cache (cached: {', '.join(configs)}); "
            f"pass NAME:CONFIG:SPLIT, e.g. {name}:{configs[0]}:{split}",
            path=source,
        )
    mine = [path for path in revisions if os.path.basename(os.path.dirname(os.path.dirname(path))) == config]
    folder = max(mine, key=lambda path: (os.stat(path).st_mtime, path))
    info_path = os.path.join(folder, "dataset_info.json")
    try:
        with open(info_path, encoding="utf-8") as f:
            splits = json.load(f).get("splits") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise SourceError(f"{info_path}: not a readable datasets cache entry ({exc})", path=info_path) from exc
    if split not in splits:
        raise SourceError(
            f"{name}: split {split!r} is not cached (cached: {', '.join(sorted(splits)) or 'none'}); "
            f"pass NAME:SPLIT, e.g. {name}:{next(iter(sorted(splits)), 'train')}",
            path=source,
        )
    pattern = re.compile(rf"^{re.escape(parts[-1])}-{re.escape(split)}(-\d{{5}}-of-\d{{5}})?\.arrow$")
    files = sorted(entry for entry in os.listdir(folder) if pattern.match(entry))
    if not files:
        raise SourceError(
            f"{folder}: the cache entry lists split {split!r} but holds no Arrow file of it; "
            f"{_how_to_cache(name, cache)}",
            path=folder,
        )
    return CachedDataset(name, config, split, folder, tuple(files))


__all__ = ["CachedDataset", "datasets_cache_dir", "find_cached", "looks_like_name"]
