"""Imported Hugging Face classifiers (`export.hf.classifiers`, each family's layout from its registry
entry, `export.hf.families`): ONNX Runtime against transformers on tiny random models of every family,
labels from id2label, refused options, refused exports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers
from torch import nn

from export.hf import ImportProblem
from export.hf import classifiers as clf
from export.hf.classifiers import ClassifierLayout
from export.hf.families import FAMILIES, family_of
from export.validate import FP32_TOL, ExportError, session
from service.contract.graphs import pad
from tests.hf_checkpoints import DEBERTA_V2, DEBERTA_V3

pytestmark = pytest.mark.families  # Hugging Face families against transformers: left out of `make test-fast`

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SIZES = {"vocab_size": 120, "max_position_embeddings": 64, "id2label": LABELS}
BERT_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
DISTILBERT_SIZES = {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37}
ROBERTA_IDS = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
# the encoder families; BART (an encoder-decoder pooled at its end token) is checked on pairs below
CLASSIFIERS = [f.model_type for f in FAMILIES if isinstance(f.graph, ClassifierLayout) and not f.graph.pool_eos]


def layout(family: str) -> ClassifierLayout:
    """The family's quirks as its registry entry states them."""
    graph = family_of(tiny_config(family)).graph
    assert isinstance(graph, ClassifierLayout)
    return graph


def tiny_config(family: str, **options: object) -> transformers.PretrainedConfig:
    """hidden 32, 2 layers, 4 heads, intermediate 37, vocab 120, 64 positions, 3 labels; `options` win."""
    if family == "bert":
        return transformers.BertConfig(**{**SIZES, **BERT_SIZES, **options})
    if family == "distilbert":
        return transformers.DistilBertConfig(**{**SIZES, **DISTILBERT_SIZES, **options})
    if family == "roberta":
        return transformers.RobertaConfig(**{**SIZES, **BERT_SIZES, **ROBERTA_IDS, **options})
    if family == "deberta-v2":  # v3's layout: relative attention over log buckets, no positions, no token types
        return transformers.DebertaV2Config(**{**SIZES, **BERT_SIZES, **DEBERTA_V3, **options})
    return transformers.XLMRobertaConfig(**{**SIZES, **BERT_SIZES, **ROBERTA_IDS, "hidden_act": "gelu_new", **options})


def tiny_model(family: str, **options: object) -> transformers.PreTrainedModel:
    """Seeded, loaded as from_pretrained would load it (sdpa attention), every weight moved well off
    its initial value: under the default init (std 0.02, zero biases, unit norms) the logits are
    about 0.02 and attention nearly uniform, so a missing pooler tanh moves the logits by only 5e-4
    (measured); here by 6."""
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(tiny_config(family, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def batches(config: transformers.PretrainedConfig) -> list[clf.Batch]:
    """Right-padded with the model's pad id: a batch of one at the longest input, one of one token,
    mixed lengths with the longest padded against the shortest, no padding at all; token types 0
    then 1 from a random point of each row (a pair's second text)."""
    rng = np.random.default_rng(7)
    longest = clf.max_sequence_length(config, layout(config.model_type))
    out = []
    for lengths in ([longest], [1], [longest, 3, 1, 10], [5, 12, 8, 2, 9, 30], [6, 6]):
        seqs = [[int(i) for i in rng.integers(3, config.vocab_size, size=n)] for n in lengths]  # no pad id
        ids, mask = pad(seqs, pad_id=config.pad_token_id)
        second = rng.integers(0, ids.shape[1] + 1, size=(len(seqs), 1))
        out.append((ids, mask, ((np.arange(ids.shape[1]) >= second) & (mask == 1)).astype(np.int64)))
    return out


Run = Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]


def max_diffs(
    run: Run, model: transformers.PreTrainedModel, config: transformers.PretrainedConfig
) -> tuple[float, float]:
    """Largest |run - transformers| of the logits (every row) and of the last layer's attention
    weights on real query and key positions, over `batches` (token types where the family has them)."""
    worst_logits = worst_attentions = 0.0
    model.set_attn_implementation("eager")
    try:
        for batch in batches(config):
            inputs = clf.feeds(batch, clf.takes_segments(config, layout(config.model_type)))
            mask = batch[1]
            logits, weights = run(inputs)
            with torch.no_grad():
                ref = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}, output_attentions=True)
            assert logits.shape == tuple(ref.logits.shape) and weights.shape == tuple(ref.attentions[-1].shape)
            worst_logits = max(worst_logits, float(np.abs(logits - ref.logits.numpy()).max()))
            worst_attentions = max(worst_attentions, clf.real_diff(weights, ref.attentions[-1].numpy(), mask))
    finally:
        model.set_attn_implementation("sdpa")
    return worst_logits, worst_attentions


