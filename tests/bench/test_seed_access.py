"""The seed scenario of bench_random_access.py (issue #45): its data builder,
one cell per tool, and the report."""

from __future__ import annotations

import os

from bench.harness import seed_access


def test_seed_data_gives_every_tool_the_same_samples_and_a_report(tmp_path):
    paths = seed_access.ensure_seed_data(str(tmp_path), 20_000)
    assert paths["num_shards"] == 2 and paths["build_s"]["sqlite"] is not None
    tars = [os.path.join(paths["shards"], f"shard-00000{i}.tar") for i in range(2)]
    assert os.stat(tars[0]).st_ino == os.stat(tars[1]).st_ino  # one real shard, linked
    index = seed_access.SAMPLES_PER_SHARD + 7  # sample 7 of the second shard
    key, caption, label = seed_access.base_samples()[7]
    samples = {tool: seed_access.open_tool(tool, paths, 20_000)[index] for tool in seed_access.TOOLS}
    assert samples["sqlite"] == {"__key__": key, "txt": caption, "cls": label}
    assert samples["shardkit"]["__key__"] == key and samples["shardkit"]["txt"] == caption.encode()
    assert samples["shardkit-open"] == samples["shardkit"]
    assert samples["wids"]["__key__"] == key and samples["wids"][".txt"].getvalue() == caption.encode()
    assert seed_access.ensure_seed_data(str(tmp_path), 20_000)["build_s"] == paths["build_s"]  # reused

    cells = []
    for tool in seed_access.TOOLS:
        spec = {"tool": tool, "paths": paths, "num_samples": 20_000, "workers": 0, "reads": 256, "batch_size": 64,
                "seed": 0, "budget_s": 60.0}
        cells.append(seed_access.run_cell(spec))
    assert all(c["reads_done"] == 256 and not c["extrapolated"] and c["uss_mb"] is not None for c in cells)
    # Two runs of 5x10^6 stand in for the targets' rows; their memory is set, as a
    # measured growth can be 0 or less under memory pressure (a parallel suite).
    cells = [{**c, "num_samples": 5_000_000, "uss_mb": 10.0 + i} for i, c in enumerate(cells)]
    record = {
        "machine": {"cpus": 2},
        "commit": "abc1234",
        "config": {"sizes": [5_000_000], "workers": [0], "reads": 256, "batch_size": 64, "budget_s": 60.0,
                   "repeats": 1, "repeat_cells": []},
        "data": {"5000000": paths},
        "cells": cells,
        "targets": seed_access.targets(cells),
    }
    assert [t["what"] for t in record["targets"]] == [
        "time, 5e+06 samples, 0 workers", "private memory, 5e+06 samples, 0 workers",
        "time, 5e+06 samples, 0 workers, open_shards()", "private memory, 5e+06 samples, 0 workers, open_shards()"]
    table = seed_access.markdown(record)
    assert "| 5,000,000 | 500 | 0 |" in table and "abc1234" in table
    seed_access.plot(record, str(tmp_path / "seed.png"))
    assert os.path.getsize(tmp_path / "seed.png") > 0
