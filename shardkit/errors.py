"""Errors raised by shardkit.

Every error derives from :class:`ShardkitError` and, where one fits, from the
matching builtin too, so handlers written for ``ValueError`` or ``OSError``
still catch them::

    ShardkitError
    ├── UsageError (ValueError)          bad option values, conflicting flags
    ├── SourceError (ValueError)         input dataset cannot be read as asked
    │   ├── DuplicateSampleError         two inputs map to one key + extension
    │   ├── MapError                     the user's map failed on an item or returned no sample
    │   └── InputFileError (OSError)     an input file is missing or unreadable
    ├── DestinationError (FileExistsError)  output directory not usable
    ├── ManifestError (ValueError)       manifest missing, malformed, mismatched
    ├── CorruptShardError (ValueError)   tar bytes are not what they must be
    │   ├── TruncatedShardError          a shard's data ends before its manifest or index says
    │   ├── MemberTooLargeError          a member inflates past a limit (decompressed bytes)
    │   │   ├── ImageTooLargeError       an image's (or video frame's) header claims more pixels than the limit
    │   │   └── MediaTooLargeError       a video or audio member needs more frames or samples than the limit
    │   └── MediaError                   a video or audio member does not decode as its header says
    ├── VerifyError (ValueError)         ``shardkit verify`` found a bad shard
    ├── MissingShardError (FileNotFoundError)  a shard the manifest lists is gone
    ├── StateError (ValueError)          a reader checkpoint cannot be restored
    └── RemoteError (OSError)            a remote object could not be fetched or stored

Errors carry where they happened as attributes (``path``, ``member``,
``offset``) instead of only inside the message, so callers can act on them.

Messages never hold secrets: every URL in a :class:`ShardkitError`'s message
goes through :func:`redact_url` when the error is made (no ``user:password@``,
no query string, where presigned URLs carry their signature and token), on
top of the redaction each message does when it is formatted. So does every
attribute that names a location (:data:`LOCATION_ATTRIBUTES`), whenever it
is set: an error's ``repr``, its attributes and its pickle hold no secret.
"""

from __future__ import annotations

import re
import urllib.parse

#: A URL inside free text: ``scheme://`` up to the next blank or quote.
#: Schemes whose URLs carry ``user:password@``: there a raw ``@`` in the
#: path is taken for the end of a password that was not percent-encoded.
_USERINFO_SCHEMES = frozenset({"http", "https", "ftp", "ftps", "sftp", "ssh", "webdav", "dav", "davs"})

_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")


