"""A shard task's slice of the plan, carried with the task as bytes.

A :class:`~shardkit.write.plan.ShardTask` names rows of the plan's files,
which live in the write's work folder. Where that folder is not on a file
system every machine shares (a Ray cluster writing to ``s3://``: the work
folder is in the driver's local staging area), the driver packs each task's
rows when it submits the task: per sample its partition number, its spill
record (56 bytes) and its key and name, about 100 bytes a sample, a few
hundred kB for a shard of thousands of samples. The partitions' table
(``partitions.json``) is sent once for all tasks. A
:class:`CarriedPlan` reads the rows back in the writing process, where
:func:`~shardkit.write.shard_task.write_shard` uses it as it uses a
:class:`~shardkit.write.plan.PlanReader`: the shard's bytes are the same.

Only the driver's memory for the tasks in flight holds packed rows, never the
whole plan's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shardkit.write.plan import PARTITIONS_FILE, PlanReader, SampleBlock, ShardTask
from shardkit.write.sources.base import Partition
from shardkit.write.sources.files import OpenFiles
from shardkit.write.spill import RECORD, cut_strings


@dataclass(frozen=True)
class CarriedRows:
    """One task's samples, in write order.

    Attributes:
        parts: The samples' partition numbers (``<u4`` each).
        records: Their spill records (:data:`~shardkit.write.spill.RECORD`),
            with ``key_off`` pointing into ``strings``.
        strings: Their keys and names.
    """

    parts: bytes
    records: bytes
    strings: bytes


def read_partitions(task: ShardTask) -> bytes:
    """The plan's partition table (``partitions.json``), to send once with every task."""
    with open(os.path.join(task.plan_dir, PARTITIONS_FILE), "rb") as f:
        return f.read()


def pack_task(task: ShardTask) -> CarriedRows:
    """Read ``task``'s rows of the plan into bytes the task carries.

    Raises:
        OSError: The plan's or the spills' files cannot be read.
    """
    parts = np.empty(task.num_samples, dtype="<u4")
    records = np.empty(task.num_samples, dtype=RECORD)
    strings = bytearray()
    i = -1
    with PlanReader(task) as plan:
        for i, (part, key, name, rec) in enumerate(plan.samples(task)):
            parts[i] = part
            records[i] = rec._replace(key_off=len(strings))
            strings += key.encode("utf-8", "surrogateescape")
            strings += name
    assert i + 1 == task.num_samples, f"{task.name}: the plan holds {i + 1} samples, the task {task.num_samples}"
    return CarriedRows(parts=parts.tobytes(), records=records.tobytes(), strings=bytes(strings))


class CarriedPlan(PlanReader):
    """A :class:`~shardkit.write.plan.PlanReader` over the rows a task carries
    (the input files are still read where the partitions say)."""

    def __init__(self, partitions: bytes, rows: CarriedRows):
        table = json.loads(partitions)
        self.read_paths = [row.pop("read_path") for row in table]
        self.partitions = [Partition(**row) for row in table]
        self._rows = rows
        self._spills = {}
        self._files = OpenFiles()

    def unchanged(self, part: int) -> bool:
        return False  # no spill summary here: JSONL rows are read from their lines

    def blocks(self, task: ShardTask) -> Iterator[SampleBlock]:
        """The carried samples, in write order, as one block."""
        records = np.frombuffer(self._rows.records, dtype=RECORD)
        strings = self._rows.strings
        keys, names = cut_strings(strings, *(records[name].tolist() for name in ("key_off", "key_len", "name_len")))
        yield SampleBlock(np.frombuffer(self._rows.parts, dtype="<u4").tolist(), records, keys, names)
