"""Load option dataclasses from YAML configs, mappings and command-line values.

One loader serves every frozen options dataclass (the writer's
``WriteOptions``, the reader's options): the config file uses the field names
of the class, unknown keys are refused by name, and values are converted by
the field's declared type, so nothing converts config values by hand::

    options = load_options(WriteOptions, "configs/imagenet-like.yaml", section="write")

Fields whose name ends in ``_bytes`` take sizes such as ``"256MB"`` or
``"1GiB"`` as well as plain integers. Errors are :class:`UsageError` naming
the file (or ``command line``) and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from shardkit.errors import UsageError

T = TypeVar("T")

#: Where values passed as ``overrides`` are said to come from in messages.
COMMAND_LINE = "command line"

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1 << 10,
    "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
    "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
    "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
}  # fmt: skip


def human_bytes(n: float) -> str:
    """A byte count for people, in powers of 1000: ``812 B``, ``1.5 MB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def parse_size(text: str) -> int:
    """Parse a byte size such as ``"512MB"``, ``"1GiB"`` or ``"4096"``.

    Args:
        text: A positive number with an optional decimal (``KB``, ``MB``...)
            or binary (``KiB``, ``MiB``...) unit; case and spaces are ignored.

    Returns:
        The size in bytes.

    Raises:
        UsageError: Not a positive size.
    """
    cleaned = text.strip().lower().replace(" ", "")
    number = cleaned.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (examples: 4096, 512MB, 1GiB)") from None
    if unit not in _SIZE_UNITS or value <= 0 or value != value:
        raise UsageError(f"not a positive size: {text!r} (examples: 4096, 512MB, 1GiB)")
    return int(value * _SIZE_UNITS[unit])


def read_config(path: str | os.PathLike[str], *, section: str | None = None) -> dict[str, Any]:
    """Read a YAML config file into a plain mapping (no conversion).

    Args:
        path: The YAML file.
        section: If the file's top level has this key holding a mapping
            (``write:``), return that mapping; otherwise the whole file.

    Returns:
        The options as written in the file.

    Raises:
        UsageError: The file cannot be read, is not YAML, or is not a mapping.
    """
    import yaml

    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise UsageError(f"{name}: cannot read config ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{name}: invalid YAML ({exc})") from exc
    if data is None:
        data = {}
    if section is not None and isinstance(data, dict) and isinstance(data.get(section), dict):
        data = data[section]
    if not isinstance(data, dict):
        raise UsageError(f"{name}: config must be a mapping of option names to values")
    return dict(data)


def load_options(
    cls: type[T],
    source: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    section: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    override_names: Mapping[str, str] | None = None,
) -> T:
    """Build an options dataclass from a YAML file or a mapping.

    Args:
        cls: A dataclass whose fields are the option names.
        source: A YAML file path, a mapping of field names to values, or None
            (defaults only).
        section: For a file, the top-level key holding this class's options
            (e.g. ``"write"``); a file without it is read whole.
        overrides: Values that win over ``source`` (command-line flags); a
            None value means "not given" and is ignored.
        override_names: How to name an override key in messages (e.g.
            ``{"max_bytes": "--max-bytes"}``); the field name by default.

    Returns:
        An instance of ``cls``.

    Raises:
        UsageError: An unknown key (named with the file), a value of the wrong
            kind, or one the class itself refuses; the message names the
            file or ``command line`` and the key.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    hints = _type_hints(cls)

    if source is None:
        where, raw = "defaults", {}
    elif isinstance(source, Mapping):
        where, raw = "options", dict(source)
    else:
        where, raw = os.fspath(source), read_config(source, section=section)

    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    # A key spelled as its command-line flag (field, key, connect-timeout) is the usual slip.
    flags = {flag.lstrip("-"): name for name, flag in (override_names or {}).items()}
    _refuse_unknown(raw, names, where, {**flags, **{k.replace("-", "_"): v for k, v in flags.items()}})
    for key, value in raw.items():
        values[key] = _convert(value, hints.get(key, Any), key, f"{where}: {key}")
        origins[key] = f"{where}: {key}"
    labels = dict(override_names or {})
    for key, value in (overrides or {}).items():
        if key not in names:
            raise UsageError(f"{COMMAND_LINE}: unknown option {key!r}")
        if value is None:
            continue
        label = f"{labels.get(key, key)}"
        values[key] = _convert(value, hints.get(key, Any), key, label)
        origins[key] = label
    try:
        return cls(**values)
    except UsageError as exc:
        culprit = next((origins[k] for k in values if k in str(exc)), where)
        raise UsageError(f"{culprit}: {exc}") from exc
    except TypeError as exc:
        raise UsageError(f"{where}: {exc}") from exc


def _convert(value: Any, annotation: Any, name: str, label: str) -> Any:
    """Convert one value to its field's type; ``label`` says where it came from."""
    allowed, literals, optional = _unwrap(annotation)
    if value is None:
        if optional or not (allowed or literals):
            return None
        raise UsageError(f"{label}: a value is required, got null")
    if any(value == literal and type(value) is type(literal) for literal in literals):
        return value
    nested = [t for t in allowed if dataclasses.is_dataclass(t)]
    if nested and isinstance(value, Mapping):
        return _load_nested(nested[0], value, label)
    if name.endswith("_bytes") and int in allowed:
        return _to_size(value, label)
    if bool in allowed:
        return _to_bool(value, label)
    if int in allowed:
        return _to_int(value, label)
    if float in allowed:
        return _to_float(value, label)
    if str in allowed:
        if isinstance(value, (dict, list, bool)):
            raise UsageError(f"{label}: expected text, got {value!r}")
        return str(value)
    if literals and not allowed:
        choices = ", ".join(repr(v) for v in literals)
        raise UsageError(f"{label}: must be one of {choices}, got {value!r}")
    if tuple in allowed and isinstance(value, list):
        return tuple(value)
    return value


