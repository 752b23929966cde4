"""Which member extensions name images, and under which a string is text.

A leaf the sources (:mod:`shardkit.write.sources`), the table column map and
the shard writers share: it imports nothing of the writer, so any of them may
import it whatever was imported first.
"""

from __future__ import annotations

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp", "gif"})

#: Extensions whose string values are content, not file paths or URLs (in
#: JSONL rows and table columns alike), matched in lower case.
TEXT_EXTENSIONS = frozenset({"txt", "text", "caption", "json", "cls", "id", "md", "html", "csv", "label"})

__all__ = ["IMAGE_EXTENSIONS", "TEXT_EXTENSIONS"]
