"""Fuzzing the token-block reader (``ShardDataset(..., tokens=TokenBlocks(...))``).

Two small token datasets, written by the map writer: one whose documents
change dtype from one to the next (read document by document), one of a
single dtype (read as runs of a shard's documents, see
:func:`shardkit.format.tokens.run_token_arrays`). Then one seeded mutation at
a time, of one of the three places a token dataset keeps what it holds:

- a shard: the generic tar damage of :mod:`tests.hostile.test_fuzz`, and
  edits of a document's ``.npy`` header that leave the tar valid (its shape,
  dtype, order, header length, version; a dtype and shape that read the same
  bytes as another valid token array);
- an offset index's per-document token counts: values off by one, lying,
  negative, huge, moved from one document to another (same sum), chosen so
  that their int64 sum wraps to the true total, an array of another shape or
  dtype, a flipped bit, the array gone, the file cut short or grown;
- the shard table's per-shard totals (the manifest pinned to the new table, as
  a crafted dataset would be): off by one, zero, negative, huge, moved from
  one shard to another, wrapping; and a lie the index and the table agree on.

Each mutated dataset is read by one reader over the whole epoch in stored
order (both error policies, with and without checksums), and by three ranks
with shuffled shards and ``eos`` (both policies). What must hold:

- no exception outside shardkit's error tree, no hang, nothing past the
  memory cap (the fuzz runs in a child process under one);
- every block holds ``block_size`` int64 tokens;
- every error names a file of the dataset;
- where the tokens cannot have changed unseen (the shards untouched, or
  checksums on): one reader yields the written blocks up to its error, and
  all of them when it raises none (a count that lies is an error: every
  document is read, and checked against its count); under ``skip``, all of
  them unless it counted a skip, and never a token twice or one not written;
  the three ranks together yield the written blocks unless one raised or
  skipped (one rank alone may not see a lie in documents another reads).

``pytest tests/hostile/test_fuzz_tokens.py --fuzz-mutations 2000 -s`` runs
more cases (the default runs a quarter of ``--fuzz-mutations``) and prints how
often each outcome came.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import json
import os
import random
import re
import shutil
import tarfile

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import shardkit
from shardkit import ShardDataset, TokenBlocks
from shardkit.errors import ShardkitError
from shardkit.read.split import epoch_order
from shardkit.read.tokens import TokenStream
from tests.hostile.conftest import print_outcomes, run_fuzz
from tests.hostile.test_fuzz import Hang, deadline, mutate
from tests.read.token_data import document

BLOCK = 16
#: An id no document holds (document ``i``'s ids are ``i * 10_000 + k``, ``k`` < 6,000).
EOS = 9_999
RANKS = 3
NUM_DOCUMENTS = 60
PER_SHARD = 12
READ_TIMEOUT_S = 20
#: Address space the fuzzing child may take beyond what it holds after its imports.
MEM_MB = 768
#: The whole fuzz's time limit, in the child.
CHILD_TIMEOUT_S = 240


# ---------------------------------------------------------------- datasets


def _write(dest: str, dtypes: tuple) -> None:
    make = functools.partial(document, long_every=25, dtypes=dtypes)
    options = shardkit.WriteOptions(max_samples=PER_SHARD, workers=1)
    shardkit.write_dataset(range(NUM_DOCUMENTS), dest, map=make, options=options)


def _shard_documents(root: str) -> list[list[np.ndarray]]:
    """Each shard's documents' token ids, in stored order (read with the
    standard library and NumPy, not shardkit)."""
    out = []
    for name in sorted(n for n in os.listdir(root) if n.endswith(".tar")):
        with tarfile.open(os.path.join(root, name)) as tar:
            out.append([np.load(io.BytesIO(tar.extractfile(m).read())).astype(np.int64) for m in tar.getmembers()])
    return out


def _pack(documents: list[np.ndarray]) -> list[np.ndarray]:
    """The blocks of one unshuffled reader (no ``eos``) over ``documents``."""
    stream = np.concatenate(documents)
    whole = len(stream) // BLOCK * BLOCK
    return list(stream[:whole].reshape(-1, BLOCK))


# ---------------------------------------------------------------- mutations


def _files(root: str) -> dict:
    names = sorted(os.listdir(root))
    return {
        "tar": [n for n in names if n.endswith(".tar")],
        "idx": [n for n in names if n.endswith(".idx")],
        "table": next(n for n in names if n.endswith(".table")),
    }


def _split_index(data: bytes) -> tuple[bytes, np.ndarray]:
    """An index file as its boundaries and checksums (bytes as stored) and its token counts."""
    f = io.BytesIO(data)
    np.load(f)
    np.load(f)
    at = f.tell()
    return data[:at], np.load(f)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _table_tokens(data: bytes) -> tuple[int, int]:
    """Where the table's ``tokens`` column (its last array) keeps its values, and how many."""
    at = data.rindex(b"\x93NUMPY")
    f = io.BytesIO(data[at:])
    np.lib.format.read_magic(f)
    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    assert dtype == np.dtype("<i8") and shape[1] == 1, (shape, dtype)
    return at + f.tell(), shape[0]


