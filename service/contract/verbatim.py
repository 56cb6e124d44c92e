"""Words a translation keeps as written: identifiers, inline code, personal names, quoted spans, dashes.

Unlike the spans of `service.contract.spans` (a format string or a URL is never translated), these
are only *usually* kept: a reference may write ``COMBIN`` as ``KOMBINATIONEN`` or ``Monday`` as
``Montag``. So training masks such a candidate only where the reference keeps it verbatim (the
model then learns both: copy the placeholder, translate the word it saw unmasked), and the service
masks every candidate, so whatever it finds comes back exactly as written.

Candidates, found on the source text alone:
  code      inline code: ```make install```, GNU's ```make install'``
  caps      all-capital identifiers of two or more letters: ``HOME``, ``PATH_MAX``, ``UTF8`` (not
            in a text shouting in capitals: three or more capital words there are words)
  snake     ``snake_case``, ``max_len2``; camelCase and PascalCase: ``maxLength``, ``GtkWindow``,
            ``iPhone``; calls: ``malloc()``, ``os.path.join()``
  name      a capitalised word the tokenizer holds neither as a whole word nor in lower case
            (``Siobhan``, ``François``, ``Jürgen``), outside title-case labels (``Voronoi Diagram``);
            never a day, a month, a language or a country (`TRANSLATED`: those have German names),
            and, where the model says which (`common_words`), never a word its training text
            writes in lower case: an 8000-piece vocabulary lacks ``Tasks`` and ``Subtotals`` whole,
            and masking them cost 3 BLEU on the sentences that had one
  dashes    a free-standing run of hyphens: the ``--`` of ``option -- '%c'``
  quotes    any span or candidate directly inside a pair of quotes, quotes included: ``'%c'``,
            ``‘--help’``, ``"HOME"`` (so GNU quoting survives as written)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_UPPER = "A-ZÀ-ÖØ-Þ"
_LOWER = "a-zß-öø-ÿ"
_RULES: tuple[tuple[str, str], ...] = (
    ("code", r"`[^`\n]+`|`[^`'\n]+'"),
    ("snake", r"(?<![\w.])[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+(?:\(\))?(?![\w])"),
    ("snake", r"(?<![\w.])[a-z]+[A-Z][A-Za-z0-9]*(?![\w])|(?<![\w.])[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*(?![\w'’-])"),
    ("snake", r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+)*\(\)"),
    ("caps", r"(?<![\w-])[A-Z][A-Z0-9]*[A-Z][A-Z0-9]*(?![\w-])"),
    (
        "name",
        rf"(?<![\w'’-])[{_UPPER}](?:[{_LOWER}]+|(?=['’][{_UPPER}]))(?:['’-][{_UPPER}]?[{_LOWER}]+)*(?![\w'’-])",
    ),
    ("dashes", r"(?<!\S)-{2,}(?!\S)"),
)
TRANSLATED = frozenset(
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July "
    "August September October November December English German French Spanish Italian Dutch Portuguese "
    "Russian Polish Swedish Danish Norwegian Finnish Greek Turkish Chinese Japanese Korean Arabic Hebrew "
    "Germany France Spain Italy Netherlands Austria Switzerland Belgium Poland Sweden Denmark Norway "
    "Finland Greece Turkey Russia China Japan Korea Europe European America American Africa Asia Australia "
    "Christmas Easter".split()
)
_PATTERN = re.compile("|".join(f"(?P<{kind}{i}>{rx})" for i, (kind, rx) in enumerate(_RULES)))
_WORD = re.compile(r"[^\W\d_]{2,}")
_QUOTES = {"'": "'", "‘": "’", '"': '"', "“": "”", "„": "“", "«": "»", "»": "«", "`": "'", "‚": "‘"}


@dataclass(frozen=True)
class Candidate:
    start: int
    end: int
    kind: str


def whole_words(pieces: Iterable[str], marker: str = "▁") -> frozenset[str]:
    """The words a vocabulary holds whole: its pieces that begin with the word marker."""
    return frozenset(p[len(marker) :] for p in pieces if p.startswith(marker) and len(p) > len(marker))


_LOWER_WORD = re.compile(rf"(?<![\w'’-])[{_LOWER}]+(?![\w-])")  # "couldn" of "couldn't" too
COMMON_MIN_COUNT = 2  # a word written in lower case once may be a name in a command line


def common_words(texts: Iterable[str], min_count: int = COMMON_MIN_COUNT) -> frozenset[str]:
    """The words `texts` write in lower case at least `min_count` times: words, not names."""
    counts: dict[str, int] = {}
    for text in texts:
        for word in _LOWER_WORD.findall(text):
            counts[word] = counts.get(word, 0) + 1
    return frozenset(w for w, n in counts.items() if n >= min_count)


def _known(word: str, words: frozenset[str]) -> bool:
    """A word of the vocabulary, in lower case or as written; "Couldn't", "Let’s": the part before
    the apostrophe."""
    head = re.split("['’]", word, maxsplit=1)[0]
    return any(w in words for w in (word, word.lower(), head, head.lower()))


def candidates(text: str, words: frozenset[str] | None, spans: Iterable[tuple[int, int]] = ()) -> list[Candidate]:
    """The candidates of `text`, left to right, non-overlapping; `words` (the tokenizer's whole
    words, with the model's `common_words` where it has them) enables names; `spans`, the
    protected spans found by the strict rules, become `quoted` candidates when quotes enclose
    them directly."""
    letters = _WORD.findall(text)
    shouting = sum(w.isupper() for w in letters) >= 3 and sum(w.isupper() for w in letters) * 2 >= len(letters)
    title = len(letters) >= 2 and all(w[0].isupper() for w in letters)
    found: list[Candidate] = []
    for m in _PATTERN.finditer(text):
        kind = (m.lastgroup or "x").rstrip("0123456789")
        word = m.group()
        if kind == "caps" and shouting:
            continue
        if kind == "name" and (words is None or title or word in TRANSLATED or _known(word, words)):
            continue
        found.append(Candidate(m.start(), m.end(), kind))
    inner = sorted([*((s, e) for s, e in spans), *((c.start, c.end) for c in found)])
    quoted = [Candidate(s - 1, e + 1, "quotes") for s, e in inner if _enclosed(text, s, e)]
    return _outermost(quoted + found)


_QUOTED = re.compile(
    "|".join(
        rf"(?<![^\s(\[{{]){re.escape(o)}(?=\S)[^\n{re.escape(o + c)}]+(?<=\S){re.escape(c)}(?![^\s.,;:!?)\]}}])"
        for o, c in _QUOTES.items()
    )
)


def quoted(text: str) -> list[tuple[int, int]]:
    """Where `text` quotes something, quotes included, left to right, on one line: an opening quote
    at the start or after a space or bracket, its closing quote (`_QUOTES`) before the end, a space
    or punctuation; the inner text neither starts nor ends with a space (so "don't" opens none)
    and holds neither quote (a backtick of ```x``` never pairs with the apostrophe of "users'")."""
    return [(m.start(), m.end()) for m in _QUOTED.finditer(text)]


def _enclosed(text: str, start: int, end: int) -> bool:
    if start == 0 or end >= len(text):
        return False
    close = _QUOTES.get(text[start - 1])
    return close is not None and text[end] == close and text[start - 1] != text[start] and text[end - 1] != close


def _outermost(found: list[Candidate]) -> list[Candidate]:
    """Left to right; a candidate inside or overlapping an earlier, longer one is dropped."""
    out: list[Candidate] = []
    for c in sorted(found, key=lambda c: (c.start, -c.end)):
        if out and c.start < out[-1].end:
            continue
        out.append(c)
    return out


def kept_in(target: str, word: str) -> list[tuple[int, int]]:
    """Where `target` holds `word` as written and not inside a longer word."""
    pattern = (r"(?<!\w)" if word[0].isalnum() else "") + re.escape(word) + (r"(?!\w)" if word[-1].isalnum() else "")
    return [(m.start(), m.end()) for m in re.finditer(pattern, target)]
