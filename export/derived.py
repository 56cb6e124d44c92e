"""Derived, rule-labelled sentiment examples: training-only help for short everyday texts.

The human-rated sources hold almost no one- to five-word texts, so the classifier guessed on
"Awful." or "The meeting is at 3pm.". Two derived sources fill that gap with labels that follow
published rules, never a hand-picked label:

- ``vader_lexicon_derived``: short template phrases around words of VADER's own lexicon,
  labelled by the sign of the valence after VADER's rules (negation scales by N_SCALAR = -0.74,
  so it flips the sign; boosters, capitals and "!" only grow the magnitude, keeping the sign).
- ``neutral_derived``: English Ding dictionary sentences with no lexicon word at all and a
  VADER compound of exactly 0, labelled neutral.

Everything is a pure function of its inputs; choices are made by sha1, so a rebuild gives the
same bytes. Decontamination against evaluation texts happens here too (`decontaminate`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

LEXICON_SOURCE = "vader_lexicon_derived"
NEUTRAL_SOURCE = "neutral_derived"

# Lexicon rows kept: a lowercase alphabetic word of 3+ letters (no emoticons, no "can't stand"),
# |mean valence| >= MIN_VALENCE (a clear polarity, not "mild"), and at most MAX_DISSENT of the ten
# raters on the other side of zero (the sign is agreed; "awful" keeps its one +4 outlier).
MIN_VALENCE = 1.0
MAX_DISSENT = 1
_WORD = re.compile(r"[a-z]{3,}")

N_SCALAR = -0.74  # vaderSentiment.N_SCALAR: a negated word's valence is multiplied by this
BOOST = 0.293  # vaderSentiment.B_INCR: added to |valence|, the sign is kept

# Adjectival look (an approximation: no tagger): these suffixes but not the noun or adverb
# endings below ("dignity", "compliment", "uselessly"), or the short list of common adjectives.
# Only such words enter "It was {w}." style templates; a miss only costs fluency, not the label.
ADJECTIVE_SUFFIXES = (
    "ed", "ful", "ous", "ive", "able", "ible", "less", "ic", "al", "ing", "y", "ent", "ant",
)  # fmt: skip
NOT_ADJECTIVE_SUFFIXES = ("ly", "ity", "ment", "ery", "ency", "ancy")
ADJECTIVES = frozenset(
    "bad good great nice fine poor sad glad cool fun fair safe sick weak wise rude cute "
    "dull dumb fake free kind mad nasty odd pure rich sore true vile worse worst best better "
    "brave calm clean clear cruel dead dear fresh grim harsh ideal keen lame mean neat proud "
    "rare smart sweet tense tough vague warm wrong awesome superb gross cheap brilliant "
    "excellent perfect decent gorgeous horrible terrible awful lovely ugly friendly unfriendly "
    "silly lonely deadly costly lively jolly holy smelly cowardly".split()
)

NOUNS = (
    "service", "food", "movie", "hotel", "staff", "app", "delivery", "product", "support",
    "room", "battery", "book", "meal", "show", "trip", "team", "price", "update",
)  # fmt: skip


@dataclass(frozen=True)
class Template:
    """One phrase pattern: ``{w}`` the word, ``{W}`` capitalised, ``{U}`` upper case, ``{noun}``."""

    name: str
    pattern: str
    negated: bool  # holds one of VADER's negations before the word
    boosters: int  # VADER booster words before the word ("very", "extremely", ...)
    adjectival: bool  # only for words that look like adjectives


TEMPLATES = (
    Template("bare", "{W}.", False, 0, False),
    Template("bare!", "{W}!", False, 0, False),
    Template("caps!", "{U}!", False, 0, False),
    Template("very", "Very {w}.", False, 1, True),
    Template("extremely", "Extremely {w}!", False, 1, True),
    Template("really", "It was really {w}.", False, 1, True),
    Template("so", "So {w}!", False, 1, True),
    Template("totally", "Totally {w}.", False, 1, True),
    Template("absolutely", "Absolutely {w}!", False, 1, True),
    Template("it-was", "It was {w}.", False, 0, True),
    Template("the-noun-was", "The {noun} was {w}.", False, 0, True),
    Template("w-noun", "{W} {noun}.", False, 0, True),
    Template("not", "Not {w}.", True, 0, True),
    Template("not-at-all", "Not {w} at all.", True, 0, True),
    Template("its-not", "It's not {w}.", True, 0, True),
    Template("wasnt", "It wasn't {w}.", True, 0, True),
    Template("the-noun-was-not", "The {noun} was not {w}.", True, 0, True),
)
ADJECTIVE_TEMPLATES_PER_WORD = 2
OTHER_TEMPLATES_PER_WORD = 1


@dataclass(frozen=True)
class Entry:
    """One lexicon row: mean valence (-4..4) and the individual ratings."""

    mean: float
    ratings: tuple[int, ...]


@dataclass(frozen=True)
class Derived:
    """One derived example (``source`` names which rule made it)."""

    text: str
    label: str
    source: str


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def parse_lexicon(text: str) -> dict[str, Entry]:
    """``token<TAB>mean<TAB>std<TAB>[ratings]`` lines (CRLF in the sdist) -> token: Entry."""
    out = {}
    for line in text.splitlines():
        fields = line.rstrip("\r").split("\t")
        if len(fields) == 4:
            ratings = tuple(int(r) for r in re.findall(r"-?\d+", fields[3]))
            out[fields[0]] = Entry(float(fields[1]), ratings)
    return out


def dissent(entry: Entry) -> int:
    """How many raters put the word on the other side of zero from the mean."""
    return sum(1 for r in entry.ratings if r * entry.mean < 0)


def usable_word(token: str, entry: Entry) -> bool:
    """A plain word of clear, agreed polarity (thresholds above)."""
    return bool(_WORD.fullmatch(token)) and abs(entry.mean) >= MIN_VALENCE and dissent(entry) <= MAX_DISSENT


def looks_adjectival(word: str) -> bool:
    """Suffix heuristic plus a short list; wrong sometimes ("ring"), which only costs fluency."""
    if word in ADJECTIVES:
        return True
    return len(word) >= 5 and word.endswith(ADJECTIVE_SUFFIXES) and not word.endswith(NOT_ADJECTIVE_SUFFIXES)


def rule_valence(valence: float, template: Template) -> float:
    """The word's valence after the template's VADER rules: boosters grow |v|, negation * N_SCALAR."""
    v = valence + (BOOST if valence > 0 else -BOOST) * template.boosters
    return v * N_SCALAR if template.negated else v


def label_of(valence: float) -> str:
    """Sign of the rule-adjusted valence; usable words never reach 0, so no neutrals here."""
    return "positive" if valence > 0 else "negative"


def choose_templates(word: str) -> list[Template]:
    """The word's templates: eligible ones ranked by sha1(word, template), first few taken."""
    adjectival = looks_adjectival(word)
    eligible = [t for t in TEMPLATES if adjectival or not t.adjectival]
    count = ADJECTIVE_TEMPLATES_PER_WORD if adjectival else OTHER_TEMPLATES_PER_WORD
    return sorted(eligible, key=lambda t: _sha1(f"{word}\t{t.name}"))[:count]


