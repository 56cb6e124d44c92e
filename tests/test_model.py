"""Model math: attention, masks, positions, cached decoding, tokenizer, and that training learns."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from export import tokenizer as tokenizer_lib
from export.batches import pad, token_batches
from export.model import (
    NEG_INF,
    Classifier,
    ClassifierConfig,
    Translator,
    TranslatorConfig,
    attention,
    causal_bias,
    greedy,
    padding_bias,
    sinusoidal_table,
)
from export.train import TrainConfig, translator_loss

TOL = 1e-5  # fp32 on CPU: cached and full paths differ only by summation order


def tiny_translator(seed: int = 0) -> Translator:
    torch.manual_seed(seed)
    cfg = TranslatorConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=2, n_dec_layers=2, dropout=0.0)
    return Translator(cfg).eval()


def test_attention_matches_naive_loops() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    out, weights = attention(q, k, v, None)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 4))
    ref = torch.zeros_like(out)
    for b in range(2):
        for h in range(3):
            for i in range(4):
                w = [math.exp(float(q[b, h, i] @ k[b, h, j]) / math.sqrt(8)) for j in range(5)]
                z = sum(w)
                ref[b, h, i] = sum(w[j] / z * v[b, h, j] for j in range(5))
    assert torch.allclose(out, ref, atol=1e-5)


def test_attention_matches_torch_sdpa() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16)
    assert torch.allclose(attention(q, k, v, None)[0], F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_padded_keys_get_zero_weight() -> None:
    torch.manual_seed(2)
    q, k = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    v_a = torch.randn(1, 1, 5, 8)
    v_b = v_a.clone()
    v_b[..., 3:, :] = 1e3  # values behind padding must not leak into the output
    bias = padding_bias(mask)
    assert torch.allclose(attention(q, k, v_a, bias)[0], attention(q, k, v_b, bias)[0], atol=1e-6)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, -1)
    assert float(weights[..., 3:].max()) == 0.0


def test_causal_bias_shape_and_values() -> None:
    b = causal_bias(2, 3, torch.device("cpu"))  # 2 new queries after 3 cached positions
    assert b.shape == (2, 5)
    assert b[0].tolist() == [0, 0, 0, 0, NEG_INF]
    assert b[1].tolist() == [0, 0, 0, 0, 0]


def test_decoder_is_causal() -> None:
    model = tiny_translator()
    src = torch.randint(5, 50, (2, 6))
    mask = torch.ones_like(src)
    tgt = torch.randint(5, 50, (2, 7))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(5, 50, (2, 3))
    with torch.no_grad():
        a = model(src, mask, tgt)
        b = model(src, mask, changed)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-3)


def test_positional_encoding_formula() -> None:
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_incremental_decoding_equals_full_decoder() -> None:
    """Cached one-token steps give the logits of the full-sequence decoder (max abs diff ≤ 1e-5)."""
    model = tiny_translator(3)
    src = torch.randint(5, 50, (3, 7))
    src_mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    tgt = torch.randint(5, 50, (3, 6))
    with torch.no_grad():
        full = model(src, src_mask, tgt)  # (B, T, V)
        cross = model.cross_kv(model.encode(src, src_mask))
        past = model.empty_past(3)
        steps = []
        for t in range(tgt.size(1)):
            logits, past = model.decode(tgt[:, t : t + 1], past, cross, src_mask)
            steps.append(logits)
        cached = torch.cat(steps, dim=1)
        # two tokens at a time after a cached prefix also agree
        _, past3 = model.decode(tgt[:, :3], model.empty_past(3), cross, src_mask)
        chunk, _ = model.decode(tgt[:, 3:5], past3, cross, src_mask)
    assert past[0][0].shape == (3, 4, 6, 8)
    assert (cached - full).abs().max().item() <= TOL
    assert (chunk - full[:, 3:5]).abs().max().item() <= TOL


def test_greedy_cached_equals_uncached() -> None:
    model = tiny_translator(4)
    src, mask = pad([[7, 8, 9, 2], [10, 11, 2], [12, 13, 14, 15, 16, 2]])
    assert greedy(model, src, mask, 12) == greedy(model, src, mask, 12, cached=False)


def test_padding_in_source_does_not_change_translation() -> None:
    model = tiny_translator(5)
    alone, alone_mask = pad([[7, 8, 2]])
    padded, padded_mask = pad([[7, 8, 2], [9, 10, 11, 12, 13, 14, 2]])
    with torch.no_grad():
        a = model(alone, alone_mask, torch.tensor([[1, 20, 21]]))
        b = model(padded, padded_mask, torch.tensor([[1, 20, 21], [1, 22, 23]]))
    assert torch.allclose(a[0], b[0], atol=1e-5)


def test_tokenizer_round_trip_keeps_identifiers() -> None:
    texts = ["Open the file with dpkg-split now.", "Speichern unter |FILE| fehlgeschlagen!"] * 50
    texts += [f"word{i} another{i % 7} sentence." for i in range(200)]
    tok = tokenizer_lib.train_bpe(texts, vocab_size=300)
    assert tok.token_to_id("<pad>") == 0 and tok.token_to_id("</s>") == 2 and tok.token_to_id("<mask>") == 4
    for text in ["Open the file with dpkg-split now.", "Speichern unter |FILE| fehlgeschlagen!", "word3 another3"]:
        assert tok.decode(tok.encode(text).ids) == text


def test_token_batches_respect_budget_and_cover_everything() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(500)]
    batches = token_batches(lengths, 200, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(max(lengths[i] for i in b) * len(b) <= 200 or len(b) == 1 for b in batches)


def test_tiny_translator_overfits_a_handful_of_pairs() -> None:
    """A copy-and-reverse task on 8 pairs: loss must fall below 0.3 and greedy must reproduce targets."""
    torch.manual_seed(0)
    cfg = TranslatorConfig(vocab_size=30, d_model=48, n_heads=4, d_ff=96, n_layers=1, n_dec_layers=2, dropout=0.0)
    model = Translator(cfg)
    rng = random.Random(0)
    pairs = []
    for _ in range(8):
        s = [rng.randint(5, 29) for _ in range(rng.randint(3, 6))]
        pairs.append((s + [2], [1] + s[::-1] + [2]))
    src, src_mask = pad([p[0] for p in pairs])
    tgt, _ = pad([p[1] for p in pairs])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    tc = TrainConfig()
    for _ in range(150):
        loss = translator_loss(model, src, src_mask, tgt, 0.0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
        opt.step()
    assert loss.item() < 0.3
    model.eval()
    out = greedy(model, src, src_mask, 10)
    assert out == [p[1][1:-1] for p in pairs]


def test_tiny_classifier_overfits() -> None:
    torch.manual_seed(0)
    cfg = ClassifierConfig(vocab_size=30, d_model=32, n_heads=4, d_ff=64, n_layers=1, dropout=0.0)
    model = Classifier(cfg)
    ids, mask = pad([[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16], [17, 18, 19]])
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model(ids, mask), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert model.eval()(ids, mask).argmax(-1).tolist() == labels.tolist()


def test_fold_indices_name_every_row_once_in_its_own_sentence() -> None:
    """IO contract 6's fold (N, M) and unfold (R,): each sentence's queries are its own rows (its
    spare places repeat one of them), each row is named by exactly one place, M is the widest
    sentence's rows, whatever the sentences' order against their rows."""
    from service.contract.graphs import fold_indices

    rng = random.Random(4)
    for _ in range(200):
        widths = [rng.choice([1, 1, 2, 3, 4, 5]) for _ in range(rng.randint(1, 9))]
        order = list(range(len(widths)))
        rng.shuffle(order)  # the rows' order of the sentences (blocks), against their slots
        starts, row = [0] * len(widths), 0
        for k in order:
            starts[k], row = row, row + widths[k]
        fold, unfold = fold_indices(starts, widths)
        m = max(widths)
        assert fold.shape == (len(widths), m) and unfold.shape == (row,)
        for k, (s0, w) in enumerate(zip(starts, widths, strict=True)):
            assert fold[k, :w].tolist() == list(range(s0, s0 + w))
            assert all(s0 <= r < s0 + w for r in fold[k, w:])
        assert [fold.reshape(-1)[place] for place in unfold] == list(range(row))
        assert all(place % m < widths[place // m] for place in unfold)  # never a spare place


def test_folded_cross_attention_equals_per_row() -> None:
    """The decoder step with each sentence's keys and values once and its rows folded into one
    product (IO contract 6) gives what every row with its own copy gives: logits and weights."""
    from service.contract.graphs import fold_indices, unfold_rows

    torch.manual_seed(0)
    model = Translator(TranslatorConfig(vocab_size=60, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0)).eval()
    src = torch.randint(5, 60, (3, 7))
    src_mask = torch.ones_like(src)
    src_mask[1, 4:] = 0
    cross = model.cross_kv(model.encode(src, src_mask))
    widths, starts = [2, 1, 3], [4, 0, 1]  # sentence 1's row first, then sentence 2's, then sentence 0's
    sentence = torch.tensor([1, 2, 2, 2, 0, 0])  # each row's
    rows = len(sentence)
    tokens = torch.randint(5, 60, (rows, 1))
    positions = torch.tensor([2, 3, 3, 3, 1, 1])
    cache = [(torch.randn(rows, 4, 5, 8), torch.randn(rows, 4, 5, 8)) for _ in model.layers]
    with torch.no_grad():
        per_row = [(k[sentence], v[sentence]) for k, v in cross]
        want, _, want_w = model.decode_step(tokens, positions, cache, per_row, src_mask[sentence])
        fold, unfold = (torch.from_numpy(a) for a in fold_indices(starts, widths))
        got, _, got_w = model.decode_step(tokens, positions, cache, cross, src_mask, folding=(fold, unfold))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(unfold_rows(got_w.numpy(), unfold.numpy())), want_w)
