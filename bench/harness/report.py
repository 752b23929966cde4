"""Turn result JSON into ``RESULTS.md`` tables and PNG plots.

Pure functions of the result dicts (no measuring), so they are tested on
hand-made results.
"""

from __future__ import annotations

import os
from typing import Any

#: The published 7200 rpm HDD figures (bytes only, caches dropped), by
#: loader threads; 6 threads omitted since the table runs 1/2/4/8.
PUBLISHED_HDD = {
    "imagefolder_images_per_s": {1: 83, 2: 86, 4: 104, 8: 120},
    "webdataset_images_per_s": {1: 1447, 2: 1424, 4: 1216, 8: 1021},
    "webdataset_mb_per_s": {1: 160, 2: 155, 4: 135, 8: 112},
}
#: The published HDD's sequential rate.
PUBLISHED_SEQUENTIAL_MB_S = 175
LABELS = {
    "imagefolder": "ImageFolder",
    "webdataset": "webdataset",
    "shardkit": "shardkit",
    "shardkit-nolock": "shardkit, device lock off (experiment)",
}
#: What comparing shardkit with each experiment shows.
EXPERIMENT_GAINS = {
    "shardkit-nolock": "shardkit with its device lock ÷ without",
}


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _lookup(table: list[dict[str, Any]], loader: str, workers: int) -> dict[str, Any] | None:
    for row in table:
        if row["loader"] == loader and row["workers"] == workers:
            return row
    return None


def throughput_table(profile: dict[str, Any]) -> str:
    """One profile's table: rows per loader and figure, columns per worker count."""
    table = profile["table"]
    workers = sorted({row["workers"] for row in table})
    loaders = [name for name in LABELS if any(row["loader"] == name for row in table)]
    lines = [
        "| DataLoader workers | " + " | ".join(str(w) for w in workers) + " |",
        "|---|" + "---|" * len(workers),
    ]
    for loader in loaders:
        for key, unit, fmt in (
            ("images_per_s", "images/s", ".0f"),
            ("mb_per_s", "MB/s", ".1f"),
            ("fraction_of_ceiling", "% of ceiling", ".0%"),
            ("first_batch_s", "s to first batch", ".2f"),
        ):
            cells = []
            for w in workers:
                row = _lookup(table, loader, w)
                cells.append(_cell(None if row is None else row.get(key), fmt))
            lines.append(f"| {LABELS[loader]} {unit} | " + " | ".join(cells) + " |")
    for name, note in profile.get("unavailable", {}).items():
        lines.append(f"\n{LABELS.get(name, name)} not measured: {note}")
    return "\n".join(lines)


def ratio(table: list[dict[str, Any]], num: str, den: str, workers: int, key: str = "images_per_s") -> float | None:
    a, b = _lookup(table, num, workers), _lookup(table, den, workers)
    if a is None or b is None or not b[key]:
        return None
    return a[key] / b[key]


