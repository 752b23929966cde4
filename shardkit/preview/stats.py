"""The dataset's shape: per-shard counts and sizes from the shard table,
field facts from the samples drawn, and how the manifest says it was made.

Per-shard numbers (samples, bytes, removed samples) cover every shard: they
are columns of the shard table, no shard is read. Member sizes, field
presence and class balance are counted over the samples drawn for the page
(``stats_samples`` of them), and the page says so: counting them over the
whole dataset would mean reading all of it.

Plots are inline SVG made with matplotlib (text drawn as paths, so no font
is fetched and no label becomes markup; comments and metadata stripped).
Without matplotlib the same numbers are tables and the page says how to get
the plots (``pip install 'shardkit[show]'``).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit.format.removed import unpack
from shardkit.preview.draw import DrawnSample, RandomAccess
from shardkit.preview.fields import human_bytes, text

#: Classes a plot or table lists (the most frequent among the samples drawn).
MAX_CLASSES_LISTED = 30
#: Characters of a label (a field or class name) in a plot.
MAX_LABEL_CHARS = 32
PLOTS_NEED = "plots need matplotlib: pip install 'shardkit[show]'"


@dataclass
class Statistics:
    """What the statistics section shows (see the module docstring)."""

    num_samples: int
    num_shards: int
    counts: np.ndarray
    shard_bytes: np.ndarray | None
    removed: np.ndarray | None
    num_drawn: int = 0
    presence: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, list[int]] = field(default_factory=dict)
    classes: collections.Counter[str] = field(default_factory=collections.Counter)
    class_names: tuple[str, ...] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    extensions: tuple[str, ...] = ()


def gather(dataset: RandomAccess, drawn: Sequence[DrawnSample]) -> Statistics:
    """The statistics of ``dataset``, field facts counted over ``drawn``."""
    manifest = dataset.manifest
    counts = np.asarray(dataset.shard_counts, dtype=np.int64)
    stats = Statistics(len(dataset), dataset.num_shards, counts, None, None)
    if manifest is not None:
        table = manifest.table
        stats.shard_bytes = np.asarray(table.num_bytes, dtype=np.int64)
        if table.removed is not None and len(table.removed):
            shards, _ = unpack(table.removed)
            stats.removed = np.bincount(shards.astype(np.int64), minlength=stats.num_shards)
        stats.class_names = manifest.class_names
        stats.skipped = manifest.skipped_by_category
        stats.options = dict(manifest.options)
        stats.fingerprint = manifest.fingerprint
        stats.extensions = manifest.extensions
    read = [sample for sample in drawn if sample.error is None]
    stats.num_drawn = len(read)
    for sample in read:
        for name, size in sample.sizes.items():
            stats.presence[name] = stats.presence.get(name, 0) + 1
            stats.sizes.setdefault(name, []).append(size)
        label = sample.fields.get("cls")
        if label is not None:
            stats.classes[label.decode("utf-8", errors="replace").strip()[:MAX_LABEL_CHARS]] += 1
    return stats


def class_label(stats: Statistics, value: str) -> str:
    """A label as the page names it: ``3 (cat)`` when the manifest names class 3."""
    names = stats.class_names
    if names is not None and value.isdigit() and len(value) < 10 and int(value) < len(names):
        return f"{value} ({names[int(value)]})"
    return value


# ------------------------------------------------------------------ HTML


def render_statistics(stats: Statistics) -> str:
    """The statistics section: plots (when matplotlib is there) and tables."""
    plots = _plots(stats)
    parts = ['<section class="stats"><h2>Statistics</h2>', _overview(stats)]
    if plots is None:
        parts.append(f'<p class="note">{text(PLOTS_NEED)}</p>')
    else:
        parts.append('<div class="plots">' + "".join(plots) + "</div>")
    parts += [_field_table(stats), _class_table(stats), _skipped_table(stats), _made_table(stats), "</section>"]
    return "".join(parts)


def _table(caption: str, head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = "".join(f"<th>{text(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{text(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><caption>{text(caption)}</caption>{f'<tr>{cells}</tr>' if head else ''}{body}</table>"


def _spread(values: np.ndarray, unit: Any = str) -> str:
    if not len(values):
        return "none"
    low, mid, high = np.percentile(values, [0, 50, 100])
    return f"min {unit(low)}, median {unit(mid)}, max {unit(high)}"


def _whole(value: float) -> str:
    return f"{int(round(value)):,}"


def _overview(stats: Statistics) -> str:
    rows: list[tuple[str, str]] = [
        ("samples", f"{stats.num_samples:,}"),
        ("shards", f"{stats.num_shards:,}"),
        ("samples per shard", _spread(stats.counts, _whole)),
    ]
    if stats.shard_bytes is not None:
        rows.append(("bytes", f"{int(stats.shard_bytes.sum()):,} ({human_bytes(int(stats.shard_bytes.sum()))})"))
        rows.append(("bytes per shard", _spread(stats.shard_bytes, human_bytes)))
    if stats.removed is not None:
        removed = int(stats.removed.sum())
        rows.append(("removed", f"{removed:,} samples (shardkit remove) in {int((stats.removed > 0).sum()):,} shards"))
    if stats.extensions:
        rows.append(("fields", ", ".join(stats.extensions)))
    return _table("Dataset", (), rows)


def _field_table(stats: Statistics) -> str:
    rows = []
    for name in sorted(stats.presence):
        sizes = np.asarray(stats.sizes[name])
        rows.append((name, f"{stats.presence[name]} of {stats.num_drawn}", _spread(sizes, human_bytes)))
    return _table(f"Fields, over {stats.num_drawn} samples drawn", ("field", "present in", "member size"), rows)


def _class_table(stats: Statistics) -> str:
    if not stats.classes:
        return ""
    rows = [(class_label(stats, v), n) for v, n in stats.classes.most_common(MAX_CLASSES_LISTED)]
    more = len(stats.classes) - len(rows)
    caption = f"Classes (cls), over {stats.num_drawn} samples drawn" + (f"; {more} more not listed" if more else "")
    return _table(caption, ("class", "samples"), rows)


def _skipped_table(stats: Statistics) -> str:
    total = sum(stats.skipped.values())
    rows = sorted(stats.skipped.items(), key=lambda item: (-item[1], item[0]))
    return _table(f"Inputs skipped when written: {total:,}", ("reason", "inputs"), rows) if rows else ""


def _made_table(stats: Statistics) -> str:
    rows = [(key, value) for key, value in sorted(stats.options.items())]
    if stats.fingerprint is not None:
        rows.append(("fingerprint", stats.fingerprint))
    return _table("How it was written (manifest options)", ("option", "value"), rows) if rows else ""


# ------------------------------------------------------------------ plots

_SVG_START = re.compile(r"^.*?(?=<svg\b)", re.S)
_SVG_NOISE = re.compile(r"<!--.*?-->|<metadata\b.*?</metadata>", re.S)


def _plots(stats: Statistics) -> list[str] | None:
    """The plots as inline SVG, or None when matplotlib is not installed."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        return None
    # Labels are text from the data: never parsed as mathtext ("$x$"), drawn as paths.
    with matplotlib.rc_context({"svg.fonttype": "path", "text.parse_math": False}):
        return _draw(Figure, stats)


