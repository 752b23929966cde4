"""Tables as sources: Parquet, CSV/TSV and datasets folders read as rows and
partitions; column-to-field maps; rows of URLs turned into samples."""

from __future__ import annotations

import io
import json
import logging
import pickle

import pytest

from shardkit.errors import SourceError, UsageError
from shardkit.write.download import Downloader, DownloadOptions
from shardkit.write.fieldmap import FieldMap, UrlField
from shardkit.write.parallel import WriteOptions
from shardkit.write.ingest import IngestedSample, SkippedRow, ingest_rows
from shardkit.write.resize import ImageOptions
from shardkit.write.sources.table_reader import open_table, read_rows
from tests.write.url_servers import Answer, ScriptedServer, photo_jpeg

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def image_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    return Image.open(io.BytesIO(data)).size


def all_rows(table, columns=None):
    columns = list(columns or table.columns)
    return [row for partition in table.partitions for row in read_rows(table, partition, columns)]


def write_parquet(path, rows: dict, row_group_size: int) -> None:
    pq.write_table(pa.table(rows), path, row_group_size=row_group_size)


def test_parquet_file_folder_and_pattern_read_every_row_once_with_positions(tmp_path):
    (tmp_path / "parts").mkdir()
    for i in range(3):
        write_parquet(tmp_path / "parts" / f"p{i}.parquet",
                      {"url": [f"http://h/{i}/{j}.jpg" for j in range(5)], "caption": [f"c{i}{j}" for j in range(5)]},
                      row_group_size=2)  # fmt: skip
    expected = [(5 * i + j, {"url": f"http://h/{i}/{j}.jpg", "caption": f"c{i}{j}"}) for i in range(3) for j in range(5)]
    for source in (str(tmp_path / "parts"), str(tmp_path / "parts" / "p{0..2}.parquet")):
        table = open_table(source)
        assert table.format == "parquet" and table.columns == ("url", "caption") and table.num_rows == 15
        assert len(table.partitions) == 9  # 3 row groups (2+2+1) per file
        assert [(p.first_row, p.num_rows) for p in table.partitions[:3]] == [(0, 2), (2, 2), (4, 1)]
        assert all_rows(table) == expected
    copy = pickle.loads(pickle.dumps(table))  # what a worker process or a Ray task gets
    assert copy.partitions == table.partitions and all_rows(copy) == expected
    assert copy.partitions.array.shape == (9, 6) and copy.partitions[-1].path.endswith("p2.parquet")
    one = open_table(str(tmp_path / "parts" / "p1.parquet"))
    assert all_rows(one, ["caption"])[0] == (0, {"caption": "c10"})


def test_parquet_files_with_other_columns_are_refused_naming_the_file(tmp_path):
    write_parquet(tmp_path / "a.parquet", {"url": ["x"]}, 1)
    write_parquet(tmp_path / "b.parquet", {"URL": ["x"]}, 1)
    with pytest.raises(SourceError, match=r"b\.parquet: its columns \(URL\) differ from those of .*a\.parquet \(url\)"):
        open_table(str(tmp_path))


CSV_TEXT = (
    'url,caption,n\n'
    'http://h/0.jpg,plain,0\n'
    'http://h/1.jpg,"with, comma",1\n'
    'http://h/2.jpg,"two\nlines",2\n'
    '\n'
    'http://h/4.jpg,"a ""quoted"" word",4\n'
    'http://h/5.jpg,last without newline,5'
)


@pytest.mark.parametrize("partition_bytes", [1, 7, 40, 1 << 20])
def test_csv_partitions_split_at_row_boundaries_and_give_the_same_rows(tmp_path, partition_bytes):
    path = tmp_path / "meta.csv"
    path.write_bytes(CSV_TEXT.encode())
    table = open_table(str(path), partition_bytes=partition_bytes)
    assert table.columns == ("url", "caption", "n") and table.num_rows == 6
    rows = all_rows(table)
    assert rows == [
        (0, {"url": "http://h/0.jpg", "caption": "plain", "n": "0"}),
        (1, {"url": "http://h/1.jpg", "caption": "with, comma", "n": "1"}),
        (2, {"url": "http://h/2.jpg", "caption": "two\nlines", "n": "2"}),
        (4, {"url": "http://h/4.jpg", "caption": 'a "quoted" word', "n": "4"}),  # the blank line keeps position 3
        (5, {"url": "http://h/5.jpg", "caption": "last without newline", "n": "5"}),
    ]
    starts = [p.start for p in table.partitions]
    assert starts == sorted(set(starts)) and table.partitions[-1].end == len(CSV_TEXT)
    if partition_bytes == 1:
        # One per row (the blank line joins the next): never inside the quoted newline.
        assert [(p.first_row, p.num_rows) for p in table.partitions] == [(0, 1), (1, 1), (2, 1), (3, 2), (5, 1)]


