"""The ImageFolder row of the writer benchmark: the peers write the samples shardkit writes."""

from __future__ import annotations

from pathlib import Path

import webdataset as wds

from bench.harness.scale_writer import image_folder, image_samples, image_table
from shardkit.format.manifest import load_manifest
from shardkit.write.parallel import WriteOptions, write_dataset


def test_peers_list_the_image_folder_as_shardkit_reads_it(tmp_path):
    root = image_folder(str(tmp_path / "work"), 300)
    samples = image_samples(root)
    assert len(samples) == 300 and len({Path(p).read_bytes() for _, p, _ in samples}) == 300  # all different
    dest = tmp_path / "out"
    write_dataset(root, str(dest), options=WriteOptions(workers=1, shuffle=False))
    manifest = load_manifest(str(dest))
    written = [(s["__key__"], s["jpg"], int(s["cls"]))
               for entry in manifest.shards for s in wds.WebDataset([manifest.resolve(entry.path)], shardshuffle=False)]
    assert written == [(key, Path(path).read_bytes(), label) for key, path, label in samples]


def test_image_table_puts_scan_and_plan_beside_shardkits_rows_with_cpu_rates_and_names_errors():
    images = {
        "files": 100_000, "mean_file_bytes": 640.4, "shard_bytes": 16 << 20,
        "plan": [{"workers": 1, "driver_peak_mb": 43.2, "rows_per_s": 91_000.0}, {"workers": 2, "error": "timeout after 1800 s"}],
        "write": [
            {"peer": "shardkit", "workers": 1, "seconds": 6.5, "samples_per_s": 15_384.6, "driver_peak_mb": 56.0,
             "cpu_seconds": 7.0, "samples_per_cpu_s": 14_285.7,
             "runs": [{"samples_per_s": 15_384.6, "samples_per_cpu_s": 14_285.7}, {"samples_per_s": 14_000, "samples_per_cpu_s": 13_000}]},
            {"peer": "shardkit", "workers": 2, "seconds": 4.0, "samples_per_s": 25_000.0, "driver_peak_mb": 57.0},
            {"peer": "mosaic", "workers": 1, "error": "MemoryError"},
        ],
    }
    lines = image_table(images)
    assert lines[0] == (
        "## ImageFolder of 100,000 small files (100 classes, JPEGs of 640 B on average, page cache warm; shards of 16 MB)"
    )
    assert lines[-3:] == [
        "| shardkit | 1 | 43 | 91,000 | 6.5 | 15,385 | 7.0 | 14,286 (runs: 14,286, 13,000) | 56 |",
        "| shardkit | 2 | error: timeout after 1800 s | – | 4.0 | 25,000 | – | – | 57 |",
        "| mosaic | 1 | – | – | error: MemoryError |",
    ]
