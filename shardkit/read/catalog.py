"""Turn the reader's ``source`` argument into a list of shards to read.

A :class:`ShardCatalog` is what the split and the stream need: shard URLs,
and, when known, per-shard sample counts and offset-index URLs. With a
manifest all three are known, and the reader splits at sample precision.
With only shard paths (a list or a brace pattern), counts are taken from
local ``.idx`` sidecars when every shard has one; otherwise the reader works
at shard granularity (see :class:`shardkit.ShardDataset`).

Compressed shards (``.tar.gz``, ``.tgz``, ``.tar.zst``) cannot be entered in
the middle, so a catalog with any compressed shard has no counts and no
index URLs: the plan then deals whole shards to slots (shard granularity,
as without a manifest) and the stream reads each from byte 0. A shard is
known to be compressed by its name, and local shards listed with ``.idx``
sidecars also by their first bytes; a compressed shard that passes for a
plain one is still recognised by its magic bytes when read whole (see
:mod:`.pieces`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardkit.errors import InputFileError, ManifestError, UsageError
from shardkit.format.brace import BraceList, JoinedNames, expand_patterns, is_pattern
from shardkit.format.compression import SHARD_SUFFIXES, compression_from_name, file_compression
from shardkit.format.index import index_path_for, load_index
from shardkit.format.derived import DerivedManifest
from shardkit.format.manifest import Manifest, load_manifest
from shardkit.format.path_column import any_entry_ends_with, irregular_entries
from shardkit.format.removed import Removed
from shardkit.format.table import ShardEntry, ShardTable
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_document_tokens
from shardkit.io.manifest import manifest_url, remote_manifest
from shardkit.io.urls import is_local, local_path
from shardkit.read.derived import DerivedCatalog, open_derived

#: Resolved shard and index URLs kept per catalog (a reader touches a few
#: shards at a time; resolving one again costs ~10 us; a random reader keeps
#: the URLs of the shards it holds open with them). ~0.5 KB an entry.
URL_CACHE_SIZE = 256


class ShardCatalog:
    """The shards a reader reads.

    A catalog over a manifest holds the manifest (whose shard table is a
    memory-mapped file, shared by every process on the machine) and computes
    URLs on access; one over a list of shard paths holds the list.

    Args:
        urls: Shard paths or URLs, in dataset order (None over a manifest).
        counts: Samples per shard, or None when unknown (shard granularity).
        index_urls: Offset-index path or URL per shard, or None when the
            shards have no indexes.
        manifest: The manifest they came from, if any.
        compressed: Whether any shard is known to be compressed; such a
            catalog has no counts or index URLs, so shards are read whole.
            None: told by the shard names when asked (remote shards without
            a manifest, read whole in any case).
        allowed_prefixes: Locations outside the dataset that manifest entries
            may point to (see :meth:`Manifest.resolve`).

    Pickled, a catalog over a manifest is small: the manifest's small fields
    and where its table file is; the receiver maps the table again. So is
    one over a brace pattern (:class:`~shardkit.format.brace.BraceList`):
    its names are made on access.
    """

    #: The sides a reader joins and the fields it keeps (see
    #: :mod:`.derived`); a plain catalog with ``fields`` set keeps those only.
    sides: tuple[Any, ...] | None = None
    fields: frozenset[str] | None = None

    def __init__(
        self,
        urls: Sequence[str] | None = None,
        counts: np.ndarray | None = None,
        index_urls: Sequence[str] | None = None,
        manifest: Manifest | None = None,
        compressed: bool | None = False,
        *,
        allowed_prefixes: Sequence[str] = (),
    ):
        if urls is None and manifest is None:
            raise UsageError("a ShardCatalog needs shard urls or a manifest")
        self._urls = None if urls is None else urls if isinstance(urls, _LAZY_NAMES) else tuple(urls)
        self._counts = counts
        self._index_urls = None if index_urls is None else tuple(index_urls)
        self.manifest = manifest
        self._compressed = compressed
        self.allowed_prefixes = tuple(allowed_prefixes)
        self._setup()

    def _setup(self) -> None:
        self._starts: np.ndarray | None = None
        self._url = functools.lru_cache(maxsize=URL_CACHE_SIZE)(self._resolve_url)
        self._index = functools.lru_cache(maxsize=URL_CACHE_SIZE)(self._resolve_index)

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_url", "_index", "_starts")}
        if self.manifest is not None and self._urls is None:
            state["_counts"] = None  # a view of the table: derived again on arrival
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @property
    def compressed(self) -> bool:
        """Whether some shard is compressed whole (read whole, no counts or
        indexes); for remote shards without a manifest, as their names say."""
        if self._compressed is None:
            assert self._urls is not None
            self._compressed = any(compression_from_name(u) for u in self._urls)
        return self._compressed

    @property
    def _table(self) -> ShardTable | None:
        return self.manifest.table if self.manifest is not None and self._urls is None else None

    @property
    def num_shards(self) -> int:
        table = self._table
        if table is not None:
            return table.num_shards
        assert self._urls is not None
        return len(self._urls)

    @property
    def counts(self) -> np.ndarray | None:
        """Samples per shard (read-only; a view of the shard table over a
        manifest), or None when unknown."""
        table = self._table
        if table is not None:
            return None if self.compressed else table.counts
        return self._counts

    @property
    def starts(self) -> np.ndarray | None:
        """Cumulative counts (n + 1): shard ``i`` holds samples
        ``[starts[i], starts[i + 1])``; None when counts are unknown."""
        table = self._table
        if table is not None:
            return None if self.compressed else table.starts
        if self._starts is None and self._counts is not None:
            starts = np.zeros(len(self._counts) + 1, dtype=np.int64)
            np.cumsum(self._counts, out=starts[1:])
            starts.flags.writeable = False
            self._starts = starts
        return self._starts

    @property
    def removed(self) -> Removed | None:
        """The samples removed from the shards (``shardkit remove``), or None
        when none were: :attr:`counts` count the samples kept, and each
        shard's kept samples are read by their stored positions (see
        :mod:`shardkit.format.removed`)."""
        table = self._table
        return None if table is None or table.removed is None else Removed(table.removed)

    def stored_count(self, shard: int) -> int:
        """Samples shard ``shard``'s tar file and offset index hold: the kept
        ones and any removed from it.

        Raises:
            UsageError: The counts are unknown.
        """
        counts = self.counts
        if counts is None:
            raise UsageError("sample counts are unknown: read a dataset with a manifest")
        return Removed(None if self._table is None else self._table.removed).stored_count(counts, shard)

    def entry(self, shard: int) -> ShardEntry | None:
        """Shard ``shard``'s manifest entry (its size and checksum), or None
        without a manifest."""
        return None if self.manifest is None else self.manifest.shards[shard]

    @property
    def has_indexes(self) -> bool:
        """Whether every shard has an offset index (see :meth:`index_url`)."""
        if self._table is not None:
            return not self.compressed
        return self._index_urls is not None

    @property
    def urls(self) -> Sequence[str]:
        """Every shard's URL as a sequence (computed on access over a manifest)."""
        return self._urls if self._urls is not None else _UrlView(self, self.url)

    @property
    def index_urls(self) -> Sequence[str] | None:
        """Every shard's index URL as a sequence (computed on access over a
        manifest), or None without indexes. Prefer :meth:`index_url`."""
        if not self.has_indexes:
            return None
        return self._index_urls if self._index_urls is not None else _UrlView(self, self.index_url)

    def url(self, shard: int) -> str:
        """The path or URL of shard number ``shard``."""
        return self._url(int(shard))

    def index_url(self, shard: int) -> str:
        """The path or URL of shard number ``shard``'s offset index.

        Raises:
            UsageError: The shards have no indexes (see :attr:`has_indexes`).
        """
        if not self.has_indexes:
            raise UsageError(f"shard {shard} ({self.url(shard)}) has no offset index")
        return self._index(int(shard))

    def _resolve_url(self, shard: int) -> str:
        if self._urls is not None:
            return self._urls[shard]
        assert self.manifest is not None
        return self.manifest.shard_url(shard, allowed_prefixes=self.allowed_prefixes)

    def _resolve_index(self, shard: int) -> str:
        if self._index_urls is not None:
            return self._index_urls[shard]
        assert self.manifest is not None
        return self.manifest.index_url(shard, allowed_prefixes=self.allowed_prefixes)

    def shard_of(self, sample: int) -> tuple[int, int]:
        """The shard holding global sample ``sample`` and its offset there
        (a binary search over :attr:`starts`; empty shards are skipped).

        Raises:
            UsageError: The counts are unknown.
            IndexError: ``sample`` is out of range.
        """
        starts = self.starts
        if starts is None:
            raise UsageError("sample positions need per-shard counts: read a dataset with a manifest")
        total = int(starts[-1])
        if not 0 <= sample < total:
            raise IndexError(f"sample {sample} out of range (the dataset has {total} samples)")
        shard = int(np.searchsorted(starts, sample, side="right")) - 1
        return shard, int(sample - starts[shard])

    @property
    def fingerprint(self) -> str:
        """What identifies the dataset in a reader state: the manifest's
        fingerprint, or for shards without a manifest a hash of their names
        and sample counts.

        Raises:
            UsageError: Shards without a manifest and without counts.
        """
        if self.manifest is not None:
            return self.manifest.fingerprint
        counts = self.counts
        if counts is None:
            raise UsageError("a fingerprint needs per-shard sample counts: read a dataset with a manifest")
        digest = hashlib.sha256()
        for url, count in zip(self.urls, counts.tolist()):
            digest.update(f"{url.rsplit('/', 1)[-1]}\0{int(count)}\n".encode())
        return digest.hexdigest()

    @property
    def num_samples(self) -> int | None:
        starts = self.starts
        return None if starts is None else int(starts[-1])

    @property
    def token_fields(self) -> tuple[str, ...]:
        """The fields whose token counts the dataset records (see
        :mod:`shardkit.format.tokens`); empty when it records none."""
        table = self._table
        return () if table is None or self.manifest is None else self.manifest.token_fields

    def shard_tokens(self, field: str) -> np.ndarray:
        """Each shard's token count of ``field`` (int64, read-only, a view
        of the shard table).

        Raises:
            UsageError: The dataset records no counts of ``field``.
        """
        column = self._token_column(field)
        tokens = self._tokens()
        return tokens[:, column]

    def document_tokens(self, shard: int, field: str, *, options: SourceOptions | None = None) -> np.ndarray:
        """Each sample's token count of ``field`` in shard ``shard`` (int64),
        from the third array of its offset index, checked against the
        shard table (:func:`~shardkit.io.index.fetch_document_tokens`).

        Args:
            shard: The shard's number.
            field: A recorded token field (see :attr:`token_fields`).
            options: How to read a remote index.

        Raises:
            UsageError: The dataset records no counts of ``field``.
            IndexError: ``shard`` is out of range.
            CorruptShardError: The index holds no counts, or ones that
                disagree with the table; naming the file.
        """
        column = self._token_column(field)
        tokens = self._tokens()
        if not 0 <= shard < len(tokens):
            raise IndexError(f"shard {shard} out of range (the dataset has {len(tokens)} shards)")
        removed = self.removed
        gone = None if removed is None else removed.in_shard(shard)
        num_samples = int(self._table.counts[shard]) + (0 if gone is None else len(gone))  # type: ignore[union-attr]
        if num_samples == 0:
            return np.zeros(0, dtype=np.int64)
        counts = fetch_document_tokens(
            self.index_url(shard), num_samples=num_samples, totals=tokens[shard], options=options, removed=gone
        )
        return counts[:, column]

    def _tokens(self) -> np.ndarray:
        """The table's ``tokens`` column (there when :attr:`token_fields` is not empty)."""
        table = self._table
        assert table is not None and table.tokens is not None
        return table.tokens

    def _token_column(self, field: str) -> int:
        fields = self.token_fields
        if field not in fields:
            recorded = f"counts of {', '.join(map(repr, fields))}" if fields else "no token counts"
            where = self.manifest.name if self.manifest is not None else "these shards (no manifest)"
            raise UsageError(
                f"{where}: no token counts of field {field!r}; the dataset records {recorded}. A field is counted "
                "where it is a 1-D integer .npy array in every sample that has it: run `shardkit index DIR` on the "
                "dataset, or rewrite it with `shardkit write`, to record them"
            )
        return fields.index(field)


