"""Accelerator marks: found as msgfmt counts them, taken out, put back before a sensible letter."""

from __future__ import annotations

import pytest

from service.contract import accelerators as acc


@pytest.mark.parametrize(
    ("text", "mark", "stripped", "letter"),
    [
        ("_File", "_", "File", "F"),
        ("Save _As…", "_", "Save As…", "A"),
        ("Fi_le", "_", "File", "l"),
        ("&Open", "&", "Open", "O"),
        ("EVENT_QUERY", "_", "EVENT_QUERY", None),  # between capitals: an identifier
        ("AT&T", "&", "AT&T", None),
        ("Tom &amp; Jerry", "&", "Tom &amp; Jerry", None),  # an entity, not a mark
        ("_a_b", "_", "_a_b", None),  # several: none is the mark
        ("set $BASH_ENV", "_", "set $BASH_ENV", None),  # inside a protected span
        ("use --dry_run", "_", "use --dry_run", None),
        ("no mark", "_", "no mark", None),
    ],
)
def test_strip_finds_the_one_mark(text: str, mark: str, stripped: str, letter: str | None) -> None:
    assert acc.strip(text, mark) == (stripped, letter)


@pytest.mark.parametrize(
    ("translation", "letter", "out"),
    [
        ("Datei", "F", "_Datei"),  # no F: the first letter
        ("Speichern als", "A", "Speichern _als"),  # the same letter at a word start
        ("Öffnen", "O", "_Öffnen"),
        ("Datei laden", "l", "Datei _laden"),  # a word start before a letter inside a word
        ("Hallo", "l", "Ha_llo"),  # only inside a word
        ("…", "x", "…"),  # nothing to mark
    ],
)
def test_insert_prefers_the_same_letter_at_a_word_start(translation: str, letter: str, out: str) -> None:
    assert acc.insert(translation, letter, "_") == out


def test_count_is_msgfmts_doubled_marks_are_literals() -> None:
    assert acc.count("a && b &c", "&") == 1
    assert acc.count("___", "_") == 1
    assert acc.count("none", "_") == 0


def test_convention_needs_marks_at_word_starts() -> None:
    assert acc.convention(["_File", "_Edit", "&Help"]) == "_"
    assert acc.convention(["&File", "&Edit", "_Help"]) == "&"
    assert acc.convention(["file_name", "user_id", "_Only"]) is None  # identifiers are not marks
    assert acc.convention([]) is None
