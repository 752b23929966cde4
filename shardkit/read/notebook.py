"""Notebook views of the reader's datasets (``_repr_html_``), drawn by a
layer above: :mod:`shardkit.preview` registers its views here when it is
imported (``import shardkit`` does so with the first reader name it
loads), so the reader never imports the page code. Without a registered
view a dataset shows its ``repr``, escaped."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

#: What a dataset's view is registered under, by the kind of dataset.
STREAM, INDEXED = "stream", "indexed"

_views: dict[str, Callable[[Any], str]] = {}


def register_notebook_view(kind: str, render: Callable[[Any], str]) -> None:
    """Draw datasets of ``kind`` (:data:`STREAM`, :data:`INDEXED`) with ``render``."""
    _views[kind] = render


def notebook_view(kind: str, dataset: Any) -> str:
    """The HTML a notebook shows for ``dataset``."""
    render = _views.get(kind)
    if render is None:
        return f"<p>{html.escape(repr(dataset))}</p>"
    return render(dataset)