class _UrlView(Sequence[str]):
    """``catalog.urls`` over a manifest: each URL computed on access."""

    def __init__(self, catalog: ShardCatalog, url: Any):
        self._catalog = catalog
        self._get = url

    def __len__(self) -> int:
        return self._catalog.num_shards

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self._get(j) for j in range(*i.indices(len(self))))
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._get(i % n)


def _table_is_compressed(table: ShardTable) -> bool:
    """Whether any shard's name says it is compressed (see
    :func:`compression_from_name`), without a Python string per shard."""
    columns = table.path_columns()
    if columns is None:
        return compression_from_name(table.naming.shard) is not None  # type: ignore[union-attr]
    return any_entry_ends_with(*columns[0], SHARD_SUFFIXES, cut="?")  # as compression_from_name, before a query


def _local_shard_is_compressed(path: str) -> bool:
    try:
        return file_compression(path) is not None
    except OSError:
        return False  # reported when the shard is read


def from_manifest(manifest: Manifest, *, options: SourceOptions | None = None) -> ShardCatalog:
    """Catalog of a manifest's shards, resolved inside its base location.

    Args:
        manifest: The manifest.
        options: ``allowed_prefixes`` names locations outside the dataset
            that entries may point to (see :meth:`Manifest.resolve`).

    Raises:
        ManifestError: An entry leaves the dataset and no prefix allows it.
            The first shard is resolved here; of the paths stored in the
            table, those that are not plain relative paths
            (:func:`~shardkit.format.path_column.irregular_entries`, found in
            numpy over the whole column) are resolved here too, so a manifest
            naming a place outside the dataset fails here, not mid-epoch.
            Names made from a naming pattern, and plain stored paths, cannot
            leave the dataset but through a symlink: each is resolved on
            access, where a local shard that is a symlink out is refused.
    """
    allowed = () if options is None else tuple(options.allowed_prefixes)
    compressed = _table_is_compressed(manifest.table)
    catalog = ShardCatalog(manifest=manifest, compressed=compressed, allowed_prefixes=allowed)
    shards = set(range(min(1, manifest.num_shards)))
    indexes = set(shards)
    columns = manifest.table.path_columns()
    if columns is not None:
        shards.update(irregular_entries(*columns[0]).tolist())
        indexes.update(irregular_entries(*columns[1]).tolist())
    for shard in sorted(shards | indexes):  # in order: the first bad entry is the one named
        if shard in shards:
            catalog.url(shard)
        if catalog.has_indexes and shard in indexes:
            catalog.index_url(shard)
    manifest.table.drop_pages()  # the columns read for these checks
    return catalog


