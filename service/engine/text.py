"""A text as the translator sees it, and back: lines, sentences and protected spans.

`split(text)` keeps every line break, blank line and the whitespace around lines and between
sentences as literal pieces, and yields the sentences to translate, each with its protected
spans (`service.contract.spans`) replaced by placeholders numbered from ⟨1⟩ in that sentence.
`join(layout, translations)` puts the translated sentences back between the literal pieces,
with their spans restored. So a 3-line text gives a 3-line translation, and a long line is
translated sentence by sentence (the per-sentence token limit stays, not a per-text one). A
sentence that is one protected span alone (``</para>``, a lone URL) is no sentence to translate:
it stays as a literal piece.

Spans are found on the whole line before it is split into sentences (Wikimedia's `sentencex`),
so the splitter never breaks a URL, a version number or a placeholder apart. A sentence with
more spans than there are placeholder tokens keeps the extra ones as plain text. A control's
label (``Save _As``, ``&Open File``: `service.contract.accelerators.in_label`) is translated
without its accelerator mark, which `join` puts back before a sensible letter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sentencex

from service.contract import accelerators, spans

LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# A span's place while its line is split into sentences: <c>index<c>, c a character the line lacks.
_MARK_CHARS = "\x00\ue000\ue001\ue002\ue003"
# A sentence that is one span alone: nothing to translate, it stays as written (a model given "⟨1⟩"
# alone answered "⟨1⟩⟨1⟩" or "⟨1⟩:", its best once each placeholder comes back exactly once). Two
# spans are the model's to join ("pHYs DPI" -> "pHYs-DPI", as the reference has it).
_SPAN_ONLY = re.compile(r"\s*⟨\d+⟩\s*")


@dataclass(frozen=True)
class Segment:
    """One sentence to translate: `text` with placeholders, `spans` what each stands for."""

    text: str
    spans: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    """A text as literal pieces and sentence slots (ints index `segments`), in order."""

    pieces: tuple[str | int, ...]
    segments: tuple[Segment, ...]
    label: accelerators.Label | None = None  # a control's label: its accelerator goes back after `join`


def split(
    text: str,
    language: str = "en",
    protect: bool = True,
    alphabet: frozenset[str] | None = None,
    words: frozenset[str] | None = None,
    verbatim: bool = True,
) -> Layout:
    """Lines, then sentences; `protect=False` (a model without placeholder tokens) masks nothing;
    `alphabet` and `words`, the tokenizer's, protect the words it cannot spell and the names it
    does not hold (`spans`); `verbatim`, identifiers, code and names too (a model trained so)."""
    pieces: list[str | int] = []
    segments: list[Segment] = []
    label = accelerators.in_label(text) if protect else None
    if label is not None:  # the model never saw accelerator marks: translated without, put back after
        text = label.text
    pos = 0
    for brk in [*LINE_BREAK.finditer(text), None]:
        end = brk.start() if brk else len(text)
        _line(text[pos:end], language, protect, (alphabet, words, verbatim), pieces, segments)
        if brk:
            pieces.append(brk.group())
            pos = brk.end()
    return Layout(tuple(pieces), tuple(segments), label)


def join(layout: Layout, translations: list[str]) -> str:
    """The text with each sentence slot replaced by its translation, spans restored."""
    out = []
    for piece in layout.pieces:
        if isinstance(piece, int):
            out.append(spans.unmask(translations[piece], layout.segments[piece].spans))
        else:
            out.append(piece)
    joined = "".join(out)
    return layout.label.restore(joined) if layout.label else joined


def _line(
    line: str,
    language: str,
    protect: bool,
    known: tuple[frozenset[str] | None, frozenset[str] | None, bool],
    pieces: list[str | int],
    segments: list[Segment],
) -> None:
    core = line.strip()
    if not core:
        pieces.append(line)
        return
    lead = line[: len(line) - len(line.lstrip())]
    trail = line[len(line.rstrip()) :]
    mark = next((c for c in _MARK_CHARS if c not in core), None)
    alphabet, words, verbatim = known
    found = spans.find_spans(core, True, alphabet, verbatim=verbatim, words=words) if protect and mark else []
    originals = [core[s.start : s.end] for s in found]
    marked, last = [], 0
    for k, s in enumerate(found):
        marked += [core[last : s.start], f"{mark}{k}{mark}"]
        last = s.end
    marked.append(core[last:])
    pattern = re.compile(f"{re.escape(mark)}(\\d+){re.escape(mark)}") if found and mark else None
    pieces.append(lead)
    for sentence in _sentences("".join(marked), language):
        body = sentence.rstrip()
        segment = _segment(body, originals, pattern)
        if len(segment.spans) == 1 and _SPAN_ONLY.fullmatch(segment.text):
            pieces += [spans.unmask(segment.text, segment.spans), sentence[len(body) :]]
            continue
        segments.append(segment)
        pieces += [len(segments) - 1, sentence[len(body) :]]
    pieces.append(trail)


def _sentences(text: str, language: str) -> list[str]:
    """Sentences with their trailing whitespace; the whole text when the splitter would lose a character."""
    try:
        parts = [p for p in sentencex.segment(language, text) if p]
    except Exception:  # an unknown language or a splitter bug: one sentence
        return [text]
    return parts if "".join(parts) == text else [text]


def _segment(body: str, originals: list[str], pattern: re.Pattern[str] | None) -> Segment:
    """A sentence's span marks as placeholders ⟨1⟩, ⟨2⟩, ... in its own order."""
    if pattern is None:
        return Segment(body, ())
    kept: list[str] = []

    def place(m: re.Match[str]) -> str:
        original = originals[int(m.group(1))]
        if len(kept) >= spans.PLACEHOLDER_COUNT:
            return original
        kept.append(original)
        return spans.placeholder(len(kept))

    return Segment(pattern.sub(place, body), tuple(kept))