def _refuse_unknown(raw: Mapping[str, Any], names: set[str], where: str, aliases: Mapping[str, str] | None = None) -> None:
    """Refuse keys of ``raw`` that are not in ``names``, naming for each the
    option it stands for in ``aliases`` (flag spellings) or else the nearest
    name, and the whole list."""
    unknown = sorted(str(k) for k in raw if k not in names)
    if not unknown:
        return
    guesses = []
    for key in unknown:
        near = [aliases[key]] if aliases and key in aliases else difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        guesses.append(f"{key} (did you mean {near[0]}?)" if near else key)
    raise UsageError(f"{where}: unknown option(s) {', '.join(guesses)}; known: {', '.join(sorted(names))}")


def _load_nested(cls: type, raw: Mapping[str, Any], label: str) -> Any:
    """A dataclass-typed field given as a mapping (``source: {cache_dir: ...}``)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    _refuse_unknown(raw, names, label)
    hints = _type_hints(cls)
    values = {k: _convert(v, hints.get(k, Any), k, f"{label}.{k}") for k, v in raw.items()}
    try:
        return cls(**values)
    except UsageError as exc:
        raise UsageError(f"{label}: {exc}") from exc


def _type_hints(cls: type) -> dict[str, Any]:
    """Field types of ``cls``; a field whose annotation cannot be resolved
    (a class defined inside a function) takes values unconverted."""
    try:
        return typing.get_type_hints(cls)
    except NameError:
        return {}


def _unwrap(annotation: Any) -> tuple[tuple[type, ...], tuple[Any, ...], bool]:
    """The plain types and literal values an annotation allows, and whether it allows None."""
    if annotation is Any:
        return (), (), True
    pending = [annotation]
    plain: list[type] = []
    literals: list[Any] = []
    optional = False
    while pending:
        member = pending.pop(0)
        origin = typing.get_origin(member)
        if origin is typing.Union or origin is types.UnionType:
            pending.extend(typing.get_args(member))
        elif origin is typing.Literal:
            literals.extend(typing.get_args(member))
        elif member is type(None):
            optional = True
        elif isinstance(origin or member, type):
            plain.append(origin or member)
    return tuple(plain), tuple(literals), optional


def _to_size(value: Any, label: str) -> int:
    if isinstance(value, bool):
        raise UsageError(f"{label}: must be a size, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise UsageError(f"{label}: must be positive, got {value}")
        return value
    try:
        return parse_size(str(value))
    except UsageError as exc:
        raise UsageError(f"{label}: {exc}") from None


def _to_int(value: Any, label: str) -> int:
    if isinstance(value, bool):
        raise UsageError(f"{label}: must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    body = text[1:] if text[:1] in "+-" else text
    if not body.isdigit():
        raise UsageError(f"{label}: must be an integer, got {value!r}")
    return int(text)


def _to_float(value: Any, label: str) -> float:
    if isinstance(value, bool):
        raise UsageError(f"{label}: must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{label}: must be a number, got {value!r}") from None


_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def _to_bool(value: Any, label: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise UsageError(f"{label}: must be true or false, got {value!r}")