def _from_shard_urls(urls: Sequence[str]) -> ShardCatalog:
    if not urls:
        raise UsageError("no shards given: the shard list or pattern is empty")
    if not isinstance(urls, _LAZY_NAMES):
        urls = tuple(urls)
    if not _any_local(urls):
        # Remote shards without a manifest are read whole, at shard granularity; their
        # names are not walked here (a pattern of a million URLs stays a pattern).
        return ShardCatalog(urls=urls, counts=None, index_urls=None, compressed=None)
    _check_local_shards_exist(urls)
    if any(compression_from_name(u) for u in urls):
        return ShardCatalog(urls=urls, counts=None, index_urls=None, compressed=True)
    sidecars = [index_path_for(local_path(u)) for u in urls] if all(is_local(u) for u in urls) else []
    if sidecars and all(os.path.exists(p) for p in sidecars):
        if any(_local_shard_is_compressed(local_path(u)) for u in urls):
            return ShardCatalog(urls=urls, counts=None, index_urls=None, compressed=True)
        counts = np.array([len(load_index(p)) - 1 for p in sidecars], dtype=np.int64)
        return ShardCatalog(urls=urls, counts=counts, index_urls=tuple(sidecars))
    return ShardCatalog(urls=urls, counts=None, index_urls=None)


