"""``shardkit append`` (issue #54): new shards after the dataset's last as
one new revision. The old shards and indexes stay byte for byte; the
dataset reads as old + new; a killed append finishes on a rerun, to the
bytes of one that was never interrupted; a state saved before an append
finishes its epoch over the samples it knew."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import shardkit
import shardkit.cli
from shardkit.errors import DestinationError, DuplicateSampleError, ManifestError, StateError
from shardkit.format.manifest import load_manifest
from shardkit.revise.append import APPEND_DIR, append
from shardkit.revise.remove import remove_samples
from shardkit.verify import verify_dataset
from shardkit.write.options import WriteOptions
from shardkit.write.parallel import write_dataset
from tests.write.test_resume_guard import make_texts, tree_digest

OPTIONS = WriteOptions(max_samples=4, seed=2, workers=1)


def keys_of(dest: str, **kwargs) -> list[str]:
    return [s["__key__"] for s in shardkit.ShardDataset(dest, **kwargs)]


@pytest.fixture
def pool(tmp_path):
    """A dataset of 30 samples ('a000'...) in 8 shards, and 14 new samples ('n000'...) to append."""
    dest = str(tmp_path / "pool")
    write_dataset(make_texts(str(tmp_path / "a"), "a", 30), dest, options=OPTIONS)
    return dest, make_texts(str(tmp_path / "new"), "n", 14)


def test_append_adds_shards_after_the_last_and_leaves_the_old_files_as_they_were(pool):
    dest, new = pool
    before = {name: digest for name, digest in tree_digest(dest).items() if name.startswith("shard-")}
    old = load_manifest(dest)
    report = append(dest, new, options=WriteOptions(max_samples=5, seed=1))
    after = tree_digest(dest)
    assert {name: after[name] for name in before} == before
    assert report.num_samples == 14 and report.num_shards == 3 and report.fingerprint_before == old.fingerprint
    manifest = load_manifest(dest)
    assert manifest.num_shards == 11 and manifest.num_samples == 44
    assert [(a.fingerprint, a.num_shards) for a in manifest.appended] == [(old.fingerprint, 8)]
    assert manifest.appended[0].source.startswith(new + " #")
    assert [manifest.table.path(i) for i in range(8, 11)] == ["shard-000008.tar", "shard-000009.tar", "shard-000010.tar"]
    assert sorted(keys_of(dest)) == sorted([f"a{i:03d}" for i in range(30)] + [f"n{i:03d}" for i in range(14)])
    assert not os.path.exists(os.path.join(dest, APPEND_DIR))
    checked = verify_dataset(dest)
    assert checked.num_shards_checked == 11 and checked.num_samples_checked == 44
    # Random access numbers the new samples after the old.
    indexed = shardkit.IndexedDataset(dest)
    assert len(indexed) == 44 and indexed[43]["__key__"].startswith("n")


def test_a_second_append_records_both_revisions(pool, tmp_path):
    dest, new = pool
    first = load_manifest(dest).fingerprint
    append(dest, new, options=OPTIONS)
    second = load_manifest(dest).fingerprint
    append(dest, make_texts(str(tmp_path / "more"), "m", 3), options=OPTIONS)
    assert [(a.fingerprint, a.num_shards) for a in load_manifest(dest).appended] == [(first, 8), (second, 12)]
    assert len(keys_of(dest)) == 47


def test_the_same_data_appended_twice_is_refused_unless_asked_for(pool, capsys):
    """A finished append run again would add every sample a second time (new keys are not checked against the dataset's)."""
    dest, new = pool
    append(dest, new, options=OPTIONS)
    before = tree_digest(dest)
    with pytest.raises(shardkit.UsageError, match=f"{new} was appended to this dataset already.*--again"):
        append(dest, new, options=OPTIONS)
    assert shardkit.cli.main(["append", dest, new, "--max-samples", "4", "--seed", "2", "-q"]) == 2
    assert "--again" in capsys.readouterr().err
    assert tree_digest(dest) == before
    assert shardkit.cli.main(["append", dest, new, "--max-samples", "5", "--seed", "2", "-q"]) == 0  # other options
    assert shardkit.cli.main(["append", dest, new, "--max-samples", "5", "--seed", "2", "-q", "--again"]) == 0
    assert "appended 14 samples in 3 shards; the dataset holds 72 samples" in capsys.readouterr().out


def test_a_folder_appended_again_with_new_contents_is_not_taken_for_the_same_data(pool, tmp_path):
    """Next month's files in the same folder, or another sequence of the same length: other shards, appended."""
    dest, new = pool
    append(dest, new, options=OPTIONS)
    for name in os.listdir(new):
        os.unlink(os.path.join(new, name))
    make_texts(new, "m", 14)
    assert append(dest, new, options=OPTIONS).num_samples == 14
    append(dest, [0, 1], map=_text_sample, options=OPTIONS)
    assert append(dest, [2, 3], map=_text_sample, options=OPTIONS).num_samples == 2
    assert len(keys_of(dest)) == 30 + 14 + 14 + 4


def test_keys_repeated_in_the_new_data_are_refused_and_nothing_is_appended(pool, tmp_path):
    dest, _ = pool
    before = tree_digest(dest)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"__key__": k, "txt": "x"}) + "\n" for k in ("k1", "k2", "k1")))
    with pytest.raises(DuplicateSampleError, match="k1"):
        append(dest, str(rows), options=OPTIONS)
    assert {n: d for n, d in tree_digest(dest).items() if not n.startswith(APPEND_DIR)} == before


