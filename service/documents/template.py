"""A file as raw text with holes for its segments: the shape text, SubRip and Markdown share.

Everything outside a hole is copied from the source, so a file comes back byte for byte but for
the translated runs, and a render with the segments themselves gives the input again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.documents.base import Rendered, RenderInfo

_LINE_BREAK = re.compile(r"\r?\n")


def choose(segments: Sequence[str], translations: Sequence[str]) -> list[str]:
    """The text each hole gets: an empty translation of a non-empty segment keeps the source, so
    a refused line stays readable and the file keeps its structure (the unit counts as failed)."""
    if len(translations) != len(segments):
        raise ValueError(f"{len(translations)} translations for {len(segments)} segments")
    return [s if _failed(s, t) else t for s, t in zip(segments, translations, strict=True)]


def count(units: Sequence[Sequence[int]], segments: Sequence[str], translations: Sequence[str]) -> tuple[int, int, int]:
    """(translated, kept, failed) units: a unit without segments is kept, one with any refused
    segment failed."""
    kept = sum(not unit for unit in units)
    failed = sum(any(_failed(segments[i], translations[i]) for i in unit) for unit in units if unit)
    return len(units) - kept - failed, kept, failed


def _failed(segment: str, translation: str) -> bool:
    return bool(segment.strip()) and not translation.strip()


@dataclass(frozen=True)
class Template:
    """A `Parsed`: `parts` are raw text or the index of a segment; a hole is one line's text, so
    a translation's line breaks become spaces (a line count per cue or block must not change)."""

    parts: tuple[str | int, ...]
    segments: tuple[str, ...]
    units: tuple[tuple[int, ...], ...]  # segment indexes per unit (line, cue, block)

    def render(self, translations: Sequence[str], info: RenderInfo) -> Rendered:
        chosen = [_LINE_BREAK.sub(" ", t) for t in choose(self.segments, translations)]
        text = "".join(p if isinstance(p, str) else chosen[p] for p in self.parts)
        return Rendered(text.encode("utf-8"), *count(self.units, self.segments, translations))


@dataclass
class Builder:
    """Collects a template in file order: raw text, holes, and the units they belong to."""

    parts: list[str | int] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    units: list[tuple[int, ...]] = field(default_factory=list)
    _unit: list[int] = field(default_factory=list)

    def raw(self, text: str) -> None:
        if text:
            self.parts.append(text)

    def hole(self, text: str) -> None:
        """`text` as a segment without its surrounding whitespace, which stays raw."""
        core = text.strip()
        if not core:
            self.raw(text)
            return
        start = text.index(core)
        self.raw(text[:start])
        self._unit.append(len(self.segments))
        self.parts.append(len(self.segments))
        self.segments.append(core)
        self.raw(text[start + len(core) :])

    def end_unit(self) -> None:
        self.units.append(tuple(self._unit))
        self._unit = []

    def build(self) -> Template:
        return Template(tuple(self.parts), tuple(self.segments), tuple(self.units))
