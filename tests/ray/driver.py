"""Ray drivers for tests/ray, run inside the cluster's network namespace.

``python tests/ray/driver.py ADDRESS COMMAND ARGS...`` connects to the
cluster at ADDRESS, runs COMMAND and prints one JSON line as its last line.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import ray


def digest_rows(rows) -> dict[str, dict[str, str]]:
    """Sample key -> {extension: sha256 of the bytes}, for non-null binary columns."""
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        key = row["__key__"]
        assert key not in out, f"duplicate key {key!r}"
        out[key] = {
            name: hashlib.sha256(value).hexdigest()
            for name, value in row.items()
            if not name.startswith("__") and value is not None
        }
    return out


def wait_nodes(count: str) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) >= int(count):
            return {"nodes": len(alive)}
        time.sleep(0.5)
    raise SystemExit(f"only {len(alive)} Ray nodes alive after 60 s")


def rows(source: str, blocks: str = "0") -> dict:
    import shardkit.ray

    ds = shardkit.ray.read_shards(source, override_num_blocks=int(blocks) or None)
    materialized = ds.materialize()
    return {"num_blocks": materialized.num_blocks(), "rows": digest_rows(materialized.iter_rows())}


def roundtrip(source: str, dest: str, max_samples: str) -> dict:
    import shardkit.ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    manifest = shardkit.ray.write_shards(shardkit.ray.read_shards(source), dest, max_samples=int(max_samples))
    return {"num_shards": manifest.num_shards, "num_samples": manifest.num_samples}


def rewrite(folder: str, max_samples: str) -> dict:
    """Reshard a dataset into its own folder (overwrite=True)."""
    import shardkit.ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    manifest = shardkit.ray.write_shards(
        shardkit.ray.read_shards(folder), folder, max_samples=int(max_samples), overwrite=True
    )
    return {"num_shards": manifest.num_shards, "num_samples": manifest.num_samples}


def http(source: str) -> dict:
    """Serve the dataset folder ``source`` from a ranged HTTP server in this namespace; read it with read_shards."""
    import shardkit.ray
    from tests.remote.remote_servers import FaultyHTTPServer

    server = FaultyHTTPServer().start()
    try:
        for name in sorted(os.listdir(source)):
            with open(os.path.join(source, name), "rb") as f:
                server.add(f"/data/{name}", f.read())
        ds = shardkit.ray.read_shards(server.base_url + "/data/", override_num_blocks=8)
        got = digest_rows(ds.iter_rows())
        shard_gets = sum(1 for method, path, _ in server.requests if method == "GET" and path.endswith(".tar"))
    finally:
        server.close()
    return {"rows": got, "shard_gets": shard_gets}


def webdataset(source: str) -> dict:
    """Ray's own read_webdataset over shardkit shards."""
    paths = sorted(os.path.join(source, n) for n in os.listdir(source) if n.endswith(".tar"))
    ds = ray.data.read_webdataset(paths, decoder=None)
    return {"rows": digest_rows(ds.iter_rows())}


def vanish(source: str, dest: str, victim: str, on_error: str) -> dict:
    """write_dataset with the Ray engine; ``victim`` is deleted when the first shard is done."""
    from shardkit.errors import ShardkitError
    from shardkit.write.parallel import WriteOptions, write_dataset

    def on_progress(event) -> None:
        if os.path.exists(victim):
            os.unlink(victim)

    options = WriteOptions(
        engine="ray", max_samples=1, shuffle=False, on_error=on_error, ray_max_retries=1,
        ray_address=ray.get_runtime_context().gcs_address,
    )
    try:
        report = write_dataset(source, dest, options=options, progress=on_progress)
    except ShardkitError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "path": getattr(exc, "path", None)}
    return {"skipped": [s.path for s in report.manifest.skipped], "num_samples": report.manifest.num_samples}