def test_tsv_has_no_quoting(tmp_path):
    path = tmp_path / "cc.tsv"
    path.write_text('caption\turl\nsays "hi\tthere\nsecond "row\thttp://h/1.jpg\n', encoding="utf-8")
    table = open_table(str(path), partition_bytes=1)
    assert all_rows(table, ["url", "caption"]) == [
        (0, {"url": "there", "caption": 'says "hi'}),
        (1, {"url": "http://h/1.jpg", "caption": 'second "row'}),
    ]


def test_csv_that_is_not_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("url,caption\nhttp://h/0.jpg,ok\nhttp://h/1.jpg,café\n".encode("latin-1"))
    for partition_bytes in (1, 1 << 20):
        table = open_table(str(path), partition_bytes=partition_bytes)
        with pytest.raises(SourceError, match=r"latin1\.csv: line 3: byte 0xe9 at column 19 is not UTF-8") as caught:
            all_rows(table)
        assert caught.value.line == 3 and caught.value.path == str(path)


def test_csv_row_with_the_wrong_number_of_fields_names_its_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text('url,caption\nhttp://h/0.jpg,"a\nb"\nhttp://h/1.jpg,x,extra\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"bad\.csv: line 4: 3 fields where the header names 2 columns"):
        all_rows(open_table(str(path)))
    unclosed = tmp_path / "open.csv"
    unclosed.write_text('url,caption\nhttp://h/0.jpg,"never closed\n', encoding="utf-8")
    with pytest.raises(SourceError, match="quoted field is still open"):
        open_table(str(unclosed))


def test_datasets_folder_keeps_image_bytes_as_they_are(tmp_path):
    datasets = pytest.importorskip("datasets")
    jpeg = photo_jpeg(32, 24)
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": jpeg, "path": None}] * 3, "text": ["a", "b", "c"], "label": [0, 1, 2]}, features=features
    )
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
    table = open_table(str(tmp_path / "ds"))
    assert table.format == "arrow" and table.num_rows == 3 and len(table.partitions) == 2
    fields = FieldMap.parse(["jpg=image", "txt=text", "cls=label"]).resolve(table.columns, source=table.source)
    samples = [fields.sample(pos, row, source=table.source) for pos, row in all_rows(table, fields.columns_read(table.columns))]
    assert [s.key for s in samples] == ["000000000", "000000001", "000000002"]
    assert samples[2].fields == (("cls", b"2"), ("jpg", jpeg), ("txt", b"c"))
    with Downloader(DownloadOptions(num_threads=2)) as downloader:
        as_is = list(ingest_rows(samples, downloader=downloader))
        resized = list(ingest_rows(samples, downloader=downloader, images=ImageOptions(resize=16)))
    assert as_is[2].fields == samples[2].fields  # no URL, no --resize: stored as they are, no json added
    fields_out = dict(resized[2].fields)
    assert image_size(fields_out["jpg"]) == (21, 16)
    assert json.loads(fields_out["json"]) == {"original_width": 32, "original_height": 24, "width": 21, "height": 16}
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceError, match=r"a DatasetDict with splits .*train.*; pass one split's folder"):
        open_table(str(tmp_path / "dd"))


def test_field_map_refuses_a_missing_column_naming_those_that_exist():
    columns = ("URL", "TEXT", "WIDTH")
    with pytest.raises(SourceError, match=r"meta\.parquet: --field jpg=url: no column 'url'; the columns are: URL, TEXT, WIDTH"):
        FieldMap.parse(["jpg=url"]).resolve(columns, source="meta.parquet")
    with pytest.raises(SourceError, match=r"--key id: no such column; the columns are: URL, TEXT, WIDTH"):
        FieldMap.parse(["jpg=URL"], key_column="id").resolve(columns, source="meta.parquet")
    with pytest.raises(SourceError, match=r"no column is named after a field extension \(URL, TEXT, WIDTH\); map them"):
        FieldMap.parse([]).resolve(columns, source="meta.parquet")
    for bad, message in [("jpg", "EXT=COLUMN"), ("txt=*", "only goes with json"), ("a/b=URL", "cannot be")]:
        with pytest.raises(UsageError, match=message):
            FieldMap.parse([bad])


