"""Gettext catalogs (.po, .pot): the untranslated messages out, their translations spliced back.

The rules (docs/documents.md): only untranslated entries are translated (fuzzy ones too on
request); translated, fuzzy and obsolete entries are never touched; a new translation is marked
`fuzzy` with a translator comment naming the model, so a person reviews it; every plural form is
filled; a translation that loses a format placeholder or the accelerator mark, or that the
file's charset cannot hold, is left empty and counted as failed. The header's template fields
are filled in. Everything else comes back byte for byte: the writer replaces only the lines of
the entries it changed, in the file's own line ending, charset and byte order mark.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.contract import accelerators
from service.documents import placeholders, po_syntax
from service.documents.base import DocumentError, Rendered, RenderInfo
from service.documents.message import Message, split
from service.documents.po_syntax import Entry

BOM = b"\xef\xbb\xbf"
_CHARSET = re.compile(r"charset=([^\s;\\]+)")
PLURAL_FORMS = {"de": "nplurals=2; plural=(n != 1);"}  # what a template's Plural-Forms becomes
TEMPLATE = re.compile(r"^(?:|CHARSET|.*\b(?:INTEGER|EXPRESSION|YEAR-MO-DA)\b.*)$")


_PROBE = 'msgid "a\\b" # x\n'  # PO syntax: what an ASCII-compatible charset must write as ASCII does


def _codec(name: str, line: int | None) -> str:
    """Python's codec for a declared charset (`CHARSET`, a template's, is UTF-8). Only an
    ASCII-compatible text encoding reads PO syntax (as gettext requires): not UTF-16 or UTF-7,
    nor Python's other codecs (rot13, zlib, idna, ...)."""
    if name.upper() == "CHARSET":
        return "utf-8"
    try:
        codec = codecs.lookup(name).name
        ascii_like = _PROBE.encode(codec) == _PROBE.encode("ascii") and _PROBE.encode("ascii").decode(codec) == _PROBE
        if not ascii_like or codec == "idna":  # idna writes host names, one label at a time
            raise ValueError(codec)
    except (LookupError, UnicodeError, ValueError):  # ValueError: also a NUL in the name
        raise DocumentError("the header's charset is unknown or not ASCII-compatible", line) from None
    return codec


def _decode(data: bytes) -> tuple[str, str, bool]:
    """The text, the codec it is in and whether it began with a UTF-8 byte order mark. The
    header is read first as Latin-1 (the PO syntax is ASCII) to learn the charset."""
    bom = data.startswith(BOM)
    body = data[len(BOM) :] if bom else data
    codec = "utf-8"
    header = next((e for e in po_syntax.read(po_syntax.split_lines(body.decode("latin-1"))) if e.is_header), None)
    if header is not None:
        found = _CHARSET.search(header.msgstr.get(0, ""))
        if found:
            codec = _codec(found[1], header.start + 1)
    if bom and codec != "utf-8":
        raise DocumentError(f"a UTF-8 byte order mark, but the header declares {codec}", 1)
    try:
        return body.decode(codec), codec, bom
    except UnicodeDecodeError as exc:
        line = body[: exc.start].count(b"\n") + 1
        raise DocumentError(f"bytes that are not {codec}, as the header declares", line) from None
    except UnicodeError:  # a codec that fails without saying where
        raise DocumentError(f"bytes that are not {codec}, as the header declares") from None


@dataclass
class _Todo:
    entry: Entry
    messages: list[Message]  # msgid, and msgid_plural when there is one


@dataclass
class ParsedPo:
    lines: list[str]
    entries: list[Entry]
    codec: str
    bom: bool
    mark: str | None  # the catalog's accelerator mark
    todo: list[_Todo] = field(default_factory=list)

    @property
    def segments(self) -> list[str]:
        return [s for t in self.todo for m in t.messages for s in m.segments]

    @property
    def newline(self) -> str:
        first = self.lines[0] if self.lines else "\n"
        return "\r\n" if first.endswith("\r\n") else "\n"

    def render(self, translations: Sequence[str], info: RenderInfo) -> Rendered:
        header = next((e for e in self.entries if e.is_header), None)
        nplurals = _nplurals(header, info.target_lang)
        comment = f"# Machine translation ({info.model} version {info.version}): please review"
        spliced: dict[int, tuple[int, list[str]]] = {}
        done = failed = 0
        it = iter(translations)
        for t in self.todo:
            pieces = [[next(it) for _ in m.segments] for m in t.messages]
            texts = [m.join(p) for m, p in zip(t.messages, pieces, strict=True)]
            if not all(p.strip() for ps in pieces for p in ps) or not self._keeps(t, texts):
                failed += 1
                continue
            forms = texts[:1] if t.entry.msgid_plural is None else [texts[0]] + [texts[1]] * (nplurals - 1)
            spliced[t.entry.start] = (t.entry.end, self._entry_lines(t.entry, forms, comment))
            done += 1
        if header is not None:
            new = _header(header.msgstr[0], info, translated=done > 0)
            if new != header.msgstr[0]:
                assert header.msgstr_line is not None
                lines = self.lines[header.start : header.msgstr_line]
                spliced[header.start] = (header.end, lines + po_syntax.string_lines("msgstr", new, self.newline))
        out, i = [], 0
        while i < len(self.lines):
            if i in spliced:
                i, lines = spliced[i]
                out += lines
            else:
                out.append(self.lines[i])
                i += 1
        data = (BOM if self.bom else b"") + "".join(out).encode(self.codec)
        kept = sum(not e.is_header for e in self.entries) - done - failed
        return Rendered(data, done, kept, failed)

    def _keeps(self, t: _Todo, texts: list[str]) -> bool:
        """Each translation has the source's placeholders and accelerator marks, and fits the
        file's charset."""
        kinds = placeholders.formats(t.entry.flags)
        for m, text in zip(t.messages, texts, strict=True):
            source = t.entry.msgid if m is t.messages[0] else t.entry.msgid_plural
            assert source is not None
            if not placeholders.kept(source, text, kinds):
                return False
            if self.mark is not None and accelerators.count(text, self.mark) != accelerators.count(source, self.mark):
                return False
            try:
                text.encode(self.codec)
            except UnicodeEncodeError:
                return False
        return True

    def _entry_lines(self, entry: Entry, forms: list[str], comment: str) -> list[str]:
        """The entry's lines with the translator comment, the fuzzy flag and the new msgstr lines."""
        assert entry.msgstr_line is not None and entry.keys_line is not None
        nl = self.newline
        head = self.lines[entry.start : entry.msgstr_line]
        keys = entry.keys_line - entry.start
        if entry.flags_line is not None:
            if "fuzzy" not in entry.flags:
                head[entry.flags_line - entry.start] = "#, " + ", ".join(["fuzzy", *entry.flags]) + nl
        else:
            head.insert(keys, "#, fuzzy" + nl)
        if not any(line.rstrip("\r\n") == comment for line in head):
            at = 0
            while at < len(head) and (head[at].rstrip("\r\n") == "#" or head[at].startswith("# ")):
                at += 1
            head.insert(at, comment + nl)
        if entry.msgid_plural is None:
            return head + po_syntax.string_lines("msgstr", forms[0], nl)
        return head + [
            line for n, text in enumerate(forms) for line in po_syntax.string_lines(f"msgstr[{n}]", text, nl)
        ]


