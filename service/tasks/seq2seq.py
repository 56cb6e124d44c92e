"""The sequence-to-sequence task: any encoder-decoder model served by the step scheduler.

A request's texts become sources through the task's plug-in (`service.engine.seq2seq.Preparation`:
translation splits sentences, masks spans and adds language tokens; text-to-text reads each text
whole), each source gets its search (the request's decode parameters; a sampled source its own
seed), and the step scheduler decodes them, publishing progress as it goes
(`service.scheduling.progress`). `stream(work)` yields that progress and, last, the answer the
plug-in assembles (`Done`); `run(work)` is that last event: a one-shot answer and a stream read
the same events. Knows nothing about sentences, spans or languages (it hands the request's
source options to the plug-in unread), nor about any protocol.
"""

from __future__ import annotations

import contextlib
import time
from abc import abstractmethod
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from service.contract.manifest import Generation
from service.engine.decoding import DecodeParams, Hypothesis, Search
from service.engine.running import DecoderBatch
from service.engine.runtime import LoadOptions
from service.engine.seq2seq import Generated, Preparation, Prepared, SourceOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.scheduling import policy
from service.scheduling.progress import Finished, Tokens
from service.scheduling.stepper import Job, Sentence, StepLimits, StepScheduler
from service.store import StoreEntry
from service.tasks.base import Q, R, Task, TaskContext, Work
from service.tracing import Trace


class Decoding(Protocol):
    """A request's options as this task reads them (the task's `Options`)."""

    def source_options(self) -> SourceOptions: ...

    def params(self, model_limit: int, sentence: int, defaults: Generation | None = None) -> DecodeParams: ...


@dataclass(frozen=True)
class Piece:
    """Tokens one row of a source chose (`progress.Tokens`), and the text that row reads so far
    (decoded on the reader's side, not the scheduler's; a translated sentence's with its spans
    still masked: they are restored in the answer)."""

    text: int  # the input text the source belongs to
    source: int
    row: int
    ids: tuple[int, ...]
    so_far: str


@dataclass(frozen=True)
class Done:
    """A request's last event: its sources, each source's hypotheses, and per text its n-best outputs."""

    prepared: Prepared
    hypotheses: list[list[Hypothesis]]
    outputs: list[list[Generated]]


Progress = Piece | Finished | Done
T = TypeVar("T")


class Seq2SeqTask(Task[Q, R]):
    """One sequence-to-sequence model version and its step scheduler; `preparation`, its plug-in."""

    def __init__(self, entry: StoreEntry, engine: TranslatorEngine, context: TaskContext) -> None:
        super().__init__(entry, engine.variant)
        self.engine = engine
        self.preparation = self.plug_in(engine)
        s, obs = context.settings, context.metrics
        limits = StepLimits(
            s.step_max_rows,
            s.step_max_cache_tokens,
            s.max_queue,
            express_share=s.step_express_share,
            express_work=s.step_express_work,
            express_few=s.step_express_few,
        )

        def make_batch() -> DecoderBatch[Sentence]:
            if not limits.express_share:
                return engine.new_batch(timer=obs.compute_time)
            return engine.new_lanes(timer=obs.compute_time)  # the scheduler's policy names the lanes

        self.queue = StepScheduler(entry.name, make_batch, limits, obs)

    @classmethod
    def load(cls, entry: StoreEntry, options: LoadOptions, context: TaskContext) -> Seq2SeqTask:
        engine = load_translator(entry, options)
        engine.warmup()
        return cls(entry, engine, context)

    @staticmethod
    @abstractmethod
    def plug_in(engine: TranslatorEngine) -> Preparation[Any]:
        """How this task's texts become the engine's sources and its outputs texts again."""

    def start(self) -> None:
        self.queue.start()

    async def close(self, timeout: float) -> None:
        await self.queue.close(timeout)

    @property
    def in_flight(self) -> int:
        return self.queue.in_flight

    def sources(self, texts: Sequence[str], options: Decoding) -> tuple[Prepared, list[Search], DecodeParams]:
        """The texts' sources (the plug-in's), each one's search, and the request's parameters:
        the same for every source, but for sampling's seeds (each source draws from its own
        generator); each search holds its source's placeholders, if the plug-in has any."""
        engine = self.engine
        prepared = self.preparation.prepare(texts, options.source_options())
        limit, defaults = engine.max_new_tokens, engine.generation
        first = options.params(limit, 0, defaults)  # the options hold for this model even with no source
        searches = [
            engine.search(
                options.params(limit, k, defaults) if k and first.sample else first,
                forced=prepared.forced,
                placeholders=prepared.placeholders_of(k),
            )
            for k in range(len(prepared.sources))
        ]
        return prepared, searches, first

    async def stream(self, work: Work, tokens: bool = False) -> AsyncGenerator[Progress, None]:
        """The work's progress: with `tokens`, each token its greedy and sampled rows choose
        (`Piece`); each source's `Finished`; last, `Done` with the answer. A reader that stops
        reading (cancelled, or closing the stream: `contextlib.aclosing`) frees its rows at the
        next step. With `work.trace`, its parts become children of the request's span: tokenize,
        queue (submitted to the encoder run), encoder, decode (first join to last leave: steps,
        rows, lane), assembly; whichever way it is read (whole, or streamed by any protocol)."""
        _, events = self.open(work, tokens)
        async with contextlib.aclosing(events) as progress:
            async for event in progress:
                yield event

    def open(self, work: Work, tokens: bool = False) -> tuple[Prepared, AsyncGenerator[Progress, None]]:
        """The work's sources and its `stream`, refused now (busy, a bad text or option) rather
        than at its first read: a streamed answer's errors before its first byte."""
        self.queue.refuse_if_busy(work.deadline)
        trace = work.trace
        t0 = time.time_ns() if trace is not None else 0
        prepared, searches, first = self.sources(work.texts, cast(Decoding, work.options))
        if trace is not None:
            t0 = trace_sources(trace, t0, prepared.sources)
        return prepared, self._progress(prepared, searches, first, work.deadline, tokens, trace, t0)

    async def _progress(
        self,
        prepared: Prepared,
        searches: list[Search],
        first: DecodeParams,
        deadline: float,
        tokens: bool,
        trace: Trace | None = None,
        submitted_ns: int = 0,
    ) -> AsyncGenerator[Progress, None]:
        items = list(zip(prepared.sources, searches, strict=True))
        jobs: list[Job] | None = [] if trace is not None else None
        hyps: list[list[Hypothesis]] = [[] for _ in items]
        codec = self.engine.codec
        so_far: dict[tuple[int, int], list[int]] = {}
        if items:
            try:
                for start, part in phases(items, tokens):
                    # closed with this stream (its reader left): the scheduler frees the rows at once
                    async with contextlib.aclosing(self.queue.stream(part, deadline, tokens, jobs)) as progress:
                        async for events in progress:
                            for event in events:
                                source = event.source + start
                                if isinstance(event, Tokens):
                                    row = so_far.setdefault((source, event.row), [])
                                    row += event.ids
                                    owner = prepared.owner[source]
                                    yield Piece(owner, source, event.row, event.ids, codec.decode(row))
                                else:
                                    hyps[source] = event.hypotheses
                                    yield event if not start else Finished(source, event.hypotheses)
            finally:
                if trace is not None and jobs:
                    express = policy.takes_express(jobs[0].sentences[0], self.queue.limits)
                    for job in jobs:
                        trace_job(trace, job, submitted_ns, time.time_ns(), express)
        t2 = time.time_ns() if trace is not None else 0
        outputs = self.preparation.assemble(prepared, hyps, first.length_penalty)
        if trace is not None:
            trace_outputs(trace, t2, hyps, outputs)
        yield Done(prepared, hyps, outputs)

    async def answer(self, work: Work) -> Done:
        """The work's answer: the last event of its `stream`."""
        async with contextlib.aclosing(self.stream(work)) as progress:
            async for event in progress:
                if isinstance(event, Done):
                    return event
        raise AssertionError("a stream ends with its answer")

    async def run(self, work: Work) -> Any:
        return (await self.answer(work)).outputs


