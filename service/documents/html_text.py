"""HTML as text nodes to translate and the markup around them, kept exactly as written.

`split(html)` returns pieces alternating markup and text: ``[markup, text, markup, text, ...,
markup]`` (markup may be empty); text pieces are unescaped (``&amp;`` -> ``&``), and text that is
only whitespace, or inside <script>, <style>, <code> or <pre>, stays markup. `join(pieces,
translations)` puts the translated texts back, escaped, with the whitespace around them.
"""

from __future__ import annotations

import html
import itertools
import re
from html.parser import HTMLParser

RAW = {"script", "style", "code", "pre", "textarea"}


class _Pieces(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.pieces: list[tuple[bool, str]] = []  # (is text, raw source)
        self.raw_depth = 0

    def _markup(self) -> None:
        self.pieces.append((False, self.get_starttag_text() or ""))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup()
        self.raw_depth += tag in RAW

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup()

    def handle_endtag(self, tag: str) -> None:
        self.pieces.append((False, f"</{tag}>"))  # re-serialised: the parser gives no raw end tag
        self.raw_depth -= tag in RAW and self.raw_depth > 0

    def handle_data(self, data: str) -> None:
        self.pieces.append((self.raw_depth == 0, data))

    def handle_entityref(self, name: str) -> None:
        self.pieces.append((self.raw_depth == 0, f"&{name};"))

    def handle_charref(self, name: str) -> None:
        self.pieces.append((self.raw_depth == 0, f"&#{name};"))

    def handle_comment(self, data: str) -> None:
        self.pieces.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.pieces.append((False, f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.pieces.append((False, f"<?{data}>"))


_END_TAG = re.compile(r"</\s*([A-Za-z][\w:-]*)\s*>")


def split(source: str) -> list[str]:
    parser = _Pieces()
    last = source.rfind(">") + 1
    parser.feed(source[:last])
    # After the last ">" nothing can close (a tag, comment or declaration needs one): it is data,
    # as HTMLParser's close() would read it, but without its scan to the end from every "<"
    # (quadratic: 20,000 unclosed "<a " took 38 s).
    rest, parser.rawdata = parser.rawdata + source[last:], ""
    if rest:
        parser.handle_data(rest)
    parser.close()
    out: list[list[str]] = [[]]  # lists joined once: a string grown piece by piece is quadratic
    for is_text, group in itertools.groupby(parser.pieces, key=lambda p: p[0]):
        raw = "".join(r for _, r in group)  # adjacent text and entity pieces are one text node
        if is_text and raw.strip():
            text = html.unescape(raw)
            lead, trail = raw[: len(raw) - len(raw.lstrip())], raw[len(raw.rstrip()) :]
            out[-1].append(lead)
            out += [[text.strip()], [trail]]
        else:
            out[-1].append(raw)
    return ["".join(parts) for parts in out]


def join(pieces: list[str], translations: list[str]) -> str:
    out = [pieces[0]]
    for translated, markup in zip(translations, pieces[2::2], strict=True):
        out += [html.escape(translated, quote=False), markup]
    return "".join(out)
