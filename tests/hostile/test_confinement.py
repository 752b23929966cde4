"""Confinement (issue #26, item 3): a manifest sends the reader only inside its
dataset, to regular files of the size it records, and is itself refused when
absurd. Each case runs every entry point that reads through the manifest in
a child process (see :mod:`tests.hostile.entry`), so a hang is a failure,
not a stuck test run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from shardkit import IndexedDataset, ShardDataset
from shardkit.errors import ManifestError, VerifyError
from shardkit.format.manifest import MANIFEST_NAME, Manifest
from shardkit.io.registry import open_source
from shardkit.verify import verify_dataset
from tests.conftest import build_dataset
from tests.hostile.conftest import run_entry
from tests.remote.remote_servers import FaultyHTTPServer

READERS = ("stream", "loader", "indexed", "verify")
NUM = 3  # samples in the dataset's one shard
CANARY = 2  # samples in the canary's one shard, outside the dataset


def _refused(outcome, *needles: str) -> str:
    """Assert the entry point failed with a shardkit error naming ``needles``, yielding nothing; return the message."""
    assert outcome.outcome != "hang", outcome.child_output[-2000:]
    assert outcome.samples == []
    if outcome.exit_code is not None:  # the CLI: exit 2 (usage/ShardkitError) or 1 (a failed check)
        assert outcome.exit_code in (1, 2), outcome.stdout + outcome.stderr
        message = outcome.stderr
    else:
        assert outcome.outcome == "error", (outcome.error_type, outcome.message, outcome.child_output[-2000:])
        message = outcome.message
    for needle in needles:
        assert needle in message, message
    return message


def _read_ok(outcome, count: int) -> None:
    assert outcome.outcome == "ok", (outcome.error_type, outcome.message, outcome.child_output[-2000:])
    if outcome.exit_code is not None:
        assert outcome.exit_code == 0, outcome.stdout + outcome.stderr
    else:
        assert len(outcome.samples) == count


@pytest.fixture
def datasets(tmp_path):
    """A one-shard dataset ``ds`` and a canary dataset beside it, ``outside``."""
    ds = build_dataset(str(tmp_path / "ds"), [NUM])
    canary = build_dataset(str(tmp_path / "outside"), [CANARY], payload_bytes=77)
    return ds, canary


def _point_shard_at(ds, canary, path: str, index: str) -> str:
    """Rewrite ``ds``'s manifest so its shard is the canary's, at ``path`` and ``index``."""
    file = os.path.join(ds.location, MANIFEST_NAME)
    data = json.loads(ds.to_format1_json())
    entry = dict(data["shards"][0], **{k: v for k, v in json.loads(canary.to_format1_json())["shards"][0].items() if k not in ("path", "index")})
    entry.update(path=path, index=index)
    data["shards"] = [entry]
    data.update(num_samples=entry["num_samples"], num_bytes=entry["num_bytes"])
    with open(file, "w") as f:
        json.dump(data, f)
    return file


def _escapes(tmp_path, ds, canary) -> dict[str, tuple[str, str]]:
    outside = canary.location
    shard, index = canary.shards[0].path, canary.shards[0].index
    os.symlink(os.path.join(outside, shard), os.path.join(ds.location, "link.tar"))
    os.symlink(os.path.join(outside, index), os.path.join(ds.location, "link.idx"))
    return {
        "dotdot": (f"../outside/{shard}", f"../outside/{index}"),
        "absolute": (os.path.join(outside, shard), os.path.join(outside, index)),
        "file_url": (f"file://{outside}/{shard}", f"file://{outside}/{index}"),
        "local_url": (f"local://{outside}/{shard}", f"local://{outside}/{index}"),
        "symlink": ("link.tar", "link.idx"),
    }


ESCAPES = ("dotdot", "absolute", "file_url", "local_url", "symlink")


@pytest.mark.parametrize("entry", READERS)
@pytest.mark.parametrize("escape", ESCAPES)
def test_an_entry_leaving_the_dataset_is_refused_naming_manifest_and_entry(tmp_path, datasets, escape, entry):
    ds, canary = datasets
    path, index = _escapes(tmp_path, ds, canary)[escape]
    manifest_file = _point_shard_at(ds, canary, path, index)
    outcome = run_entry(entry, ds.location, timeout_s=120)
    message = _refused(outcome, manifest_file, "shard 0 path", "allowed_prefixes")
    assert "outside the dataset" in message or "leaves the dataset" in message


@pytest.mark.parametrize("entry", ("stream", "indexed", "verify"))
@pytest.mark.parametrize("escape", ("dotdot", "absolute", "symlink"))
def test_a_location_the_user_allows_is_read(tmp_path, datasets, escape, entry):
    ds, canary = datasets
    path, index = _escapes(tmp_path, ds, canary)[escape]
    _point_shard_at(ds, canary, path, index)
    prefix = canary.location + "/"
    options = {"allow_prefix": [prefix]} if entry == "verify" else {"source_options": {"allowed_prefixes": [prefix]}}
    _read_ok(run_entry(entry, ds.location, options=options, timeout_s=120), CANARY)


def test_a_neighbour_folder_sharing_the_prefix_is_not_allowed(tmp_path, datasets):
    ds, canary = datasets
    # '/x/outside' must not admit '/x/outsider/...'
    neighbour = str(tmp_path / "outsider")
    shutil.copytree(canary.location, neighbour)
    _point_shard_at(ds, canary, os.path.join(neighbour, canary.shards[0].path), os.path.join(neighbour, canary.shards[0].index))
    options = {"source_options": {"allowed_prefixes": [canary.location]}}
    _refused(run_entry("stream", ds.location, options=options, timeout_s=120), "shard 0 path", "outsider")


# ------------------------------------------------------------ pipes and FIFOs


@pytest.mark.parametrize("entry", READERS)
def test_a_pipe_entry_is_refused_even_with_allow_pipe_and_never_runs(tmp_path, datasets, entry):
    ds, canary = datasets
    marker = tmp_path / "ran"
    manifest_file = _point_shard_at(ds, canary, f"pipe:touch {marker}", f"pipe:touch {marker}")
    options = {} if entry == "verify" else {"source_options": {"allow_pipe": True}}
    outcome = run_entry(entry, ds.location, options=options, timeout_s=120)
    _refused(outcome, manifest_file, "pipe:", "never runs commands")
    assert not marker.exists()


@pytest.mark.parametrize("entry", READERS)
@pytest.mark.parametrize("what", ("shard", "index"))
def test_a_fifo_in_the_manifest_is_an_error_not_a_hang(datasets, what, entry):
    ds, _ = datasets
    name = ds.shards[0].path if what == "shard" else ds.shards[0].index
    fifo = os.path.join(ds.location, name)
    os.remove(fifo)
    os.mkfifo(fifo)
    # Every reader loads a shard's index when the manifest names one (it
    # checks each sample's span), whole shards included.
    _refused(run_entry(entry, ds.location, timeout_s=60), fifo, "FIFO", "not a regular file")


@pytest.mark.parametrize("entry", ("stream", "indexed", "verify", "info"))
def test_a_fifo_as_the_manifest_is_an_error_not_a_hang(datasets, entry):
    ds, _ = datasets
    file = os.path.join(ds.location, MANIFEST_NAME)
    os.remove(file)
    os.mkfifo(file)
    _refused(run_entry(entry, ds.location, timeout_s=60), file, "FIFO")


# ------------------------------------------------------------------- sizes


@pytest.mark.parametrize("entry", READERS)
@pytest.mark.parametrize("change", ("longer", "shorter"))
def test_a_shard_of_another_size_than_the_manifest_says_is_refused(datasets, change, entry):
    ds, _ = datasets
    path = os.path.join(ds.location, ds.shards[0].path)
    if change == "longer":
        with open(path, "ab") as f:  # past the end marker: the tar itself still parses
            f.write(b"\0" * 512)
    else:
        os.truncate(path, ds.shards[0].num_bytes - 512)
    outcome = run_entry(entry, ds.location, timeout_s=120)
    message = _refused(outcome, path)
    assert str(ds.shards[0].num_bytes) in message
    if entry != "verify":
        assert outcome.error_type == ("CorruptShardError" if change == "longer" else "TruncatedShardError")


# -------------------------------------------------------- manifest parsing


def _write_manifest(ds, text: str | bytes) -> str:
    file = os.path.join(ds.location, MANIFEST_NAME)
    with open(file, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    return file


def _valid_manifest_with(ds, **changes) -> str:
    data = json.loads(ds.to_format1_json())
    data.update(changes)
    return json.dumps(data)


ABSURD = {
    "nested": lambda ds: "[" * 100_000,
    "nested_in_a_field": lambda ds: _valid_manifest_with(ds).replace('"seed": null', '"seed": ' + "[" * 50_000 + "]" * 50_000),
    "shards_a_string": lambda ds: _valid_manifest_with(ds, shards="shard-000000.tar"),
    "shards_an_object": lambda ds: _valid_manifest_with(ds, shards={"path": "x"}),
    "negative_count": lambda ds: _valid_manifest_with(ds, shards=[dict(json.loads(ds.to_format1_json())["shards"][0], num_samples=-1)]),
    "float_size": lambda ds: _valid_manifest_with(ds, shards=[dict(json.loads(ds.to_format1_json())["shards"][0], num_bytes=1.5)]),
    "huge_int": lambda ds: _valid_manifest_with(ds).replace('"num_bytes": ', '"num_bytes": ' + "9" * 5000 + ", \"x\": ", 1),
    "big_int": lambda ds: _valid_manifest_with(ds, shards=[dict(json.loads(ds.to_format1_json())["shards"][0], num_bytes=2**70)]),
}


#: The two cases the issue names go through every entry point that loads a
#: manifest; the others share their parsing path, so one entry point each.
ABSURD_RUNS = [
    (case, entry)
    for case in sorted(ABSURD)
    for entry in (("stream", "indexed", "verify", "info") if case in ("nested", "shards_a_string") else ("stream",))
]


@pytest.mark.parametrize(("case", "entry"), ABSURD_RUNS)
def test_an_absurd_manifest_is_a_manifest_error(datasets, case, entry):
    ds, _ = datasets
    file = _write_manifest(ds, ABSURD[case](ds))
    outcome = run_entry(entry, ds.location, timeout_s=60)
    message = _refused(outcome, file)
    assert "RecursionError" not in message and "Traceback" not in outcome.child_output
    if outcome.exit_code is None:
        assert outcome.error_type == "ManifestError"


def test_a_manifest_over_the_size_limit_is_refused_before_it_is_read(datasets):
    from shardkit.format.manifest import MAX_MANIFEST_BYTES

    ds, _ = datasets
    file = os.path.join(ds.location, MANIFEST_NAME)
    os.truncate(file, MAX_MANIFEST_BYTES + 1)  # sparse: costs no disk
    outcome = run_entry("stream", ds.location, timeout_s=60, mem_mb=256)
    assert _refused(outcome, file, "more than a manifest may hold")


# ------------------------------------------------------------------ HTTP


@pytest.fixture
def two_servers():
    first, second = FaultyHTTPServer().start(), FaultyHTTPServer().start()
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _serve(server: FaultyHTTPServer, folder: str, prefix: str) -> str:
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            server.add(f"{prefix}/{name}", f.read())
    return server.base_url + prefix


@pytest.mark.parametrize("entry", ("stream", "indexed", "verify"))
def test_a_remote_manifest_cannot_send_the_reader_to_another_host(datasets, two_servers, entry):
    ds, canary = datasets
    first, second = two_servers
    other = _serve(second, canary.location, "/canary")
    _point_shard_at(ds, canary, f"{other}/{canary.shards[0].path}", f"{other}/{canary.shards[0].index}")
    base = _serve(first, ds.location, "/data")
    outcome = run_entry(entry, base + "/", timeout_s=120)
    _refused(outcome, f"{base}/{MANIFEST_NAME}", "shard 0 path", other, "allowed_prefixes")
    assert first.gets(f"/data/{MANIFEST_NAME}")  # the manifest was read...
    assert second.requests == []  # ...and the other host never contacted

    options = {"allow_prefix": [other + "/"]} if entry == "verify" else {"source_options": {"allowed_prefixes": [other + "/"]}}
    _read_ok(run_entry(entry, base + "/", options=options, timeout_s=120), CANARY)
    assert second.requests


@pytest.mark.parametrize("entry", ("stream", "indexed"))
def test_a_remote_manifest_cannot_climb_out_of_its_prefix(datasets, two_servers, entry):
    ds, canary = datasets
    first, _ = two_servers
    _serve(first, canary.location, "/canary")
    for shard in ("../canary/" + canary.shards[0].path, "%2e%2e/canary/" + canary.shards[0].path):
        _point_shard_at(ds, canary, shard, "../canary/" + canary.shards[0].index)
        base = _serve(first, ds.location, "/data")
        first.requests.clear()
        _refused(run_entry(entry, base + "/", timeout_s=120), "leaves the dataset", shard)
        assert not [p for m, p, r in first.requests if "canary" in p]


@pytest.mark.parametrize("entry", ("stream", "indexed"))
def test_a_remote_shard_of_another_size_is_refused(datasets, two_servers, entry):
    ds, _ = datasets
    first, _ = two_servers
    base = _serve(first, ds.location, "/data")
    name = ds.shards[0].path
    with open(os.path.join(ds.location, name), "rb") as f:
        first.add(f"/data/{name}", f.read() + b"\0" * 512)
    outcome = run_entry(entry, base + "/", timeout_s=120)
    _refused(outcome, f"{base}/{name}", str(ds.shards[0].num_bytes))
    assert outcome.error_type == "CorruptShardError"


# ---------------------------------------------------------------- positive


@pytest.mark.parametrize("entry", READERS)
def test_a_normal_dataset_still_reads(datasets, entry):
    ds, _ = datasets
    _read_ok(run_entry(entry, ds.location, timeout_s=120), NUM)


@pytest.mark.parametrize("entry", ("stream", "indexed", "verify"))
def test_an_http_served_dataset_still_reads(datasets, two_servers, entry):
    ds, _ = datasets
    first, _ = two_servers
    base = _serve(first, ds.location, "/data")
    _read_ok(run_entry(entry, base + "/", timeout_s=120), NUM)


# ------------------------------------------------------- the rule, in-process


@pytest.mark.parametrize(
    ("entry", "prefix", "allowed"),
    [
        ("https://a/x/s.tar", "https://a/x/", True),
        ("https://A/x/s.tar", "https://a/x", True),
        ("https://a/x/../y/s.tar", "https://a/x/", False),
        ("https://a/x/%2e%2e/y/s.tar", "https://a/x/", False),
        ("https://a/x/..%2fy/s.tar", "https://a/x/", False),
        ("https://a/xy/s.tar", "https://a/x/", False),
        ("https://a/xy/s.tar", "https://a/x", False),
        ("https://a:8443/x/s.tar", "https://a/x/", False),
        ("https://user@a/x/s.tar", "https://a/x/", False),
        ("http://a/x/s.tar", "https://a/x/", False),
    ],
)
def test_allowed_prefixes_match_normalised_urls(entry, prefix, allowed):
    from shardkit.errors import ManifestError
    from shardkit.format.location import resolve_inside

    if allowed:
        assert resolve_inside("https://h/data", entry, allowed_prefixes=(prefix,)) == entry
    else:
        with pytest.raises(ManifestError, match="outside the dataset"):
            resolve_inside("https://h/data", entry, allowed_prefixes=(prefix,))


@pytest.mark.parametrize("prefix", ["pipe:", "pipe:cat", "relative/dir", "/a/../b", ""])
def test_a_bad_allowed_prefix_is_a_usage_error(prefix):
    from shardkit import SourceOptions, UsageError

    with pytest.raises(UsageError, match="allowed_prefixes"):
        SourceOptions(allowed_prefixes=(prefix,))


def test_a_pipe_entry_is_refused_whatever_the_prefixes():
    from shardkit.errors import ManifestError
    from shardkit.format.location import resolve_inside

    with pytest.raises(ManifestError, match="never runs commands"):
        resolve_inside("/data/ds", "pipe:cat /data/ds/x.tar", allowed_prefixes=("/",))


def test_entries_inside_the_dataset_resolve_under_its_base():
    from shardkit.format.location import resolve_inside

    assert resolve_inside("/data/ds", "./a//b.tar") == "/data/ds/a/b.tar"
    assert resolve_inside("https://h/data", "a/b.tar?v=1") == "https://h/data/a/b.tar?v=1"
    assert resolve_inside("https://h/data/", "./a:b.tar") == "https://h/data/a:b.tar"


# ------------------------------------------------ a symlink swapped after the check


def _relink(link: str, target: str) -> None:
    """Point the symlink ``link`` at ``target`` in one step (a rename)."""
    os.symlink(target, link + ".new")
    os.replace(link + ".new", link)


@pytest.fixture
def swapped(tmp_path, monkeypatch):
    """A dataset whose shard and index are symlinks into its own ``data/``
    folder, and a hook that, each time a manifest entry is resolved, shows
    the resolution the links inside the dataset and then swaps them to an
    identical copy outside it: the race an attacker who can write in the
    dataset folder would try to win, won every time, with no timing."""
    root = str(tmp_path / "ds")
    ds = build_dataset(root, [NUM])
    os.makedirs(os.path.join(root, "data"))
    os.makedirs(str(tmp_path / "outside"))
    links = {}
    for name in (ds.shards[0].path, ds.shards[0].index):
        os.replace(os.path.join(root, name), os.path.join(root, "data", name))
        shutil.copy(os.path.join(root, "data", name), str(tmp_path / "outside" / name))
        os.symlink(os.path.join("data", name), os.path.join(root, name))
        links[name] = (os.path.join(root, name), os.path.join("data", name), str(tmp_path / "outside" / name))

    resolve = Manifest.resolve

    def resolve_then_swap(self, relative, **kwargs):
        link, inside, outside = links[relative]
        _relink(link, inside)
        resolved = resolve(self, relative, **kwargs)
        _relink(link, outside)
        return resolved

    monkeypatch.setattr(Manifest, "resolve", resolve_then_swap)
    return root


def _swap_refused(message: str) -> None:
    assert "outside the dataset" in message and "changed after the manifest entry was checked" in message, message


@pytest.mark.parametrize("entry", ["stream", "indexed", "verify"])
def test_a_symlink_swapped_after_resolution_is_refused_on_the_opened_file(swapped, entry):
    with pytest.raises((ManifestError, VerifyError)) as caught:
        if entry == "stream":
            list(ShardDataset(swapped, shuffle=False))
        elif entry == "indexed":
            IndexedDataset(swapped)[0]
        else:
            verify_dataset(swapped)
    _swap_refused(str(caught.value))


def test_a_swapped_shard_and_index_are_refused_by_the_sources_themselves(swapped):
    from shardkit.format.manifest import load_manifest
    from shardkit.io.index import fetch_offset_index

    manifest = load_manifest(swapped)
    with pytest.raises(ManifestError) as caught:
        b"".join(open_source(manifest.shard_url(0)).iter_range(0, None, chunk_bytes=1 << 16))
    _swap_refused(str(caught.value))
    with pytest.raises(ManifestError) as caught:
        open_source(manifest.shard_url(0)).read_at(0, 512)
    _swap_refused(str(caught.value))
    with pytest.raises(ManifestError) as caught:
        fetch_offset_index(manifest.index_url(0), num_samples=NUM)
    _swap_refused(str(caught.value))


def test_a_symlink_inside_the_dataset_still_reads(tmp_path):
    root = str(tmp_path / "ds")
    ds = build_dataset(root, [NUM])
    os.makedirs(os.path.join(root, "data"))
    name = ds.shards[0].path
    os.replace(os.path.join(root, name), os.path.join(root, "data", name))
    os.symlink(os.path.join("data", name), os.path.join(root, name))
    assert len(list(ShardDataset(root, shuffle=False))) == NUM
    assert len(IndexedDataset(root)) == NUM and IndexedDataset(root)[NUM - 1] is not None
    assert verify_dataset(root).num_samples_checked == NUM