def phases(items: list[T], streamed: bool) -> list[tuple[int, list[T]]]:
    """The parts a request's sources are decoded in, each with its first source's place: all at
    once, or for a stream its first source alone, then the rest. A stream is read in order, and
    beside its own 19 sentences a 20-sentence text's first came out at 0.68 of the whole answer's
    time (all of them sharing every step); alone it comes out after its own steps, the rest then
    decoding together (docs/results.md#streaming)."""
    if not streamed or len(items) < 2:
        return [(0, items)]
    return [(0, items[:1]), (1, items[1:])]


def trace_sources(trace: Trace, started_ns: int, sources: Sequence[Sequence[int]]) -> int:
    """The tokenize span and the request's input figures; returns when the sources were ready."""
    ready = time.time_ns()
    tokens_in = sum(len(ids) for ids in sources)
    trace.child("tokenize", started_ns, ready, {"transformer_serve.sentences": len(sources)})
    trace.set({"gen_ai.usage.input_tokens": tokens_in})  # on the request's span only: an attribute is set once
    return ready


def trace_outputs(
    trace: Trace, started_ns: int, hyps: Sequence[Sequence[Hypothesis]], outputs: Sequence[Sequence[Generated]]
) -> None:
    """The assembly span and the request's output figures."""
    trace.child("assembly", started_ns, time.time_ns())
    trace.set(
        {
            "gen_ai.usage.output_tokens": sum(len(h[0].tokens) + int(h[0].finished) for h in hyps if h),
            "gen_ai.response.finish_reasons": sorted({row[0].finish_reason for row in outputs if row}),
        }
    )


def trace_job(trace: Trace, job: Job, submitted_ns: int, end_ns: int, express: bool) -> None:
    """A job's queue, encoder and decode spans from the marks its sentences left in the scheduler."""
    joined = [s.joined for s in job.sentences if s.joined is not None]
    left = [s.left for s in job.sentences if s.left is not None]
    encoder = sorted({s.encoder for s in job.sentences if s.encoder is not None})
    first = min(joined, default=None)
    queued_until = first.at_ns if first is not None else end_ns
    if encoder:
        queued_until = min(queued_until, encoder[0][0])
    trace.child("queue", submitted_ns, queued_until, {"transformer_serve.sentences": len(job.sentences)})
    if encoder:
        trace.child(
            "encoder", encoder[0][0], max(e[1] for e in encoder), {"transformer_serve.encoder_runs": len(encoder)}
        )
    if first is None:
        return
    last = max(left, default=None)
    trace.child(
        "decode",
        first.at_ns,
        last.at_ns if last is not None and len(left) == len(joined) else end_ns,
        {
            "transformer_serve.sentences": len(joined),
            "transformer_serve.sentences_finished": len(left),
            "transformer_serve.steps": (last.step if last is not None else first.step) - first.step,
            "transformer_serve.rows_at_join": first.rows,
            "transformer_serve.rows_at_leave": last.rows if last is not None else 0,
            "transformer_serve.lane": "express" if express else "main",
        },
    )
