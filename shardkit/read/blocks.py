"""Token blocks as the samples of a reader: what ``ShardDataset(...,
tokens=TokenBlocks(...))`` reads (issue #40).

An epoch's *token stream* is the dataset's documents in the epoch's order
(shards in the order ``(seed, epoch)`` gives them, as for samples; each
shard's documents in stored order), each document's token ids (the 1-D
integer array in ``field``) followed by ``eos`` when one is set. The stream
is cut into ``num_tokens // block_size`` blocks.

**Blocks are samples.** The reader sees each epoch's blocks as a dataset of
their own: :class:`BlockCatalog` presents them as *virtual shards* of
:data:`CHUNK_BLOCKS` blocks (virtual shard ``epoch * num_chunks + c`` holds
blocks ``[c * CHUNK_BLOCKS, ...)`` of that epoch), :class:`BlockLayout`
keeps them in stream order, and :class:`BlockReader` reads them. So
everything the reader does for samples it does for blocks, unchanged: the
split over ranks and workers by whole blocks (every rank the same number of
blocks in ``"balanced"`` mode, whatever the documents' lengths; every
block once in ``"exact"``), ``len()``, the swap-buffer shuffle (of blocks,
see below), checkpoints as a count of delivered blocks, resuming in a new
process or on another topology, ``"infinite"`` mode.

**The split is arithmetic.** Where block *b* lies in the shards follows
from token counts alone (:class:`~shardkit.read.tokens.TokenStream`): the
shard table's per-shard totals, and the per-document counts of the at most
two shards a run of blocks starts or ends inside (the offset index's token
array; see :meth:`~shardkit.read.catalog.ShardCatalog.document_tokens`).
No data is read to plan an epoch, and a block is read again by position
(a restored shuffle buffer) by reading just its documents.

**Mixtures.** A stream of a mixture is read as the sample reader reads a
stream: its blocks are a walk, pass after pass over its virtual shards (runs
of :data:`CHUNK_BLOCKS` blocks of its epoch-0 token stream), each pass in a
new order; the shares, in blocks, are shares of tokens.

**Shuffle: blocks after packing.** Each slot packs its documents in stream
order and mixes the blocks through its swap buffer (``buffer_size`` counts
blocks). A block's documents are neighbours in one shard (as in LitData's
``TokensLoader``); the epoch's shard order and the buffer mix the rest
(see ``bench/bench_tokens.py`` for ``shuffle_quality``). Packing after a
document shuffle would need every document's count to replay a checkpoint.

**Runs.** The documents come from the shards' reader as runs where they
are plain (:class:`~shardkit.format.plain.SampleRun`: one member each, as
``shardkit write`` stores them) and their ids are taken as arrays
(:func:`~shardkit.format.tokens.run_token_arrays`); a run that is not all
1-D arrays of one dtype as NumPy writes them is read document by document,
as any other document is.

**Faults.** A document whose recorded count disagrees with its array, or
whose field is not a 1-D integer array (or holds an id past int64), is a
:class:`~shardkit.errors.CorruptShardError` naming the sample; under
``on_error="skip"`` its tokens are left out, and the run of blocks it was in
comes out short by the blocks it can no longer fill. A shard total above the
shard's size in bytes is refused when the dataset opens (a
:class:`~shardkit.errors.ManifestError` naming the table). In an exact
epoch every document is read by one reader, those counted empty and those
after the last block included, so a count that lies fails some reader. What
one reader cannot see: a run that starts inside a shard is placed by the
counts of the documents before it, which it does not read; a lie there fails
the reader of those documents, not this one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.errors import CorruptShardError, ManifestError, UsageError
from shardkit.format.npy import MAX_HEADER_BYTES, parse_npy_header
from shardkit.format.plain import SampleRun
from shardkit.format.table import TABLE_ADVICE
from shardkit.format.tar import RawSample
from shardkit.format.tokens import run_token_arrays, token_array
from shardkit.io.urls import redact_url
from shardkit.read.block_output import OUTPUT_DTYPES, BlockOutput, stack_blocks
from shardkit.read.catalog import ShardCatalog
from shardkit.read.packer import Packer, cut_lengths
from shardkit.read.pieces import FAULTS, Located, OnError, PieceReader
from shardkit.read.split import Piece, epoch_order
from shardkit.read.tokens import TokenPiece, TokenStream
from shardkit.world import World

#: What a block can be yielded as (``TokenBlocks.dtype``), and as which NumPy type.
#: The largest token id a block holds (int64; ids stored as uint64 are checked).
_MAX_ID = np.iinfo(np.int64).max
#: Blocks in one virtual shard (see the module docstring): bounds what a
#: restored buffer's replay sizes at once, whatever the epoch's length.
CHUNK_BLOCKS = 1024
#: Epoch streams (shard order and its running token totals) a catalog keeps.
_STREAMS_KEPT = 2
#: Virtual shards' names a catalog keeps.
_URLS_KEPT = 4096
#: Shards' per-document counts a reader keeps (the boundary shards of its runs).
_COUNTS_KEPT = 8


@dataclass(frozen=True)
class TokenBlocks:
    """Read fixed-length blocks of token ids instead of samples (see
    :mod:`shardkit.read.blocks`).

    Args:
        field: The field holding each document's token ids: a 1-D integer
            ``.npy`` array (any integer dtype), e.g. ``"tokens.npy"`` or
            ``"npy"``. The dataset must record its token counts (``shardkit
            write`` does for such fields; ``shardkit index`` for published
            shards).
        block_size: Tokens per block (e.g. 2049 for 2048-token contexts
            and their next-token targets).
        eos: A token id appended after each document, or None.
        boundaries: Yield each block with its documents' layout (see
            :mod:`.block_output`): ``position_ids`` (restarting at 0 at each
            document, continuing the true position of a document carried
            over) and ``cu_seqlens``/``seq_lens``/``max_seqlen``, as
            flash-attention's varlen functions and torchtitan take them;
            taken from the stored per-document counts.
        dtype: What a block is yielded as: ``torch.int64`` (what embedding
            and loss layers index with), or ``torch.int32``, half the bytes
            to hand from a DataLoader worker and to copy to the device,
            where ``.long()`` is nearly free. Ids stored in a wider type
            are checked to fit int32 as each block leaves the reader.

    Raises:
        UsageError: A bad field, block size, ``eos`` or ``dtype``.
    """

    field: str
    block_size: int
    eos: int | None = None
    dtype: torch.dtype = torch.int64
    boundaries: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field or self.field.startswith("."):
            raise UsageError(f"TokenBlocks field must be a field name such as 'tokens.npy', not {self.field!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise UsageError(f"TokenBlocks block_size must be an int >= 1, not {self.block_size!r}")
        if self.eos is not None and (isinstance(self.eos, bool) or not isinstance(self.eos, int) or self.eos < 0):
            raise UsageError(f"TokenBlocks eos must be a token id (an int >= 0) or None, not {self.eos!r}")
        if not isinstance(self.boundaries, bool):
            raise UsageError(f"TokenBlocks boundaries must be True or False, not {self.boundaries!r}")
        if self.dtype not in OUTPUT_DTYPES:
            raise UsageError(f"TokenBlocks dtype must be torch.int64 or torch.int32, not {self.dtype!r}")
        if self.eos is not None and self.eos > np.iinfo(OUTPUT_DTYPES[self.dtype]).max:
            raise UsageError(f"TokenBlocks eos {self.eos:,} does not fit {self.dtype}: use dtype=torch.int64")

    def record(self) -> str:
        """What a checkpoint's fingerprint adds for these blocks."""
        return f"tokens:{self.field}:{self.block_size}:{self.eos}"

    def apply(self, mixture: Any, output: Any, *, seed: int, shuffle: bool) -> tuple[Any, Any]:
        """The reader's sources and output for these blocks: each source's
        blocks as a catalog, each block handed over as :mod:`.block_output` says.

        Raises:
            UsageError: ``decode`` or ``select`` given (blocks are token ids).
        """
        if output.decoder is not None or output.select is not None:
            raise UsageError("tokens= yields blocks of token ids: leave decode= and select= unset")
        mixture = mixture.with_tokens(self, seed=seed, shuffle=shuffle)
        if output.map is None and output.collate is None and output.batch_size is not None:
            stack = functools.partial(stack_blocks, dtype=self.dtype)
            return mixture, dataclasses.replace(output, map=BlockOutput.batched, collate=stack)
        return mixture, dataclasses.replace(output, map=BlockOutput(output.map, self.dtype))


