"""Manners of the downloader: who it says it is, whose opt-out it respects,
and how many requests it sends to one host at once."""

from __future__ import annotations

import threading
from collections.abc import Iterable

#: ``X-Robots-Tag`` directives that keep an answer out of a dataset.
OPT_OUT_DIRECTIVES = frozenset({"noai", "noimageai"})

#: ``X-Robots-Tag`` directives written ``NAME: VALUE`` (not agent names).
_DIRECTIVES_WITH_VALUES = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})

#: The agent name an ``X-Robots-Tag: NAME: directive`` must give to be meant for us.
AGENT_NAME = "shardkit"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("shardkit")
    except Exception:  # not installed (a source checkout on PYTHONPATH)
        return "0"


def default_user_agent(contact: str | None = None) -> str:
    """``shardkit/VERSION``, with ``(+CONTACT)`` when a contact (a URL or an
    address site owners can write to) is given."""
    agent = f"{AGENT_NAME}/{_version()}"
    return f"{agent} (+{contact})" if contact else agent


def opted_out(values: Iterable[str]) -> bool:
    """Whether ``X-Robots-Tag`` header values forbid use for AI training.

    Each value is a comma-separated list of directives, optionally led by
    ``AGENT:``; directives for other agents than ``shardkit`` are ignored.

    >>> opted_out(["noindex, noai"]), opted_out(["otherbot: noai"]), opted_out(["shardkit: noimageai"])
    (True, False, True)
    """
    for value in values:
        agent = None  # an "AGENT:" prefix holds for the directives after it in the value
        for part in value.lower().split(","):
            name, colon, rest = (p.strip() for p in part.partition(":"))
            if colon and name and " " not in name and name not in _DIRECTIVES_WITH_VALUES:
                agent, part = name, rest
            if part.strip() in OPT_OUT_DIRECTIVES and agent in (None, AGENT_NAME):
                return True
    return False


class HostSlots:
    """At most ``limit`` holders per host at once; memory only for hosts in use."""

    def __init__(self, limit: int):
        self._limit = limit
        self._active: dict[tuple, int] = {}
        self._changed = threading.Condition()

    def acquire(self, host: tuple, stop: threading.Event) -> bool:
        with self._changed:
            while self._active.get(host, 0) >= self._limit:
                if stop.is_set():
                    return False
                self._changed.wait(0.1)
            self._active[host] = self._active.get(host, 0) + 1
            return True

    def release(self, host: tuple) -> None:
        with self._changed:
            left = self._active[host] - 1
            if left:
                self._active[host] = left
            else:
                del self._active[host]
            self._changed.notify_all()


__all__ = ["AGENT_NAME", "HostSlots", "OPT_OUT_DIRECTIVES", "default_user_agent", "opted_out"]
