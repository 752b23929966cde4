"""The Ray engine of :func:`~shardkit.write.parallel.write_dataset`: one Ray task per shard.

The driver plans exactly as with the local engine; the partitions are
scanned by Ray tasks (:mod:`shardkit.write.scan_ray`), and the step "run
these :class:`~shardkit.write.plan.ShardTask` objects" changes. Each task
is submitted as a Ray task that calls
:func:`~shardkit.write.shard_task.run_shard` on whichever node Ray picks, with
``max_retries`` (a lost worker or node, or an error inside the task, runs it
again). A shard's bytes depend only on its task, and every shard is written
to a temporary name and renamed, so the output is byte-identical to the local
engine's whatever the cluster size, the task order or the retries; the
manifest is still written last, by the driver.

Only ``max_in_flight`` tasks are submitted at a time (``ray.wait`` hands back
the finished ones, which feed the progress bar), so the object store never
holds the whole plan; a task names rows of the plan's files, which live in
DEST's work folder (``.shardkit-journal/``), so it pickles small (or carries
its rows, for a remote DEST).

Every node must see the inputs: before any shard is written a zero-CPU probe
task runs on each alive node and checks a local source path. With a local
DEST it also checks the plan's folder (in DEST's work folder) and a probe file
the driver put into DEST. For an ``s3://``/fsspec DEST the plan stays in the
driver's staging folder, which no other node needs to see: each task carries
its rows of the plan as bytes (:mod:`shardkit.write.carried`, about 100 bytes
a sample, packed when the task is submitted), writes its shard on its own
node and uploads it (:class:`~shardkit.write.publisher.ShardPublisher`).

Ray is imported only when this engine runs; without it the error names
``pip install 'shardkit[ray]'``.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from shardkit.errors import ShardkitError, UsageError
from shardkit.write.carried import CarriedPlan, CarriedRows, pack_task, read_partitions
from shardkit.write.journal import ShardResult
from shardkit.write.plan import PlanReader, ShardTask
from shardkit.write.shard_task import ShardJob, run_shard

log = logging.getLogger(__name__)

#: Probe file the driver writes into DEST for the workers' visibility check.
PROBE_PREFIX = ".shardkit-probe-"
#: Seconds to wait for a TCP connection to ``HOST:PORT`` before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0
INSTALL_HINT = "pip install 'shardkit[ray]'"
#: Seconds to wait for cancelled tasks to remove their temporary files.
CANCEL_WAIT_S = 30.0


def require_ray() -> Any:
    """Import and return the ``ray`` module.

    Raises:
        ImportError: Ray is not installed; the message says how to install it.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"the Ray engine needs Ray, which is not installed: {INSTALL_HINT}") from exc
    return ray


def connect(address: str | None) -> bool:
    """Connect this process to a Ray cluster unless it already is.

    Args:
        address: ``"auto"``, ``HOST:PORT`` (a ``ray://`` client URL too), or
            None for Ray's default.

    Returns:
        True when this call connected (the caller disconnects when done),
        False when Ray was already initialized here.

    Raises:
        ImportError: Ray is not installed.
        UsageError: The address cannot be reached.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address not in (None, "auto") and "://" not in address:
        _check_reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        shown = address or "RAY_ADDRESS / a local cluster"
        raise UsageError(
            f"cannot connect to the Ray cluster at {shown} ({' '.join(str(exc).split())[:200]}); "
            "start one with `ray start --head` or pass --ray-address HOST:PORT of its head"
        ) from exc
    return True


@contextmanager
def session(address: str | None) -> Iterator[None]:
    """Stay connected to the cluster for a whole write (its scan and its shards):
    connect unless this process already is, and disconnect at the end if connected here."""
    connected = connect(address)
    try:
        yield
    finally:
        if connected:
            require_ray().shutdown()


def preflight(address: str | None) -> None:
    """Fail early, before any scanning: Ray missing, or a ``HOST:PORT`` nobody listens on.

    Raises:
        ImportError: Ray is not installed.
        UsageError: The address is malformed or unreachable.
    """
    require_ray()
    if address not in (None, "auto") and "://" not in address:
        _check_reachable(address)


def _check_reachable(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--ray-address must be 'auto' or HOST:PORT, got {address!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}); "
            "start one with `ray start --head` or check --ray-address"
        ) from None


def _write_one(task: ShardTask, job: ShardJob, partitions: bytes | None, rows: CarriedRows | None) -> ShardResult:
    """Body of one Ray task: write and publish one shard, from the plan rows
    it carries when it carries some (``partitions``: the plan's partition table)."""
    plan = CarriedPlan(partitions, rows) if partitions is not None and rows is not None else None
    return run_shard(task, job, plan=plan)


def _missing_here(paths: list[str]) -> tuple[str, list[str]]:
    """Body of a probe task: this node's id and which of ``paths`` it cannot see."""
    import ray

    return ray.get_runtime_context().get_node_id(), [p for p in paths if not os.path.exists(p)]


def check_visible(paths: list[str]) -> None:
    """Check from every alive node of the cluster that ``paths`` exist there.

    Raises:
        UsageError: A node cannot see one of them (the first such path and
            node are named).
    """
    if not paths:
        return
    ray = require_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_missing_here)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(paths)
        for n in nodes
    ]
    for node, (node_id, missing) in zip(nodes, ray.get(refs)):
        if missing:
            raise UsageError(
                f"{missing[0]}: not visible from Ray node {node.get('NodeManagerAddress', '?')} (id {node_id[:12]}); "
                "the source and DEST must be on a file system every node shares, or URLs (s3://, http(s)://) "
                "every node can reach"
            )


