"""The PO format with a scripted translator: what it translates, what it keeps byte for byte, and
what Debian's gettext says of the result (`msgfmt -c -f`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from service.documents.base import DocumentError, Rendered, RenderInfo
from service.documents.placeholders import formats, placeholders
from service.documents.po import PoFormat
from service.documents.registry import find
from tests.helpers import CATALOG, CATALOGS, entries, lines_outside, msgfmt

DATA = Path(__file__).parent / "data" / "po"

INFO = RenderInfo("tiny-mt", 1, "en", "de", "transformer-serve 0.1.0", "2026-12-01 20:00+0000")


def german(segment: str) -> str:
    """A stand-in translator that keeps every placeholder, as the served one's masking does."""
    return f"Übersetzt: {segment}"


def translate(data: bytes, fn: Callable[[str], str] = german, fmt: PoFormat | None = None) -> Rendered:
    parsed = (fmt or PoFormat()).parse(data)
    return parsed.render([fn(s) for s in parsed.segments], INFO)


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.stem)
def test_a_real_catalog_round_trip(path: Path, tmp_path: Path) -> None:
    source = path.read_bytes()
    out = translate(source)
    assert out.translated > 10 and out.failed == 0
    assert msgfmt(out.data, tmp_path).returncode == 0, msgfmt(out.data, tmp_path).stderr
    before, after = entries(source), entries(out.data)
    assert [(e.msgctxt, e.msgid, e.obsolete) for e in before] == [(e.msgctxt, e.msgid, e.obsolete) for e in after]
    changed = set()
    for b, a in zip(before, after, strict=True):
        if b.is_header:
            continue
        if b.untranslated and "fuzzy" not in b.flags and not b.obsolete:
            changed.add(b.start)
            assert "fuzzy" in a.flags and all(a.msgstr.values())
            assert len(a.msgstr) == (2 if b.msgid_plural is not None else 1)  # both German forms
            kinds = formats(b.flags)
            assert placeholders(a.msgstr[0], kinds) == placeholders(b.msgid or "", kinds)
            if b.msgid_plural is not None:
                assert placeholders(a.msgstr[1], kinds) == placeholders(b.msgid_plural, kinds)
        else:
            assert (a.flags, a.msgstr) == (b.flags, b.msgstr)
    # every byte outside the changed entries and the header is as it was
    header = next(e.start for e in before if e.is_header)
    old = lines_outside(source, changed | {header})
    new_starts = {a.start for a, b in zip(after, before, strict=True) if b.start in changed | {header}}
    assert lines_outside(out.data, new_starts) == old
    assert translate(out.data).data == out.data  # a second run changes nothing


def test_plural_forms_follow_the_header(tmp_path: Path) -> None:
    text = (DATA / "git.po").read_text()
    assert "nplurals=2" in text
    out = translate(
        text.replace("nplurals=2; plural=(n!=1);", "nplurals=3; plural=(n==1 ? 0 : n==2 ? 1 : 2);").encode()
    )
    three = [e for e in entries(out.data) if e.msgid_plural is not None and "fuzzy" in e.flags]
    assert three and all(len(e.msgstr) == 3 and e.msgstr[1] == e.msgstr[2] for e in three)


def test_the_header_template_is_filled_and_accelerators_kept(tmp_path: Path) -> None:
    out = translate(CATALOG.encode())
    text = out.data.decode()
    assert out.translated == 6 and out.failed == 0 and out.kept == 0
    assert '"Language: de\\n"' in text and '"Plural-Forms: nplurals=2; plural=(n != 1);\\n"' in text
    assert "charset=UTF-8" in text and "X-Generator: transformer-serve 0.1.0" in text
    assert "PO-Revision-Date: 2026-12-01 20:00+0000" in text
    assert "Last-Translator: FULL NAME <EMAIL@ADDRESS>" in text  # not ours to change
    got = {(e.msgctxt, e.msgid): e.msgstr[0] for e in entries(out.data)}
    assert got[(None, "_File")] == "Übersetzt: _File"  # the same letter, at a word start
    assert got[("menu", "_Open")] == got[("verb", "_Open")] == "Übersetzt: _Open"  # each context its own entry
    assert got[(None, "  Copied %d of %s files\n")] == "  Übersetzt: Copied %d of %s files\n"
    assert got[(None, 'Hello %(name)s, say "hi"\tnow')] == 'Übersetzt: Hello %(name)s, say "hi"\tnow'
    result = msgfmt(out.data, tmp_path, "--check-accelerators=_")
    assert result.returncode == 0, result.stderr
    assert translate(out.data).data == out.data


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda s: s.replace("%s", "").replace("{app}", "").replace("%(name)s", ""), "a placeholder lost"),
        (lambda s: s + " _x", "an accelerator mark too many"),
        (lambda s: "", "no text"),
    ],
)
def test_a_translation_that_loses_something_stays_empty(fn: Callable[[str], str], why: str) -> None:
    out = translate(CATALOG.encode(), fn)
    assert out.failed >= 3, why
    failed = [e for e in entries(out.data) if e.msgid and e.untranslated]
    assert len(failed) == out.failed and all("fuzzy" not in e.flags for e in failed)


def test_fuzzy_entries_are_kept_unless_asked() -> None:
    source = (DATA / "sed.po").read_bytes()
    fuzzy = [e for e in entries(source) if "fuzzy" in e.flags and not e.is_header]
    kept = translate(source)
    again = translate(source, fmt=find("sed.PO", retranslate_fuzzy=True))  # extensions in any case
    old = {e.msgid: e.msgstr for e in fuzzy}
    assert all(e.msgstr == old[e.msgid] for e in entries(kept.data) if e.msgid in old)
    redone = [e for e in entries(again.data) if e.msgid in old]
    assert redone and all("Übersetzt: " in e.msgstr[0] and "fuzzy" in e.flags for e in redone)
    assert again.translated == kept.translated + len(fuzzy)