def test_columns_the_default_map_leaves_out_are_named_with_the_flag_to_keep_them(tmp_path, caplog):
    """A LAION-style table (url, caption) written without --field: the
    caption maps to itself, and the url column would be dropped without a
    word; the write says so, before anything is fetched or written."""
    from shardkit.write.dry_run import plan_dataset

    table = tmp_path / "meta.csv"
    table.write_text("url,caption,width\nhttp://127.0.0.1:9/a.jpg,a cat,4\n")
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        plan = plan_dataset(str(table))
    assert plan.num_samples == 1
    (message,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "column(s) url, width left out" in message and "--field jpg=url" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        plan_dataset(str(table), options=WriteOptions(fields=("txt=caption", "jpg=url", "json=*")))
    assert not [r for r in caplog.records if "left out" in r.getMessage()]  # mapped: nothing to say


def test_field_map_defaults_rest_as_json_and_keys():
    default = FieldMap.parse([]).resolve(("__key__", "jpg", "txt", "score"), source="t")
    assert default.fields == (("jpg", "jpg"), ("txt", "txt")) and default.key_column == "__key__"
    row = {"__key__": "a1", "jpg": "https://h/a1.jpg", "txt": "a cat", "score": 0.5}
    assert default.sample(7, row, source="t").fields == (("jpg", UrlField("https://h/a1.jpg")), ("txt", b"a cat"))
    mapped = FieldMap.parse(["jpg=URL", "txt=TEXT", "json=*"], key_column="id").resolve(
        ("id", "URL", "TEXT", "W", "when"), source="t"
    )
    sample = mapped.sample(3, {"id": 17, "URL": None, "TEXT": None, "W": float("nan"), "when": b"\x00"}, source="t")
    assert sample.key == "17" and sample.fields == (("jpg", UrlField("")),)  # no text; the empty URL is kept for bad_url
    assert sample.record == {"W": None, "when": {"base64": "AA=="}}
    with pytest.raises(SourceError, match=r"row 4: key 'a.b' from column 'id' may not hold a dot"):
        mapped.sample(4, {"id": "a.b", "URL": "x", "TEXT": "t"}, source="t")


def test_rows_of_urls_become_samples_in_row_order_with_failures_recorded(tmp_path):
    server = ScriptedServer()
    try:
        big = photo_jpeg(800, 600, seed=1)
        urls = [
            server.serve("/0.jpg", Answer(body=big)),
            server.serve("/1.jpg", Answer(404)),
            server.serve("/2.jpg", Answer(body=b"<html>login</html>", headers={"Content-Type": "image/jpeg"})),
            server.serve("/3.jpg", Answer(body=big[: len(big) // 2])),
            "not a url",
            server.serve("/5.jpg", Answer(body=photo_jpeg(100, 80, seed=5), headers={"X-Robots-Tag": "noai"})),
            server.serve("/6.jpg", Answer(body=photo_jpeg(120, 90, seed=6))),
        ]
        write_parquet(tmp_path / "meta.parquet", {"URL": urls, "TEXT": [f"caption {i}" for i in range(7)],
                                                  "similarity": [i / 10 for i in range(7)]}, row_group_size=3)  # fmt: skip
        table = open_table(str(tmp_path / "meta.parquet"))
        fields = FieldMap.parse(["jpg=URL", "txt=TEXT", "json=*"]).resolve(table.columns, source=table.source)
        samples = (fields.sample(pos, row, source=table.source) for pos, row in all_rows(table))
        options = DownloadOptions(num_threads=4, read_timeout_s=2.0, backoff_initial_s=0.01)
        with Downloader(options) as downloader:
            results = list(ingest_rows(samples, downloader=downloader, images=ImageOptions(resize=64)))
    finally:
        server.close()
    assert [type(r).__name__ for r in results] == ["IngestedSample", "SkippedRow", "SkippedRow", "SkippedRow",
                                                   "SkippedRow", "SkippedRow", "IngestedSample"]  # fmt: skip
    assert [r.reason for r in results if isinstance(r, SkippedRow)] == [
        "http_404", "not_image", "not_image", "bad_url", "opt_out"
    ]
    first = results[0]
    assert isinstance(first, IngestedSample) and first.key == "000000000"
    assert [ext for ext, _ in first.fields] == ["jpg", "json", "txt"]
    record = json.loads(dict(first.fields)["json"])
    assert record == {"url": urls[0], "status": 200, "original_width": 800, "original_height": 600,
                      "width": 85, "height": 64, "similarity": 0.0}  # fmt: skip
    skip = results[1].skipped_input(table.source)
    assert skip.path.endswith("meta.parquet#row=1") and skip.reason.startswith("http_404: jpg http://127.0.0.1")
    error = results[1].error(table.source)  # what on_error="raise" raises
    assert isinstance(error, SourceError) and "meta.parquet: row 1 (key 000000001): http_404" in str(error)
    assert "--on-error skip" in str(error)


def test_missing_pyarrow_names_the_extra(tmp_path, monkeypatch):
    write_parquet(tmp_path / "t.parquet", {"url": ["x"]}, 1)
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(__import__("sys").modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'shardkit\[tables\]'"):
        open_table(str(tmp_path / "t.parquet"))
