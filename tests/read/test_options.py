"""ReaderOptions and OutputOptions: validation, the dataset's options (as groups or keyword arguments), and loading from YAML."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from shardkit import ShardDataset
from shardkit.config import load_options
from shardkit.errors import UsageError
from shardkit.read.options import OutputOptions, ReaderOptions

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"mode": "sometimes"}, "mode must be one of"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"buffer_size": -1}, "buffer_size must be >= 0"),
        ({"buffer_bytes": 0}, "buffer_bytes > 0"),
        ({"interleave": 0}, "interleave must be >= 1"),
        ({"mode": "exact", "pad": True}, "pad=True applies to mode='balanced' only"),
    ],
)
def test_invalid_reader_options_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ReaderOptions(**kwargs)


def test_reader_options_are_frozen_and_keyword_only():
    options = ReaderOptions(mode="exact", seed=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        ReaderOptions("exact")  # type: ignore[misc]
    assert options.to_dict() == {
        "mode": "exact", "seed": 3, "shuffle": True, "buffer_size": 1000,
        "buffer_bytes": None, "pad": False, "interleave": 1, "batching": "stratified",
    }  # fmt: skip


def test_the_dataset_holds_its_keyword_arguments_as_reader_options(make_shards):
    ds = ShardDataset(make_shards([3, 4]), mode="exact", seed=5, buffer_size=7, buffer_bytes=1 << 20, interleave=2)
    assert ds.options == ReaderOptions(mode="exact", seed=5, buffer_size=7, buffer_bytes=1 << 20, interleave=2)


def test_groups_read_the_same_samples_as_their_keyword_arguments(make_shards):
    manifest = make_shards([3, 4, 2])
    flat = ShardDataset(manifest, mode="exact", seed=2, buffer_size=4, batch_size=2, collate=list)
    grouped = ShardDataset(
        manifest,
        options=ReaderOptions(mode="exact", seed=2, buffer_size=4),
        output=OutputOptions(batch_size=2, collate=list),
    )
    assert grouped.options == flat.options
    keys = [[[s["__key__"] for s in batch] for batch in ds] for ds in (flat, grouped)]
    assert keys[0] == keys[1]
    every = [s["__key__"] for s in ShardDataset(manifest, mode="exact", shuffle=False)]
    assert sorted(k for batch in keys[0] for k in batch) == sorted(every)
    assert len(every) == 9


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"options": ReaderOptions(mode="exact"), "seed": 3}, "seed given both"),
        ({"output": OutputOptions(batch_size=2), "batch_size": 4, "decode": "pil"}, "decode, batch_size given both"),
        ({"options": {"mode": "exact"}}, "options= takes a shardkit.ReaderOptions, not dict"),
    ],
)
def test_a_group_and_its_keyword_arguments_are_refused_together(make_shards, kwargs, named):
    manifest = make_shards([2])
    with pytest.raises(UsageError, match=named):
        ShardDataset(manifest, **kwargs)


@pytest.mark.parametrize(
    "kwargs,message", [({"decode": "png"}, "decode must be"), ({"batch_size": 0}, "batch_size must be >= 1")]
)
def test_invalid_output_options_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(UsageError, match=message):
        OutputOptions(**kwargs)


def test_grouped_options_decide_as_their_keyword_arguments_do(make_shards, tmp_path):
    manifest = make_shards([3, 4])
    shards = []
    for entry in manifest.shards:  # bare tars, no offset index: no sample counts
        shards.append(str(tmp_path / entry.path))
        shutil.copy(os.path.join(manifest.location, entry.path), shards[-1])
    # exact mode from the group: a list of shards is accepted (balanced mode would need counts)
    keys = [s["__key__"] for s in ShardDataset(shards, options=ReaderOptions(mode="exact", interleave=2))]
    assert len(keys) == 7 and len(set(keys)) == 7


def test_reader_options_load_from_a_yaml_file(tmp_path):
    path = tmp_path / "reader.yaml"
    path.write_text("read:\n  mode: exact\n  seed: 11\n  buffer_size: 64\n  buffer_bytes: 32MiB\n  interleave: 2\n")
    options = load_options(ReaderOptions, str(path), section="read")
    assert options == ReaderOptions(mode="exact", seed=11, buffer_size=64, buffer_bytes=32 << 20, interleave=2)


def test_an_unknown_key_in_a_reader_config_is_refused_by_name(tmp_path):
    path = tmp_path / "reader.yaml"
    path.write_text("read:\n  mode: exact\n  bufer_size: 64\n")
    with pytest.raises(UsageError, match="unknown option.*bufer_size"):
        load_options(ReaderOptions, str(path), section="read")


def test_a_refused_value_in_a_reader_config_names_the_file(tmp_path):
    path = tmp_path / "reader.yaml"
    path.write_text("read:\n  mode: exact\n  pad: true\n")
    with pytest.raises(UsageError, match=r"reader\.yaml.*pad=True applies"):
        load_options(ReaderOptions, str(path), section="read")


def test_the_example_reader_config_loads():
    options = load_options(ReaderOptions, os.path.join(CONFIGS, "reader.yaml"), section="read")
    assert options == ReaderOptions()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(shuffle=1000), r"shuffle must be True or False, not 1000 \(the shuffle buffer's size is buffer_size: "
         r"shuffle=True, buffer_size=1000\)"),
        (dict(shuffle="yes"), "shuffle must be True or False, not 'yes'$"),
        (dict(buffer_size=True), "buffer_size must be an integer, not True"),
        (dict(seed=1.5), "seed must be an integer, not 1.5"),
        (dict(batch_size="8"), "batch_size must be an integer or None, not '8'"),
        (dict(verify_checksums=1), "verify_checksums must be True or False, not 1"),
    ],
)
def test_option_types_are_checked(make_shards, kwargs, message):
    with pytest.raises(UsageError, match=message):
        ShardDataset(make_shards([3]), mode="exact", **kwargs)
