"""Checks of a manifest's JSON before anything in it is used: its depth,
and the type and range of every field a reader relies on (a manifest may be
damaged, or written by someone else to do harm)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.appended import Appended
from shardkit.format.index import MAX_TOKEN_FIELDS
from shardkit.format.table import TABLE_NAME, table_name

FORMAT_NAME = "shardkit"
MANIFEST_NAME = "manifest.json"
#: The version of a view's or an extension's manifest, a revision over other
#: datasets' shards (:mod:`shardkit.format.derived`).
DERIVED_VERSION = 5

#: Largest count or byte size a manifest may state, per shard and in total
#: (2**62: every sum stays within a 64-bit integer).
MAX_COUNT = 1 << 62


def short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (values from a manifest may be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."



_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_DEPTH_BLOCK = 1 << 20


def json_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects deeper than
    ``limit``, found without recursion: brackets outside strings are
    counted in blocks (a broken string makes the count high, never low)."""
    brackets = _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", raw))
    if len(brackets) <= limit:
        return False
    codes = np.frombuffer(brackets, dtype=np.uint8)
    depth = 0
    for lo in range(0, len(codes), _DEPTH_BLOCK):
        block = codes[lo : lo + _DEPTH_BLOCK]
        steps = np.where((block == ord("[")) | (block == ord("{")), 1, -1).astype(np.int64)
        running = np.cumsum(steps) + depth
        if int(running.max()) > limit:
            return True
        depth = int(running[-1])
    return False


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def check_fields(data: Mapping[str, Any], where: str, location: str | None, version: int) -> None:
    """Check the type and range of every field a reader relies on."""

    def bad(field_name: str, wanted: str, value: object) -> ManifestError:
        return ManifestError(
            f"{where}: {field_name} must be {wanted}, not {short(value)}; the manifest is damaged or was "
            "not written by shardkit. Rewrite it with `shardkit write`.",
            path=location,
        )

    if version == 1:
        shards = data.get("shards")
        if not isinstance(shards, list):
            raise bad("'shards'", "a list of shard entries", shards)
        for i, entry in enumerate(shards):
            if not isinstance(entry, dict):
                raise bad(f"shard {i}", "an object", entry)
            for key in ("path", "index", "sha256"):
                if key in entry and not isinstance(entry[key], str):
                    raise bad(f"shard {i} {key}", "a string", entry[key])
            for key in ("num_samples", "num_bytes"):
                if key in entry and not is_count(entry[key]):
                    raise bad(f"shard {i} {key}", "a whole number from 0 to 2**62", entry[key])
    else:
        for key in ("num_samples", "num_bytes", "num_shards"):
            if not is_count(data.get(key)):
                raise bad(f"'{key}'", "a whole number from 0 to 2**62", data.get(key))
        fingerprint = data.get("fingerprint")
        if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{64}", fingerprint):
            raise bad("'fingerprint'", "64 hex digits", fingerprint)
        ref = data.get("table")
        if not isinstance(ref, dict) or set(ref) != {"path", "num_bytes", "sha256"}:
            raise bad("'table'", "{'path': ..., 'num_bytes': ..., 'sha256': ...}", ref)
        if not isinstance(ref["path"], str) or not TABLE_NAME.match(ref["path"]):
            raise bad("'table' path", "a name like 'shards-0123456789abcdef.table'", ref["path"])
        if not is_count(ref["num_bytes"]):
            raise bad("'table' num_bytes", "a whole number from 0 to 2**62", ref["num_bytes"])
        if not isinstance(ref["sha256"], str) or not re.fullmatch(r"[0-9a-f]{64}", ref["sha256"]):
            raise bad("'table' sha256", "64 hex digits", ref["sha256"])
        if not ref["path"].startswith(table_name(ref["sha256"])[:23]):
            raise bad("'table' path", "named by its sha256", ref["path"])
    for key in ("num_samples", "num_bytes", "num_shards"):
        if key in data and not is_count(data[key]):
            raise bad(f"'{key}'", "a whole number from 0 to 2**62", data[key])
    for key in ("extensions", "skipped"):
        if not isinstance(data.get(key, []), list):
            raise bad(f"'{key}'", "a list", data[key])
    if not all(isinstance(e, str) for e in data.get("extensions", [])):
        raise bad("'extensions'", "a list of strings", data["extensions"])
    if not all(isinstance(s, dict) for s in data.get("skipped", [])):
        raise bad("'skipped'", "a list of objects", data["skipped"])
    counts = data.get("skipped_counts")
    if counts is not None and not (
        isinstance(counts, dict) and all(isinstance(k, str) and is_count(v) for k, v in counts.items())
    ):
        raise bad("'skipped_counts'", "an object of whole numbers", counts)
    names = data.get("class_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad("'class_names'", "a list of strings or null", names)
    for key in ("source", "options"):
        if not isinstance(data.get(key, {}), dict):
            raise bad(f"'{key}'", "an object", data[key])
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or abs(seed) > MAX_COUNT):
        raise bad("'seed'", "a whole number or null", seed)
    fields = data.get("token_fields")
    if fields is not None and (
        version < 3 or not isinstance(fields, list) or not 1 <= len(fields) <= MAX_TOKEN_FIELDS
        or not all(isinstance(f, str) and f for f in fields) or len(set(fields)) != len(fields)
    ):
        raise bad("'token_fields'", f"a list of 1 to {MAX_TOKEN_FIELDS} distinct field names, in format 3", fields)
    if version == 3 and fields is None:
        raise bad("'token_fields'", "present in format 3", fields)
    removed = data.get("removed")
    if (version == 4) != (removed is not None):
        raise bad("'removed'", "present in format 4 and only there", removed)
    if removed is not None:
        earlier = removed.get("earlier_fingerprints") if isinstance(removed, dict) else None
        if (
            set(removed) != {"num_samples", "earlier_fingerprints"} or not is_count(removed["num_samples"])
            or not isinstance(earlier, list) or len(earlier) > 10_000
            or not all(isinstance(f, str) and re.fullmatch(r"[0-9a-f]{64}", f) for f in earlier)
        ):
            raise bad("'removed'", "{'num_samples': N, 'earlier_fingerprints': [up to 10,000 of 64 hex digits]}", removed)
    compression = data.get("member_compression")
    if compression is not None and not isinstance(compression, str):
        raise bad("'member_compression'", "a string or null", compression)