def test_new_samples_with_other_class_names_are_refused(tmp_path):
    from tests.write.conftest import make_imagefolder

    dest = str(tmp_path / "images")
    make_imagefolder(str(tmp_path / "in"), classes=("cat", "dog"), per_class=3)
    write_dataset(str(tmp_path / "in"), dest, options=OPTIONS)
    make_imagefolder(str(tmp_path / "other"), classes=("cat", "eel"), per_class=2)
    before = tree_digest(dest)
    with pytest.raises(DestinationError, match=r"class names \(\['cat', 'eel'\]\) differ from the dataset's \(\['cat', 'dog'\]\)"):
        append(dest, str(tmp_path / "other"), options=OPTIONS)
    assert tree_digest(dest) == before  # the staging folder is gone too


def test_append_refuses_a_url_and_resume_or_overwrite(pool):
    dest, new = pool
    with pytest.raises(shardkit.UsageError, match="local folder"):
        append("http://127.0.0.1:9/pool", new)
    with pytest.raises(shardkit.UsageError, match="leave resume and overwrite unset"):
        append(dest, new, options=WriteOptions(resume=True))


def test_a_sequence_with_a_map_appends_as_write_does(pool):
    dest, _ = pool
    report = append(dest, list(range(5)), map=_text_sample, options=OPTIONS)
    assert report.num_samples == 5
    assert sorted(k for k in keys_of(dest) if k.startswith("seq")) == [f"seq{i}" for i in range(5)]


def _text_sample(i: int) -> dict:
    return {"__key__": f"seq{i}", "txt": f"item {i}"}


# ------------------------------------------------------------------ crashes

KILLED_APPEND = textwrap.dedent(
    """
    import os, signal, sys
    from shardkit.revise.append import append
    from shardkit.write.options import WriteOptions
    done = []
    def on_progress(event):
        done.append(event)
        if len(done) == 2:
            os.killpg(0, signal.SIGKILL)
    append(sys.argv[1], sys.argv[2], options=WriteOptions(max_samples=2, seed=2, workers=2), progress=on_progress)
    """
)


