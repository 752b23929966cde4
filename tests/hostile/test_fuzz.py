"""Fuzzing the readers with damaged and hostile shards.

Real shards written by shardkit, then one seeded mutation at a time: random
damage (bit flips, a zeroed block, truncation, a run of bytes replaced by a
run of another length) and structure-aware edits of tar headers with their
checksum fixed up (sizes in octal and base-256, negative ones included, type
flags, pax records, GNU long names), so the parser is driven past its
checksum into every numeric field. Each mutated dataset goes through
``ShardDataset`` and ``IndexedDataset`` under both error policies, with and
without checksums, and through ``shardkit verify``, each under a timeout.

What must hold for every read: no exception outside shardkit's error tree, no
hang, no sample whose key or field set is not an original's, no sample twice,
and with checksums on, no sample whose bytes differ from the original's.
``pytest tests/hostile/test_fuzz.py --fuzz-mutations 1000 -s`` prints how
often each outcome came.
"""

from __future__ import annotations

import collections
import contextlib
import random
import signal

import pytest

import shardkit
from shardkit.errors import ShardkitError
from shardkit.format.index import load_index
from shardkit.format.tar import BLOCK_SIZE, byte_sum
from shardkit.verify import verify_dataset

from tests.conftest import build_dataset

SIZES = (9, 7, 8)
READ_TIMEOUT_S = 20


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int):
    def alarm(signum, frame):
        raise Hang(f"no result within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _fix_checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = format(byte_sum(bytes(block)), "06o").encode() + b"\0 "


def _header_offsets(data: bytes) -> list[int]:
    """Offsets of the blocks that pass as tar headers (their checksum holds)."""
    found = []
    for pos in range(0, len(data) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = data[pos : pos + BLOCK_SIZE]
        if block[257:262] != b"ustar":
            continue
        stored = block[148:156].split(b"\0", 1)[0].strip()
        if stored and byte_sum(block) - sum(block[148:156]) + 256 == int(stored, 8):
            found.append(pos)
    return found


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    block = bytearray(BLOCK_SIZE)
    block[0 : len(name)] = name[:100]
    block[100:108] = b"0000644\0"
    block[124:136] = format(size, "011o").encode()[-11:] + b"\0"
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    _fix_checksum(block)
    return bytes(block)


def _pax(records: bytes, *, claimed: int | None = None) -> bytes:
    size = len(records) if claimed is None else claimed
    head = bytearray(_header(b"././@PaxHeader", 0, b"x"))
    head[124:136] = format(size, "011o").encode()[-11:] + b"\0"
    _fix_checksum(head)
    return bytes(head) + records + bytes(-len(records) % BLOCK_SIZE)


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One seeded mutation of a shard's bytes: ``(kind, new bytes)``."""
    buf = bytearray(data)
    kind = rng.choice(
        ["bitflip", "zero_block", "truncate", "splice", "size_octal", "size_base256", "size_negative",
         "typeflag", "pax", "longname"]
    )  # fmt: skip
    headers = _header_offsets(data)
    at = rng.choice(headers) if headers else 0
    if kind == "bitflip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == "zero_block":
        i = rng.randrange(len(buf) // BLOCK_SIZE) * BLOCK_SIZE
        buf[i : i + BLOCK_SIZE] = bytes(BLOCK_SIZE)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf)) :]
    elif kind == "splice":
        i = rng.randrange(len(buf))
        old, new = rng.randint(1, 2048), rng.randint(0, 2048)
        new += new == old
        buf[i : i + old] = rng.randbytes(new)
    elif kind.startswith("size") or kind == "typeflag":
        block = bytearray(buf[at : at + BLOCK_SIZE])
        if kind == "size_octal":
            value = rng.choice([0, 1, 511, 513, 8**11 - 1, rng.randrange(8**11)])
            block[124:136] = format(value, "011o").encode() + b"\0"
        elif kind == "size_base256":
            block[124:136] = b"\x80" + rng.randbytes(11)
        elif kind == "size_negative":
            block[124:136] = b"\xff" + rng.randbytes(11)
        else:
            block[156:157] = rng.choice([b"1", b"2", b"3", b"5", b"6", b"x", b"g", b"L", b"K", b"S", b"A", b"\xff"])
            if rng.random() < 0.5:
                block[124:136] = b"\xff" + rng.randbytes(11)  # a negative size on an entry the parser steps over
        _fix_checksum(block)
        buf[at : at + BLOCK_SIZE] = block
    elif kind == "pax":
        records = rng.choice(
            [b"13 size=-512\n", b"30 size=99999999999999999999\n", b"18 path=a\0b.jpg\n", b"99 path=x\n",
             b"3 x\n", b"12 path=..\n", b"20 size=12345678901\n"]
        )  # fmt: skip
        claimed = rng.choice([None, None, 1 << 33, 0])
        buf[at:at] = _pax(records, claimed=claimed)
    else:  # longname
        name = rng.choice([b"x" * 300 + b".jpg\0", b"k.jpg", b""])
        size = rng.choice([len(name), 1 << 40, 1 << 21])
        head = _header(b"././@LongLink", 0, b"L")
        head = bytearray(head)
        head[124:136] = format(size, "011o").encode()[-11:] + b"\0"
        _fix_checksum(head)
        buf[at:at] = bytes(head) + name + bytes(-len(name) % BLOCK_SIZE)
    return kind, bytes(buf)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fuzz") / "ds")
    manifest = build_dataset(root, SIZES, payload_bytes=700)
    originals = {s["__key__"]: s for s in shardkit.ShardDataset(manifest, mode="exact", shuffle=False)}
    assert len(originals) == sum(SIZES)
    return manifest, originals


