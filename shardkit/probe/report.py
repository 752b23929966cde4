"""``shardkit bench``'s output: a table for the terminal, and JSON,
Markdown and a plot (throughput against workers, the ceiling as a line)
in the output folder."""

from __future__ import annotations

import json
import os
from typing import Any

from shardkit.probe.measure import Row, best_workers

COLUMNS = ("workers", "ceiling MB/s", "raw samples/s", "raw MB/s", "of ceiling", "options samples/s",
           "first batch s", "worker MB", "CPU s/GB")  # fmt: skip


def table_rows(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        run = r.options or r.raw
        out.append([
            str(r.workers), f"{r.ceiling.mb_per_s:,.1f}", f"{r.raw.samples_per_s:,.0f}", f"{r.raw.mb_per_s:,.1f}",
            f"{r.raw.mb_per_s / r.ceiling.mb_per_s:.0%}" if r.ceiling.mb_per_s else "-",
            f"{r.options.samples_per_s:,.0f}" if r.options else "-",
            f"{run.first_batch_s:.2f}", f"{run.worker_mb:.0f}" if r.workers else "-", f"{run.cpu_s_per_gb:,.1f}",
        ])  # fmt: skip
    return out


def text(rows: list[Row], source: str) -> str:
    """The terminal table, a verdict per worker count and the advice."""
    cells = [list(COLUMNS), *table_rows(rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = [f"shardkit bench {source}", *("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells), ""]
    lines += [f"{r.workers} workers: {r.verdict}" for r in rows]
    lines.append(_advice(rows))
    cold = {r.ceiling.cold for r in rows}
    if False in cold:
        lines.append("note: the page cache could not be dropped for every local shard, so the ceiling may be warm")
    return "\n".join(lines)


def _advice(rows: list[Row]) -> str:
    best = best_workers(rows)
    return f"fewest workers within 95% of the best throughput: {best}"


def markdown(rows: list[Row], source: str) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---:|" * len(COLUMNS) + "\n"
    body = "".join("| " + " | ".join(r) + " |\n" for r in table_rows(rows))
    verdicts = "".join(f"- **{r.workers} workers**: {r.verdict}\n" for r in rows)
    return f"# shardkit bench `{source}`\n\n{head}{body}\n{verdicts}\n{_advice(rows)}.\n\n![throughput](bench.png)\n"


def plot(rows: list[Row], path: str) -> bool:
    """The plot, if matplotlib is installed (whether it was written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = [r.workers for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(xs, [r.ceiling.mb_per_s for r in rows], "k--", label="storage ceiling (raw read)")
    ax.plot(xs, [r.raw.mb_per_s for r in rows], "o-", label="loader, raw bytes")
    if any(r.options for r in rows):
        ax.plot(xs, [r.options.mb_per_s if r.options else float("nan") for r in rows], "s-", label="loader, with options")
    ax.set_xlabel("DataLoader workers")
    ax.set_ylabel("MB/s of shards")
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def save(rows: list[Row], source: str, out_dir: str, settings: dict[str, Any]) -> list[str]:
    """Write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir``; the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    record = {"source": source, "settings": settings, "best_workers": best_workers(rows),
              "rows": [r.to_dict() for r in rows]}  # fmt: skip
    for name, content in (("bench.json", json.dumps(record, indent=1)), ("bench.md", markdown(rows, source))):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
        written.append(path)
    if plot(rows, os.path.join(out_dir, "bench.png")):
        written.append(os.path.join(out_dir, "bench.png"))
    return written