def torch_run(graph: nn.Module) -> Run:
    def run(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            logits, weights = graph(**{k: torch.from_numpy(v) for k, v in inputs.items()})
        return logits.numpy(), weights.numpy()

    return run


@pytest.fixture(scope="module", params=CLASSIFIERS)
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    family = request.param
    model = tiny_model(family)
    path = tmp_path_factory.mktemp(family) / "model.onnx"
    clf.export_classifier(model, layout(family), path)
    return family, model, path


def test_onnx_matches_transformers(exported) -> None:
    family, model, path = exported
    sess = session(path)

    def run(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        logits, weights = sess.run(None, inputs)
        return logits, weights

    logits, attentions = max_diffs(run, model, model.config)
    print(f"{family}: max abs diff logits {logits:.1e}, attentions {attentions:.1e}")
    assert logits <= FP32_TOL and attentions <= FP32_TOL
    loaded = tiny_model(family).config._attn_implementation  # sdpa; eager where there is none (DeBERTa)
    assert model.config._attn_implementation == loaded  # the export put the model back as it was


def test_graph_file_follows_the_contract(exported) -> None:
    family, model, path = exported
    proto = onnx.load(str(path))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input}
    dims |= {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.output}
    segments = {"token_type_ids": ["batch", "sequence"]} if family == "bert" else {}
    assert dims == {
        "input_ids": ["batch", "sequence"],
        "attention_mask": ["batch", "sequence"],
        **segments,  # BERT's segments (IO contract 7); RoBERTa, XLM-R, DistilBERT and DeBERTa-v3 have none
        "logits": ["batch", 3],
        "attentions": ["batch", 4, "sequence", "sequence"],
    }
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]  # one file, no temporary left


def test_padding_changes_no_real_row(exported) -> None:
    """Each row answers as it would alone, whatever id fills the padding (the service's pad id 0 is
    RoBERTa's <s>): positions of real tokens do not depend on what follows them. (A padded query's
    own weights are not compared: DeBERTa's pairwise mask leaves it nothing to attend, so uniform.)"""
    family, model, path = exported
    sess = session(path)
    segments = clf.takes_segments(model.config, layout(family))
    seqs = [[5, 9, 17, 30, 4], [8, 11], [40]]
    for pad_id in {model.config.pad_token_id, 0}:
        ids, mask = pad(seqs, pad_id=pad_id)
        types = mask * (np.arange(ids.shape[1]) >= 1)  # the second segment from the second token
        logits, weights = sess.run(None, clf.feeds((ids, mask, types), segments))
        for row, seq in enumerate(seqs):
            part = (ids[row : row + 1, : len(seq)], mask[row : row + 1, : len(seq)], types[row : row + 1, : len(seq)])
            alone, alone_weights = sess.run(None, clf.feeds(part, segments))
            assert np.abs(logits[row] - alone[0]).max() <= 1e-5
            assert np.abs(weights[row, :, : len(seq), : len(seq)] - alone_weights[0]).max() <= 1e-5
            assert np.all(weights[row, :, : len(seq), len(seq) :] == 0.0)  # padding takes no real row's attention


def drop_pooler_tanh(graph: nn.Module) -> None:
    graph.head = nn.Sequential(graph.head[0], graph.head[2])


def shift_positions(graph: nn.Module) -> None:
    """Position p reads row p - 1: an off-by-one in RoBERTa's pad-id offset."""
    table = graph.embeddings.positions.weight.detach()
    graph.embeddings.positions = nn.Embedding.from_pretrained(torch.roll(table, 1, dims=0))


def drop_position_to_content(graph: nn.Module) -> None:
    """DeBERTa's p2c term left out (its scale kept)."""
    for layer in graph.layers:
        layer.pos_q = None