def test_crlf_stays_crlf_and_a_bom_stays(tmp_path: Path) -> None:
    source = (DATA / "diffutils.po").read_bytes().replace(b"\n", b"\r\n")
    out = translate(source).data
    assert out.count(b"\r\n") == out.count(b"\n") and out.count(b"\n") > source.count(b"\n")
    bom = translate(b"\xef\xbb\xbf" + (DATA / "diffutils.po").read_bytes()).data
    assert bom.startswith(b"\xef\xbb\xbf") and bom[3:] == translate((DATA / "diffutils.po").read_bytes()).data


def test_a_latin1_catalog_stays_latin1(tmp_path: Path) -> None:
    source = (DATA / "diffutils.po").read_text().replace("charset=UTF-8", "charset=ISO-8859-1").encode("latin-1")
    out = translate(source)
    assert out.failed == 0 and out.translated > 10
    assert out.data.decode("latin-1") == translate((DATA / "diffutils.po").read_bytes()).data.decode().replace(
        "charset=UTF-8", "charset=ISO-8859-1"
    )
    assert msgfmt(out.data, tmp_path).returncode == 0
    euro = translate(source, lambda s: f"{s} €")  # the charset cannot hold it: left empty
    assert euro.translated == 0 and euro.failed == out.translated


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b'msgid "a"\nmsgstr "b"\n\nmsgid "c"\nmsgstr "d\n', 5),  # an unterminated string
        (b'msgid "a"\nmsgstr "b"\nfoo\n', 3),
        (b'msgid "a"\n\nmsgid "b"\nmsgstr ""\n', 1),  # no msgstr
        (b'msgid "a"\nmsgstr[0] "b"\n', 2),  # a plural form without a plural
        (b'msgid "a\\q"\nmsgstr ""\n', 1),  # an unknown escape
        (b'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgid "\xff"\nmsgstr ""\n', 4),
        (b'msgid ""\nmsgstr "Content-Type: text/plain; charset=KLINGON\\n"\n', 1),
        (b'\xef\xbb\xbfmsgid ""\nmsgstr "Content-Type: text/plain; charset=ISO-8859-1\\n"\n', 1),
    ],
)
def test_unreadable_files_name_the_line(data: bytes, line: int) -> None:
    with pytest.raises(DocumentError) as err:
        PoFormat().parse(data)
    assert err.value.line == line and re.match(rf"line {line}: ", str(err.value))


def test_unknown_extensions_are_refused() -> None:
    with pytest.raises(DocumentError, match="unsupported file type .exe"):
        find("setup.EXE")
    assert find("de.POT").name == "po"


@pytest.mark.parametrize(
    ("text", "kind", "found"),
    [
        ("%1$s of %2$d, 100%% %-5.2f %<PRIu64> %zu", "c-format", ["%1$s", "%2$d", "%%", "%-5.2f", "%<PRIu64>", "%zu"]),
        ("%(name)s has %(n)d %s", "python-format", ["%(name)s", "%(n)d", "%s"]),
        ("{name} {{literal}} {0!r:>10}", "python-brace-format", ["{name}", "{0!r:>10}"]),
    ],
)
def test_placeholders_per_format(text: str, kind: str, found: list[str]) -> None:
    assert sorted(placeholders(text, [kind]).elements()) == sorted(found)
    assert formats(["fuzzy", kind, "no-c-format"]) == [kind]


def test_lines_end_at_newlines_only() -> None:
    """Read as Latin-1 for its header, "х" (D1 85) holds U+0085, which `str.splitlines` breaks at."""
    data = (
        'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgid "Bye"\nmsgstr "Пока, хорошо ą\u2028"\n'
    )
    out = translate(data.encode())
    assert out.data.decode().endswith('msgid "Bye"\nmsgstr "Пока, хорошо ą\u2028"\n')  # translated already: kept


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("Plural-Forms: nplurals=1000000; plural=0;", "more than 100 plural forms"),
        ("Plural-Forms: nplurals=" + "9" * 5000 + "; plural=0;", "more than 100 plural forms"),
        ("Content-Type: text/plain; charset=rot13", "not ASCII-compatible"),
        ("Content-Type: text/plain; charset=UTF-16", "not ASCII-compatible"),
        ("Content-Type: text/plain; charset=utf\\0", "not ASCII-compatible"),
    ],
)
def test_a_header_that_cannot_be_honoured_is_refused_before_translating(header: str, message: str) -> None:
    data = f'msgid ""\nmsgstr "{header}\\n"\n\nmsgid "a"\nmsgid_plural "b"\nmsgstr[0] ""\nmsgstr[1] ""\n'.encode()
    with pytest.raises(DocumentError, match=f"line 1: .*{message}"):
        PoFormat().parse(data)


def test_a_huge_plural_index_is_a_syntax_error() -> None:
    with pytest.raises(DocumentError, match="line 3: not a PO keyword"):
        PoFormat().parse(b'msgid "a"\nmsgid_plural "b"\nmsgstr[' + b"9" * 5000 + b'] ""\n')


def test_long_inner_whitespace_is_read_in_linear_time() -> None:
    """A lazy regex for a message's edges backtracked quadratically (40,000 spaces took 26 s)."""
    spaces = " " * 400_000
    out = translate(f'msgid "a{spaces}a"\nmsgstr ""\n'.encode(), lambda s: s.upper())
    assert out.data.decode().count(f"A{spaces}A") == 1
