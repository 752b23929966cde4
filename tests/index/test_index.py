"""`shardkit index`: published shards (webdataset.ShardWriter, GNU tar, img2dataset's layout)
indexed in place or into --out, then read by every reader feature as webdataset reads them."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from shardkit import IndexOptions, ShardDataset, index_dataset, load_manifest
from shardkit.cli import main
from shardkit.errors import CorruptShardError, DestinationError, ManifestError, MissingShardError, UsageError
from shardkit.format.manifest import Manifest
from tests.conftest import paused_run

webdataset = pytest.importorskip("webdataset")

ONE = IndexOptions(workers=1)


def _payload(i: int, size: int) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(size))


def write_wds(folder, *, num=23, per_shard=5, pattern="s-%05d.tar", prefix="k") -> list[str]:
    """webdataset.ShardWriter shards with img2dataset's sidecars beside them."""
    os.makedirs(folder, exist_ok=True)
    with webdataset.ShardWriter(os.path.join(str(folder), pattern), maxcount=per_shard, verbose=0) as sink:
        for i in range(num):
            sink.write({"__key__": f"{prefix}{i:04d}", "jpg": _payload(i, 700 + 13 * i), "cls": str(i % 3).encode(),
                        "json": json.dumps({"i": i}).encode()})
    shards = sorted(os.path.join(str(folder), n) for n in os.listdir(folder) if n.endswith(".tar"))
    for n, shard in enumerate(shards):  # what img2dataset writes beside each shard
        with open(os.path.join(str(folder), f"{n:05d}.parquet"), "wb") as f:
            f.write(b"PAR1 not a shard")
        with open(os.path.join(str(folder), f"{n:05d}_stats.json"), "w") as f:
            f.write("{}")
    return shards


def write_gnu_tar(folder, *, num=9) -> str:
    """A shard made by GNU tar from a folder tree (directory entries first, dotted-free keys)."""
    tree = os.path.join(str(folder), "tree")
    os.makedirs(os.path.join(tree, "imgs"))
    for i in range(num):
        with open(os.path.join(tree, "imgs", f"g{i:03d}.jpg"), "wb") as f:
            f.write(_payload(i, 300 + i))
        with open(os.path.join(tree, "imgs", f"g{i:03d}.txt"), "wb") as f:
            f.write(f"caption {i}".encode())
    shard = os.path.join(str(folder), "gnu", "gnu-000.tar")
    os.makedirs(os.path.dirname(shard))
    names = ["imgs"] + [f"imgs/g{i:03d}.{e}" for i in range(num) for e in ("jpg", "txt")]
    subprocess.run(["tar", "--format=gnu", "--no-recursion", "-cf", shard, "-C", tree, *names], check=True)
    shutil.rmtree(tree)
    return shard


def wds_samples(shards: list[str]) -> dict[str, dict[str, bytes]]:
    out = {}
    for sample in webdataset.WebDataset(shards, shardshuffle=False, empty_check=False):
        out[sample["__key__"]] = {k: v for k, v in sample.items() if not k.startswith("__")}
    return out


def as_dict(samples) -> dict[str, dict[str, bytes]]:
    out = {}
    for sample in samples:
        key = sample["__key__"]
        assert key not in out, f"sample {key} twice"
        out[key] = {k: v for k, v in sample.items() if not k.startswith("__")}
    return out


@pytest.fixture
def published(tmp_path):
    src = tmp_path / "src"
    shards = write_wds(src)
    return src, shards


def test_index_in_place_reads_sample_for_sample_as_webdataset(published):
    src, shards = published
    report = index_dataset(str(src), options=IndexOptions(workers=2))
    assert report.num_indexed == len(shards) and not report.skipped
    manifest = load_manifest(str(src))
    assert manifest.num_samples == 23 and manifest.shards_base is None
    assert set(manifest.extensions) == {"cls", "jpg", "json"}  # the parquet and stats sidecars are no shards
    expected = wds_samples(shards)
    assert as_dict(ShardDataset(str(src), mode="exact", shuffle=False)) == expected
    # per-sample split over 3 ranks, balanced: 7 each, disjoint, at sample precision inside shards
    seen: dict[str, dict[str, bytes]] = {}
    for rank in range(3):
        part = as_dict(ShardDataset(str(src), rank=rank, world_size=3, seed=1))
        assert len(part) == 23 // 3 and not set(part) & set(seen)
        seen.update(part)
    assert all(seen[k] == expected[k] for k in seen)