def _pin_table(root: str, old: str, table: bytes) -> None:
    """Replace table ``old`` by ``table`` (named by its hash) and point the
    manifest at it, as a crafted dataset would."""
    digest = hashlib.sha256(table).hexdigest()
    name = f"shards-{digest[:16]}.table"
    os.remove(os.path.join(root, old))
    with open(os.path.join(root, name), "wb") as f:
        f.write(table)
    path = os.path.join(root, "manifest.json")
    manifest = json.load(open(path))
    manifest["table"] = {"path": name, "num_bytes": len(table), "sha256": digest}
    with open(path, "w") as f:
        json.dump(manifest, f)


def _lie(value: int, rng: random.Random) -> int:
    return rng.choice([value + 1, value - 1, 0, value * 2 + 1, 2**31, 2**32 - 1, 10**12])


def _npy_header_edit(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Edit one document's ``.npy`` header inside its tar member, the tar left valid."""
    starts = [i for i in range(0, len(data), 512) if data[i : i + 6] == b"\x93NUMPY"]
    at = rng.choice(starts)
    buf = bytearray(data)
    hlen = int.from_bytes(data[at + 8 : at + 10], "little")
    text = data[at + 10 : at + 10 + hlen].decode("latin1")
    descr = text.split("'descr': '")[1].split("'")[0]
    count = int(text.split("'shape': (")[1].split(",")[0])
    kind = rng.choice(["npy_shape", "npy_descr", "npy_reinterpret", "npy_order", "npy_length", "npy_version",
                       "npy_magic", "npy_bitflip"])  # fmt: skip
    if kind in ("npy_shape", "npy_descr", "npy_reinterpret", "npy_order"):
        shape, order = f"({count},)", "False"
        if kind == "npy_shape":
            shape = rng.choice(["(0,)", f"({count + 1},)", f"({count - 1},)", "(99999999999999999999,)", "(-1,)",
                                f"({count}, 1)", f"(1, {count})", "()", "(,)"])  # fmt: skip
        elif kind == "npy_descr":
            descr = rng.choice(["<f4", "<f8", "<i2", "|u1", "|i1", ">i4", ">u8", "<U1", "|O", "|b1", "<m8", "V4",
                                "<i4", "<u4", "<i8", "<c16", "x"])  # fmt: skip
        elif kind == "npy_reinterpret":  # the same bytes as another 1-D integer array: a valid token array
            nbytes = count * np.dtype(descr).itemsize
            size = rng.choice([size for size in (1, 2, 4, 8) if nbytes % size == 0])
            descr = rng.choice(["<i", "<u"]) + str(size) if size > 1 else rng.choice(["|i1", "|u1"])
            shape = f"({nbytes // size},)"
        else:
            order = "True"
        new = f"{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}"
        if len(new) + 1 > hlen:
            return kind, data
        buf[at + 10 : at + 10 + hlen] = (new.ljust(hlen - 1) + "\n").encode("latin1")
    elif kind == "npy_length":
        buf[at + 8 : at + 10] = rng.choice([0, 1, hlen - 1, hlen + 1, hlen + 64, 0xFFFF]).to_bytes(2, "little")
    elif kind == "npy_version":
        buf[at + 6] = rng.choice([0, 2, 3, 4, 255])
    elif kind == "npy_magic":
        buf[at + rng.randrange(6)] ^= 1 << rng.randrange(8)
    else:
        for _ in range(rng.randint(1, 4)):
            i = at + 10 + rng.randrange(hlen)
            buf[i] ^= 1 << rng.randrange(8)
    return kind, bytes(buf)


def _mutate_index(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """An index file with its token counts damaged or lying: ``(kind, bytes)``."""
    head, counts = _split_index(data)
    n = len(counts)
    wide = counts.astype(np.int64)
    a, b, c = (rng.randrange(n) for _ in range(3))
    kind = rng.choice(["idx_off_by_one", "idx_lie", "idx_negative", "idx_huge", "idx_move", "idx_wrap", "idx_shape",
                       "idx_dtype", "idx_bitflip", "idx_drop", "idx_truncate", "idx_append"])  # fmt: skip
    if kind == "idx_off_by_one":
        wide[a, 0] += rng.choice([-1, 1])
        return kind, head + _npy(wide.astype(counts.dtype) if wide[a, 0] >= 0 else wide)
    if kind == "idx_lie":
        wide[a, 0] = _lie(int(wide[a, 0]), rng)
        return kind, head + _npy(wide)
    if kind == "idx_negative":
        wide[a, 0] = rng.choice([-1, -(2**63), -int(wide[a, 0]) - 1])
        return kind, head + _npy(wide)
    if kind == "idx_huge":
        wide[a, 0] = rng.choice([2**62, 2**63 - 1, 2**40])
        return kind, head + _npy(wide)
    if kind == "idx_move":  # the sum kept: only the documents' lengths disagree
        delta = rng.choice([1, 5, int(wide[a, 0]) or 1, int(wide[a, 0]) + 3])
        wide[a, 0] -= delta
        wide[b, 0] += delta
        return kind, head + _npy(wide if (wide < 0).any() else wide.astype(counts.dtype))
    if kind == "idx_wrap":  # two counts of 2**63 - 1 and a third that brings the int64 sum back to the total
        if len({a, b, c}) < 3:
            a, b, c = 0, 1, 2
        wide[c, 0] += wide[a, 0] + wide[b, 0] + 2
        wide[a, 0] = wide[b, 0] = 2**63 - 1
        return kind, head + _npy(wide)
    if kind == "idx_shape":
        shape = rng.choice([(n + 1, 1), (n - 1, 1), (n, 2), (n,), (1, n), (n, 0)])
        size = int(np.prod(shape))
        values = np.resize(wide, size).reshape(shape)
        if rng.random() < 0.5 and values.ndim == 2:
            values = np.asfortranarray(values)
        return kind, head + _npy(values.astype(counts.dtype))
    if kind == "idx_dtype":
        dtype = rng.choice(["<f8", "<i4", ">u4", "<u2", "|u1", "<i8", "<u8", ">i8", "<f4", "<U3"])
        return kind, head + _npy(wide.astype(dtype))
    if kind == "idx_bitflip":
        tail = bytearray(_npy(counts))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(tail))
            tail[i] ^= 1 << rng.randrange(8)
        return kind, head + bytes(tail)
    if kind == "idx_drop":
        return kind, head
    if kind == "idx_truncate":
        return kind, data[: rng.randrange(len(data))]
    return kind, data + rng.choice([bytes(8), rng.randbytes(rng.randint(1, 600)), _npy(counts)])


def _mutate_table(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """A table with lying token totals: ``(kind, bytes)``."""
    at, n = _table_tokens(data)
    totals = np.frombuffer(data, dtype="<i8", count=n, offset=at).copy()
    assert n >= 4
    a, b = rng.sample(range(n), 2)
    kind = rng.choice(["table_off_by_one", "table_lie", "table_zero", "table_negative", "table_huge", "table_move",
                       "table_wrap"])  # fmt: skip
    if kind == "table_off_by_one":
        totals[a] += rng.choice([-1, 1])
    elif kind == "table_lie":
        totals[a] = _lie(int(totals[a]), rng)
    elif kind == "table_zero":
        totals[a] = 0
    elif kind == "table_negative":
        totals[a] = rng.choice([-1, -(2**63)])
    elif kind == "table_huge":
        totals[a] = rng.choice([2**62, 2**63 - 1, 2**40, 2**33])
    elif kind == "table_move":
        delta = rng.choice([1, 7, int(totals[a])])
        totals[a] -= delta
        totals[b] += delta
    else:  # four shards of 2**62 more: their int64 sum wraps back to the true total
        for shard in rng.sample(range(n), 4):
            totals[shard] += 2**62
    buf = bytearray(data)
    buf[at : at + 8 * n] = totals.astype("<i8").tobytes()
    return kind, bytes(buf)


def _agreeing_lie(root: str, files: dict, rng: random.Random) -> str:
    """Shard ``s``'s index and the table both count ``delta`` tokens more in one document than it holds."""
    s = rng.randrange(len(files["idx"]))
    idx = os.path.join(root, files["idx"][s])
    head, counts = _split_index(open(idx, "rb").read())
    d = rng.randrange(len(counts))
    delta = rng.choice([1, -1, 3, 50, -int(counts[d, 0])])  # the last: counted empty
    if int(counts[d, 0]) + delta < 0:
        delta = 1
    wide = counts.astype(np.int64)
    wide[d, 0] += delta
    with open(idx, "wb") as f:
        f.write(head + _npy(wide.astype(counts.dtype)))
    table_path = os.path.join(root, files["table"])
    table = bytearray(open(table_path, "rb").read())
    at, n = _table_tokens(bytes(table))
    totals = np.frombuffer(bytes(table), dtype="<i8", count=n, offset=at).copy()
    totals[s] += delta
    table[at : at + 8 * n] = totals.tobytes()
    _pin_table(root, files["table"], bytes(table))
    return "index_and_table_agree"


def _mutate_case(root: str, files: dict, rng: random.Random) -> tuple[str, str, bool]:
    """Mutate one file of ``root``: ``(kind, file, whether a shard changed)``."""
    target = rng.choices(["tar", "npy", "idx", "table", "agree"], weights=[3, 5, 6, 4, 2])[0]
    if target == "agree":
        return _agreeing_lie(root, files, rng), files["table"], False
    name = files["table"] if target == "table" else rng.choice(files["idx" if target == "idx" else "tar"])
    path = os.path.join(root, name)
    data = open(path, "rb").read()
    if target == "tar":
        kind, data = mutate(data, rng)
        kind = f"tar_{kind}"
    elif target == "npy":
        kind, data = _npy_header_edit(data, rng)
    elif target == "idx":
        kind, data = _mutate_index(data, rng)
    else:
        kind, data = _mutate_table(data, rng)
    if target == "table":
        _pin_table(root, name, data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return kind, name, target in ("tar", "npy")


# ---------------------------------------------------------------- reading


class Reading:
    """One way to read a dataset's blocks: ``ranks`` readers (with more
    than one: shards shuffled and ``eos`` after each document)."""

    def __init__(self, ranks: int, on_error: str, checksums: bool = False):
        self.ranks, self.on_error, self.checksums = ranks, on_error, checksums
        readers = "one reader" if ranks == 1 else f"{ranks} ranks"
        self.label = f"{readers}/{on_error}" + ("/checksums" if checksums else "")

    def read(self, root: str) -> tuple[list[list[np.ndarray]], list[ShardkitError], int, list[str]]:
        """``(blocks of each rank, shardkit errors, samples skipped, malformed blocks)``."""
        several = self.ranks > 1
        per_rank, errors, skipped, malformed = [], [], 0, []
        for rank in range(self.ranks):
            blocks: list[np.ndarray] = []
            try:
                ds = ShardDataset(
                    root, tokens=TokenBlocks("tokens.npy", BLOCK, eos=EOS if several else None), mode="exact",
                    shuffle=several, seed=3, rank=rank, world_size=self.ranks, on_error=self.on_error,
                    verify_checksums=self.checksums,
                )
                for block in ds:
                    array = block.numpy()
                    if array.dtype != np.int64 or array.shape != (BLOCK,):
                        malformed.append(f"a block of {array.dtype} and shape {array.shape}")
                    blocks.append(array)
                skipped += ds.num_skipped
            except ShardkitError as exc:
                errors.append(exc)
            per_rank.append(blocks)
        return per_rank, errors, skipped, malformed


READINGS = (
    Reading(1, "raise"),
    Reading(1, "skip"),
    Reading(1, "raise", checksums=True),
    Reading(1, "skip", checksums=True),
    Reading(RANKS, "raise"),
    Reading(RANKS, "skip"),
)


def _rows(blocks: list[np.ndarray]) -> list[tuple]:
    return sorted(tuple(b.tolist()) for b in blocks)


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


class Pristine:
    """What a dataset holds, and what each reading yields of it unmutated."""

    def __init__(self, root: str):
        self.root = root
        self.files = _files(root)
        self.bytes = {name: open(os.path.join(root, name), "rb").read() for name in os.listdir(root)}
        self.documents = _shard_documents(root)
        self.written = np.concatenate([ids for shard in self.documents for ids in shard] + [np.array([EOS])])
        self.one = _pack([ids for shard in self.documents for ids in shard])
        got, errors, skipped, _ = READINGS[0].read(root)
        assert not errors and not skipped and _same(got[0], self.one), "the unmutated dataset reads other blocks"
        got, errors, skipped, _ = READINGS[-1].read(root)
        assert not errors and not skipped
        self.ranks = _rows([b for blocks in got for b in blocks])

    def restore(self) -> None:
        for name in set(os.listdir(self.root)) - set(self.bytes):
            os.remove(os.path.join(self.root, name))
        for name, data in self.bytes.items():
            with open(os.path.join(self.root, name), "wb") as f:
                f.write(data)


def _faults(reading: Reading, read: tuple, pristine: Pristine, *, exact: bool) -> tuple[list[str], str]:
    """What ``reading`` did wrong (``read`` is what :meth:`Reading.read`
    returned), and its outcome in a few words."""
    per_rank, errors, skipped, malformed = read
    faults = list(malformed)
    names = [n for n in os.listdir(pristine.root) if n != "README.md"]
    for exc in errors:
        if not any(name in str(exc) for name in names):
            faults.append(f"{type(exc).__name__} names no file of the dataset: {exc}")
    every = [b for blocks in per_rank for b in blocks]
    outcome = f"{type(errors[0]).__name__}" if errors else "read to the end"
    outcome += f", {'some' if skipped else 'no'} skips"
    if not exact:
        return faults, outcome
    tokens = np.concatenate(every) if every else np.zeros(0, dtype=np.int64)
    if not np.isin(tokens, pristine.written).all():
        faults.append("a token that was never written")
    if reading.ranks == 1:
        got, want = per_rank[0], pristine.one
        if not skipped:
            if not _same(got, want[: len(got)]):
                faults.append(f"blocks other than the written ones ({len(got)} blocks, {len(want)} written)")
            elif not errors and len(got) != len(want):
                faults.append(f"{len(got)} blocks of {len(want)} and no error")
    if skipped or errors:
        for rank, blocks in enumerate(per_rank):
            ids = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
            ids = ids[ids != EOS] if reading.ranks > 1 else ids
            if len(np.unique(ids)) != len(ids):
                faults.append(f"rank {rank}: a token twice")
    elif reading.ranks > 1 and _rows(every) != pristine.ranks:
        faults.append(f"the ranks' blocks are not the written ones ({len(every)} of {len(pristine.ranks)} blocks)")
    return faults, outcome


def fuzz_tokens(roots: list[str], count: int, seed: int) -> dict:
    """Run ``count`` seeded cases over the datasets at ``roots``: ``{"outcomes", "failures"}``."""
    pristine = [Pristine(root) for root in roots]
    rng = random.Random(seed)
    outcomes: collections.Counter = collections.Counter()
    failures: list[str] = []
    for case in range(count):
        dataset = rng.choice(pristine)
        kind, name, shard_changed = _mutate_case(dataset.root, dataset.files, rng)
        outcomes[f"mutation {kind}"] += 1
        try:
            for reading in READINGS:
                label = f"case {case} ({kind} of {os.path.basename(dataset.root)}/{name}) {reading.label}"
                try:
                    with deadline(READ_TIMEOUT_S):
                        read = reading.read(dataset.root)
                except Hang:
                    failures.append(f"{label}: hang")
                    continue
                except Exception as exc:  # noqa: BLE001 - the failure names it
                    failures.append(f"{label}: foreign {type(exc).__name__}: {exc}")
                    continue
                exact = not shard_changed or reading.checksums
                faults, outcome = _faults(reading, read, dataset, exact=exact)
                failures.extend(f"{label}: {fault}" for fault in faults)
                outcomes[f"{reading.label}: {outcome}"] += 1
        finally:
            dataset.restore()
    return {"outcomes": dict(outcomes), "failures": failures}


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def token_datasets(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("fuzz-tokens")
    roots = [str(root / "dtypes-in-turn"), str(root / "one-dtype")]
    _write(roots[0], (np.int32, np.int64, np.uint32))
    _write(roots[1], (np.uint32,))
    return roots


def test_mutated_token_datasets_yield_written_blocks_or_shardkit_errors(token_datasets, pytestconfig, capsys, tmp_path):
    count = max(1, pytestconfig.getoption("--fuzz-mutations") // 4)
    report = run_fuzz(fuzz_tokens, (token_datasets, count, 20261207), output=str(tmp_path / "report.json"),
                      mem_mb=MEM_MB, timeout_s=CHILD_TIMEOUT_S)  # fmt: skip
    print_outcomes(capsys, f"token fuzz: {count} mutations, {count * len(READINGS)} readings", report)
    assert not report["failures"], "\n".join(report["failures"][:20])


# ---------------------------------------------------------------- what the fuzz found


@pytest.fixture
def copied(token_datasets, tmp_path) -> str:
    """A copy of the documents in turn dataset, to damage."""
    dest = str(tmp_path / "ds")
    shutil.copytree(token_datasets[0], dest)
    return dest


def _read_all(root: str, **options) -> list:
    return list(ShardDataset(root, tokens=TokenBlocks("tokens.npy", BLOCK, eos=options.pop("eos", None)), mode="exact",
                             shuffle=False, **options))  # fmt: skip


@pytest.mark.parametrize("total", [2**62, 2**63 - 1, 2**40])
def test_a_table_total_above_its_shards_size_is_refused_naming_the_table(copied, total):
    # Once a MemoryError (blocks for 2**62 tokens) or, where the totals' sum wrapped, a numpy ValueError.
    files = _files(copied)
    table = open(os.path.join(copied, files["table"]), "rb").read()
    at, _ = _table_tokens(table)
    _pin_table(copied, files["table"], table[: at + 8] + total.to_bytes(8, "little", signed=True) + table[at + 16 :])
    with pytest.raises(shardkit.ManifestError, match=rf"shards-[0-9a-f]{{16}}\.table: damaged shard table: shard 1 "
                       rf"\(.*shard-000001\.tar\) counts {total:,} tokens in field 'tokens\.npy', more than its "
                       r"[\d,]+ bytes can hold"):  # fmt: skip
        ShardDataset(copied, tokens=TokenBlocks("tokens.npy", BLOCK))


def test_index_counts_whose_int64_sum_wraps_to_the_total_are_refused(copied):
    # Every index so; the first of two ranks ends inside a shard, whose
    # documents' counts place its end.
    for name in _files(copied)["idx"]:
        path = os.path.join(copied, name)
        head, counts = _split_index(open(path, "rb").read())
        wide = counts.astype(np.int64)
        wide[2, 0] += wide[0, 0] + wide[1, 0] + 2
        wide[0, 0] = wide[1, 0] = 2**63 - 1
        assert wide.sum() == counts.sum()  # wrapped
        with open(path, "wb") as f:
            f.write(head + _npy(wide))
    with pytest.raises(shardkit.CorruptShardError, match=r"shard-\d+\.idx: offset index is corrupt: its token counts "
                       r"add up past 2\*\*63 \(entry 1\)"):  # fmt: skip
        _read_all(copied, rank=0, world_size=2)


@pytest.mark.parametrize("eos", [None, 7])
@pytest.mark.parametrize("dtype", ["<u8", ">u8"])
def test_a_uint64_token_id_past_int64_is_an_error_naming_the_sample(tmp_path, eos, dtype):
    # Once a UsageError naming no shard with the wrong advice, and with eos a
    # negative id yielded silently (the id cast to int64 wrapped).
    dest = str(tmp_path / "ds")
    ids = np.arange(40, dtype=dtype)
    ids[20] = 2**63 + 5
    docs = [{"__key__": "a", "tokens.npy": _npy(np.arange(40, dtype=dtype))}, {"__key__": "b", "tokens.npy": _npy(ids)}]
    shardkit.write_dataset(docs, dest)
    with pytest.raises(shardkit.CorruptShardError, match=r"shard-000000\.tar: sample 'b': field 'tokens\.npy' holds "
                       r"token id 9,223,372,036,854,775,813, more than int64 holds") as caught:  # fmt: skip
        _read_all(dest, eos=eos)
    assert caught.value.member == "b.tokens.npy"
    assert len(_read_all(dest, eos=eos, on_error="skip")) == (40 + (eos is not None)) // BLOCK


def _count_empty(root: str, shard: int, document: int) -> int:
    """Make the index and the table of ``root`` agree that a document of
    ``shard`` holds no tokens; return what it holds."""
    files = _files(root)
    path = os.path.join(root, files["idx"][shard])
    head, counts = _split_index(open(path, "rb").read())
    wide = counts.astype(np.int64)
    held = int(wide[document, 0])
    wide[document, 0] = 0
    with open(path, "wb") as f:
        f.write(head + _npy(wide.astype(counts.dtype)))
    table = open(os.path.join(root, files["table"]), "rb").read()
    at, n = _table_tokens(table)
    totals = np.frombuffer(table, dtype="<i8", count=n, offset=at).copy()
    totals[shard] -= held
    _pin_table(root, files["table"], table[:at] + totals.tobytes() + table[at + 8 * n :])
    return held


@pytest.mark.parametrize("document", [0, PER_SHARD - 1])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_document_counted_empty_fails_a_reader_of_an_exact_epoch(copied, document, world_size):
    # Once its tokens were left out silently: the read ended inside the last
    # shard, whose first document a piece began after, and whose last one
    # fell after the epoch's last block; no reader read either.
    held = _count_empty(copied, len(_files(copied)["idx"]) - 1, document)
    errors = []
    for rank in range(world_size):
        try:
            _read_all(copied, rank=rank, world_size=world_size)
        except shardkit.CorruptShardError as exc:
            errors.append(str(exc))
    assert errors
    pattern = rf"shard-000004\.tar: (sample 'doc\d+' holds {held} tokens|its documents hold [\d,]+ tokens) in field"
    assert all(re.search(pattern, message) for message in errors), errors


def test_a_shard_counted_empty_is_read_and_its_count_checked(copied):
    # Once left out silently: a shard without tokens was never read.
    files = _files(copied)
    table = open(os.path.join(copied, files["table"]), "rb").read()
    at, n = _table_tokens(table)
    _pin_table(copied, files["table"], table[: at + 16] + bytes(8) + table[at + 24 :])
    with pytest.raises(shardkit.CorruptShardError, match=r"shard-000002\.tar: its documents hold [\d,]+ tokens in "
                       r"field 'tokens\.npy', but the dataset's token counts say 0"):  # fmt: skip
        _read_all(copied)


@settings(max_examples=200)
@given(corpus=st.lists(st.lists(st.integers(0, 9), max_size=5), min_size=1, max_size=6),
       cuts=st.lists(st.integers(1, 10**6), max_size=5), seed=st.integers(0, 3))  # fmt: skip
def test_ranges_that_cover_the_stream_read_every_document_and_each_empty_one_once(corpus, cuts, seed):
    totals, documents = [sum(counts) for counts in corpus], [len(counts) for counts in corpus]
    assume(sum(totals) > 0)
    stream = TokenStream(totals, documents, epoch_order(len(corpus), seed=seed, epoch=0, shuffle=True))
    bounds = sorted({0, stream.num_tokens, *(cut % stream.num_tokens for cut in cuts)})
    read: collections.Counter = collections.Counter()
    for lo, hi in zip(bounds, bounds[1:]):
        for piece in stream.pieces(lo, hi, lambda shard: np.array(corpus[shard])):
            read.update((piece.shard, d) for d in range(piece.start, piece.stop))
    every = {(shard, d): count for shard, counts in enumerate(corpus) for d, count in enumerate(counts)}
    assert set(read) == set(every)
    assert all(read[key] == 1 for key, count in every.items() if count == 0)


def test_each_document_counted_empty_is_in_the_piece_it_starts_or_the_shards_last():
    counts = [0, 5, 0, 0, 5, 0]  # empty ones at 0, at 5 and at the end
    stream = TokenStream([10], [6], np.arange(1))
    pieces = [next(stream.pieces(lo, hi, lambda s: np.array(counts))) for lo, hi in [(0, 5), (5, 10)]]
    assert [(p.start, p.stop, p.skip, p.num_tokens) for p in pieces] == [(0, 2, 0, 5), (2, 6, 0, 5)]
