"""Decode-step attention for CPUs: two batched matmuls instead of torch's fused SDPA kernel.

With one query token per row, torch's CPU SDPA kernel is slow: 19 ms for 128 rows x 250 keys (SmolLM2's
9 query / 3 key-value heads, bf16, 2 threads) where `softmax(q K^T) V` as two batched matmuls over the
key-value heads takes 1.9 ms. Prefill (many query tokens) stays on SDPA, which is faster there. Decoding
many rows at once is exactly what batched ES populations do, so this is registered as an attention
implementation of `transformers` and switched on for CPU models by `HFEngine`.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "esopt_cpu_decode"


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Same contract as `transformers`' `sdpa_attention_forward`: query (B, H, L, D), key and value
    (B, KV, S, D) with H a multiple of KV; returns (B, L, H, D)."""
    batch, heads, q_len, dim = query.shape
    unsupported = (dropout and module.training) or kwargs.get("position_bias") is not None or \
        kwargs.get("softcap") is not None or heads % key.shape[1]
    if q_len != 1 or query.device.type != "cpu" or unsupported:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    kv_heads = key.shape[1]
    # query heads h = k * group + j all read key-value head k (as repeat_kv lays them out)
    scores = torch.matmul(query.reshape(batch, kv_heads, heads // kv_heads, dim), key.transpose(-1, -2)).float()
    scores.mul_(dim ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:  # (B or 1, 1, 1, S): bool keeps, float adds
        mask = attention_mask[..., -1:, : key.shape[2]]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # (B, KV, group, D)
    return out.reshape(batch, 1, heads, dim), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model that runs SDPA to `decode_attention`; False (unchanged) otherwise."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu" or not hasattr(model, "set_attn_implementation"):
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)  # type: ignore[operator]
    return config._attn_implementation == NAME