#: Most appends a manifest records (``"appended"``), and the longest note of what each appended.
MAX_APPENDED = 100_000
MAX_SOURCE_CHARS = 4096


def appended_revisions(data: Mapping[str, Any], num_shards: int, where: str, location: str | None) -> tuple[Appended, ...]:
    """The manifest's ``"appended"`` list (see :mod:`shardkit.revise.append`):
    each earlier revision's fingerprint and shard count, oldest first, the
    counts rising and below ``num_shards`` (the table's).

    Raises:
        ManifestError: Anything else.
    """
    entries = data.get("appended", [])
    wanted = (f"a list of up to {MAX_APPENDED:,} {{'fingerprint': 64 hex digits, 'num_shards': N, 'source': "
              f"text}}, N rising below {num_shards}")  # fmt: skip
    ok = isinstance(entries, list) and len(entries) <= MAX_APPENDED
    out: list[Appended] = []
    for entry in entries if ok else ():
        if not (isinstance(entry, dict) and {"fingerprint", "num_shards"} <= set(entry) <= {"fingerprint", "num_shards", "source"}
                and isinstance(entry["fingerprint"], str) and re.fullmatch(r"[0-9a-f]{64}", entry["fingerprint"])
                and isinstance(entry.get("source", ""), str) and len(entry.get("source", "")) <= MAX_SOURCE_CHARS
                and is_count(entry["num_shards"]) and (out[-1].num_shards if out else -1) < entry["num_shards"] < num_shards):  # fmt: skip
            ok = False
            break
        out.append(Appended(entry["fingerprint"], int(entry["num_shards"]), entry.get("source", "")))
    if not ok:
        raise ManifestError(
            f"{where}: 'appended' must be {wanted}, not {short(entries)}; the manifest is damaged or was not "
            "written by shardkit. Rewrite it with `shardkit write`.",
            path=location,
        )
    return tuple(out)