@pytest.mark.parametrize(
    ("family", "break_graph"),
    [("bert", drop_pooler_tanh), ("roberta", shift_positions), ("deberta-v2", drop_position_to_content)],
)
def test_a_graph_that_differs_is_caught(family: str, break_graph, tmp_path: Path, monkeypatch) -> None:
    """The comparisons above would see these mistakes, and the export refuses to write them."""
    model = tiny_model(family)
    loader = layout(family).loader

    def broken(model: nn.Module, heads: int) -> clf.HFClassifierGraph:
        graph = loader(model, heads)
        break_graph(graph)
        return graph

    wrong = dataclasses.replace(layout(family), loader=broken)
    logits, _ = max_diffs(torch_run(clf.classifier_graph(model, wrong)), model, model.config)
    assert logits > 10 * FP32_TOL
    with pytest.raises(ExportError, match="graph module vs transformers"):
        clf.export_classifier(model, wrong, tmp_path / "model.onnx")
    assert not list(tmp_path.iterdir())


def test_labels_in_id_order() -> None:
    config = tiny_config("bert", id2label={"2": "positive", "0": "negative", "1": "neutral"})
    assert clf.labels(config) == ["negative", "neutral", "positive"]


@pytest.mark.parametrize(
    ("id2label", "message"),
    [
        ({0: "a", 1: "b", 2: "a"}, r"more than one id: \['a'\]"),
        ({0: "a", 2: "c"}, r"no label name for ids \[1\]"),
        ({0: "a", 1: " "}, r"no label name for ids \[1\]"),
    ],
)
def test_labels_refuses_missing_or_repeated_names(id2label: dict, message: str) -> None:
    with pytest.raises(ImportProblem, match=message):
        clf.labels(tiny_config("distilbert", id2label=id2label))


@pytest.mark.parametrize(
    ("family", "options", "message"),
    [
        ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
        ("roberta", {"is_decoder": True, "add_cross_attention": True}, "is_decoder=True.*add_cross_attention=True"),
        ("bert", {"problem_type": "multi_label_classification"}, "problem_type='multi_label_classification'"),
        ("distilbert", {"problem_type": "regression"}, "problem_type='regression'"),
        ("xlm-roberta", {"pruned_heads": {1: [0]}}, r"pruned_heads=\{1: \[0\]\}"),
        ("roberta", {"pad_token_id": None}, "pad_token_id=None"),
        ("bert", {"max_position_embeddings": 4}, "max_position_embeddings=4 leaves 4 positions"),
        (
            "deberta-v2",
            {"position_buckets": 256, "max_relative_positions": 64},
            "position_buckets=256, max_relative_positions=64: the log buckets do not grow",
        ),
    ],
)
def test_check_supported_names_the_option(family: str, options: dict, message: str) -> None:
    with pytest.raises(ImportProblem, match=f"^{family}: .*{message}"):
        family_of(tiny_config(family, **options)).check(tiny_config(family, **options))


@pytest.mark.parametrize(("family", "positions"), [("bert", 16), ("roberta", 18)])
def test_a_short_position_table_is_checked_within_it(family: str, positions: int, tmp_path: Path) -> None:
    """The export's check batches (one at the longest input, others of fixed lengths) fit the table."""
    config = tiny_config(family, max_position_embeddings=positions)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    clf.export_classifier(model, layout(family), tmp_path / "model.onnx")
    longest = max(ids.shape[1] for ids, *_ in clf.probe_batches(config, layout(family)))
    assert longest == clf.max_sequence_length(config, layout(family)) == 16


DEBERTA_LAYOUTS = {
    "v2": DEBERTA_V2,  # absolute positions, token types, pos_key_proj and pos_query_proj, no buckets, convolution
    "c2p-narrow": {"pos_att_type": "c2p", "share_att_key": False, "embedding_size": 24, "type_vocab_size": 1},
    "p2c": {"pos_att_type": "p2c", "norm_rel_ebd": "none"},
    "absolute": {"relative_attention": False, "position_biased_input": True},
}


@pytest.mark.parametrize("options", DEBERTA_LAYOUTS.values(), ids=DEBERTA_LAYOUTS.keys())
def test_deberta_layouts_match_transformers(options: dict, tmp_path: Path) -> None:
    """DeBERTa's options besides v3's (the `exported` fixture's): each within 1e-4 of transformers
    in ONNX Runtime; token types an input only where the table has two rows."""
    model = tiny_model("deberta-v2", **options)
    clf.export_classifier(model, layout("deberta-v2"), tmp_path / "model.onnx")
    sess = session(tmp_path / "model.onnx")
    assert ("token_type_ids" in [i.name for i in sess.get_inputs()]) == (model.config.type_vocab_size >= 2)
    logits, attentions = max_diffs(lambda inputs: tuple(sess.run(None, inputs)), model, model.config)
    assert logits <= FP32_TOL and attentions <= FP32_TOL


