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

pytestmark = pytest.mark.families  # Hugging Face families against transformers: left out of `make test-fast`

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SIZES = {"vocab_size": 120, "max_position_embeddings": 64, "id2label": LABELS}
BERT_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
DISTILBERT_SIZES = {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37}
ROBERTA_IDS = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
CLASSIFIERS = [family.model_type for family in FAMILIES if family.task == "classification"]


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
    return transformers.XLMRobertaConfig(**{**SIZES, **BERT_SIZES, **ROBERTA_IDS, "hidden_act": "gelu_new", **options})


def tiny_model(family: str) -> transformers.PreTrainedModel:
    """Seeded, loaded as from_pretrained would load it (sdpa attention), every weight moved well off
    its initial value: under the default init (std 0.02, zero biases, unit norms) the logits are
    about 0.02 and attention nearly uniform, so a missing pooler tanh moves the logits by only 5e-4
    (measured); here by 6."""
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(tiny_config(family)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def batches(config: transformers.PretrainedConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """Right-padded with the model's pad id: a batch of one at the longest input, one of one token,
    mixed lengths with the longest padded against the shortest, no padding at all."""
    rng = np.random.default_rng(7)
    longest = clf.max_sequence_length(config, layout(config.model_type))
    out = []
    for lengths in ([longest], [1], [longest, 3, 1, 10], [5, 12, 8, 2, 9, 30], [6, 6]):
        seqs = [[int(i) for i in rng.integers(3, config.vocab_size, size=n)] for n in lengths]  # no pad id
        out.append(pad(seqs, pad_id=config.pad_token_id))
    return out


def max_diffs(
    run: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    model: transformers.PreTrainedModel,
    config: transformers.PretrainedConfig,
) -> tuple[float, float]:
    """Largest |run - transformers| of the logits (every row) and of the last layer's attention
    weights on real query and key positions, over `batches`."""
    worst_logits = worst_attentions = 0.0
    model.set_attn_implementation("eager")
    try:
        for ids, mask in batches(config):
            logits, weights = run(ids, mask)
            with torch.no_grad():
                ref = model(
                    input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_attentions=True
                )
            assert logits.shape == tuple(ref.logits.shape) and weights.shape == tuple(ref.attentions[-1].shape)
            worst_logits = max(worst_logits, float(np.abs(logits - ref.logits.numpy()).max()))
            worst_attentions = max(worst_attentions, clf.real_diff(weights, ref.attentions[-1].numpy(), mask))
    finally:
        model.set_attn_implementation("sdpa")
    return worst_logits, worst_attentions


def torch_run(graph: nn.Module) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def run(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            logits, weights = graph(torch.from_numpy(ids), torch.from_numpy(mask))
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

    def run(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, weights = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        return logits, weights

    logits, attentions = max_diffs(run, model, model.config)
    print(f"{family}: max abs diff logits {logits:.1e}, attentions {attentions:.1e}")
    assert logits <= FP32_TOL and attentions <= FP32_TOL
    assert model.config._attn_implementation == "sdpa"  # the export put the model back as it was


def test_graph_file_follows_the_contract(exported) -> None:
    _, model, path = exported
    proto = onnx.load(str(path))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input}
    dims |= {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.output}
    assert dims == {
        "input_ids": ["batch", "sequence"],
        "attention_mask": ["batch", "sequence"],
        "logits": ["batch", 3],
        "attentions": ["batch", 4, "sequence", "sequence"],
    }
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]  # one file, no temporary left


def test_padding_changes_no_real_row(exported) -> None:
    """Each row answers as it would alone, whatever id fills the padding (the service's pad id 0 is
    RoBERTa's <s>): positions of real tokens do not depend on what follows them."""
    _, model, path = exported
    sess = session(path)
    seqs = [[5, 9, 17, 30, 4], [8, 11], [40]]
    for pad_id in {model.config.pad_token_id, 0}:
        ids, mask = pad(seqs, pad_id=pad_id)
        logits, weights = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        for row, seq in enumerate(seqs):
            alone, alone_weights = sess.run(
                None, {"input_ids": ids[row : row + 1, : len(seq)], "attention_mask": mask[row : row + 1, : len(seq)]}
            )
            assert np.abs(logits[row] - alone[0]).max() <= 1e-5
            assert np.abs(weights[row, :, : len(seq), : len(seq)] - alone_weights[0]).max() <= 1e-5
            assert np.all(weights[row, :, :, len(seq) :] == 0.0)  # padding takes no attention


def drop_pooler_tanh(graph: nn.Module) -> None:
    graph.head = nn.Sequential(graph.head[0], graph.head[2])


def shift_positions(graph: nn.Module) -> None:
    """Position p reads row p - 1: an off-by-one in RoBERTa's pad-id offset."""
    table = graph.embeddings.positions.weight.detach()
    graph.embeddings.positions = nn.Embedding.from_pretrained(torch.roll(table, 1, dims=0))


@pytest.mark.parametrize(("family", "break_graph"), [("bert", drop_pooler_tanh), ("roberta", shift_positions)])
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
        (
            "distilbert",
            {"problem_type": "regression", "id2label": {0: "score"}},
            "problem_type='regression'.*num_labels=1",
        ),
        ("xlm-roberta", {"pruned_heads": {1: [0]}}, r"pruned_heads=\{1: \[0\]\}"),
        ("roberta", {"pad_token_id": None}, "pad_token_id=None"),
        ("bert", {"max_position_embeddings": 4}, "max_position_embeddings=4 leaves 4 positions"),
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
    longest = max(ids.shape[1] for ids, _ in clf.probe_batches(config, layout(family)))
    assert longest == clf.max_sequence_length(config, layout(family)) == 16


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
