"""The classifier graph (`service.contract.graphs`) of a `BartForSequenceClassification`
(bart-large-mnli's class): an NLI model for zero-shot classification.

As `export.hf.classifiers` does for the BERT family, the forward is rebuilt from the checkpoint's
own submodules: the encoder reads the text (a pair framed `<s> a </s></s> b </s>`), the decoder
reads it again shifted right by one (its decoder start token first), causally and with
cross-attention to the encoder, and the head reads the decoder's state at each row's last end
token. The decoder has no padding mask (transformers passes none): causal attention keeps a real
position from seeing the padding after it. Quirks stated here once: learned positions after an
offset (2), `layernorm_embedding`, post-norm layers, the embedding scale inside `embed_tokens`.
`attentions` are the encoder's last layer's self-attention weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from export.hf import ImportProblem
from export.hf.classifiers import Block


def _attend(attn: nn.Module, x: Tensor, memory: Tensor, bias: Tensor, heads: int) -> Tensor:
    """A BART attention module's output for queries `x` over `memory` (itself for self-attention)."""
    d_k = attn.out_proj.in_features // heads

    def split(lin: nn.Linear, h: Tensor) -> Tensor:
        return lin(h).view(h.shape[0], -1, heads, d_k).transpose(1, 2)  # (B, H, T, d_k)

    scores = torch.matmul(split(attn.q_proj, x), split(attn.k_proj, memory).transpose(2, 3)) * d_k**-0.5 + bias
    context = torch.matmul(torch.softmax(scores, dim=-1), split(attn.v_proj, memory))  # (B, H, T, d_k)
    return attn.out_proj(context.transpose(1, 2).reshape(x.shape))


class _CrossBlock(nn.Module):
    """One post-norm decoder layer: causal self-attention, cross-attention to the encoder, FFN."""

    def __init__(self, layer: nn.Module, heads: int) -> None:
        super().__init__()
        self.layer, self.heads = layer, heads
        self.ffn = nn.Sequential(layer.fc1, layer.activation_fn, layer.fc2)

    def forward(self, x: Tensor, causal: Tensor, memory: Tensor, cross: Tensor) -> Tensor:
        la = self.layer
        x = la.self_attn_layer_norm(_attend(la.self_attn, x, x, causal, self.heads) + x)
        x = la.encoder_attn_layer_norm(_attend(la.encoder_attn, x, memory, cross, self.heads) + x)
        return la.final_layer_norm(self.ffn(x) + x)


class BartClassifierGraph(nn.Module):
    """forward(input_ids, attention_mask) -> (logits, the encoder's last self-attention weights)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        config, base = model.config, model.model
        enc, dec = base.encoder, base.decoder
        self.words_enc, self.words_dec = enc.embed_tokens, dec.embed_tokens  # their forward applies the scale
        self.pos_enc, self.pos_dec = enc.embed_positions, dec.embed_positions
        self.offset = int(getattr(enc.embed_positions, "offset", 2))
        self.norm_enc, self.norm_dec = enc.layernorm_embedding, dec.layernorm_embedding
        heads_e, heads_d = config.encoder_attention_heads, config.decoder_attention_heads
        self.encoder = nn.ModuleList(
            Block(
                (la.self_attn.q_proj, la.self_attn.k_proj, la.self_attn.v_proj),
                la.self_attn.out_proj,
                la.self_attn_layer_norm,
                nn.Sequential(la.fc1, la.activation_fn, la.fc2),
                la.final_layer_norm,
                heads_e,
            )
            for la in enc.layers
        )
        self.decoder = nn.ModuleList(_CrossBlock(la, heads_d) for la in dec.layers)
        self.head = nn.Sequential(model.classification_head.dense, nn.Tanh(), model.classification_head.out_proj)
        self.pad, self.eos, self.start = config.pad_token_id, config.eos_token_id, config.decoder_start_token_id

    def _positions(self, ids: Tensor, table: nn.Embedding) -> Tensor:
        pos = torch.cumsum(torch.ones_like(ids), dim=1) - 1 + self.offset  # (B, T)
        return F.embedding(pos, table.weight)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        low = torch.finfo(torch.float32).min
        keys = torch.where(attention_mask.bool()[:, None, None, :], 0.0, low)  # (B, 1, 1, T)
        x = self.norm_enc(self.words_enc(input_ids) + self._positions(input_ids, self.pos_enc))
        weights = x.new_zeros(())
        for block in self.encoder:
            x, weights = block(x, keys)
        start = torch.full_like(input_ids[:, :1], self.start)
        shifted = torch.cat([start, input_ids[:, :-1]], dim=1)  # (B, T): shift_tokens_right
        y = self.norm_dec(self.words_dec(shifted) + self._positions(shifted, self.pos_dec))
        t = torch.arange(input_ids.shape[1], device=input_ids.device)
        causal = torch.where(t[None, :] <= t[:, None], 0.0, low)[None, None]  # (1, 1, T, T)
        for layer in self.decoder:
            y = layer(y, causal, x, keys)
        last_eos = torch.argmax(input_ids.eq(self.eos).long() * (t[None, :] + 1), dim=1)  # (B,)
        pooled = y[torch.arange(y.shape[0], device=y.device), last_eos]  # (B, D)
        return self.head(pooled), weights


def bart(model: nn.Module, heads: int) -> nn.Module:
    """The `ClassifierLayout` loader of BART (`heads` is the encoder's, from the config)."""
    config = model.config
    if config.decoder_start_token_id is None or config.eos_token_id is None:
        raise ImportProblem("bart: the classifier needs decoder_start_token_id and eos_token_id")
    if getattr(config, "add_final_layer_norm", False) or getattr(config, "normalize_before", False):
        raise ImportProblem("bart: pre-norm layers (mBART's) are not implemented for classifiers")
    return BartClassifierGraph(model)
