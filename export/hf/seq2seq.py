"""Hugging Face encoder-decoders of the BART lineage as the project's translator graphs (IO contract).

MarianMT, M2M100/NLLB, BART and mBART share one layer layout (`self_attn`, `encoder_attn`, `fc1`,
`fc2` and their layer norms); they differ in a few flags (`Layout`), which each family states in
its registry entry (`export.hf.families`), as CTranslate2's converter does. The computation is
written here from the checkpoint's own modules rather than by calling the transformers forward: the
serving step needs rows at different positions with a slot cache written in place by the caller,
which transformers' caches do not offer. Parity with transformers is what the importer checks
before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.fused import fused_self_attention
from export.hf import ImportProblem

NEG_INF = -1e9  # as export.model: finite, so fully masked rows stay NaN-free in fp16
KV = tuple[Tensor, Tensor]
Folding = tuple[Tensor, Tensor]  # fold (N, M), unfold (R,): IO contract 6
T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """What differs between the families that share the BART layer layout (a family's quirks)."""

    pre_norm: bool  # x + f(LN(x)) (mBART, M2M100) or LN(x + f(x)) (BART, Marian)
    # how a position indexes the position table: "none", "offset" (the module's), "pad" (pad id + 1)
    position_offset: Literal["none", "offset", "pad"]
    refused: tuple[tuple[str, str], ...] = ()  # (config option, why) refused when the option is set


# Options of these configs that change the computation, with the values this module implements.
_SUPPORTED = {
    "add_cross_attention": (None, False),
    "is_decoder": (None, False),
    "tie_encoder_decoder": (None, False),
}


@dataclass(frozen=True)
class StepConfig:
    """What the exporter's validation reads of a translator (the fields of `TranslatorConfig` it uses)."""

    n_heads: int
    d_model: int
    vocab_size: int
    bos_id: int  # the decoder start id: the first step's input
    eos_id: int
    pad_id: int
    max_len: int  # positions the model has

    @property
    def d_k(self) -> int:
        """Each attention head's width."""
        return self.d_model // self.n_heads


def check_supported(config: object, layout: Layout) -> None:
    """ImportProblem naming what of `config` this module cannot reproduce."""
    kind = getattr(config, "model_type", None)
    for option, allowed in _SUPPORTED.items():
        if getattr(config, option, None) not in allowed:
            raise ImportProblem(f"{kind}: config option {option}={getattr(config, option)!r} is not supported")
    for option, why in layout.refused:
        if getattr(config, option, None):
            raise ImportProblem(f"{kind}: {why} are not supported")
    d, h = config.d_model, config.decoder_attention_heads  # type: ignore[attr-defined]
    if d % h or d % config.encoder_attention_heads:  # type: ignore[attr-defined]
        raise ImportProblem(f"{kind}: d_model {d} is not divisible by the attention heads")


def architecture(config: object) -> dict[str, int | float | str]:
    """The manifest's `architecture` of a BART-layout translator: its config's dimensions."""
    c = config
    return {
        "family": c.model_type,  # type: ignore[attr-defined]
        "d_model": c.d_model,  # type: ignore[attr-defined]
        "n_heads": c.decoder_attention_heads,  # type: ignore[attr-defined]
        "n_layers": c.encoder_layers,  # type: ignore[attr-defined]
        "n_dec_layers": c.decoder_layers,  # type: ignore[attr-defined]
        "vocab_size": c.vocab_size,  # type: ignore[attr-defined]
    }


class _Stack(nn.Module):
    """The embedding side of one stack: token embedding x scale + position table[position + offset],
    then `layernorm_embedding` where the family has it."""

    def __init__(self, stack: nn.Module, layout: Layout, pad_id: int) -> None:
        super().__init__()
        embed = stack.embed_tokens
        self.tokens = embed.weight
        scale = float(getattr(embed, "embed_scale", None) or 1.0) * float(getattr(stack, "embed_scale", None) or 1.0)
        self.scale = scale
        pos = stack.embed_positions
        table = pos.weight if hasattr(pos, "weight") else pos.weights
        self.register_buffer("positions", table.detach().clone(), persistent=False)
        self.offset = {"none": 0, "offset": getattr(pos, "offset", 0), "pad": pad_id + 1}[layout.position_offset]
        self.norm_embedding = getattr(stack, "layernorm_embedding", None)
        self.final_norm = getattr(stack, "layer_norm", None)
        self.layers = stack.layers

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        x = F.embedding(ids, self.tokens) * self.scale + self.positions[positions + self.offset]
        return self.norm_embedding(x) if self.norm_embedding is not None else x


def _heads(x: Tensor, h: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)  # (B, H, T, d_k)


def _merge(x: Tensor) -> Tensor:
    b, h, t, dk = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dk)