#: Name sequences made on access (patterns), kept as they are.
_LAZY_NAMES = (BraceList, JoinedNames)


def _any_local(urls: Sequence[str]) -> bool:
    """Whether some of ``urls`` is a local path (a pattern's scheme is in its first part)."""
    if isinstance(urls, BraceList):
        return is_local(urls[0])
    if isinstance(urls, JoinedNames):
        return any(_any_local(part) for part in urls.parts)
    return any(is_local(u) for u in urls)


def _check_local_shards_exist(urls: Sequence[str]) -> None:
    """Refuse a list naming local shards that are not there (a brace
    pattern running past the last shard, say), naming the first."""
    missing = [u for u in urls if is_local(u) and not os.path.exists(local_path(u))]
    if missing:
        first = local_path(missing[0])
        more = f" (and {len(missing) - 1} more of the {len(urls)} shards given)" if len(missing) > 1 else ""
        raise InputFileError(
            f"{first}: no such shard{more}. Check the shard paths or the range of the brace pattern",
            path=first,
        )


def _names_a_shard(url: str) -> bool:
    """Whether a remote URL names one shard (its path ends like a tar
    shard, or it is a ``pipe:`` command) rather than a dataset folder."""
    if url.startswith("pipe:"):
        return True
    return urllib.parse.urlsplit(url).path.endswith((".tar", *SHARD_SUFFIXES))


