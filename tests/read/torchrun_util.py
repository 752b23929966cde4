"""Both halves of the tests that run a script under a real torchrun (gloo, CPU).

Test side: :func:`launch` starts ``python -m torch.distributed.run`` on a
script and returns what every rank wrote. Script side: :func:`run_rank` joins
the process group, runs the script's own work and writes this rank's result
where :func:`launch` looks for it; :func:`rank_arguments` parses the options
those scripts share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAIL_CHARS = 3000  # how much of each captured stream a failure message keeps


def result_path(out: str, rank: int, tag: str = "") -> str:
    """Where rank ``rank`` writes its result: ``OUT/{tag}rank{rank}.json``."""
    return os.path.join(out, f"{tag}rank{rank}.json")


def launch(script: str, nproc: int, args: Sequence[str], *, out: str, tag: str = "", timeout_s: float = 240) -> list[Any]:
    """Run ``script`` with ``args`` on ``nproc`` local ranks and return each
    rank's JSON result, rank 0 first. Fails the test with the tail of the
    captured stdout and stderr when torchrun exits non-zero or runs past
    ``timeout_s``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script, *args]
    # ACCELERATE_USE_CPU: what `accelerate launch --cpu` sets (else accelerate sees one process without GPUs).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "ACCELERATE_USE_CPU": "1"}
    os.makedirs(out, exist_ok=True)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        problem = f"exited with status {proc.returncode}" if proc.returncode else ""
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop(proc)
        problem = f"ran past {timeout_s:g} s"
    if problem:
        name = os.path.basename(script)
        raise AssertionError(f"torchrun {name} on {nproc} ranks {problem}\n{stdout[-TAIL_CHARS:]}{stderr[-TAIL_CHARS:]}")
    return [_load(result_path(out, rank, tag)) for rank in range(nproc)]


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop a torchrun that ran too long and return what it printed. SIGTERM
    first, which torchrun passes on to the ranks it started; SIGKILL (to
    torchrun alone) if that does not end it."""
    proc.terminate()
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "", "(no output: torchrun did not stop on SIGTERM and was killed)"


def _load(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def rank_arguments() -> argparse.ArgumentParser:
    """Script side: a parser with the options every such script takes,
    ``--data`` (the dataset) and ``--out`` (the folder for the results)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    return parser


def run_rank(work: Callable[[int, int], dict[str, Any]], *, out: str, tag: str = "") -> None:
    """Script side: join the gloo process group, compute this rank's result
    with ``work(rank, world_size)``, wait until every rank has finished (so
    none is left blocked in a collective), write the result for
    :func:`launch` and leave the group."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = work(rank, dist.get_world_size())
    dist.barrier()
    with open(result_path(out, rank, tag), "w") as f:
        json.dump(result, f)
    # Not on the way out of an error: the process ends, and torchrun stops the other ranks.
    dist.destroy_process_group()


def save_gathered_state(loader: Any, path: str, rank: int) -> None:
    """Script side: gather every rank's loader state (a collective: every
    rank calls it) and have rank 0 write the merged state to ``path``."""
    from shardkit.read.resume import gather_states

    state = gather_states(loader.state_dict())
    if rank == 0:
        with open(path, "w") as f:
            json.dump(state, f)


def load_saved_state(loader: Any, path: str) -> None:
    """Script side: load the state :func:`save_gathered_state` wrote into ``loader``."""
    with open(path) as f:
        loader.load_state_dict(json.load(f))


def run_phases(
    read_phase: Callable[[argparse.Namespace, int], dict[str, Any]],
    *,
    steps: int = 5,
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Script side: the ``main()`` of a two-phase script (``--phase full``
    saves a state, ``--phase resume`` loads it): parse :func:`rank_arguments`,
    ``--phase`` and ``--steps`` (and what ``more`` adds), then
    :func:`run_rank` ``read_phase(args, rank)``, its result tagged by phase."""
    parser = rank_arguments()
    parser.add_argument("--phase", choices=("full", "resume"), required=True)
    parser.add_argument("--steps", type=int, default=steps)
    if more is not None:
        more(parser)
    args = parser.parse_args()
    run_rank(lambda rank, _: read_phase(args, rank), out=args.out, tag=f"{args.phase}-")