def test_index_out_declares_the_shards_base_and_every_reader_feature_works(tmp_path, published):
    import torch

    from shardkit import IndexedDataset, Stream

    src, shards = published
    gnu = write_gnu_tar(tmp_path)
    out = tmp_path / "idx"
    os.chmod(src, 0o555)  # read-only shards: the index goes to --out
    try:
        report = index_dataset([*shards, gnu], out=str(out), options=ONE)
    finally:
        os.chmod(src, 0o755)
    manifest = load_manifest(str(out))
    assert manifest.shards_base == str(tmp_path) and report.manifest.num_shards == len(shards) + 1
    assert main(["verify", str(out), "-q"]) == 0
    assert not any(n.endswith(".idx") for n in os.listdir(src))  # nothing written beside the shards
    expected = wds_samples([*shards, gnu])
    assert len(expected) == 32
    # streaming through a real DataLoader with 2 workers: every sample once
    loader = torch.utils.data.DataLoader(ShardDataset(str(out), mode="exact", seed=3), batch_size=None, num_workers=2)
    assert as_dict(loader) == expected
    # random access agrees
    indexed = IndexedDataset(str(out))
    assert len(indexed) == 32
    assert as_dict(indexed[i] for i in range(len(indexed))) == expected
    # resume mid-epoch: the rest, every sample once overall
    ds = ShardDataset(str(out), mode="exact", seed=5)
    it = iter(ds)
    first = [next(it) for _ in range(11)]
    state = ds.state_dict()
    again = ShardDataset(str(out), mode="exact", seed=5)
    again.load_state_dict(state)
    assert as_dict(first + list(again)) == expected
    # a mixture of the index and a second index of the same shards
    other = tmp_path / "idx2"
    index_dataset(str(src), out=str(other), options=ONE)
    mixed = ShardDataset([Stream(str(out), samples=32), Stream(str(other), samples=23)], mode="exact", shuffle=False)
    keys = [s["__key__"] for s in mixed]
    assert sorted(keys) == sorted(list(expected) + [k for k in expected if k.startswith("k")])


def test_rerun_reads_only_new_or_changed_shards_and_drops_removed_ones(tmp_path, published):
    src, shards = published
    out = str(tmp_path / "idx")
    assert index_dataset(str(src), out=out, options=ONE).num_indexed == 5
    again = index_dataset(str(src), out=out, options=ONE)
    assert (again.num_indexed, again.num_unchanged, again.num_removed) == (0, 5, 0)
    # rewrite one shard (another size), remove one, add one
    with webdataset.TarWriter(shards[1]) as sink:
        sink.write({"__key__": "new0", "jpg": b"x" * 10})
    os.unlink(shards[4])
    shutil.copy(shards[0], os.path.join(src, "t-00000.tar"))
    report = index_dataset(str(src), out=out, options=ONE)
    assert (report.num_indexed, report.num_unchanged, report.num_removed) == (2, 3, 1)
    assert not os.path.exists(os.path.join(out, "s-00004.idx"))
    remaining = [shards[0], shards[1], shards[2], shards[3], os.path.join(src, "t-00000.tar")]
    assert [s["__key__"] for s in ShardDataset(out, mode="exact", shuffle=False)] == [
        s["__key__"] for s in webdataset.WebDataset(remaining, shardshuffle=False)
    ]
    assert sum(n.endswith(".table") for n in os.listdir(out)) == 1


def test_compressed_shards_are_counted_and_stream_only(tmp_path, published, caplog):
    src, shards = published
    with open(shards[0], "rb") as f, gzip.GzipFile(os.path.join(src, "z-00000.tar.gz"), "wb", mtime=0) as g:
        g.write(f.read())
    report = index_dataset(str(src), options=ONE)
    assert report.num_compressed == 1 and report.manifest.num_samples == 28
    assert not os.path.exists(os.path.join(src, "z-00000.tar.gz.idx"))
    assert sum("stream-only" in r.getMessage() for r in caplog.records) == 1
    keys = [s["__key__"] for s in ShardDataset(str(src), mode="exact", shuffle=False)]
    assert len(keys) == 28 and len(set(keys)) == 23