def default_max_in_flight(ray: Any) -> int:
    """Tasks submitted at once: two per CPU of the cluster, so workers never wait for the driver."""
    return max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))


def run_tasks_on_ray(
    tasks: list[ShardTask], job: ShardJob, options: Any, *, max_in_flight: int | None = None
) -> Iterator[ShardResult]:
    """The Ray engine: run shard tasks as Ray tasks, yielding each result as it finishes.

    Args:
        tasks: The shards to write.
        job: The write's publisher and shard options. With a local DEST (on
            a shared file system) the tasks write into it and read their rows
            of the plan from its work folder; with a remote one each task
            writes on its own node, uploads its shard there and carries its
            rows of the plan (:mod:`shardkit.write.carried`).
        options: The run's :class:`~shardkit.write.parallel.WriteOptions`.
        max_in_flight: Tasks submitted at once (default: ``options.workers``
            when set, else two per cluster CPU).

    Raises:
        ImportError: Ray is not installed.
        UsageError: The cluster cannot be reached, or a node cannot see the
            inputs or DEST.
        ShardkitError: A task failed for good (retries spent); the error is
            the task's own (an :class:`InputFileError` names the input).
    """
    if not tasks:
        return
    ray = require_ray()
    with session(options.ray_address):
        yield from _run_all(ray, tasks, job, options, max_in_flight)


def _run_all(
    ray: Any, tasks: list[ShardTask], job: ShardJob, options: Any, max_in_flight: int | None
) -> Iterator[ShardResult]:
    """:func:`run_tasks_on_ray` once connected."""
    in_flight: dict[Any, ShardTask] = {}
    try:
        _check_nodes_see_the_run(tasks[0], job)
        remote = ray.remote(_write_one).options(
            num_cpus=1, max_retries=options.ray_max_retries, retry_exceptions=True, name="shardkit_write_shard"
        )
        carry = job.publisher.remote  # the plan is in the driver's staging folder: tasks carry their rows
        partitions = ray.put(read_partitions(tasks[0])) if carry else None
        limit = max_in_flight or options.workers or default_max_in_flight(ray)
        pending = iter(tasks)
        while True:
            while len(in_flight) < limit and (task := next(pending, None)) is not None:
                rows = pack_task(task) if carry else None
                in_flight[remote.remote(task, job, partitions, rows)] = task
            if not in_flight:
                break
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                yield _result(ray, ref, in_flight.pop(ref))
    finally:
        if in_flight:  # a task failed or the caller stopped: stop the others, and let them clean up
            for ref in in_flight:
                ray.cancel(ref)
            ray.wait(list(in_flight), num_returns=len(in_flight), timeout=CANCEL_WAIT_S)


def _check_nodes_see_the_run(first: ShardTask, job: ShardJob) -> None:
    """Before any shard is written: every node must see an input file, and
    for a local DEST its work folder's plan and DEST itself."""
    with PlanReader(first) as plan:
        paths = plan.read_paths[:1]
    if job.publisher.remote:
        check_nodes_see(paths)
    else:
        check_nodes_see([*paths, first.plan_dir], folder=job.publisher.folder)


def check_nodes_see(paths: list[str], *, folder: str | None = None) -> None:
    """:func:`check_visible` for ``paths`` and, when given, for a probe file
    put into ``folder`` (an output folder every node must share), removed after.

    Raises:
        UsageError: A node cannot see one of them.
    """
    if folder is None:
        check_visible(sorted(set(paths)))
        return
    probe = os.path.join(folder, PROBE_PREFIX + uuid.uuid4().hex)
    with open(probe, "wb"):
        pass
    try:
        check_visible([*sorted(set(paths)), probe])
    finally:
        os.unlink(probe)


def _result(ray: Any, ref: Any, task: ShardTask) -> Any:
    """The task's result; its own error (not Ray's wrapper) when it failed for good."""
    return task_result(ray, ref, subject=task.name, doing="writing it", kept="shards already written")


def task_result(
    ray: Any, ref: Any, *, subject: str, doing: str, kept: str, error: Callable[[str], ShardkitError] = ShardkitError
) -> Any:
    """``ray.get(ref)``; when the task failed for good, its own
    :class:`ShardkitError` (not Ray's wrapper), else ``error(message)``.

    Args:
        subject: What the task works on, first in the message (a shard's name, an input's path).
        doing: What the task does to it (``"writing it"``).
        kept: What ``--resume`` keeps of the run (``"shards already written"``).
        error: Makes the error for a failure that is not the task's own.
    """
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, ShardkitError):
            raise cause from None
        raise error(f"{subject}: the Ray task {doing} failed: {cause!r}") from exc
    except ray.exceptions.RayError as exc:
        raise error(
            f"{subject}: the Ray task {doing} was lost after {exc.__class__.__name__} "
            f"(retries spent); rerun with --resume to keep the {kept}"
        ) from exc
