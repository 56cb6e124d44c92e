"""What every document format gives the translation task: segments out, translations back in.

A format parses a file into a `Parsed`: the texts to translate (`segments`, plain text without
the format's markup, accelerators or protected structure) and a way to render the file again
from their translations. Everything between (masking, batching, deadlines) is the translation
task's, so a format never sees a model and is testable with any function that maps strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class DocumentError(ValueError):
    """A file the format cannot read; `line` (1-based) where it failed, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass(frozen=True)
class RenderInfo:
    """What a rendered file may record about its translation (a PO header, a translator comment)."""

    model: str
    version: int
    source_lang: str
    target_lang: str
    generator: str  # e.g. "transformer-serve 0.9"
    now: str  # ISO time "2026-12-01 19:45+0000", passed in so rendering stays pure


@dataclass(frozen=True)
class Rendered:
    data: bytes
    translated: int  # units (entries, paragraphs, cues) filled by the machine
    kept: int  # units left as they were (already translated, fuzzy, obsolete, not translatable)
    failed: int  # units whose translation was refused (a placeholder or accelerator lost) and left empty


class Parsed(Protocol):
    @property
    def segments(self) -> Sequence[str]:
        """The texts to translate, in file order (duplicates allowed)."""
        ...

    def render(self, translations: Sequence[str], info: RenderInfo) -> Rendered:
        """The file again with `translations[i]` for `segments[i]`."""
        ...


class Format(Protocol):
    name: str  # "po", "text", "srt", "html", "markdown"
    extensions: tuple[str, ...]  # lower case with the dot: (".po", ".pot")
    media_type: str  # of the rendered file, e.g. "text/x-gettext-translation; charset=utf-8"

    def parse(self, data: bytes) -> Parsed:
        """Raises `DocumentError` for a file it cannot read."""
        ...
