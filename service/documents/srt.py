"""SubRip: cue numbers, timings and blank lines kept as written, each text line a segment, so a
cue keeps its line count (players break lines where the file does). Tags such as <i> stay in the
segment: the translation task protects markup."""

from __future__ import annotations

import re

from service.documents.base import DocumentError, Format
from service.documents.template import Builder, Template
from service.documents.textfile import decode, lines, split_bom

_TIME = r"\d+:\d{2}:\d{2}[,.]\d{1,3}"
_TIMING = re.compile(rf"\s*{_TIME}\s*-->\s*{_TIME}(\s.*)?")  # position hints (X1:... ) may follow


class SrtFormat:
    name: str = "srt"
    extensions: tuple[str, ...] = (".srt",)
    media_type: str = "application/x-subrip; charset=utf-8"

    def parse(self, data: bytes) -> Template:
        bom, text = split_bom(decode(data))
        out = Builder()
        out.raw(bom)
        expect = "number"  # then "timing", then "text" until a blank line
        numbered = list(enumerate(lines(text), start=1))
        for number, (body, ending) in numbered:
            blank = not body.strip()
            if expect == "number" and not blank and not body.strip().isdigit():
                raise DocumentError(f"expected a cue number, found {body.strip()[:40]!r}", number)
            if expect == "timing" and not _TIMING.fullmatch(body):
                raise DocumentError(
                    f"expected a cue timing 'hh:mm:ss,mmm --> hh:mm:ss,mmm', found {body[:40]!r}", number
                )
            if expect == "text" and not blank:
                out.hole(body)
            else:
                out.raw(body)
            out.raw(ending)
            if expect == "text" and blank:
                out.end_unit()
            expect = _next(expect, blank)
        if expect == "timing":
            raise DocumentError("a cue number without a timing", numbered[-1][0])
        if expect == "text":
            out.end_unit()
        return out.build()


def _next(expect: str, blank: bool) -> str:
    if expect == "number":
        return "number" if blank else "timing"
    if expect == "timing":
        return "text"
    return "number" if blank else "text"


FORMAT: Format = SrtFormat()  # typed so mypy checks the class against the protocol
