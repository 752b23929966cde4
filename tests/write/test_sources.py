"""The sources' registry: every kind in it, detection through it, and each
option either applying to a source's kind or refused by name before anything
is scanned."""

from __future__ import annotations

import json
import os

import pytest

from shardkit.cli import main
from shardkit.errors import SourceError, UsageError
from shardkit.format.manifest import load_manifest
from shardkit.write.dry_run import plan_dataset
from shardkit.write.parallel import WriteOptions, write_dataset
from shardkit.write.sources import FORMATS, KINDS, SOURCE_OPTIONS, detect_source, source_kind
from shardkit.write.sources.base import IMAGE_OPTIONS, SourceKind
from tests.conftest import build_dataset
from tests.write.conftest import make_imagefolder

ALL_KINDS = ("imagefolder", "directory", "jsonl", "tar", "parquet", "csv", "tsv", "hf")


# --------------------------------------------------------------- sources of each kind


def imagefolder_source(root) -> str:
    make_imagefolder(str(root / "images"), per_class=2, size=200)
    return str(root / "images")


def directory_source(root) -> str:
    folder = root / "tree"
    (folder / "imgs").mkdir(parents=True)
    (folder / "labels").mkdir()
    for i in range(3):
        (folder / "imgs" / f"a{i}.jpg").write_bytes(os.urandom(100))
        (folder / "labels" / f"a{i}.cls").write_text(str(i))
    return str(folder)


def jsonl_source(root) -> str:
    path = root / "rows.jsonl"
    path.write_text("".join(json.dumps({"__key__": f"r{i}", "txt": f"row {i}"}) + "\n" for i in range(5)))
    return str(path)


def tar_source(root) -> str:
    build_dataset(str(root / "shards"), [4, 3])
    return str(root / "shards")


def parquet_source(root) -> str:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    path = root / "rows.parquet"
    pq.write_table(pa.table({"txt": [f"row {i}" for i in range(5)]}), str(path))
    return str(path)


def csv_source(root) -> str:
    path = root / "rows.csv"
    path.write_text("txt,cls\n" + "".join(f"row {i},{i}\n" for i in range(5)))
    return str(path)


def tsv_source(root) -> str:
    path = root / "rows.tsv"
    path.write_text("txt\tcls\n" + "".join(f"row {i}\t{i}\n" for i in range(5)))
    return str(path)


def hf_source(root) -> str:
    folder = root / "saved"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": []}))
    return str(folder)


SOURCES = {
    "imagefolder": imagefolder_source,
    "directory": directory_source,
    "jsonl": jsonl_source,
    "tar": tar_source,
    "parquet": parquet_source,
    "csv": csv_source,
    "tsv": tsv_source,
    "hf": hf_source,
}


# --------------------------------------------------------------- the registry


def test_the_registry_lists_every_kind_once_in_the_order_messages_name_them():
    assert FORMATS == tuple(KINDS) == ALL_KINDS
    for name, kind in KINDS.items():
        assert isinstance(kind, SourceKind) and kind.name == name
        for method in ("partitions", "scan", "load", "origin"):
            assert getattr(type(kind), method) is not getattr(SourceKind, method), f"{name} lacks {method}"
        assert IMAGE_OPTIONS <= kind.options  # the image options apply to every kind


def test_an_unknown_format_is_refused_naming_every_kind():
    with pytest.raises(UsageError, match="unknown source format 'webp'; choose one of " + ", ".join(ALL_KINDS)):
        source_kind("webp")


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_detection_goes_through_the_registry_for_each_kind(tmp_path, kind):
    source = SOURCES[kind](tmp_path)
    assert detect_source(source) == kind
    assert source_kind(detect_source(source)).name == kind


def test_detection_through_the_registry_still_refuses_an_ambiguous_folder(tmp_path):
    source = tar_source(tmp_path)
    os.remove(os.path.join(source, "manifest.json"))
    (tmp_path / "shards" / "notes").mkdir()
    with pytest.raises(SourceError, match=r"cannot tell the source format: .* Pass `--format tar`"):
        detect_source(source)


# --------------------------------------------------------------- options refused by name

