"""One message's text as the translator gets it, and the translation put back in its shape.

Leading and trailing whitespace (newlines included) and each line's own indentation stay where
they were; the accelerator mark comes out before translation and goes back after it; lines
without a letter (a bare `%s`, a rule of dashes) are copied, not translated. The translation
task splits lines and sentences again, but a message's lines are its segments here so that the
shape is rebuilt exactly whatever the model does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.contract import accelerators


@dataclass(frozen=True)
class Message:
    """`lines[i]` is (before, core, after); a core with a letter is a segment, in order."""

    lead: str
    lines: tuple[tuple[str, str, str], ...]
    trail: str
    letter: str | None  # the accelerated letter, or None
    mark: str | None

    @property
    def segments(self) -> list[str]:
        return [core for _, core, _ in self.lines if _translatable(core)]

    def join(self, translations: Sequence[str]) -> str:
        """The message again with its segments replaced by `translations`, in order."""
        it = iter(translations)
        body = "\n".join(b + (next(it) if _translatable(core) else core) + a for b, core, a in self.lines)
        if self.letter is not None and self.mark is not None:
            body = accelerators.insert(body, self.letter, self.mark)
        return self.lead + body + self.trail


def _translatable(core: str) -> bool:
    return any(c.isalpha() for c in core)


def split(text: str, mark: str | None) -> Message:
    """`text` taken apart: edges, lines, the accelerator of the catalog's `mark` (None: none)."""
    lead, body, trail = _edges(text)
    letter = None
    if mark is not None:
        body, letter = accelerators.strip(body, mark)
    lines = []
    for line in body.split("\n"):
        lines.append(_edges(line))
    return Message(lead, tuple(lines), trail, letter, mark)


def _edges(text: str) -> tuple[str, str, str]:
    """(leading whitespace, core, trailing whitespace): with `str.strip`, linear in the text (a
    lazy regex for the core backtracked quadratically on long inner runs of spaces)."""
    core = text.strip()
    if not core:
        return text, "", ""
    start = len(text) - len(text.lstrip())
    return text[:start], core, text[start + len(core) :]
