"""Every document format, found by a file name's extension (case-insensitive).

The one place a format is registered: add its module's format object to `FORMATS`.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from service.documents import html, markdown, srt, text
from service.documents.base import DocumentError, Format
from service.documents.po import PoFormat

FORMATS: tuple[Format, ...] = (PoFormat(), text.FORMAT, srt.FORMAT, html.FORMAT, markdown.FORMAT)


def extensions() -> list[str]:
    """Every extension a format reads, as LibreTranslate lists them (".po")."""
    return [ext for f in FORMATS for ext in f.extensions]


def find(filename: str, retranslate_fuzzy: bool = False) -> Format:
    """The format of `filename`; a `DocumentError` for an extension no format reads.
    `retranslate_fuzzy` asks a catalog format to translate its fuzzy entries again."""
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    for f in FORMATS:
        if suffix in f.extensions:
            if retranslate_fuzzy and isinstance(f, PoFormat):
                return PoFormat(retranslate_fuzzy=True)
            return f
    raise DocumentError(f"unsupported file type {suffix or '(none)'}: use one of {', '.join(extensions())}")