def target_checks(profiles: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, one line each, with the measured figures."""
    lines = []
    for profile in profiles:
        name, table = profile["profile"], profile["table"]
        workers = sorted({row["workers"] for row in table if row["loader"] == "shardkit"})
        if not workers:
            lines.append(f"- `{name}`: shardkit not measured")
            continue
        if name in ("hdd", "hdd-seek"):
            ratios = [ratio(table, "shardkit", "imagefolder", w) for w in workers]
            fractions = [_lookup(table, "shardkit", w)["fraction_of_ceiling"] for w in workers]
            lines.append(_check(f"`{name}`: shardkit ≥ 10× ImageFolder", ratios, 10.0, "×", ".1f", workers))
            lines.append(_check(f"`{name}`: shardkit ≥ 95% of the sequential ceiling", fractions, 0.95, "", ".2%", workers))
            if name == "hdd-seek":
                many = [w for w in workers if w >= 4]
                vs = [ratio(table, "shardkit", "webdataset", w) for w in many]
                lines.append(_check(f"`{name}`: shardkit ≥ 1.2× webdataset at 4+ workers", vs, 1.2, "×", ".2f", many))
                lines.extend(_ratio_scale(table))
            for experiment, what in EXPERIMENT_GAINS.items():
                if any(row["loader"] == experiment for row in table):
                    gains = [ratio(table, "shardkit", experiment, w) for w in workers]
                    shown = ", ".join(f"{w}w {_cell(v, '.2f')}×" for w, v in zip(workers, gains))
                    lines.append(f"- (experiment) `{name}`: {what}: {shown}")
        else:
            vs = [ratio(table, "shardkit", "webdataset", w) for w in workers]
            lines.append(_check(f"`{name}`: shardkit ≥ webdataset", vs, 1.0, "×", ".2f", workers))
    return lines


def _ratio_scale(table: list[dict[str, Any]]) -> list[str]:
    """What 1.2x webdataset at 4 workers asks of shardkit, as a share of the
    ceiling, next to what webdataset itself reaches with one worker."""
    one, four = _lookup(table, "webdataset", 1), _lookup(table, "webdataset", 4)
    if not one or not four or one["fraction_of_ceiling"] is None or four["fraction_of_ceiling"] is None:
        return []
    return [
        f"  - for scale: webdataset reads at {one['fraction_of_ceiling']:.1%} of the ceiling with 1 worker and "
        f"{four['fraction_of_ceiling']:.1%} with 4, so 1.2× its 4-worker rate is "
        f"{1.2 * four['fraction_of_ceiling']:.1%} of the ceiling"
    ]


def _check(label: str, values: list[float | None], bound: float, unit: str, fmt: str, workers: list[int]) -> str:
    ok = all(v is not None and v >= bound for v in values)
    shown = ", ".join(f"{w}w {_cell(v, fmt)}{unit}" for w, v in zip(workers, values))
    return f"- {'✅' if ok else '❌'} {label}: {shown}"


def calibration_lines(profile: dict[str, Any]) -> list[str]:
    """The seek model's parameters and the two figures it is calibrated on."""
    lines = []
    model = profile.get("seek_model")
    if model:
        lines.append(
            f"Model: {model['seek_s'] * 1e3:.1f} ms seek + rotation per non-continuing read, "
            f"{model['transfer_bytes_per_s'] / 1e6:.0f} MB/s transfer, "
            f"{model['readahead_budget_bytes'] / 2**20:.0f} MiB of read-ahead shared by the streams active in the "
            f"last {model['stream_idle_s']:.1f} s, {model['open_s'] * 1e3:.1f} ms of metadata on a file's first open."
        )
    imagefolder = _lookup(profile["table"], "imagefolder", 1)
    calib = [f"one-stream sequential (cold `dd`) {profile['ceiling']['mb_per_s']:.0f} MB/s (target ≈ 170)"]
    if imagefolder:
        calib.insert(0, f"one-worker ImageFolder {imagefolder['images_per_s']:.0f} images/s (published 83)")
    lines.append("Calibration: " + "; ".join(calib) + ".")
    return lines


def published_comparison(profile: dict[str, Any]) -> str:
    """Measured vs published HDD figures: in brackets relative to 1 worker,
    and for webdataset also as a share of the sequential rate (the published
    disk's ≈175 MB/s; this profile's measured ceiling), plus what the seek
    model alone predicts for interleaved streams (no CPU limits)."""
    table = profile["table"]
    workers = sorted({row["workers"] for row in table})
    ceiling = profile["ceiling"]["mb_per_s"]
    lines = [
        "| workers | " + " | ".join(str(w) for w in workers) + " |",
        "|---|" + "---|" * len(workers),
    ]

    def published_row(label: str, published: dict[int, float]) -> None:
        base = published.get(1)
        cells = [f"{published[w]} ({published[w] / base:.0%})" if w in published and base else "–" for w in workers]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def measured_row(label: str, loader: str, key: str) -> None:
        first = _lookup(table, loader, 1)
        cells = []
        for w in workers:
            row = _lookup(table, loader, w)
            if row is None:
                cells.append("–")
            else:
                rel = f" ({row[key] / first[key]:.0%})" if first and first[key] else ""
                cells.append(f"{row[key]:.0f}{rel}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    published_row("ImageFolder images/s, published", PUBLISHED_HDD["imagefolder_images_per_s"])
    measured_row("ImageFolder images/s, measured", "imagefolder", "images_per_s")
    published_row("webdataset MB/s, published", PUBLISHED_HDD["webdataset_mb_per_s"])
    model = profile.get("seek_model")
    if model:
        from bench.profiles.seekmodel import DiskParams, interleaved_throughput

        params = DiskParams(**model)
        predicted = {w: round(interleaved_throughput(params, w) / 1e6) for w in workers}
        published_row("webdataset MB/s, seek model alone (w streams, no CPU limit)", predicted)
    measured_row("webdataset MB/s, measured", "webdataset", "mb_per_s")
    pub = PUBLISHED_HDD["webdataset_mb_per_s"]
    lines.append(
        f"| webdataset % of sequential, published (÷{PUBLISHED_SEQUENTIAL_MB_S} MB/s) | "
        + " | ".join(f"{pub[w] / PUBLISHED_SEQUENTIAL_MB_S:.0%}" if w in pub else "–" for w in workers)
        + " |"
    )
    cells = []
    for w in workers:
        row = _lookup(table, "webdataset", w)
        cells.append("–" if row is None else f"{row['mb_per_s'] / ceiling:.0%}")
    lines.append(f"| webdataset % of sequential, measured (÷{ceiling:.0f} MB/s) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def head_activity_table(profile: dict[str, Any]) -> str:
    """For ``hdd-seek``: what the virtual head did, medians per loader and
    worker count (seeks, MB read per seek, share of the run the head was busy)."""
    import statistics

    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in profile.get("runs", []):
        if run.get("io", {}).get("seeks") is not None:
            groups.setdefault((run["loader"], run["workers"]), []).append(run)
    if not groups:
        return ""
    lines = [
        "| loader | workers | seeks | MB per seek | head busy | reader switches |",
        "|---|---|---|---|---|---|",
    ]
    for (loader, workers), runs in sorted(groups.items(), key=lambda kv: (list(LABELS).index(kv[0][0]), kv[0][1])):
        seeks = statistics.median(r["io"]["seeks"] for r in runs)
        per_seek = statistics.median(r["io"]["device_bytes"] / max(r["io"]["seeks"], 1) / 1e6 for r in runs)
        busy = statistics.median(r["io"]["busy_s"] / r["seconds"] for r in runs if r["seconds"] > 0)
        switches = statistics.median(r["io"].get("pid_switches", 0) for r in runs)
        lines.append(f"| {LABELS[loader]} | {workers} | {seeks:.0f} | {per_seek:.2f} | {busy:.0%} | {switches:.0f} |")
    return "\n".join(lines)


def block_requests_table(profile: dict[str, Any]) -> str:
    """For the loop profiles: block-layer read requests per run and their
    mean size, from the cgroup's blkio counters (medians)."""
    import statistics

    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in profile.get("runs", []):
        if run.get("io", {}).get("read_io_serviced"):
            groups.setdefault((run["loader"], run["workers"]), []).append(run)
    if not groups:
        return ""
    lines = ["| loader | workers | read requests | KB per request |", "|---|---|---|---|"]
    for (loader, workers), runs in sorted(groups.items(), key=lambda kv: (list(LABELS).index(kv[0][0]), kv[0][1])):
        count = statistics.median(r["io"]["read_io_serviced"] for r in runs)
        size = statistics.median(r["io"]["read_io_service_bytes"] / r["io"]["read_io_serviced"] / 1e3 for r in runs)
        lines.append(f"| {LABELS[loader]} | {workers} | {count:.0f} | {size:.0f} |")
    return "\n".join(lines)


def memory_table(memory: dict[str, Any]) -> str:
    sizes = memory["sizes"]
    lines = [
        "| per-worker memory (MB) | " + " | ".join(f"{n:.0e} samples" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    kinds = []
    for case in memory["cases"]:
        if case["kind"] not in kinds:
            kinds.append(case["kind"])
    for kind in kinds:
        for key, label in (("worker_rss_mb", "RSS"), ("worker_uss_mb", "private (USS)")):
            cells = []
            for n in sizes:
                case = next((c for c in memory["cases"] if c["kind"] == kind and c["num_samples"] == n), None)
                cells.append("error" if case is None or "error" in case else f"{case[key]:.0f}")
            lines.append(f"| {kind} {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory_check(memory: dict[str, Any]) -> str:
    cases = {c["num_samples"]: c for c in memory["cases"] if c["kind"] == "shardkit" and "error" not in c}
    if len(cases) < 2:
        return "- shardkit memory: not enough sizes measured"
    small, large = min(cases), max(cases)
    a, b = cases[small]["worker_rss_mb"], cases[large]["worker_rss_mb"]
    ok = abs(b - a) <= max(0.10 * a, 20.0)
    return (
        f"- {'✅' if ok else '❌'} shardkit per-worker RSS at {large:.0e} samples within 10% (or 20 MB) of "
        f"{small:.0e}: {a:.0f} → {b:.0f} MB ({b - a:+.0f} MB)"
    )


def shuffle_table(shuffle: dict[str, Any]) -> str:
    sizes = sorted({row["buffer_size"] for row in shuffle["rows"]})
    lines = [
        "| buffer size | " + " | ".join(str(s) for s in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for reader in ("shardkit", "webdataset"):
        for key, label in (("quality", "batch label mix (1.0 = i.i.d.)"), ("displacement", "displacement")):
            cells = []
            for s in sizes:
                row = next((r for r in shuffle["rows"] if r["reader"] == reader and r["buffer_size"] == s), None)
                cells.append("–" if row is None else f"{row[key]:.3f}")
            lines.append(f"| {reader} {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _and_list(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _repeats_text(plan: dict[str, Any]) -> str:
    """``3 runs``, or ``3 runs (5 on `ssd` and `raw`)`` where some profiles ran more."""
    extra = [tuple(pair) for pair in plan.get("repeats_by_profile", ())]
    if not extra:
        return f"{plan['repeats']} runs"
    by_count: dict[int, list[str]] = {}
    for name, runs in extra:
        by_count.setdefault(runs, []).append(f"`{name}`")
    parts = [f"{runs} on {_and_list(names)}" for runs, names in by_count.items()]
    return f"{plan['repeats']} runs ({'; '.join(parts)})"


def _shard_mb(data: dict[str, Any]) -> str:
    try:
        return f"{data['num_images'] / data['num_shards'] * data['mean_image_kb'] / 1e3:.0f}"
    except (KeyError, TypeError, ZeroDivisionError):
        return "?"


def _section(
    title: str, intro: str, blocks: list[str], *, plot: tuple[str, str], plot_prefix: str | None
) -> list[str]:
    """Lines of one ``##`` section: title, intro paragraph, blocks separated
    by blank lines, and the plot's image link when plots are linked."""
    out = ["", f"## {title}", "", intro]
    for block in blocks:
        out += ["", block]
    if plot_prefix is not None:
        alt, name = plot
        out += ["", f"![{alt}]({plot_prefix}{name})"]
    return out


def render_markdown(results: dict[str, Any], *, plot_prefix: str | None = None) -> str:
    """The whole RESULTS.md from ``{"throughput": ..., "memory": ..., "shuffle": ...}``
    (any may be missing); ``plot_prefix`` is the plots' folder relative to
    the Markdown file (None: no plot links)."""
    meta = results.get("meta", {})
    out = ["# Benchmark results", ""]
    out.append(
        "Generated by `python -m bench.harness` — do not edit by hand. "
        "Throughput figures on this machine are trustworthy as ratios between loaders measured in the same run, "
        "not as absolute numbers."
    )
    if meta:
        out += ["", "| run | |", "|---|---|"]
        for key in ("command", "mode", "date", "git_commit", "machine", "kernel", "cpus", "python", "torch",
                    "torchvision", "webdataset", "shardkit"):
            if key in meta:
                out.append(f"| {key} | `{meta[key]}` |")
    tp = results.get("throughput")
    if tp:
        data = tp.get("data", {})
        out += ["", "## Throughput: images/s and MB/s by DataLoader workers", ""]
        out.append(
            f"{data.get('num_images', '?')} JPEGs (mean {data.get('mean_image_kb', 0):.0f} KB) in "
            f"{data.get('num_classes', '?')} class folders and in {data.get('num_shards', '?')} shards "
            f"(about {_shard_mb(data)} MB each); raw bytes, "
            f"no decode; caches dropped before every run and again once the loader is built, so file metadata "
            f"and indexes come from the device too; ImageFolder reads {tp['plan']['imagefolder_limit']} images "
            f"in random order per run, webdataset and shardkit one full pass (shard shuffle + a "
            f"{tp['plan']['buffer_size']}-sample buffer; shardkit in balanced mode, with its default options: "
            f"on `hdd` it detects the spinning disk from sysfs and its workers take turns on it, on `hdd-seek` "
            f"the harness passes `device_lock=True` because a FUSE mount has no block device to detect). "
            f"Medians of {_repeats_text(tp['plan'])}; \"s to first batch\" counts from `iter(loader)`, worker "
            f"start-up included."
        )
        out += ["", "### Targets", ""] + target_checks(tp["profiles"])
        for profile in tp["profiles"]:
            ceiling = profile["ceiling"]["mb_per_s"]
            out += ["", f"### `{profile['profile']}` — {profile['description']}", ""]
            out.append(f"Sequential ceiling (cold `dd` of one large file): **{ceiling:.0f} MB/s**.")
            out += ["", throughput_table(profile)]
            requests = block_requests_table(profile)
            if requests:
                out += ["", "Block-layer reads (blkio counters of the benchmark's cgroup, medians per run):", "",
                        requests]
            if profile["profile"] == "hdd-seek":
                out += [""] + calibration_lines(profile)
                out += ["", "Against the published 7200 rpm HDD figures (in brackets: relative to 1 worker):", "",
                        published_comparison(profile), "",
                        "The *seek model alone* row is the model's closed form for w interleaved streams; the "
                        "measured rows add this machine's limits. Where the head was busy less than ~90% of a run "
                        "(next table), that run was held back by CPU (2 shared cores for the FUSE process, the "
                        "workers and the main process), not by the modelled disk."]
                activity = head_activity_table(profile)
                if activity:
                    out += ["", "What the virtual head did (medians per run; a reader switch is a request from "
                            "a different process than the one before):", "", activity]
        if plot_prefix is not None:
            out += ["", f"![throughput vs workers]({plot_prefix}throughput.png)"]
    mem = results.get("memory")
    if mem:
        intro = (
            f"{mem['workers']} workers; each reads {mem['samples_per_worker']} samples and runs one full garbage "
            "collection (the in-memory dataset also references every sample once, as a full epoch would), then "
            "the parent reads each worker's `/proc/PID/smaps_rollup`. shardkit: a manifest of N samples; "
            "in_memory: a map-style dataset holding the sample list in a Python list; sqlite: a map-style "
            "dataset reading the list from SQLite, connection opened in each worker."
        )
        out += _section("Memory per DataLoader worker vs dataset size", intro, [memory_check(mem), memory_table(mem)],
                        plot=("memory vs dataset size", "memory.png"), plot_prefix=plot_prefix)
    sh = results.get("shuffle")
    if sh:
        intro = (
            f"{sh['num_samples']} samples written sorted by class ({sh['num_classes']} classes) into "
            f"{sh['num_shards']} shards, read in one stream with shard shuffle + buffer. Batch label mix: mean "
            f"distance of each batch of {sh['batch_size']}'s label histogram from the stream's, relative to a "
            "uniform random permutation (1.0 = as mixed as i.i.d.; larger is worse). Displacement: mean "
            "|output − input position| relative to a uniform permutation. Means over seeds "
            f"{sh['seeds']}."
        )
        out += _section("Shuffle quality vs buffer size", intro, [shuffle_table(sh)],
                        plot=("shuffle quality vs buffer size", "shuffle.png"), plot_prefix=plot_prefix)
    return "\n".join(out) + "\n"


def plot_all(results: dict[str, Any], out_dir: str) -> list[str]:
    """Write throughput.png, memory.png and shuffle.png; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    tp = results.get("throughput")
    if tp:
        profiles = tp["profiles"]
        fig, axes = plt.subplots(1, len(profiles), figsize=(4.2 * len(profiles), 3.8), squeeze=False)
        for ax, profile in zip(axes[0], profiles):
            for loader, label in LABELS.items():
                rows = sorted((r for r in profile["table"] if r["loader"] == loader), key=lambda r: r["workers"])
                if rows:
                    ax.plot([r["workers"] for r in rows], [r["mb_per_s"] for r in rows], marker="o", label=label)
            ax.axhline(profile["ceiling"]["mb_per_s"], color="grey", linestyle="--", label="sequential ceiling")
            if profile["profile"] == "hdd-seek":
                pub = PUBLISHED_HDD["webdataset_mb_per_s"]
                ax.plot(list(pub), list(pub.values()), color="black", linestyle=":", marker="x",
                        label="webdataset, published HDD")
            ax.set_title(profile["profile"])
            ax.set_xlabel("DataLoader workers")
            ax.set_ylabel("MB/s")
            ax.set_xscale("log", base=2)
            ax.set_xticks([r["workers"] for r in profile["table"] if r["loader"] == profile["table"][0]["loader"]])
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        handles: dict[str, Any] = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=8)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        path = os.path.join(out_dir, "throughput.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    mem = results.get("memory")
    if mem:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        kinds = []
        for case in mem["cases"]:
            if case["kind"] not in kinds:
                kinds.append(case["kind"])
        for kind in kinds:
            cases = sorted((c for c in mem["cases"] if c["kind"] == kind and "error" not in c),
                           key=lambda c: c["num_samples"])
            ax.plot([c["num_samples"] for c in cases], [c["worker_rss_mb"] for c in cases], marker="o", label=kind)
        ax.set_xscale("log")
        ax.set_xlabel("samples in the dataset")
        ax.set_ylabel("RSS per worker (MB)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, "memory.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    sh = results.get("shuffle")
    if sh:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for reader in ("shardkit", "webdataset"):
            rows = sorted((r for r in sh["rows"] if r["reader"] == reader), key=lambda r: r["buffer_size"])
            ax.plot([r["buffer_size"] for r in rows], [r["quality"] for r in rows], marker="o", label=reader)
        ax.axhline(1.0, color="grey", linestyle="--", label="i.i.d.")
        ax.set_xscale("log")
        ax.set_xlabel("shuffle buffer (samples)")
        ax.set_ylabel("batch label mix (lower is better)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, "shuffle.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
