"""Brace patterns of shard names, kept as patterns.

``https://host/laion/{000000..499999}.tar`` names half a million shards.
Expanded, that is half a million strings in every reader process (about
60 MB each, and 19 MB in every pickled dataset a ``spawn`` worker or a Ray
task receives). :func:`expand_braces` returns a :class:`BraceList`
instead: a sequence that makes the ``i``-th name on access, by mixed-radix
arithmetic over the pattern's ranges, and pickles as the pattern.

It takes the patterns that shard lists use: literal text with any number of
``{A..B}`` / ``{A..B..STEP}`` integer ranges (zero-padded as
``braceexpand`` pads them) and ``{x,y,z}`` lists of plain words
(letters, digits, ``_`` and ``-``). Any other pattern (nested braces,
letter ranges, escapes, list items with other characters) is expanded by
``braceexpand`` into a list, as before. Both give the same names in the
same order.

Several patterns joined by ``::`` (webdataset's and OpenCLIP's
``/data/laion/{00000..41455}.tar::/data/cc12m/{00000..01242}.tar``) name
their shards one pattern after the other (:func:`expand_patterns`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any, overload

# What braceexpand takes for an integer range, and the list items kept lazily.
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_WORD = re.compile(r"^[A-Za-z0-9_-]*$")


class _IntRange(Sequence[str]):
    """The names of ``{start..end[..step]}``, as braceexpand formats them."""

    def __init__(self, start: str, end: str, step: str | None):
        padded = any(s.startswith(("0", "-0")) for s in (start, end) if s not in ("0", "-0"))
        self._format = f"%0{max(len(start), len(end))}d" if padded else "%d"
        stride = (int(step) or 1) if step else 1
        first, last = int(start), int(end)
        self._range = range(first, last + 1, stride) if first < last else range(first, last - 1, -stride)

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, i: Any) -> str:  # an int: BraceList does the slicing
        return self._format % self._range[i]


class BraceList(Sequence[str]):
    """The names a brace pattern expands to, made on access (see the module).

    ``len()``, indexing (negative indexes and slices too), iteration and
    ``in`` work as on the expanded list; equality compares the names.
    Pickles as its pattern.
    """

    def __init__(self, pattern: str):
        parts = _parts(pattern)
        if parts is None:
            raise ValueError(f"not a pattern kept lazily (expand it with braceexpand): {pattern!r}")
        self.pattern = pattern
        self._parts = parts
        # spans[k]: how many names one step of part k spans (the last part varies fastest)
        self._spans = [1] * len(parts)
        for k in range(len(parts) - 2, -1, -1):
            self._spans[k] = self._spans[k + 1] * len(parts[k + 1])
        self._len = self._spans[0] * len(parts[0]) if parts else 1

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        i = i.__index__()
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"name {i} of a pattern of {self._len}")
        out = []
        for part, span in zip(self._parts, self._spans):
            digit, i = divmod(i, span)
            out.append(part[digit])
        return "".join(out)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BraceList) and other.pattern == self.pattern:
            return True
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._len and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  (equal to lists, which do not hash)

    def __reduce__(self) -> tuple:
        return (BraceList, (self.pattern,))

    def __repr__(self) -> str:
        return f"BraceList({self.pattern!r}, {self._len} names)"


def _parts(pattern: str) -> list[Sequence[str]] | None:
    """The pattern cut into literal text (one-name parts) and brace groups,
    or None when it holds anything :class:`BraceList` does not take."""
    if "\\" in pattern:
        return None
    parts: list[Sequence[str]] = []
    pos = 0
    while True:
        opening = pattern.find("{", pos)
        closing = pattern.find("}", pos)
        if opening < 0:
            if closing >= 0:
                return None  # a "}" without its "{"
            if pos < len(pattern):
                parts.append((pattern[pos:],))
            return parts
        if opening > pos:
            parts.append((pattern[pos:opening],))
        end = pattern.find("}", opening)
        if end < 0 or closing < opening or "{" in pattern[opening + 1 : end]:
            return None  # unbalanced or nested
        group = pattern[opening + 1 : end]
        match = _INT_RANGE.match(group)
        if match:
            parts.append(_IntRange(*match.groups()))
        elif "," in group and all(_WORD.match(word) for word in group.split(",")):
            parts.append(tuple(group.split(",")))
        else:
            return None
        pos = end + 1


class JoinedNames(Sequence[str]):
    """Several name sequences one after the other (patterns joined by ``::``)."""

    def __init__(self, parts: Sequence[Sequence[str]]):
        self.parts = tuple(parts)
        self._starts = [0]
        for part in self.parts:
            self._starts.append(self._starts[-1] + len(part))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = i.__index__()
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"name {i} of {len(self)}")
        k = bisect.bisect_right(self._starts, i) - 1
        return self.parts[k][i - self._starts[k]]


def split_patterns(text: str) -> list[str]:
    """``text`` cut at each ``::`` outside ``[...]`` (an IPv6 host such as
    ``http://[::1]:8000/`` keeps its colons): webdataset's and OpenCLIP's
    way of giving several patterns in one string."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] == "[":
            depth += 1
        elif text[i] == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith("::", i):
            parts.append(text[start:i])
            i += 2
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def is_pattern(text: str) -> bool:
    """Whether ``text`` names shards by braces or as ``::``-joined patterns."""
    return ("{" in text and "}" in text) or len(split_patterns(text)) > 1


def expand_patterns(text: str) -> Sequence[str]:
    """The names of ``::``-joined brace patterns, in order (each part as
    :func:`expand_braces` gives it)."""
    parts = [expand_braces(part) for part in split_patterns(text)]
    return parts[0] if len(parts) == 1 else JoinedNames(parts)


def expand_braces(pattern: str) -> Sequence[str]:
    """The names ``pattern`` expands to: a :class:`BraceList` where it takes
    the pattern, else ``braceexpand``'s list (same names, same order)."""
    try:
        return BraceList(pattern)
    except ValueError:
        import braceexpand

        return list(braceexpand.braceexpand(pattern))
