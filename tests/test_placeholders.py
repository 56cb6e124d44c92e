"""The masked-span guarantee (`decoding.Placeholders`): whatever the model prefers, each placeholder
its source holds is in every hypothesis exactly once and no other placeholder is, in greedy, beam
and sampled search, alone, in a batch and in a running batch; a limit reached first leaves the
missing spans to the end of the sentence, and the answer counts them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.engines import newest
from bench.search_drivers import decode
from service import store
from service.contract import spans
from service.engine import decoding
from service.engine.decoding import DecodeParams, Hypothesis, Placeholders, Search
from service.engine.running import RunningBatch
from service.engine.runtime import LoadOptions
from service.engine.seq2seq import SourceOptions
from service.engine.translator import TranslatorEngine, load_translator
from tests.fakes import BOS, EOS, PAD, FakeRuntime
from tests.tiny import expected_translation

VOCAB = 40
RESERVED = frozenset(range(28, 40))  # twelve placeholder ids
Row = tuple[int, tuple[int, ...]]  # (sentence, tokens generated so far)


@cache
def eager(seed: int, sentence: int, prefix: tuple[int, ...]) -> np.ndarray:
    """A model that wants to end at once: EOS the likeliest token at every step (about 0.9),
    placeholders next likeliest among the rest."""
    logits = np.random.default_rng([seed, sentence, *prefix]).normal(size=VOCAB)
    logits[[PAD, BOS]] = -30.0
    logits[EOS] += 8.0
    logits[sorted(RESERVED)] += 2.5
    return (logits - np.logaddexp.reduce(logits)).astype(np.float32)


def step_of(seed: int):  # type: ignore[no-untyped-def]
    """A step function (`bench.search_drivers.StepFn`) over `eager`: its state, each row's (sentence, prefix)."""

    def step(tokens: np.ndarray, state: list[Row], rows: np.ndarray) -> tuple[np.ndarray, list[Row]]:
        new = [(state[r][0], state[r][1] + (int(t),)) for r, t in zip(rows.tolist(), tokens.tolist(), strict=True)]
        return np.stack([eager(seed, sid, fed[1:]) for sid, fed in new]), new

    return step


def check(hyps: Sequence[Hypothesis], required: Sequence[int], limit: int, reserved: frozenset[int] = RESERVED) -> None:
    """Each hypothesis holds each required placeholder at most once and no other; one that ended
    (rather than reaching the limit) holds them all."""
    assert hyps
    for h in hyps:
        held = [t for t in h.tokens if t in reserved]
        assert len(held) == len(set(held)) and set(held) <= set(required), (h, required)
        if h.finished:
            assert set(held) == set(required), (h, required)
        else:
            assert len(h.tokens) == limit, h


params_strategy = st.one_of(
    st.builds(
        lambda k, n, lp: DecodeParams(beam_size=k, num_hypotheses=min(n, k), length_penalty=lp, max_new_tokens=20),
        st.integers(1, 4),
        st.integers(1, 4),
        st.sampled_from([0.0, 1.0, 1.5]),
    ),
    st.builds(
        lambda n, t, k, p, seed: DecodeParams(
            beam_size=1, sample=True, num_hypotheses=n, temperature=t, top_k=k, top_p=p, seed=seed, max_new_tokens=20
        ),
        st.integers(1, 3),
        st.sampled_from([0.5, 1.0, 2.0]),
        st.sampled_from([0, 1, 5]),
        st.sampled_from([0.5, 1.0]),
        st.integers(0, 2**31),
    ),
    st.builds(
        lambda k, ng, mn: DecodeParams(beam_size=k, no_repeat_ngram_size=ng, min_new_tokens=mn, max_new_tokens=20),
        st.integers(1, 3),
        st.integers(0, 2),
        st.integers(0, 3),
    ),
)
required_strategy = st.lists(st.sampled_from(sorted(RESERVED)), max_size=len(RESERVED), unique=True)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    cases=st.lists(st.tuples(params_strategy, required_strategy), min_size=1, max_size=6),
    vectorised=st.booleans(),
)
def test_every_placeholder_comes_back_exactly_once_alone_and_in_a_batch(
    seed: int, cases: list[tuple[DecodeParams, list[int]]], vectorised: bool
) -> None:
    """Greedy, beam (ranked for the batch at once, vectorised or not, and alone) and sampling: the
    model would end at once, yet every hypothesis ends only with all its placeholders, each once;
    a sentence decodes in a batch exactly as alone, and a beam ranked unmasked (masked only when
    its candidates hold a refused token) exactly as one always ranked masked."""
    default = decoding._VECTORISED_FROM
    decoding._VECTORISED_FROM = 1 if vectorised else 1000
    try:
        step = step_of(seed)

        def searches() -> list[Search]:
            return [Search(p, BOS, EOS, placeholders=Placeholders(tuple(r), RESERVED)) for p, r in cases]

        together = decode(step, [(i, ()) for i in range(len(cases))], searches())
        alone = [decode(step, [(i, ())], [s])[0] for i, s in enumerate(searches())]
        with mock.patch.object(Search, "penalised", property(lambda _: True)):  # beams always ranked masked
            masked = decode(step, [(i, ()) for i in range(len(cases))], searches())
    finally:
        decoding._VECTORISED_FROM = default
    assert together == alone == masked
    for (_, required), hyps in zip(cases, together, strict=True):
        check(hyps, required, 20)