def _dataset_name(catalog: ShardCatalog) -> str:
    first = redact_url(catalog.url(0)) if catalog.num_shards else "?"
    return f"the dataset of {catalog.num_shards:,} shards from {first}"


class BlockCatalog:
    """One dataset's token blocks as a catalog of virtual shards (see the
    module docstring): what a :class:`~shardkit.read.slot.SlotReader` asks of
    a catalog, answered from the real one's token counts.

    Args:
        catalog: The dataset.
        tokens: What to read.
        seed: The reader's seed (the epochs' shard orders).
        shuffle: Permute the shards each epoch.

    Raises:
        UsageError: The dataset records no token counts for the field, or
            holds fewer tokens than one block, or its shards are compressed.
        ManifestError: Its table counts more tokens in a shard than the
            shard has bytes.
    """

    has_indexes = True
    compressed = False
    manifest = None

    def __init__(self, catalog: ShardCatalog, tokens: TokenBlocks, *, seed: int, shuffle: bool):
        totals = np.asarray(catalog.shard_tokens(tokens.field), dtype=np.int64)
        _check_shard_totals(catalog, tokens.field, totals)
        documents = np.asarray(catalog.counts, dtype=np.int64)
        if tokens.eos is not None:
            totals = totals + documents  # one eos after each document
        self.catalog = catalog
        self.tokens = tokens
        self.seed = seed
        self.shuffle = shuffle
        self.shard_tokens = totals
        self.shard_documents = documents
        self.num_tokens = int(totals.sum())
        self.num_blocks = self.num_tokens // tokens.block_size
        if self.num_blocks == 0:
            raise UsageError(
                f"{_dataset_name(catalog)}: {self.num_tokens:,} tokens in field {tokens.field!r}, fewer than one "
                f"block of {tokens.block_size:,}: use a smaller block_size or more data"
            )
        self.num_shards = -(-self.num_blocks // CHUNK_BLOCKS)  # virtual shards of one epoch
        counts = np.full(self.num_shards, CHUNK_BLOCKS, dtype=np.int64)
        counts[-1] = self.num_blocks - CHUNK_BLOCKS * (self.num_shards - 1)
        self.counts = counts
        self.num_samples = self.num_blocks
        self._streams: dict[int, TokenStream] = {}
        self._urls: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint and what these blocks are of it: a
        checkpoint of samples, or of other blocks, does not load here."""
        return hashlib.sha256(f"{self.catalog.fingerprint}|{self.tokens.record()}".encode()).hexdigest()

    def describe(self) -> str:
        return f"{_dataset_name(self.catalog)}, {self.num_blocks:,} blocks of {self.tokens.block_size:,} tokens"

    def url(self, shard: int) -> str:
        """What messages call virtual shard ``shard`` (asked for every block: kept)."""
        found = self._urls.get(shard)
        if found is None:
            epoch, chunk = divmod(shard, self.num_shards)
            first = chunk * CHUNK_BLOCKS
            found = f"{self.describe()}: epoch {epoch}, blocks {first}-{first + int(self.counts[chunk]) - 1}"
            if len(self._urls) >= _URLS_KEPT:
                self._urls.clear()
            self._urls[shard] = found
        return found

    def place(self, shard: int) -> tuple[int, int, int]:
        """Virtual shard ``shard`` as ``(epoch, first block, blocks)``."""
        epoch, chunk = divmod(shard, self.num_shards)
        return epoch, chunk * CHUNK_BLOCKS, int(self.counts[chunk])

    def stream(self, epoch: int) -> TokenStream:
        """``epoch``'s token stream (the last few are kept; the read parts
        of a slot ask from their own threads)."""
        with self._lock:
            found = self._streams.get(epoch)
            if found is None:
                order = epoch_order(len(self.shard_tokens), seed=self.seed, epoch=epoch, shuffle=self.shuffle)
                found = TokenStream(self.shard_tokens, self.shard_documents, order)
                if len(self._streams) >= _STREAMS_KEPT:
                    self._streams.pop(next(iter(self._streams)))
                self._streams[epoch] = found
            return found

    def check_world(self, world: World) -> None:
        """Refuse a topology with more slots than blocks per rank.

        Raises:
            UsageError: Some slot would have no block, naming the counts.
        """
        if self.num_blocks // world.world_size < world.num_workers:
            raise UsageError(
                f"{_dataset_name(self.catalog)} holds {self.num_tokens:,} tokens in field {self.tokens.field!r}, "
                f"{self.num_blocks:,} whole blocks of {self.tokens.block_size:,}: fewer than one block for each "
                f"of the {world.num_slots} readers ({world.world_size} ranks x {world.num_workers} DataLoader "
                "workers). Use a smaller block_size, fewer workers, or more data."
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Small across processes: the per-shard arrays come again from the catalog's table.
        return _block_catalog, (self.catalog, self.tokens, self.seed, self.shuffle)


def _check_shard_totals(catalog: ShardCatalog, field: str, totals: np.ndarray) -> None:
    """Refuse shards a token reader cannot place, and token totals no shard
    can hold: each token takes at least one byte of its (uncompressed)
    shard, so a total above the shard's size is a lie. This also keeps every
    sum of totals within int64 (they add up to at most the dataset's bytes).

    Raises:
        UsageError: The shards are compressed (no offset indexes).
        ManifestError: A total above its shard's size, naming the table.
    """
    if not catalog.has_indexes:
        raise UsageError(
            f"{_dataset_name(catalog)}: token blocks are placed by the offset indexes of uncompressed shards, "
            "and these shards are compressed. Reshard them uncompressed with `shardkit write`."
        )
    assert catalog.manifest is not None  # token counts come with a manifest's table
    table = catalog.manifest.table
    over = np.flatnonzero(totals > table.num_bytes)
    if len(over):
        i = int(over[0])
        where = table.file or catalog.manifest.name
        raise ManifestError(
            f"{where}: damaged shard table: shard {i} ({redact_url(catalog.url(i))}) counts {int(totals[i]):,} "
            f"tokens in field {field!r}, more than its {int(table.num_bytes[i]):,} bytes can hold (a token takes "
            f"at least one byte); {TABLE_ADVICE}",
            path=where,
        )


def _block_catalog(catalog: ShardCatalog, tokens: TokenBlocks, seed: int, shuffle: bool) -> BlockCatalog:
    return BlockCatalog(catalog, tokens, seed=seed, shuffle=shuffle)


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Each epoch's blocks in stream order, as pieces of virtual shards (an
    :class:`~shardkit.read.plan.EpochLayout`)."""

    num_blocks: int
    num_chunks: int
    stable_from: int = 0

    def length(self, epoch: int) -> int:
        return self.num_blocks

    def pieces(self, epoch: int, start: int, stop: int) -> Iterator[Piece]:
        pos = start
        while pos < stop:  # positions past the epoch wrap to its start (padding)
            at = pos % self.num_blocks
            chunk, first = divmod(at, CHUNK_BLOCKS)
            take = min(CHUNK_BLOCKS - first, self.num_blocks - at, stop - pos)
            yield Piece(epoch * self.num_chunks + chunk, first, first + take)
            pos += take


@dataclass(frozen=True, eq=False)
class BlockSchedule:
    """The schedule of one dataset's blocks read alone: every epoch whole
    (the counterpart of :class:`~shardkit.read.plan.WholeDataset`)."""

    catalog: BlockCatalog
    stable_from: int = 0

    def shares(self, epoch: int) -> tuple[int, ...]:
        return (1,)

    def layout(
        self, index: int, counts: np.ndarray | None, *, seed: int, words: tuple[int, ...], shuffle: bool
    ) -> BlockLayout:
        return BlockLayout(self.catalog.num_blocks, self.catalog.num_shards)


class BlockReader:
    """Reads runs of blocks (pieces of virtual shards): the documents under
    them, through a :class:`~shardkit.read.pieces.PieceReader` of the real
    shards (read-ahead, fault policy, checksums), packed into blocks.

    Takes what a :class:`~shardkit.read.pieces.PieceReader` takes, with a
    :class:`BlockCatalog`; offers what the reader and its resume code call.
    """

    def __init__(self, catalog: BlockCatalog, **reader: Any):
        self.catalog = catalog
        # on_error, on_skip, options, read_ahead_bytes...; runs of documents where they are plain
        self._reader = PieceReader(catalog.catalog, run_field=catalog.tokens.field, **reader)
        self.on_error: OnError = self._reader.on_error
        self.on_skip = self._reader.on_skip
        self._options = self._reader.options
        self._counts: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        tokens = catalog.tokens
        self._field = tokens.field
        self._block_size = tokens.block_size
        self._eos = None if tokens.eos is None else np.array([tokens.eos], dtype=np.int64)
        self._boundaries = tokens.boundaries
        self._nbytes = tokens.block_size * 8  # a block's size in a byte-capped buffer: as an int64 tensor

    # ------------------------------------------------------------ planning

    def document_tokens(self, shard: int) -> np.ndarray:
        """Tokens of each document of real shard ``shard``, ``eos`` included."""
        with self._lock:
            found = self._counts.get(shard)
        if found is None:
            found = self.catalog.catalog.document_tokens(shard, self._field, options=self._options)
            if self._eos is not None:
                found = found + 1
            with self._lock:
                if len(self._counts) >= _COUNTS_KEPT:
                    self._counts.pop(next(iter(self._counts)))
                self._counts[shard] = found
        return found

    def _run(self, piece: Piece) -> tuple[int, list[TokenPiece]]:
        """A run of blocks (a piece of a virtual shard): its first block's
        number in its epoch, and the documents it packs."""
        epoch, first, _ = self.catalog.place(piece.shard)
        lo, hi = first + piece.start, first + piece.stop
        size = self._block_size
        stream = self.catalog.stream(epoch)
        # The epoch's last run reads on to the stream's end: the tokens after
        # its last block fill no block (fewer than one), but their documents'
        # counts are checked, as every other document's is in an exact epoch.
        stop = stream.num_tokens if hi == self.catalog.num_blocks else hi * size
        return lo, list(stream.pieces(lo * size, stop, self.document_tokens))

    # ------------------------------------------------------------ reading

    def load_bounds(self, shard: int) -> np.ndarray:
        """Virtual shard ``shard``'s blocks as byte spans of equal size (what
        a restored shuffle buffer's replay sizes them by)."""
        _, _, blocks = self.catalog.place(shard)
        return np.arange(blocks + 1, dtype=np.int64) * self._nbytes

    def read_runs(self, shard: int, runs: list[tuple[int, int]], *, bounds: np.ndarray) -> Iterator[Located]:
        """Blocks ``[lo, hi)`` of each run of virtual shard ``shard`` (a
        restored buffer's blocks, read again by position)."""
        for lo, hi in runs:
            yield from self.read(iter([Piece(shard, lo, hi)]))

    def read(self, pieces: Iterator[Piece]) -> Iterator[Located]:
        """The blocks of ``pieces`` (runs of virtual shards) in order, each
        as ``(virtual shard, block in it, sample)`` whose field ``tokens``
        holds the block's token ids. Reading starts at once (see
        :meth:`~shardkit.read.pieces.PieceReader.read`)."""
        runs: deque[tuple[Piece, int, list[TokenPiece]]] = deque()

        def documents() -> Iterator[Piece]:  # runs in the read-ahead thread: hands each plan to the packer
            for piece in pieces:
                first, planned = self._run(piece)
                runs.append((piece, first, planned))
                for part in planned:
                    yield Piece(part.shard, part.start, part.stop)

        return self._blocks(self._reader.read(documents()), runs)

    def _blocks(self, located: Iterator[Located], runs: deque[tuple[Piece, int, list[TokenPiece]]]) -> Iterator[Located]:
        # A run's plan is in ``runs`` once a document of it (or the end) came.
        incoming = _Lookahead(iter(located))
        while runs:
            piece, first, planned = runs.popleft()
            packer = Packer(self._block_size)
            number = piece.start
            for part in planned:
                url = self.catalog.catalog.url(part.shard)
                whole = part.skip == 0 and part.num_tokens == int(self.catalog.shard_tokens[part.shard])
                tally = _Tally()
                counts = None if whole and not self._boundaries else self.document_tokens(part.shard)
                for position, tokens, lengths in self._documents(part, incoming, url, counts, tally):
                    skip = part.skip if position == part.start else 0
                    count = max(0, min(len(tokens) - skip, part.num_tokens - tally.taken))
                    tokens = tokens[skip : skip + count]
                    layout = cut_lengths(lengths, skip, count) if self._boundaries else (None, 0)
                    tally.taken += len(tokens)
                    for block, placed in packer.add(tokens, *layout):
                        fields = {"tokens": block} if placed is None else {"tokens": block, "layout": placed}
                        yield piece.shard, number, RawSample(
                            f"block-{first + number - piece.start}", fields,
                            number * self._nbytes, (number + 1) * self._nbytes,
                        )
                        number += 1
                if whole and tally.complete and tally.seen != part.num_tokens:
                    self._fault(self._miscounted(url, part, tally.seen))

    def _documents(
        self, part: TokenPiece, incoming: _Lookahead, url: str, counts: np.ndarray | None, tally: _Tally
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """The token ids (``eos`` included) of ``part``'s documents as they
        come, each as ``(position of its first document, ids, each
        document's token count)``: a document's
        alone, or a run's one after another (a
        :class:`~shardkit.format.plain.SampleRun` whose documents are all
        as NumPy writes them, and as long as ``counts`` says). Documents
        that did not come (skipped faults) and faults skipped here leave
        ``tally.complete`` false."""
        position = part.start
        while position < part.stop:
            item = incoming.item
            if item is None or item[0] != part.shard or item[1] != position:
                tally.complete = False  # skipped under on_error="skip": its tokens are missing
                position += 1
                continue
            incoming.take()
            raw = item[2]
            if isinstance(raw, SampleRun):
                found = self._run_tokens(raw, None if counts is None else counts[position : position + len(raw)])
                if found is not None:
                    tally.seen += len(found[0])
                    yield position, *found
                    position += len(raw)
                    continue
                samples: list[RawSample] = [raw.sample(i) for i in range(len(raw))]  # read one by one: faults named
            else:
                samples = [raw]
            for sample in samples:
                try:
                    tokens = self._tokens(sample, url, None if counts is None else int(counts[position]))
                except FAULTS as exc:
                    if self.on_error == "raise":
                        raise
                    self.on_skip(exc)
                    tally.complete = False
                else:
                    tally.seen += len(tokens)
                    yield position, tokens, np.array([len(tokens)])
                position += 1

    def _run_tokens(self, run: SampleRun, expected: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """The token ids of a run's documents (``eos`` after each) and each
        one's count, or None unless all are read as arrays and agree with
        ``expected``."""
        found = run_token_arrays(run)
        if found is None:
            return None
        ids, counts = found
        if _past_int64(ids):
            return None  # read one by one: the error names the document
        if self._eos is not None:
            counts = counts + 1
            out = np.empty(len(ids) + len(counts), dtype=np.int64)
            ends = np.cumsum(counts) - 1
            out[ends] = self._eos[0]
            tokens = np.ones(len(out), dtype=bool)
            tokens[ends] = False
            out[tokens] = ids
            ids = out
        if expected is not None and not np.array_equal(counts, expected):
            return None
        return ids, counts

    def _fault(self, exc: CorruptShardError) -> None:
        if self.on_error == "raise":
            raise exc
        self.on_skip(exc)

    def _miscounted(self, url: str, part: TokenPiece, seen: int) -> CorruptShardError:
        return CorruptShardError(
            f"{url}: its documents hold {seen:,} tokens in field {self._field!r}"
            f"{' (eos included)' if self._eos is not None else ''}, but the dataset's token counts say "
            f"{part.num_tokens:,}: the shard changed after it was counted. Run `shardkit verify` on the "
            "dataset, and `shardkit index` (or rewrite it) to count its tokens again.",
            path=url,
        )

    def _bad_document(self, url: str, raw: RawSample, what: str) -> CorruptShardError:
        """The error for a document whose token field is missing or unusable (``what``: how)."""
        return CorruptShardError(f"{url}: sample {raw.key!r}{what}", path=url, member=f"{raw.key}.{self._field}",
                                 offset=raw.start)  # fmt: skip

    def _tokens(self, raw: RawSample, url: str, expected: int | None) -> np.ndarray:
        """A document's token ids (``eos`` appended), checked: a 1-D integer
        array, of ``expected`` tokens when its count was read."""
        data = raw.fields.get(self._field)
        if data is None:
            raise self._bad_document(
                url, raw, f" has no field {self._field!r} (it has {', '.join(raw.fields) or 'none'}), but every sample "
                "of a token dataset needs its token ids there",
            )
        array = token_array(data)
        if array is None:
            raise self._bad_document(
                url, raw, f": field {self._field!r} holds {_describe_npy(data)}, not a 1-D integer array of token "
                "ids. Store each document's token ids as one 1-D integer array (e.g. write_dataset(texts, dest, "
                "map=tokenize) returning {'tokens.npy': ids}).",
            )
        if _past_int64(array):
            raise self._bad_document(
                url, raw, f": field {self._field!r} holds token id {int(array.max()):,}, more than int64 holds "
                "(blocks are int64 tensors; no vocabulary needs ids past 2**63). Run `shardkit verify` on the "
                "dataset to see whether the shard changed, or store the ids as a smaller integer type.",
            )
        if self._eos is not None:
            array = np.concatenate((array.astype(np.int64, copy=False), self._eos))
        if expected is not None and len(array) != expected:
            raise self._bad_document(
                url, raw, f" holds {len(array):,} tokens in field {self._field!r}"
                f"{' (eos included)' if self._eos is not None else ''}, but its offset index counts "
                f"{expected:,}: the shard changed after it was counted. Run `shardkit verify` on the dataset, "
                "and `shardkit index` (or rewrite it) to count its tokens again.",
            )
        return array


class _Lookahead:
    """An iterator with its next item in view (``item``; None at the end)."""

    def __init__(self, items: Iterator[Any]):
        self._items = items
        self.item = next(items, None)

    def take(self) -> Any:
        item, self.item = self.item, next(self._items, None)
        return item


@dataclass
class _Tally:
    """What a part's documents held (``seen``, eos included), what of them
    it packed (``taken``), and whether every document came."""

    seen: int = 0
    taken: int = 0
    complete: bool = True


def _past_int64(ids: np.ndarray) -> bool:
    """Whether token ids stored as uint64 (either byte order) hold one int64 cannot."""
    return ids.dtype.kind == "u" and ids.dtype.itemsize == 8 and len(ids) > 0 and int(ids.max()) > _MAX_ID


def _describe_npy(data: bytes) -> str:
    """What ``.npy`` bytes that are no token array hold, for a message."""
    try:
        header = parse_npy_header(data[:MAX_HEADER_BYTES])
    except ValueError as exc:
        return f"no readable .npy array ({exc})"
    dtype = header.dtype()
    return f"a {dtype if dtype is not None else header.descr.decode('ascii', 'replace')} array of shape {header.shape}"


def token_world_check(catalogs: tuple[Any, ...], world: World) -> None:
    """Refuse ``world`` when one dataset's blocks are fewer per rank than it
    has workers (see :meth:`BlockCatalog.check_world`). A mixture's stream
    may have fewer: its share of a slot is then none, as for samples."""
    if len(catalogs) == 1 and isinstance(catalogs[0], BlockCatalog):
        catalogs[0].check_world(world)


__all__ = [
    "CHUNK_BLOCKS", "BlockCatalog", "BlockLayout", "BlockReader", "BlockSchedule", "TokenBlocks",
]  # fmt: skip
