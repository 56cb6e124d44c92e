"""Hugging Face T5 (T5 1.0, T5 1.1, Flan-T5, mT5) as the project's translator graphs (IO contract 6).

T5 differs from the BART lineage (`export.hf.seq2seq`) in its layers: RMS norms before each
sub-layer, no position table, attention unscaled, and a relative position bias (bucketed,
bidirectional in the encoder, causal in the decoder) from layer 0 of each stack added to every
layer's self-attention scores. The decoder step computes each row's bias at the row's own
position (`position_ids`), so rows at different steps share one call as for every family; the
bias reaches the fused self-attention (`export.fused`) as its additive `attention_bias` input.
The buckets are a constant table over distances (they are constant past `max_distance`), made by
transformers' own bucketing, so the graph holds no logarithm to round otherwise. T5 1.0 scales the
decoder's output by d_model ** -0.5 before its (tied) head where transformers does
(`config.scale_decoder_outputs`); T5 1.1, Flan-T5 and mT5 do not. Parity with transformers is
checked before anything is written (`export.hf.steps.check_against_transformers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.fused import fused_self_attention
from export.hf import ImportProblem

NEG_INF = -1e9  # as export.hf.seq2seq: finite, so fully masked rows stay NaN-free in fp16
KV = tuple[Tensor, Tensor]
Folding = tuple[Tensor, Tensor]  # fold (N, M), unfold (R,): IO contract 6


@dataclass(frozen=True)
class StepConfig:
    """What the exporter's validation reads of a translator (as `export.hf.seq2seq.StepConfig`)."""

    n_heads: int
    d_model: int
    d_k: int  # T5's d_kv: heads x d_k need not be d_model (Flan-T5 small: 6 x 64 over 512)
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    max_len: int


def check_supported(config: object) -> None:
    """ImportProblem naming what of a T5 `config` this module cannot reproduce. The feed-forward is
    the checkpoint's own module (ReLU, gated GELU, any activation transformers builds), so it is
    not checked here: the parity check before publishing is."""
    c = config
    kind = getattr(c, "model_type", None)
    if getattr(c, "is_decoder", False) or not getattr(c, "is_encoder_decoder", True):
        raise ImportProblem(f"{kind}: only encoder-decoder checkpoints are supported (not T5 encoders or decoders)")
    named = getattr(c, "architectures", None) or []
    if named and not any(a.endswith("ForConditionalGeneration") for a in named):
        # transformers would load the missing decoder as random weights (a warning only)
        raise ImportProblem(f"{kind}: architectures {named}: only ...ForConditionalGeneration checkpoints are served")
    if c.d_kv % 8:  # type: ignore[attr-defined]
        raise ImportProblem(f"{kind}: d_kv={c.d_kv} (the fused decoder attention needs a multiple of 8)")  # type: ignore[attr-defined]


def architecture(config: object) -> dict[str, int | float | str]:
    """The manifest's `architecture` of a T5 translator: its config's dimensions."""
    c = config
    return {
        "family": c.model_type,  # type: ignore[attr-defined]
        "d_model": c.d_model,  # type: ignore[attr-defined]
        "d_kv": c.d_kv,  # type: ignore[attr-defined]
        "n_heads": c.num_heads,  # type: ignore[attr-defined]
        "n_layers": c.num_layers,  # type: ignore[attr-defined]
        "n_dec_layers": c.num_decoder_layers,  # type: ignore[attr-defined]
        "vocab_size": c.vocab_size,  # type: ignore[attr-defined]
        "feed_forward_proj": c.feed_forward_proj,  # type: ignore[attr-defined]
    }


def _bucket_bias(attention: nn.Module, distances: Tensor, bidirectional: bool) -> Tensor:
    """The bias (len(distances), H) of key-minus-query `distances`, bucketed by transformers' own function."""
    buckets = attention._relative_position_bucket(
        distances,
        bidirectional=bidirectional,
        num_buckets=attention.relative_attention_num_buckets,
        max_distance=attention.relative_attention_max_distance,
    )
    return attention.relative_attention_bias.weight[buckets].detach().clone()


