"""bench.same_model's rules: the checkpoint's vocabulary layout, and that differing greedy tokens stop the
report (a diff, no speed) while beam and int8 differences are only counted."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from bench import same_model, same_model_t5
from bench.same_model import TokensDiffer, compare, vocabulary


def test_vocabulary_is_marian_layout_of_exactly_the_size() -> None:
    tokens = vocabulary(["<unk>", "▁the", "▁cat", "s"], 50)
    assert len(tokens) == len(set(tokens)) == 50
    assert tokens[same_model.EOS] == "</s>" and tokens[same_model.UNK] == "<unk>" and tokens[-1] == "<pad>"
    assert tokens[2:5] == ["▁the", "▁cat", "s"]
    with pytest.raises(ValueError, match="cannot hold"):
        vocabulary([f"p{i}" for i in range(60)], 50)


def test_source_ids_end_with_eos_and_avoid_special_tokens() -> None:
    sources = same_model.source_ids(100, [1, 3], 6)
    assert {b: len(rows) for b, rows in sources.items()} == {1: 1, 3: 3}
    for rows in sources.values():
        for row in rows:
            assert len(row) == 6 and row[-1] == same_model.EOS
            assert all(same_model.UNK < t < 99 for t in row[:-1])  # never </s>, <unk> or <pad> inside


def _ids(greedy: list[list[int]], beam: list[list[int]]) -> dict[tuple[int, int], list[list[int]]]:
    return {(2, 1): greedy, (2, 4): beam}


def test_identical_greedy_passes_and_beam_or_int8_differences_are_counted() -> None:
    ours = _ids([[5, 6, 7], [8, 9, 10]], [[5, 6, 7], [8, 9, 10]])
    ids = {
        "ours": ours,
        "hf": _ids([[5, 6, 7], [8, 9, 10]], [[5, 6, 7], [8, 9, 11]]),  # beam differs in one sentence
        "ct2-int8": _ids([[5, 6, 8], [8, 9, 10]], [[5, 6, 7], [8, 9, 10]]),  # int8: counted, not required
    }
    agreement = compare(ids, new_tokens=3)
    assert {(a["tool"], a["beam"]): (a["identical"], a["sentences"]) for a in agreement} == {
        ("hf", 1): (2, 2),
        ("hf", 4): (1, 2),
        ("ct2-int8", 1): (1, 2),
        ("ct2-int8", 4): (2, 2),
    }
    notes = " ".join(same_model.agreement_notes({"reference": "ours", "agreement": agreement}))
    assert "Beam 4, best hypothesis: hf 1 of 2 sentences." in notes
    assert "ct2-int8 1 of 2 (greedy), ct2-int8 2 of 2 (beam 4)." in notes


def test_a_differing_greedy_sentence_raises_with_the_diff() -> None:
    ours = _ids([[5, 6, 7, 8], [8, 9, 10, 11]], [[5, 6, 7, 8], [8, 9, 10, 11]])
    ids = {"ours": ours, "optimum": _ids([[5, 6, 7, 8], [8, 9, 12, 13]], ours[(2, 4)])}
    with pytest.raises(TokensDiffer) as err:
        compare(ids, new_tokens=4)
    message = str(err.value)
    assert "optimum batch 2 greedy: 1 of 2 sentences differ from ours;" in message
    assert "sentence 1 from step 2: ours [10, 11], optimum [12, 13]" in message


def test_a_wrong_length_raises_for_any_tool() -> None:
    ours = _ids([[5, 6, 7], [8, 9, 10]], [[5, 6, 7], [8, 9, 10]])
    ids = {"ours": ours, "ct2-int8": _ids([[5, 6], [8, 9, 10]], ours[(2, 4)])}  # stopped early (EOS)
    with pytest.raises(TokensDiffer, match=r"ct2-int8 batch 2 beam 1: sentences \[0\] are not 3 tokens long"):
        compare(ids, new_tokens=3)


def test_layout_ratios_take_ctranslate2s_faster_layout_per_case() -> None:
    """The headline ratio sets this engine against whichever CTranslate2 layout was faster in each case,
    and int8 ÷ fp32 is reported for both sides."""
    rows = [
        {"tool": tool, "batch": 32, "beam": 1, "tokens_per_s": tps}
        for tool, tps in (
            ("ours", 100.0),
            ("ct2", 50.0),
            ("ct2-workers", 125.0),
            ("ours-int8", 200.0),
            ("ct2-int8", 400.0),
            ("ct2-int8-workers", 250.0),
        )
    ]
    text = " ".join(same_model.layout_ratios(rows))
    assert "This engine ÷ the faster CTranslate2 layout, fp32: greedy b32 0.80×." in text
    assert "This engine ÷ the faster CTranslate2 layout, int8: greedy b32 0.50×." in text
    assert "int8 ÷ fp32, this engine: greedy b32 2.00×." in text
    assert "int8 ÷ fp32, CTranslate2 (faster layouts): greedy b32 3.20×." in text


def test_t5_source_ids_hold_ordinary_pieces_only() -> None:
    vocab = 32128
    sources = same_model.source_ids(vocab, [4], 400, family="t5")
    for row in sources[4]:
        assert len(row) == 400 and row[-1] == same_model_t5.EOS
        # never <pad>, </s> or <unk> inside, nor a sentinel (32000..32099) or a spare row (32100..)
        assert all(same_model_t5.UNK < t < 32000 for t in row[:-1])


def test_t5_tokenizer_has_t5_smalls_layout(tmp_path: Path) -> None:
    size = same_model_t5.write_tokenizer(tmp_path, same_model.sentences(same_model.WORDS, 64), vocab=328)
    assert size == 328 - same_model_t5.SPARE_ROWS  # pieces, then 100 sentinels; 28 spare rows past them
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert tok.convert_ids_to_tokens([0, 1, 2, 299, 200]) == ["<pad>", "</s>", "<unk>", "<extra_id_0>", "<extra_id_99>"]
    text = "the small cat sees the window"
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text  # the fillers tokenize nothing


def test_ct2_vocabulary_may_drop_or_add_one_rows_kind_only() -> None:
    tokens = ["</s>", "<unk>", "▁a", "<pad>"]
    same_model.check_ct2_vocabulary(tokens, tokens[:-1])  # Marian's converter drops <pad>
    same_model.check_ct2_vocabulary(tokens, [*tokens, "<extra_id_0>"])  # T5's names the spare rows again
    for wrong in (tokens[:-2], ["</s>", "▁a", "<unk>", "<pad>"]):
        with pytest.raises(RuntimeError, match="does not begin with"):
            same_model.check_ct2_vocabulary(tokens, wrong)


def test_cpu_ratios_compare_calls_per_cpu_second_at_each_precision() -> None:
    rows = [
        {"tool": "ours", "batch": 1, "beam": 1, "cpu_seconds": 2.0},
        {"tool": "ct2", "batch": 1, "beam": 1, "cpu_seconds": 3.0},
        {"tool": "ours-int8", "batch": 1, "beam": 1, "cpu_seconds": 2.0},
        {"tool": "ct2-int8", "batch": 1, "beam": 1, "cpu_seconds": 1.0},
        {"tool": "ours", "batch": 32, "beam": 4, "cpu_seconds": 4.0},  # CTranslate2 lacks this case: no cell
    ]
    text = " ".join(same_model.cpu_ratios(rows))
    assert "CPU seconds a call, fp32: greedy b1 1.50×." in text
    assert "CPU seconds a call, int8: greedy b1 0.50×." in text
