"""From-scratch Transformer building blocks, the encoder-only classifier and the seq2seq translator.

The translator's decoder has an explicit cache interface (self-attention K/V in and out, cross-attention
K/V computed once from the encoder output) because that is exactly what the ONNX export exposes.
Pre-norm residual blocks: x + f(LayerNorm(x)), with a final LayerNorm after each stack.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.fused import fused_self_attention

NEG_INF = -1e9  # finite "minus infinity": keeps fully masked rows NaN-free in fp16 and ONNX

KV = tuple[Tensor, Tensor]
Folding = tuple[Tensor, Tensor]  # fold (N, M), unfold (R,): IO contract 6's cross-attention over sentences


@dataclass
class EncoderConfig:
    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_layers: int = 3
    dropout: float = 0.1
    max_len: int = 256
    pad_id: int = 0

    @property
    def d_k(self) -> int:
        """Each attention head's width."""
        return self.d_model // self.n_heads


@dataclass
class ClassifierConfig(EncoderConfig):
    num_labels: int = 3
    # Masked-token pre-training needs an id that never appears in text.
    mask_id: int = 4


@dataclass
class TranslatorConfig(EncoderConfig):
    n_dec_layers: int = 3
    bos_id: int = 1
    eos_id: int = 2


def save_config(config: EncoderConfig, path: Path) -> None:
    """Configs are saved beside the weights so a checkpoint rebuilds its model without code edits."""
    kind = type(config).__name__
    path.write_text(json.dumps({"kind": kind, **asdict(config)}, indent=2) + "\n")


def load_config(path: Path) -> ClassifierConfig | TranslatorConfig:
    data = json.loads(path.read_text())
    kind = data.pop("kind")
    classes: dict[str, type[ClassifierConfig] | type[TranslatorConfig]] = {
        "ClassifierConfig": ClassifierConfig,
        "TranslatorConfig": TranslatorConfig,
    }
    if kind not in classes:
        raise ValueError(f"{path}: unknown model kind {kind!r}")
    return classes[kind](**data)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ / √d_k + bias) V, with bias 0 for allowed and NEG_INF for masked keys; also
    returns the weights softmax(...) (B, H, T, S), which the export offers as attention maps."""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    return weights @ v, weights  # (B, H, T, d_k)


def attention_with_new(q: Tensor, cache: KV, cache_bias: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """One query over a row's cached keys plus its own new key, without concatenating the cache
    (the serving step: the cache is written in place by the caller, never copied by the graph).
    q, k, v (R, H, 1, d_k); cache (R, H, C, d_k) each; cache_bias (R, 1, 1, C) masks unused slots.
    The new key's score comes first: the row's live scores then fill the same leading places
    whatever the number of slots, so the softmax sums them in the same order (with it last, its
    place moved with the slot count, and so did the last bit of the sum: a sentence decoded
    alone and in a batch with longer rows could differ).
    Returns the attended values (R, H, 1, d_k) and the weights (R, H, 1, 1 + C), the new key's first."""
    scale = math.sqrt(q.size(-1))
    scores = torch.cat([q @ k.transpose(-2, -1) / scale, q @ cache[0].transpose(-2, -1) / scale + cache_bias], -1)
    weights = torch.softmax(scores, dim=-1)
    return weights[..., :1] * v + weights[..., 1:] @ cache[1], weights


def padding_bias(mask: Tensor) -> Tensor:
    """(B, S) 1/0 (or True/False) attention mask -> (B, 1, 1, S) additive bias: 0 or NEG_INF."""
    return torch.where(mask[:, None, None, :].bool(), 0.0, NEG_INF)