def s3_write(images: str) -> dict:
    """The Ray engine writing to S3 (moto's server in this namespace), then read_shards reading it back.

    The workers get the endpoint and throwaway credentials the way a user's
    would: through the job's runtime environment (see ``main``).
    """
    import boto3

    import shardkit.ray
    from shardkit.write.parallel import WriteOptions, write_dataset

    client = boto3.client("s3")
    client.create_bucket(Bucket="shards")
    options = WriteOptions(engine="ray", max_samples=6, seed=7)
    report = write_dataset(images, "s3://shards/train", options=options)
    objects = {}
    for item in client.list_objects_v2(Bucket="shards", Prefix="train/")["Contents"]:
        body = client.get_object(Bucket="shards", Key=item["Key"])["Body"].read()
        objects[item["Key"].split("/", 1)[1]] = hashlib.sha256(body).hexdigest()
    rows = shardkit.ray.read_shards("s3://shards/train/").count()
    # write_shards publishes through the same step: its tasks stage and upload their shards.
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    shardkit.ray.write_shards(shardkit.ray.read_shards("s3://shards/train/"), "s3://shards/again", max_samples=6)
    again = {}
    for item in client.list_objects_v2(Bucket="shards", Prefix="again/")["Contents"]:
        body = client.get_object(Bucket="shards", Key=item["Key"])["Body"].read()
        again[item["Key"].split("/", 1)[1]] = hashlib.sha256(body).hexdigest()
    again_rows = shardkit.ray.read_shards("s3://shards/again/").count()
    return {
        "objects": objects, "num_written": report.num_written, "rows": rows, "again": again, "again_rows": again_rows
    }


def map_sequence(dest: str, num_items: str) -> dict:
    """write_dataset(range(N), map=square) with the Ray engine: the map stage's jobs run as Ray tasks."""
    from shardkit.write.parallel import WriteOptions, write_dataset
    from tests.write.map_functions import square

    options = WriteOptions(engine="ray", max_samples=37, seed=3, ray_address=ray.get_runtime_context().gcs_address)
    report = write_dataset(range(int(num_items)), dest, map=square, options=options)
    return {"num_items": report.num_items, "num_samples": report.manifest.num_samples}


def extend(parent: str, dest: str) -> dict:
    """shardkit.extend with the Ray engine: each parent shard's new fields written by a Ray task."""
    import shardkit
    from tests.revise.derived_maps import embedding

    report = shardkit.extend(parent, dest, map=embedding, engine="ray")
    return {"num_samples": report.num_samples, "num_extended": report.num_extended, "fields": list(report.fields)}


def numpy_rows(dest: str, num_rows: str) -> dict:
    """shardkit.ray.write_shards of rows with numpy values (an int32 array under tokens.npy, a numpy int)."""
    import numpy as np

    import shardkit.ray

    def row(r: dict) -> dict:
        i = int(r["id"])
        return {"__key__": f"{i:05d}", "tokens.npy": np.arange(i % 5, dtype=np.int32), "cls": np.int64(i * 3)}

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    manifest = shardkit.ray.write_shards(ray.data.range(int(num_rows)).map(row), dest, max_samples=16)
    return {"num_samples": manifest.num_samples, "num_shards": manifest.num_shards}


def homes() -> dict:
    """Where each node's worker processes, and a process such a worker starts, find HOME and TMPDIR."""
    import subprocess

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    def report() -> list[str]:
        child = subprocess.run(
            [sys.executable, "-c", "import os, pathlib, tempfile; print(pathlib.Path.home(), tempfile.gettempdir())"],
            capture_output=True, text=True, check=True,
        )
        return [os.environ["HOME"], os.environ["TMPDIR"], *child.stdout.split()]

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    refs = [report.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
    return {"driver": [os.environ["HOME"], os.environ["TMPDIR"]], "nodes": ray.get(refs)}


def _start_s3() -> dict[str, str]:
    from moto.server import ThreadedMotoServer

    from tests.remote.remote_servers import moto_environment

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = moto_environment(host, port)
    os.environ.update(env)
    return env


COMMANDS = {"s3-write": s3_write, "wait-nodes": wait_nodes, "rows": rows, "roundtrip": roundtrip, "rewrite": rewrite,
            "http": http,
            "webdataset": webdataset, "vanish": vanish, "homes": homes, "map-sequence": map_sequence,
            "numpy-rows": numpy_rows, "extend": extend}


def main() -> None:
    address, command, *args = sys.argv[1:]
    runtime_env = {"env_vars": _start_s3()} if command.startswith("s3") else None
    ray.init(address=address, logging_level="WARNING", log_to_driver=False, runtime_env=runtime_env)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        result = COMMANDS[command](*args)
    finally:
        ray.shutdown()
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
