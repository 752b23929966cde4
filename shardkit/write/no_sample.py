"""The error of a write that has no sample left to write.

Inputs drop out at three stages: the scan (a file that cannot be read, a
row naming a missing file), the map stage (``map`` returned None or failed,
an image that does not decode under ``--resize``) and the shard writers (a
download that failed, a table's image that does not decode). Whichever stage
finds that nothing is left refuses with the same message, built here: what
happened, the count by reason, the first few inputs at fault, what is left
in DEST and what to do. A write that left out some inputs, not all, is not
an error: its manifest records them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardkit.errors import SourceError
from shardkit.format.manifest import SkippedInput

#: How many inputs at fault the message names.
EXAMPLES_NAMED = 3

#: The count a ``map`` that returned None is listed under, next to the skip categories.
FILTERED = "filtered"

#: What the message says is left when nothing was written yet.
NOTHING_WRITTEN = "Nothing was written"


def no_sample_error(
    source: str,
    what: str,
    counts: Mapping[str, int],
    examples: Sequence[SkippedInput],
    *,
    left: str = NOTHING_WRITTEN,
) -> SourceError:
    """The :class:`~shardkit.errors.SourceError` of a write with no sample to write.

    Args:
        source: The source as given (the message starts with it).
        what: How the inputs were lost (``"all 12 inputs were skipped"``).
        counts: How many inputs each reason left out: skip categories
            (:func:`~shardkit.format.manifest.skip_category`) and
            :data:`FILTERED` for items ``map`` dropped.
        examples: Inputs at fault (skipped ones in source order, then
            items ``map`` dropped: see :func:`filtered_examples`); the
            first :data:`EXAMPLES_NAMED` are named.
        left: What the failed write leaves in DEST, a sentence.

    Returns:
        The error to raise, its ``path`` the source.
    """
    shown = [reason for reason, n in sorted(counts.items()) if n]
    by_reason = "" if shown == ["input"] else " (by reason: " + ", ".join(f"{r} {counts[r]}" for r in shown) + ")"
    named = examples[:EXAMPLES_NAMED]
    listed = ""
    if named:
        listed = f"; {'e.g. ' if sum(counts.values()) > len(named) else ''}" + "; ".join(map(_described, named))
    if set(shown) <= {FILTERED}:
        advice = "Check that map returns a sample for the items you mean to keep (None drops the item)"
    else:
        advice = (
            "Check the inputs named (with --on-error raise, on_error='raise', the write stops at the first "
            "one with its whole error), then run the same write again"
        )
    return SourceError(f"{source}: no sample to write: {what}{by_reason}{listed}. {left}. {advice}.", path=source)


def every_input(count: int, how: str = "skipped") -> str:
    """``"all 12 inputs were skipped"`` (``"the one input was skipped"`` for one)."""
    return f"the one input was {how}" if count == 1 else f"all {count} inputs were {how}"


def filtered_examples(summaries: Iterable[Mapping[str, Any]]) -> list[SkippedInput]:
    """The first items ``map`` dropped, as the map stage's partition
    summaries name them (a few per partition), at most :data:`EXAMPLES_NAMED`."""
    wheres = itertools.chain.from_iterable(s.get("filtered_first", ()) for s in summaries)
    return [SkippedInput(where, f"{FILTERED}: map returned None") for where in itertools.islice(wheres, EXAMPLES_NAMED)]


def _described(item: SkippedInput) -> str:
    """``PATH: REASON``, or the reason alone when it names its input (or its
    table) first; no closing full stop."""
    source = item.path.rpartition("#row=")[0] or item.path  # a table's row: PATH#row=N
    reason = item.reason.rstrip(".")  # the message goes on after it
    return reason if reason.startswith((f"{item.path}:", f"{source}:")) else f"{item.path}: {reason}"