def test_a_sigkilled_append_finishes_on_a_rerun_to_the_uninterrupted_bytes(pool, tmp_path):
    dest, new = pool
    clean = str(tmp_path / "clean")
    write_dataset(str(tmp_path / "a"), clean, options=OPTIONS)
    append(clean, new, options=WriteOptions(max_samples=2, seed=2))
    before = load_manifest(dest)
    proc = subprocess.run([sys.executable, "-c", KILLED_APPEND, dest, new], start_new_session=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    assert load_manifest(dest).fingerprint == before.fingerprint  # the old revision, whole
    assert len(keys_of(dest)) == 30
    report = append(dest, new, options=WriteOptions(max_samples=2, seed=2, workers=2))
    assert report.write is not None and report.write.num_reused >= 1
    assert tree_digest(dest) == tree_digest(clean)


def test_an_append_stopped_while_linking_finishes_on_a_rerun(pool, tmp_path, monkeypatch):
    dest, new = pool
    real_link = os.link
    calls = []

    def flaky_link(source, target):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_link(source, target)

    monkeypatch.setattr(os, "link", flaky_link)
    with pytest.raises(OSError):
        append(dest, new, options=OPTIONS)
    monkeypatch.setattr(os, "link", real_link)
    assert load_manifest(dest).num_samples == 30
    assert len(keys_of(dest)) == 30  # the linked files are in no table yet
    report = append(dest, new, options=OPTIONS)
    assert report.num_samples == 14 and len(keys_of(dest)) == 44


def test_a_rerun_after_the_publish_finds_the_append_done(pool):
    """Killed after publishing, before the staging folder was removed: the rerun appends nothing twice."""
    dest, new = pool
    old = load_manifest(dest)
    append(dest, new, options=OPTIONS)
    work = os.path.join(dest, APPEND_DIR)
    os.makedirs(work)
    with open(os.path.join(work, "base.json"), "w") as f:
        json.dump({"fingerprint": old.fingerprint, "num_shards": old.num_shards}, f)
    report = append(dest, new, options=OPTIONS)
    assert report.write is None and report.num_samples == 14
    assert load_manifest(dest).num_samples == 44 and not os.path.exists(work)


def test_an_interrupted_append_over_a_dataset_changed_since_is_refused(pool, tmp_path):
    dest, new = pool
    work = os.path.join(dest, APPEND_DIR)
    os.makedirs(work)
    with open(os.path.join(work, "base.json"), "w") as f:
        json.dump({"fingerprint": "0" * 64, "num_shards": 3}, f)
    before = tree_digest(dest)
    with pytest.raises(DestinationError, match=f"interrupted append .* remove {work}"):
        append(dest, new, options=OPTIONS)
    assert tree_digest(dest) == before


def test_an_interrupted_append_of_other_data_is_not_finished_with_this(pool, tmp_path):
    dest, new = pool

    def stop(event):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        append(dest, new, options=WriteOptions(max_samples=2, seed=2, workers=1), progress=stop)
    other = make_texts(str(tmp_path / "other"), "o", 5)
    with pytest.raises(DestinationError, match="interrupted append of other data"):
        append(dest, other, options=WriteOptions(max_samples=2, seed=2, workers=1))
    assert load_manifest(dest).num_samples == 30


# ------------------------------------------------------------------ readers


def test_a_state_saved_before_an_append_finishes_its_epoch_over_the_old_samples(pool):
    dest, new = pool
    ds = shardkit.ShardDataset(dest, seed=4, mode="exact")
    it = iter(ds)
    taken = [next(it)["__key__"] for _ in range(11)]
    state = ds.state_dict()
    whole_epoch = keys_of(dest, seed=4, mode="exact")
    append(dest, new, options=OPTIONS)

    resumed = shardkit.ShardDataset(dest, seed=4, mode="exact")
    resumed.load_state_dict(state)
    assert len(resumed) == 30  # the epoch it was saved in
    rest = [s["__key__"] for s in resumed]
    assert taken + rest == whole_epoch  # the same order as if nothing had been appended
    resumed.set_epoch(1)
    assert len(resumed) == 44 and sorted(s["__key__"] for s in resumed) == sorted(whole_epoch + [f"n{i:03d}" for i in range(14)])


def test_a_state_saved_in_the_resumed_epoch_resumes_it_again(pool):
    dest, new = pool
    ds = shardkit.ShardDataset(dest, seed=4)
    it = iter(ds)
    taken = [next(it)["__key__"] for _ in range(5)]
    state = ds.state_dict()
    append(dest, new, options=OPTIONS)
    second = shardkit.ShardDataset(dest, seed=4)
    second.load_state_dict(state)
    it = iter(second)
    taken += [next(it)["__key__"] for _ in range(10)]
    again = second.state_dict()
    assert again["fingerprint"] == state["fingerprint"]
    third = shardkit.ShardDataset(dest, seed=4)
    third.load_state_dict(again)
    taken += [s["__key__"] for s in third]
    assert sorted(taken) == [f"a{i:03d}" for i in range(30)]


def test_a_removal_after_an_append_retires_states_saved_before_the_append(pool):
    dest, new = pool
    ds = shardkit.ShardDataset(dest, seed=4)
    next(iter(ds))
    state = ds.state_dict()
    append(dest, new, options=OPTIONS)
    remove_samples(dest, ["n003"])
    manifest = load_manifest(dest)
    assert manifest.appended == () and state["fingerprint"] in manifest.earlier_fingerprints
    with pytest.raises(StateError, match="saved before samples were removed"):
        shardkit.ShardDataset(dest, seed=4).load_state_dict(state)


def test_an_index_of_irregular_names_gets_shards_after_them(tmp_path):
    """Shards named by someone else, indexed in place: new ones take our names, after them."""
    shards = tmp_path / "theirs"
    write_dataset(make_texts(str(tmp_path / "a"), "a", 12), str(tmp_path / "w"), options=OPTIONS)
    os.makedirs(shards)
    for i, name in enumerate(["train-b.tar", "train-a.tar", "shard-000004.tar"]):
        os.link(tmp_path / "w" / f"shard-00000{i}.tar", shards / name)
    assert shardkit.cli.main(["index", str(shards), "-q"]) == 0
    report = append(str(shards), make_texts(str(tmp_path / "n"), "n", 6), options=OPTIONS)
    table = load_manifest(str(shards)).table
    names = [table.path(i) for i in range(table.num_shards)]
    assert names[:3] == sorted(["train-b.tar", "train-a.tar", "shard-000004.tar"])
    assert names[3:] == ["shard-000005.tar", "shard-000006.tar"]  # after shard-000004.tar, which is taken
    assert report.num_samples == 6 and len(keys_of(str(shards))) == 18


@pytest.mark.parametrize("bad", [
    [{"fingerprint": "0" * 64, "num_shards": 9}],  # not below the table's 8
    [{"fingerprint": "0" * 64, "num_shards": 3}, {"fingerprint": "1" * 64, "num_shards": 3}],  # not rising
    [{"fingerprint": "xyz", "num_shards": 3}],
    [{"fingerprint": "0" * 64, "num_shards": -1}],
    {"fingerprint": "0" * 64},
    [{"fingerprint": "0" * 64, "num_shards": 3, "more": 1}],
])
def test_a_damaged_appended_list_is_refused_on_load(pool, bad):
    dest, _ = pool
    path = os.path.join(dest, "manifest.json")
    with open(path) as f:
        data = json.load(f)
    data["appended"] = bad
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ManifestError, match="'appended' must be"):
        load_manifest(dest)
