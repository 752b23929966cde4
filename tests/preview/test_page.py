"""shardkit.show: the page of a real dataset, what it shows and what it refuses to draw."""

from __future__ import annotations

import base64
import io
import re
import sys

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit.errors import ManifestError, UsageError
from shardkit.preview.build import ShowOptions
from shardkit.preview.page import CONTENT_SECURITY_POLICY
from tests.preview.datasets import (
    HOSTILE_CAPTION,
    image_dataset,
    jpeg,
    mixed_dataset,
    text_dataset,
    wav,
)
from tests.preview.pages import assert_self_contained, parse


def _placeholders(page: str) -> list[str]:
    return [" ".join("".join(parse(m).text).split()) for m in re.findall(r'<div class="placeholder">.*?</div>', page)]


def test_image_page_has_one_card_per_sample_with_thumbnails_and_class_names(tmp_path):
    image_dataset(str(tmp_path / "ds"), num_samples=4)
    page = shardkit.show(tmp_path / "ds", samples=4)
    parsed = assert_self_contained(page)
    cards = parsed.all("article", "card")
    assert len(cards) == 4
    images = parsed.all("img")
    assert len(images) == 4
    for attrs in images:
        assert attrs["src"].startswith("data:image/jpeg;base64,")
        thumb = Image.open(io.BytesIO(base64.b64decode(attrs["src"].split(",", 1)[1])))
        assert thumb.size == (256, 192) == (int(attrs["width"]), int(attrs["height"]))  # 320 x 240 made small
    text = " ".join(" ".join(parsed.text).split())
    for key in ("img000", "img001", "img002", "img003"):
        assert key in text
    assert "0 cat" in text and "1 dog" in text  # the cls value with the manifest's class name
    assert "320 x 240" in text  # the original's size under its thumbnail
    assert "shard-000000.tar @ byte 0" in text and "shard-000001.tar" in text
    assert "a photo, number 2" in text


def test_page_policy_allows_nothing_from_outside(tmp_path):
    image_dataset(str(tmp_path / "ds"))
    page = shardkit.show(str(tmp_path / "ds"))
    metas = parse(page).all("meta")
    policy = [m["content"] for m in metas if m.get("http-equiv") == "Content-Security-Policy"]
    assert policy == [CONTENT_SECURITY_POLICY]
    assert "default-src 'none'" in policy[0] and "script-src" not in policy[0]


def test_same_seed_same_samples_other_seed_others(tmp_path):
    text_dataset(str(tmp_path / "ds"), num_samples=30)

    def keys(seed: int) -> list[str]:
        page = shardkit.show(tmp_path / "ds", samples=5, seed=seed)
        return re.findall(r'<span class="key">(t\d+)</span>', page)

    first = keys(1)
    assert len(first) == len(set(first)) == 5
    assert keys(1) == first
    assert keys(2) != first


def test_text_page_escapes_markup_in_captions_and_json(tmp_path):
    text_dataset(str(tmp_path / "ds"), num_samples=30)
    page = shardkit.show(tmp_path / "ds", samples=30)
    parsed = assert_self_contained(page)
    assert len(parsed.all("article", "card")) == 30
    # The markup is on the page as text, exactly as the caption holds it.
    assert HOSTILE_CAPTION in "".join(parsed.text)
    assert "<script>" not in page and "<img src=x" not in page and "<b onclick" not in page
    assert "&lt;script&gt;document.title=&quot;owned&quot;&lt;/script&gt;" in page
    assert not parsed.all("b")
    # JSON is pretty-printed inside a <details> that collapses it.
    details = re.findall(r"<details><summary>(.*?)</summary><pre>(.*?)</pre></details>", page, re.S)
    assert len(details) == 30
    assert all(summary.startswith("JSON, ") for summary, _ in details)
    assert '  &quot;url&quot;: &quot;javascript:alert(1)&quot;' in details[0][1]


def test_control_and_bidi_characters_are_shown_not_obeyed(tmp_path):
    with shardkit.ShardWriter(str(tmp_path / "ds")) as writer:
        writer.write({"__key__": "evil\u202ekey", "txt": "bell\x07 and\u202e reversed"})
    page = shardkit.show(tmp_path / "ds")
    assert "\u202e" not in page and "\x07" not in page
    assert "evil\\u202ekey" in page and "bell\\x07" in page