def _heads(x: Tensor, h: int) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, h, -1).transpose(1, 2)  # (B, H, T, d_k)


def _merge(x: Tensor) -> Tensor:
    b, h, t, dk = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dk)


def _mask_bias(mask: Tensor) -> Tensor:
    """(B, S) 1/0 mask -> (B, 1, 1, S) additive bias."""
    return torch.where(mask[:, None, None, :].bool(), 0.0, NEG_INF)


class T5Step(nn.Module):
    """A transformers T5 with the step-model interface the graphs and the checks use
    (`export.hf.steps.ImportedStep`): `encode`, `cross_kv`, `decode_step`, `layers`, `config`."""

    def __init__(
        self, hf: nn.Module, decoder_start_id: int, suppressed: tuple[int, ...] = (), eos_id: int | None = None
    ) -> None:
        super().__init__()
        c = hf.config
        check_supported(c)
        self.hf_config = c
        self.tokens = hf.shared.weight
        self.enc_blocks, self.layers = hf.encoder.block, hf.decoder.block
        self.enc_norm, self.dec_norm = hf.encoder.final_layer_norm, hf.decoder.final_layer_norm
        self.heads, dk = c.num_heads, c.d_kv
        enc_rel = self.enc_blocks[0].layer[0].SelfAttention  # layer 0 holds each stack's bias
        dec_rel = self.layers[0].layer[0].SelfAttention
        self.reach, self.reach_dec = enc_rel.relative_attention_max_distance, dec_rel.relative_attention_max_distance
        # (distances, H), the bucket constant beyond `reach`: encoder key - query in -reach .. reach,
        # decoder query - key in 0 .. reach (keys after the query are never attended)
        enc_bias = _bucket_bias(enc_rel, torch.arange(-self.reach, self.reach + 1), bidirectional=True)
        dec_bias = _bucket_bias(dec_rel, -torch.arange(self.reach_dec + 1), bidirectional=False)
        self.register_buffer("enc_bias", enc_bias, persistent=False)
        self.register_buffer("dec_bias", dec_bias, persistent=False)
        self.lm_head = hf.get_output_embeddings().weight
        self.output_scale = c.d_model**-0.5 if getattr(c, "scale_decoder_outputs", False) else 1.0
        vocab = self.lm_head.shape[0]
        mask = torch.zeros(vocab)
        mask[list(suppressed)] = float("-inf")
        self.register_buffer("suppress", mask, persistent=False)
        self.suppressing = bool(suppressed)
        self.config = StepConfig(
            n_heads=self.heads,
            d_model=c.d_model,
            d_k=dk,
            vocab_size=vocab,
            bos_id=decoder_start_id,
            eos_id=c.eos_token_id if eos_id is None else eos_id,
            pad_id=c.pad_token_id,
            max_len=int(getattr(c, "n_positions", None) or 512),  # the tokenizer's model_max_length
        )

    # -- encoder ---------------------------------------------------------------------------------

    def encode(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B, S) right-padded ids -> (B, S, D): every layer adds the same relative bias."""
        s = ids.shape[1]
        at = torch.arange(s, device=ids.device)
        distance = (at[None, :] - at[:, None]).clamp(-self.reach, self.reach) + self.reach  # (S, S) key - query
        bias = self.enc_bias[distance].permute(2, 0, 1)[None] + _mask_bias(mask)  # (B, H, S, S)
        x = F.embedding(ids, self.tokens)
        for block in self.enc_blocks:
            attn, ff = block.layer[0], block.layer[1]
            a = attn.SelfAttention
            h = attn.layer_norm(x)
            q, k, v = (_heads(p(h), self.heads) for p in (a.q, a.k, a.v))
            w = torch.softmax(q @ k.transpose(-2, -1) + bias, dim=-1)
            x = x + a.o(_merge(w @ v))
            x = x + ff.DenseReluDense(ff.layer_norm(x))
        return self.enc_norm(x)

    # -- decoder ---------------------------------------------------------------------------------

    def cross_kv(self, memory: Tensor) -> list[KV]:
        """Cross-attention K/V per decoder layer, (B, H, S, d_k) each: once per sentence."""
        e = [block.layer[1].EncDecAttention for block in self.layers]
        return [(_heads(a.k(memory), self.heads), _heads(a.v(memory), self.heads)) for a in e]

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
        """One token per row at each row's own position (`export.hf.seq2seq.Seq2Seq.decode_step`):
        log-probabilities (R, V), each layer's new key and value (R, H, 1, d_k) (`in_place`: the
        whole cache with them in slot `position`), the cross-attention weights (R, layers, H, S),
        folded (N, layers, H, M, S) with `folding`. The self-attention bias of slot s for a row at
        position p is the bucket of p - s: the row's own, whatever its neighbours' positions."""
        x = F.embedding(tokens, self.tokens)  # (R, 1, D)
        slots = torch.arange(cache[0][0].shape[2], device=tokens.device)
        distance = (positions[:, None] - slots[None, :]).clamp(0, self.reach_dec)  # (R, C); later slots unused
        self_bias = self.dec_bias[distance].permute(0, 2, 1)[:, :, None, :]  # (R, H, 1, C)
        src_bias = _mask_bias(src_mask)
        new_kv, weights = [], []
        for block, layer_cache, layer_cross in zip(self.layers, cache, cross, strict=True):
            attn, cross_attn, ff = block.layer
            a = attn.SelfAttention
            out, present = fused_self_attention(
                attn.layer_norm(x), (a.q, a.k, a.v), layer_cache, positions, self.heads, 1.0, self_bias
            )
            x = x + a.o(out)
            if not in_place:
                rows = torch.arange(x.shape[0])
                present = tuple(t[rows, :, positions][:, :, None] for t in present)  # type: ignore[assignment]
            out, w = self._cross_attn(
                cross_attn.EncDecAttention, layer_cross, src_bias, folding, cross_attn.layer_norm(x)
            )
            x = x + out
            x = x + ff.DenseReluDense(ff.layer_norm(x))
            new_kv.append(present)
            weights.append(w.unsqueeze(1) if folding is not None else w.transpose(1, 2))
        x = self.dec_norm(x)
        if self.output_scale != 1.0:
            x = x * self.output_scale
        logprobs = torch.log_softmax(x[:, 0] @ self.lm_head.T, -1)  # (R, V)
        if self.suppressing:
            logprobs = logprobs + self.suppress
        return logprobs, new_kv, torch.cat(weights, dim=1)

    def _cross_attn(
        self, a: nn.Module, kv: KV, bias: Tensor, folding: Folding | None, h: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Unscaled cross-attention with no position bias (T5's), folded as `export.hf.seq2seq`'s."""
        if folding is None:
            w = torch.softmax(_heads(a.q(h), self.heads) @ kv[0].transpose(-2, -1) + bias, dim=-1)
            return a.o(_merge(w @ kv[1])), w
        fold, unfold = folding
        inner = self.heads * self.config.d_k
        # Queries halved in the projection, scores doubled: exact (powers of two), and a scaled product
        # is the one ONNX Runtime fuses (FusedMatMul) into a kernel that gives a sentence's scores the
        # same bits whatever its rows M; the plain product does not (measured: rows alone and beside differ).
        q = (
            F.linear(h, a.q.weight * 0.5).reshape(-1, self.heads, self.config.d_k)[fold].transpose(1, 2)
        )  # (N, H, M, d_k)
        w = torch.softmax((q @ kv[0].transpose(-2, -1)) * 2.0 + bias, dim=-1)
        out = w[:, :, :, None] @ kv[1][:, :, None]  # (N, H, M, 1, d_k)
        return a.o(out.transpose(1, 2).reshape(-1, 1, inner)[unfold]), w

    def mismatch_hint(self, targets: Tensor) -> str:
        return ""

    def empty_cache(self, rows: int, slots: int) -> list[KV]:
        dk = self.config.d_k
        return [
            (torch.zeros(rows, self.heads, slots, dk), torch.zeros(rows, self.heads, slots, dk)) for _ in self.layers
        ]
