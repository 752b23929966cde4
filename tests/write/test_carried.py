"""Shard tasks that carry their rows of the plan (Ray with a remote DEST):
same bytes as tasks reading the work folder, with the work folder gone."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile

from shardkit.write.carried import CarriedPlan, pack_task, read_partitions
from shardkit.write.parallel import WriteOptions, scan_and_plan, write_dataset
from shardkit.write.shard_task import write_shard
from shardkit.write.spill import RECORD
from tests.write.test_write_dataset import tree_bytes


def test_a_task_carrying_its_rows_writes_the_same_bytes_without_the_work_folder(imagefolder, tmp_path):
    root, _ = imagefolder
    os.rename(os.path.join(root, "eel"), os.path.join(root, "é l"))  # a non-ASCII name travels too
    options = WriteOptions(max_samples=5, seed=3, workers=1)
    write_dataset(root, str(tmp_path / "reference"), options=options)
    expected = {n: b for n, b in tree_bytes(tmp_path / "reference").items() if n.startswith("shard-")}

    work = tmp_path / "driver" / ".shardkit-journal"
    with tempfile.TemporaryDirectory() as unpack_dir:
        _, tasks, _ = scan_and_plan(root, options, work=str(work), unpack_dir=unpack_dir)
    partitions = read_partitions(tasks[0])
    # What a Ray task is sent (Ray pickles its arguments): nothing but its own rows.
    carried = [pickle.loads(pickle.dumps(pack_task(task))) for task in tasks]
    assert all(len(rows.records) == RECORD.itemsize * task.num_samples for rows, task in zip(carried, tasks))
    shutil.rmtree(work)  # the plan and the spills are on the driver only

    out = tmp_path / "node"
    out.mkdir()
    for task, rows in zip(tasks, carried):
        write_shard(task, str(out), plan=CarriedPlan(partitions, rows))
    shutil.rmtree(out / ".shardkit-journal")  # the tasks' journal records
    assert tree_bytes(out) == expected
    assert len(expected) == 2 * len(tasks) == 2 * 5  # 24 images, 5 a shard: shards and their indexes
    assert json.loads(partitions)[0]["read_path"].startswith(root)  # inputs are still read where they are
