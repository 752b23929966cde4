"""Run by tests/read/test_resume.py in a fresh interpreter: resume saved states.

Reads a JSON job ``{"data", "dataset", "loader", "cases": [{"state", "take"}],
"next_epoch", "out"}``; for each case builds a new dataset and loader, loads
the state file, and records the keys of the next ``take`` batches (all of the
epoch when ``take`` is null). With ``next_epoch``, the keys of the following
epoch are recorded too. Writes ``{"runs": [[keys...], ...], "next": [...]}``.
"""

from __future__ import annotations

import itertools
import json
import sys

from shardkit import ShardDataset, make_loader


def batch_keys(batch: object) -> list[str]:
    """The sample keys of a batch (or of a single sample)."""
    keys = batch["__key__"]  # type: ignore[index]
    return [keys] if isinstance(keys, str) else list(keys)


def main(job_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    runs = []
    following = []
    for case in job["cases"]:
        ds = ShardDataset(job["data"], **job["dataset"])
        loader = make_loader(ds, **job["loader"])
        with open(case["state"]) as f:
            loader.load_state_dict(json.load(f))
        batches = itertools.islice(loader, case["take"]) if case["take"] is not None else loader
        runs.append([k for batch in batches for k in batch_keys(batch)])
        if job.get("next_epoch"):
            ds.set_epoch(ds.epoch + 1)
            following.append([k for batch in loader for k in batch_keys(batch)])
        del loader
    with open(job["out"], "w") as f:
        json.dump({"runs": runs, "next": following}, f)


if __name__ == "__main__":
    main(sys.argv[1])
