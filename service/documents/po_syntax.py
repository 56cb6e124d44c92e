"""The PO file syntax, line by line: entries with the lines they span, and PO string escapes.

A hand-written reader rather than a library's, because the writer splices: it replaces the lines
of the entries it changed and copies every other line as it came (wrapping, comments, line
endings, odd spacing), so each entry must know exactly which lines it spans.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from service.documents.base import DocumentError

_KEYWORD = re.compile(r'(msgctxt|msgid_plural|msgid|msgstr(?:\[(\d{1,3})\])?)\s*("(?:[^"\\]|\\.)*")\s*$')
_STRING = re.compile(r'("(?:[^"\\]|\\.)*")\s*$')
_UNESCAPE = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_ESCAPE = {v: "\\" + k for k, v in _UNESCAPE.items()}
_ESCAPED = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)


@dataclass
class Entry:
    """One message: its fields and the lines (0-based, end exclusive) it spans in the file."""

    start: int
    end: int = 0
    obsolete: bool = False
    flags: list[str] = field(default_factory=list)
    flags_line: int | None = None  # the `#,` line
    keys_line: int | None = None  # first `#|` or keyword line: where a new `#,` line goes
    msgctxt: str | None = None
    msgid: str | None = None
    msgid_plural: str | None = None
    msgstr: dict[int, str] = field(default_factory=dict)
    msgstr_line: int | None = None  # first msgstr line: the rest of the entry is its strings

    @property
    def is_header(self) -> bool:
        return self.msgid == "" and self.msgctxt is None and not self.obsolete

    @property
    def untranslated(self) -> bool:
        return not any(self.msgstr.values())


def unescape(quoted: str, line: int) -> str:
    """A PO string's text (`quoted` with its quotes); an unknown escape is a `DocumentError`."""

    def one(m: re.Match[str]) -> str:
        octal, hexa, char = m.groups()
        if octal is not None:
            return chr(int(octal, 8))
        if hexa is not None:
            return chr(int(hexa, 16))
        if char in _UNESCAPE:
            return _UNESCAPE[char]
        raise DocumentError(f"unknown escape sequence \\{char}", line)

    return _ESCAPED.sub(one, quoted[1:-1])


def escape(text: str) -> str:
    return '"' + "".join(_ESCAPE.get(c, c) for c in text) + '"'


def split_lines(text: str) -> list[str]:
    """Lines with their endings, as gettext reads them: only "\n" ends one ("\r\n" too, its "\r"
    kept), unlike `str.splitlines`, which also breaks at U+0085 (a byte of "х" and "ą" read as
    Latin-1), form feeds and U+2028."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def string_lines(keyword: str, text: str, newline: str, prefix: str = "") -> list[str]:
    """`keyword "text"`, or as gettext writes a message with inner newlines: `keyword ""` and one
    line per newline-ended piece."""
    if "\n" not in text[:-1]:
        return [f"{prefix}{keyword} {escape(text)}{newline}"]
    pieces = split_lines(text)
    return [f'{prefix}{keyword} ""{newline}', *(f"{prefix}{escape(p)}{newline}" for p in pieces)]


class _Reader:
    """Reads lines into entries; `field` is the string a continuation line extends."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.entry: Entry | None = None
        self.field: tuple[str, int] | None = None

    def close(self, last: int) -> None:
        entry, self.entry, self.field = self.entry, None, None
        if entry is None or entry.msgid is None:  # comments alone: not a message, left as they are
            return
        if not entry.msgstr:
            raise DocumentError("a msgid without a msgstr", entry.start + 1)
        entry.end = last
        self.entries.append(entry)

    def open(self, i: int) -> Entry:
        if self.entry is not None and self.entry.msgstr:  # a new message starts right after the last
            self.close(i)
        if self.entry is None:
            self.entry = Entry(start=i)
        return self.entry

    def comment(self, i: int, text: str) -> None:
        if text.startswith("#~") and not text.startswith("#~|"):
            rest = text[2:].strip()
            if rest:
                self.keyword(i, rest, obsolete=True)
            return
        entry = self.open(i)
        self.field = None
        if text.startswith("#,"):
            entry.flags += [f.strip() for f in text[2:].split(",") if f.strip()]
            entry.flags_line = i
        elif text.startswith(("#|", "#~|")) and entry.keys_line is None:
            entry.keys_line = i

    def keyword(self, i: int, text: str, obsolete: bool = False) -> None:
        m = _KEYWORD.match(text)
        if m is None:
            s = _STRING.match(text)
            if s is None or self.field is None:
                raise DocumentError("not a PO keyword, string or comment", i + 1)
            self._mixing(i, obsolete)
            self._extend(unescape(s[1], i + 1))
            return
        key, index, quoted = m.groups()
        entry = self.open(i) if key in ("msgctxt", "msgid") else self.entry
        if entry is None:
            raise DocumentError(f"{key} before any msgid", i + 1)
        if entry.msgid is None and entry.msgctxt is None:
            entry.obsolete = obsolete
        self._mixing(i, obsolete)
        if entry.keys_line is None:
            entry.keys_line = i
        value = unescape(quoted, i + 1)
        if key == "msgctxt" and entry.msgid is None and entry.msgctxt is None:
            entry.msgctxt, self.field = value, ("msgctxt", 0)
        elif key == "msgid" and entry.msgid is None:
            entry.msgid, self.field = value, ("msgid", 0)
        elif key == "msgid_plural" and entry.msgid is not None and entry.msgid_plural is None and not entry.msgstr:
            entry.msgid_plural, self.field = value, ("msgid_plural", 0)
        elif key.startswith("msgstr") and entry.msgid is not None:
            n = int(index) if index is not None else 0
            if n in entry.msgstr or (index is None) != (entry.msgid_plural is None) or n != len(entry.msgstr):
                raise DocumentError(f"{key} out of place", i + 1)
            if entry.msgstr_line is None:
                entry.msgstr_line = i
            entry.msgstr[n], self.field = value, ("msgstr", n)
        else:
            raise DocumentError(f"{key} out of place", i + 1)

    def _mixing(self, i: int, obsolete: bool) -> None:
        if self.entry is not None and self.entry.obsolete != obsolete:
            raise DocumentError("an entry mixes obsolete (#~) and active lines", i + 1)

    def _extend(self, value: str) -> None:
        assert self.entry is not None and self.field is not None
        name, n = self.field
        if name == "msgstr":
            self.entry.msgstr[n] += value
        else:
            setattr(self.entry, name, (getattr(self.entry, name) or "") + value)


def read(lines: list[str]) -> list[Entry]:
    """The messages of a PO file's lines (decoded, line endings kept); a `DocumentError` names the
    first line that is not PO."""
    reader = _Reader()
    for i, line in enumerate(lines):
        text = line.strip()
        if not text:
            reader.close(i)
        elif text.startswith("#"):
            reader.comment(i, text)
        else:
            reader.keyword(i, text)
    reader.close(len(lines))
    return reader.entries
