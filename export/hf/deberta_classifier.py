"""The classifier graph (`service.contract.graphs`) of a `DebertaV2ForSequenceClassification`
(DeBERTa-v2 and v3: most current cross-encoders and NLI models).

As `export.hf.classifiers` does for the BERT family, the forward is rebuilt from the checkpoint's
own submodules. Quirks stated here once, as transformers' modeling_deberta_v2 has them:
- disentangled attention: content->content scores plus, per `pos_att_type`, content->position
  (`c2p`: each query against the relative-position keys of its distance to each key) and
  position->content (`p2c`: each key against the relative-position queries of its distance to
  each query), all over sqrt(head_dim * (1 + number of those terms));
- relative distances log-bucketed (`position_buckets`, `max_relative_positions`); the buckets are a
  constant table over distances made by transformers' own `make_log_bucket_position`, so the graph
  holds no logarithm to round otherwise, and it serves any length: past the table's reach both
  terms read the end rows of the relative embeddings, as transformers' clamp makes them;
- `rel_embeddings`, through the encoder's LayerNorm where `norm_rel_ebd` says `layer_norm`; their
  keys and queries are the content ones where `share_att_key` (v3), else `pos_key_proj` and
  `pos_query_proj`;
- absolute positions added only where `position_biased_input` (v3: none); token types only where
  `type_vocab_size` > 0 (v3: none, so no `token_type_ids` input); `embed_proj` where the embedding
  is narrower than the hidden size; padded positions zeroed after the embedding LayerNorm;
- DeBERTa-v2's convolution beside the first layer (`conv_kernel_size`);
- the ContextPooler: dense on the first token, then `pooler_hidden_act`; then the classifier.
The attention mask is transformers' pairwise one (a padded query attends to nothing, so its weights
are uniform); real rows never see the padding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers.activations import ACT2FN
from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_deberta

from export.hf import ImportProblem

LOW = torch.finfo(torch.float32).min
MAX_REACH = 1 << 16  # the farthest distance searched for where the buckets stop changing the scores


def pos_att_terms(config: object) -> tuple[bool, bool]:
    """(c2p, p2c): the relative terms the config names (transformers ignores any other entry)."""
    kinds = getattr(config, "pos_att_type", None) or []
    return "c2p" in kinds, "p2c" in kinds


def _span(config: object) -> tuple[int, int, int]:
    """(position_buckets, max_relative_positions, att_span) as transformers derives them."""
    buckets = getattr(config, "position_buckets", -1)
    most = getattr(config, "max_relative_positions", -1)
    most = most if most >= 1 else config.max_position_embeddings  # type: ignore[attr-defined]
    return buckets, most, buckets if buckets > 0 else most


def bucket_table(config: object) -> tuple[Tensor, int]:
    """(transformers' relative position of every distance q - k in -reach .. reach, reach): from
    `reach` on, both terms' indices are clamped to the ends of the relative embeddings (buckets grow
    with distance), so a distance past it reads as `reach` does."""
    buckets, most, span = _span(config)

    def position(d: Tensor) -> Tensor:
        return hf_deberta.make_log_bucket_position(d, buckets, most) if buckets > 0 and most > 0 else d

    reach = max(span, 1)
    while reach <= MAX_REACH:
        far = position(torch.tensor([-reach, reach])).long()
        if far[0] <= -span and far[1] >= span:
            distances = torch.arange(-reach, reach + 1)
            return position(distances).long(), reach
        reach *= 2
    raise ImportProblem(
        f"deberta-v2: position_buckets={buckets}, max_relative_positions={most}: the log buckets do not "
        "grow with distance (max_relative_positions - 1 must exceed position_buckets / 2)"
    )


class _Embeddings(nn.Module):
    """Word (+ absolute position) (+ token type) embeddings, `embed_proj`, LayerNorm, times the mask."""

    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.words, self.positions, self.types = emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings
        self.proj, self.norm = emb.embed_proj, emb.LayerNorm

    def forward(self, input_ids: Tensor, mask: Tensor, token_type_ids: Tensor | None) -> Tensor:
        x = F.embedding(input_ids, self.words.weight)  # (B, T, E)
        if self.positions is not None:
            pos = torch.cumsum(torch.ones_like(input_ids[0]), dim=0) - 1  # (T,): 0..T-1
            x = x + F.embedding(pos, self.positions.weight)[None]
        if self.types is not None and token_type_ids is not None:
            x = x + F.embedding(token_type_ids, self.types.weight)
        elif self.types is not None:
            x = x + self.types.weight[0]  # no token_type_ids input: every token is in segment 0
        if self.proj is not None:
            x = self.proj(x)  # (B, T, D)
        return self.norm(x) * mask[:, :, None].to(x.dtype)


class _Layer(nn.Module):
    """One DeBERTa-v2 layer: disentangled self-attention, then the post-norm output and feed-forward."""

    def __init__(self, layer: nn.Module, heads: int, c2p: bool, p2c: bool) -> None:
        super().__init__()
        att = layer.attention.self
        self.q, self.k, self.v = att.query_proj, att.key_proj, att.value_proj
        relative = bool(att.relative_attention)
        shared = att.share_att_key
        self.pos_k = (att.key_proj if shared else att.pos_key_proj) if relative and c2p else None
        self.pos_q = (att.query_proj if shared else att.pos_query_proj) if relative and p2c else None
        self.out, self.norm1 = layer.attention.output.dense, layer.attention.output.LayerNorm
        self.ffn = nn.Sequential(layer.intermediate, layer.output.dense)
        self.norm2 = layer.output.LayerNorm
        self.heads, self.d_k = heads, att.query_proj.out_features // heads
        # transformers' scale: sqrt of a float32 head width times (1 + the relative terms named)
        factor = 1 + int(c2p) + int(p2c)
        self.scale = float(torch.sqrt(torch.tensor(self.d_k, dtype=torch.float) * factor))

    def _split(self, h: Tensor) -> Tensor:
        return h.view(h.shape[0], -1, self.heads, self.d_k).transpose(1, 2)  # (B or 1, H, T, d_k)

    def forward(
        self, x: Tensor, keep: Tensor, rel: Tensor | None, c2p_at: Tensor, p2c_at: Tensor
    ) -> tuple[Tensor, Tensor]:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))  # (B, H, T, d_k)
        scores = torch.matmul(q, k.transpose(-1, -2) / self.scale)  # (B, H, T, T)
        if rel is not None and self.pos_k is not None:
            pos_k = self._split(self.pos_k(rel[None]))  # (1, H, 2S, d_k)
            c2p = torch.matmul(q, pos_k.transpose(-1, -2))  # (B, H, T, 2S)
            index = c2p_at.expand(c2p.shape[0], c2p.shape[1], -1, -1)  # (B, H, T, T)
            scores = scores + torch.gather(c2p, -1, index) / self.scale
        if rel is not None and self.pos_q is not None:
            pos_q = self._split(self.pos_q(rel[None]))  # (1, H, 2S, d_k)
            p2c = torch.matmul(k, pos_q.transpose(-1, -2))  # (B, H, T, 2S): row = key
            index = p2c_at.expand(p2c.shape[0], p2c.shape[1], -1, -1)
            scores = scores + torch.gather(p2c, -1, index).transpose(-1, -2) / self.scale
        weights = torch.softmax(torch.where(keep, scores, LOW), dim=-1)
        context = torch.matmul(weights, v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)  # (B, T, H*d_k)
        x = self.norm1(self.out(context) + x)
        return self.norm2(self.ffn(x) + x), weights


class _Conv(nn.Module):
    """DeBERTa-v2's convolution over the layers' input, added to the first layer's output."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv, self.norm, self.act = conv.conv, conv.LayerNorm, ACT2FN[conv.conv_act]

    def forward(self, embedded: Tensor, layer_out: Tensor, mask: Tensor) -> Tensor:
        real = mask[:, :, None].to(embedded.dtype)  # (B, T, 1)
        out = self.conv(embedded.transpose(1, 2)).transpose(1, 2) * real  # (B, T, D), 0 on padding
        return self.norm(layer_out + self.act(out)) * real