def test_verify_checks_compressed_shards_whole_and_warns_they_are_stream_only(tmp_path, published, capsys):
    from shardkit.verify import verify_dataset

    src, shards = published
    gz = os.path.join(src, "z-00000.tar.gz")
    with open(shards[0], "rb") as f, gzip.GzipFile(gz, "wb", mtime=0) as g:
        g.write(f.read())
    index_dataset(str(src), options=ONE)
    report = verify_dataset(str(src))
    assert report.num_shards_checked == 6 and report.num_samples_checked == 28 and report.num_stream_only == 1
    assert [w for w in report.warnings if "stream-only" in w] == [
        f"{gz}: gzip-compressed, stream-only: size, SHA-256, tar structure and sample count checked; no offset "
        "index or per-sample checksums to check (readers read it whole, shard by shard)"
    ]
    assert main(["verify", str(src), "-q"]) == 0
    captured = capsys.readouterr()
    assert "(1 compressed shards stream-only: no offset index to check)" in captured.out
    assert f"WARNING: {gz}: gzip-compressed, stream-only" in captured.err
    # what it can check, it does: a byte changed inside the compressed stream fails, naming the shard
    data = bytearray(open(gz, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(gz, "wb").write(bytes(data))
    assert main(["verify", str(src), "-q"]) == 1
    assert f"FAILED: {gz}: " in capsys.readouterr().err


def test_truncated_shard_is_skipped_with_its_reason_and_the_others_indexed(tmp_path, published, capsys):
    src, shards = published
    with open(shards[2], "r+b") as f:
        f.truncate(3000)
    shutil.copy(shards[0], tmp_path / "outside.tar")
    os.symlink(tmp_path / "outside.tar", src / "link-out.tar")  # leads out of the folder: left out, said why
    code = main(["index", str(src), "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert "s-00002.tar" in err and "truncated" in err and "rerun `shardkit index`" in err
    manifest = load_manifest(str(src))
    assert manifest.num_shards == 4 and [s.path for s in manifest.skipped] == ["link-out.tar", "s-00002.tar"]
    assert "outside the folder" in manifest.skipped[0].reason
    assert len(list(ShardDataset(str(src), mode="exact"))) == 18
    # verify checks the shards the manifest lists, and says that some were left out
    assert main(["verify", str(src), "-q"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 4 shards, 18 samples") and "2 inputs left out when it was made" in out and "shardkit info" in out


def test_a_folder_of_which_no_shard_can_be_indexed_fails_and_publishes_nothing(tmp_path, published, capsys):
    src, shards = published
    for shard in shards:
        with open(shard, "r+b") as f:
            f.truncate(700)
    assert main(["index", str(src), "-q"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"{src}: no shard could be indexed (all 5 shards left out); the first: {shards[0]}: " in err
    assert "truncated" in err and "Nothing was published" in err and "run `shardkit index` again" in err
    assert not (src / "manifest.json").exists() and not (src / ".shardkit-index.journal").exists()
    assert not [n for n in os.listdir(src) if n.endswith((".idx", ".table"))]


def test_a_shard_changed_or_gone_after_indexing_is_a_one_line_error_naming_it(published):
    src, shards = published
    index_dataset(str(src), options=ONE)
    with open(shards[1], "ab") as f:
        f.write(bytes(512))
    with pytest.raises(CorruptShardError) as info:
        list(ShardDataset(str(src), mode="exact", shuffle=False))
    assert "s-00001.tar" in str(info.value) and "shardkit index" in str(info.value) and "\n" not in str(info.value)
    index_dataset(str(src), options=ONE)  # reindexed: reads again
    os.unlink(shards[3])
    with pytest.raises(MissingShardError) as gone:  # also a FileNotFoundError
        list(ShardDataset(str(src), mode="exact", shuffle=False))
    assert "s-00003.tar: shard missing" in str(gone.value) and "shardkit index" in str(gone.value)
    assert "\n" not in str(gone.value)


def test_out_holding_another_dataset_is_refused_in_one_line(tmp_path, published, make_shards, capsys):
    src, _ = published
    other = make_shards([3], name="written")  # a dataset `shardkit write` made
    with pytest.raises(DestinationError, match="another dataset"):
        index_dataset(str(src), out=other.location, options=ONE)
    index_dataset(str(src), out=str(tmp_path / "a"), options=ONE)
    elsewhere = tmp_path / "elsewhere"
    write_wds(elsewhere, num=4)
    assert main(["index", str(elsewhere), "--out", str(tmp_path / "a"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "another dataset" in err and "index of" in err


def test_shards_base_is_confined(tmp_path, published):
    src, shards = published
    out = tmp_path / "idx"
    index_dataset(str(src), out=str(out), options=ONE)
    data = json.loads((out / "manifest.json").read_text())
    for bad in ("relative/dir", "pipe:cat /etc/passwd", "https://user:pw@host/data", str(src) + "/../x"):
        with pytest.raises(ManifestError, match="shards_base"):
            Manifest.from_dict({**data, "shards_base": bad}, location=str(out))
    # a manifest fetched from a URL never sends the reader to local files
    with pytest.raises(ManifestError, match="came from a URL"):
        Manifest.from_dict(data, location="https://example.org/ds", open_table=lambda *a: load_manifest(str(out)).table)
    # shard entries stay under the declared base
    manifest = load_manifest(str(out))
    with pytest.raises(ManifestError, match="leaves the dataset"):
        manifest.resolve("../etc/passwd", shard=True)


def test_remote_shards_over_http_indexed_into_out(tmp_path, published, http_server):
    src, shards = published
    for shard in shards:
        http_server.add("/data/" + os.path.basename(shard), open(shard, "rb").read())
    url = http_server.base_url + "/data/s-{00000..00004}.tar"
    out = str(tmp_path / "idx")
    report = index_dataset(url, out=out, options=IndexOptions(workers=2))
    assert report.num_indexed == 5 and load_manifest(out).shards_base == http_server.base_url + "/data"
    assert as_dict(ShardDataset(out, mode="exact", shuffle=False)) == wds_samples(shards)
    assert index_dataset(url, out=out, options=ONE).num_unchanged == 5  # same sizes: not read again
    with pytest.raises(UsageError, match=r"remote shards are indexed where --out says.*the shards' own URL"):
        index_dataset(url, options=ONE)  # nothing is written into someone's bucket unasked


@pytest.mark.parametrize("validator", ["ETag", "Last-Modified"])
def test_http_rerun_reads_a_shard_again_when_its_etag_or_last_modified_changes(tmp_path, published, http_server,
                                                                               validator):
    """Rewritten in place with the same size, an object is read again when the
    server's ETag (or, without one, Last-Modified) says it changed; the size
    alone would keep a stale entry."""
    src, shards = published
    paths = ["/data/" + os.path.basename(shard) for shard in shards]
    for n, (path, shard) in enumerate(zip(paths, shards)):
        http_server.add(path, open(shard, "rb").read())
        http_server.extra_headers[path] = {validator: f'"v1-{n}"' if validator == "ETag" else
                                           f"Mon, 0{n + 1} Jan 2024 00:00:00 GMT"}
    url = http_server.base_url + "/data/s-{00000..00004}.tar"
    out = str(tmp_path / "idx")
    assert index_dataset(url, out=out, options=ONE).num_indexed == 5
    again = index_dataset(url, out=out, options=ONE)
    assert again.num_unchanged == 5 and again.num_indexed == 0
    assert again.manifest.extensions == ("cls", "jpg", "json")  # kept with the entries
    # shard 1 rewritten in place: the same size, its first sample's payload reversed
    old = http_server.objects[paths[1]]
    first = list(wds_samples([shards[1]]).values())[0]["jpg"]
    new = old.replace(first, first[::-1], 1)
    assert new != old and len(new) == len(old)
    http_server.objects[paths[1]] = new
    http_server.extra_headers[paths[1]] = {validator: '"v2-1"' if validator == "ETag" else
                                           "Tue, 02 Jan 2024 00:00:00 GMT"}
    third = index_dataset(url, out=out, options=ONE)
    assert third.num_indexed == 1 and third.num_unchanged == 4
    manifest = load_manifest(out)
    assert manifest.shards[1].sha256 == hashlib.sha256(new).hexdigest()
    assert manifest.shards[2].sha256 == hashlib.sha256(http_server.objects[paths[2]]).hexdigest()


def _card_data_files(folder) -> list[str]:
    import yaml

    card = (folder / "README.md").read_text()
    return yaml.safe_load(card.split("---\n")[1])["configs"][0]["data_files"][0]["path"]


def test_card_of_an_out_index_names_shards_under_it_relatively_and_others_by_their_base(tmp_path, published):
    """What the Hub and `datasets` get from the card an `--out` index writes:
    shards under the card's folder by relative patterns (the folder works
    wherever it is copied or uploaded); shards elsewhere by the declared
    base: an absolute path (`datasets` on this machine reads it, the Hub has
    no such file) or a URL (`datasets` globs it through fsspec)."""
    import functools
    import http.server
    import threading

    datasets = pytest.importorskip("datasets")
    src, shards = published
    expected = {k: v["cls"] for k, v in wds_samples(shards).items()}

    def rows(folder) -> dict[str, bytes]:
        loaded = datasets.load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "hf" / folder.name))
        return {row["__key__"]: str(row["cls"]).encode() for row in loaded.select_columns(["__key__", "cls"])}

    # shards under the card's folder: relative, as for a dataset `write` made
    index_dataset(str(src), out=str(tmp_path), options=ONE)
    assert _card_data_files(tmp_path) == ["src/s-*.tar"]
    assert rows(tmp_path) == expected
    # shards elsewhere on this machine: the absolute base
    elsewhere = tmp_path / "elsewhere"
    index_dataset(str(src), out=str(elsewhere), options=ONE)
    assert _card_data_files(elsewhere) == [f"{src}/s-*.tar"]
    assert rows(elsewhere) == expected
    # shards behind a URL: the URL, which `datasets` globs where the server lists the folder
    serve = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(src))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), serve)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        remote = tmp_path / "remote"
        index_dataset(base + "/s-{00000..00004}.tar", out=str(remote), options=ONE)
        assert _card_data_files(remote) == [f"{base}/s-*.tar"]
        assert rows(remote) == expected
    finally:
        server.shutdown()
        server.server_close()


def test_cli_index_runs_as_a_module(tmp_path, published):
    src, _ = published
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, "-m", "shardkit", "index", str(src), "--out", str(tmp_path / "o"), "--workers", "1"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "indexed 5 shards (5 read, 0 unchanged, 0 removed), 23 samples" in run.stdout
    table = load_manifest(str(tmp_path / "o")).table
    assert np.array_equal(table.counts, [5, 5, 5, 5, 3])


def test_info_of_an_indexed_dataset_says_no_write_options_were_recorded(tmp_path, published, capsys):
    src, _ = published
    assert main(["index", str(src), "--out", str(tmp_path / "o"), "-q"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "o")]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines() if ":" in line)
    assert lines["options"].strip() == "none recorded"
    assert lines["samples"].strip() == "23"


_KILLED_INDEX = """
import os, signal, sys
from shardkit import IndexOptions, index_dataset
done = []
def progress(result):
    done.append(result)
    if len(done) == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup runs: as the OOM killer leaves it
index_dataset(sys.argv[1], out=sys.argv[2], options=IndexOptions(workers=1), progress=progress)
"""


def _index_killed_after(src, out, shards: int) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED_INDEX, str(src), str(out), str(shards)], timeout=120)
    assert proc.returncode == -9


def test_a_killed_index_run_is_gone_on_from_by_its_rerun_to_the_same_dataset(tmp_path):
    """Indexing 10^5 shards over HTTP takes hours: a run killed near its end
    must not start again from the first shard. The rerun keeps what the killed
    run read (its journal in the index folder), reads the rest, and publishes
    the dataset a run that was never killed publishes; nothing is left behind."""
    shards = write_wds(tmp_path / "src", num=40, per_shard=2)  # 20 shards
    clean = index_dataset(str(tmp_path / "src"), out=str(tmp_path / "clean"), options=ONE)
    _index_killed_after(tmp_path / "src", tmp_path / "out", 7)
    left = sorted(os.listdir(tmp_path / "out"))
    assert ".shardkit-index.journal" in left and not any(n.endswith(".table") or n == "manifest.json" for n in left)
    # One shard changed since the killed run read it: read again, not taken from the journal.
    with open(shards[2], "ab") as f:
        f.write(b"\0" * 1024)
    report = index_dataset(str(tmp_path / "src"), out=str(tmp_path / "out"), options=ONE)
    assert report.num_resumed == 6 and report.num_indexed == 14
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".shardkit-index")]  # journal, scratch: gone
    mine, theirs = report.manifest, load_manifest(str(tmp_path / "clean"))
    assert mine.num_shards == theirs.num_shards == 20 and mine.extensions == theirs.extensions == clean.manifest.extensions
    assert [e.num_samples for e in mine.shards] == [e.num_samples for e in theirs.shards]
    assert [e.sha256 for e in mine.shards if e.path != "s-00002.tar"] == [
        e.sha256 for e in theirs.shards if e.path != "s-00002.tar"]
    assert as_dict(ShardDataset(str(tmp_path / "out"), mode="exact", shuffle=False)) == wds_samples(shards)


# An index that pauses after its first shard (see tests.conftest.paused_run).
_PAUSED_INDEX = """
from shardkit import IndexOptions, index_dataset
index_dataset(sys.argv[1], out=sys.argv[2], options=IndexOptions(workers=1), progress=pause)
"""


def test_an_index_or_write_into_a_folder_being_indexed_is_refused_and_the_first_index_completes(
    tmp_path, capsys, monkeypatch
):
    """Two runs into one folder would share the index's journal, or publish
    two manifests over each other: the second waits a moment for the
    folder's lock, then exits 2 in one line."""
    monkeypatch.setattr("shardkit.write.destination.LOCK_WAIT_S", 0.5)
    shards = write_wds(tmp_path / "src", num=12, per_shard=2)
    out, go = tmp_path / "out", tmp_path / "go"
    with paused_run(_PAUSED_INDEX, str(tmp_path / "src"), str(out), go=go):
        assert main(["index", str(tmp_path / "src"), "--out", str(out), "-q"]) == 2
        err = capsys.readouterr().err
        assert f"{out}: another shardkit write or index into this folder is running" in err
        assert "run the index again" in err and len(err.strip().splitlines()) == 1
        assert main(["write", str(tmp_path / "src"), str(out), "--resume", "-q"]) == 2
        assert "another shardkit write or index into this folder is running" in capsys.readouterr().err
    assert as_dict(ShardDataset(str(out), mode="exact", shuffle=False)) == wds_samples(shards)
    assert not [n for n in os.listdir(out) if n.startswith(".shardkit-index")]  # journal, scratch: gone


def test_a_journal_of_other_shards_is_not_used(tmp_path):
    write_wds(tmp_path / "src", num=30, per_shard=3)
    shutil.copytree(tmp_path / "src", tmp_path / "twin")  # the same names in another folder: other shards
    _index_killed_after(tmp_path / "src", tmp_path / "out", 4)
    assert index_dataset(str(tmp_path / "twin"), out=str(tmp_path / "out"), options=ONE).num_resumed == 0
    _index_killed_after(tmp_path / "src", tmp_path / "out2", 4)
    shutil.move(tmp_path / "src" / "s-00000.tar", tmp_path / "src" / "s-00099.tar")  # other names: other rows
    events = []
    report = index_dataset(str(tmp_path / "src"), out=str(tmp_path / "out2"), options=ONE, progress=events.append)
    assert report.num_resumed == 0 and report.num_indexed == 10
    assert len(events) == 10 and {e.num_to_read for e in events} == {10}  # the CLI bar's total
    keys = {s["__key__"] for s in ShardDataset(str(tmp_path / "out2"), mode="exact", shuffle=False)}
    assert len(keys) == 30


def test_shards_of_two_folders_given_as_double_colon_joined_patterns(tmp_path):
    """`/data/laion/{...}.tar::/data/cc12m/{...}.tar`, as webdataset and
    OpenCLIP take it: the reader, `index` and `write` read both lists in turn."""
    from shardkit.write.parallel import WriteOptions, write_dataset

    first = write_wds(tmp_path / "a", num=10, per_shard=5)  # 2 shards
    second = write_wds(tmp_path / "b", num=9, per_shard=3, pattern="t-%05d.tar", prefix="m")  # 3 shards
    text = f"{tmp_path}/a/s-{{00000..00001}}.tar::{tmp_path}/b/t-{{00000..00002}}.tar"

    def listed(samples) -> list:  # every (key, fields) pair, sorted
        return sorted((s["__key__"], sorted((k, v) for k, v in s.items() if not k.startswith("__"))) for s in samples)

    expected = listed([{"__key__": k, **v} for shards in (first, second) for k, v in wds_samples(shards).items()])
    assert len(expected) == 19 and listed(ShardDataset(text, mode="exact", shuffle=False)) == expected
    report = index_dataset(text, out=str(tmp_path / "idx"), options=ONE)
    assert report.manifest.num_shards == 5 and report.manifest.num_samples == 19
    write_dataset(text, str(tmp_path / "w"), options=WriteOptions(workers=1))
    assert listed(ShardDataset(str(tmp_path / "w"), mode="exact")) == expected
