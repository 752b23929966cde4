"""Views and extensions (issue #54): datasets over other datasets' shards,
read as one dataset, with takedowns reaching them and hostile parents refused."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import shardkit
from shardkit import IndexedDataset, ShardDataset, make_loader
from shardkit.errors import DestinationError, ManifestError, UsageError
from shardkit.format.derived import build_rows
from shardkit.format.manifest import load_manifest
from shardkit.revise.derived_publish import publish_derived
from shardkit.revise.remove import remove_samples
from tests.conftest import build_dataset
from tests.revise import derived_maps

SIZES = (9, 0, 14, 6, 11)


def _pool(tmp_path, name="pool", sizes=SIZES):
    build_dataset(str(tmp_path / name), sizes)
    return str(tmp_path / name)


def _all(source, **kwargs):
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in ShardDataset(source, **kwargs)}


def _joined_expected(pool):
    parent = _all(pool)
    return {k: {**v, **derived_maps.expected_fields({"__key__": k, **v})} for k, v in parent.items()}


def test_an_extension_reads_as_its_parent_with_the_new_fields_in_every_mode(tmp_path):
    pool = _pool(tmp_path)
    report = shardkit.extend(pool, tmp_path / "ext", map=derived_maps.embedding, workers=2)
    expected = _joined_expected(pool)
    assert report.fields == ("emb.npy", "score.txt") and report.num_samples == len(expected) == sum(SIZES)
    assert report.num_shards == len(SIZES)
    ext = str(tmp_path / "ext")
    # Parent's shards untouched; the extension holds only the new members.
    assert all(n.startswith("shard-") or n in ("manifest.json", "README.md") or n.startswith("shards-")
               for n in os.listdir(os.path.join(ext, "fields")))
    assert _all(ext, mode="exact") == expected
    loader = make_loader(ShardDataset(ext, mode="exact", seed=4), batch_size=None, num_workers=2)
    assert {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in loader} == expected
    ranks = [[s["__key__"] for s in ShardDataset(ext, mode="balanced", rank=r, world_size=3, seed=1)] for r in range(3)]
    assert len({len(r) for r in ranks}) == 1 and len(set().union(*ranks)) == sum(len(r) for r in ranks)
    indexed = IndexedDataset(ext)
    assert {indexed[i]["__key__"]: indexed[i]["emb.npy"] for i in range(len(indexed)) if "emb.npy" in indexed[i]} == {
        k: v["emb.npy"] for k, v in expected.items() if "emb.npy" in v
    }


def test_a_resumed_epoch_over_an_extension_reads_every_sample_once(tmp_path):
    pool = _pool(tmp_path)
    ext = str(tmp_path / "ext")
    shardkit.extend(pool, ext, map=derived_maps.embedding, workers=1)
    ds = ShardDataset(ext, mode="exact", seed=5, buffer_size=8)
    it = iter(ds)
    first = [next(it)["__key__"] for _ in range(17)]
    state = ds.state_dict()
    again = ShardDataset(ext, mode="exact", seed=5, buffer_size=8)
    again.load_state_dict(state)
    rest = [s["__key__"] for s in again]
    assert sorted(first + rest) == sorted(_joined_expected(pool))


def test_reading_the_new_fields_alone_opens_no_parent_shard(tmp_path):
    pool = _pool(tmp_path)
    ext = str(tmp_path / "ext")
    shardkit.extend(pool, ext, map=derived_maps.embedding, workers=1)
    expected = {k: {f: v[f] for f in ("emb.npy",) if f in v} for k, v in _joined_expected(pool).items()}
    for name in os.listdir(pool):
        if name.endswith(".tar"):
            os.unlink(os.path.join(pool, name))  # any read of the parent's data would fail now
    assert _all(ext, fields=["emb.npy"], mode="exact") == expected
    indexed = IndexedDataset(ext, fields=["emb.npy"])
    assert sorted(indexed[i]["__key__"] for i in range(len(indexed))) == sorted(expected)
    with pytest.raises(Exception, match=r"pool/shard-00000\d.tar: shard missing"):
        list(ShardDataset(ext, fields=["json"]))
    with pytest.raises(UsageError, match="no field 'nope'"):
        ShardDataset(ext, fields=["nope"])


def test_extend_refuses_a_field_the_parent_has_and_leaves_no_dataset(tmp_path):
    pool = _pool(tmp_path)
    with pytest.raises(UsageError, match="field 'json'.*already has"):
        shardkit.extend(pool, tmp_path / "ext", map=derived_maps.clashing, workers=1)
    assert not os.path.exists(tmp_path / "ext" / "manifest.json")


def test_a_killed_extend_run_again_gives_the_bytes_of_a_clean_one(tmp_path):
    pool = _pool(tmp_path)
    shardkit.extend(pool, tmp_path / "clean", map=derived_maps.slow_embedding, workers=1)
    code = ("import sys, shardkit; from tests.revise import derived_maps; "
            "shardkit.extend(sys.argv[1], sys.argv[2], map=derived_maps.slow_embedding, workers=1)")
    env = {**os.environ, "SHARDKIT_TEST_SLEEP": "0.05"}
    run = subprocess.Popen([sys.executable, "-c", code, pool, str(tmp_path / "ext")], env=env, cwd=os.getcwd())
    done = tmp_path / "ext" / ".shardkit-extend" / "done"
    deadline = time.monotonic() + 60
    while (not done.exists() or len(os.listdir(done)) < 2) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.01)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    assert not os.path.exists(tmp_path / "ext" / "manifest.json")
    report = shardkit.extend(pool, tmp_path / "ext", map=derived_maps.slow_embedding, workers=2)
    assert 0 < report.num_extended < len(SIZES)

    def files(root):
        return {n: hashlib.sha256(open(os.path.join(root, n), "rb").read()).hexdigest()
                for n in sorted(os.listdir(root)) if os.path.isfile(os.path.join(root, n))}

    assert files(tmp_path / "ext" / "fields") == files(tmp_path / "clean" / "fields")
    assert files(tmp_path / "ext") == files(tmp_path / "clean")


def test_views_keep_what_they_choose_and_merges_refuse_a_shared_key(tmp_path):
    pool = _pool(tmp_path)
    everything = _all(pool)
    high = shardkit.view(pool, tmp_path / "high", where="json.i >= 5", workers=2)
    assert _all(tmp_path / "high") == {k: v for k, v in everything.items() if json.loads(v["json"])["i"] >= 5}
    assert high.num_samples == len(_all(tmp_path / "high"))
    listed = sorted(everything)[::3]
    (tmp_path / "keys.txt").write_text("\n".join(listed + ["missing-key"]))
    shardkit.view(pool, tmp_path / "listed", keys=tmp_path / "keys.txt", workers=1)
    assert sorted(_all(tmp_path / "listed")) == listed
    # A view of a view.
    shardkit.view(tmp_path / "high", tmp_path / "high-listed", keys=listed, workers=1)
    assert sorted(_all(tmp_path / "high-listed")) == sorted(set(listed) & set(_all(tmp_path / "high")))
    # A merge of two pools, and of a pool with itself (every key twice).
    with pytest.raises(UsageError, match="same key"):
        shardkit.view([pool, tmp_path / "listed"], tmp_path / "merged", workers=1)
    with pytest.raises(DestinationError, match="holds a dataset"):
        shardkit.view(pool, tmp_path / "high", where="json.i >= 5", workers=1)
    shardkit.view(pool, tmp_path / "high", where="json.i >= 9", workers=1, overwrite=True)
    assert all(json.loads(v["json"])["i"] >= 9 for v in _all(tmp_path / "high").values())
    low = shardkit.view(pool, tmp_path / "low", where="json.i < 4", workers=1)
    merged = shardkit.view([tmp_path / "low", tmp_path / "high"], tmp_path / "merged", workers=1)
    assert _all(tmp_path / "merged") == {**_all(tmp_path / "low"), **_all(tmp_path / "high")}
    assert merged.num_samples == low.num_samples + len(_all(tmp_path / "high"))


def test_splits_never_overlap_and_keep_their_keys_when_the_pool_grows(tmp_path):
    pool = _pool(tmp_path, sizes=(40, 40, 40))
    first = shardkit.view(pool, tmp_path / "s1", split={"val": 0.2, "train": 0.8}, workers=1)
    val, train = set(_all(tmp_path / "s1" / "val")), set(_all(tmp_path / "s1" / "train"))
    assert not val & train and len(val | train) == 120 and 5 < len(val) < 45
    assert first["val"].num_samples == len(val)
    more = tmp_path / "more"
    more.mkdir()
    for i in range(30):
        (more / f"new{i:03d}.txt").write_text(f"caption {i}")
    shardkit.append(pool, str(more), options=shardkit.WriteOptions(max_samples=10))
    shardkit.view(pool, tmp_path / "s2", split={"val": 0.2, "train": 0.8}, workers=1)
    val2, train2 = set(_all(tmp_path / "s2" / "val")), set(_all(tmp_path / "s2" / "train"))
    assert val <= val2 and train <= train2 and not val2 & train2 and len(val2 | train2) == 150
    assert set(_all(tmp_path / "s1" / "val")) == val  # the old split reads as it was


def test_a_takedown_on_the_parent_reaches_every_view_and_extension(tmp_path):
    pool = _pool(tmp_path)
    shardkit.extend(pool, tmp_path / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(tmp_path / "ext", tmp_path / "ext-view", where="json.i < 6", workers=1)
    shardkit.view(pool, tmp_path / "view", where="json.i < 6", workers=1)
    shardkit.extend(tmp_path / "view", tmp_path / "view-ext", map=derived_maps.embedding, workers=1)
    before = {d: _all(tmp_path / d) for d in ("ext", "ext-view", "view", "view-ext")}
    gone = sorted(before["ext-view"])[:3]
    remove_samples(pool, gone)
    for name, samples in before.items():
        now = _all(tmp_path / name)
        assert now == {k: v for k, v in samples.items() if k not in gone}, name
        assert len(ShardDataset(tmp_path / name)) == len(now)
        indexed = IndexedDataset(tmp_path / name)
        assert sorted(indexed[i]["__key__"] for i in range(len(indexed))) == sorted(now)
    # remove on a view takes the samples out of that view (and what stands on it) alone.
    mine = sorted(_all(tmp_path / "view"))[:2]
    report = remove_samples(str(tmp_path / "view"), mine)
    assert report.num_removed == 2
    assert not set(mine) & set(_all(tmp_path / "view")) and not set(mine) & set(_all(tmp_path / "view-ext"))
    assert set(mine) <= set(_all(pool)) and set(mine) <= set(_all(tmp_path / "ext"))


def _republish(folder, **changes):
    manifest = load_manifest(str(folder))
    publish_derived(str(folder), dataclasses.replace(manifest, **changes))


def test_hostile_parents_are_refused_with_one_line(tmp_path):
    pool = _pool(tmp_path)
    view = tmp_path / "v"
    shardkit.view(pool, view, where="json.i < 6", workers=1)
    original = load_manifest(str(view))
    ref = original.parents[0]
    # A parent outside the local tree by an absolute path, or on a remote origin: opt-in only.
    _republish(view, parents=(dataclasses.replace(ref, path=os.path.abspath(pool)),))
    with pytest.raises(ManifestError, match="allowed_prefixes"):
        ShardDataset(view)
    assert len(ShardDataset(view, source_options=shardkit.SourceOptions(allowed_prefixes=[os.path.abspath(pool)])))
    _republish(view, parents=(dataclasses.replace(ref, path="http://127.0.0.1:9/pool"),))
    with pytest.raises(ManifestError, match="outside"):
        ShardDataset(view)
    # A cycle: the view names itself.
    _republish(view, parents=(dataclasses.replace(ref, path="."),))
    with pytest.raises(ManifestError, match="cycle"):
        ShardDataset(view)
    # A parent rewritten since (not removals or appends): refused naming both revisions.
    _republish(view, parents=(dataclasses.replace(ref, fingerprint="0" * 64),))
    with pytest.raises(ManifestError, match=r"made from revision 0000000000000000 of .*which is now"):
        ShardDataset(view)
    # Rows that do not match the parent's table.
    rows = original.rows
    bad = build_rows(rows.parent, rows.parent_row, rows.counts, np.zeros_like(rows.select_kind), rows.select_offsets,
                     rows.select_positions + 1000)
    _republish(view, parents=(ref,), rows=bad)
    with pytest.raises(ManifestError, match="does not match the parent's table"):
        list(ShardDataset(view))
    far = build_rows(rows.parent, rows.parent_row + 100, rows.counts, rows.select_kind, rows.select_offsets,
                     rows.select_positions)
    _republish(view, rows=far)
    with pytest.raises(ManifestError, match="names shard"):
        ShardDataset(view)


def test_a_chain_of_parents_deeper_than_the_bound_is_refused(tmp_path, monkeypatch):
    from shardkit.read import derived

    pool = _pool(tmp_path, sizes=(6,))
    last = pool
    for depth in range(4):
        shardkit.view(last, tmp_path / f"v{depth}", where=f"json.i >= {depth}", workers=1)
        last = tmp_path / f"v{depth}"
    assert len(ShardDataset(last)) == 3
    monkeypatch.setattr(derived, "MAX_PARENT_DEPTH", 3)
    with pytest.raises(ManifestError, match="more than 3 parents"):
        ShardDataset(last)


def test_info_shows_the_lineage(tmp_path, capsys):
    from shardkit.cli import main

    pool = _pool(tmp_path)
    shardkit.extend(pool, tmp_path / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(tmp_path / "ext", tmp_path / "ev", where="json.i < 6", workers=1)
    assert main(["info", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "view, where json.i < 6" in out and "extension adding emb.npy, score.txt" in out and "dataset, 40 samples" in out


def test_verify_checks_every_dataset_of_the_chain_once(tmp_path, capsys):
    from shardkit.cli import main

    pool = _pool(tmp_path)
    shardkit.extend(pool, tmp_path / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(tmp_path / "ext", tmp_path / "ev", where="json.i < 6", workers=1)
    shardkit.view([tmp_path / "ev"], tmp_path / "ev2", keys=sorted(_all(tmp_path / "ev"))[:5], workers=1)
    assert main(["verify", str(tmp_path / "ev2"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("OK: ") == 6 and out.count(f"{pool} (dataset") == 1  # pool, fields, ext, ev, ev2, the total
    shard = os.path.join(pool, "shard-000002.tar")
    data = bytearray(open(shard, "rb").read())
    data[700] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    assert main(["verify", str(tmp_path / "ev2"), "--workers", "1"]) == 1
    assert f"FAILED: {pool} (dataset" in capsys.readouterr().err
    data[700] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    rows = load_manifest(str(tmp_path / "ev2")).rows
    offsets = np.concatenate(([0], np.cumsum(rows.counts)))
    bad = build_rows(rows.parent, rows.parent_row, rows.counts, np.zeros_like(rows.select_kind), offsets,
                     np.arange(int(offsets[-1])) + 10_000)  # the right counts, of samples no shard holds
    _republish(tmp_path / "ev2", rows=bad)
    assert main(["verify", str(tmp_path / "ev2"), "--workers", "1"]) == 1
    assert f"FAILED: {tmp_path / 'ev2'} (view" in capsys.readouterr().err


def test_views_and_extensions_mix_and_show_as_any_dataset(tmp_path):
    pool = _pool(tmp_path)
    shardkit.extend(pool, tmp_path / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(tmp_path / "ext", tmp_path / "low", where="json.i < 4", workers=1)
    low, ext = _all(tmp_path / "low"), _all(tmp_path / "ext")
    mixed = ShardDataset([shardkit.Stream(str(tmp_path / "low"), weight=1), shardkit.Stream(str(tmp_path / "ext"), weight=3)],
                         samples_per_epoch=60, seed=2)
    samples = list(mixed)
    assert len(samples) == 60
    assert all(s["__key__"] in ext and {k: v for k, v in s.items() if not k.startswith("__")} == ext[s["__key__"]]
               for s in samples)
    from_view = [s["__key__"] for s in samples if s["__stream__"] == 0]
    assert len(from_view) == 15 and set(from_view) <= set(low)  # a quarter of the steps, from the view alone
    page = shardkit.show(str(tmp_path / "low"))
    assert "emb.npy" in page and "score.txt" in page


def test_token_readers_over_a_view_are_refused_with_what_to_read(tmp_path):
    pool = _pool(tmp_path)
    shardkit.view(pool, tmp_path / "v", where="json.i < 4", workers=1)
    for tokens in (shardkit.TokenBlocks("json", 64), shardkit.TokenBudget("json", 64)):
        with pytest.raises(UsageError, match="records no token counts .*from the dataset it stands on"):
            ShardDataset(tmp_path / "v", tokens=tokens)


@pytest.mark.parametrize("side", ["pool", "ext/fields"])
def test_a_damaged_sample_is_skipped_from_every_side_of_an_extension(tmp_path, side):
    """on_error='skip': the joined reader drops a sample one side lost from all sides, and the rest stay in step."""
    pool = _pool(tmp_path)
    ext = tmp_path / "ext"
    shardkit.extend(pool, ext, map=derived_maps.embedding, workers=1)
    expected = _joined_expected(pool)
    shard = os.path.join(tmp_path, side, "shard-000002.tar")
    bounds = np.load(os.path.join(tmp_path, side, "shard-000002.idx"))
    data = bytearray(open(shard, "rb").read())
    data[int(bounds[5]) + 520] ^= 0xFF  # inside sample 5's first member's data: its checksum fails
    open(shard, "wb").write(bytes(data))
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
           for s in ShardDataset(ext, mode="exact", on_error="skip", verify_checksums=True)}
    assert len(got) == len(expected) - 1
    assert all(got[k] == expected[k] for k in got)  # every other sample whole, its fields its own