#: (field, value, flag and its arguments, or None where the option has no flag,
#: the kinds it applies to as the message says, a source kind that does not take it)
REFUSED = [
    ("download_threads", 4, ["--download-threads", "4"], "table", "imagefolder"),
    ("max_connections_per_host", 2, ["--max-connections-per-host", "2"], "table", "directory"),
    ("connect_timeout_s", 3.0, ["--connect-timeout", "3"], "table", "jsonl"),
    ("read_timeout_s", 3.0, ["--read-timeout", "3"], "table", "tar"),
    ("download_retries", 0, ["--retries", "0"], "table", "imagefolder"),
    ("respect_opt_out", False, ["--no-respect-opt-out"], "table", "jsonl"),
    ("user_agent_contact", "me@example.org", ["--user-agent-contact", "me@example.org"], "table", "directory"),
    ("s3_anonymous", True, ["--s3-anonymous"], "table", "tar"),
    ("fields", ("jpg=url",), ["--field", "jpg=url"], "table", "jsonl"),
    ("key_column", "id", ["--key", "id"], "table", "imagefolder"),
    ("files_root", "ROOT", ["--files-root", "ROOT"], "jsonl and table", "imagefolder"),
    ("files_root", "ROOT", ["--files-root", "ROOT"], "jsonl and table", "tar"),
    ("partition_bytes", 1 << 20, None, "jsonl, csv and tsv", "tar"),
    ("partition_bytes", 1 << 20, None, "jsonl, csv and tsv", "parquet"),
    ("max_unpack_bytes", 1 << 30, ["--max-unpack-bytes", "1GiB"], "tar", "jsonl"),
    ("max_unpack_bytes", 1 << 30, ["--max-unpack-bytes", "1GiB"], "tar", "csv"),
]
REFUSED_IDS = [f"{field}-on-{kind}" for field, _, _, _, kind in REFUSED]


def refusal(field: str, flag: list[str] | None, applies_to: str, source: str, kind: str) -> str:
    named = f"{flag[0]} ({field})" if flag else field
    article = "an" if kind in ("imagefolder", "hf") else "a"
    return f"{named} applies to {applies_to} sources only; {source} is {article} {kind} source"


def test_the_refused_cases_cover_every_option_some_kinds_refuse():
    refused_somewhere = {name for name in SOURCE_OPTIONS if any(name not in kind.options for kind in KINDS.values())}
    assert refused_somewhere == {field for field, *_ in REFUSED}


@pytest.mark.parametrize(("field", "value", "flag", "applies_to", "kind"), REFUSED, ids=REFUSED_IDS)
def test_an_option_for_other_kinds_is_refused_by_name_before_scanning(tmp_path, field, value, flag, applies_to, kind):
    source = SOURCES[kind](tmp_path)
    value = str(tmp_path) if value == "ROOT" else value
    dest = tmp_path / "out"
    with pytest.raises(UsageError) as caught:
        write_dataset(source, str(dest), options=WriteOptions(**{field: value}))
    assert str(caught.value) == refusal(field, flag, applies_to, source, kind)
    assert not dest.exists()  # refused before anything was made
    with pytest.raises(UsageError, match="applies to"):
        plan_dataset(source, options=WriteOptions(**{field: value}))  # the dry run refuses it too


#: The refused cases that have a command-line flag: (field, flag, applies_to, kind).
FLAGGED = [(field, flag, applies, kind) for field, _, flag, applies, kind in REFUSED if flag is not None]


@pytest.mark.parametrize(("field", "flag", "applies_to", "kind"), FLAGGED, ids=[f"{c[0]}-on-{c[3]}" for c in FLAGGED])
def test_the_command_line_refuses_it_with_exit_2_naming_the_flag(tmp_path, capsys, field, flag, applies_to, kind):
    source = SOURCES[kind](tmp_path)
    flag = [str(tmp_path) if part == "ROOT" else part for part in flag]
    assert main(["write", source, str(tmp_path / "out"), "-q", *flag]) == 2
    err = capsys.readouterr().err
    assert refusal(field, flag, applies_to, source, kind) in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_option_left_at_its_default_is_not_refused(tmp_path):
    source = imagefolder_source(tmp_path)
    options = WriteOptions(download_threads=16, fields=(), files_root=None, max_unpack_bytes=64 << 30, workers=1)
    assert write_dataset(source, str(tmp_path / "out"), options=options).manifest.num_samples == 6


# --------------------------------------------------------------- options that apply


def test_options_that_apply_to_a_kind_are_taken(tmp_path):
    jsonl = jsonl_source(tmp_path)
    files_root = WriteOptions(files_root=str(tmp_path), partition_bytes=40, workers=1)
    assert write_dataset(jsonl, str(tmp_path / "a"), options=files_root).manifest.num_samples == 5
    tar = tar_source(tmp_path)
    assert write_dataset(tar, str(tmp_path / "b"), options=WriteOptions(max_unpack_bytes=1 << 20, workers=1))
    csv = csv_source(tmp_path)
    table = WriteOptions(partition_bytes=16, download_threads=2, fields=("txt=txt",), key_column="cls", workers=1)
    write_dataset(csv, str(tmp_path / "c"), options=table)
    assert load_manifest(str(tmp_path / "c")).num_samples == 5


@pytest.mark.parametrize("kind", ["imagefolder", "directory", "jsonl", "tar"])
def test_the_image_options_are_not_refused_for_any_kind(tmp_path, kind):
    source = SOURCES[kind](tmp_path)
    options = WriteOptions(resize=64, resize_mode="center_crop", image_format="jpg", image_quality=80, workers=1)
    assert plan_dataset(source, options=options).num_samples > 0