def _attend(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scaling + bias) v, with the module's own scaling (head_dim ** -0.5)."""
    weights = torch.softmax((q @ k.transpose(-2, -1)) * attn.scaling + bias, dim=-1)
    return weights @ v, weights


def _bias(mask: Tensor) -> Tensor:
    """(B, S) 1/0 mask -> (B, 1, 1, S) additive bias."""
    return torch.where(mask[:, None, None, :].bool(), 0.0, NEG_INF)


class Seq2Seq(nn.Module):
    """A transformers encoder-decoder with the interface of `export.model.Translator` that the
    graphs and the exporter's checks use: `encode`, `cross_kv`, `decode_step`, `layers`, `config`."""

    def __init__(
        self,
        hf: nn.Module,
        decoder_start_id: int,
        suppressed: tuple[int, ...] = (),
        eos_id: int | None = None,
        *,
        layout: Layout,
    ) -> None:
        super().__init__()
        c = hf.config
        check_supported(c, layout)
        self.layout = layout
        self.hf_config = c
        base = hf.get_encoder(), hf.get_decoder()
        self.enc = _Stack(base[0], layout, c.pad_token_id)
        self.dec = _Stack(base[1], layout, c.pad_token_id)
        self.layers = self.dec.layers
        self.enc_heads, self.heads = c.encoder_attention_heads, c.decoder_attention_heads
        self.lm_head = hf.get_output_embeddings().weight
        bias = getattr(hf, "final_logits_bias", None)
        vocab = self.lm_head.shape[0]
        self.register_buffer("logits_bias", torch.zeros(vocab) if bias is None else bias.detach().reshape(-1).clone())
        # Suppressed ids (Marian's pad, generation_config.suppress_tokens / bad single-token words)
        # leave the log-probabilities as transformers' logits processors do: after the log-softmax.
        mask = torch.zeros(vocab)
        mask[list(suppressed)] = float("-inf")
        self.register_buffer("suppress", mask, persistent=False)
        # A bias or a mask of zeros leaves the graph: each would be a pass over every row's vocabulary
        # per step (without both, 16 int8 sentences of beam 4 translated 1.06x as fast; measured).
        self.biased, self.suppressing = bool(self.logits_bias.any()), bool(suppressed)
        if layout.position_offset == "pad" and decoder_start_id == c.pad_token_id:
            raise ImportProblem(
                f"{c.model_type}: decoder_start_token_id is the pad id {c.pad_token_id}, to which transformers gives "
                "no position of its own: the engine's positions would differ from the first step on"
            )
        limit = min(self.enc.positions.shape[0] - self.enc.offset, self.dec.positions.shape[0] - self.dec.offset)
        self.config = StepConfig(
            n_heads=self.heads,
            d_model=c.d_model,
            vocab_size=vocab,
            bos_id=decoder_start_id,
            eos_id=c.eos_token_id if eos_id is None else eos_id,
            pad_id=c.pad_token_id,
            max_len=limit,
        )

    # -- encoder ---------------------------------------------------------------------------------

    def encode(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B, S) right-padded ids -> (B, S, D); positions count from 0 in every row."""
        positions = torch.arange(ids.shape[1], device=ids.device)[None, :].expand_as(ids)
        x = self.enc.embed(ids, positions)
        bias = _bias(mask)
        for layer in self.enc.layers:
            x, _ = self._residual(x, layer.self_attn_layer_norm, partial(self._encoder_attn, layer.self_attn, bias))
            x, _ = self._residual(x, layer.final_layer_norm, partial(_ffn, layer))
        return self.enc.final_norm(x) if self.enc.final_norm is not None else x

    def _encoder_attn(self, a: nn.Module, bias: Tensor, h: Tensor) -> tuple[Tensor, None]:
        q, k, v = (_heads(p(h), self.enc_heads) for p in (a.q_proj, a.k_proj, a.v_proj))
        out, _ = _attend(a, q, k, v, bias)
        return a.out_proj(_merge(out)), None

    def _residual(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], tuple[Tensor, T]]) -> tuple[Tensor, T]:
        """x + f(LN(x)) for a pre-norm family, LN(x + f(x)) for a post-norm one; f's extra output."""
        out, extra = f(norm(x) if self.layout.pre_norm else x)
        return (x + out if self.layout.pre_norm else norm(x + out)), extra

    # -- decoder ---------------------------------------------------------------------------------

    def cross_kv(self, memory: Tensor) -> list[KV]:
        """Cross-attention K/V per decoder layer, (B, H, S, d_k) each: once per sentence."""
        e = [layer.encoder_attn for layer in self.layers]
        return [(_heads(a.k_proj(memory), self.heads), _heads(a.v_proj(memory), self.heads)) for a in e]

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
        """One token per row at each row's own position (`export.model.Translator.decode_step`):
        log-probabilities (R, V) with the suppressed ids at -inf, each layer's new key and value
        (R, H, 1, d_k) (`in_place`: the whole cache with them in slot `position`, the fused graph's
        output), the cross-attention weights (R, layers, H, S). `folding`: `cross` and `src_mask`
        per sentence, each sentence's rows folded into one product, the weights folded too
        (N, layers, H, M, S) (IO contract 6)."""
        x = self.dec.embed(tokens, positions[:, None])  # (R, 1, D)
        slots = torch.arange(cache[0][0].shape[2], device=tokens.device)
        cache_bias = _bias(slots[None, :] < positions[:, None])  # (R, 1, 1, C)
        src_bias = _bias(src_mask)  # (R, 1, 1, S)
        new_kv, weights = [], []
        for layer, layer_cache, layer_cross in zip(self.layers, cache, cross, strict=True):
            step = (
                partial(self._in_place_attn, layer.self_attn, layer_cache, positions)
                if in_place
                else partial(self._cached_attn, layer.self_attn, layer_cache, cache_bias)
            )
            x, kv = self._residual(x, layer.self_attn_layer_norm, step)
            cross_step = partial(self._cross_attn, layer.encoder_attn, layer_cross, src_bias, folding)
            x, w = self._residual(x, layer.encoder_attn_layer_norm, cross_step)
            x, _ = self._residual(x, layer.final_layer_norm, partial(_ffn, layer))
            new_kv.append(kv)
            weights.append(
                w.unsqueeze(1) if folding is not None else w.transpose(1, 2)
            )  # (N, 1, H, M, S) / (R, 1, H, S)
        if self.dec.final_norm is not None:
            x = self.dec.final_norm(x)
        logits = x[:, 0] @ self.lm_head.T  # (R, V)
        if self.biased:
            logits = logits + self.logits_bias
        logprobs = torch.log_softmax(logits, -1)
        if self.suppressing:
            logprobs = logprobs + self.suppress
        return logprobs, new_kv, torch.cat(weights, dim=1)

    def _cached_attn(self, a: nn.Module, cache: KV, cache_bias: Tensor, h: Tensor) -> tuple[Tensor, KV]:
        """Self-attention of one new token over its row's cache slots and itself; the new key's
        score first, as `export.model.attention_with_new` (a row's live scores then fill the same
        leading places whatever the slot count, so they are summed in one order)."""
        q, k, v = (_heads(p(h), self.heads) for p in (a.q_proj, a.k_proj, a.v_proj))  # (R, H, 1, d_k)
        scores = torch.cat(
            [(q @ k.transpose(-2, -1)) * a.scaling, (q @ cache[0].transpose(-2, -1)) * a.scaling + cache_bias], -1
        )
        w = torch.softmax(scores, -1)
        return a.out_proj(_merge(w[..., :1] * v + w[..., 1:] @ cache[1])), (k, v)

    def _in_place_attn(self, a: nn.Module, cache: KV, positions: Tensor, h: Tensor) -> tuple[Tensor, KV]:
        """`_cached_attn` as the exported graph runs it (`export.fused`): returns the whole cache."""
        out, present = fused_self_attention(h, (a.q_proj, a.k_proj, a.v_proj), cache, positions, self.heads, a.scaling)
        return a.out_proj(out), present

    def _cross_attn(
        self, a: nn.Module, kv: KV, bias: Tensor, folding: Folding | None, h: Tensor
    ) -> tuple[Tensor, Tensor]:
        if folding is None:
            out, w = _attend(a, _heads(a.q_proj(h), self.heads), kv[0], kv[1], bias)
            return a.out_proj(_merge(out)), w
        fold, unfold = folding  # as `export.model.MultiHeadAttention.attend_folded`: weights folded,
        d, dk = self.config.d_model, self.config.d_model // self.heads  # constant shapes: none read per step
        q = a.q_proj(h).reshape(-1, self.heads, dk)[fold].transpose(1, 2)  # (N, H, M, d_k)
        w = torch.softmax((q @ kv[0].transpose(-2, -1)) * a.scaling + bias, dim=-1)  # the M queries one product
        out = w[:, :, :, None] @ kv[1][:, :, None]  # each query's values a product of its own: (N, H, M, 1, d_k)
        return a.out_proj(out.transpose(1, 2).reshape(-1, 1, d)[unfold]), w

    def teacher_forced(self, src: Tensor, src_mask: Tensor, tgt: Tensor) -> Tensor:
        """Log-probabilities (B, T, V) of each next token given target prefixes `tgt` (B, T), one
        cached step at a time: the reference the exported graphs are checked against is transformers."""
        b, t = tgt.shape
        cross = self.cross_kv(self.encode(src, src_mask))
        cache = self.empty_cache(b, t)
        out = []
        for i in range(t):
            logp, new, _ = self.decode_step(tgt[:, i : i + 1], torch.full((b,), i), cache, cross, src_mask)
            for (ck, cv), (k, v) in zip(cache, new, strict=True):
                ck[:, :, i : i + 1], cv[:, :, i : i + 1] = k, v
            out.append(logp)
        return torch.stack(out, 1)

    def mismatch_hint(self, targets: Tensor) -> str:
        """Why transformers' greedy `targets` (B, T) may be decoded differently, or ""."""
        pad_id = self.config.pad_id
        if self.layout.position_offset == "pad" and bool((targets[:, 1:] == pad_id).any()):
            return (
                f" (transformers' greedy decoding produced the pad id {pad_id}, to which it gives no position of "
                "its own, unlike the engine: the checkpoint's pad token is likely mistrained)"
            )
        return ""

    def empty_cache(self, rows: int, slots: int) -> list[KV]:
        dk = self.config.d_model // self.heads
        return [
            (torch.zeros(rows, self.heads, slots, dk), torch.zeros(rows, self.heads, slots, dk)) for _ in self.layers
        ]


def _ffn(layer: nn.Module, h: Tensor) -> tuple[Tensor, None]:
    return layer.fc2(layer.activation_fn(layer.fc1(h))), None
