"""A requested language code as a model names it.

Checkpoints name languages their own way: M2M100 `fr`, mBART `fr_XX`, NLLB `fra_Latn` (ISO 639-3
and a script). A request may give the model's code, its primary subtag when that is unique
(`fra`), or the two-letter ISO 639-1 code LibreTranslate clients send (`fr`), mapped to 639-3.
"""

from __future__ import annotations

from service.errors import InvalidInput

# ISO 639-1 -> the 639-3 code NLLB-200 uses, for the languages with both (NLLB names Arabic
# `arb`, Persian `pes`, Malay `zsm`, Swahili `swh`, Estonian `est`, Latvian `lvs`).
ISO_639_3 = {
    "af": "afr", "am": "amh", "ar": "arb", "az": "azj", "be": "bel", "bg": "bul", "bn": "ben",
    "bs": "bos", "ca": "cat", "cs": "ces", "cy": "cym", "da": "dan", "de": "deu", "el": "ell",
    "en": "eng", "eo": "epo", "es": "spa", "et": "est", "eu": "eus", "fa": "pes", "fi": "fin",
    "fr": "fra", "ga": "gle", "gl": "glg", "gu": "guj", "he": "heb", "hi": "hin", "hr": "hrv",
    "hu": "hun", "hy": "hye", "id": "ind", "is": "isl", "it": "ita", "ja": "jpn", "ka": "kat",
    "kk": "kaz", "km": "khm", "kn": "kan", "ko": "kor", "lo": "lao", "lt": "lit", "lv": "lvs",
    "mk": "mkd", "ml": "mal", "mr": "mar", "ms": "zsm", "mt": "mlt", "my": "mya", "nb": "nob",
    "ne": "npi", "nl": "nld", "pa": "pan", "pl": "pol", "pt": "por", "ro": "ron", "ru": "rus",
    "sk": "slk", "sl": "slv", "sq": "als", "sr": "srp", "sv": "swe", "sw": "swh", "ta": "tam",
    "te": "tel", "th": "tha", "tl": "tgl", "tr": "tur", "uk": "ukr", "ur": "urd", "uz": "uzn",
    "vi": "vie", "zh": "zho",
}  # fmt: skip


def _primary(code: str) -> str:
    return code.split("_")[0].split("-")[0].lower()


def resolve(kind: str, asked: str | None, known: list[str]) -> str:
    """`asked` as one of the model's codes `known` ("" entries are not codes); InvalidInput if
    none or several match."""
    codes = [k for k in known if k]
    if asked is None:
        raise InvalidInput(f"this model needs a {kind} language (one of {', '.join(sorted(codes))})")
    if asked in codes:
        return asked
    for primary in (asked.lower(), ISO_639_3.get(asked.lower())):
        matches = [k for k in codes if _primary(k) == primary]
        if len(matches) == 1:
            return matches[0]
    shown = ", ".join(sorted(codes)[:12]) + (", …" if len(codes) > 12 else "")
    raise InvalidInput(f"unknown {kind} language for this model (it has {shown})")


def check(kind: str, asked: str | None, known: list[str]) -> None:
    """A model of one language pair takes its own code or none."""
    if asked is not None and known and resolve(kind, asked, known) not in known:
        raise InvalidInput(f"this model translates {kind} language {known[0]!r} only")
