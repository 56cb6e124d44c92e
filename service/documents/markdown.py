"""Markdown: the text runs of headings, paragraphs, list items, quotes, table cells and link and
image texts are segments, cut from the source line by line; everything else (markers, code,
link targets, HTML, front matter) is copied as written.

markdown-it-py finds the runs; its inline tokens carry no offsets, so each run is found in the
source after the previous one, skipping what the token before it covered (code spans, inline
HTML, link targets). A run never crosses a line or a markup character, so emphasis inside a
sentence splits it (``a *b* c`` gives "a", "b", "c"), runs without a letter (``.``, ``1``) stay
as written, and escapes and entities reach the
translator as written (``\\*``, ``&amp;``).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.helpers import parseLinkDestination, parseLinkTitle
from markdown_it.token import Token

from service.documents.base import Format
from service.documents.template import Builder, Template
from service.documents.textfile import decode, split_bom

# text_join off: escapes and entities stay tokens of their own, so every text token is raw source
_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"]).disable("text_join")
_KEPT_BLOCKS = {"fence", "code_block", "html_block"}
_PIPE = re.compile(r"(?<!\\)\|")  # a cell border; "\|" is a pipe in a cell's text
_FRONT_MATTER = {"---": ("---", "..."), "+++": ("+++",)}

Span = tuple[int, int]


class MarkdownFormat:
    name: str = "markdown"
    extensions: tuple[str, ...] = (".md", ".markdown")
    media_type: str = "text/markdown; charset=utf-8"

    def parse(self, data: bytes) -> Template:
        bom, text = split_bom(decode(data))
        src = text.replace("\r\n", "\n")  # what markdown-it sees; spans are mapped back below
        crlf = [m.start() - n for n, m in enumerate(re.finditer("\r\n", text))]  # their "\n" in src
        lines = src.split("\n")
        matter = _front_matter(lines)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)
        tokens = _PARSER.parse("\n" * matter + "\n".join(lines[matter:]))
        units: list[list[Span]] = [[] for _ in range(bool(matter))]
        cursor = 0
        for i, token in enumerate(tokens):
            if token.type in _KEPT_BLOCKS:
                units.append([])
            elif token.type == "inline" and token.map:
                limit = len(src)
                if tokens[i - 1].type in ("th_open", "td_open"):
                    cursor, limit = _cell(src, starts[token.map[0]], cursor, tokens[i - 2].type == "tr_open")
                else:
                    cursor = _inline_start(src, starts, token, cursor)
                spans: list[Span] = []
                cursor = _runs(src, token.children or [], cursor, limit, spans)
                units.append([(a, b) for a, b in _merge(spans) if any(c.isalpha() for c in src[a:b])])
        return _template(bom, text, units, crlf)


def _front_matter(lines: list[str]) -> int:
    """How many lines the front matter takes (0 without one): they are kept and not parsed."""
    closers = _FRONT_MATTER.get(lines[0].rstrip(), ())
    for j in range(1, len(lines) if closers else 0):
        if lines[j].rstrip() in closers:
            return j + 1
    return 0


def _inline_start(src: str, starts: list[int], token: Token, cursor: int) -> int:
    """Where a block's text begins: after the block's markers (``#``, ``-``, ``1.``, ``>``) on its
    first line, found as the line's last copy of the text's first line."""
    assert token.map is not None
    line_start = starts[token.map[0]]
    first = token.content.split("\n", 1)[0]
    found = src.rfind(first, line_start, starts[token.map[0] + 1] - 1)
    return max(cursor, line_start if found < 0 else found)


def _cell(src: str, line_start: int, cursor: int, first: bool) -> tuple[int, int]:
    """(start, end) of a table cell: between its pipes (the row's first may have none), so a
    cell's text is never looked for in its neighbour."""
    if first:
        start = line_start + len(src[line_start:]) - len(src[line_start:].lstrip(" \t"))
        start += src.startswith("|", start)
    else:  # pipes are looked for on the row's line only: linear in the table, however many rows lack them
        pipe = _PIPE.search(src, cursor, _line_end(src, cursor))
        start = pipe.end() if pipe else cursor
    line_end = _line_end(src, start)
    end = _PIPE.search(src, start, line_end)
    return start, end.start() if end else line_end


def _line_end(src: str, at: int) -> int:
    end = src.find("\n", at)
    return len(src) if end < 0 else end  # the last line ends with src


def _runs(src: str, children: Sequence[Token], cursor: int, limit: int, spans: list[Span]) -> int:
    """Appends the source spans of the text tokens before `limit` to `spans`; returns the cursor
    after them."""
    autolink = False
    for child in children:
        kind = child.type
        if kind in ("text", "text_special") and not autolink:
            raw = child.markup if kind == "text_special" else child.content
            at = src.find(raw, cursor)
            if 0 <= at <= limit - len(raw) and "\n" not in src[cursor:at]:  # a run never leaves its line
                spans.append((at, at + len(raw)))
                cursor = at + len(raw)
        elif kind in ("softbreak", "hardbreak"):
            cursor = src.find("\n", cursor) + 1 or cursor
        elif kind == "code_inline":
            cursor = _after_code(src, cursor, child.markup)
        elif kind == "html_inline":
            at = src.find(child.content, cursor)
            cursor = cursor if at < 0 else at + len(child.content)
        elif kind == "link_open":
            autolink = child.markup == "autolink"
        elif kind == "link_close":
            cursor = _after_autolink(src, cursor) if autolink else _after_link(src, cursor)
            autolink = False
        elif kind == "image":
            at = src.find("![", cursor)
            cursor = _runs(src, child.children or [], cursor if at < 0 else at + 2, limit, spans)
            cursor = _after_link(src, cursor)
    return cursor


def _after_code(src: str, cursor: int, ticks: str) -> int:
    start = src.find(ticks, cursor)
    if start < 0:
        return cursor
    end = re.compile(rf"(?<!`){ticks}(?!`)").search(src, start + len(ticks))
    return end.end() if end else start + len(ticks)


def _after_autolink(src: str, cursor: int) -> int:
    """Past ``<url>``: its text is the target, never a segment."""
    return src.find(">", cursor) + 1 or cursor


def _after_link(src: str, cursor: int) -> int:
    """Past a link's or image's target: ``](url "title")``, ``][ref]``, or the ``]`` alone."""
    close = src.find("]", cursor)
    if close < 0:
        return cursor
    at = close + 1
    if src.startswith("[", at):
        end = src.find("]", at)
        return at if end < 0 else end + 1
    if not src.startswith("(", at):
        return at
    at = _skip_space(src, at + 1)
    target = parseLinkDestination(src, at, len(src))
    if target.ok:
        at = _skip_space(src, target.pos)
        title = parseLinkTitle(src, at, len(src))
        at = _skip_space(src, title.pos) if title.ok else at
    return at + 1 if src.startswith(")", at) else close + 1


def _skip_space(src: str, at: int) -> int:
    while at < len(src) and src[at] in " \t\n":
        at += 1
    return at


def _merge(spans: list[Span]) -> list[Span]:
    """Touching spans (text, an escape, more text) are one run: a segment is never cut mid-word."""
    merged: list[Span] = []
    for start, end in spans:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _template(bom: str, text: str, units: list[list[Span]], crlf: list[int]) -> Template:
    """The source with a hole per run; `crlf` lists the "\\n" of `src` that were "\\r\\n", so an
    offset of `src` moves by the carriage returns before it."""
    out = Builder()
    out.raw(bom)
    done = 0
    for spans in units:
        for start, end in spans:
            start, end = start + bisect_left(crlf, start), end + bisect_left(crlf, end)
            out.raw(text[done:start])
            out.hole(text[start:end])
            done = end
        out.end_unit()
    out.raw(text[done:])
    return out.build()


FORMAT: Format = MarkdownFormat()  # typed so mypy checks the class against the protocol
