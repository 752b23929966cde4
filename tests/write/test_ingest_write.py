"""`shardkit write` from tables: Parquet of URLs served on 127.0.0.1 with faults
injected, CSV and datasets folders; every row stored or counted by reason."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

import shardkit
from shardkit.format.manifest import load_manifest
from shardkit.cli import main
from tests.write.url_servers import Answer, photo_jpeg, server  # noqa: F401  (a fixture)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

#: Quick to give up on a hung answer (the read timeout); the connect timeout
#: is generous because a loopback connect only waits when the machine is
#: loaded, and a 1 s one once turned CI's 404 into a timeout.
FAST = ["--read-timeout", "1", "--connect-timeout", "10", "--retries", "0", "-q"]


def _image_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


def _url_table(tmp_path, server) -> tuple[str, dict[str, bytes]]:
    """A Parquet of 12 URL rows in 3 row groups: 9 photos, a 404, an HTML page
    served as image/jpeg and a server that hangs; returns the path and the
    photos by caption."""
    photos, urls, captions = {}, [], []
    for i in range(12):
        caption = f"photo {i}"
        if i == 3:
            url = server.serve("/missing.jpg", Answer(404, b"gone"))
        elif i == 7:
            url = server.serve("/page.jpg", Answer(200, b"<html>not an image</html>"))
        elif i == 10:
            url = server.serve("/hang.jpg", Answer(200, b"late", hold_s=5))
        else:
            photos[caption] = photo_jpeg(40 + i, 30, seed=i)
            url = server.serve(f"/{i}.jpg", Answer(200, photos[caption]))
        urls.append(url)
        captions.append(caption)
    path = tmp_path / "meta.parquet"
    pq.write_table(pa.table({"URL": urls, "TEXT": captions, "WIDTH": list(range(12))}), path, row_group_size=4)
    return str(path), photos


def _members(folder) -> dict[str, dict[str, bytes]]:
    samples = {}
    for sample in shardkit.ShardDataset(str(folder), shuffle=False):
        samples[sample["__key__"]] = {k: v for k, v in sample.items() if not k.startswith("__")}
    return samples


def _tree_digest(folder) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(folder))
        if name.endswith((".tar", ".idx", ".table"))  # manifest.json holds the folder's own path
    }


def test_parquet_of_urls_to_shards_counts_every_row_by_reason(tmp_path, server, capsys):
    source, photos = _url_table(tmp_path, server)
    args = ["--field", "jpg=URL", "--field", "txt=TEXT", "--field", "json=*", "--max-samples", "4", "--seed", "1", *FAST]
    assert main(["write", source, str(tmp_path / "w1"), "--workers", "1", *args]) == 0
    assert main(["write", source, str(tmp_path / "w2"), "--workers", "2", *args]) == 0
    skips = [[(s.path, s.reason) for s in load_manifest(str(tmp_path / w)).skipped] for w in ("w1", "w2")]
    assert skips[0] == skips[1]
    assert _tree_digest(tmp_path / "w1") == _tree_digest(tmp_path / "w2")  # same bytes whatever finished first

    manifest = load_manifest(str(tmp_path / "w1"))
    reasons = sorted(item.reason.split(":")[0] for item in manifest.skipped)
    assert reasons == ["http_404", "not_image", "timeout"]
    assert manifest.num_samples + len(manifest.skipped) == 12
    # in source order, not in the shuffled order the shards met them
    assert [item.path for item in manifest.skipped] == [f"{source}#row={i}" for i in (3, 7, 10)]

    samples = _members(tmp_path / "w1")
    assert len(samples) == 9
    for key, fields in samples.items():
        caption = fields["txt"].decode()
        assert fields["jpg"] == photos[caption]  # the served bytes, as they are
        record = json.loads(fields["json"])
        assert record["WIDTH"] == int(key) and record["status"] == 200
        assert record["url"].endswith(f"/{int(key)}.jpg") and record["original_width"] == 40 + int(key)

    capsys.readouterr()
    assert main(["info", str(tmp_path / "w1")]) == 0
    out = capsys.readouterr().out
    assert "skipped:    3 (by reason: http_404 1, not_image 1, timeout 1)" in out


def test_resize_and_dry_run_and_resume(tmp_path, server, capsys):
    source, photos = _url_table(tmp_path, server)
    args = ["--field", "jpg=URL", "--field", "txt=TEXT", "--resize", "16", "--max-samples", "4", *FAST]
    assert main(["write", source, str(tmp_path / "dry"), "--dry-run", *args]) == 0
    out = capsys.readouterr().out
    assert "samples: 12" in out and "shards:  3" in out
    assert not server.requests  # a dry run counts rows, it fetches nothing
    assert not (tmp_path / "dry").exists()

    dest = tmp_path / "out"
    assert main(["write", source, str(dest), "--workers", "1", *args]) == 0
    for fields in _members(dest).values():
        width, height = _image_size(fields["jpg"])
        assert height == 16 and width == round(16 * (40 + int(fields["txt"].split()[1])) / 30)
    served = len(server.requests)
    # Resuming with only the first shard left fetches the other shards' rows only.
    manifest = load_manifest(str(dest))
    first = manifest.table.entry(0).path
    with tarfile.open(dest / first) as tar:
        kept = {name.split(".")[0] for name in tar.getnames()}
    journal = dest / ".shardkit-journal"
    for entry in range(1, manifest.num_shards):
        os.unlink(dest / manifest.table.entry(entry).path)
    assert main(["write", source, str(dest), "--workers", "1", "--resume", *args]) == 0
    again = {path.lstrip("/").split(".")[0] for path, _ in server.requests[served:]}
    assert again and not again & {str(int(key)) for key in kept}
    assert len(_members(dest)) == 9
    assert not journal.exists()


def test_image_format_other_than_the_fields_name_is_said_before_writing(tmp_path, server, caplog):
    source, _ = _url_table(tmp_path, server)
    args = ["--field", "jpg=URL", "--field", "txt=TEXT", "--image-format", "webp", "--max-samples", "4", *FAST]
    with caplog.at_level("WARNING", logger="shardkit"):
        assert main(["write", source, str(tmp_path / "dry"), "--dry-run", *args]) == 0
    warned = [r.getMessage() for r in caplog.records if "image_format=webp" in r.getMessage()]
    assert warned == ["field 'jpg' will hold WEBP images (image_format=webp) in members named KEY.jpg; "
                      "to name them after what they hold, map the column as --field webp=URL"]
    caplog.clear()
    assert main(["write", source, str(tmp_path / "out"), "--workers", "1", *args]) == 0
    assert any("image_format=webp" in r.getMessage() for r in caplog.records)
    for fields in _members(tmp_path / "out").values():  # the field keeps its name; the bytes are WebP
        assert fields["jpg"][:4] == b"RIFF" and fields["jpg"][8:12] == b"WEBP"

    caplog.clear()
    renamed = ["--field", "webp=URL", "--field", "txt=TEXT", "--image-format", "webp", "--dry-run", *FAST]
    with caplog.at_level("WARNING", logger="shardkit"):
        assert main(["write", source, str(tmp_path / "dry2"), *renamed]) == 0
    assert not [r for r in caplog.records if "image_format" in r.getMessage()]


def test_a_manifest_lists_the_first_skipped_rows_and_counts_them_all(tmp_path, server, capsys):
    # At LAION's scale 10**8 rows fail: listed whole they would make
    # manifest.json gigabytes (and the driver hold them all).
    import csv

    from shardkit.format.manifest import SKIPPED_LISTED

    rows = SKIPPED_LISTED + 150
    good = {i for i in range(0, rows, 40)}
    photo = photo_jpeg(32, 24, seed=1)
    url = server.serve("/p.jpg", Answer(200, photo))
    source = tmp_path / "rows.csv"
    with open(source, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["url", "caption"])
        for i in range(rows):
            writer.writerow([url if i in good else f"nope://{i}", f"row {i}"])  # no http(s)/s3 scheme: bad_url
    dest = tmp_path / "out"
    args = ["--field", "jpg=url", "--field", "txt=caption", "--max-samples", "100", *FAST]
    assert main(["write", str(source), str(dest), *args]) == 0
    manifest = load_manifest(str(dest))
    failed = [i for i in range(rows) if i not in good]
    assert manifest.num_samples == len(good) and manifest.num_skipped == len(failed)
    assert manifest.skipped_by_category == {"bad_url": len(failed)}
    assert [s.path for s in manifest.skipped] == [f"{source}#row={i}" for i in failed[:SKIPPED_LISTED]]
    stored = json.loads((dest / "manifest.json").read_text())
    assert stored["skipped_counts"] == {"bad_url": len(failed)} and len(stored["skipped"]) == SKIPPED_LISTED

    capsys.readouterr()
    assert main(["info", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"skipped:    {len(failed)} (by reason: bad_url {len(failed)})" in out
    assert f"... and {len(failed) - 20} more (manifest.json lists the first {SKIPPED_LISTED})" in out
    assert main(["verify", str(dest)]) == 0
    assert f"({len(failed)} inputs left out when it was made" in capsys.readouterr().out


def test_on_error_raise_stops_at_the_first_failed_row_naming_it(tmp_path, server, capsys):
    source, _ = _url_table(tmp_path, server)
    code = main(["write", source, str(tmp_path / "out"), "--field", "jpg=URL", "--on-error", "raise",
                 "--no-shuffle", "--workers", "1", *FAST])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "meta.parquet: row 3 (key 000000003): http_404: jpg http://127.0.0.1:" in err
    assert "missing.jpg" in err and "--on-error skip" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_missing_column_is_refused_before_any_request(tmp_path, server, capsys):
    source, _ = _url_table(tmp_path, server)
    code = main(["write", source, str(tmp_path / "out"), "--field", "jpg=url", "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--field jpg=url: no column 'url'; the columns are: URL, TEXT, WIDTH" in err
    assert not server.requests
    assert not (tmp_path / "out").exists()


def test_csv_that_is_not_utf8_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "captions.csv"
    path.write_bytes(b"txt,cls\nok,1\ncaf\xe9,2\n")
    code = main(["write", str(path), str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert "captions.csv: line 3: byte 0xe9 at column 4 is not UTF-8" in err and "iconv" in err


def test_csv_text_rows_are_sized_and_written_in_order(tmp_path):
    path = tmp_path / "captions.tsv"
    path.write_text("id\ttxt\tcls\n" + "".join(f"k{i}\tcaption {i}\t{i % 3}\n" for i in range(30)), encoding="utf-8")
    dest = tmp_path / "out"
    assert main(["write", str(path), str(dest), "--key", "id", "--max-bytes", "8KB", "--workers", "2", "-q"]) == 0
    manifest = load_manifest(str(dest))
    assert manifest.num_samples == 30 and manifest.num_shards > 1 and manifest.source["format"] == "tsv"
    samples = _members(dest)
    assert samples["k7"] == {"cls": b"1", "txt": b"caption 7"}


def test_datasets_folder_with_image_bytes(tmp_path):
    datasets = pytest.importorskip("datasets")
    jpegs = [photo_jpeg(32 + i, 24, seed=i) for i in range(5)]
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": j, "path": None} for j in jpegs], "text": [f"t{i}" for i in range(5)]}, features=features
    )
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
    dest = tmp_path / "out"
    assert main(["write", str(tmp_path / "ds"), str(dest), "--field", "jpg=image", "--field", "txt=text", "-q"]) == 0
    manifest = load_manifest(str(dest))
    assert manifest.source["format"] == "hf" and manifest.num_samples == 5 and not manifest.skipped
    samples = _members(dest)
    assert {key: fields["jpg"] for key, fields in samples.items()} == {f"{i:09d}": jpegs[i] for i in range(5)}
    assert sorted(samples["000000002"]) == ["jpg", "txt"]  # bytes in the table: no download record added


def test_opt_out_is_respected_unless_turned_off(tmp_path, server, capsys):
    jpeg = photo_jpeg(20, 20)
    url = server.serve("/mine.jpg", Answer(200, jpeg, headers={"X-Robots-Tag": "noai"}))
    path = tmp_path / "urls.csv"
    path.write_text(f"jpg\n{url}\n", encoding="utf-8")
    # Its one row left out: no sample to write, so no dataset (see test_no_sample.py).
    assert main(["write", str(path), str(tmp_path / "polite"), *FAST]) == 2
    assert "the one input was skipped (by reason: opt_out 1)" in capsys.readouterr().err
    assert not (tmp_path / "polite" / "manifest.json").exists()
    assert main(["write", str(path), str(tmp_path / "all"), "--no-respect-opt-out", *FAST]) == 0
    assert [fields["jpg"] for fields in _members(tmp_path / "all").values()] == [jpeg]
