"""`--resize` applies to every source it names: ImageFolder, directory, JSONL,
tar shards and a Python sequence (tables resize as they download, see
test_ingest_write.py). Before, it was ignored on all but tables while the
manifest recorded resize=N."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

import shardkit
from shardkit.cli import main
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.write import map_functions as fns
from tests.write.test_map_writer import samples_of
from tests.write.url_servers import photo_jpeg

Image = pytest.importorskip("PIL.Image")


def _size(data: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(data)).size


def _photos() -> dict[str, bytes]:
    return {f"p{i}": photo_jpeg(120 + 10 * i, 90, seed=i) for i in range(4)}


def _imagefolder(root) -> None:
    for i, (name, data) in enumerate(_photos().items()):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jpg").write_bytes(data)


def _directory(root) -> None:
    root.mkdir()
    for name, data in _photos().items():
        (root / f"{name}.jpg").write_bytes(data)
        (root / f"{name}.txt").write_text(name)


def _jsonl(root) -> None:
    root.mkdir()
    rows = []
    for name, data in _photos().items():
        (root / f"{name}.jpg").write_bytes(data)
        rows.append(json.dumps({"__key__": name, "jpg": f"{name}.jpg", "txt": name}))
    (root / "rows.jsonl").write_text("\n".join(rows) + "\n")


def _tar(root) -> None:
    root.mkdir()
    with tarfile.open(root / "in-000000.tar", "w") as tar:
        for name, data in _photos().items():
            info = tarfile.TarInfo(f"{name}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


SOURCES = {
    "imagefolder": (_imagefolder, ""),
    "directory": (_directory, ""),
    "jsonl": (_jsonl, "rows.jsonl"),
    "tar": (_tar, ""),
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_resize_applies_to_every_path_source(tmp_path, kind):
    make, inside = SOURCES[kind]
    root = tmp_path / "src"
    make(root)
    source = str(root / inside) if inside else str(root)
    dest = tmp_path / "out"
    assert main(["write", source, str(dest), "--resize", "32", "-q", "--workers", "2"]) == 0
    got = samples_of(dest)
    assert len(got) == 4
    for sample in got.values():
        width, height = _size(sample["jpg"])
        assert min(width, height) == 32 and width > height  # the shorter side, the ratio kept
    manifest = shardkit.load_manifest(str(dest))
    assert manifest.options["resize"] == 32 and manifest.source["format"] == kind


def test_image_format_renames_the_member_after_what_it_holds(tmp_path):
    root = tmp_path / "src"
    _imagefolder(root)
    dest = tmp_path / "out"
    assert main(["write", str(root), str(dest), "--resize", "20", "--image-format", "png", "-q"]) == 0
    for sample in samples_of(dest).values():
        assert set(sample) == {"png", "cls"}
        assert Image.open(io.BytesIO(sample["png"])).format == "PNG"


def test_resize_applies_to_what_map_returns(tmp_path):
    report = write_dataset(range(6), str(tmp_path / "out"), map=fns.image_item,
                           options=WriteOptions(resize=24, workers=2))  # fmt: skip
    assert report.manifest.num_samples == 6
    assert {_size(s["png"]) for s in samples_of(tmp_path / "out").values()} == {(32, 24)}


def test_an_image_that_does_not_decode_is_named_or_skipped(tmp_path):
    root = tmp_path / "src"
    _directory(root)
    (root / "bad.jpg").write_bytes(b"not an image at all")
    dest = tmp_path / "out"
    with pytest.raises(shardkit.SourceError, match=r"bad\.jpg.*field 'jpg': cannot identify an image"):
        write_dataset(str(root), str(dest), options=WriteOptions(resize=16))
    report = write_dataset(str(root), str(dest), options=WriteOptions(resize=16, on_error="skip"))
    assert report.manifest.num_samples == 4
    (skipped,) = report.manifest.skipped
    assert skipped.reason.startswith("not_image: ") and skipped.path.endswith("bad.jpg")


def test_without_resize_path_sources_skip_the_map_stage_and_keep_their_bytes(tmp_path):
    root = tmp_path / "src"
    _directory(root)
    dest = tmp_path / "out"
    write_dataset(str(root), str(dest))
    got = samples_of(dest)
    assert got["p1"]["jpg"] == _photos()["p1"]
    assert not (dest / ".shardkit-journal").exists()


@pytest.mark.parametrize(
    "options, says",
    [
        ({"resize_mode": "center_crop"}, r"--resize-mode \(resize_mode\) applies with --resize only"),
        ({"image_quality": 80}, r"--image-quality \(image_quality\) applies to re-encoded images only"),
    ],
)
def test_image_options_that_would_do_nothing_without_resize_are_refused(options, says):
    with pytest.raises(shardkit.UsageError, match=says):
        WriteOptions(**options)
    WriteOptions(resize=64, **options)  # with --resize they apply