def test_mixed_page_renders_each_kind_and_says_why_it_drew_nothing(tmp_path):
    mixed_dataset(str(tmp_path / "ds"))
    page = shardkit.show(tmp_path / "ds", samples=4)
    parsed = assert_self_contained(page)
    assert len(parsed.all("article", "card")) == 4
    text = " ".join(" ".join(parsed.text).split())
    assert "shape (3, 4), dtype <i4" in text and "first values: [0, 1, 2, 3, 4, 5, 6, 7, ...]" in text
    assert "1 one" in text  # cls with its class name
    audio, video = parsed.all("audio"), parsed.all("video")
    assert len(audio) == 1 and audio[0]["src"] == "data:audio/wav;base64," + base64.b64encode(wav()).decode()
    assert len(video) == 1 and video[0]["src"].startswith("data:video/mp4;base64,")
    assert "00 01 02 03" in text  # other bytes: their first bytes in hex
    assert len(parsed.all("img")) == 1  # the one real image; the others are placeholders
    assert sorted(_placeholders(page)) == [
        "avi video, not embedded: browsers do not play it",
        "not drawn: image header gives 20000 x 20000 = 400,000,000 pixels, over the page's limit of "
        "89,478,485 pixels",
        "not drawn: not an image Pillow recognises (first bytes 74 68 69 73 20 69 73 20)",
        "shape (9999999,), dtype <f8: the header asks for 79,999,992 bytes of data, the member holds 32",
    ]


def test_a_small_pixel_limit_gives_a_placeholder_not_a_decode(tmp_path):
    image_dataset(str(tmp_path / "ds"), num_samples=2)
    page = shardkit.show(tmp_path / "ds", options=ShowOptions(samples=2, max_image_pixels=1000))
    assert not parse(page).all("img")
    assert _placeholders(page) == [
        "not drawn: image header gives 320 x 240 = 76,800 pixels, over the page's limit of 1,000 pixels"
    ] * 2


def test_page_size_limit_keeps_the_page_small(tmp_path):
    image_dataset(str(tmp_path / "ds"), num_samples=4)
    page = shardkit.show(tmp_path / "ds", options=ShowOptions(samples=4, max_page_bytes=3000))
    images = parse(page).all("img")
    assert 0 < len(images) < 4
    assert "320 x 240 image not embedded: the page is at its size limit" in _placeholders(page)


def test_a_sample_too_large_to_read_and_a_damaged_shard_become_cards_saying_why(tmp_path):
    dest = tmp_path / "ds"
    with shardkit.ShardWriter(str(dest), max_samples=2) as writer:
        writer.write({"__key__": "big", "bin": bytes(5000)})
        writer.write({"__key__": "fine", "txt": "fine"})
        writer.write({"__key__": "broken", "txt": "x" * 100})
    shard = dest / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[0:100] = b"\xff" * 100  # the member header's name and checksum: not a tar header any more
    shard.write_bytes(bytes(data))
    page = shardkit.show(dest, options=ShowOptions(samples=3, max_sample_bytes=4096))
    cards = parse(page).all("article", "card")
    assert len(cards) == 3 and len(parse(page).all("article", "failed")) == 2
    reasons = _placeholders(page)
    assert any(r.startswith("not read: MemberTooLargeError:") and "shard-000000.tar" in r
               and "over the limit of 4,096 bytes" in r for r in reasons), reasons  # fmt: skip
    assert any(r.startswith("not read: CorruptShardError:") and "shard-000001.tar" in r for r in reasons), reasons
    assert "fine" in "".join(parse(page).text)


def test_statistics_cover_shards_fields_classes_skipped_removed_and_options(tmp_path):
    dest = str(tmp_path / "ds")
    image_dataset(dest, num_samples=10, max_samples=4)
    shardkit.remove_samples(dest, ["img003"])
    page = shardkit.show(dest, samples=2, stats_samples=100)
    manifest = shardkit.load_manifest(dest)
    text = " ".join(" ".join(parse(page).text).split())
    assert "samples per shard min 2, median 3, max 4" in text  # 4, 4, 2 less the one removed: 3, 4, 2
    assert "removed 1 samples (shardkit remove) in 1 shards" in text
    assert "Fields, over 9 samples drawn" in text
    assert "cls 9 of 9" in text and "jpg 9 of 9" in text
    assert "0 (cat) 5" in text and "1 (dog) 4" in text  # class balance over the samples drawn
    assert f"fingerprint {manifest.fingerprint}" in text
    assert "max_samples 4" in text
    assert len(re.findall(r'<figure class="plot"><svg\b', page)) == 5  # two per shard, sizes, presence, classes
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page and "<metadata" not in page


