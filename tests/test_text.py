"""Lines, sentences and spans of a text, and the lossless tokenizer."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from export import tokenizer as tokenizer_lib
from service.engine import text
from tests.conftest import sentences


def identity(layout: text.Layout) -> str:
    return text.join(layout, [s.text for s in layout.segments])


def test_lines_and_sentences_keep_their_separators() -> None:
    t = "  Could not open %s. Try again!  \r\n\r\nSecond line\n"
    layout = text.split(t)
    assert [s.text for s in layout.segments] == ["Could not open ⟨1⟩.", "Try again!", "Second line"]
    assert layout.segments[0].spans == ("%s",)
    assert text.join(layout, ["Öffnen von ⟨1⟩ nicht möglich.", "Nochmal!", "Zweite Zeile"]) == (
        "  Öffnen von %s nicht möglich. Nochmal!  \r\n\r\nZweite Zeile\n"
    )


def test_a_three_line_text_gives_three_lines() -> None:
    layout = text.split("Line one.\nLine two.\nLine three.")
    assert text.join(layout, ["A", "B", "C"]).split("\n") == ["A", "B", "C"]


def test_spans_are_found_before_sentences_are_split() -> None:
    layout = text.split("See https://x.org/a.b. Version 1.2.3 is out.")
    assert [(s.text, s.spans) for s in layout.segments] == [
        ("See ⟨1⟩.", ("https://x.org/a.b",)),
        ("Version ⟨1⟩ is out.", ("1.2.3",)),
    ]


def test_a_sentence_of_one_span_alone_is_not_translated() -> None:
    """Nothing to translate: it stays as written (a model given "⟨1⟩" alone answered "⟨1⟩:"); two
    spans are the model's to join."""
    layout = text.split("<para>Save the file.</para>\n https://x.org/a \n⟨1⟩\nhttps://x.org/a %s")
    assert [s.text for s in layout.segments] == ["⟨1⟩Save the file.", "⟨1⟩ ⟨2⟩"]
    assert text.join(layout, ["⟨1⟩Datei speichern.", "⟨1⟩ ⟨2⟩"]) == (
        "<para>Datei speichern.</para>\n https://x.org/a \n⟨1⟩\nhttps://x.org/a %s"
    )
    unprotected = text.split("⟨1⟩", protect=False)  # a literal placeholder, no span: the model's
    assert [s.text for s in unprotected.segments] == ["⟨1⟩"]


def test_without_protection_nothing_is_masked() -> None:
    layout = text.split("Open %s now.", protect=False)
    assert [(s.text, s.spans) for s in layout.segments] == [("Open %s now.", ())]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_split_then_join_is_the_identity(t: str) -> None:
    assert identity(text.split(t)) == t


TOKENIZER = tokenizer_lib.train_bpe(sentences(300) + ["naïve café", "Größe ändern"], vocab_size=400)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=60))
def test_tokenizer_is_lossless(s: str) -> None:
    """decode(encode(s)) is s up to NFC, with leading spaces dropped and ▁ (U+2581) read as a space."""
    decoded = TOKENIZER.decode(TOKENIZER.encode(s).ids, skip_special_tokens=False)
    assert decoded == unicodedata.normalize("NFC", s).replace("▁", " ").lstrip(" ")


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("Impressive results.", "impressive results."),
        ("Rude staff. Awful food! Never again?", "rude staff. awful food! never again?"),
        ('"Great!" Loved it. (Really) yes', '"great!" loved it. (really) yes'),
        (" Leading space", " leading space"),
        ("AWFUL! I think so. iPhone works.", "AWFUL! I think so. iPhone works."),  # shouting, "I", camel case
        ("Made by Siobhan in Paris. OK.", "made by Siobhan in Paris. OK."),  # mid-sentence capitals stay
    ],
)
def test_a_classifier_tokenizer_lowers_only_a_capital_that_starts_a_sentence(raw: str, normalised: str) -> None:
    assert tokenizer_lib.sentence_case().normalize_str(raw) == normalised


def test_sentence_case_makes_a_sentence_start_encode_as_the_word_does_mid_sentence() -> None:
    texts = [*sentences(300), "it was impressive and rude"]
    cased = tokenizer_lib.train_bpe(texts, vocab_size=400, lower_sentence_starts=True)
    assert cased.encode("Impressive. Rude staff.").ids == cased.encode("impressive. rude staff.").ids
    patched = tokenizer_lib.with_sentence_case(TOKENIZER)
    assert patched.encode("Open the file.").ids == TOKENIZER.encode("open the file.").ids
    assert TOKENIZER.encode("Open the file.").ids != TOKENIZER.encode("open the file.").ids  # unpatched: cased
    assert patched.encode("open the file.").ids == TOKENIZER.encode("open the file.").ids  # nothing else changes


def test_special_token_text_is_just_text() -> None:
    ids = TOKENIZER.encode("</s> <pad> <unk>").ids
    assert not {0, 1, 2, 3, 4} & set(ids)


def test_a_labels_accelerator_is_translated_without_its_mark_and_put_back() -> None:
    layout = text.split("Save _As…")
    assert [s.text for s in layout.segments] == ["Save As…"]
    assert text.join(layout, ["Speichern unter …"]) == "_Speichern unter …"  # no "a" in it: the first letter
    assert text.join(layout, ["Speichern als …"]) == "Speichern _als …"  # the same letter at a word start
    amp = text.split("&Open File")
    assert [s.text for s in amp.segments] == ["Open File"] and text.join(amp, ["Datei öffnen"]) == "&Datei öffnen"
    for plain in ("Call _private now", "R&D costs", "A & B", "a_b and c_d"):  # identifiers and prose stay text
        assert text.split(plain).label is None
    assert text.split("Save _As", protect=False).label is None


def test_identifiers_are_masked_only_for_a_model_trained_with_them() -> None:
    assert [s.text for s in text.split("HOME not set").segments] == ["⟨1⟩ not set"]
    assert [s.text for s in text.split("HOME not set", verbatim=False).segments] == ["HOME not set"]
    assert [s.text for s in text.split("Open %s", verbatim=False).segments] == ["Open ⟨1⟩"]  # strict spans stay
