"""The page: sample cards and the statistics in one self-contained HTML file.

The page fetches nothing. Thumbnails and players are ``data:`` URIs, plots
inline SVG, the style one inline ``<style>``; there is no script. A
Content-Security-Policy ``<meta>`` says so to the browser as well
(:data:`CONTENT_SECURITY_POLICY`: images and media from ``data:`` only,
inline style, nothing else), so that even markup that slipped through
could load nothing and run nothing. JSON collapses with ``<details>``.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardkit.preview.draw import DrawnSample
from shardkit.preview.fields import FieldContext, kind_of, placeholder, render_field, text

#: The page's policy: nothing from the network, no script, no plugin, no form.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src data:; media-src data:; style-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'"
)

#: Every rule under ``.shardkit-preview``, so the same style serves a page and a notebook cell.
STYLE = """
.shardkit-preview { font: 14px/1.4 system-ui, sans-serif; color: #1d1d1f; }
.shardkit-preview h1 { font-size: 20px; margin: 0 0 4px; }
.shardkit-preview h2 { font-size: 17px; margin: 24px 0 8px; }
.shardkit-preview .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(270px, 1fr)); gap: 12px; }
.shardkit-preview .card { border: 1px solid #d0d0d7; border-radius: 6px; padding: 8px; background: #fff;
  overflow: hidden; overflow-wrap: anywhere; }
.shardkit-preview .card.failed { border-color: #c62828; }
.shardkit-preview .where { font: 12px ui-monospace, monospace; color: #555; margin-bottom: 6px; }
.shardkit-preview .key { font-weight: 600; color: #1d1d1f; }
.shardkit-preview .field { margin: 6px 0; }
.shardkit-preview .name { font: 12px ui-monospace, monospace; color: #444; }
.shardkit-preview .size, .shardkit-preview .dims, .shardkit-preview .more { color: #888; font-size: 12px; }
.shardkit-preview img { display: block; max-width: 100%; height: auto; background: #eee; }
.shardkit-preview audio, .shardkit-preview video { width: 100%; }
.shardkit-preview pre { white-space: pre-wrap; margin: 2px 0; font: 12px ui-monospace, monospace;
  background: #f6f6f8; padding: 4px; max-height: 240px; overflow: auto; }
.shardkit-preview .placeholder { background: #fff4e5; border: 1px dashed #e0a040; padding: 6px; font-size: 12px; }
.shardkit-preview .label { font-weight: 600; }
.shardkit-preview .classname { font-weight: 400; color: #555; }
.shardkit-preview .hex, .shardkit-preview .npy { font: 12px ui-monospace, monospace; }
.shardkit-preview table { border-collapse: collapse; margin: 8px 16px 8px 0; display: inline-table; vertical-align: top; }
.shardkit-preview caption { text-align: left; font-weight: 600; padding: 4px 0; }
.shardkit-preview td, .shardkit-preview th { border: 1px solid #ddd; padding: 2px 8px; font-size: 13px;
  text-align: left; max-width: 520px; overflow-wrap: anywhere; }
.shardkit-preview .plots { display: flex; flex-wrap: wrap; gap: 8px; }
.shardkit-preview figure.plot { margin: 0; }
.shardkit-preview figure.plot svg { width: 420px; height: auto; }
.shardkit-preview .note { color: #8a5a00; }
"""


#: The order of a card's fields: what one looks at first, first (a stable sort keeps the rest in member order).
_KIND_ORDER = ("image", "video", "audio", "class", "text", "json", "npy", "bytes")


def render_card(sample: DrawnSample, context: FieldContext) -> str:
    """One sample as an ``<article class="card">``: where it is (key,
    shard, byte offset), then each field; a sample that could not be read,
    a card saying why."""
    where = f"#{sample.number:,} · {text(sample.shard_name)}"
    if sample.error is not None:
        return (
            f'<article class="card failed"><div class="where">{where}</div>'
            f"{placeholder('not read: ' + sample.error)}</article>"
        )
    head = f'<span class="key">{text(sample.key)}</span><br>{where} @ byte {sample.offset:,}'
    ordered = sorted(sample.fields.items(), key=lambda item: _KIND_ORDER.index(kind_of(item[0])))
    fields = "".join(render_field(name, data, context) for name, data in ordered)
    return f'<article class="card"><div class="where">{head}</div>{fields}</article>'


def render_cards(drawn: Sequence[DrawnSample], context: FieldContext) -> str:
    """The cards of ``drawn`` in a grid."""
    return '<div class="cards">' + "".join(render_card(s, context) for s in drawn) + "</div>"


def render_page(*, title: str, summary: str, cards: str, statistics: str, footer: str, next_seed: int | None = None) -> str:
    """The whole page. ``title``, ``summary`` and ``footer`` are plain text
    (escaped here); ``cards`` and ``statistics`` are HTML made by this
    package. ``next_seed``: a page served by ``--serve`` links to the same
    page drawn with that seed (a link to the page itself, made of a number)."""
    more = "" if next_seed is None else f'<p><a href="?seed={int(next_seed)}">next samples (seed {int(next_seed)})</a></p>\n'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{text(title)}</title>\n<style>{STYLE}body {{ margin: 16px; background: #fafafa; }}</style>\n"
        '</head><body><div class="shardkit-preview">\n'
        f"<h1>{text(title)}</h1><p>{text(summary)}</p>\n"
        f"<h2>Samples</h2>\n{cards}\n{more}{statistics}\n"
        f'<p class="size">{text(footer)}</p>\n'
        "</div></body></html>\n"
    )


def render_fragment(*, summary: str, cards: str) -> str:
    """A notebook cell's view: the style, one line of counts and a few cards."""
    return f'<div class="shardkit-preview"><style>{STYLE}</style><p>{text(summary)}</p>{cards}</div>'
