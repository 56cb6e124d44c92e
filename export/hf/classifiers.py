"""The classifier graph (`service.contract.graphs`) of a Hugging Face BERT-family sequence classifier.

The forward is rebuilt from the checkpoint's own submodules instead of traced through the
transformers forward: that forward returns attention weights only under the eager attention
implementation (from_pretrained picks sdpa), builds its mask through control flow that tracing
freezes, and hides each family's quirks. Here every family states its quirks once, in its `ClassifierLayout`
(its registry entry, `export.hf.families`): its loader (which token type is added, what head sits on
the first token), its transformers class, where positions start. The result
is checked against the transformers model (logits and last-layer attentions) and against ONNX
Runtime before the file is written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import Tensor, nn
from torch.nn import functional as F

from export.graphs import export_graph
from export.hf import ImportProblem
from export.validate import FP32_TOL, ExportError, session
from service.contract import graphs as io
from service.contract.manifest import GraphSpec, TensorSpec


class _Embeddings(nn.Module):
    """Word (+ token type) + position embeddings, then LayerNorm, summed in transformers' order.
    Token types come from a `token_type_ids` input where the family has segments (BERT), else every
    token is in segment 0 (RoBERTa and XLM-R have a one-row table).
    `pad` None: positions 0..T-1 (BERT, DistilBERT). Otherwise fairseq positions from the ids, as
    transformers' `create_position_ids_from_input_ids`: pad + 1 + index for every id that is not the
    pad id, pad for pad ids (RoBERTa, XLM-R); with right padding, real tokens get pad + 1 + index
    whatever id fills the padding. The tables are read directly: an Embedding's padding_idx only
    matters to gradients."""

    def __init__(
        self,
        words: nn.Embedding,
        positions: nn.Embedding,
        norm: nn.LayerNorm,
        types: nn.Embedding | None,
        pad: int | None,
    ) -> None:
        super().__init__()
        self.words, self.positions, self.norm, self.types, self.pad = words, positions, norm, types, pad

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if self.pad is None:
            pos = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1  # (B, T): 0..T-1 for any T
        else:
            real = input_ids.ne(self.pad).long()
            pos = torch.cumsum(real, dim=1) * real + self.pad  # (B, T)
        x = F.embedding(input_ids, self.words.weight)  # (B, T, D)
        if self.types is not None and token_type_ids is not None:
            x = x + F.embedding(token_type_ids, self.types.weight)
        elif self.types is not None:
            x = x + self.types.weight[0]  # no token_type_ids input: every token is in segment 0
        return self.norm(x + F.embedding(pos, self.positions.weight))


class Block(nn.Module):
    """One post-norm encoder layer over the checkpoint's linear and norm modules. The attention is
    written out here so that its weights always come back, whatever implementation the model was
    loaded with; dropout is left out (inference)."""

    def __init__(
        self,
        qkv: tuple[nn.Linear, nn.Linear, nn.Linear],
        out: nn.Linear,
        norm1: nn.LayerNorm,
        ffn: nn.Module,
        norm2: nn.LayerNorm,
        heads: int,
    ) -> None:
        super().__init__()
        self.q, self.k, self.v = qkv
        self.out, self.norm1, self.ffn, self.norm2, self.heads = out, norm1, ffn, norm2, heads
        self.d_k = out.in_features // heads
        self.scale = self.d_k**-0.5

    def forward(self, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        def split(lin: nn.Linear) -> Tensor:
            return lin(x).view(x.shape[0], -1, self.heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)

        scores = torch.matmul(split(self.q), split(self.k).transpose(2, 3)) * self.scale + bias  # (B, H, T, T)
        weights = torch.softmax(scores, dim=-1)
        context = torch.matmul(weights, split(self.v)).transpose(1, 2).reshape(x.shape)  # (B, T, D)
        x = self.norm1(self.out(context) + x)
        return self.norm2(self.ffn(x) + x), weights


class HFClassifierGraph(nn.Module):
    """forward(input_ids, attention_mask[, token_type_ids]) -> (logits, last layer's attention
    weights), per the contract."""

    def __init__(self, embeddings: _Embeddings, blocks: list[Block], head: nn.Module) -> None:
        super().__init__()
        self.embeddings, self.blocks, self.head = embeddings, nn.ModuleList(blocks), head

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        keep = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        # the additive mask transformers builds for eager attention: exp(min - max) is exactly 0
        bias = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        weights = x.new_zeros(())
        for block in self.blocks:
            x, weights = block(x, bias)
        return self.head(x[:, 0]), weights  # every family classifies from the first token


def bert_block(layer: nn.Module, heads: int) -> Block:
    """BERT, RoBERTa and XLM-R layers: same module names, `intermediate` holds dense + activation."""
    att = layer.attention
    ffn = nn.Sequential(layer.intermediate, layer.output.dense)
    return Block(
        (att.self.query, att.self.key, att.self.value),
        att.output.dense,
        att.output.LayerNorm,
        ffn,
        layer.output.LayerNorm,
        heads,
    )


def bert(model: nn.Module, heads: int) -> HFClassifierGraph:
    """[CLS] -> tanh pooler -> classifier; token types from the input (segments); positions from 0."""
    base, emb = model.bert, model.bert.embeddings
    if base.pooler is None:
        raise ImportProblem("bert: the model has no pooler, which the sequence classifier's head reads")
    embeddings = _Embeddings(
        emb.word_embeddings, emb.position_embeddings, emb.LayerNorm, emb.token_type_embeddings, None
    )
    head = nn.Sequential(base.pooler.dense, nn.Tanh(), model.classifier)
    return HFClassifierGraph(embeddings, [bert_block(layer, heads) for layer in base.encoder.layer], head)


def distilbert(model: nn.Module, heads: int) -> HFClassifierGraph:
    """[CLS] -> pre_classifier -> ReLU -> classifier; no token types; positions from 0."""
    emb = model.distilbert.embeddings
    embeddings = _Embeddings(emb.word_embeddings, emb.position_embeddings, emb.LayerNorm, None, None)
    blocks = [
        Block(
            (b.attention.q_lin, b.attention.k_lin, b.attention.v_lin),
            b.attention.out_lin,
            b.sa_layer_norm,
            nn.Sequential(b.ffn.lin1, b.ffn.activation, b.ffn.lin2),
            b.output_layer_norm,
            heads,
        )
        for b in model.distilbert.transformer.layer
    ]
    head = nn.Sequential(model.pre_classifier, nn.ReLU(), model.classifier)
    return HFClassifierGraph(embeddings, blocks, head)


def roberta(model: nn.Module, heads: int) -> HFClassifierGraph:
    """<s> -> dense -> tanh -> out_proj (no pooler); token type 0 added; positions from pad id + 1."""
    emb = model.roberta.embeddings
    embeddings = _Embeddings(
        emb.word_embeddings, emb.position_embeddings, emb.LayerNorm, emb.token_type_embeddings, emb.padding_idx
    )
    head = nn.Sequential(model.classifier.dense, nn.Tanh(), model.classifier.out_proj)
    return HFClassifierGraph(embeddings, [bert_block(layer, heads) for layer in model.roberta.encoder.layer], head)


MIN_TOKENS = 8  # a position table shorter than this is refused


@dataclass(frozen=True)
class ClassifierLayout:
    """A BERT-family classifier's quirks: how its graph is built from the checkpoint's modules, the
    transformers class that holds them, whether positions count from the pad id (RoBERTa) and
    whether the graph takes segment ids (BERT's `token_type_ids`, IO contract 7)."""

    loader: Callable[[nn.Module, int], nn.Module]  # (model, heads) -> graph over its weights
    model_class: str  # e.g. "BertForSequenceClassification"
    positions_from_pad: bool = False  # fairseq positions: pad id + 1 + index
    # a token_type_ids input where the config's table has two rows or more: a pair's second text is
    # segment 1 (BERT, DeBERTa-v2; DeBERTa-v3 has no table)
    segments: bool = False
    pool_eos: bool = False  # an encoder-decoder read at each row's last end token (BART): no encoder-only checks
    # the family's own refusals: what of a config its graph would not reproduce, one phrase each
    check: Callable[[transformers.PretrainedConfig], list[str]] | None = None


def takes_segments(config: transformers.PretrainedConfig, layout: ClassifierLayout) -> bool:
    """Whether the graph takes `token_type_ids`: a family with segments whose config has a token
    type table of two rows or more (with one row every token is in segment 0; with none, nothing is added)."""
    return layout.segments and getattr(config, "type_vocab_size", 2) >= 2


def check_supported(config: transformers.PretrainedConfig, layout: ClassifierLayout) -> None:
    """Refuses, naming every offending option, a config whose model the graph would not reproduce:
    a graph that ran but answered differently from the checkpoint would be worse than none."""
    family = getattr(config, "model_type", None)
    problems = []
    position = getattr(config, "position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        problems.append(f"position_embedding_type={position!r}: only absolute position embeddings are implemented")
    refused = ("is_decoder", "add_cross_attention") + (() if layout.pool_eos else ("is_encoder_decoder",))
    for option in refused:
        if getattr(config, option, False):
            problems.append(f"{option}=True: the graph is a bidirectional encoder without cross-attention")
    scorer = config.num_labels == 1  # a cross-encoder: one logit, read through a sigmoid
    if config.problem_type not in (None, "single_label_classification") and not (
        scorer and config.problem_type == "regression"
    ):
        problems.append(
            f"problem_type={config.problem_type!r}: the service reads logits as one softmax over the labels "
            "(or one logit's sigmoid)"
        )
    if (config.num_labels or 0) < 1:
        problems.append(f"num_labels={config.num_labels}: a classifier needs a label")
    if getattr(config, "pruned_heads", None):
        problems.append(f"pruned_heads={config.pruned_heads}: every layer must keep all its heads")
    if layout.positions_from_pad and config.pad_token_id is None:
        problems.append("pad_token_id=None: RoBERTa positions are counted from the pad id")
    elif max_sequence_length(config, layout) < MIN_TOKENS:
        problems.append(
            f"max_position_embeddings={config.max_position_embeddings} leaves {max_sequence_length(config, layout)} "
            f"positions: too few to classify a text (at least {MIN_TOKENS})"
        )
    if layout.check is not None:
        problems += layout.check(config)
    if problems:
        raise ImportProblem(f"{family}: " + "; ".join(problems))


def labels(config: transformers.PretrainedConfig) -> list[str]:
    """The label names in id order, from `config.id2label`; refuses gaps and repeats, which would
    make an answer's label ambiguous."""
    id2label = getattr(config, "id2label", None) or {}
    try:
        by_id = {int(i): name for i, name in id2label.items()}
    except (TypeError, ValueError) as e:
        raise ImportProblem(f"id2label: label ids must be integers ({e})") from None
    n = max(config.num_labels or 0, len(by_id))
    if n == 0:
        raise ImportProblem("id2label: no labels")
    missing = [i for i in range(n) if not isinstance(by_id.get(i), str) or not by_id[i].strip()]
    if missing or len(by_id) != n:
        extra = sorted(set(by_id) - set(range(n)))
        raise ImportProblem(
            f"id2label: no label name for ids {missing} of 0..{n - 1}" + (f", stray ids {extra}" * bool(extra))
        )
    names = [by_id[i] for i in range(n)]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ImportProblem(f"id2label: label names used for more than one id: {repeated}")
    return names


def max_sequence_length(config: transformers.PretrainedConfig, layout: ClassifierLayout) -> int:
    """The longest input the position table covers: RoBERTa-style positions start at pad id + 1."""
    if layout.positions_from_pad:
        return config.max_position_embeddings - config.pad_token_id - 1
    return config.max_position_embeddings


def graph_spec(config: transformers.PretrainedConfig, layout: ClassifierLayout) -> GraphSpec:
    """The classifier contract's IO, with this model's label and head counts and, where the family
    has segments, its token_type_ids input."""
    names = (io.INPUT_IDS, io.ATTENTION_MASK, *((io.TOKEN_TYPE_IDS,) if takes_segments(config, layout) else ()))
    ids = [TensorSpec(name=name, dtype="int64", shape=["batch", "sequence"]) for name in names]
    out = [
        TensorSpec(name=io.LOGITS, dtype="float32", shape=["batch", config.num_labels]),
        TensorSpec(
            name=io.ATTENTIONS, dtype="float32", shape=["batch", config.num_attention_heads, "sequence", "sequence"]
        ),
    ]
    return GraphSpec(inputs=ids, outputs=out)


def classifier_graph(model: transformers.PreTrainedModel, layout: ClassifierLayout) -> nn.Module:
    """The contract's forward over `model`'s own weights (shared, not copied), in eval mode."""
    check_supported(model.config, layout)
    family = model.config.model_type
    if type(model).__name__ != layout.model_class:
        raise ImportProblem(f"{family}: expected a {layout.model_class}, got {type(model).__name__}")
    wrong = sorted({str(p.dtype) for p in model.parameters()} - {"torch.float32"})
    if wrong:
        raise ImportProblem(f"{family}: parameters in {wrong}; load the checkpoint with dtype=torch.float32")
    return layout.loader(model, model.config.num_attention_heads).eval()


Batch = tuple[np.ndarray, np.ndarray, np.ndarray]  # input_ids, attention_mask, token_type_ids (B, T)


def probe_batches(config: transformers.PretrainedConfig, layout: ClassifierLayout, seed: int = 0) -> list[Batch]:
    """Right-padded int64 batches of several sizes and lengths, one at the longest input: what an
    export is checked on. Ids avoid the pad id, as a tokenizer's real tokens do; token types are 0
    then 1 from a random point of each row (a pair's second text), 0 on padding."""
    rng = np.random.default_rng(seed)
    longest = max_sequence_length(config, layout)
    shapes = [[longest], [1, 5, 9], [7, 7], [3, min(40, longest), 2, 17], [1]]
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    eos = config.eos_token_id if layout.pool_eos else None
    batches = []
    for lengths in shapes:
        seqs = []
        for n in lengths:
            ids = rng.integers(0, config.vocab_size - 1, size=min(n, longest))
            seq = [int(i) + (i >= pad) for i in ids]  # skip the pad id
            if eos is not None:  # one end token, last, in every row: what the eos pooling reads
                seq = [max(pad, eos) + 1 if i == eos else i for i in seq[:-1]] + [eos]
            seqs.append(seq)
        ids, mask = io.pad(seqs, pad_id=pad)
        second = rng.integers(0, ids.shape[1] + 1, size=(len(seqs), 1))  # (B, 1) where segment 1 starts
        types = ((np.arange(ids.shape[1])[None, :] >= second) & (mask == 1)).astype(np.int64)  # (B, T)
        batches.append((ids, mask, types))
    return batches


def feeds(batch: Batch, segments: bool) -> dict[str, np.ndarray]:
    """The graph's inputs for a probe batch: its token types only where the graph takes segments
    (`takes_segments`)."""
    ids, mask, types = batch
    return {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask} | ({io.TOKEN_TYPE_IDS: types} if segments else {})


@contextlib.contextmanager
def _eager(model: transformers.PreTrainedModel) -> Iterator[None]:
    """transformers returns attention weights only from its eager attention; the model is put back
    as it was."""
    before = model.config._attn_implementation
    if before != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if before != "eager":
            model.set_attn_implementation(before)


def real_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Largest difference of two (B, H, T, T) attention tensors over real query and key positions."""
    real = (mask[:, None, :, None] * mask[:, None, None, :]).astype(bool)  # (B, 1, T, T)
    return float(np.abs(np.where(real, a - b, 0.0)).max())


def last_attentions(output: object) -> Tensor:
    """transformers' last layer self-attention weights: an encoder's (`attentions`), or an
    encoder-decoder's encoder's (`encoder_attentions`, BART)."""
    found = getattr(output, "attentions", None)
    layers = found if found is not None else output.encoder_attentions  # type: ignore[attr-defined]
    return layers[-1]


def _check(name: str, logits: float, attentions: float) -> None:
    if logits > FP32_TOL or attentions > FP32_TOL:
        raise ExportError(f"{name}: max abs diff logits {logits:.2e}, attentions {attentions:.2e} > {FP32_TOL:.0e}")


SINGLE_FILE_BYTES = 2**31 - 2**26
"""Protobuf's 2 GiB message limit less room for the graph: past it the exporter writes external
tensor files, which the store refuses."""


def export_classifier(model: transformers.PreTrainedModel, layout: ClassifierLayout, path: Path) -> None:
    """Writes the fp32 classifier graph to `path` (the version's `model.onnx`), only once it matches
    the transformers model and the graph module within FP32_TOL on every probe batch. Leaves the
    model in eval mode, its attention implementation as it was."""
    graph = classifier_graph(model, layout)
    size = sum(p.numel() * p.element_size() for p in graph.parameters())
    if size > SINGLE_FILE_BYTES:
        raise ImportProblem(
            f"{model.config.model_type}: {size / 2**30:.2f} GiB of weights; one ONNX file holds < 2 GiB"
        )
    spec = graph_spec(model.config, layout)
    batches = probe_batches(model.config, layout)
    segments = takes_segments(model.config, layout)
    with torch.no_grad(), _eager(model):
        model.eval()
        expected = []
        for batch in batches:
            inputs = {k: torch.from_numpy(v) for k, v in feeds(batch, segments).items()}
            ref = model(**inputs, output_attentions=True)
            logits, weights = graph(**inputs)
            mask = batch[1]
            _check(
                "graph module vs transformers",
                (logits - ref.logits).abs().max().item(),
                real_diff(weights.numpy(), last_attentions(ref).numpy(), mask),
            )
            expected.append((logits.numpy(), weights.numpy()))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with torch.no_grad():
            example = tuple(torch.from_numpy(v) for v in feeds(batches[1], segments).values())
            export_graph(graph, example, spec, tmp)
        sess = session(tmp)
        for batch, (logits, weights) in zip(batches, expected, strict=True):
            got_logits, got_weights = sess.run(None, feeds(batch, segments))
            _check(
                "ONNX Runtime vs graph module",
                float(np.abs(got_logits - logits).max()),
                real_diff(got_weights, weights, batch[1]),
            )
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
