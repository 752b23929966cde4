"""Reading a page back as a browser's parser would: its tags, attributes and text."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

#: Attributes that make a browser fetch or navigate.
URL_ATTRIBUTES = frozenset({"src", "href", "xlink:href", "srcset", "poster", "action", "formaction", "data", "background"})


@dataclass
class Parsed:
    tags: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def all(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in a.get("class", "").split())]

    def urls(self) -> list[str]:
        return [value for _, attrs in self.tags for name, value in attrs.items() if name in URL_ATTRIBUTES]

    def event_handlers(self) -> list[str]:
        return [name for _, attrs in self.tags for name in attrs if name.startswith("on")]


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parsed = Parsed()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.parsed.tags.append((tag, {name: value or "" for name, value in attrs}))

    def handle_data(self, data: str) -> None:
        self.parsed.text.append(data)


def parse(page: str) -> Parsed:
    parser = _Parser()
    parser.feed(page)
    parser.close()
    return parser.parsed


def assert_self_contained(page: str) -> Parsed:
    """No script, no event handler, and every URL a data: URI or a fragment."""
    parsed = parse(page)
    assert not parsed.all("script"), "the page has a script element"
    assert not parsed.all("link") and not parsed.all("iframe") and not parsed.all("object")
    assert not parsed.event_handlers(), parsed.event_handlers()
    outside = [url for url in parsed.urls() if not url.startswith(("data:", "#"))]
    assert not outside, f"URLs outside the page: {outside[:5]}"
    assert "@import" not in page and "url(http" not in page
    return parsed