def redact_url(url: str) -> str:
    """Drop credentials, query string and fragment from ``url`` for logs and errors.

    Userinfo (``user:password@``) and the whole query string go: a presigned
    URL carries its signature, credential and token there (``X-Amz-Signature``,
    ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``Signature``, ``sig``,
    ``token``...). A ``pipe:CMD`` keeps its command with any URL in it
    redacted. A plain path is returned as it is. An ``http(s)://`` URL
    whose path holds an ``@`` (a password typed with a raw ``/``) loses
    everything up to that ``@``.

    >>> redact_url("https://user:secret@host/a/b.tar?X-Amz-Signature=abc")
    'https://host/a/b.tar'
    """
    if url.startswith("pipe:"):
        return redact_text(url)
    if "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    if not rest:  # a scheme named in prose ("URLs (s3://, ...)"): nothing to hide
        return url
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
        suspicious = scheme.lower() in _USERINFO_SCHEMES and "@" in parts.path
    except ValueError:  # malformed (a bad IPv6 literal, a bad port)
        suspicious = True
    if suspicious:
        # A password typed with a raw "/" or "@" (not percent-encoded) ends
        # the authority early: everything up to the last "@" may be secret.
        return f"{scheme}://{rest.rsplit('@', 1)[-1]}"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_text(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url`.

    >>> redact_text("cannot read http://u:pw@h/x.tar?sig=1 (HTTP 403)")
    'cannot read http://h/x.tar (HTTP 403)'
    """
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(_redact_match, text)


def _redact_match(match: re.Match[str]) -> str:
    # Punctuation closing the URL belongs to the sentence ("URL: what"), not to its query.
    url = match.group(0)
    kept = url.rstrip(":,;.)]'")
    return redact_url(kept) + url[len(kept) :]


#: Error attributes that name a file or object: redacted whenever they are set.
LOCATION_ATTRIBUTES = frozenset({"path", "url", "first", "second"})


class ShardkitError(Exception):
    """Base class of every error shardkit raises on purpose.

    Every subclass survives ``pickle`` (a worker process, a Ray task or a
    DataLoader worker hands it to its parent) with its message and its
    attributes, whatever its ``__init__`` takes: the instance is rebuilt
    without calling ``__init__`` and given back its ``args`` and attributes.

    Every URL in the message is redacted (:func:`redact_text`), whichever
    floor formatted it, and so is a location attribute (``path``, ``url``,
    ``first``, ``second``: :func:`redact_url`) when it is set.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_text(a) if isinstance(a, str) else a for a in args))

    def __setattr__(self, name: str, value: object) -> None:
        if name in LOCATION_ATTRIBUTES and isinstance(value, str):
            value = redact_url(value)
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple:
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


def _rebuild_error(cls: type[ShardkitError], args: tuple, state: dict) -> ShardkitError:
    # The C-level constructor of the builtin that lays the instance out
    # (OSError's differs from the others'); __init__ is not called, as it may
    # take keyword-only arguments that args does not hold.
    base: type[BaseException] = OSError if issubclass(cls, OSError) else BaseException
    error = base.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class UsageError(ShardkitError, ValueError):
    """An option has an invalid value or options conflict."""


class SourceError(ShardkitError, ValueError):
    """The input dataset cannot be read the way it was asked for.

    Attributes:
        path: The input path at fault, when one is known.
        line: The 1-based line number for line-oriented inputs (JSONL).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line


class DuplicateSampleError(SourceError):
    """Two inputs map to the same sample key and extension."""

    def __init__(self, message: str, *, first: str, second: str):
        super().__init__(message, path=second)
        self.first = first
        self.second = second


class InputFileError(SourceError, OSError):
    """An input file vanished or cannot be read while writing."""


class MapError(SourceError):
    """The user's ``map`` failed on an item, or returned what cannot be stored.

    Attributes:
        path: The item (``items#row=17`` for a sequence's, else its input).
        reason: ``map_error`` (it raised), ``bad_sample`` (not a sample, no
            key, a value that cannot be encoded) or an image's problem
            (``not_image``...).
        frames: When the function raised: the last frames of its traceback,
            formatted (``shardkit write -v`` prints them), else "".
    """

    def __init__(self, message: str, *, path: str, reason: str, frames: str = ""):
        super().__init__(message, path=path)
        self.reason = reason
        self.frames = frames


class DestinationError(ShardkitError, FileExistsError):
    """The output location cannot be used (not empty, not a directory...)."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class ManifestError(ShardkitError, ValueError):
    """A manifest is missing, malformed or does not match the shards."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class CorruptShardError(ShardkitError, ValueError):
    """Tar bytes that cannot be parsed, or end in the middle of a sample.

    Attributes:
        path: The shard path or URL.
        member: The member name being read, when it is known.
        offset: The byte offset in the shard where the problem was found.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
    ):
        super().__init__(message)
        self.path = path
        self.member = member
        self.offset = offset


class TruncatedShardError(CorruptShardError):
    """A shard's data stops before the end its manifest or offset index gives
    (or goes on past it): the shard was cut short, damaged or rewritten.
    ``offset`` is where the data ended; nothing after it can be read."""


class MemberTooLargeError(CorruptShardError):
    """A member would inflate past a configured limit: it decompresses to
    more than ``max_member_bytes`` (a decompression bomb, or a member too
    large to hold), or, as :class:`ImageTooLargeError`, its image header
    claims more than ``max_image_pixels`` pixels. Nothing past the limit is
    allocated. A data fault like corruption: ``on_error="skip"`` skips the
    sample.

    Attributes:
        path: The shard, when known.
        member: The member's name (``KEY.EXT``), when known.
        limit: The limit that was passed.
        option: The option that sets the limit (``"max_member_bytes"``).
        amount: What the member holds, where known (at least ``limit + 1``).
    """

    #: What the error counts, for the message.
    unit = "bytes"

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
        option: str | None = None,
        amount: int | None = None,
        what: str | None = None,
    ):
        super().__init__(message, path=path, member=member, offset=offset)
        self.limit = limit
        self.option = option
        self.amount = amount
        self.what = what  # the message's first part, without where or what to do

    @classmethod
    def over_limit(
        cls,
        what: str,
        *,
        limit: int,
        option: str,
        path: str | None = None,
        member: str | None = None,
        amount: int | None = None,
        unit: str | None = None,
    ) -> MemberTooLargeError:
        """The error for ``what`` (``"image header gives 20000 x 20000 =
        400,000,000 pixels"``), with where, the limit (counted in ``unit``,
        default the class's) and what to do."""
        where = _where(path, member)
        message = (
            f"{where}{what}, over the limit of {limit:,} {unit or cls.unit} ({option}={limit}). "
            f"If such members are expected, raise {option}; otherwise rewrite this shard, or read past the "
            "sample with on_error='skip'."
        )
        error = cls(message, path=path, member=member, limit=limit, option=option, amount=amount, what=what)
        if unit is not None:
            error.unit = unit
        return error

    def located(self, *, path: str | None, member: str | None) -> MemberTooLargeError:
        """The same error naming ``path`` and ``member`` (where it is first known)."""
        if self.what is None or self.limit is None or self.option is None:
            return self
        return type(self).over_limit(
            self.what,
            limit=self.limit,
            option=self.option,
            path=path or self.path,
            member=member or self.member,
            amount=self.amount,
            unit=self.unit,
        )


class ImageTooLargeError(MemberTooLargeError):
    """An image's header gives more pixels than ``max_image_pixels`` (an
    image bomb: a few KB of PNG can claim gigabytes of pixels). Raised from
    the header, before anything is decoded; ``amount`` is the pixel count."""

    unit = "pixels"


class MediaTooLargeError(MemberTooLargeError):
    """A video or audio member would need more than a limit allows: more
    frames decoded for one clip than ``max_decoded_frames`` (a stream of
    tiny frames, a keyframe interval of minutes, timestamps that lie), or
    more audio samples than ``max_audio_samples``. Raised before the excess
    is decoded or allocated; ``unit`` says what ``amount`` counts."""

    unit = "frames"


class MediaError(CorruptShardError):
    """A video or audio member that does not decode as its own header
    says: not a container FFmpeg or libsndfile reads, no stream of the kind
    asked for, frames that end long before the duration it claims, a
    decoder error. A data fault like corruption: ``on_error="skip"`` skips
    the sample.

    Attributes:
        what: The fault, without where or what to do.
    """

    def __init__(self, message: str, *, path: str | None = None, member: str | None = None, what: str | None = None):
        super().__init__(message, path=path, member=member)
        self.what = what

    @classmethod
    def of(cls, what: str, *, path: str | None = None, member: str | None = None) -> MediaError:
        """The error for ``what`` (``"no video stream"``), with where and what to do."""
        message = (
            f"{_where(path, member)}{what}. The member is damaged or not what its name says: rewrite it, "
            "or read past the sample with on_error='skip'."
        )
        return cls(message, path=path, member=member, what=what)

    def located(self, *, path: str | None, member: str | None) -> MediaError:
        """The same error naming ``path`` and ``member`` (where it is first known)."""
        if self.what is None:
            return self
        return type(self).of(self.what, path=path or self.path, member=member or self.member)


#: The errors a transform in ``map`` raises for a member at fault rather
#: than for a bug: data faults, which the readers raise naming the shard and
#: member (each has ``located``), or skip under ``on_error="skip"``.
TRANSFORM_FAULTS: tuple[type[MemberTooLargeError] | type[MediaError], ...] = (MemberTooLargeError, MediaError)


def _where(path: str | None, member: str | None) -> str:
    """``"PATH: member 'KEY.EXT': "``, the parts that are known."""
    where = ": ".join(p for p in (path, f"member {member!r}" if member else None) if p)
    return where + ": " if where else ""


class VerifyError(ShardkitError, ValueError):
    """A shard failed verification against its manifest entry; raised for a
    whole dataset, the first of those that failed.

    Attributes:
        path: The shard (or offset index) at fault; for a dataset, the first
            failed shard's.
        failures: For a dataset, the failed shards' own errors, the first
            :data:`shardkit.verify.LISTED` by shard number; ``()`` for one shard.
        num_failed: How many shards failed (1 for one shard).
    """

    def __init__(self, message: str, *, path: str, failures: tuple[VerifyError, ...] = (), num_failed: int = 1):
        super().__init__(message)
        self.path = path
        self.failures = failures
        self.num_failed = num_failed


class RemoteError(ShardkitError, OSError):
    """A remote object (HTTP, S3, fsspec) could not be read or written.

    Raised at once for answers that retrying cannot fix (403, 404, 416), and
    after the retry deadline for transient faults (timeouts, dropped
    connections, 5xx answers).

    Attributes:
        url: The object's URL, without query string or credentials.
        offset: The byte offset the failed request started at, when known.
        status: The HTTP status of the last answer, when there was one.
        retryable: Whether the last fault was transient (so the deadline ran out).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        offset: int | None = None,
        status: int | None = None,
        retryable: bool = False,
    ):
        super().__init__(message)
        self.url = url
        self.offset = offset
        self.status = status
        self.retryable = retryable


class MissingShardError(ShardkitError, FileNotFoundError):
    """A shard the manifest lists is gone (moved or deleted after the
    dataset was written or indexed).

    Attributes:
        path: The shard's path.
    """

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class WorkerStartError(ShardkitError, RuntimeError):
    """A DataLoader worker never started (stuck before running any code) and
    was stopped; the message says which and the likely cause."""


class StateError(ShardkitError, ValueError):
    """A reader checkpoint cannot be restored: malformed, from another
    dataset, made with incompatible options, or missing the ranks needed."""