def resolve_catalog(
    source: str | os.PathLike[str] | Sequence[str] | Manifest,
    *,
    options: SourceOptions,
    fields: Sequence[str] | None = None,
) -> ShardCatalog:
    """Resolve the reader's ``source`` argument.

    Args:
        source: A :class:`Manifest`; a ``manifest.json`` path or URL; a
            directory or folder URL (with or without its trailing ``/``)
            holding ``manifest.json``; a brace pattern of shard paths/URLs;
            one shard path or URL (ending ``.tar``, ``.tar.gz``, ``.tgz`` or
            ``.tar.zst``; a shard URL ending otherwise goes in a list); or a
            list of shard paths/URLs.
        options: How to read remote manifests, and the locations outside
            the dataset a manifest may name (``allowed_prefixes``).
        fields: Read only these fields (column projection): of a view or
            an extension, only the shards that hold them are read.

    Raises:
        UsageError: An empty shard list.
        InputFileError: A local shard of the list or pattern does not exist.
        ManifestError: A manifest that is missing or invalid, or that names
            a location outside the dataset.
    """
    from shardkit.io.registry import prepare_reading

    catalog = _catalog_of(source, options=options)
    if isinstance(catalog, DerivedCatalog):
        catalog = catalog.projected(fields)
    elif fields is not None:
        catalog = _projected(catalog, fields)
    if catalog.num_shards:
        # Here, before DataLoader workers fork: what reading the shards needs
        # once per process (an s3:// signer) is made once, not in each worker.
        prepare_reading(catalog.url(0), options=options)
    return catalog


def _projected(catalog: ShardCatalog, fields: Sequence[str]) -> ShardCatalog:
    """A plain dataset's catalog that keeps ``fields`` of each sample."""
    have = catalog.manifest.extensions if catalog.manifest is not None else None
    unknown = [f for f in fields if have is not None and f not in have]
    if unknown:
        raise UsageError(f"{catalog.manifest.name}: no field {unknown[0]!r}; its samples have {list(have)}")  # type: ignore[union-attr]
    catalog.fields = frozenset(fields)
    return catalog


def open_location(location: str, *, options: SourceOptions, chain: tuple[str, ...] = ()) -> Any:
    """The catalog of the dataset at ``location`` (a folder or URL with a
    manifest), plain or derived (a parent, see :mod:`.derived`)."""
    if is_local(location):
        manifest: Any = load_manifest(local_path(location))
    else:
        manifest = remote_manifest(manifest_url(location), options)
    return _from_any_manifest(manifest, options=options, chain=chain)


def _from_any_manifest(manifest: Any, *, options: SourceOptions, chain: tuple[str, ...] = ()) -> Any:
    if isinstance(manifest, DerivedManifest):
        return open_derived(manifest, options=options, open_location=open_location, chain=chain)
    return from_manifest(manifest, options=options)


def _catalog_of(source: str | os.PathLike[str] | Sequence[str] | Manifest, *, options: SourceOptions) -> ShardCatalog:
    """:func:`resolve_catalog` but for what it prepares."""
    if isinstance(source, (Manifest, DerivedManifest)):
        return _from_any_manifest(source, options=options)
    if isinstance(source, (list, tuple)):
        return _from_shard_urls([os.fspath(s) for s in source])
    text = os.fspath(source)  # type: ignore[arg-type]
    if is_pattern(text):
        return _from_shard_urls(expand_patterns(text))
    if is_local(text):
        path = local_path(text)
        if os.path.isdir(path) or path.endswith(".json"):
            return _from_any_manifest(load_manifest(path), options=options)
        if not os.path.exists(path):
            raise ManifestError(f"{path}: no such shard, manifest or dataset directory", path=path)
        return _from_shard_urls([text])
    if text.endswith(".json") or not _names_a_shard(text):
        # A manifest, or a dataset folder with or without its trailing slash.
        return _from_any_manifest(remote_manifest(manifest_url(text), options), options=options)
    return _from_shard_urls([text])
