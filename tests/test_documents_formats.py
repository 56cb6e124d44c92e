"""The document formats, driven by a fake translator ("DE:" in front of every segment): the
structure a format promises to keep is compared byte for byte, and rendering the segments
themselves must give the input back."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.documents import html, markdown, srt, text
from service.documents.base import DocumentError, Format, Rendered, RenderInfo

INFO = RenderInfo("translator", 1, "en", "de", "transformer-serve test", "2026-12-01 19:45+0000")
FORMATS: list[Format] = [text.FORMAT, srt.FORMAT, html.FORMAT, markdown.FORMAT]


def de(segments: Sequence[str]) -> list[str]:
    return ["DE:" + s for s in segments]


def render(fmt: Format, data: bytes, translate: Callable[[Sequence[str]], list[str]] = de) -> Rendered:
    parsed = fmt.parse(data)
    return parsed.render(translate(parsed.segments), INFO)


def identity(segments: Sequence[str]) -> list[str]:
    return list(segments)


TEXT = b"  Hello there\n\n\tSecond paragraph  \nits second line\n\n\n   \nlast"
SRT = (
    b"1\n00:00:01,000 --> 00:00:02,500\n<i>Hello</i> there\n  second line \n\n"
    b"2\n00:00:03,000 --> 00:00:04,000 X1:10 X2:20\nBye\n\n"
    b"3\n00:00:05,000 --> 00:00:06,000\n\n"
)
HTML = (
    b"<!DOCTYPE html>\n<html><head><title>Hi &amp; bye</title><style>p { color: red }</style></head>\n"
    b'<body><p class="intro" title="keep me">Hello <b>world</b>!</p>\n'
    b"<pre>do not touch</pre><code>x = 1</code><script>var s = 'no';</script>\n"
    b'<img alt="pic" src="a.png"/></body></html>\n'
)
MARKDOWN = b"""---
title: Front matter stays
---
# Title *with* emphasis #