MAX_PLURALS = 100  # plural forms a header may declare (languages have at most 6)


def _nplurals(header: Entry | None, language: str) -> int:
    declared = _declared_plurals(header)
    if declared:
        return declared
    fallback = re.search(r"nplurals=(\d+)", PLURAL_FORMS.get(language, "nplurals=2"))
    assert fallback is not None
    return int(fallback[1])


def _declared_plurals(header: Entry | None) -> int | None:
    """The header's nplurals; a DocumentError above MAX_PLURALS, which would make every plural
    entry's answer that many strings long."""
    found = re.search(r"^Plural-Forms:.*?nplurals\s*=\s*(\d+)", header.msgstr[0] if header else "", re.M)
    if found is None:
        return None
    digits = found[1].lstrip("0") or "0"
    if len(digits) > 3 or int(digits) > MAX_PLURALS:
        line = header.start + 1 if header is not None else None
        raise DocumentError(f"Plural-Forms declares more than {MAX_PLURALS} plural forms", line)
    return int(digits)


def _header(text: str, info: RenderInfo, translated: bool) -> str:
    """The header with its template fields filled in (`Language`, `Plural-Forms`, the charset),
    and `PO-Revision-Date` and `X-Generator` set when entries were translated. `Last-Translator`
    stays: the machine is not a translator."""
    fields = [line.split(":", 1) if ":" in line else [line] for line in text.split("\n")]
    values = {f[0].strip(): f[1].strip() for f in fields if len(f) == 2}
    wanted: dict[str, str] = {}
    if not values.get("Language"):
        wanted["Language"] = info.target_lang
    plural = PLURAL_FORMS.get(info.target_lang)
    if plural and ("Plural-Forms" not in values or TEMPLATE.match(values["Plural-Forms"])):
        wanted["Plural-Forms"] = plural
    content = values.get("Content-Type", "")
    if "charset=CHARSET" in content:
        wanted["Content-Type"] = content.replace("charset=CHARSET", "charset=UTF-8")
    if translated:
        wanted |= {"PO-Revision-Date": info.now, "X-Generator": info.generator}
    if not any(values.get(k) != v for k, v in wanted.items()):
        return text
    out = []
    for f in fields:
        key = f[0].strip()
        out.append(f"{f[0]}: {wanted.pop(key)}" if len(f) == 2 and key in wanted else ":".join(f))
    tail = out.pop() if out and out[-1] == "" else None
    out += [f"{k}: {v}" for k, v in wanted.items()]
    return "\n".join(out) + ("\n" if tail is not None else "")


class PoFormat:
    """`retranslate_fuzzy`: fuzzy entries are translated again too (they stay fuzzy)."""

    name = "po"
    extensions: tuple[str, ...] = (".po", ".pot")
    media_type = "text/x-gettext-translation"  # the charset is the one the file's header declares

    def __init__(self, retranslate_fuzzy: bool = False) -> None:
        self.retranslate_fuzzy = retranslate_fuzzy

    def parse(self, data: bytes) -> ParsedPo:
        text, codec, bom = _decode(data)
        lines = po_syntax.split_lines(text)
        entries = po_syntax.read(lines)
        _declared_plurals(next((e for e in entries if e.is_header), None))  # refused now, not after translating
        active = [e for e in entries if not e.obsolete and not e.is_header]
        ids = [x for e in active for x in (e.msgid, e.msgid_plural) if x]
        mark = accelerators.convention(ids)
        out = ParsedPo(lines, entries, "utf-8" if codec == "utf-8" else codec, bom, mark)
        for e in active:
            fuzzy = "fuzzy" in e.flags
            if (e.untranslated and not fuzzy) or (fuzzy and self.retranslate_fuzzy):
                sources = [e.msgid or "", *([e.msgid_plural] if e.msgid_plural is not None else [])]
                out.todo.append(_Todo(e, [split(s, mark) for s in sources]))
        return out
