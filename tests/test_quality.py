"""bench.quality's dropped-content figures: content words, the length ratio and the shares built
on them, on literal German examples (the issue's own among them)."""

from __future__ import annotations

import pytest

from bench.quality import SHORT_RATIO, content_words, dropped_scores, length_ratio


def test_content_words_leave_out_function_words_and_punctuation() -> None:
    assert content_words("Das Wetter ist heute nett.") == {"wetter", "heute", "nett"}
    assert content_words("Das Wetter ist heute.") == {"wetter", "heute"}
    assert content_words("„Datei-Manager“ öffnen…") == {"datei-manager", "öffnen"}


def test_content_words_keep_negations_and_count_a_repeated_word_once() -> None:
    assert content_words("Das ist nicht gut, kein Problem") == {"nicht", "gut", "kein", "problem"}
    assert content_words("Änderungen speichern speichern?") == {"änderungen", "speichern"}


def test_content_words_leave_out_numbers_identifiers_and_placeholders() -> None:
    assert content_words("Datei %s hat 42 Zeilen in foo_bar") == {"datei", "zeilen"}


def test_length_ratio_counts_characters_without_spaces() -> None:
    assert length_ratio("Das Wetter ist heute.", "Das Wetter ist heute nett.") == pytest.approx(18 / 22)
    assert length_ratio("ab  cd", "abcd") == 1.0
    assert length_ratio("anything", "") == 1.0  # an empty reference: nothing to lose


def test_dropped_scores_flag_short_outputs_and_fewer_content_words_than_greedy() -> None:
    refs = ["Das Wetter ist heute nett.", "Datei öffnen", "Einstellungen speichern"]
    greedy = ["Das Wetter ist heute nett.", "Datei öffnen", "Speichern"]
    hyps = ["Das Wetter ist heute.", "Öffnen", "Einstellungen speichern"]
    scores = dropped_scores(hyps, refs, greedy)
    assert length_ratio(hyps[1], refs[1]) < SHORT_RATIO <= length_ratio(hyps[0], refs[0])
    assert scores == {
        "short_share": pytest.approx(1 / 3),  # "Öffnen": 6 of 11 characters
        "fewer_content_than_greedy": pytest.approx(2 / 3),  # "nett" and "datei" lost
        "more_content_than_greedy": pytest.approx(1 / 3),  # "einstellungen" gained
    }


def test_dropped_scores_of_nothing_are_zero() -> None:
    assert dropped_scores([], [], []) == {
        "short_share": 0.0,
        "fewer_content_than_greedy": 0.0,
        "more_content_than_greedy": 0.0,
    }