class DebertaClassifierGraph(nn.Module):
    """forward(input_ids, attention_mask[, token_type_ids]) -> (logits, last layer's attention weights)."""

    def __init__(self, model: nn.Module, heads: int) -> None:
        super().__init__()
        config, base = model.config, model.deberta
        c2p, p2c = pos_att_terms(config)
        encoder = base.encoder
        relative = bool(encoder.relative_attention)
        self.embeddings = _Embeddings(base.embeddings)
        _, _, self.span = _span(config)
        table, self.reach = bucket_table(config) if relative else (torch.zeros(1, dtype=torch.long), 0)
        self.register_buffer("buckets", table, persistent=False)
        self.rel_table = encoder.rel_embeddings if relative else None
        self.rel_norm = encoder.LayerNorm if "layer_norm" in encoder.norm_rel_ebd else None
        self.layers = nn.ModuleList(_Layer(layer, heads, c2p, p2c) for layer in encoder.layer)
        self.conv = _Conv(encoder.conv) if encoder.conv is not None else None
        self.pool, self.pool_act = model.pooler.dense, ACT2FN[config.pooler_hidden_act]
        self.classifier = model.classifier

    def _relative(self, input_ids: Tensor) -> tuple[Tensor | None, Tensor, Tensor]:
        """The relative embeddings (2S, D) and, per query and key, their c2p and p2c rows (1, 1, T, T)."""
        if self.rel_table is None:
            empty = torch.zeros(1, 1, 1, 1, dtype=torch.long)
            return None, empty, empty
        rel = self.rel_table.weight[: self.span * 2]
        rel = self.rel_norm(rel) if self.rel_norm is not None else rel
        t = torch.cumsum(torch.ones_like(input_ids[0]), dim=0) - 1  # (T,)
        distance = torch.clamp(t[:, None] - t[None, :], -self.reach, self.reach) + self.reach  # (T, T)
        position = self.buckets[distance]  # (T, T): transformers' relative_pos
        top = self.span * 2 - 1
        c2p_at = torch.clamp(position + self.span, 0, top)[None, None]
        p2c_at = torch.clamp(-position + self.span, 0, top)[None, None]
        return rel, c2p_at, p2c_at

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        x = self.embeddings(input_ids, attention_mask, token_type_ids)  # (B, T, D)
        real = attention_mask.bool()
        keep = real[:, None, None, :] & real[:, None, :, None]  # (B, 1, T, T): transformers' pairwise mask
        rel, c2p_at, p2c_at = self._relative(input_ids)
        embedded, weights = x, x.new_zeros(())
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, keep, rel, c2p_at, p2c_at)
            if i == 0 and self.conv is not None:
                x = self.conv(embedded, x, attention_mask)
        return self.classifier(self.pool_act(self.pool(x[:, 0]))), weights


def deberta(model: nn.Module, heads: int) -> nn.Module:
    """The `ClassifierLayout` loader of DeBERTa-v2 and v3."""
    return DebertaClassifierGraph(model, heads)


def problems(config: object) -> list[str]:
    """What of a DeBERTa-v2 config the graph would not reproduce (`ClassifierLayout.check`)."""
    found = []
    if getattr(config, "relative_attention", False):
        try:
            bucket_table(config)
        except ImportProblem as e:
            found.append(str(e).removeprefix("deberta-v2: "))
    return found
