"""Decoding driven by scripted step functions: hand-written probability tables with exact
expected tokens and scores, a brute-force reference beam search as an oracle, and property
tests on random tables."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.search_drivers import beam_search, greedy
from service.engine import decoding
from service.engine.decoding import (
    BEAM,
    GREEDY,
    SAMPLING,
    DecodeParams,
    Hypothesis,
    Search,
    Strategy,
    rank_block,
    rank_candidates,
)

BOS, EOS = 0, 1
TINY = 1e-4  # probability of every token a table does not list
LOG_TINY = math.log(TINY)

Row = tuple[int, tuple[int, ...]]  # (sentence id, tokens fed so far, BOS first)
LogprobFn = Callable[[int, tuple[int, ...]], np.ndarray]  # (sentence, generated prefix) -> (V,)
Table = dict[tuple[int, ...], dict[int, float]]


class Model:
    """A fake decoder. Its state is one (sentence, prefix) per row, gathered by `rows` exactly
    as a real step gathers its KV cache, so wrong row bookkeeping gives wrong prefixes."""

    def __init__(self, logprobs: LogprobFn, *, strict: bool = True) -> None:
        self.logprobs = logprobs
        self.strict = strict  # no row may continue past EOS (off when beams can die: tiny V)
        self.rows_per_call: list[int] = []

    @staticmethod
    def initial(batch: int) -> list[Row]:
        return [(i, ()) for i in range(batch)]

    def __call__(self, tokens: np.ndarray, state: list[Row], rows: np.ndarray) -> tuple[np.ndarray, list[Row]]:
        assert tokens.dtype == np.int64 and rows.dtype == np.int64
        assert tokens.shape == rows.shape and tokens.size > 0
        self.rows_per_call.append(int(rows.size))
        new = [(state[r][0], state[r][1] + (int(t),)) for r, t in zip(rows, tokens, strict=True)]
        for _, fed in new:
            assert fed[0] == BOS
            assert not self.strict or EOS not in fed
        return np.stack([self.logprobs(sid, fed[1:]) for sid, fed in new]), new


def table_model(*tables: Table, vocab: int = 6, strict: bool = True) -> Model:
    """Sentence i reads tables[i]; a prefix it does not list falls back to its (-1,) entry,
    if any. Tokens a distribution does not list get TINY."""

    def logprobs(sid: int, prefix: tuple[int, ...]) -> np.ndarray:
        table = tables[sid]
        out = np.full(vocab, LOG_TINY)
        for tok, p in table.get(prefix, table.get((-1,), {})).items():
            out[tok] = math.log(p)
        return out.astype(np.float32)

    return Model(logprobs, strict=strict)


def random_model(seed: int, vocab: int, *, ties: bool = False) -> Model:
    """Seeded random log-softmax per (sentence, prefix); `ties` rounds logits so many tie."""

    @cache
    def logprobs(sid: int, prefix: tuple[int, ...]) -> np.ndarray:
        logits = np.random.default_rng([seed, sid, *prefix]).normal(size=vocab) * 2.0
        if ties:
            logits = np.round(logits)
        return (logits - np.logaddexp.reduce(logits)).astype(np.float32)

    return Model(logprobs, strict=False)


def only(sid: int) -> list[Row]:
    """The initial state of sentence `sid` decoded on its own."""
    return [(sid, ())]


def approx(x: float) -> object:
    return pytest.approx(x, abs=1e-6)  # tables are float32 log-probs


def run_beam(
    model: Model, params: DecodeParams, limits: list[int], strategy: Strategy | None = None
) -> list[list[Hypothesis]]:
    return beam_search(model, Model.initial(len(limits)), BOS, EOS, params, limits, strategy=strategy)


def run_greedy(model: Model, limits: list[int], lp: float = 1.0) -> list[Hypothesis]:
    return greedy(model, Model.initial(len(limits)), BOS, EOS, limits, length_penalty=lp)


def reference_beam(
    logprobs: LogprobFn, sid: int, vocab: int, k: int, lp: float, limit: int, n: int
) -> list[Hypothesis]:
    """The contract written as plainly as possible: rank all K*V continuations with Python
    floats, ties to the lower beam*V + token."""

    def hyp(tokens: tuple[int, ...], logprob: float, length: int, done: bool) -> Hypothesis:
        return Hypothesis(tokens, logprob, logprob / length**lp if length else logprob, done)

    if limit == 0:
        return [hyp((), 0.0, 0, False)]
    beams: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    out: list[Hypothesis] = []
    n_finished = 0
    for t in range(1, limit + 1):
        cands = []
        for b, (prefix, cum) in enumerate(beams):
            row = logprobs(sid, prefix)
            cands += [(cum + float(row[tok]), b * vocab + tok, prefix, tok) for tok in range(vocab)]
        cands = sorted(cands, key=lambda c: (-c[0], c[1]))[: 2 * k]
        for rank, (score, _, prefix, tok) in enumerate(cands):
            if tok == EOS and rank < k and math.isfinite(score) and n_finished < k:
                out.append(hyp(prefix, score, t, True))
                n_finished += 1
        beams = [(prefix + (tok,), score) for score, _, prefix, tok in cands if tok != EOS][:k]
        if n_finished >= k or not beams:
            break
        if t == limit:
            out += [hyp(prefix, score, t, False) for prefix, score in beams]
    return sorted(out, key=lambda h: -h.score)[:n]


# --- hand-written tables --------------------------------------------------------------------

# Greedy takes 2 (p=.5) then must stop (EOS .4): p=.2. Beam sees 3 (.4) then EOS (.9): p=.36.
BETTER_THAN_GREEDY: Table = {
    (): {2: 0.5, 3: 0.4, EOS: 0.1},
    (2,): {EOS: 0.4, 4: 0.3, 5: 0.3},
    (3,): {EOS: 0.9, 4: 0.1},
}

# Short [2] ends with p=.6*.55=.33 (length 2); long [3, 4] with p=.4*.9*.7=.252 (length 3).
# Unpenalised the short one wins; per token (length_penalty=1) the long one does.
PENALTY_FLIPS: Table = {
    (): {2: 0.6, 3: 0.4},
    (2,): {EOS: 0.55, 5: 0.45},
    (3,): {4: 0.9, EOS: 0.1},
    (3, 4): {EOS: 0.7, 2: 0.3},
    (2, 5): {EOS: 0.2, 3: 0.8},
}

# Never ends: every prefix prefers 2 (.6) over 3 (.4), EOS stays TINY.
ENDLESS: Table = {(-1,): {2: 0.6, 3: 0.4}}

L = math.log


def test_greedy_on_table() -> None:
    [h] = run_greedy(table_model(BETTER_THAN_GREEDY), [10])
    assert h.tokens == (2,) and h.finished
    assert h.logprob == approx(L(0.5) + L(0.4))
    assert h.score == approx((L(0.5) + L(0.4)) / 2)


def test_beam_finds_better_sequence_than_greedy() -> None:
    params = DecodeParams(beam_size=2, length_penalty=0.0, num_hypotheses=2)
    [[best, second]] = run_beam(table_model(BETTER_THAN_GREEDY), params, [10])
    assert (best.tokens, best.finished) == ((3,), True)
    assert best.logprob == approx(L(0.4) + L(0.9)) and best.score == best.logprob
    assert (second.tokens, second.finished) == ((2,), True)
    assert second.score == approx(L(0.5) + L(0.4))


def test_beam_scores_with_length_penalty() -> None:
    params = DecodeParams(beam_size=2, length_penalty=0.5, num_hypotheses=2)
    [[best, second]] = run_beam(table_model(BETTER_THAN_GREEDY), params, [10])
    assert best.tokens == (3,) and best.score == approx((L(0.4) + L(0.9)) / 2**0.5)
    assert second.tokens == (2,) and second.score == approx((L(0.5) + L(0.4)) / 2**0.5)


def test_length_penalty_changes_the_winner() -> None:
    short, long = L(0.6) + L(0.55), L(0.4) + L(0.9) + L(0.7)
    model = table_model(PENALTY_FLIPS)
    [[a, b]] = run_beam(model, DecodeParams(beam_size=2, length_penalty=0.0, num_hypotheses=2), [9])
    assert (a.tokens, a.score, b.tokens, b.score) == ((2,), approx(short), (3, 4), approx(long))
    [[a, b]] = run_beam(model, DecodeParams(beam_size=2, length_penalty=1.0, num_hypotheses=2), [9])
    assert (a.tokens, a.score) == ((3, 4), approx(long / 3))
    assert (b.tokens, b.score) == ((2,), approx(short / 2))
    assert a.logprob == approx(long) and a.finished and b.finished


def test_max_new_tokens_cuts_unfinished_beams() -> None:
    # Step 2 ties [2,3] with [3,2] (same probability): the lower beam wins, so beam 0 = [2,*].
    params = DecodeParams(beam_size=2, max_new_tokens=3, length_penalty=1.0, num_hypotheses=2)
    [[a, b]] = run_beam(table_model(ENDLESS), params, [50])  # capped by params: 3
    assert (a.tokens, a.finished, a.logprob) == ((2, 2, 2), False, approx(3 * L(0.6)))
    assert a.score == approx(3 * L(0.6) / 3)
    assert (b.tokens, b.finished, b.score) == ((2, 2, 3), False, approx((2 * L(0.6) + L(0.4)) / 3))


def test_per_sentence_max_new_tokens() -> None:
    model = table_model(ENDLESS, ENDLESS, ENDLESS)
    params = DecodeParams(beam_size=3, max_new_tokens=4)
    out = run_beam(model, params, [2, 9, 0])
    assert [h.tokens for [h] in out] == [(2, 2), (2, 2, 2, 2), ()]
    assert not any(h.finished for [h] in out) and out[2][0].score == 0.0
    g = run_greedy(model, [2, 5, 0])
    assert [h.tokens for h in g] == [(2, 2), (2, 2, 2, 2, 2), ()]
    assert g[1].logprob == approx(5 * L(0.6)) and not g[1].finished


def test_num_hypotheses_returns_that_many_sorted() -> None:
    model = random_model(7, vocab=20)
    for n in range(1, 5):
        [hyps] = run_beam(model, DecodeParams(beam_size=4, max_new_tokens=6, num_hypotheses=n), [6])
        assert len(hyps) == n
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_beam_size_one_is_greedy_on_tables() -> None:
    for table in (BETTER_THAN_GREEDY, PENALTY_FLIPS, ENDLESS):
        [g] = run_greedy(table_model(table), [5])
        [[b]] = run_beam(table_model(table), DecodeParams(beam_size=1), [5])
        assert (b.tokens, b.logprob, b.finished) == (g.tokens, g.logprob, g.finished)


# --- batching and early exit ----------------------------------------------------------------


def test_early_exit_makes_no_extra_step() -> None:
    model = table_model(BETTER_THAN_GREEDY)
    run_beam(model, DecodeParams(beam_size=2), [100])
    assert model.rows_per_call == [1, 2]  # the first step runs one row, then the K rows; both beams end at step 2
    model = table_model(BETTER_THAN_GREEDY)
    run_greedy(model, [100])
    assert model.rows_per_call == [1, 1]  # 2, then EOS


def test_finished_sentences_leave_the_batch() -> None:
    model = table_model(BETTER_THAN_GREEDY, ENDLESS, ENDLESS)
    out = run_beam(model, DecodeParams(beam_size=2), [100, 4, 3])
    # one row per sentence at the first step, then K; sentence 0 is done after step 2, 2 after step 3.
    assert model.rows_per_call == [3, 6, 4, 2]
    assert [len(h[0].tokens) for h in out] == [1, 4, 3]
    model = table_model(BETTER_THAN_GREEDY, ENDLESS, ENDLESS)
    run_greedy(model, [100, 4, 3])
    assert model.rows_per_call == [3, 3, 2, 1]


@pytest.mark.parametrize("ties", [False, True])
def test_batch_equals_singles(ties: bool) -> None:
    limits = [5, 1, 7, 3, 6, 0, 4]
    model = random_model(11, vocab=40, ties=ties)
    for params in (
        DecodeParams(beam_size=1, max_new_tokens=6),
        DecodeParams(beam_size=3, max_new_tokens=6, length_penalty=0.6, num_hypotheses=2),
        DecodeParams(beam_size=5, max_new_tokens=6, length_penalty=1.3, num_hypotheses=5),
    ):
        batch = run_beam(model, params, limits)
        for sid, limit in enumerate(limits):
            single = beam_search(model, only(sid), BOS, EOS, params, [limit])[0]
            assert [h.tokens for h in batch[sid]] == [h.tokens for h in single]
            assert [h.finished for h in batch[sid]] == [h.finished for h in single]
            for hb, hs in zip(batch[sid], single, strict=True):
                assert abs(hb.score - hs.score) < 1e-5 and abs(hb.logprob - hs.logprob) < 1e-5
    batch_g = run_greedy(model, limits)
    for sid, limit in enumerate(limits):
        [single_g] = greedy(model, only(sid), BOS, EOS, [limit])
        assert batch_g[sid].tokens == single_g.tokens
        assert abs(batch_g[sid].logprob - single_g.logprob) < 1e-5


@pytest.mark.parametrize(("vocab", "ties"), [(1500, False), (1500, True), (512, True)])
def test_large_vocabulary_matches_reference(vocab: int, ties: bool) -> None:
    # Exercises the strided-block threshold (V > 512, V % 512 != 0) and ties across it.
    model = random_model(3, vocab=vocab, ties=ties)
    params = DecodeParams(beam_size=4, max_new_tokens=5, length_penalty=1.0, num_hypotheses=4)
    out = run_beam(model, params, [5, 5, 3])
    for sid, limit in enumerate([5, 5, 3]):
        assert out[sid] == reference_beam(model.logprobs, sid, vocab, 4, 1.0, limit, 4)


@pytest.mark.parametrize("pattern", ["normal", "ties", "spread", "neg_inf"])
@pytest.mark.parametrize(("vocab", "width", "c"), [(1500, 4, 8), (2048, 2, 4), (700, 8, 16)])
def test_top_candidates_equal_a_full_sort(pattern: str, vocab: int, width: int, c: int) -> None:
    """The hot-path shortcut (per-row threshold, then rank the few survivors) must give
    exactly the c best of each sentence's width*V view, ties to the lower index: ranked for
    three sentences at once (`rank_candidates`) and for each alone (`rank_block`)."""
    rng = np.random.default_rng(vocab + c)
    n_sent = 3
    logp = rng.normal(size=(n_sent * width, vocab)).astype(np.float32)
    if pattern == "ties":
        logp = np.round(logp)
    elif pattern == "spread":  # the c best of each row in c different threshold blocks
        logp = np.full_like(logp, -50.0)
        logp[:, ::29][:, :c] = rng.normal(size=(n_sent * width, c))
    elif pattern == "neg_inf":  # fewer finite entries than c in some rows
        logp[:, 3:] = -np.inf
        logp[0, :] = -np.inf
    cum = rng.normal(size=n_sent * width).round(1)
    score, row, tok = rank_candidates(logp, cum, np.full(n_sent, width), np.full(n_sent, c), pad_tok=EOS)
    for a in range(n_sent):
        rows = slice(a * width, (a + 1) * width)
        alone = rank_block(logp[rows], cum[rows], c, pad_tok=EOS)
        assert np.array_equal(alone[0], score[a]) and np.array_equal(alone[2], tok[a])
        assert np.array_equal(alone[1] + a * width, row[a])
        view = (cum[a * width : (a + 1) * width, None] + logp[a * width : (a + 1) * width]).ravel()
        best = np.lexsort((np.arange(view.size), -view))[:c]
        finite = np.isfinite(view[best])
        assert np.array_equal(score[a][finite], view[best][finite])
        index = (row[a] - a * width) * vocab + tok[a]  # into the sentence's view
        assert np.array_equal(index[finite], best[finite])
        assert np.isneginf(score[a][~finite]).all()


# --- property tests -------------------------------------------------------------------------


@st.composite
def searches(draw: st.DrawFn) -> tuple[Model, int, DecodeParams, list[int]]:
    vocab = draw(st.integers(3, 8))
    model = random_model(draw(st.integers(0, 2**32 - 1)), vocab, ties=draw(st.booleans()))
    k = draw(st.integers(1, 5))
    params = DecodeParams(
        beam_size=k,
        max_new_tokens=draw(st.integers(1, 6)),
        length_penalty=draw(st.sampled_from([0.0, 0.5, 1.0, 1.7, 2.0])),
        num_hypotheses=draw(st.integers(1, k)),
    )
    limits = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4))
    return model, vocab, params, limits


@settings(max_examples=150, deadline=None)
@given(searches())
def test_beam_search_properties(case: tuple[Model, int, DecodeParams, list[int]]) -> None:
    model, vocab, params, limits = case
    out = run_beam(model, params, limits)
    lp = params.length_penalty
    for sid, (hyps, limit) in enumerate(zip(out, limits, strict=True)):
        limit = min(limit, params.max_new_tokens)
        assert 1 <= len(hyps) <= params.num_hypotheses
        assert all(hyps[0].score >= h.score for h in hyps)
        assert len({h.tokens for h in hyps}) == len(hyps)
        for h in hyps:
            length = len(h.tokens) + h.finished
            assert length <= limit and EOS not in h.tokens
            assert h.finished or length == limit
            path = [*h.tokens, EOS] if h.finished else list(h.tokens)
            logprob = sum(float(model.logprobs(sid, tuple(path[:i]))[path[i]]) for i in range(length))
            assert h.logprob == pytest.approx(logprob, abs=1e-9)
            assert h.score == pytest.approx(logprob / length**lp if length else 0.0, abs=1e-9)
        assert hyps == reference_beam(model.logprobs, sid, vocab, params.beam_size, lp, limit, params.num_hypotheses)


@settings(max_examples=100, deadline=None)
@given(searches())
def test_beam_size_one_is_greedy(case: tuple[Model, int, DecodeParams, list[int]]) -> None:
    model, _, params, limits = case
    limits = [min(n, params.max_new_tokens) for n in limits]
    g = run_greedy(model, limits, lp=params.length_penalty)
    b = run_beam(
        model,
        DecodeParams(beam_size=1, max_new_tokens=params.max_new_tokens, length_penalty=params.length_penalty),
        limits,
        strategy=BEAM,  # a beam of one row, not the greedy strategy its parameters choose
    )
    assert [[h] for h in g] == b


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beam_size": 0}, "beam_size"),
        ({"beam_size": 9}, "beam_size"),
        ({"beam_size": 2.0}, "beam_size"),
        ({"beam_size": True}, "beam_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"length_penalty": -0.1}, "length_penalty"),
        ({"length_penalty": 2.5}, "length_penalty"),
        ({"length_penalty": math.nan}, "length_penalty"),
        ({"length_penalty": "1"}, "length_penalty"),
        ({"num_hypotheses": 0}, "num_hypotheses"),
        ({"beam_size": 2, "num_hypotheses": 3}, "num_hypotheses"),
    ],
)
def test_decode_params_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecodeParams(**kwargs)  # type: ignore[arg-type]  # invalid on purpose


def test_decode_params_defaults_are_valid() -> None:
    p = DecodeParams()
    assert (p.beam_size, p.max_new_tokens, p.length_penalty, p.num_hypotheses) == (4, 128, 1.0, 1)


def test_beam_search_batch_size_argument() -> None:
    model = table_model(ENDLESS, ENDLESS)
    params = DecodeParams(beam_size=2, max_new_tokens=3)
    by_size = beam_search(model, Model.initial(2), BOS, EOS, params, batch_size=2)
    assert by_size == run_beam(model, params, [3, 3])
    with pytest.raises(ValueError, match="max_new_tokens or batch_size"):
        beam_search(model, Model.initial(2), BOS, EOS, params)
    with pytest.raises(ValueError, match="batch_size"):
        beam_search(model, Model.initial(2), BOS, EOS, params, [3, 3], batch_size=3)
    with pytest.raises(ValueError, match=">= 0"):
        beam_search(model, Model.initial(2), BOS, EOS, params, [3, -1])


def test_step_returning_wrong_rows_is_an_error() -> None:
    def bad_step(tokens: np.ndarray, state: None, rows: np.ndarray) -> tuple[np.ndarray, None]:
        return np.zeros((rows.size + 1, 5), np.float32), None

    with pytest.raises(ValueError, match="shape"):
        greedy(bad_step, None, BOS, EOS, [3])
    with pytest.raises(ValueError, match="shape"):
        beam_search(bad_step, None, BOS, EOS, DecodeParams(), [3])


# --- sampling, penalties, finish reasons ----------------------------------------------------------


def test_sampling_is_reproducible_by_seed_and_top_k_1_is_greedy() -> None:
    model = random_model(21, vocab=30)
    p = DecodeParams(beam_size=1, sample=True, num_hypotheses=3, max_new_tokens=8, seed=5, temperature=1.3)
    a, b = run_beam(model, p, [8, 8]), run_beam(model, p, [8, 8])
    assert a == b
    other = run_beam(model, DecodeParams(**{**p.__dict__, "seed": 6}), [8, 8])
    assert other != a  # 6 draws of up to 8 tokens among 30: another seed draws otherwise
    top1 = DecodeParams(beam_size=1, sample=True, top_k=1, max_new_tokens=8, seed=9)
    g = run_greedy(model, [8, 8])
    assert [h[0].tokens for h in run_beam(model, top1, [8, 8])] == [h.tokens for h in g]


def _draw_by_full_sort(logp: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """The definition `decoding._draw` must match: every token sorted, the prefix kept, one draw."""
    scaled = np.asarray(logp, dtype=np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")[: top_k or None]
    probs = np.exp(scaled[order] - scaled[order[0]])
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), len(order) - 1)])


def test_a_draw_sorting_only_the_likely_tokens_draws_what_a_full_sort_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.standard_normal((40, 3000)) * scale for scale in (0.3, 3.0, 12.0)]).astype(np.float32)
    rows[:10, :40] = rows[:10, :1]  # tied likeliest tokens: the lower id first
    rows[10:20, 5:] = -60.0  # all but a few tokens below the first floor
    rows[20:30] = np.log(5e-5) + 0.01 * rows[20:30]  # a long tail just below it holding ~13 % of the mass,
    rows[20:30, 7] = 0.0  # past which top_p 0.95 reaches
    cases = (
        (0, 1.0, 1.0),
        (0, 0.9, 0.7),
        (0, 0.95, 1.0),
        (5, 1.0, 1.0),
        (50, 0.5, 1.3),
        (2500, 0.99, 1.0),
    )  # top_k, top_p, temperature
    reached = []
    at_least = decoding._at_least

    def watched(scaled: np.ndarray, probs: np.ndarray, floor: float) -> np.ndarray:
        reached.append(floor)
        return at_least(scaled, probs, floor)

    monkeypatch.setattr(decoding, "_at_least", watched)
    for r, row in enumerate(rows):
        for top_k, top_p, temperature in cases:
            seed = r * 7 + top_k
            want = _draw_by_full_sort(row, temperature, top_k, top_p, np.random.default_rng(seed))
            assert decoding._draw(row, temperature, top_k, top_p, np.random.default_rng(seed)) == want, (r, top_k)
    assert set(reached) == set(decoding._DRAW_FLOORS)  # both the partial sort and the full one were taken


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 4))
def test_no_repeat_ngram_size_holds(seed: int, n: int, k: int) -> None:
    model = random_model(seed, vocab=6)
    [hyps] = run_beam(model, DecodeParams(beam_size=k, num_hypotheses=k, max_new_tokens=9, no_repeat_ngram_size=n), [9])
    for h in hyps:
        grams = [h.tokens[i : i + n] for i in range(len(h.tokens) - n + 1)]
        assert len(grams) == len(set(grams)), h.tokens


def test_repetition_penalty_multiplies_the_log_prob_of_generated_tokens() -> None:
    # ENDLESS prefers 2 (.6) over 3 (.4); with penalty 2, a generated 2 scores 2 ln .6 < ln .4.
    [h] = run_greedy(table_model(ENDLESS), [3])
    assert h.tokens == (2, 2, 2)
    [[h]] = run_beam(table_model(ENDLESS), DecodeParams(beam_size=1, max_new_tokens=2, repetition_penalty=2.0), [2])
    assert h.tokens == (2, 3) and h.logprob == approx(L(0.6) + L(0.4))


def test_finish_reason_says_how_a_hypothesis_ended() -> None:
    [h] = run_greedy(table_model(BETTER_THAN_GREEDY), [10])
    assert h.finished and h.finish_reason == "eos"
    [h] = run_greedy(table_model(ENDLESS), [3])
    assert not h.finished and h.finish_reason == "length"


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    widths=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    vocab=st.sampled_from([5, 12, 40, 300]),
    ties=st.booleans(),
    stopping=st.sampled_from([True, False, "never"]),
    vectorised=st.booleans(),
)
def test_candidates_ranked_for_a_whole_batch_decide_as_each_sentence_alone(
    seed: int, widths: list[int], vocab: int, ties: bool, stopping: bool | str, vectorised: bool
) -> None:
    """Each strategy's batch-level step over several sentences of different beam widths decides
    exactly what a beam search decides for each sentence alone from its own log-probabilities,
    also with many tied scores and vocabularies too small to supply 2K candidates; a greedy
    sentence from its best token alone (`Greedy`), the others from one ranking (`Beam`), whose
    beams continue in one vectorised pass or sentence by sentence (`_VECTORISED_FROM`)."""
    rng = np.random.default_rng(seed)
    params = [
        DecodeParams(  # greedy (one row) stops at its EOS whatever `early_stopping` says
            beam_size=k,
            num_hypotheses=k,
            max_new_tokens=6,
            length_penalty=1.2,
            early_stopping=stopping if k > 1 else True,
        )
        for k in widths
    ]
    default = decoding._VECTORISED_FROM
    decoding._VECTORISED_FROM = 1 if vectorised else 1000
    try:
        _decide_as_alone(rng, params, widths, vocab, ties)
    finally:
        decoding._VECTORISED_FROM = default


def _decide_as_alone(
    rng: np.random.Generator, params: list[DecodeParams], widths: list[int], vocab: int, ties: bool
) -> None:
    alone = [Search(p, BOS, EOS, strategy=BEAM) for p in params]
    batched = [Search(p, BOS, EOS) for p in params]
    assert [s.strategy for s in batched] == [GREEDY if k == 1 else BEAM for k in widths]
    while not all(s.done for s in alone):
        live = [i for i, s in enumerate(alone) if not s.done]
        assert live == [i for i, s in enumerate(batched) if not s.done]
        logp_of = {}
        for i in live:
            logits = rng.normal(size=(alone[i].rows, vocab)).round(0 if ties else 6)  # rounding: equal scores
            logits[:, EOS] += rng.normal() * 2
            logp_of[i] = (logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)).astype(np.float32)
        logp = np.concatenate([logp_of[i] for i in live])
        starts = np.cumsum([0] + [batched[i].rows for i in live])[:-1].astype(np.int64)
        decided: dict[int, np.ndarray | None] = {}
        for strategy in (GREEDY, BEAM):
            members = [j for j, i in enumerate(live) if batched[i].strategy is strategy]
            chosen = strategy.step([batched[live[j]] for j in members], logp, starts[members])
            decided |= {live[j]: c for j, c in zip(members, chosen, strict=True)}
        for i in live:
            a, b = alone[i].advance(logp_of[i]), decided[i]
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))
            assert np.array_equal(alone[i].tokens, batched[i].tokens)
    assert [s.hypotheses() for s in alone] == [s.hypotheses() for s in batched]


def test_a_strategy_refuses_parameters_it_cannot_decode() -> None:
    with pytest.raises(ValueError, match="greedy"):
        Search(DecodeParams(beam_size=2), BOS, EOS, strategy=GREEDY)
    with pytest.raises(ValueError, match="greedy"):
        Search(DecodeParams(beam_size=1, repetition_penalty=1.5), BOS, EOS, strategy=GREEDY)
    with pytest.raises(ValueError, match="sample"):
        Search(DecodeParams(beam_size=1, sample=True), BOS, EOS, strategy=BEAM)
    assert Search(DecodeParams(beam_size=1, sample=True), BOS, EOS).strategy is SAMPLING
    assert Search(DecodeParams(beam_size=1, no_repeat_ngram_size=2), BOS, EOS).strategy is BEAM


def test_a_beam_keeps_each_parents_best_child_in_the_parents_row() -> None:
    """Only the rows that must copy a cache move: row 0's two best continuations and row 1's
    best continue; in rank order rows 1 and 2 would both copy, here only row 2 (row 0's second)."""
    s = Search(DecodeParams(beam_size=3, max_new_tokens=5), BOS, EOS)
    first = np.full((1, 8), -20.0)
    first[0, [2, 3, 4]] = [-0.1, -0.2, -0.3]
    assert s.advance(first).tolist() == [0, 0, 0]  # the beam widens from its one row
    second = np.full((3, 8), -20.0)
    second[0, [5, 6]] = [-0.1, -0.2]  # row 0's two, ranked first and second
    second[1, 7] = -0.15  # then row 1's best; row 2's are all worse
    assert s.advance(second).tolist() == [0, 1, 0]
    assert s.tokens.tolist() == [5, 7, 6]
    assert s.hist[:, :2].tolist() == [[2, 5], [3, 7], [2, 6]]
    assert decoding._in_place([0, 1, 2]) is None
    assert decoding._in_place([1, 0, 0, 2]) == [1, 0, 3, 2]
    assert decoding._in_place([3, 3, 3, 3]) == [1, 2, 3, 0]


@pytest.mark.parametrize("beam", [1, 3])
def test_forced_tokens_are_taken_with_log_probability_zero(beam: int) -> None:
    """A forced first token (a target language) and a forced EOS at the limit, whatever the model
    prefers: each adds nothing to the score, as transformers' forced-BOS/EOS processors."""
    v, eos = 6, 2
    table = np.log(np.full((beam, v), 1 / v))
    table[:, 4] = np.log(0.5)  # token 4 is always the model's choice
    table = table - np.logaddexp.reduce(table, axis=1, keepdims=True)
    s = Search(DecodeParams(beam_size=beam, max_new_tokens=4), 0, eos, forced=(5,), forced_eos=True)
    while not s.done:
        s.advance(table[: s.rows])
    best = s.hypotheses()[0]
    assert best.tokens[0] == 5 and best.finished and len(best.tokens) == 3  # 5, two free tokens, forced EOS
    assert best.tokens[1:] == (4, 4)
    assert best.logprob == pytest.approx(2 * float(table[0, 4]))
    assert best.score == pytest.approx(best.logprob / 4)


def test_early_stopping_never_keeps_searching_for_a_better_hypothesis() -> None:
    """With early_stopping true a beam of 1 ends at the first EOS; "never" (with a length penalty
    favouring length) goes on while a live beam could still beat it at the length limit
    (transformers' heuristic), and finds the better, longer one."""
    eos = 1
    steps = [
        np.log([[0.05, 0.5, 0.45, 0.0001]]),  # EOS now scores log 0.5 / 1
        np.log([[0.001, 0.001, 0.001, 0.997]]),
        np.log([[0.001, 0.997, 0.001, 0.001]]),
    ]
    found: dict[object, Hypothesis] = {}
    for stopping in (True, "never"):
        s = Search(DecodeParams(beam_size=1, max_new_tokens=5, length_penalty=2.0, early_stopping=stopping), 0, eos)
        s.strategy = BEAM  # the beam path at width 1 (greedy ends at the first EOS)
        for logp in steps:
            if not s.done:
                s.advance(np.nan_to_num(logp, neginf=-1e9))
        found[stopping] = s.hypotheses()[0]
    assert found[True].tokens == () and found["never"].tokens == (2, 3)
    assert found["never"].score > found[True].score


@pytest.mark.parametrize("vocab", [8000, 9001])
def test_the_entries_passing_a_threshold_are_found_in_the_blocks_that_pass_it(
    vocab: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many rows (`_in_passing_blocks`): the same entries, ascending, as comparing every one with
    its row's threshold (the scan turned off), with ties, rows of -inf and entries past the blocks."""
    rng = np.random.default_rng(vocab)
    for rows, c in ((40, 8), (128, 16), (64, 2)):
        logp = np.round(rng.normal(size=(rows, vocab)), 1).astype(np.float32)  # ties
        logp[0, : vocab // 2] = -np.inf
        logp[1] = -np.inf
        logp[1, 7] = 0.0
        logp[2, -3:] = 5.0  # the best entries past the blocks
        cum = rng.normal(size=rows)
        assert rows * vocab >= decoding._SCAN_BLOCKS_FROM
        scanned = decoding._survivors(logp, cum, c)
        with monkeypatch.context() as m:
            m.setattr(decoding, "_SCAN_BLOCKS_FROM", rows * vocab + 1)
            compared = decoding._survivors(logp, cum, c)
        assert all(np.array_equal(a, b) for a, b in zip(scanned, compared, strict=True))


def test_rows_in_place_for_many_sentences_at_once_equal_each_sentences() -> None:
    """`_in_place_all` against `_in_place`, sentence by sentence: every parent list of widths 1 to
    4, 3000 random ones of widths 5 to 8 (dead candidates descend from row 0 like any other)."""
    rng = np.random.default_rng(8)
    for k in range(1, 9):
        every = (
            np.array(np.meshgrid(*[np.arange(k)] * k, indexing="ij")).reshape(k, -1).T  # all k^k lists
            if k <= 4
            else rng.integers(0, rng.integers(1, k + 1, size=(3000, 1)), size=(3000, k))  # few parents to many
        )
        got = decoding._in_place_all(every)
        for parents, rows in zip(every.tolist(), got.tolist(), strict=True):
            want = decoding._in_place(parents)
            assert rows == (want if want is not None else list(range(k)))
