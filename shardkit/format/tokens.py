"""Token fields: which fields hold token ids, and how many each sample holds.

Language-model pretraining reads each sample's 1-D integer array (a field
``tokens.npy``, or ``npy``) and packs the tokens into fixed-length blocks;
a reader splits an epoch's token stream among its readers by arithmetic
over token counts, without reading the data (see :mod:`shardkit.read.tokens`).
The writer and ``shardkit index`` record those counts as they pass each
sample: per shard in the shard table's ``tokens`` column, per sample in a
third array of the shard's offset index (:mod:`shardkit.format.index`).

**A token field** is a field whose kind is ``npy`` (its name is ``npy`` or
ends in ``.npy``) and whose value, in every sample of the shard that has
it, is ``.npy`` bytes whose header says a 1-D array of an integer dtype
(int8 to int64, uint8 to uint64), as long as the bytes say. Only the header
is read (:func:`~shardkit.format.npy.parse_npy_header`: nothing is
evaluated, nothing unpickled). A sample without the field counts 0 tokens.

**Disagreement.** A field that is a 1-D integer array in some samples of a
shard and not in another (a 2-D array, floats, bytes that are not ``.npy``)
is not a token field of that shard. The dataset records token counts only
when every shard holding samples found the same token fields
(:func:`dataset_tokens`): a column of the table and of each index
must mean the same field in every shard. Otherwise it records none, and
says which shard differs; its indexes keep the counts they hold, which no
reader asks for. At most :data:`~shardkit.format.index.MAX_TOKEN_FIELDS`
fields are counted, the first by name.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

from shardkit.format.index import MAX_TOKEN_FIELDS
from shardkit.format.npy import MAX_HEADER_BYTES, NPY_MAGIC, parse_npy_header
from shardkit.format.plain import SampleRun, tar_blocks
from shardkit.format.ustar import BLOCK_SIZE

logger = logging.getLogger(__name__)

_NPY_KINDS = ("npy", "NPY")


def is_npy_field(name: str) -> bool:
    """Whether a field's kind (its last dotted part) is ``npy``: ``tokens.npy``, ``npy``."""
    return name.rpartition(".")[2].lower() == "npy"


def token_count(data: bytes | memoryview) -> int | None:
    """The length of the 1-D integer array ``data`` holds as ``.npy`` bytes,
    or None when it holds something else (another shape or dtype, bytes
    that are not ``.npy``, fewer or more bytes than its header says)."""
    array = token_array(data)
    return None if array is None else len(array)


#: Token-array headers already read: header bytes -> (dtype, count), or None
#: for a header of anything else. Documents of one length share a header,
#: so a corpus has a few thousand; the table is emptied when it fills.
_HEADERS: dict[bytes, tuple[np.dtype, int] | None] = {}
_HEADERS_KEPT = 8192


def token_array(data: bytes | memoryview) -> np.ndarray | None:
    """The 1-D integer array ``.npy`` bytes hold (a view of them), or None
    when they hold anything else or are not as long as their header says
    (what the writer counts and the reader packs). The header is read by
    :func:`~shardkit.format.npy.parse_npy_header` (``np.load`` evaluates it,
    and is slow for a document's few bytes), once per distinct header."""
    if bytes(data[:6]) != NPY_MAGIC:
        return None
    version = bytes(data[6:7])
    if version == b"\x01":
        end = 10 + int.from_bytes(data[8:10], "little")
    elif version in (b"\x02", b"\x03"):
        end = 12 + int.from_bytes(data[8:12], "little")
    else:
        return None
    head = bytes(data[:end])
    found = _HEADERS.get(head, False)
    if found is False:
        found = _token_header(head)
        if len(_HEADERS) >= _HEADERS_KEPT:
            _HEADERS.clear()
        _HEADERS[head] = found
    if found is None:
        return None
    dtype, count = found
    if end + count * dtype.itemsize != len(data):
        return None
    return np.frombuffer(data, dtype=dtype, count=count, offset=end)


_MAGIC = np.frombuffer(NPY_MAGIC + b"\x01\x00", dtype=np.uint8)  # version 1.0
_DIGIT0, _DIGIT9 = ord("0"), ord("9")
_TAIL = np.frombuffer(b",), }", dtype=np.uint8)
_MAX_DIGITS = 18  # a count int64 holds, whatever the digits