def render(template: Template, word: str) -> str:
    """The phrase; the noun, when there is one, is fixed by sha1 of the word."""
    noun = NOUNS[int(_sha1(word), 16) % len(NOUNS)]
    return template.pattern.format(w=word, W=word.capitalize(), U=word.upper(), noun=noun)


def lexicon_phrases(lexicon: Mapping[str, Entry]) -> list[Derived]:
    """Every usable word's phrases, words in sorted order."""
    out = []
    for word in sorted(lexicon):
        if usable_word(word, lexicon[word]):
            for template in choose_templates(word):
                label = label_of(rule_valence(lexicon[word].mean, template))
                out.append(Derived(render(template, word), label, LEXICON_SOURCE))
    return out


_TOKEN = re.compile(r"[a-z][a-z']*")


def has_lexicon_word(text: str, lexicon: Mapping[str, object]) -> bool:
    """Any lower-cased word (apostrophes kept, "isn't") or punctuation-stripped token in the
    lexicon, also in American spelling: the lexicon says "favorable", the Ding "favourable"."""
    lowered = text.lower()
    tokens = set(_TOKEN.findall(lowered)) | {t.strip(".,!?;:\"'()") for t in lowered.split()}
    tokens |= {t.replace("our", "or") for t in tokens}
    return any(t in lexicon for t in tokens)


NEUTRAL_MIN_WORDS, NEUTRAL_MAX_WORDS = 3, 12
NEUTRAL_TARGET = 6000


def neutral_sentences(
    texts: Iterable[str],
    lexicon: Mapping[str, object],
    compound: Callable[[str], float],
    target: int = NEUTRAL_TARGET,
) -> list[Derived]:
    """Neutral by VADER's rules: 3-12 words, no lexicon word, compound exactly 0; the `target`
    texts with the smallest sha1 (a fixed sample, independent of input order), sorted by text."""
    kept = {
        t
        for t in texts
        if NEUTRAL_MIN_WORDS <= len(t.split()) <= NEUTRAL_MAX_WORDS
        and not has_lexicon_word(t, lexicon)
        and compound(t) == 0
    }
    chosen = sorted(kept, key=_sha1)[:target]
    return [Derived(t, "neutral", NEUTRAL_SOURCE) for t in sorted(chosen)]


def match_form(text: str) -> str:
    """The form texts are compared in: case-folded words only ("Awful!" == "awful")."""
    return " ".join(re.findall(r"[^\W_]+(?:'[^\W_]+)?", text.casefold()))


def decontaminate(derived: Iterable[Derived], forbidden: Iterable[str]) -> list[Derived]:
    """Drop derived texts whose `match_form` is a forbidden text's (evaluation sets, human
    texts: the human row wins) or an earlier derived text's."""
    seen = {match_form(t) for t in forbidden}
    out = []
    for ex in derived:
        form = match_form(ex.text)
        if form and form not in seen:
            seen.add(form)
            out.append(ex)
    return out