READERS = [
    (reader, policy, checksums)
    for reader in ("stream", "indexed")
    for policy in ("raise", "skip")
    for checksums in (False, True)
]


def _read(manifest, reader: str, policy: str, checksums: bool) -> list[dict]:
    out: list[dict] = []
    if reader == "stream":
        ds = shardkit.ShardDataset(
            manifest.location, mode="exact", shuffle=False, on_error=policy, verify_checksums=checksums
        )
        out.extend(ds)
    else:
        ds = shardkit.IndexedDataset(manifest.location, on_error=policy, verify_checksums=checksums)
        for i in range(len(ds)):
            sample = ds[i]
            if sample is not None:
                out.append(sample)
    return out


def test_damaged_and_hostile_shards(dataset, pytestconfig, capsys):
    manifest, originals = dataset
    count = pytestconfig.getoption("--fuzz-mutations")
    rng = random.Random(20261124)
    paths = [manifest.resolve(s.path) for s in manifest.shards]
    pristine = {path: open(path, "rb").read() for path in paths}
    outcomes: collections.Counter = collections.Counter()
    failures: list[str] = []
    for case in range(count):
        path = rng.choice(paths)
        kind, data = mutate(pristine[path], rng)
        with open(path, "wb") as f:
            f.write(data)
        try:
            for reader, policy, checksums in READERS:
                label = f"case {case} ({kind} of {path.rsplit('/', 1)[-1]}) {reader}/{policy}/checksums={checksums}"
                try:
                    with deadline(READ_TIMEOUT_S):
                        samples = _read(manifest, reader, policy, checksums)
                except ShardkitError:
                    outcomes[f"{reader}/{policy}: a shardkit error"] += 1
                    continue
                except Hang:
                    failures.append(f"{label}: hang")
                    continue
                except Exception as exc:  # noqa: BLE001 - the failure names it
                    failures.append(f"{label}: foreign {type(exc).__name__}: {exc}")
                    continue
                keys = [s["__key__"] for s in samples]
                if len(keys) != len(set(keys)):
                    failures.append(f"{label}: a sample twice")
                altered = 0
                for sample in samples:
                    original = originals.get(sample["__key__"])
                    fields = {k for k in sample if not k.startswith("__")}
                    if original is None or fields != {k for k in original if not k.startswith("__")}:
                        failures.append(f"{label}: sample {sample['__key__']!r} with fields {sorted(fields)} is no original")
                    elif any(sample[k] != original[k] for k in fields):
                        altered += 1
                        if checksums:
                            failures.append(f"{label}: sample {sample['__key__']!r} has changed bytes, checksums on")
                result = "all samples" if len(samples) == len(originals) else "some samples left out"
                if altered:
                    result += ", some with changed bytes (checksums off)"
                outcomes[f"{reader}/{policy}: {result}"] += 1
            try:
                with deadline(READ_TIMEOUT_S):
                    verify_dataset(manifest.location)
                outcomes["verify: passes"] += 1
            except ShardkitError:
                outcomes["verify: fails with a shardkit error"] += 1
            except Hang:
                failures.append(f"case {case} ({kind}): verify hangs")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"case {case} ({kind}): verify raises foreign {type(exc).__name__}: {exc}")
        finally:
            with open(path, "wb") as f:
                f.write(pristine[path])
    with capsys.disabled():
        print(f"\nfuzz: {count} mutations, {count * len(READERS)} reads")
        for outcome, n in sorted(outcomes.items()):
            print(f"  {n:6d}  {outcome}")
    assert not failures, "\n".join(failures[:20])


def test_the_mutations_reach_the_header_fields(dataset):
    """The structure-aware mutations hit real headers (else the fuzz would
    only test the checksum)."""
    manifest, _ = dataset
    data = open(manifest.resolve(manifest.shards[0].path), "rb").read()
    offsets = _header_offsets(data)
    bounds = [int(b) for b in load_index(manifest.resolve(manifest.shards[0].index))]
    assert set(bounds[:-1]) <= set(offsets) and len(offsets) == 3 * SIZES[0]