def test_deberta_v3_serves_past_its_bucket_reach(tmp_path: Path) -> None:
    """Without absolute positions the graph takes any length: 300 tokens (past the 64-position table
    and the buckets' reach) answer as transformers does, padded rows too."""
    model, path = tiny_model("deberta-v2"), tmp_path / "model.onnx"
    clf.export_classifier(model, layout("deberta-v2"), path)
    rng = np.random.default_rng(3)
    ids, mask = pad([[int(i) for i in rng.integers(3, 120, size=n)] for n in (300, 170)], pad_id=0)
    logits, weights = session(path).run(None, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_attentions=True)
        model.set_attn_implementation("sdpa")
    assert np.abs(logits - ref.logits.numpy()).max() <= FP32_TOL
    assert clf.real_diff(weights, ref.attentions[-1].numpy(), mask) <= FP32_TOL


def test_deberta_buckets_are_transformers_relative_positions() -> None:
    """The constant table (deberta-v3-base's 256 buckets over 512 positions) gives transformers'
    relative positions at every distance, and past its reach indices both terms clamp alike."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    from export.hf.deberta_classifier import bucket_table

    config = transformers.DebertaV2Config(relative_attention=True, position_buckets=256, max_position_embeddings=512)
    table, reach = bucket_table(config)
    for n in (7, 300, reach + 1, 1500):
        x = torch.zeros(1, n, 4)
        want = build_relative_position(x, x, bucket_size=256, max_position=512)[0]  # (n, n)
        t = torch.arange(n)
        got = table[torch.clamp(t[:, None] - t[None, :], -reach, reach) + reach]
        assert torch.equal(torch.clamp(got + 256, 0, 511), torch.clamp(want + 256, 0, 511))
        assert torch.equal(torch.clamp(-got + 256, 0, 511), torch.clamp(-want + 256, 0, 511))
        assert n - 1 > reach or torch.equal(got, want)  # within its reach, the very same positions


def test_check_supported_accepts_the_families_and_refuses_others() -> None:
    for family in CLASSIFIERS:
        family_of(tiny_config(family)).check(tiny_config(family))
    with pytest.raises(ImportProblem, match="unsupported model family 'gpt2'"):
        family_of(transformers.GPT2Config())


def test_classifier_graph_refuses_a_model_without_the_classifier_head() -> None:
    torch.manual_seed(0)
    with pytest.raises(ImportProblem, match="expected a BertForSequenceClassification, got BertModel"):
        clf.classifier_graph(transformers.BertModel(tiny_config("bert")), layout("bert"))


def test_export_refuses_a_model_past_one_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(clf, "SINGLE_FILE_BYTES", 10_000)
    with pytest.raises(ImportProblem, match="GiB of weights; one ONNX file holds < 2 GiB"):
        clf.export_classifier(tiny_model("distilbert"), layout("distilbert"), tmp_path / "model.onnx")
    assert not list(tmp_path.iterdir())


# -- pairs: a BERT cross-encoder (one label, segments) and a RoBERTa pair classifier, imported --

LONG = "the quick brown fox jumps over the lazy dog near the river bank " * 6
PAIRS = [
    ("the cat sat on the mat", "a dog in the fog"),
    ("x", ""),
    (LONG, "what jumps?"),  # the first text is cut
    ("who sleeps?", LONG),  # the second
    (LONG, LONG[:200]),  # both, the longer keeping the odd token
    ("Hello, world!", "Numbers 12345, 3.14 and 1,000,000."),
]


NLI = {0: "contradiction", 1: "neutral", 2: "entailment"}


@pytest.fixture(
    scope="module",
    params=[
        ("bert", {0: "score"}),
        ("roberta", LABELS),
        ("bart", NLI),
        ("deberta", NLI),  # v3: no token types, relative positions only
        ("deberta", {0: "score"}),  # a v3 cross-encoder
        ("deberta_v2", NLI),  # v2's layout: token types, absolute positions
    ],
    ids=["bert", "roberta", "bart", "deberta-v3", "deberta-v3-scorer", "deberta-v2"],
)
def pair_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(transformers' tokenizer, transformers' model, the imported engine) of one pair classifier."""
    from export.import_hf import ImportOptions, import_checkpoint
    from service.engine.classifier import load_classifier
    from service.engine.runtime import LoadOptions
    from service.store import scan
    from tests.hf_checkpoints import build_classifier

    family, id2label = request.param
    root = tmp_path_factory.mktemp(f"{family}-pairs")
    folder = build_classifier(request.getfixturevalue(family), root / "ckpt", id2label)
    import_checkpoint(folder, root / "store", ImportOptions(name=family), log=lambda _: None)
    [entry] = scan(root / "store")
    engine = load_classifier(entry, LoadOptions(threads=1))
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    return hf_tok, model, engine


