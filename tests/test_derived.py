"""The derived sentiment sources (export/derived.py): rules on lexicon rows written here."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from export import data
from export import derived as d
from export.derived import Derived

# token, mean, std: a few rows in the shape of vader_lexicon.txt
LEXICON_TEXT = (
    "good\t1.9\t0.9434\t[2, 1, 1, 3, 2, 4, 2, 2, 1, 1]\r\n"
    "bad\t-2.5\t0.67082\t[-2, -3, -3, -3, -2, -3, -3, -1, -2, -3]\r\n"
    ":)\t2.0\t1.18322\t[2, 2, 1, 1, 1, 1, 4, 3, 4, 1]\r\n"
    "meh\t-0.3\t0.78102\t[-1, -1, -1, 1, -1, 0, 0, 0, 0, 0]\r\n"
    "joke\t1.2\t1.6\t[3, 2, 0, -2, 2, 2, 3, 1, -1, 1]\r\n"
    "disaster\t-3.1\t0.83066\t[-2, -4, -4, -3, -3, -2, -4, -4, -2, -3]\r\n"
    "awful\t-2.0\t2.04939\t[-2, -2, -3, -3, -2, -3, 4, -3, -3, -3]\r\n"
)
LEXICON = d.parse_lexicon(LEXICON_TEXT)
BY_NAME = {t.name: t for t in d.TEMPLATES}


def test_parse_lexicon_and_thresholds() -> None:
    assert LEXICON["bad"] == d.Entry(-2.5, (-2, -3, -3, -3, -2, -3, -3, -1, -2, -3))
    usable = sorted(w for w, entry in LEXICON.items() if d.usable_word(w, entry))
    # ":)" is an emoticon, "meh" is mild (|v| < 1), "joke" has two raters on the other side;
    # "awful" keeps its single dissenting rater
    assert usable == ["awful", "bad", "disaster", "good"]


@pytest.mark.parametrize(
    ("template", "word", "text", "label"),
    [
        ("not", "bad", "Not bad.", "positive"),
        ("not", "good", "Not good.", "negative"),
        ("very", "good", "Very good.", "positive"),
        ("very", "bad", "Very bad.", "negative"),
        ("not-at-all", "bad", "Not bad at all.", "positive"),
        ("its-not", "good", "It's not good.", "negative"),
        ("wasnt", "bad", "It wasn't bad.", "positive"),
        ("caps!", "bad", "BAD!", "negative"),
        ("bare!", "good", "Good!", "positive"),
        ("absolutely", "good", "Absolutely good!", "positive"),
        ("it-was", "bad", "It was bad.", "negative"),
    ],
)
def test_templates_and_negation_labels(template: str, word: str, text: str, label: str) -> None:
    t = BY_NAME[template]
    assert d.render(t, word) == text
    assert d.label_of(d.rule_valence(LEXICON[word].mean, t)) == label


def test_noun_templates_take_a_noun_from_the_list() -> None:
    text = d.render(BY_NAME["the-noun-was-not"], "bad")
    assert text.startswith("The ") and text.endswith(" was not bad.")
    assert text.split()[1] in d.NOUNS
    assert d.label_of(d.rule_valence(-2.5, BY_NAME["the-noun-was-not"])) == "positive"


def test_adjective_templates_only_for_adjectival_words() -> None:
    assert d.looks_adjectival("awful") and d.looks_adjectival("bad") and d.looks_adjectival("hopeless")
    assert not d.looks_adjectival("disaster") and not d.looks_adjectival("uselessly")
    assert {t.name for t in d.choose_templates("disaster")} <= {"bare", "bare!", "caps!"}
    assert len(d.choose_templates("disaster")) == d.OTHER_TEMPLATES_PER_WORD
    assert len(d.choose_templates("awful")) == d.ADJECTIVE_TEMPLATES_PER_WORD


def test_lexicon_phrases_labels_follow_the_rules() -> None:
    phrases = d.lexicon_phrases(LEXICON)
    assert {p.source for p in phrases} == {d.LEXICON_SOURCE}
    for p in phrases:
        negated = any(n in p.text.split() for n in ("Not", "not", "wasn't"))
        word = next(w for w in ("awful", "bad", "disaster", "good") if w in p.text.lower())
        expected = (LEXICON[word].mean > 0) != negated
        assert p.label == ("positive" if expected else "negative"), p


def test_lexicon_phrases_are_deterministic() -> None:
    reversed_lexicon = dict(reversed(list(LEXICON.items())))
    assert d.lexicon_phrases(LEXICON) == d.lexicon_phrases(reversed_lexicon) == d.lexicon_phrases(LEXICON)


def _no_compound(text: str) -> float:
    return 0.0


def test_neutral_sentences_rules_and_order() -> None:
    texts = [
        "The meeting is at three.",  # kept
        "The food was good.",  # a lexicon word
        "It is a favourable time.",  # "favorable" in American spelling
        "Go.",  # too short
        "We took the train to Bonn and then the bus to Cologne today.",  # 13 words
        "Kiss of death here.",  # scored non-zero by the (fake) analyzer
    ]
    lexicon = {**LEXICON, "favorable": d.Entry(2.1, (2, 2))}

    def compound(text: str) -> float:
        return -0.5 if "death" in text else 0.0

    out = d.neutral_sentences(texts, lexicon, compound)
    assert out == [Derived("The meeting is at three.", "neutral", d.NEUTRAL_SOURCE)]
    assert d.neutral_sentences(list(reversed(texts)), lexicon, compound) == out


def test_neutral_sample_is_a_fixed_sha1_choice() -> None:
    texts = [f"Room number {i} is upstairs." for i in range(50)]
    first = d.neutral_sentences(texts, LEXICON, _no_compound, target=10)
    assert len(first) == 10
    assert first == d.neutral_sentences(texts[::-1], LEXICON, _no_compound, target=10)


def test_decontaminate_drops_eval_and_human_texts_and_repeats() -> None:
    made = [
        Derived("Awful!", "negative", d.LEXICON_SOURCE),  # in the eval set as "awful."
        Derived("Not bad.", "positive", d.LEXICON_SOURCE),  # a human text (human wins)
        Derived("Very good.", "positive", d.LEXICON_SOURCE),
        Derived("VERY GOOD!", "positive", d.LEXICON_SOURCE),  # same words as the one before
        Derived("The meeting is at three.", "neutral", d.NEUTRAL_SOURCE),
    ]
    kept = d.decontaminate(made, ["awful.", "not   bad"])
    assert [ex.text for ex in kept] == ["Very good.", "The meeting is at three."]
    assert d.match_form("It's NOT good!") == "it's not good"


def test_derived_rows_join_train_only() -> None:
    splits = data.split_sentiment([data.Rated(f"human text {i}", "neutral", "vader_movie") for i in range(200)])
    valid, test = list(splits["valid"]), list(splits["test"])
    data.add_to_train(splits, [Derived("Very good.", "positive", d.LEXICON_SOURCE)])
    assert splits["valid"] == valid and splits["test"] == test
    assert {"text": "Very good.", "label": "positive", "source": d.LEXICON_SOURCE} in splits["train"]
    keys = [data.sort_key(row["text"]) for row in splits["train"]]
    assert keys == sorted(keys)


def test_read_vader_lexicon_from_the_sdist(tmp_path: Path) -> None:
    sdist = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    raw = LEXICON_TEXT.encode("utf-8")
    with tarfile.open(sdist, "w:gz") as archive:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/" + data.VADER_LEXICON)
        info.size = len(raw)
        archive.addfile(info, io.BytesIO(raw))
    assert data.read_vader_lexicon(sdist) == LEXICON


def test_the_bench_eval_set_is_there_to_decontaminate_against() -> None:
    texts = [row["text"] for row in data.load_jsonl(data.BENCH_SHORT_TEXTS)]
    assert len(texts) >= 100 and "Excellent." in texts
