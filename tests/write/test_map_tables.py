"""`map` over a table: each row reaches the function as a shard writer
would store it (local files read, URLs fetched from a real server on
127.0.0.1, images checked), and rows that could not be fetched are left out
by reason before the function runs."""

from __future__ import annotations

import csv

from shardkit.format.manifest import load_manifest
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.write import map_functions as fns
from tests.write.test_map_writer import samples_of
from tests.write.test_table_files import ROWS, local_image_table
from tests.write.url_servers import Answer, photo_jpeg, server  # noqa: F401  (the fixture)


def test_map_over_a_csv_of_local_files_gets_each_row_with_its_files_bytes(tmp_path):
    images = local_image_table(tmp_path)
    options = WriteOptions(fields=("jpg=file", "txt=caption"), workers=2)
    report = write_dataset(str(tmp_path / "meta.csv"), str(tmp_path / "out"), map=fns.shout, options=options)
    got = samples_of(tmp_path / "out")
    assert report.num_items == ROWS and len(got) == ROWS
    for key, data in images.items():
        assert got[key]["jpg"] == data
        assert got[key]["txt"] == f"PHOTO {int(key)}".encode()


def test_map_over_a_csv_of_urls_sees_fetched_rows_and_a_failed_fetch_is_skipped_by_reason(tmp_path, server):
    photo = photo_jpeg(40, 30)
    with open(tmp_path / "urls.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["url", "caption"])
        for i in range(6):
            path = f"/{i}.jpg"
            server.serve(path, Answer(404, b"gone") if i == 4 else Answer(200, photo))
            writer.writerow([server.base_url + path, f"cat {i}"])
    options = WriteOptions(fields=("jpg=url", "txt=caption"), workers=1)
    report = write_dataset(str(tmp_path / "urls.csv"), str(tmp_path / "out"), map=fns.shout, options=options)
    got = samples_of(tmp_path / "out")
    assert sorted(got) == [f"{i:09d}" for i in (0, 1, 2, 3, 5)]
    assert {s["jpg"] for s in got.values()} == {photo} and got[f"{5:09d}"]["txt"] == b"CAT 5"
    manifest = load_manifest(str(tmp_path / "out"))
    (skipped,) = manifest.skipped
    assert skipped.path.endswith("urls.csv#row=4") and skipped.reason.startswith("http_404: jpg ")
    assert (report.num_items, report.num_failed) == (6, 1)