def test_pairs_match_transformers_on_a_padded_batch(pair_model) -> None:
    """Framing, segments and `longest_first` truncation as transformers' tokenizer does them; logits
    of one padded batch of pairs within 1e-4 of transformers'."""
    hf_tok, model, engine = pair_model
    limit = engine.codec.pair_budget + engine.codec.pair.length
    enc = hf_tok(
        [a for a, _ in PAIRS], [b for _, b in PAIRS], truncation="longest_first", max_length=limit, padding=True
    )
    rows = engine.encode_pairs(PAIRS, truncate=True)
    mask = np.array(enc["attention_mask"])
    assert [r.ids for r in rows] == [ids[: m.sum()] for ids, m in zip(enc["input_ids"], mask, strict=True)]
    assert max(len(r.ids) for r in rows) == limit  # the long pairs were cut to the limit
    if "token_type_ids" in enc:  # BERT, DeBERTa: segment 1 from the second text on
        types = [[int(i >= r.first) for i in range(len(r.ids))] for r in rows]
        assert types == [t[: m.sum()] for t, m in zip(enc["token_type_ids"], mask, strict=True)]
        assert any(1 in t for t in types)
        # an input of the graph only where the model has a token type table (DeBERTa-v3 has none)
        assert engine.segments == (model.config.type_vocab_size >= 2)
    with torch.no_grad():
        ref = model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()
    got = engine.logits_ids([r.ids for r in rows], [r.first for r in rows])
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= FP32_TOL
    if ref.shape[1] == 1:  # a scorer: its probability is the logit's sigmoid, as transformers' pipeline reads it
        np.testing.assert_allclose(
            engine.classify_ids([r.ids for r in rows], [r.first for r in rows]), 1 / (1 + np.exp(-got))
        )


def test_single_texts_are_unchanged_by_pair_support(pair_model) -> None:
    hf_tok, model, engine = pair_model
    texts = ["the cat sat on the mat", "x"]
    rows = engine.encode_rows(texts)
    enc = hf_tok(texts, padding=True)
    assert [r.ids for r in rows] == [
        ids[: sum(m)] for ids, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)
    ]
    with torch.no_grad():
        ref = model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()
    assert np.abs(engine.logits_ids([r.ids for r in rows]) - ref).max() <= FP32_TOL


def test_a_pair_past_the_limit_is_refused_unless_truncated(pair_model) -> None:
    from service.errors import InputTooLong

    _, _, engine = pair_model
    with pytest.raises(InputTooLong, match=r"pairs\[0\] has \d+ tokens; this model accepts at most \d+ in a pair"):
        engine.encode_pairs([(LONG, LONG)])
    assert (
        len(engine.encode_pairs([(LONG, LONG)], truncate=True)[0].ids)
        == engine.codec.pair_budget + engine.codec.pair.length
    )


def test_longest_first_keeps_what_tokenizers_keeps() -> None:
    from service.engine.tokenizer import longest_first

    assert longest_first(3, 4, 10) == (3, 4)  # fits
    assert longest_first(2, 30, 10) == (2, 8)  # only the longer is cut
    assert longest_first(30, 2, 10) == (8, 2)
    assert longest_first(20, 30, 11) == (5, 6)  # both: halves, the odd id to the longer
    assert longest_first(30, 20, 11) == (6, 5)
    assert longest_first(10, 10, 15) == (7, 8)  # equal: the second counts as the longer