def run_token_arrays(run: SampleRun) -> tuple[np.ndarray, np.ndarray] | None:
    """The token ids of every sample of ``run``, one after another, and
    each sample's count; None unless every sample's field is a 1-D array of
    the first one's integer dtype whose header begins as NumPy writes it
    (``{'descr': '<u2', 'fortran_order': False, 'shape': (740,), }``: what
    follows the dict, padding, is read by neither) and whose data is as
    long as it says.

    What it accepts, :func:`token_array` reads as the same array (a test
    holds the two together); anything else (another form of header, another
    dtype, damage) is left to it, sample by sample, which names what is
    wrong."""
    sizes = run.sizes
    if not len(sizes) or (sizes < 10).any():
        return None
    starts = run.spans[:-1] + BLOCK_SIZE  # each field's first byte, a block boundary
    head = tar_blocks(run.buf)[starts // BLOCK_SIZE]  # each field's first block
    end = 10 + head[:, 8].astype(np.int64) + 256 * head[:, 9].astype(np.int64)  # where the header ends
    first = int(end[0])
    if first > BLOCK_SIZE:
        return None
    found = _token_header(bytes(head[0, :first]))
    if found is None:
        return None
    dtype = found[0]
    prefix = np.frombuffer(f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': (".encode(), dtype=np.uint8)
    at = 10 + len(prefix)  # the first digit
    if at + _MAX_DIGITS + len(_TAIL) + 1 > BLOCK_SIZE:
        return None
    ok = (head[:, :8] == _MAGIC).all(axis=1) & (end <= BLOCK_SIZE) & (end <= sizes) & (end % dtype.itemsize == 0)
    ok &= (head[:, 10:at] == prefix).all(axis=1)
    window = head[:, at : at + _MAX_DIGITS + 1]
    digit = (window >= _DIGIT0) & (window <= _DIGIT9)
    digits = np.argmin(digit, axis=1)  # the first that is none
    ok &= (digits >= 1) & ~digit.all(axis=1)
    count = np.zeros(len(sizes), dtype=np.int64)
    for i in range(_MAX_DIGITS):
        count = np.where(i < digits, count * 10 + (window[:, i].astype(np.int64) - _DIGIT0), count)
    tail = at + digits
    ok &= (np.take_along_axis(head, tail[:, None] + np.arange(len(_TAIL)), axis=1) == _TAIL).all(axis=1)
    ok &= sizes == end + count * dtype.itemsize
    if not ok.all():
        return None
    view = np.frombuffer(run.buf, dtype=dtype, count=len(run.buf) // dtype.itemsize)
    first_ids = ((starts + end) // dtype.itemsize).tolist()
    ids = np.concatenate([view[a : a + n] for a, n in zip(first_ids, count.tolist())])
    return ids, count


def _token_header(head: bytes) -> tuple[np.dtype, int] | None:
    """``(dtype, count)`` of a header that says a 1-D integer array, else None."""
    try:
        header = parse_npy_header(head[:MAX_HEADER_BYTES])
    except ValueError:
        return None
    dtype = header.dtype()
    if dtype is None or dtype.kind not in "iu" or len(header.shape) != 1 or header.offset != len(head):
        return None
    return dtype, header.count


class TokenTally:
    """The token counts of one shard's samples, taken as they are written
    or read (see the module docstring for what counts).

    Call :meth:`add` for each sample in order (:meth:`skip` for samples
    known to hold no ``npy`` field); then :attr:`fields` and :meth:`counts`.
    Holds two machine words per sample and token field.
    """

    def __init__(self) -> None:
        self.num_samples = 0
        self._rows: dict[str, tuple[array, array]] = {}  # field -> (samples, counts)
        self._refused: set[str] = set()

    def add(self, fields: Iterable[tuple[str, bytes | memoryview]]) -> None:
        """Count one sample's fields, ``(extension, bytes)`` pairs (extensions
        as stored; read lower-cased, as readers name fields)."""
        for ext, data in fields:
            if not ext.endswith(_NPY_KINDS) or not is_npy_field(ext):
                continue
            name = ext.lower()
            if name in self._refused:
                continue
            count = token_count(data)
            if count is None:
                self._refused.add(name)
                self._rows.pop(name, None)
                continue
            samples, counts = self._rows.setdefault(name, (array("Q"), array("Q")))
            samples.append(self.num_samples)
            counts.append(count)
        self.num_samples += 1

    def skip(self, num_samples: int = 1) -> None:
        """Count ``num_samples`` samples that hold no ``npy`` field."""
        self.num_samples += num_samples

    @property
    def fields(self) -> tuple[str, ...]:
        """The shard's token fields, sorted (at most :data:`MAX_TOKEN_FIELDS`)."""
        return tuple(sorted(self._rows)[:MAX_TOKEN_FIELDS])

    def counts(self) -> np.ndarray:
        """An int64 ``(num_samples, len(fields))`` array: each sample's
        token count per field, 0 where it lacks the field."""
        fields = self.fields
        out = np.zeros((self.num_samples, len(fields)), dtype=np.int64)
        for j, name in enumerate(fields):
            samples, counts = self._rows[name]
            out[np.frombuffer(samples, dtype=np.uint64).astype(np.intp), j] = np.frombuffer(counts, dtype=np.uint64)
        return out


def dataset_tokens(
    shard_fields: Sequence[Sequence[str]],
    shard_totals: Sequence[Sequence[int]],
    num_samples: Sequence[int],
    names: Sequence[str] | None = None,
) -> tuple[tuple[str, ...], np.ndarray | None]:
    """The token fields a dataset records and its table's ``tokens`` column.

    The fields are those every shard holding samples found; none when
    shards disagree (logged, naming the first shard that differs; see the
    module docstring). The column is ``(num_shards, len(fields))`` int64,
    each shard's totals (0 for a shard without samples), or None without fields.

    Args:
        shard_fields: Each shard's token fields (:attr:`TokenTally.fields`), in table order.
        shard_totals: Each shard's totals of its fields, in the same order.
        num_samples: Each shard's sample count.
        names: Each shard's name, for the log line (default: its number).
    """
    chosen: tuple[str, ...] | None = None
    first = -1
    for i, (fields, count) in enumerate(zip(shard_fields, num_samples)):
        if not count:
            continue
        if chosen is None:
            chosen, first = tuple(fields), i
        elif tuple(fields) != chosen:
            logger.warning(
                "%s has token fields %s, %s has %s: the dataset records no token counts (a field counts where it "
                "is a 1-D integer .npy array in every sample that has it, in every shard). Make the field the "
                "same in every sample, then rewrite the dataset or run `shardkit index` on it",
                _shard_name(names, i), list(fields), _shard_name(names, first), list(chosen),
            )
            return (), None
    if not chosen:
        return (), None
    column = np.zeros((len(shard_fields), len(chosen)), dtype=np.int64)
    for i, (fields, totals, count) in enumerate(zip(shard_fields, shard_totals, num_samples)):
        if count:
            column[i] = totals
    return chosen, column


def _shard_name(names: Sequence[str] | None, i: int) -> str:
    return f"shard {i}" if names is None else names[i]
