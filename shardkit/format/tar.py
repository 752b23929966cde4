"""Tar members <-> samples: webdataset's naming rules and a fast push parser.

A shard is a POSIX tar file. A sample is the contiguous run of members
``KEY.EXT`` that share one key, where the key is the member path up to the
first dot of its basename and the extension is the rest, lower-cased
(webdataset's conventions: ``train/n01.v2/img.JPG`` is field ``jpg`` of
sample ``train/n01.v2/img``). Entries that are part of no sample are
skipped and counted, as webdataset skips them: directories, links, and
files without a ``KEY.EXT`` name (``README``, ``.DS_Store``, a name whose
basename starts with a dot). One warning per shard names the first.

Encoding (:mod:`shardkit.format.ustar`: plain ustar headers with fixed
metadata, so the same input gives the same bytes) is imported here too, so
``shardkit.format.tar`` names everything about members and samples.

Decoding is a push parser (:class:`SampleParser`): feed it large byte chunks
in stream order and it returns complete samples, parsing headers straight from
the buffer without creating ``TarInfo`` objects. It never returns a sample
before the sample's last member is complete.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence

from shardkit.errors import CorruptShardError
from shardkit.format.plain import SampleRun, plain_run, plain_samples
from shardkit.format.sample import RawSample, field_name, repeated_field, split_key
from shardkit.format.ustar import (
    BLOCK_SIZE,
    END_OF_ARCHIVE,
    MEMBER_MODE,
    MEMBER_MTIME,
    PAX_HEADER_NAME,
    ZERO_BLOCK,
    append_joined_sample,
    append_sample,
    byte_sum,
    encode_header,
    encode_joined_block,
    encode_sample,
    encoded_header_size,
    encoded_member_size,
    encoded_sample_size,
    join_members,
    joined_members,
    padding,
    sample_checksum,
    split_joined,
)

__all__ = [
    "BLOCK_SIZE",
    "END_OF_ARCHIVE",
    "MAX_EXTENDED_HEADER_BYTES",
    "MAX_MEMBER_BYTES",
    "MEMBER_MODE",
    "MEMBER_MTIME",
    "PAX_HEADER_NAME",
    "RawSample",
    "SampleParser",
    "ZERO_BLOCK",
    "append_joined_sample",
    "append_sample",
    "byte_sum",
    "encode_header",
    "encode_joined_block",
    "encode_sample",
    "encoded_header_size",
    "encoded_member_size",
    "encoded_sample_size",
    "join_members",
    "joined_members",
    "member_name_problem",
    "padding",
    "sample_checksum",
    "split_joined",
    "split_key",
]

log = logging.getLogger(__name__)

_REGULAR_TYPES = (b"0", b"\x00", b"7")
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")
#: Entries that are part of no sample (links, devices, directories, FIFOs):
#: stepped over when they carry no data. One that carries data, or is named
#: like a member of the sample being read (a directory entry without its
#: trailing slash, say), is a damaged member, not a directory: skipping it
#: would yield that sample without a field.
_SKIPPED_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")
#: Shards named so far by the skipped-entries warning (once per shard per
#: process), up to a limit: past it one last line says that more are not named.
_WARNED_SHARDS: set[str] = set()
_WARNED_LOCK = threading.Lock()
MAX_WARNED_SHARDS = 100



#: What a reader's corruption message tells the user to do.
REWRITE_ADVICE = "Run `shardkit verify` on the dataset or rewrite this shard."

def _warn_skipped(path: str, name: str, offset: int) -> None:
    """Log, once per shard, that entries which are no sample member are skipped."""
    with _WARNED_LOCK:
        if path in _WARNED_SHARDS or len(_WARNED_SHARDS) > MAX_WARNED_SHARDS:
            return
        _WARNED_SHARDS.add(path)
        last = len(_WARNED_SHARDS) > MAX_WARNED_SHARDS
    log.warning(
        "%s: skipping tar entries that are no sample member (directories, links, files without a KEY.EXT name), "
        "the first %r at byte %d, as webdataset does; `shardkit verify` counts them%s",
        path,
        name,
        offset,
        f" (further shards with such entries are not named: {MAX_WARNED_SHARDS} were)" if last else "",
    )


# ---------------------------------------------------------------- decoding


#: Largest member size the parser accepts: anything larger is
#: corruption or a hostile header, whatever the shard's length.
MAX_MEMBER_BYTES = 1 << 40
#: Largest extended header (pax ``x``/``g``, GNU ``L``/``K``) the parser holds
#: in memory; real ones are a few hundred bytes.
MAX_EXTENDED_HEADER_BYTES = 1 << 20


def _parse_number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 (first byte 0x80
    positive, 0xff negative). Raises ValueError for anything that is not a
    number of one of these forms, negative numbers included."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        raise ValueError("a negative number in base-256 notation")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    if text.strip(b"01234567"):
        raise ValueError(f"{bytes(text)!r} is not an octal number")
    return int(text, 8)


def _checked_size(value: int | str) -> int:
    """A member size from a header or pax record, range-checked."""
    size = int(value)
    if not 0 <= size <= MAX_MEMBER_BYTES:
        raise ValueError(f"size {size} is outside [0, {MAX_MEMBER_BYTES}]")
    return size


def member_name_problem(name: str) -> str | None:
    """Why ``name`` may not name a member of a shard shardkit writes, or None.

    Refused: empty names, a NUL or other control character, an absolute
    path, and ``.``/``..`` path components (a name that would leave the
    folder it is extracted into).
    """
    if not name:
        return "it is empty"
    if _CONTROL_CHARACTER.search(name):
        return "it holds a NUL or control character"
    if name.startswith("/"):
        return "it is an absolute path"
    if "." in name and any(part in (".", "..") for part in name.split("/")):
        return "it has a '.' or '..' path component"
    return None


def _parse_pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            break  # NUL padding after the last record
        space = data.index(b" ", pos, pos + 24)  # raises ValueError when absent
        length = int(data[pos:space])
        if length <= space - pos or pos + length > len(data):
            raise ValueError(f"pax record length {length} does not fit the header")
        if data[pos + length - 1 : pos + length] != b"\n":
            raise ValueError("pax record does not end with a newline")
        keyword, equals, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not equals:
            raise ValueError("pax record without '='")
        records[keyword.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class SampleParser:
    """Push parser turning tar bytes into complete samples.

    Feed chunks in stream order with :meth:`feed`; call :meth:`finish` at the
    end of the stream. Offsets in errors and samples are shard offsets, counted
    from ``base_offset`` (where the first fed byte sits in the shard).

    A sample is returned only once it is known to be whole: when the next
    sample's first member has been parsed, or by :meth:`finish` for the last
    one (an end-of-archive marker does not release the sample before it, since
    zero blocks may be damage inside that sample). A sample's span runs from
    where the previous sample ended (or ``base_offset``) to the end of its last
    member: entries that belong to no sample (directories, links, files
    without a ``KEY.EXT`` name) lead into the next sample's span, the way an
    offset index counts them; those after the last sample close the last
    sample's span, which then ends where the stream (or the end-of-archive
    marker) does. Such entries are skipped, counted in
    :attr:`num_skipped_entries`, and logged once per shard.

    Extensions are lower-cased (``KEY.JPG`` is field ``jpg``), so two members
    of a sample whose extensions differ only in case are an error.

    Every numeric header field is range-checked and every step moves forward
    by at least one block, so any input ends in samples or in a
    :class:`~shardkit.errors.CorruptShardError`.

    Args:
        path: Shard path or URL, used in error messages.
        base_offset: Shard offset of the first byte fed.
        offset_name: What offsets count, in error messages (``"byte"``;
            ``"uncompressed byte"`` for the tar inside a compressed shard).
        bounds: The offset index's boundaries of the samples the fed bytes
            hold (``bounds[0] == base_offset``; sample ``k`` spans
            ``[bounds[k], bounds[k + 1])``). When given, a sample that does not
            fill its span exactly, a member that runs past its span, a zero
            block inside the span, or data past the last span is an error
            before any of that sample is returned.
        checksums: Per-sample checksums (:func:`sample_checksum`) of the same
            samples, checked before each is returned; needs ``bounds``.
        stream_end: Shard offset where the fed bytes end, when known: a header
            whose member would run past it is an error at once, instead of
            after gathering the rest of the stream.
        run_field: With ``bounds`` and no ``checksums``: return consecutive
            plain samples that are one member of this field each as one
            :class:`~shardkit.format.plain.SampleRun` instead of a
            :class:`RawSample` each (a reader of that one field).
    """

    def __init__(
        self,
        *,
        path: str,
        base_offset: int = 0,
        offset_name: str = "byte",
        bounds: Sequence[int] | None = None,
        checksums: Sequence[int] | None = None,
        stream_end: int | None = None,
        run_field: str | None = None,
    ):
        if checksums is not None and (bounds is None or len(checksums) != len(bounds) - 1):
            raise ValueError("checksums need bounds, one per sample")
        self.path = path
        self.offset_name = offset_name
        self._buf = b""
        self._pos = 0  # parse position within _buf
        self._parts: list[bytes] = []  # fed chunks not yet joined into _buf
        self._parts_size = 0
        self._need = BLOCK_SIZE  # bytes from _pos needed before parsing can go on
        self._buf_offset = base_offset  # shard offset of _buf[0]
        self._pending_name: str | None = None  # from a pax or GNU long-name header
        self._pending_size: int | None = None
        self._stray: tuple[str, str, int] | None = None  # (key, name, offset) of a non-member entry named KEY.EXT
        self._member_start: int | None = None  # first header of the member in progress
        self._key: str | None = None
        self._fields: dict[str, bytes] = {}
        self._stored_extensions: list[str] | None = None  # as spelled, once one is not lower-case
        self._span_start = base_offset  # where the sample in progress (or the next) begins
        self._last_key: str | None = None  # of the last sample returned
        self._sample_end = base_offset
        self._bounds = bounds
        self._checksums = checksums
        self._limit = int(bounds[-1]) if bounds is not None else stream_end  # no member data past it
        self._run_field = run_field if checksums is None else None
        self.num_samples = 0  # samples returned so far
        self.num_skipped_entries = 0  # entries part of no sample, stepped over
        self.first_skipped: str | None = None  # the name of the first of them
        self.ended = False  # saw the end-of-archive marker
        self.end_offset: int | None = None  # shard offset of the end marker's first block

    @property
    def offset(self) -> int:
        """Shard offset up to which input has been consumed."""
        return self._buf_offset + self._pos

    def _error(self, message: str, *, member: str | None, offset: int) -> CorruptShardError:
        where = f"member {member!r} " if member else ""
        return CorruptShardError(
            f"{self.path}: {where}{message} at {self.offset_name} {offset}. {REWRITE_ADVICE}",
            path=self.path,
            member=member,
            offset=offset,
        )

    def feed(self, chunk: bytes) -> list[RawSample | SampleRun]:
        """Add bytes; return the samples completed by them (possibly none;
        runs of samples too, with ``run_field``)."""
        if self.ended or not chunk:
            return []
        self._parts.append(chunk)
        self._parts_size += len(chunk)
        if len(self._buf) - self._pos + self._parts_size < self._need:
            return []  # a large member: gather chunks, join them once
        rest = self._buf[self._pos :]
        joined = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._buf = rest + joined if rest else joined
        self._buf_offset += self._pos
        self._pos = 0
        self._parts = []
        self._parts_size = 0
        return self._parse()

    def finish(self, *, expect_end_marker: bool = True) -> list[RawSample]:
        """Mark the end of the stream; return the last sample.

        Args:
            expect_end_marker: True when the stream is a whole shard, which must
                end with the tar end-of-archive marker; False for a byte range
                that ends on a sample boundary (as given by the offset index).

        Raises:
            CorruptShardError: The stream stopped inside a member, or a whole
                shard ended without its end-of-archive marker (a truncated
                file), or (with ``bounds``) the stream held fewer samples than
                the offset index lists.
        """
        if not self.ended:
            leftover = len(self._buf) - self._pos + self._parts_size
            if leftover or self._member_start is not None:
                start = self._member_start if self._member_start is not None else self.offset
                raise self._error(
                    f"truncated: stream ended {leftover} bytes into an incomplete member",
                    member=self._pending_name,
                    offset=start,
                )
            if expect_end_marker:
                raise self._error(
                    "truncated: shard ends without the tar end-of-archive marker",
                    member=None,
                    offset=self.offset,
                )
        self.ended = True
        if self._key is not None:
            # Entries after the last member close the last sample's span.
            self._sample_end = self.end_offset if self.end_offset is not None else self.offset
        tail = self._flush()
        if self._bounds is not None and self.num_samples != len(self._bounds) - 1:
            raise self._error(
                f"the offset index lists {len(self._bounds) - 1} samples from byte {self._bounds[0]} but the "
                f"data holds {self.num_samples}",
                member=None,
                offset=self._span_start,
            )
        return tail

    def _flush(self) -> list[RawSample]:
        """The sample in progress, checked against its span and checksum."""
        if self._key is None:
            return []
        stored = self._stored_extensions
        sample = RawSample(
            self._key, self._fields, self._span_start, self._sample_end, None if stored is None else tuple(stored)
        )
        self._key = None
        self._fields = {}
        self._stored_extensions = None
        return [self._release(sample)]

    def _release(self, sample: RawSample) -> RawSample:
        """``sample``, next in the stream, once checked against its span and
        checksum."""
        k = self.num_samples
        if self._bounds is not None:
            if k >= len(self._bounds) - 1:
                raise self._error(
                    f"sample {sample.key!r} lies past the last sample the offset index lists",
                    member=None,
                    offset=sample.start,
                )
            if sample.end != int(self._bounds[k + 1]):
                raise self._error(
                    f"sample {sample.key!r} ends at byte {sample.end} but the offset index says "
                    f"{int(self._bounds[k + 1])}: the sample is damaged",
                    member=None,
                    offset=min(sample.end, int(self._bounds[k + 1])),
                )
            if self._checksums is not None:
                stored = int(self._checksums[k])
                actual = sample.checksum()
                if actual != stored:
                    raise self._error(
                        f"sample {sample.key!r} fails its checksum (stored {stored:08x}, read {actual:08x}): "
                        "its bytes changed after it was written",
                        member=None,
                        offset=sample.start,
                    )
        self._span_start = sample.end
        self._last_key = sample.key
        self.num_samples = k + 1
        return sample

    def _span_end(self, starting: bool) -> int | None:
        """Where the sample in progress (or, ``starting``, the next one) must end."""
        if self._bounds is None:
            return self._limit
        k = self.num_samples + (1 if starting and self._key is not None else 0)
        if k >= len(self._bounds) - 1:
            return int(self._bounds[-1])
        return int(self._bounds[k + 1])

    def _one_pass(self) -> list[RawSample | SampleRun]:
        """The whole samples at the parse position, when the offset index
        spans them and they are plain, read in one pass
        (:func:`~shardkit.format.plain.plain_samples`; the rest of the parse
        reads what it leaves). A sample in progress goes first, once known
        whole: it fills its span."""
        bounds = self._bounds
        if bounds is None or self._member_start is not None or self._stray is not None:
            return []
        if self._pending_name is not None or self._pending_size is not None:
            return []
        out: list[RawSample | SampleRun] = []
        while True:
            held = self._key is not None
            k = self.num_samples + held
            if k >= len(bounds) - 1 or (held and self._sample_end != int(bounds[k])):
                return out
            if self._buf_offset + self._pos != int(bounds[k]):
                return out  # entries of no sample lead into the next span
            previous = self._key if held else self._last_key
            run = None
            if self._run_field is not None:
                run = plain_run(self._buf, self._pos, self._buf_offset, bounds[k:], self._run_field, previous=previous)
            if run is not None:
                out.extend(self._flush())
                out.append(self._release_run(run))
                continue
            found = plain_samples(self._buf, self._pos, self._buf_offset, bounds[k:], previous=previous)
            if not found:
                return out
            out.extend(self._flush())
            out.extend(self._release(sample) for sample in found)
            self._sample_end = found[-1].end
            self._pos = self._sample_end - self._buf_offset

    def _release_run(self, run: SampleRun) -> SampleRun:
        """``run``, next in the stream: its samples fill their spans, which
        are the offset index's next ones (it was cut from them)."""
        k = self.num_samples
        assert self._bounds is not None and run.end == int(self._bounds[k + len(run)])
        self.num_samples = k + len(run)
        self._span_start = self._sample_end = run.end
        self._last_key = run.key(len(run) - 1)
        self._pos = run.end - self._buf_offset
        return run

    def _parse(self) -> list[RawSample | SampleRun]:
        out = self._one_pass()
        buf = self._buf
        pos = self._pos
        end = len(buf)
        base = self._buf_offset
        self._need = BLOCK_SIZE
        while end - pos >= BLOCK_SIZE:
            header = buf[pos : pos + BLOCK_SIZE]
            if self._member_start is None:
                self._member_start = base + pos
            if header == ZERO_BLOCK:
                if self._pending_name is not None or self._pending_size is not None:
                    raise self._error(
                        "extended header not followed by a member",
                        member=self._pending_name,
                        offset=base + pos,
                    )
                if self._limit is not None and self._bounds is not None and base + pos < self._limit:
                    raise self._error(
                        "zero block (an end-of-archive marker?) inside the samples the offset index lists (they "
                        f"run to byte {self._limit}): a sample there is damaged",
                        member=None,
                        offset=base + pos,
                    )
                # The sample before the marker is released by finish(), once
                # the caller has checked that the marker is where it belongs.
                self.ended = True
                self.end_offset = base + pos
                self._pos = end
                self._member_start = None
                return out
            stored = header[148:156]
            try:
                checksum = int(stored.split(b"\x00", 1)[0].strip() or b"-1", 8)
            except ValueError:
                checksum = -1
            if byte_sum(header) - sum(stored) + 256 != checksum:
                raise self._error("bad tar header checksum", member=None, offset=base + pos)
            typeflag = header[156:157]
            try:
                size = _checked_size(
                    self._pending_size if self._pending_size is not None else _parse_number(header[124:136])
                )
            except ValueError as exc:
                member = self._pending_name or _ustar_name(header)
                raise self._error(f"bad size field ({exc})", member=member, offset=self._member_start) from None
            data_start = pos + BLOCK_SIZE
            data_end = data_start + size
            next_pos = data_end + padding(size)
            if typeflag in (b"x", b"g", b"L", b"K"):
                self._note_stray(header[0:100].split(b"\x00", 1)[0].decode("utf-8", "surrogateescape"), typeflag, 0)
                if size > MAX_EXTENDED_HEADER_BYTES:
                    raise self._error(
                        f"extended header of {size} bytes (at most {MAX_EXTENDED_HEADER_BYTES} are accepted)",
                        member=None,
                        offset=base + pos,
                    )
                self._check_within(base + data_end, starting=True, member=None, offset=self._member_start)
                # Extended headers: their data is needed now, wait for all of it.
                if end < next_pos:
                    self._need = next_pos - pos
                    break
                data = buf[data_start:data_end]
                try:
                    if typeflag == b"x":
                        records = _parse_pax(data)
                        if "path" in records:
                            self._pending_name = records["path"]
                        if "size" in records:
                            self._pending_size = _checked_size(records["size"])
                    elif typeflag == b"L":
                        self._pending_name = data.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
                except (ValueError, UnicodeDecodeError) as exc:
                    raise self._error(f"malformed extended header ({exc})", member=None, offset=base + pos) from None
                pos = next_pos
                continue
            name = self._pending_name if self._pending_name is not None else _ustar_name(header)
            member_start = self._member_start
            regular = typeflag in _REGULAR_TYPES
            if not regular and typeflag not in _SKIPPED_TYPES:
                raise self._error(f"unsupported tar member type {typeflag!r}", member=name, offset=member_start)
            parts = split_key(name) if regular else None
            if "\x00" in name:
                raise self._error("has a NUL byte in its name", member=name, offset=member_start)
            if not regular:
                self._note_stray(name, typeflag, size if typeflag in _SKIPPED_TYPES else 0)
            elif self._stray is not None and parts is not None and parts[0] == self._stray[0]:
                stray_key, stray_name, stray_offset = self._stray
                raise self._error(
                    f"an entry that is no file, {stray_name!r}, is named like a member of sample {stray_key!r}: "
                    "a damaged member",
                    member=stray_name,
                    offset=stray_offset,
                )
            starting = parts is None or parts[0] != self._key
            self._check_within(base + data_end, starting=starting, member=name, offset=member_start)
            if end < next_pos:
                # Member not complete yet: parse its header again next time.
                self._need = next_pos - pos
                break
            self._pending_name = None
            self._pending_size = None
            self._member_start = None
            pos = next_pos
            if parts is None:  # a directory, link, device, or a file without a KEY.EXT name
                self.num_skipped_entries += 1
                if self.first_skipped is None:
                    self.first_skipped = name
                    _warn_skipped(self.path, name, member_start)
                continue
            key, stored_ext = parts
            ext = field_name(stored_ext)
            self._stray = None
            if key != self._key:
                if self._key is None and key == self._last_key:
                    # A sample the one pass returned whole, continued.
                    raise self._error(
                        f"continues sample {key!r}, which the offset index says ended at byte {self._span_start}",
                        member=name,
                        offset=member_start,
                    )
                out.extend(self._flush())
                self._key = key
            elif ext in self._fields:
                raise self._error(
                    f"repeats extension {ext!r} of sample {key!r}", member=name, offset=member_start
                )
            if ext != stored_ext and self._stored_extensions is None:
                self._stored_extensions = list(self._fields)  # the earlier ones were lower-case
            if self._stored_extensions is not None:
                self._stored_extensions.append(stored_ext)
            self._fields[ext] = buf[data_start:data_end]
            self._sample_end = base + next_pos
        self._pos = pos
        return out

    def _note_stray(self, name: str, typeflag: bytes, size: int) -> None:
        """An entry that is no member (a directory, link, extended header):
        one that carries data where none belongs, or is named like a member
        of the sample around it, is a damaged member; skipping it would
        yield that sample without a field."""
        offset = self._member_start if self._member_start is not None else self.offset
        # A directory entry as tar tools write it ends with a slash; its name
        # may look like KEY.EXT (``data.v1/``) without being a member.
        stem = None if typeflag == b"5" and name.endswith("/") else split_key(name.rstrip("/"))
        if size or (stem is not None and stem[0] == self._key):
            raise self._error(
                f"a {typeflag!r} entry (no file) of {size} bytes where a sample's member belongs",
                member=name,
                offset=offset,
            )
        self._stray = None if stem is None else (stem[0], name, offset)

    def _check_within(self, data_end: int, *, starting: bool, member: str | None, offset: int) -> None:
        """Refuse a member whose data would end past its sample's span (with
        ``bounds``) or past the end of the stream, before waiting for it."""
        if self._bounds is not None and offset >= int(self._bounds[-1]):
            raise self._error(
                f"lies past byte {int(self._bounds[-1])}, where the offset index says the samples end (the shard "
                "holds more samples than its index lists)",
                member=member,
                offset=offset,
            )
        limit = self._span_end(starting)
        if limit is not None and data_end > limit:
            what = "its sample's end in the offset index" if self._bounds is not None else "the end of the shard"
            raise self._error(
                f"claims data up to byte {data_end}, past {what} (byte {limit})",
                member=member,
                offset=offset,
            )


def _ustar_name(header: bytes) -> str:
    """A header's member name from its ustar name and prefix fields."""
    raw_name = header[0:100].split(b"\x00", 1)[0]
    if header[257:262] == b"ustar" and header[345] != 0:
        raw_name = header[345:500].split(b"\x00", 1)[0] + b"/" + raw_name
    return raw_name.decode("utf-8", "surrogateescape")
