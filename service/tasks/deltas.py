"""A sequence-to-sequence request's progress as each text's output, delta by delta (streaming).

The scheduler's events (`seq2seq.Piece`, `Finished`, `Done`) say what each source's rows read so
far and when a source ends; a client wants each input text's output, and only what is final:
the concatenated deltas of a text equal, byte for byte, the text the same request answers
whole. So a text shows, in order, its finished sources' outputs and what is final of its next
one (the plug-in's `visible`: spans restored whole, layout kept), and a row's text so far counts
only where it agrees with its previous reading (incremental detokenization: a tokenizer's
clean-up may still change the end) and never ends in half a character. The best hypothesis
only: a stream has one output per text. Pure: no scheduler, no HTTP.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from os.path import commonprefix
from typing import Any

from service.engine.seq2seq import Generated, Preparation, Prepared
from service.tasks.base import Work
from service.tasks.seq2seq import Done, Finished, Piece, Progress, Seq2SeqTask

REPLACEMENT = "\ufffd"  # what a decoder reads for bytes that are not yet a whole character


@dataclass(frozen=True)
class Delta:
    """More of text `index`'s output."""

    index: int
    text: str


@dataclass(frozen=True)
class Ended:
    """Text `index`'s output is complete (after its last delta); `output` as the answer gives it;
    `source_tokens` and `tokens`, what the model read and generated for it (usage)."""

    index: int
    output: Generated
    source_tokens: int = 0
    tokens: int = 0


TextEvent = Delta | Ended


class Diverged(RuntimeError):
    """What was streamed is not the start of the answer: a plug-in showed text before it was final."""


def settled(previous: str, current: str) -> str:
    """What of a row's text is final: the part two readings agree on, without a trailing half character."""
    return commonprefix([previous, current]).rstrip(REPLACEMENT)


class Deltas:
    """One request's texts as they become final: `feed` each progress event, get the deltas it makes."""

    def __init__(
        self, preparation: Preparation[Any], prepared: Prepared, texts: int, decode: Callable[[Sequence[int]], str]
    ) -> None:
        self.preparation, self.prepared, self.decode = preparation, prepared, decode
        self.sources: list[list[int]] = [[] for _ in range(texts)]
        for source, owner in enumerate(prepared.owner):
            self.sources[owner].append(source)
        self.outputs: dict[int, str] = {}  # a finished source's best output, decoded
        self.readings: dict[int, tuple[str, str]] = {}  # a running source's last reading and its final part
        self.shown = [""] * texts

    def feed(self, event: Progress) -> list[TextEvent]:
        if isinstance(event, Piece):
            if event.row:  # a stream shows one output per text: a sampled source's first draw
                return []
            last, _ = self.readings.get(event.source, ("", ""))
            self.readings[event.source] = (event.so_far, settled(last, event.so_far))
            return self._show(event.text)
        if isinstance(event, Finished):
            best = event.hypotheses[0].tokens if event.hypotheses else []
            self.outputs[event.source] = self.decode(best)
            return self._show(self.prepared.owner[event.source])
        return self._end(event)

    def _show(self, index: int) -> list[TextEvent]:
        sources = self.sources[index]
        outputs = []
        for source in sources:
            if source not in self.outputs:
                break
            outputs.append(self.outputs[source])
        partial = self.readings.get(sources[len(outputs)], ("", ""))[1] if len(outputs) < len(sources) else ""
        now = self.preparation.visible(self.prepared, index, outputs, partial)
        return self._grow(index, now)

    def _grow(self, index: int, now: str) -> list[TextEvent]:
        shown = self.shown[index]
        if len(now) <= len(shown) or not now.startswith(shown):
            return []
        self.shown[index] = now
        return [Delta(index, now[len(shown) :])]

    def _end(self, done: Done) -> list[TextEvent]:
        out: list[TextEvent] = []
        for index, row in enumerate(done.outputs):
            best = row[0]
            if not best.text.startswith(self.shown[index]):
                raise Diverged(f"text {index}: streamed {self.shown[index]!r}, answer {best.text!r}")
            out += self._grow(index, best.text)
            read, generated = usage(done, index, 1)
            out.append(Ended(index, best, read, generated))
        return out


def usage(done: Done, index: int, n: int) -> tuple[int, int]:
    """Text `index`'s tokens read (its sources, framed) and generated (EOS included) for its `n`
    best outputs (each output takes one hypothesis of each of its sources)."""
    sources = [k for k, owner in enumerate(done.prepared.owner) if owner == index]
    read = sum(len(done.prepared.sources[k]) for k in sources)
    generated = sum(len(h.tokens) + int(h.finished) for k in sources for h in done.hypotheses[k][:n])
    return read, generated


def text_deltas(task: Seq2SeqTask[Any, Any], work: Work) -> AsyncGenerator[TextEvent, None]:
    """The work's texts as they become final: each text's deltas, then, once the answer is
    assembled, each text's `Ended`. Refused now (busy, a bad text or option), not at the first
    read; closing it frees its rows at the next step."""
    prepared, progress = task.open(work, tokens=True)
    return _read(Deltas(task.preparation, prepared, len(work.texts), task.engine.codec.decode), progress)


async def _read(texts: Deltas, progress: AsyncGenerator[Progress, None]) -> AsyncGenerator[TextEvent, None]:
    async with contextlib.aclosing(progress) as events:
        async for event in events:
            for out in texts.feed(event):
                yield out
