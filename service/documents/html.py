"""HTML: the text nodes of `service.documents.html_text` (the LibreTranslate codec's split) are the
segments; tags, attributes and the contents of script, style, code, pre and textarea are kept.

What `html_text` re-writes (so a file may not come back byte for byte): end tags as ``</tag>``
(``</P >`` becomes ``</p>``), and translated text escaped anew (``&nbsp;`` comes back as the
character, ``>`` as ``&gt;``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.documents import html_text
from service.documents.base import Format, Rendered, RenderInfo
from service.documents.template import choose, count
from service.documents.textfile import decode, split_bom


@dataclass(frozen=True)
class ParsedHtml:
    bom: str
    pieces: list[str]  # markup, text, markup, ..., markup

    @property
    def segments(self) -> Sequence[str]:
        return self.pieces[1::2]

    def render(self, translations: Sequence[str], info: RenderInfo) -> Rendered:
        text = self.bom + html_text.join(self.pieces, choose(self.segments, translations))
        units = [(i,) for i in range(len(self.segments))]
        return Rendered(text.encode("utf-8"), *count(units, self.segments, translations))


class HtmlFormat:
    name: str = "html"
    extensions: tuple[str, ...] = (".html", ".htm")
    media_type: str = "text/html; charset=utf-8"

    def parse(self, data: bytes) -> ParsedHtml:
        bom, text = split_bom(decode(data))
        return ParsedHtml(bom, html_text.split(text))


FORMAT: Format = HtmlFormat()  # typed so mypy checks the class against the protocol
