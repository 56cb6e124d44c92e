"""UTF-8 files as text and lines, so every format reads bytes, BOMs and line endings alike."""

from __future__ import annotations

from service.documents.base import DocumentError

BOM = "\ufeff"


def decode(data: bytes) -> str:
    """The text with its BOM, if any, still in front (a format writes it back as it found it);
    undecodable bytes name their line, so a user can find them."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DocumentError(f"not UTF-8 (byte {data[err.start]:#04x})", data.count(b"\n", 0, err.start) + 1) from None


def split_bom(text: str) -> tuple[str, str]:
    """(bom, rest): parsers see the text without it, renderers put it back."""
    return (BOM, text[1:]) if text.startswith(BOM) else ("", text)


def lines(text: str) -> list[tuple[str, str]]:
    """(body, ending) per line, ending "\\r\\n", "\\n" or "" (the last line): only "\\n" ends a
    line, unlike `str.splitlines`, so form feeds and U+2028 stay inside a line as written."""
    *ended, last = text.split("\n")
    return [(line[:-1], "\r\n") if line.endswith("\r") else (line, "\n") for line in ended] + [(last, "")]
