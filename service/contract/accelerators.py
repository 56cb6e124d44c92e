"""Keyboard accelerators (`_File`, `&File`): taken out before translation, put back after.

The model never saw accelerator marks in training (they were stripped from its data), so a
message is translated without its mark and the mark goes back before a sensible letter of the
translation: the same letter at a word start, else the same letter anywhere, else the first
letter. What counts as a mark follows gettext's `msgfmt --check-accelerators`: a message with
exactly one mark character needs exactly one in its translation (a doubled mark is a literal).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from service.contract.spans import find_spans

MARKS = ("_", "&")
# a mark before a letter or digit, not between two capitals or digits (EVENT_QUERY, AT&T)
_RULE = {m: re.compile(rf"(?<![A-Z0-9{m}]){m}(?=[^\W_])|{m}(?=[^\W_A-Z0-9])") for m in MARKS}
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);")


def count(text: str, mark: str) -> int:
    """Marks as msgfmt counts them: every `mark` but a doubled one."""
    return text.count(mark) - 2 * text.count(mark * 2)


def find(text: str, mark: str) -> int | None:
    """Where the one accelerator mark of `text` is, or None: none, several, not before a letter, or
    inside a protected span (`$BASH_ENV`, `--dry_run`, `%s_%d`), which the translator copies anyway."""
    if text.count(mark) != 1 or (mark == "&" and _ENTITY.search(text)):
        return None
    m = _RULE[mark].search(text)
    if m is None or any(s.start <= m.start() < s.end for s in find_spans(text)):
        return None
    return m.start()


def _at_word_start(text: str, mark: str) -> bool:
    at = find(text, mark)
    return at is not None and (at == 0 or not text[at - 1].isalnum())


def strip(text: str, mark: str) -> tuple[str, str | None]:
    """`text` without its accelerator mark, and the letter the mark stood before (None: no mark)."""
    at = find(text, mark)
    if at is None:
        return text, None
    return text[:at] + text[at + 1 :], text[at + 1]


def insert(translation: str, letter: str, mark: str, near: float | None = None) -> str:
    """`translation` with `mark` before `letter` (case-insensitive), preferring a word start; when the
    translation lacks that letter, before its first letter or digit. Unchanged when it has none.
    `near` (0..1, where the mark stood in the source): among equal choices the closest to it."""
    wanted = letter.lower()
    starts = [
        i for i, c in enumerate(translation) if c.lower() == wanted and (i == 0 or not translation[i - 1].isalnum())
    ]
    anywhere = [i for i, c in enumerate(translation) if c.lower() == wanted]
    first = [i for i, c in enumerate(translation) if c.isalnum()]
    for found in (starts, anywhere, first[:1]):
        if found:
            at = found[0] if near is None else min(found, key=lambda i: abs(i / len(translation) - near))
            return translation[:at] + mark + translation[at:]
    return translation


def convention(messages: Iterable[str]) -> str | None:
    """The catalog's accelerator mark, or None: the one more messages carry at a word start (at
    least two), so that identifiers (`file_name`) alone do not make a catalog look accelerated."""
    counts = dict.fromkeys(MARKS, 0)
    for text in messages:
        for mark in MARKS:
            counts[mark] += _at_word_start(text, mark)
    best = max(MARKS, key=lambda m: counts[m])
    return best if counts[best] >= 2 else None


LABEL_WORDS = 8  # a text of at most this many words can be a labelled control ("Save _As", "&Open File")


@dataclass(frozen=True)
class Label:
    """A control's label without its accelerator: `text`, and the mark to put back before `letter`
    near `at` (where it stood, as a share of the stripped text's length)."""

    text: str
    letter: str
    mark: str
    at: float

    def restore(self, translation: str) -> str:
        return insert(translation, self.letter, self.mark, self.at)


def in_label(text: str) -> Label | None:
    """A short one-line text with one accelerator mark at a word start, as a `Label`; None
    otherwise. Outside a catalog nothing says a text is a control's label, so only the
    unambiguous case counts (``_private``, ``a_b`` and ``R&D`` stay text)."""
    if "\n" in text or "\r" in text or len(text.split()) > LABEL_WORDS:
        return None
    for mark in MARKS:
        at = find(text, mark)
        if at is None or (at > 0 and text[at - 1].isalnum()):
            continue
        letter = text[at + 1]
        if mark == "&" or letter.isupper():  # `_x` is an identifier's more often
            stripped = text[:at] + text[at + 1 :]
            return Label(stripped, letter, mark, at / len(stripped))
    return None
