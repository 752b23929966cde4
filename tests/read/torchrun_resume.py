"""Run under torchrun by tests/read/test_torchrun_resume.py.

``--phase save``: each rank reads ``--steps`` batches of epoch 1 (2 workers),
records their keys, and rank 0 writes the gathered state of all ranks.
``--phase resume``: each rank loads that state (another world size) and
reads the rest of the epoch. Each rank writes ``OUT/{phase}-rank{RANK}.json``
with the keys per mode.

With ``--infinite``, ``mode="infinite"`` too, without worker processes: in
the save phase rank ``r`` reads ``4 + 2 r`` batches (so that ranks stop in
different epochs), in the resume phase every rank reads ``--infinite-steps``
batches.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

from shardkit import ShardDataset, make_loader
from shardkit.read.resume import gather_states
from tests.read.torchrun_util import rank_arguments, run_rank

MODES = ("exact", "balanced")


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list[str]]:
    """The keys this rank read in ``args.phase``, per mode; in the save phase
    rank 0 also writes the gathered state of every mode."""
    result: dict[str, list[str]] = {}
    for mode in MODES + (("infinite",) if args.infinite else ()):
        endless = mode == "infinite"
        ds = ShardDataset(args.data, mode=mode, seed=11, buffer_size=4, epoch=1)
        # Infinite mode reads in the rank's process (no worker processes to start: cheaper).
        loader = make_loader(ds, batch_size=2, num_workers=0 if endless else 2)
        state_path = os.path.join(args.out, f"state-{mode}.json")
        if args.phase == "save":
            batches = list(itertools.islice(loader, 4 + 2 * rank if endless else args.steps))
            state = gather_states(loader.state_dict())
            if rank == 0:
                with open(state_path, "w") as f:
                    json.dump(state, f)
        else:
            with open(state_path) as f:
                loader.load_state_dict(json.load(f))
            batches = list(itertools.islice(loader, args.infinite_steps) if endless else loader)
        result[mode] = [k for batch in batches for k in batch["__key__"]]
        del loader
    return result


def main() -> None:
    parser = rank_arguments()
    parser.add_argument("--phase", choices=("save", "resume"), required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--infinite", action="store_true")
    parser.add_argument("--infinite-steps", type=int, default=30)
    args = parser.parse_args()
    run_rank(lambda rank, _: read_phase(args, rank), out=args.out, tag=f"{args.phase}-")


if __name__ == "__main__":
    main()