def test_skipped_inputs_are_counted_by_reason(tmp_path):
    import dataclasses

    image_dataset(str(tmp_path / "ds"))
    skipped = [shardkit.SkippedInput(f"u{i}", reason) for i, reason in
               enumerate(["http_404: gone", "http_404: gone", "timeout: 10 s", "<b>odd</b> input"])]  # fmt: skip
    manifest = dataclasses.replace(shardkit.load_manifest(str(tmp_path / "ds")), skipped=tuple(skipped))
    page = shardkit.show(manifest)
    text = " ".join(" ".join(parse(page).text).split())
    assert "Inputs skipped when written: 4 reason inputs http_404 2 input 1 timeout 1" in text
    assert not parse(page).all("b")


def test_without_matplotlib_the_statistics_are_tables_and_the_page_says_so(tmp_path, monkeypatch):
    image_dataset(str(tmp_path / "ds"))
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on an install without the show extra
    page = shardkit.show(tmp_path / "ds")
    assert "<svg" not in page
    assert "plots need matplotlib: pip install &#x27;shardkit[show]&#x27;" in page
    assert "samples per shard" in page and len(parse(page).all("article", "card")) == 4


def test_published_shards_are_shown_through_their_index(tmp_path):
    from tests.conftest import build_dataset

    build_dataset(str(tmp_path / "published"), [3, 4], with_manifest=False)
    shardkit.index_dataset(str(tmp_path / "published"), out=str(tmp_path / "index"))
    page = shardkit.show(tmp_path / "index", samples=7)
    parsed = assert_self_contained(page)
    assert len(parsed.all("article", "card")) == 7
    assert "s001_00003" in "".join(parsed.text)


def test_samples_zero_writes_the_statistics_alone(tmp_path):
    image_dataset(str(tmp_path / "ds"))
    page = shardkit.show(tmp_path / "ds", samples=0)
    assert not parse(page).all("article") and "Statistics" in page


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples": -1}, "samples must be a whole number from 0 to 1000, not -1"),
        ({"samples": 1001}, "samples must be a whole number from 0 to 1000, not 1001"),
        ({"samples": 2.5}, "samples must be a whole number from 0 to 1000, not 2.5"),
        ({"seed": -3}, "seed must be a whole number of at least 0, not -3"),
    ],
)
def test_bad_options_are_refused_naming_them(tmp_path, kwargs, message):
    image_dataset(str(tmp_path / "ds"))
    with pytest.raises(UsageError) as info:
        shardkit.show(tmp_path / "ds", **kwargs)
    assert str(info.value) == message


def test_a_missing_dataset_says_where_it_looked(tmp_path):
    with pytest.raises(ManifestError) as info:
        shardkit.show(tmp_path / "nothing")
    assert str(tmp_path / "nothing") in str(info.value)


def test_notebook_views_show_counts_and_a_few_thumbnails(tmp_path):
    image_dataset(str(tmp_path / "ds"), num_samples=8)
    indexed = shardkit.IndexedDataset(str(tmp_path / "ds"))
    view = indexed._repr_html_()
    parsed = parse(view)
    assert "IndexedDataset: 8 samples in 4 shards" in "".join(parsed.text)
    assert len(parsed.all("article", "card")) == 6 and len(parsed.all("img")) == 6
    assert not parsed.all("script")
    streamed = parse(shardkit.ShardDataset(str(tmp_path / "ds"))._repr_html_())
    assert len(streamed.all("img")) == 6 and "8 samples in 4 shards" in "".join(streamed.text)


def test_notebook_view_of_a_stream_without_indexes_gives_its_counts(tmp_path):
    from tests.conftest import build_dataset

    build_dataset(str(tmp_path / "plain"), [2, 2], with_manifest=False)
    for idx in (tmp_path / "plain").glob("*.idx"):
        idx.unlink()
    shards = sorted(str(p) for p in (tmp_path / "plain").glob("*.tar"))
    view = shardkit.ShardDataset(shards, options=shardkit.ReaderOptions(mode="exact"))._repr_html_()
    assert view.startswith("<p>ShardDataset(") and "no offset index: no samples shown" in view


def test_npy_of_objects_is_described_not_loaded(tmp_path):
    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with shardkit.ShardWriter(str(tmp_path / "ds")) as writer:
        writer.write({"__key__": "obj", "npy": out.getvalue(), "jpg": jpeg((1, 2, 3), (8, 8))})
    page = shardkit.show(tmp_path / "ds")
    assert "shape (1,), dtype |O (values not shown: not a plain dtype)" in " ".join(parse(page).text)
