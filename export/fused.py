"""The decoder step's self-attention as one fused ONNX Runtime operator that writes the cache in place.

`cached_attention` runs in PyTorch as plain math (the reference) and exports as
`com.microsoft.GroupQueryAttention` (ONNX Runtime's contrib op, CPU and CUDA kernels, fp32 and fp16):
each row's new key and value go into its own slot `position` of the cache, and the row attends to
slots 0 .. position only, so rows at different positions share one call with no mask, scatter or
concatenation in the graph. When the caller binds the cache input and the present output to the same
memory (IO binding), the operator writes only the new slot: no copy of the cache per step (IO contract 5,
`service.contract.graphs`). Measured beside the unfused graph it replaces in `docs/history/2026-12-results.md`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.onnx import symbolic_helper

KV = tuple[Tensor, Tensor]

CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_OPSET = 1


class _CachedAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: object,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cache_k: Tensor,
        cache_v: Tensor,
        positions: Tensor,
        heads: int,
        scale: float,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        r, slots, d_k = cache_k.shape[0], cache_k.shape[2], cache_k.shape[3]
        rows = torch.arange(r)
        present_k, present_v = cache_k.clone(), cache_v.clone()
        present_k[rows, :, positions] = k.reshape(r, heads, d_k)
        present_v[rows, :, positions] = v.reshape(r, heads, d_k)
        q_heads = q.reshape(r, heads, 1, d_k)
        scores = (q_heads @ present_k.transpose(-2, -1)) * scale  # (R, H, 1, slots)
        if bias is not None:
            scores = scores + bias  # (R, H, 1, slots): T5's relative position bias
        unused = torch.arange(slots)[None, :] > positions[:, None]  # (R, slots): after the row's token
        scores = scores.masked_fill(unused[:, None, None, :], float("-inf"))
        out = torch.softmax(scores, dim=-1) @ present_v  # (R, H, 1, d_k)
        return out.reshape(r, 1, heads * d_k), present_k, present_v

    @staticmethod
    def symbolic(  # the TorchScript exporter's hook
        g: torch.Graph,
        q: torch.Value,
        k: torch.Value,
        v: torch.Value,
        cache_k: torch.Value,
        cache_v: torch.Value,
        positions: torch.Value,
        heads: int,
        scale: float,
        bias: torch.Value | None = None,
    ) -> tuple[torch.Value, torch.Value, torch.Value]:
        int32 = 6  # TensorProto.INT32
        seqlens = g.op("Cast", positions, to_i=int32)  # per row: total length - 1 = the token's slot
        slots = g.op("Gather", g.op("Shape", cache_k), g.op("Constant", value_t=torch.tensor(2)), axis_i=0)
        total = g.op("Cast", slots, to_i=int32)  # every slot may be attended (seqlens decide which)
        # an additive bias is the op's attention_bias input, after cos/sin caches and position ids (absent)
        none = symbolic_helper._optional_input_placeholder_tensor
        biased = [] if bias is None or symbolic_helper._is_none(bias) else [none(g), none(g), none(g), bias]
        out, present_k, present_v = g.op(
            f"{CONTRIB_DOMAIN}::GroupQueryAttention",
            q,
            k,
            v,
            cache_k,
            cache_v,
            seqlens,
            total,
            *biased,
            num_heads_i=heads,
            kv_num_heads_i=heads,
            scale_f=scale,
            outputs=3,
        )
        out.setType(q.type())
        present_k.setType(cache_k.type())
        present_v.setType(cache_v.type())
        return out, present_k, present_v


def cached_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: KV, positions: Tensor, heads: int, scale: float, bias: Tensor | None = None
) -> tuple[Tensor, KV]:
    """One new token per row over its cache: q, k, v (R, 1, H*d_k) (un-scaled queries), cache
    (R, H, slots, d_k) each with the row's earlier keys in slots 0 .. position-1, positions (R,).
    Returns the attended values (R, 1, H*d_k) and the cache with each row's new key and value in
    slot `position` (`softmax(scale * q kᵀ + bias) v` over slots 0 .. position; `bias` (R, H, 1, slots)
    or none, T5's relative position bias: the op's `attention_bias` input)."""
    out, present_k, present_v = _CachedAttention.apply(q, k, v, cache[0], cache[1], positions, heads, scale, bias)
    return out, (present_k, present_v)


def fused_self_attention(
    x: Tensor,
    projections: tuple[nn.Linear, nn.Linear, nn.Linear],
    cache: KV,
    positions: Tensor,
    heads: int,
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, KV]:
    """The decoder step's self-attention of x (R, 1, D) through `cached_attention`: queries, keys
    and values from one matmul over the three projections side by side (one larger GEMM in the
    graph). Returns the attended values (R, 1, D), before the output projection, and the cache."""
    weight = torch.cat([p.weight for p in projections])
    linear_bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features) for p in projections])
    q, k, v = F.linear(x, weight, linear_bias).split(projections[0].out_features, dim=-1)  # (R, 1, D) each
    return cached_attention(q, k, v, cache, positions, heads, scale, bias)
