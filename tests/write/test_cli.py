"""`shardkit write/info/verify`: exit codes, and messages that name the fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shardkit
from shardkit.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_write_info_verify_happy_path(imagefolder, tmp_path, capsys):
    root, files = imagefolder
    dest = str(tmp_path / "out")
    code, out, _ = run(capsys, "write", root, dest, "--max-samples", "10", "--workers", "2")
    assert code == 0 and f"{len(files)} samples" in out and "skipped 0" in out
    code, out, _ = run(capsys, "info", dest)
    assert code == 0 and f"samples:    {len(files)}" in out and "cat, dog, eel" in out
    code, out, _ = run(capsys, "verify", dest)
    assert code == 0 and out.startswith("OK: 3 shards")


def test_quiet_write_prints_the_one_line_summary_only(imagefolder, tmp_path, capsys):
    root, files = imagefolder
    code, out, err = run(capsys, "write", root, str(tmp_path / "out"), "--max-samples", "10", "-q")
    assert code == 0 and err == ""  # no progress bar
    (line,) = out.splitlines()  # as `remove -q` keeps its summary
    assert line.startswith("wrote 3 shards (3 written, 0 reused), 24 samples") and line.endswith("skipped 0")
    assert len(files) == 24


def test_output_piped_to_a_reader_that_stops_early_ends_quietly(imagefolder, tmp_path):
    # `shardkit info DS | head -1`: no "error: BrokenPipeError" and no traceback, exit 141 as git gives.
    root, _ = imagefolder
    dest = str(tmp_path / "out")
    assert main(["write", root, dest, "--max-samples", "2", "-q"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "shardkit", "info", dest, "--shards"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command has written anything
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == b""


def test_dest_not_empty_is_refused_and_untouched(imagefolder, tmp_path, capsys):
    root, _ = imagefolder
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "precious.txt").write_text("keep me")
    code, _, err = run(capsys, "write", root, str(dest))
    # Not a write of shardkit's: nothing to resume, and --overwrite would not delete it either.
    assert code == 2 and "precious.txt" in err and "--resume" not in err and str(dest) in err
    assert os.listdir(dest) == ["precious.txt"]
    code, _, err = run(capsys, "write", root, str(dest), "--overwrite")
    assert code == 2 and "precious.txt" in err
    assert os.listdir(dest) == ["precious.txt"]


def test_overwrite_replaces_an_earlier_output(imagefolder, tmp_path, capsys):
    root, _ = imagefolder
    dest = str(tmp_path / "out")
    assert run(capsys, "write", root, dest, "--max-samples", "3", "-q")[0] == 0
    assert run(capsys, "write", root, dest, "--max-samples", "50", "--overwrite", "-q")[0] == 0
    assert sorted(n for n in os.listdir(dest) if n.endswith(".tar")) == ["shard-000000.tar"]


@pytest.mark.parametrize(
    ("make_source", "message"),
    [
        (lambda p: str(p / "nope"), "does not exist"),
        (lambda p: (p / "empty").mkdir() or str(p / "empty"), "empty"),
        (lambda p: (p / "x.xlsx").write_text("a,b") and str(p / "x.xlsx"), "--format"),  # .csv is a table now
        # Counted, not listed: listing them ended in MemoryError.
        (lambda p: str(p / "s-{0000000000..9999999999}.tar"), "names 10,000,000,000 inputs"),
        (lambda p: str(p / "t-{0000000000..9999999999}.parquet"), "names 10,000,000,000 inputs"),
    ],
    ids=["missing", "empty", "unknown-kind", "huge-tar-pattern", "huge-table-pattern"],
)
def test_bad_source_is_a_usage_error_naming_it(tmp_path, capsys, make_source, message):
    source = make_source(tmp_path)
    code, _, err = run(capsys, "write", source, str(tmp_path / "out"))
    assert code == 2 and message in err and os.path.basename(source) in err
    assert not os.path.exists(tmp_path / "out")


def test_unknown_format_flag_is_refused(imagefolder, tmp_path, capsys):
    root, _ = imagefolder
    code, _, err = run(capsys, "write", root, str(tmp_path / "out"), "--format", "parquet")
    assert code == 2 and "parquet" in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-bytes", "0"), ("--max-bytes", "lots"), ("--max-bytes", "-5MB"), ("--max-samples", "0"), ("--max-samples", "1.5"), ("--workers", "zero")],
)
def test_nonsense_limits_are_usage_errors(imagefolder, tmp_path, capsys, flag, value):
    root, _ = imagefolder
    code, _, err = run(capsys, "write", root, str(tmp_path / "out"), f"{flag}={value}")
    assert code == 2 and flag in err and value in err
    assert not os.path.exists(tmp_path / "out")


def test_dangling_input_raises_with_path_or_is_skipped_and_recorded(imagefolder, tmp_path, capsys):
    root, files = imagefolder
    broken = os.path.join(root, "cat", "gone.jpg")
    os.symlink(os.path.join(root, "cat", "never-existed.jpg"), broken)
    code, _, err = run(capsys, "write", root, str(tmp_path / "a"))
    assert code == 2 and "gone.jpg" in err
    code, out, _ = run(capsys, "write", root, str(tmp_path / "b"), "--on-error", "skip")
    assert code == 0 and "skipped 1" in out and "gone.jpg" in out
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["num_samples"] == len(files)
    assert [s["path"] for s in manifest["skipped"]] == [broken]


def test_same_key_and_extension_twice_names_both(tmp_path, capsys):
    src = tmp_path / "src"
    for folder in ("x", "y"):
        (src / folder).mkdir(parents=True)
        (src / folder / "a.jpg").write_bytes(b"1")
    (src / "a.txt").write_text("t")  # a plain directory, not an ImageFolder
    code, _, err = run(capsys, "write", str(src), str(tmp_path / "out"))
    assert code == 2 and "x/a.jpg" in err and "y/a.jpg" in err


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"__key__": "a", "txt": "ok"}', "{not json"], "line 2 is not valid JSON"),
        (['{"__key__": "a", "txt": "ok"}', '{"txt": "no key"}'], 'line 2 has no string "__key__"'),
        (['{"__key__": "a", "jpg": "missing.jpg"}'], "line 1: field 'jpg' refers to"),
        (['{"__key__": "a", "txt": "1"}', '{"__key__": "a", "txt": "2"}'], "lines 1 and 2"),
    ],
    ids=["bad-json", "no-key", "missing-file", "duplicate-key"],
)
def test_malformed_jsonl_names_the_line(tmp_path, capsys, lines, message):
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "write", str(src), str(tmp_path / "out"))
    assert code == 2 and message in err and "rows.jsonl" in err


def test_jsonl_rows_name_files_only_inside_their_folder_unless_told_where(tmp_path, capsys):
    # A JSONL from elsewhere could otherwise copy any file it names into shards you publish.
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"PRIVATE")
    lists = tmp_path / "lists"
    (lists / "imgs").mkdir(parents=True)
    (lists / "imgs" / "a.jpg").write_bytes(b"jpeg a")
    for name, path in [("absolute", str(secret)), ("dotdot", "../secret.key")]:
        src = lists / f"{name}.jsonl"
        src.write_text(json.dumps({"__key__": "a", "jpg": "imgs/../imgs/a.jpg"}) + "\n"
                       + json.dumps({"__key__": "b", "jpg": path}) + "\n")
        code, _, err = run(capsys, "write", str(src), str(tmp_path / name))
        assert code == 2 and not (tmp_path / name).exists()
        assert f"{name}.jsonl:2: line 2: field 'jpg' refers to" in err and f"outside {lists}," in err
        assert "--files-root" in err
        # skipped and recorded under --on-error skip; the row inside the folder is written
        assert run(capsys, "write", str(src), str(tmp_path / f"{name}-skip"), "--on-error", "skip", "-q")[0] == 0
        manifest = json.loads((tmp_path / f"{name}-skip" / "manifest.json").read_text())
        assert manifest["num_samples"] == 1 and "outside" in manifest["skipped"][0]["reason"]
        # told where: both rows, the file's bytes as they are
        dest = tmp_path / f"{name}-root"
        assert run(capsys, "write", str(src), str(dest), "--files-root", str(tmp_path), "-q")[0] == 0
        samples = {s["__key__"]: s["jpg"] for s in shardkit.ShardDataset(str(dest), shuffle=False)}
        assert samples == {"a": b"jpeg a", "b": b"PRIVATE"}


@pytest.mark.parametrize("format", [None, "imagefolder", "directory"])
def test_a_destination_inside_the_source_is_refused_before_anything_is_made(tmp_path, capsys, format):
    # It would be scanned as one more class folder (an ImageFolder's labels
    # named a class "shards"), or its shards packed as files.
    src = tmp_path / "data"
    for label in ("cat", "dog"):
        (src / label).mkdir(parents=True)
        (src / label / f"{label}1.jpg").write_bytes(b"jpeg")
    flags = ["--format", format] if format else []
    for dest in (src / "shards", src):
        code, _, err = run(capsys, "write", str(src), str(dest), "-q", *flags)
        assert code == 2 and f"{dest}: the destination is inside the source {src}" in err
    assert sorted(os.listdir(src)) == ["cat", "dog"]
    assert run(capsys, "write", str(src), str(tmp_path / "shards"), "-q", *flags)[0] == 0


def test_a_destination_that_holds_the_source_shards_is_refused_and_they_are_kept(tmp_path, capsys):
    """`write data data --format tar --overwrite` removed the input shards
    before reading them (they have the writer's own names) and then failed:
    the dataset was gone. A folder the source reads shards from is no
    destination, however the source is given; a folder inside it is."""
    src = tmp_path / "data"
    with shardkit.ShardWriter(str(src), max_samples=5) as writer:
        for i in range(20):
            writer.write({"__key__": f"{i:03d}", "txt": f"sample {i}"})
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    sources = [(str(src), ["--format", "tar"]), (f"{src}/shard-{{000000..000003}}.tar", []),
               (f"{src}/shard-000001.tar", []), (f"{tmp_path}/elsewhere.tar::{src}/shard-000000.tar", []),
               (f"{tmp_path}/{{other,data}}/shard-000000.tar", [])]
    for source, flags in sources:
        for rerun in (["--overwrite"], ["--resume"]):
            code, _, err = run(capsys, "write", source, str(src), "--max-samples", "7", "-q", *flags, *rerun)
            assert code == 2 and f"{src}: the " in err and "choose a destination outside it" in err, err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert run(capsys, "write", str(src), str(src / "resharded"), "--format", "tar", "--max-samples", "7", "-q")[0] == 0
    assert len(list(shardkit.ShardDataset(str(src / "resharded"), mode="exact"))) == 20


def test_config_file_supplies_options_and_flags_win(imagefolder, tmp_path, capsys):
    root, _ = imagefolder
    config = tmp_path / "c.yaml"
    config.write_text("write:\n  max_samples: 6\n  seed: 3\n  shuffle: false\n")
    dest = str(tmp_path / "out")
    assert run(capsys, "write", root, dest, "--config", str(config), "--max-samples", "12", "-q")[0] == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["options"]["max_samples"] == 12 and manifest["options"]["shuffle"] is False
    bad = tmp_path / "bad.yaml"
    bad.write_text("write:\n  max_sample: 6\n")
    code, _, err = run(capsys, "write", root, str(tmp_path / "o2"), "--config", str(bad))
    assert code == 2 and "max_sample" in err


def test_shipped_config_is_valid(imagefolder, tmp_path, capsys):
    root, _ = imagefolder
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "imagenet-like.yaml")
    assert run(capsys, "write", root, str(tmp_path / "out"), "--config", config, "-q")[0] == 0


def test_python_dash_m_runs_the_cli(imagefolder, tmp_path):
    root, _ = imagefolder
    proc = subprocess.run(
        [sys.executable, "-m", "shardkit", "write", root, str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "shardkit", "info", str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 2 and "nope: no such dataset" in proc.stderr


@pytest.mark.parametrize("argv", [[], ["-v"]])
def test_no_arguments_print_usage_and_point_to_help(capsys, argv):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("usage: shardkit") and "`shardkit --help`" in err and out == ""
    assert "required" not in err


@pytest.mark.parametrize(
    ("argv", "prefix", "says"),
    [
        (["bogus"], "shardkit: error: ", "invalid choice: 'bogus'"),
        (["write", "--bogus"], "shardkit write: error: ", "required: source, dest"),
    ],
)
def test_a_refused_command_line_names_its_command_once(capsys, argv, prefix, says):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(prefix) and says in err
    assert err.count("shardkit") == (2 if argv == ["bogus"] else 1)  # the prog once; the bogus command's hint once


def test_info_of_one_shard_summarizes_it_and_names_a_damaged_one(tmp_path, capsys):
    import gzip
    import hashlib

    with shardkit.ShardWriter(str(tmp_path / "ds"), max_samples=3) as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "jpg": b"x" * 100, "cls": b"1", **({"json": b"{}"} if i == 1 else {})})
    shard = tmp_path / "ds" / "shard-000000.tar"
    code, out, err = run(capsys, "info", str(shard))
    assert code == 0 and err == ""
    assert "samples:    3 (keys k0 .. k2)" in out
    assert "fields:     cls 3, jpg 3, json 1" in out
    assert hashlib.sha256(shard.read_bytes()).hexdigest() in out

    packed = tmp_path / "one.tar.gz"
    packed.write_bytes(gzip.compress(shard.read_bytes()))
    code, out, _ = run(capsys, "info", str(packed))
    assert code == 0 and "gzip-compressed" in out and "samples:    3" in out

    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(shard.read_bytes()[:1500])
    code, out, err = run(capsys, "info", str(damaged))
    assert code == 2 and err.startswith("shardkit: error: ") and "damaged.tar" in err and "at byte" in err
    assert "Traceback" not in err and "NotADirectoryError" not in err
