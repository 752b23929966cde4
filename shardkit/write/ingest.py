"""Rows of a table turned into sample fields: URLs fetched, images checked and resized.

This is where the writer meets :mod:`~shardkit.write.sources.table_reader`,
:mod:`~shardkit.write.download` and :mod:`~shardkit.write.resize`. For one
shard, a writer process does::

    with Downloader(download_options) as downloader:       # once per process
        for result in ingest_rows(row_samples, downloader=downloader, images=image_options):
            if isinstance(result, IngestedSample):
                shard.add(result.key, result.fields)
            else:                                            # a SkippedRow
                skipped.append(result.skipped_input(source))  # counted by result.reason

``row_samples`` are the shard's :class:`~shardkit.write.fieldmap.RowSample`
in plan order; results come back in that order whatever finished first,
so a shard's bytes depend only on what was fetched. Rows are worked on
concurrently on the downloader's threads (the image work too: Pillow lets go
of the GIL while it decodes, resizes and encodes); a row's own URL fields
are fetched one after the other, and its first failure ends it.

Image fields (extensions in ``IMAGE_EXTENSIONS``) that were downloaded are
always checked to decode (and resized with ``images.resize``); image bytes
that came in the table are stored as they are unless ``images.resize`` is
set. When a row had URLs (or resized images), its ``json`` member records
where they came from: ``url``, ``status``, and for images
``original_width``/``original_height`` and the stored ``width``/``height``; with one URL field at the top level of
the object (beside the ``json=*`` columns), with several under each field's
extension. A ``json`` mapped from a column of its own is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from shardkit.errors import SourceError
from shardkit.format.manifest import SkippedInput
from shardkit.io.urls import redact_url
from shardkit.write.extensions import IMAGE_EXTENSIONS
from shardkit.write.download import Downloader
from shardkit.write.fieldmap import RowSample, UrlField, encode_record
from shardkit.write.resize import ImageOptions, ImageProblem, prepare_image


@dataclass(frozen=True, slots=True)
class IngestedSample:
    """A row ready to store: ``fields`` are ``(ext, bytes)`` sorted by ext."""

    key: str
    position: int
    fields: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class SkippedRow:
    """A row left out, and why.

    Attributes:
        key, position: The row.
        ext: The field at fault ("" when the row as a whole is).
        url: Its URL, redacted (no credentials, no query string); "" if none.
        status: The last HTTP status, when there was one.
        reason: A short category: a downloader reason
            (:data:`~shardkit.write.download.REASONS`), an image one
            (``not_image``, ``too_small``, ``image_too_large``), or
            ``no_fields``.
        detail: One line about it.
    """

    key: str
    position: int
    ext: str
    url: str
    status: int | None
    reason: str
    detail: str

    def skipped_input(self, source: str) -> SkippedInput:
        """The manifest's skip record: ``path`` names the table and row,
        ``reason`` starts with the category (``http_404: ...``)."""
        where = f" {self.ext}" if self.ext else ""
        url = f" {self.url}" if self.url else ""
        return SkippedInput(path=f"{source}#row={self.position}", reason=f"{self.reason}:{where}{url}: {self.detail}")

    def error(self, source: str) -> SourceError:
        """The error to raise for it under ``on_error="raise"``."""
        skipped = self.skipped_input(source)
        return SourceError(
            f"{source}: row {self.position} (key {self.key}): {skipped.reason}. Fix the row, or pass "
            "--on-error skip to leave such rows out (they are counted by reason in the manifest)",
            path=source,
        )


def ingest_rows(
    samples: Iterable[RowSample | SkippedRow], *, downloader: Downloader, images: ImageOptions | None = None
) -> Iterator[IngestedSample | SkippedRow]:
    """Each row's fields ready to store, or why it was left out, in input order.

    Args:
        samples: Rows mapped by a :class:`~shardkit.write.fieldmap.FieldMap`
            (their local files read), or rows already left out, passed on in
            their place.
        downloader: Fetches URL fields (its threads run the rows).
        images: Checking and resizing image fields (default: check only).
    """
    options = images or ImageOptions()

    def ingest(sample: RowSample | SkippedRow) -> IngestedSample | SkippedRow:
        if isinstance(sample, SkippedRow):
            return sample
        return ingest_row(sample, downloader=downloader, images=options)

    return downloader.map_ordered(ingest, samples)


def ingest_row(sample: RowSample, *, downloader: Downloader, images: ImageOptions) -> IngestedSample | SkippedRow:
    """One row (see :func:`ingest_rows`), on the calling thread."""
    fields: dict[str, bytes] = {}
    facts: dict[str, dict[str, Any]] = {}
    for ext, value in sample.fields:
        is_image = ext.lower() in IMAGE_EXTENSIONS
        if isinstance(value, UrlField):
            fetched = downloader.fetch(value.url)
            if not fetched.ok:
                return SkippedRow(sample.key, sample.position, ext, redact_url(fetched.url), fetched.status,
                                  fetched.reason or "", fetched.detail)  # fmt: skip
            assert fetched.data is not None
            data = fetched.data
            facts[ext] = {"url": fetched.url, "status": fetched.status}
            check = is_image
        else:
            assert isinstance(value, bytes), "local files are read before rows are ingested"
            data = value
            check = is_image and images.resize is not None
        if check:
            try:
                image = prepare_image(data, images)
            except ImageProblem as problem:
                url = redact_url(value.url) if isinstance(value, UrlField) else ""
                status = facts.get(ext, {}).get("status")
                return SkippedRow(sample.key, sample.position, ext, url, status, problem.reason, problem.detail)
            data = image.data
            facts.setdefault(ext, {}).update(
                original_width=image.original_width, original_height=image.original_height,
                width=image.width, height=image.height,
            )  # fmt: skip
        fields[ext] = data
    if facts and "json" not in fields:
        record = dict(sample.record or {})
        if len(facts) == 1:
            record.update(next(iter(facts.values())))
        else:
            record.update(facts)
        fields["json"] = encode_record(record)
    elif sample.record is not None and "json" not in fields:
        fields["json"] = encode_record(sample.record)
    if not fields:
        return SkippedRow(sample.key, sample.position, "", "", None, "no_fields", "every mapped column is empty")
    return IngestedSample(sample.key, sample.position, tuple(sorted(fields.items())))


__all__ = ["IngestedSample", "SkippedRow", "ingest_row", "ingest_rows"]