def _draw(Figure: Any, stats: Statistics) -> list[str]:  # noqa: N803 - the class
    plots = [_histogram(Figure, "samples per shard", stats.counts, "samples")]
    if stats.shard_bytes is not None:
        plots.append(_histogram(Figure, "bytes per shard", stats.shard_bytes / 1e6, "MB"))
    if stats.sizes:
        names = sorted(stats.sizes)
        fig = _figure(Figure, len(names))
        ax = fig.subplots()
        ax.boxplot([stats.sizes[n] for n in names], orientation="horizontal", tick_labels=_labels(names))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(lambda value, _: human_bytes(value))  # not mathtext: parsing is off
        ax.set_xlabel("member size")
        ax.set_title(f"member size per field ({stats.num_drawn} samples drawn)")
        plots.append(_svg(fig, "sizes"))
        fig = _figure(Figure, len(names))
        ax = fig.subplots()
        ax.barh(_labels(names), [100 * stats.presence[n] / max(stats.num_drawn, 1) for n in names])
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of samples drawn")
        ax.set_title("field presence")
        plots.append(_svg(fig, "presence"))
    if stats.classes:
        common = stats.classes.most_common(MAX_CLASSES_LISTED)
        fig = _figure(Figure, len(common))
        ax = fig.subplots()
        ax.barh(_labels([class_label(stats, v) for v, _ in common])[::-1], [n for _, n in common][::-1])
        ax.set_xlabel("samples drawn")
        ax.set_title("class balance (cls)")
        plots.append(_svg(fig, "classes"))
    return plots


def _figure(figure: Any, rows: int = 0) -> Any:
    return figure(figsize=(5.2, max(2.6, 0.8 + 0.28 * rows)), layout="constrained")


def _labels(names: Sequence[str]) -> list[str]:
    """Names made safe as plot labels: clipped, printable, unique."""
    out: list[str] = []
    for name in names:
        label = "".join(ch if ch.isprintable() else "?" for ch in name)
        label = label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 3] + "..."
        while label in out:
            label += " "
        out.append(label)
    return out


def _histogram(figure: Any, title: str, values: np.ndarray, unit: str) -> str:
    fig = _figure(figure)
    ax = fig.subplots()
    low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    bins, spread = min(40, max(1, len(values))), (low, high)
    if low == high:  # every shard alike: one bar around the value, not a sliver at an edge
        half = 0.5 if low.is_integer() else abs(low) * 0.05 or 0.5
        bins, spread = 1, (low - half, high + half)
    ax.hist(values, bins=bins, range=spread)
    ax.set_xlabel(unit)
    ax.set_ylabel("shards")
    ax.set_title(title)
    return _svg(fig, title)


def _svg(fig: Any, name: str) -> str:
    """``fig`` as an ``<svg>`` element to put in the page: no XML prolog,
    DOCTYPE, comments or metadata; text as paths (no fonts, no markup)."""
    import io

    import matplotlib

    out = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": name}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    svg = _SVG_NOISE.sub("", _SVG_START.sub("", out.getvalue(), count=1))
    return f'<figure class="plot">{svg}</figure>'
