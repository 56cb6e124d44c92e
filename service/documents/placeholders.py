"""The format placeholders of a message, per the format flags gettext gives it: what a
translation must keep, as a multiset (their order may change: `%1$s` lets it)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

# gettext's c-format directives, with its `%<PRIu64>` macros; python-format's, with `%(name)s`;
# python-brace-format's `{name}` and `{0!r:>10}` (a doubled brace is a literal)
PATTERNS = {
    "c-format": re.compile(
        r"%(?:<PRI[A-Za-z0-9_]+>|(?:\d+\$)?[-+ #0'I]*(?:\d+|\*(?:\d+\$)?)?(?:\.(?:\d+|\*(?:\d+\$)?))?"
        r"(?:hh|h|ll|l|L|q|j|z|Z|t)?[diouxXeEfFgGaAcCsSpnm%])"
    ),
    "python-format": re.compile(r"%(?:\([^()]*\))?[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[hlL]?[diouxXeEfFgGcrsa%]"),
    "python-brace-format": re.compile(r"\{\{|\}\}|\{[^{}]*\}"),
}
LITERALS = {"{{", "}}"}


def formats(flags: Iterable[str]) -> list[str]:
    """The checked formats an entry's flags declare (`no-c-format` declares none)."""
    return [f for f in flags if f in PATTERNS]


def placeholders(text: str, kinds: Iterable[str]) -> Counter[str]:
    """Every placeholder of `text` in the formats `kinds`."""
    out: Counter[str] = Counter()
    for kind in kinds:
        out.update(p for p in PATTERNS[kind].findall(text) if p not in LITERALS)
    return out


def kept(source: str, translation: str, kinds: Iterable[str]) -> bool:
    kinds = list(kinds)
    return placeholders(source, kinds) == placeholders(translation, kinds)