def causal_bias(t: int, past: int, device: torch.device) -> Tensor:
    """(T, past+T) bias: query i (absolute position past+i) sees keys 0..past+i."""
    q_pos = torch.arange(t, device=device)[:, None] + past
    k_pos = torch.arange(past + t, device=device)[None, :]
    return (k_pos > q_pos).float() * NEG_INF


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div)
    return table  # (max_len, D)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)

    def project_kv(self, x: Tensor) -> KV:
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of one token per row (x: (R, 1, D)) from one matmul over the
        three weights side by side: the exported step runs one larger GEMM instead of three."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        qkv = F.linear(x, weight, bias).reshape(-1, 3 * self.n_heads, 1, self.d_k)  # (R, 3H, 1, d_k): no transpose
        q, k, v = qkv.split(self.n_heads, dim=1)
        return q, k, v

    def forward(self, x: Tensor, kv: KV, bias: Tensor | None) -> tuple[Tensor, Tensor]:
        q = self.split(self.q_proj(x))  # (B, H, T, d_k)
        out, weights = attention(q, kv[0], kv[1], bias)  # (B, H, T, d_k), (B, H, T, S)
        return self.merge(out), weights

    def attend_token(self, x: Tensor, kv: KV, bias: Tensor | None) -> tuple[Tensor, Tensor]:
        """`forward` for one token per row (x: (R, 1, D), the serving step's cross-attention):
        with a single position the heads split and merge by reshapes, without transposes."""
        q = self.q_proj(x).reshape(-1, self.n_heads, 1, self.d_k)
        out, weights = attention(q, kv[0], kv[1], bias)
        return self.merge_token(out), weights

    def attend_folded(self, x: Tensor, kv: KV, bias: Tensor, fold: Tensor, unfold: Tensor) -> tuple[Tensor, Tensor]:
        """`attend_token` with each sentence's rows folded into the queries of one product over its
        own keys and values (IO contract 6): x (R, 1, D); kv (N, H, S, d_k) and bias (N, 1, 1, S)
        per sentence; fold (N, M) the rows of each sentence's queries, unfold (R,) each row's place
        among the N * M. Returns (R, 1, D) and the weights folded, (N, H, M, S): unfolding them
        would cost every step three operators per layer, for a caller that seldom asks for them
        (`graphs.unfold_rows`)."""
        # Every reshape below has a constant shape: one read from `fold` would add a chain of
        # shape operators to every step, a few microseconds each (`docs/history/2026-12-engine-and-serving.md`).
        q = self.q_proj(x).reshape(-1, self.n_heads, self.d_k)[fold].transpose(1, 2)  # (N, H, M, d_k)
        # The scores: one product of a sentence's M queries with its keys (the keys read once, no
        # copy along a broadcast axis). The weighted values: one product per query, the values
        # broadcast to it: an unscaled product of one query takes MLAS's one-row kernel, which
        # would change a row's last bit with its fold's width; the scores' product carries the
        # scale, so it never does (`docs/engine.md`, the decoder IO contract; figures in docs/history/).
        scores = q @ kv[0].transpose(-2, -1) / math.sqrt(self.d_k) + bias  # (N, H, M, S)
        weights = torch.softmax(scores, dim=-1)
        out = weights[:, :, :, None] @ kv[1][:, :, None]  # (N, H, M, 1, S) x (N, H, 1, S, d_k)
        out = out.transpose(1, 2).reshape(-1, 1, self.n_heads * self.d_k)[unfold]  # (R, 1, D)
        return self.dropout(self.out_proj(out)), weights

    def step(self, x: Tensor, cache: KV, cache_bias: Tensor) -> tuple[Tensor, KV]:
        """Self-attention of one new token (x: (R, 1, D)) over its row's cache and itself; also
        returns the token's key and value (R, H, 1, d_k), for the caller to cache."""
        q, k, v = self.project_qkv(x)
        out, _ = attention_with_new(q, cache, cache_bias, k, v)
        return self.merge_token(out), (k, v)

    def step_in_place(self, x: Tensor, cache: KV, positions: Tensor) -> tuple[Tensor, KV]:
        """`step` as the exported graph runs it (`export.fused`, IO contract 5): the new key and
        value go into each row's slot `position`; returns the output and the whole cache."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        out, present = fused_self_attention(x, projections, cache, positions, self.n_heads, self.d_k**-0.5)
        return self.dropout(self.out_proj(out)), present

    def merge(self, out: Tensor) -> Tensor:
        """(B, H, T, d_k) heads -> the output projection of (B, T, D)."""
        b, _, t, _ = out.shape
        return self.dropout(self.out_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.d_k)))

    def merge_token(self, out: Tensor) -> Tensor:
        """`merge` of one token per row, (R, H, 1, d_k) -> (R, 1, D): a reshape."""
        return self.dropout(self.out_proj(out.reshape(-1, 1, self.n_heads * self.d_k)))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(self.dropout(F.gelu(self.fc1(x)))))


class EncoderLayer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(c.d_model)
        self.attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.norm2 = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout)

    def forward(self, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        h = self.norm1(x)
        out, weights = self.attn(h, self.attn.project_kv(h), bias)
        x = x + out
        return x + self.ffn(self.norm2(x)), weights


class DecoderLayer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(c.d_model)
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.norm2 = nn.LayerNorm(c.d_model)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.norm3 = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout)

    def forward(self, x: Tensor, past: KV, cross: KV, self_bias: Tensor, src_bias: Tensor) -> tuple[Tensor, KV, Tensor]:
        """The new hidden states, the grown self-attention cache, the cross-attention weights (B, H, T, S)."""
        h = self.norm1(x)
        k, v = self.self_attn.project_kv(h)  # (B, H, T, d_k)
        present = (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))  # (B, H, P+T, d_k)
        x = x + self.self_attn(h, present, self_bias)[0]
        return self._cross_and_ffn(x, cross, src_bias, present)

    def step(
        self, x: Tensor, cache: KV, cross: KV, cache_bias: Tensor, src_bias: Tensor, folding: Folding | None = None
    ) -> tuple[Tensor, KV, Tensor]:
        """One new token per row over a slot cache (`MultiHeadAttention.step`): the new hidden
        states, the token's key and value, the cross-attention weights (R, H, 1, S). `folding`:
        the cross-attention inputs are per sentence (`MultiHeadAttention.attend_folded`)."""
        out, new = self.self_attn.step(self.norm1(x), cache, cache_bias)
        return self._cross_and_ffn(x + out, cross, src_bias, new, one_token=True, folding=folding)

    def step_in_place(
        self, x: Tensor, cache: KV, cross: KV, positions: Tensor, src_bias: Tensor, folding: Folding | None = None
    ) -> tuple[Tensor, KV, Tensor]:
        """`step` over the fused in-place self-attention: returns the whole cache, new slots written."""
        out, present = self.self_attn.step_in_place(self.norm1(x), cache, positions)
        return self._cross_and_ffn(x + out, cross, src_bias, present, one_token=True, folding=folding)

    def _cross_and_ffn(
        self, x: Tensor, cross: KV, src_bias: Tensor, kv: KV, one_token: bool = False, folding: Folding | None = None
    ) -> tuple[Tensor, KV, Tensor]:
        h = self.norm2(x)
        if folding is not None:
            out, cross_weights = self.cross_attn.attend_folded(h, cross, src_bias, *folding)
        else:
            attend = self.cross_attn.attend_token if one_token else self.cross_attn
            out, cross_weights = attend(h, cross, src_bias)
        x = x + out
        return x + self.ffn(self.norm3(x)), kv, cross_weights


class Embedding(nn.Module):
    """Token embedding scaled by √d plus sinusoidal positions: from `offset` on for every row, or
    each row's own `positions` (rows of one decoder step may stand at different positions)."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        nn.init.normal_(self.tokens.weight, std=c.d_model**-0.5)
        self.scale = math.sqrt(c.d_model)
        self.register_buffer("pe", sinusoidal_table(c.max_len, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, ids: Tensor, offset: int | Tensor = 0, positions: Tensor | None = None) -> Tensor:
        pe = self.pe[offset : offset + ids.size(1)] if positions is None else self.pe[positions]  # (T|B×T, D)
        return self.dropout(self.tokens(ids) * self.scale + pe)


class Encoder(nn.Module):
    def __init__(self, c: EncoderConfig, embed: Embedding | None = None) -> None:
        super().__init__()
        self.embed = embed or Embedding(c)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.with_attention(ids, mask)[0]

    def with_attention(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Hidden states (B, S, D) and the last layer's self-attention weights (B, H, S, S)."""
        bias = padding_bias(mask)  # (B, 1, 1, S)
        x = self.embed(ids)  # (B, S, D)
        weights = torch.zeros(0)
        for layer in self.layers:
            x, weights = layer(x, bias)
        return self.norm(x), weights


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class Classifier(nn.Module):
    """Encoder, masked mean pooling, linear head. `mlm_logits` serves masked-token pre-training."""

    def __init__(self, c: ClassifierConfig) -> None:
        super().__init__()
        self.config = c
        self.encoder = Encoder(c)
        self.head_dropout = nn.Dropout(c.dropout)
        self.head = nn.Linear(c.d_model, c.num_labels)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.with_attention(ids, mask)[0]

    def with_attention(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(B, C) logits and the last encoder layer's self-attention weights (B, H, S, S)."""
        x, weights = self.encoder.with_attention(ids, mask)  # (B, S, D)
        m = mask.unsqueeze(-1).to(x.dtype)  # (B, S, 1)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, D)
        return self.head(self.head_dropout(pooled)), weights

    def mlm_logits(self, ids: Tensor, mask: Tensor, scored: Tensor) -> Tensor:
        """Token logits at the `scored` (B, S) positions only: the vocabulary projection is most of
        a pre-training step, and only the masked 15 % of positions have a target."""
        x = self.encoder(ids, mask)[scored]  # (N, D)
        return x @ self.encoder.embed.tokens.weight.T  # (N, V), tied to the input embedding


class Translator(nn.Module):
    """Encoder-decoder with one shared embedding for source, target and the output projection."""

    def __init__(self, c: TranslatorConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = Embedding(c)
        self.encoder = Encoder(c, self.embed)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_dec_layers))
        self.norm = nn.LayerNorm(c.d_model)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.encoder(src, src_mask)  # (B, S, D)

    def cross_kv(self, memory: Tensor) -> list[KV]:
        """Cross-attention K/V per decoder layer: computed once per request, reused at every step."""
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def empty_past(self, batch: int, device: torch.device | None = None) -> list[KV]:
        c = self.config
        shape = (batch, c.n_heads, 0, c.d_model // c.n_heads)
        return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device))] * len(self.layers)

    def decode(self, tgt: Tensor, past: list[KV], cross: list[KV], src_mask: Tensor) -> tuple[Tensor, list[KV]]:
        """Logits for T new target tokens after `past` cached positions; returns the grown cache."""
        p = past[0][0].size(2)
        x = self.embed(tgt, p)  # (B, T, D)
        self_bias = causal_bias(tgt.size(1), p, tgt.device)  # (T, P+T)
        src_bias = padding_bias(src_mask)  # (B, 1, 1, S)
        presents = []
        for layer, layer_past, layer_cross in zip(self.layers, past, cross, strict=True):
            x, present, _ = layer(x, layer_past, layer_cross, self_bias, src_bias)
            presents.append(present)
        logits = self.norm(x) @ self.embed.tokens.weight.T  # (B, T, V), tied projection
        return logits, presents

    def decode_step(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: list[KV],
        cross: list[KV],
        src_mask: Tensor,
        in_place: bool = False,
        folding: Folding | None = None,
    ) -> tuple[Tensor, list[KV], Tensor]:
        """One token for each of R rows that may stand at different positions (the serving step).

        tokens (R, 1), positions (R,) the index of each row's token = how many of its keys are
        cached; cache (R, H, C, d_k) per layer holds them in slots 0 .. position-1 (later slots
        are masked, whatever they hold). Returns logits (R, V), the token's key and value per
        layer (R, H, 1, d_k), which the caller writes into slot `position` (`in_place`: the whole
        cache with them written there, as the fused graph of IO contract 5 returns it), and the
        cross-attention weights of the token over the source, (R, layers, H, S).
        `folding` (fold, unfold of IO contract 6): `cross` and `src_mask` are per sentence, each
        sentence's rows attend to them as one product, and the weights come folded, (N, layers,
        H, M, S) (`graphs.unfold_rows`); without it, per row.
        """
        x = self.embed(tokens, positions=positions[:, None])  # (R, 1, D)
        slots = torch.arange(cache[0][0].size(2), device=tokens.device)
        cache_bias = padding_bias(slots[None, :] < positions[:, None])  # (R, 1, 1, C)
        src_bias = padding_bias(src_mask)  # (R, 1, 1, S)
        new_kv, weights = [], []
        for layer, layer_cache, layer_cross in zip(self.layers, cache, cross, strict=True):
            if in_place:
                x, kv, cross_weights = layer.step_in_place(x, layer_cache, layer_cross, positions, src_bias, folding)
            else:
                x, kv, cross_weights = layer.step(x, layer_cache, layer_cross, cache_bias, src_bias, folding)
            new_kv.append(kv)
            # (R, 1, H, S); folded: (N, 1, H, M, S)
            weights.append(cross_weights.unsqueeze(1) if folding is not None else cross_weights.transpose(1, 2))
        logits = self.norm(x[:, 0]) @ self.embed.tokens.weight.T  # (R, V), tied projection
        return logits, new_kv, torch.cat(weights, dim=1)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for training: the whole target at once, no cache."""
        memory = self.encode(src, src_mask)
        logits, _ = self.decode(tgt_in, self.empty_past(src.size(0), src.device), self.cross_kv(memory), src_mask)
        return logits


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def greedy_loop(
    step: Callable[[Tensor], Tensor], batch: int, bos_id: int, eos_id: int, max_new_tokens: int, device: torch.device
) -> list[list[int]]:
    """The one greedy loop of the exporter: `step(prefix (B, T)) -> scores (B, V)` of the next token.

    The loop owns the BOS/EOS bookkeeping; the step owns the model (PyTorch with or without its
    K/V cache, or ONNX Runtime sessions). Returns the generated ids per sentence, EOS cut off.
    """
    prefix = torch.full((batch, 1), bos_id, dtype=torch.long, device=device)  # (B, 1 + generated)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        nxt = torch.where(done, eos_id, torch.as_tensor(step(prefix), device=device).argmax(-1))  # (B,)
        prefix = torch.cat([prefix, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return [row[: row.index(eos_id)] if eos_id in row else row for row in prefix[:, 1:].tolist()]


@torch.no_grad()
def greedy(
    model: Translator, src: Tensor, src_mask: Tensor, max_new_tokens: int, *, cached: bool = True
) -> list[list[int]]:
    """The PyTorch reference for greedy decoding. cached=False re-runs the decoder over the whole
    prefix at every step (no K/V cache): the export's parity check compares the ONNX graphs to it."""
    c = model.config
    cross = model.cross_kv(model.encode(src, src_mask))
    b = src.size(0)
    past = [model.empty_past(b, src.device)]

    def step(prefix: Tensor) -> Tensor:
        if cached:
            logits, past[0] = model.decode(prefix[:, -1:], past[0], cross, src_mask)
        else:
            logits, _ = model.decode(prefix, model.empty_past(b, src.device), cross, src_mask)
        return logits[:, -1]

    return greedy_loop(step, b, c.bos_id, c.eos_id, max_new_tokens, src.device)
