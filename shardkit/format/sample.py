"""A sample's names and its parsed form: webdataset's naming rules and
:class:`RawSample`, shared by the parsers of :mod:`shardkit.format.tar`
(which re-exports them) and :mod:`shardkit.format.plain`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shardkit.format.ustar import sample_checksum


def field_name(stored_ext: str) -> str:
    """The field a member's stored extension becomes: lower-cased, as
    webdataset and Hugging Face read it (``KEY.JPG`` -> ``jpg``)."""
    return stored_ext.lower()


def repeated_field(exts: Iterable[str]) -> tuple[str, str] | None:
    """Two of a sample's member extensions that read as one field (``TXT``
    and ``txt``: readers lower-case them, and a reader meeting both refuses
    the sample), or None. Writers check a sample with it before storing it."""
    seen: dict[str, str] = {}
    for ext in exts:
        name = field_name(ext)
        if name in seen:
            return seen[name], ext
        seen[name] = ext
    return None


def split_key(name: str) -> tuple[str, str] | None:
    """Split a member name into ``(key, extension)`` by webdataset's rule.

    The key is the path up to the first dot of the basename; the extension is
    everything after that dot, as it is (readers lower-case it). Returns None
    when the basename has no dot, or starts with one (a hidden file such as
    ``.DS_Store``), or has nothing after it.

    webdataset's ``base_plus_ext`` agrees except on a hidden file inside a
    folder: its pattern lets the key run across the slash, so it reads
    ``dir/.DS_Store`` as field ``ds_store`` of a sample keyed ``dir/``;
    shardkit skips that entry like a top-level ``.DS_Store``.

    >>> split_key("train/n0144/img_1.seg.png")
    ('train/n0144/img_1', 'seg.png')
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1 or dot == len(name) - 1:
        return None
    return name[:dot], name[dot + 1 :]


@dataclass(slots=True)
class RawSample:
    """One sample as parsed from tar bytes (not frozen, which would make
    each of the many a reader creates several times as slow to build;
    nothing changes one once built).

    Attributes:
        key: The sample key.
        fields: Extension (lower-cased) -> member bytes, in member order.
        start: Offset of the sample's first header byte in the shard.
        end: Offset just past the sample's last member (padding included).
        stored_extensions: The extensions as the member names spell them,
            in member order, when one differs from its lower-cased field
            name; None when all are lower-case already.
    """

    key: str
    fields: dict[str, bytes]
    start: int
    end: int
    stored_extensions: tuple[str, ...] | None = None

    def checksum(self) -> int:
        """The sample's :func:`sample_checksum`, over its members as stored
        (so an index written over ``KEY.JPG`` matches the field ``jpg``)."""
        names = self.fields if self.stored_extensions is None else self.stored_extensions
        return sample_checksum(self.key, zip(names, self.fields.values()))


__all__ = ["RawSample", "field_name", "repeated_field", "split_key"]
