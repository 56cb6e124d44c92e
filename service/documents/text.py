"""Plain text: every non-blank line is a segment, everything else (blank lines, indentation,
line endings) is kept as written; the translator works line by line anyway."""

from __future__ import annotations

from service.documents.base import Format
from service.documents.template import Builder, Template
from service.documents.textfile import decode, lines, split_bom


class TextFormat:
    name: str = "text"
    extensions: tuple[str, ...] = (".txt",)
    media_type: str = "text/plain; charset=utf-8"

    def parse(self, data: bytes) -> Template:
        bom, text = split_bom(decode(data))
        out = Builder()
        out.raw(bom)
        for body, ending in lines(text):
            out.hole(body)
            out.raw(ending)
            if body.strip():
                out.end_unit()
        return out.build()


FORMAT: Format = TextFormat()  # typed so mypy checks the class against the protocol