def test_without_the_guarantee_the_eager_model_drops_them() -> None:
    """The same model unconstrained: it ends at once, and its sources' placeholders are lost
    (the property test above is not vacuous)."""
    step = step_of(0)
    params = [DecodeParams(beam_size=1), DecodeParams(beam_size=4)]
    for p in params:
        [hyps] = decode(step, [(0, ())], [Search(p, BOS, EOS)])
        assert hyps[0].tokens == () and hyps[0].finished
        [hyps] = decode(step, [(0, ())], [Search(p, BOS, EOS, placeholders=Placeholders((30, 33, 35), RESERVED))])
        assert sorted(t for t in hyps[0].tokens if t in RESERVED) == [30, 33, 35] and hyps[0].finished


@pytest.mark.parametrize(("beam", "sample"), [(1, False), (3, False), (1, True)])
def test_a_limit_reached_first_keeps_each_placeholder_at_most_once(beam: int, sample: bool) -> None:
    required = tuple(sorted(RESERVED))[:6]
    for limit in (1, 3, 6):
        p = DecodeParams(beam_size=beam, sample=sample, num_hypotheses=beam, max_new_tokens=limit)
        [hyps] = decode(step_of(1), [(0, ())], [Search(p, BOS, EOS, placeholders=Placeholders(required, RESERVED))])
        check(hyps, required, limit)
        assert not any(h.finished for h in hyps) or limit == 6


def test_placeholders_must_be_distinct_and_reserved() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Placeholders((30, 30), RESERVED)
    with pytest.raises(ValueError, match="reserved"):
        Placeholders((3,), RESERVED)


# -- in a running batch, sentences joining and leaving (tests/fakes.py) ----------------------------


RUNNING_VOCAB = 24
RUNNING_RESERVED = frozenset(range(14, 24))


def running_params(rng: random.Random) -> DecodeParams:
    kind = rng.randrange(3)
    if kind == 0:
        return DecodeParams(beam_size=1, max_new_tokens=16)
    if kind == 1:
        k = rng.randint(2, 4)
        return DecodeParams(beam_size=k, num_hypotheses=rng.randint(1, k), max_new_tokens=16)
    return DecodeParams(
        beam_size=1, sample=True, num_hypotheses=rng.randint(1, 3), seed=rng.randrange(999), max_new_tokens=16
    )


def run_alone(rt: FakeRuntime, src: list[int], search: Search) -> list[Hypothesis]:
    batch: RunningBatch[int] = RunningBatch(rt, PAD)  # type: ignore[arg-type]
    batch.join([src], [search], [0])
    out: list[Hypothesis] = []
    while batch.blocks:
        for _, hyps in batch.step():
            out = hyps
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_a_running_batch_keeps_the_guarantee_and_decodes_each_sentence_as_alone(seed: int) -> None:
    rng = random.Random(seed)
    rt = FakeRuntime(seed=rng.randrange(999), vocab=RUNNING_VOCAB, eos_bias=8.0)  # EOS likeliest from the start
    n = rng.randint(2, 8)
    params = [running_params(rng) for _ in range(n)]
    required = [tuple(rng.sample(sorted(RUNNING_RESERVED), rng.randint(0, 6))) for _ in range(n)]
    srcs = [[100 + i, *required[i], EOS] for i in range(n)]

    def search(i: int) -> Search:
        return Search(params[i], BOS, EOS, placeholders=Placeholders(required[i], RUNNING_RESERVED))

    want = [run_alone(rt, srcs[i], search(i)) for i in range(n)]
    batch: RunningBatch[int] = RunningBatch(rt, PAD)  # type: ignore[arg-type]
    got: dict[int, list[Hypothesis]] = {}
    pending = list(range(n))
    while pending or batch.blocks:
        k = rng.randint(0 if batch.blocks else 1, 3)  # the arrival schedule
        joining, pending = pending[:k], pending[k:]
        batch.join([srcs[i] for i in joining], [search(i) for i in joining], joining)
        got.update(batch.step())
    batch.close()
    assert [got[i] for i in range(n)] == want
    for i in range(n):
        check(got[i], required[i], 16, RUNNING_RESERVED)


# -- the translation plug-in ----------------------------------------------------------------------


def test_the_plug_in_gives_each_sentence_its_placeholders(tiny_store: Path) -> None:
    """Each masked sentence's placeholder ids; a translation cut short appends its missing spans
    and says how many (`Generated.spans_appended`); whole, it needs none."""
    mt = load_translator(newest(store.scan(tiny_store))["tiny-mt"], LoadOptions(threads=1))
    assert isinstance(mt, TranslatorEngine)
    ids = {mt.codec.tok.token_to_id(p): p for p in spans.PLACEHOLDERS}
    text = "The cat 5 sees http://example.org a dog. Open the file 7."
    prepared = mt.prepare([text])
    assert [[ids[i] for i in ph.required] for ph in prepared.placeholders] == [["⟨1⟩", "⟨2⟩"], ["⟨1⟩"]]
    assert all(ph.reserved == frozenset(ids) for ph in prepared.placeholders)
    assert mt.whole_text.prepare(["The cat 5 sees a dog."], SourceOptions()).placeholders == ()  # text-to-text
    cut = mt.translate([text], DecodeParams(beam_size=1, max_new_tokens=2))[0][0]
    assert cut.finish_reason == "length" and cut.spans_appended >= 2
    assert all(cut.text.count(span) == 1 for span in ("5", "http://example.org", "7")), cut.text
    whole = mt.translate([text], DecodeParams(beam_size=4, max_new_tokens=mt.max_new_tokens))[0][0]
    assert whole.spans_appended == 0 and whole.text == expected_translation(text)
