"""The sequence-to-sequence plug-ins on the tiny translator: translation cuts texts into framed,
masked sentences and joins their translations back; text-to-text reads each text whole. The
task streams its progress and answers from the same events."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.seq2seq import Generated, Preparation, Prepared, SourceOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.metrics import Metrics
from service.scheduling.progress import Finished
from service.settings import Settings
from service.store import StoreEntry, scan
from service.tasks.base import TaskContext, Work
from service.tasks.seq2seq import Done, Piece, Seq2SeqTask
from service.tasks.translation import DecodeOptions, TranslationTask
from tests.conftest import CHECKED_TEXTS
from tests.tiny import expected_translation

TEXT = "The cat sees a dog. A dog runs.\nOpen the window."
MASKED = "The cat 5 sees http://example.org a dog."
SHORT = "A dog runs.\nOpen the window."  # two lines whole: within the tiny model's 23 source tokens
NUMBER = "The cat 5 sees a dog."  # its number a protected span


@pytest.fixture(scope="module")
def entry(tiny_store: Path) -> StoreEntry:
    return max((e for e in scan(tiny_store) if e.name == "tiny-mt"), key=lambda e: e.version)


@pytest.fixture(scope="module")
def mt(entry: StoreEntry) -> TranslatorEngine:
    return load_translator(entry, LoadOptions(threads=1))


def test_translation_splits_lines_and_sentences_and_joins_them_back(mt: TranslatorEngine) -> None:
    prepared = mt.translation.prepare([TEXT, MASKED], SourceOptions())
    assert prepared.owner == [0, 0, 0, 1]  # three sentences on two lines, then one
    assert prepared.sources[0] == mt.codec.encode(["The cat sees a dog."])[0]
    assert mt.translation.prepare([NUMBER], SourceOptions()).sources != mt.codec.encode([NUMBER])  # 5 masked
    greedy = DecodeParams(beam_size=1, max_new_tokens=24)
    got = mt.generate(mt.translation, [TEXT, MASKED], greedy)
    assert [row[0].text for row in got] == [expected_translation(TEXT), expected_translation(MASKED)]
    assert got == mt.translate([TEXT, MASKED], greedy)


def test_text_to_text_reads_the_whole_text_as_one_source(mt: TranslatorEngine) -> None:
    prepared = mt.whole_text.prepare([SHORT, NUMBER], SourceOptions())
    assert prepared.sources == mt.codec.encode([SHORT, NUMBER])  # nothing split, nothing masked
    assert prepared.owner == [0, 1] and prepared.forced == ()
    params = DecodeParams(beam_size=3, num_hypotheses=2, max_new_tokens=24)
    got = mt.generate(mt.whole_text, [SHORT, NUMBER], params)
    hyps = mt.translate_ids(mt.codec.encode([SHORT, NUMBER]), params)
    assert got == [[Generated(mt.codec.decode(h.tokens), h.score, h.logprob, h.finish_reason) for h in r] for r in hyps]
    assert len(got[0]) == 2


class WholeTextTask(TranslationTask):
    """The translation task's options and answers over the text-to-text plug-in (not registered)."""

    @staticmethod
    def plug_in(engine: TranslatorEngine) -> Preparation[Prepared]:
        return engine.whole_text


@pytest.mark.parametrize("cls", [TranslationTask, WholeTextTask])
def test_a_stream_s_pieces_make_the_one_shot_answer(
    tiny_store: Path, entry: StoreEntry, mt: TranslatorEngine, cls: type[Seq2SeqTask]
) -> None:
    """Greedy: each source's pieces, in order, are its hypothesis; each piece says the text its
    row reads so far; `Done`, last, is what `run` answers."""
    settings = Settings(model_store=tiny_store, threads=1)
    texts = [SHORT, *CHECKED_TEXTS[:3]]
    options = DecodeOptions(decode="greedy", max_new_tokens=24)

    async def main() -> tuple[list[object], list[object]]:
        task = cls.load(entry, LoadOptions(threads=1), TaskContext(settings, Metrics().observer(entry.name)))
        task.start()
        work = Work(texts, options, time.monotonic() + 30)
        events = [e async for e in task.stream(work, tokens=True)]
        one_shot = await task.run(work)
        await task.close(1)
        return events, one_shot.rows

    events, one_shot = asyncio.run(asyncio.wait_for(main(), 60))
    done = events[-1]
    assert isinstance(done, Done) and done.outputs == one_shot
    assert not [e for e in events[:-1] if isinstance(e, Done)]
    pieces: dict[int, list[int]] = {}
    finished: set[int] = set()
    for e in events[:-1]:
        if isinstance(e, Piece):
            assert e.source not in finished  # its tokens, then its end
            assert e.text == done.prepared.owner[e.source]
            pieces.setdefault(e.source, []).extend(e.ids)
            assert e.so_far == mt.codec.decode(pieces[e.source])
        else:
            assert isinstance(e, Finished)
            finished.add(e.source)
    assert finished == set(range(len(done.prepared.sources)))
    assert {s: tuple(ids) for s, ids in pieces.items()} == {s: h[0].tokens for s, h in enumerate(done.hypotheses)}
    if cls is WholeTextTask:  # one source a text: its last piece's text is its answer
        last = {e.text: e.so_far for e in events if isinstance(e, Piece)}
        assert [last[i] for i in range(len(texts))] == [row[0].text for row in one_shot]
    else:
        assert [row[0].text for row in one_shot] == [expected_translation(t) for t in texts]
