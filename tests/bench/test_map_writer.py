"""The map-writer benchmark's own parts: the shared functions, the hand-rolled writer, the read-back check.

No Ray and no LitData venv: those cells only run in ``bench/bench_map_writer.py``.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import sys
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

from bench.bench_map_writer import check_samples, tar_samples
from bench.map_functions import (
    encode_fields,
    image_items,
    ray_row,
    resize_photo,
    sample_key,
    text_items,
    token_ids,
    tokenize_caption,
)
from bench.map_handrolled import make_wds_shards

ROOT = Path(__file__).resolve().parents[2]


def write_photos(folder: Path, count: int) -> list[str]:
    """A few photo-like JPEGs of about 500x375 (tools/gen_photos.py, preset ``imagenet``)."""
    spec = importlib.util.spec_from_file_location("_gen_photos_map", ROOT / "tools" / "gen_photos.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen  # its dataclasses look their module up
    spec.loader.exec_module(gen)
    folder.mkdir()
    paths = []
    for i, data in enumerate(gen.photo_jpegs("imagenet", count, seed=1)):
        path = folder / f"photo_{i}.jpg"
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def read_shards(folder: Path) -> list[dict]:
    return list(wds.WebDataset(sorted(str(p) for p in folder.glob("*.tar")), shardshuffle=False, empty_check=False))


def test_hand_rolled_writer_writes_each_image_item_once_resized_to_256(tmp_path):
    items = image_items(write_photos(tmp_path / "photos", 3), 7)  # cycles over the 3 photos
    out = tmp_path / "images"
    out.mkdir()
    assert make_wds_shards(str(out / "shard-%03d.tar"), 3, 2, items, resize_photo, seed=5) == 7
    samples = read_shards(out)
    assert sorted(s["__key__"] for s in samples) == [sample_key(i) for i in range(7)]
    for sample in samples:
        index = int(sample["__key__"])
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == {"jpg", "cls"}
        assert int(sample["cls"]) == index % 1000
        with Image.open(io.BytesIO(sample["jpg"])) as image:
            assert image.format == "JPEG" and min(image.size) == 256
    assert check_samples(tar_samples(str(out)), {"function": "image", "items": 7}) == {"samples": 7}


def test_hand_rolled_writer_shuffles_text_items_into_every_shard_and_tokens_round_trip(tmp_path):
    items = text_items(40, seed=0)
    assert items == text_items(40, seed=0) and all(10 <= len(c.split()) <= 40 for _, c in items)
    out = tmp_path / "text"
    out.mkdir()
    assert make_wds_shards(str(out / "shard-%03d.tar"), 4, 2, items, tokenize_caption, seed=0) == 40
    per_shard = [len(list(wds.WebDataset(str(p), shardshuffle=False))) for p in sorted(out.glob("*.tar"))]
    assert per_shard == [10, 10, 10, 10]
    captions = dict(items)
    for sample in read_shards(out):
        caption = captions[int(sample["__key__"])]
        assert sample["txt"].decode() == caption
        tokens = np.load(io.BytesIO(sample["tokens.npy"]))
        assert tokens.dtype == np.int32 and np.array_equal(tokens, token_ids(caption))
    assert check_samples(tar_samples(str(out)), {"function": "text", "items": 40}) == {"samples": 40}


def test_tokenizer_is_a_stable_hash_of_lower_case_words_and_punctuation():
    ids = token_ids("Red fox, red FOX.")
    red, fox, comma, red_again, fox_again, stop = ids.tolist()  # case folded; punctuation is a token
    assert (red, fox) == (red_again, fox_again) and len({red, fox, comma, stop}) == 4
    assert ((ids >= 0) & (ids < 50_000)).all()


def test_functions_pickle_by_reference_and_the_ray_adapter_gives_bytes_of_the_same_sample():
    assert pickle.loads(pickle.dumps(tokenize_caption)) is tokenize_caption
    assert len(pickle.dumps(resize_photo)) < 100  # module and name, not code
    row = ray_row({"index": 3, "value": "Two words."}, fn=tokenize_caption)
    assert row == encode_fields(tokenize_caption((3, "Two words.")))
    assert row["__key__"] == "000000003" and row["txt"] == b"Two words."
    assert np.array_equal(np.load(io.BytesIO(row["tokens.npy"])), token_ids("Two words."))


def test_check_samples_names_duplicates_missing_items_and_wrong_fields():
    samples = [("000000000", ["txt", "tokens.npy"]), ("000000000", ["txt", "tokens.npy"]), ("000000002", ["txt"])]
    assert check_samples(iter(samples), {"function": "text", "items": 3}) == {
        "samples": 3,
        "error": "wrote 3 samples for 3 items (1 duplicate keys, 1 items missing, "
        "1 samples without exactly ['tokens.npy', 'txt'])",
    }