Paragraph with `code span`, a [link text](http://x.y/a "a title") and ![alt text](img.png).
Second line with \\* escape &amp; entity <b>bold</b> and <http://auto.link>.

- item one
- item **two**
  continued

> quote line
> more quote

| a | b |
|---|---|
| c | [r][ref] |

```python
print("code")
```

    indented code

<div>
html block
</div>

Setext
======

[ref]: http://ref.example "ref title"
"""
FIXTURES = {"text": TEXT, "srt": SRT, "html": HTML, "markdown": MARKDOWN}


def fixture(fmt: Format) -> bytes:
    return FIXTURES[fmt.name]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_rendering_the_segments_themselves_gives_the_input_back(fmt: Format) -> None:
    assert render(fmt, fixture(fmt), identity).data == fixture(fmt)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_crlf_and_bom_are_kept(fmt: Format) -> None:
    data = b"\xef\xbb\xbf" + fixture(fmt).replace(b"\n", b"\r\n")
    assert render(fmt, data, identity).data == data
    out = render(fmt, data).data
    assert out.startswith(b"\xef\xbb\xbf") and out.count(b"\n") == out.count(b"\r\n") == data.count(b"\n")
    assert "DE:\ufeff" not in out.decode("utf-8") and all("\ufeff" not in s for s in fmt.parse(data).segments)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_undecodable_bytes_name_their_line(fmt: Format) -> None:
    data = fixture(fmt).replace(b"\n", b"\n\xff", 3).replace(b"\n\xff", b"\n", 2)  # \xff on line 4
    with pytest.raises(DocumentError) as err:
        fmt.parse(data)
    assert err.value.line == 4 and "line 4" in str(err.value)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_an_empty_translation_keeps_the_source_and_counts_as_failed(fmt: Format) -> None:
    parsed, whole = fmt.parse(fixture(fmt)), render(fmt, fixture(fmt))
    out = parsed.render(["", *de(parsed.segments[1:])], INFO)
    assert out.failed == 1 and out.data.decode("utf-8").count("DE:") == len(parsed.segments) - 1
    assert (out.translated + 1, out.kept) == (whole.translated, whole.kept)


def test_every_format_describes_itself() -> None:
    assert [(f.name, f.extensions) for f in FORMATS] == [
        ("text", (".txt",)),
        ("srt", (".srt",)),
        ("html", (".html", ".htm")),
        ("markdown", (".md", ".markdown")),
    ]
    assert all(f.media_type.endswith("; charset=utf-8") for f in FORMATS)


def test_text_translates_every_line_and_keeps_blank_lines_and_whitespace() -> None:
    parsed = text.FORMAT.parse(TEXT)
    assert list(parsed.segments) == ["Hello there", "Second paragraph", "its second line", "last"]
    out = parsed.render(de(parsed.segments), INFO)
    assert out.data == b"  DE:Hello there\n\n\tDE:Second paragraph  \nDE:its second line\n\n\n   \nDE:last"
    assert (out.translated, out.kept, out.failed) == (4, 0, 0)


def test_a_translation_never_adds_a_line() -> None:
    out = render(text.FORMAT, b"one\ntwo\n", lambda segments: [s + "\nmore" for s in segments])
    assert out.data == b"one more\ntwo more\n"


def test_srt_keeps_numbers_timings_and_line_count_per_cue() -> None:
    parsed = srt.FORMAT.parse(SRT)
    assert list(parsed.segments) == ["<i>Hello</i> there", "second line", "Bye"]
    out = parsed.render(de(parsed.segments), INFO)
    assert out.data == (
        b"1\n00:00:01,000 --> 00:00:02,500\nDE:<i>Hello</i> there\n  DE:second line \n\n"
        b"2\n00:00:03,000 --> 00:00:04,000 X1:10 X2:20\nDE:Bye\n\n"
        b"3\n00:00:05,000 --> 00:00:06,000\n\n"
    )
    assert (out.translated, out.kept, out.failed) == (2, 1, 0)  # the third cue has no text


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"1\n00:00:01,000 -> 00:00:02,000\nHi\n", 2),
        (b"1\n00:00:01,000 --> 00:00:02,000\nHi\n\n2\n00:00:03 --> 00:00:04,000\nBye\n", 6),
        (b"1\n00:00:01,000 --> 00:00:02,000\nHi\n\nnot a number\n", 5),
        (b"1\n00:00:01,000 --> 00:00:02,000\nHi\n\n2\n", 6),
    ],
)
def test_a_malformed_cue_names_its_line(data: bytes, line: int) -> None:
    with pytest.raises(DocumentError) as err:
        srt.FORMAT.parse(data)
    assert err.value.line == line


def test_html_translates_text_nodes_and_keeps_tags_attributes_and_code() -> None:
    parsed = html.FORMAT.parse(HTML)
    assert list(parsed.segments) == ["Hi & bye", "Hello", "world", "!"]
    out = parsed.render(["Hallo & tschüss", "Hallo", "Welt", "!"], INFO)
    assert out.data == HTML.replace(b"Hi &amp; bye", "Hallo &amp; tschüss".encode()).replace(
        b"Hello <b>world</b>", b"Hallo <b>Welt</b>"
    )
    assert (out.translated, out.kept, out.failed) == (4, 0, 0)


def test_markdown_translates_text_runs_and_keeps_markup_code_targets_and_front_matter() -> None:
    parsed = markdown.FORMAT.parse(MARKDOWN)
    assert list(parsed.segments) == [
        *("Title", "with", "emphasis", "Paragraph with", ", a", "link text", "and", "alt text"),
        *("Second line with \\* escape &amp; entity", "bold", "and"),
        *("item one", "item", "two", "continued", "quote line", "more quote", "a", "b", "c", "r", "Setext"),
    ]
    out = parsed.render(de(parsed.segments), INFO)
    expected = MARKDOWN
    for source, translated in [
        (b"# Title *with* emphasis #", b"# DE:Title *DE:with* DE:emphasis #"),
        (b"Paragraph with `code span`, a [link text]", b"DE:Paragraph with `code span`DE:, a [DE:link text]"),
        (b" and ![alt text](img.png).", b" DE:and ![DE:alt text](img.png)."),
        (b"Second line with", b"DE:Second line with"),
        (b"<b>bold</b> and <http", b"<b>DE:bold</b> DE:and <http"),
        (b"- item one\n- item **two**\n  continued", b"- DE:item one\n- DE:item **DE:two**\n  DE:continued"),
        (b"> quote line\n> more quote", b"> DE:quote line\n> DE:more quote"),
        (b"| a | b |\n|---|---|\n| c | [r][ref] |", b"| DE:a | DE:b |\n|---|---|\n| DE:c | [DE:r][ref] |"),
        (b"Setext\n===", b"DE:Setext\n==="),
    ]:
        assert expected.count(source) == 1
        expected = expected.replace(source, translated)
    assert out.data == expected
    # units: 10 blocks with text; front matter, the fence, the indented code and the HTML block kept
    assert (out.translated, out.kept, out.failed) == (10, 4, 0)


def test_a_table_cell_is_looked_for_between_its_pipes() -> None:
    parsed = markdown.FORMAT.parse(b"x | y\n-|-\n| a \\| y | y |\n")
    out = parsed.render(de(parsed.segments), INFO)
    assert out.data == b"DE:x | DE:y\n-|-\n| a \\| y | DE:y |\n"  # an escaped pipe's cell stays as written


@pytest.mark.slow
def test_table_rows_without_pipes_are_read_in_linear_time() -> None:
    """Each cell's pipe was looked for to the end of the file (40,000 such rows took 82 s)."""
    rows = 40_000
    parsed = markdown.FORMAT.parse(b"|a|b|\n|-|-|\n" + b"a\n" * rows)
    out = parsed.render(de(parsed.segments), INFO)
    assert out.data == b"|DE:a|DE:b|\n|-|-|\n" + b"DE:a\n" * rows


@pytest.mark.parametrize(
    ("source", "segments"),
    [
        (
            b"<p>Hi</p>" + b"<a " * 50_000,
            ["Hi", ("<a " * 50_000).strip()],
        ),  # no ">" after: text, as HTMLParser reads it
        (b"<p>" + b"<b>" * 100_000 + b"Hi", ["Hi"]),
        (b"<p>" + b"&amp;" * 200_000, ["&" * 200_000]),
    ],
    ids=["unclosed-tags", "many-tags", "many-entities"],
)
def test_hostile_html_is_read_in_linear_time(source: bytes, segments: list[str]) -> None:
    """Unclosed tags made HTMLParser rescan to the end from every "<" (20,000 took 38 s); a text
    node grown one piece at a time was copied whole at each."""
    parsed = html.FORMAT.parse(source)
    assert list(parsed.segments) == segments
    assert parsed.render(identity(parsed.segments), INFO).data.startswith(source[:9])


def test_a_thematic_break_is_no_front_matter() -> None:
    parsed = markdown.FORMAT.parse(b"---\n\nText\n")
    assert list(parsed.segments) == ["Text"]


LINE = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\n"), max_size=12)


@settings(max_examples=150, deadline=None)
@given(st.lists(LINE, max_size=8), st.booleans(), st.booleans())
def test_any_text_file_comes_back_as_it_was(lines: list[str], crlf: bool, bom: bool) -> None:
    data = ("\ufeff" * bom + ("\r\n" if crlf else "\n").join(lines)).encode("utf-8")
    assert render(text.FORMAT, data, identity).data == data
    assert render(text.FORMAT, data).data.count(b"\n") == data.count(b"\n")


CUE_TEXT = st.lists(LINE.filter(lambda s: s.strip() != ""), min_size=0, max_size=3)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 99), CUE_TEXT), min_size=1, max_size=5), st.booleans())
def test_any_subrip_file_comes_back_as_it_was(cues: list[tuple[int, list[str]]], crlf: bool) -> None:
    blocks = [[str(i + 1), f"00:00:{s:02d},000 --> 00:01:{s:02d},500", *lines] for i, (s, lines) in enumerate(cues)]
    end = "\r\n" if crlf else "\n"
    data = (end * 2).join(end.join(b) for b in blocks).encode("utf-8")
    assert render(srt.FORMAT, data, identity).data == data
    out = render(srt.FORMAT, data)
    assert out.data.decode().split(end)[:2] == blocks[0][:2] and out.translated == sum(bool(c) for _, c in cues)


MARKDOWN_CHARS = st.sampled_from(
    [*"ab #*_`[]()<>!|-=>\\&;:\n\t\"'~", "  ", "    ", "\n\n", "```", "](u)", "<b>", "&amp;", "1. ", "---\n"]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(MARKDOWN_CHARS, max_size=40).map("".join), st.booleans())
def test_any_markdown_comes_back_as_it_was_and_keeps_its_lines(source: str, crlf: bool) -> None:
    data = source.replace("\n", "\r\n" if crlf else "\n").encode("utf-8")
    assert render(markdown.FORMAT, data, identity).data == data
    assert render(markdown.FORMAT, data).data.count(b"\n") == data.count(b"\n")
