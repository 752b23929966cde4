"""Result tables, target checks and plots from hand-made results."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest

from bench.harness import report
from bench.harness.throughput import parse_dd, summarize


def make_profile(name: str, rates: dict[str, dict[int, float]], ceiling: float = 170.0) -> dict:
    runs = []
    for loader, by_workers in rates.items():
        for workers, mb_s in by_workers.items():
            for jitter in (-1.0, 0.0, 1.0):  # median is the middle one
                runs.append({"loader": loader, "workers": workers, "mb_per_s": mb_s + jitter,
                             "images_per_s": (mb_s + jitter) * 10, "first_batch_s": 0.5 + jitter / 10})
    return {
        "profile": name,
        "description": "test profile",
        "ceiling": {"mb_per_s": ceiling},
        "table": summarize(runs, ceiling),
        "unavailable": {},
    }


def test_summarize_takes_medians_and_fraction_of_ceiling():
    profile = make_profile("hdd", {"webdataset": {1: 153.0}})
    [row] = profile["table"]
    assert row["mb_per_s"] == 153.0
    assert row["images_per_s"] == 1530.0
    assert row["first_batch_s"] == 0.5
    assert row["fraction_of_ceiling"] == pytest.approx(0.9)
    assert row["runs"] == 3


def test_summarize_orders_loaders_as_the_table_does():
    profile = make_profile("raw", {"shardkit": {1: 5.0}, "imagefolder": {2: 1.0, 1: 1.0}})
    assert [(r["loader"], r["workers"]) for r in profile["table"]] == [
        ("imagefolder", 1), ("imagefolder", 2), ("shardkit", 1)]


def test_parse_dd_reads_bytes_and_seconds():
    stderr = "64+0 records in\n64+0 records out\n268435456 bytes (268 MB, 256 MiB) copied, 1.6 s, 168 MB/s\n"
    assert parse_dd(stderr) == (268435456, 1.6)
    with pytest.raises(ValueError, match="no transfer summary"):
        parse_dd("dd: error")


def test_throughput_table_has_a_row_per_loader_and_figure():
    profile = make_profile("hdd", {"imagefolder": {1: 9.0, 2: 10.0}, "webdataset": {1: 160.0, 2: 150.0}})
    table = report.throughput_table(profile)
    lines = table.splitlines()
    assert lines[0] == "| DataLoader workers | 1 | 2 |"
    assert "| ImageFolder images/s | 90 | 100 |" in lines
    assert "| webdataset MB/s | 160.0 | 150.0 |" in lines
    assert "| webdataset % of ceiling | 94% | 88% |" in lines
    assert "| webdataset s to first batch | 0.50 | 0.50 |" in lines


def test_target_checks_pass_and_fail_with_figures():
    good = make_profile("hdd-seek", {"imagefolder": {1: 9.0, 4: 9.0}, "webdataset": {1: 160.0, 4: 120.0},
                                     "shardkit": {1: 166.0, 4: 165.0}})
    bad = make_profile("ssd", {"webdataset": {1: 400.0}, "shardkit": {1: 300.0}}, ceiling=500.0)
    lines = report.target_checks([good, bad])
    assert lines[0].startswith("- ✅ `hdd-seek`: shardkit ≥ 10× ImageFolder: 1w 18.4×, 4w 18.3×")
    assert lines[1].startswith("- ✅ `hdd-seek`: shardkit ≥ 95% of the sequential ceiling")
    assert lines[2] == "- ✅ `hdd-seek`: shardkit ≥ 1.2× webdataset at 4+ workers: 4w 1.38×"
    # make_profile's ceiling is 170 MB/s: webdataset 160 and 120 MB/s.
    assert lines[3] == ("  - for scale: webdataset reads at 94.1% of the ceiling with 1 worker and 70.6% with 4, "
                        "so 1.2× its 4-worker rate is 84.7% of the ceiling")
    assert lines[4] == "- ❌ `ssd`: shardkit ≥ webdataset: 1w 0.75×"


def test_missing_shardkit_is_reported_not_checked():
    profile = make_profile("hdd", {"webdataset": {1: 160.0}})
    assert report.target_checks([profile]) == ["- `hdd`: shardkit not measured"]


def memory_result(rss: dict[str, dict[int, float]]) -> dict:
    cases = [{"kind": kind, "num_samples": n, "worker_rss_mb": v, "worker_uss_mb": v / 2}
             for kind, by_n in rss.items() for n, v in by_n.items()]
    return {"sizes": sorted({n for by_n in rss.values() for n in by_n}), "workers": 2,
            "samples_per_worker": 100, "cases": cases}


def test_memory_check_allows_20_mb_or_10_percent():
    flat = memory_result({"shardkit": {10_000: 300.0, 10_000_000: 325.0}})
    grown = memory_result({"shardkit": {10_000: 300.0, 10_000_000: 400.0}})
    assert report.memory_check(flat).startswith("- ✅")
    assert "300 → 400 MB (+100 MB)" in report.memory_check(grown)
    assert report.memory_check(grown).startswith("- ❌")


def test_memory_table_shows_rss_and_private_memory():
    table = report.memory_table(memory_result({"in_memory": {10_000: 300.0, 1_000_000: 900.0}}))
    assert "| in_memory RSS | 300 | 900 |" in table
    assert "| in_memory private (USS) | 150 | 450 |" in table


def full_results() -> dict:
    profile = make_profile("hdd-seek", {"imagefolder": {1: 9.0, 2: 9.5}, "webdataset": {1: 160.0, 2: 150.0},
                                        "shardkit": {1: 166.0, 2: 165.0}})
    return {
        "meta": {"command": "python -m bench.harness", "mode": "full"},
        "throughput": {"data": {"num_images": 10, "mean_image_kb": 110.0, "num_classes": 2, "num_shards": 2},
                       "plan": {"imagefolder_limit": 5, "buffer_size": 100, "repeats": 3},
                       "profiles": [profile]},
        "memory": memory_result({"shardkit": {10_000: 300.0, 1_000_000: 301.0},
                                 "in_memory": {10_000: 300.0, 1_000_000: 900.0}}),
        "shuffle": {"num_samples": 100, "num_shards": 4, "num_classes": 10, "batch_size": 32, "seeds": [0],
                    "rows": [{"reader": r, "buffer_size": b, "quality": 1.1, "displacement": 0.9}
                             for r in ("shardkit", "webdataset") for b in (10, 100)]},
    }


def test_render_markdown_has_every_section_and_plot_links():
    text = report.render_markdown(full_results(), plot_prefix="results/")
    for heading in ("## Throughput", "### Targets", "### `hdd-seek`", "## Memory per DataLoader worker",
                    "## Shuffle quality vs buffer size"):
        assert heading in text
    assert "| webdataset MB/s, published | 160 (100%) | 155 (97%) |" in text
    assert "![throughput vs workers](results/throughput.png)" in text


def test_plot_all_writes_three_pngs(tmp_path):
    paths = report.plot_all(full_results(), str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == ["memory.png", "shuffle.png", "throughput.png"]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_head_activity_table_summarizes_seek_model_counters():
    profile = make_profile("hdd-seek", {"webdataset": {8: 100.0}})
    profile["runs"] = [{"loader": "webdataset", "workers": 8, "seconds": 2.0,
                        "io": {"seeks": 100, "device_bytes": 200_000_000, "busy_s": 1.5, "pid_switches": 40}}]
    table = report.head_activity_table(profile)
    assert "| webdataset | 8 | 100 | 2.00 | 75% | 40 |" in table


def test_block_requests_table_shows_request_count_and_size():
    profile = make_profile("hdd", {"shardkit": {1: 160.0}})
    profile["runs"] = [{"loader": "shardkit", "workers": 1, "seconds": 1.0,
                        "io": {"read_io_serviced": 400, "read_io_service_bytes": 400 * 1_280_000}}]
    assert "| shardkit | 1 | 400 | 1280 |" in report.block_requests_table(profile)


def test_calibration_lines_name_the_model_and_the_two_targets():
    profile = make_profile("hdd-seek", {"imagefolder": {1: 8.3}})
    profile["seek_model"] = {"seek_s": 0.008, "transfer_bytes_per_s": 170e6, "readahead_budget_bytes": 24 << 20,
                             "stream_idle_s": 0.5, "open_s": 0.0012}
    model, calibration = report.calibration_lines(profile)
    assert model.startswith("Model: 8.0 ms seek + rotation per non-continuing read, 170 MB/s transfer, 24 MiB")
    assert calibration == ("Calibration: one-worker ImageFolder 83 images/s (published 83); "
                           "one-stream sequential (cold `dd`) 170 MB/s (target ≈ 170).")


def test_experiment_rows_get_their_own_lines():
    profile = make_profile("hdd-seek", {"imagefolder": {4: 9.0}, "webdataset": {4: 100.0},
                                        "shardkit": {4: 130.0}, "shardkit-nolock": {4: 100.0}})
    lines = report.target_checks([profile])
    assert "- (experiment) `hdd-seek`: shardkit with its device lock ÷ without: 4w 1.30×" in lines
    table = report.throughput_table(profile)
    assert "| shardkit, device lock off (experiment) MB/s | 100.0 |" in table


def test_repeats_per_profile_override_the_default_and_are_reported():
    from bench.harness.throughput import ThroughputPlan

    plan = ThroughputPlan(repeats=3, repeats_by_profile=(("ssd", 5), ("raw", 5)))
    assert [plan.repeats_for(p) for p in ("hdd", "ssd", "raw")] == [3, 5, 5]
    assert report._repeats_text(asdict(plan)) == "3 runs (5 on `ssd` and `raw`)"
    assert report._repeats_text(asdict(ThroughputPlan(repeats=2))) == "2 runs"
    three = ThroughputPlan(repeats=3, repeats_by_profile=(("hdd-seek", 5), ("ssd", 5), ("raw", 5), ("hdd", 4)))
    assert report._repeats_text(asdict(three)) == "3 runs (5 on `hdd-seek`, `ssd` and `raw`; 4 on `hdd`)"
