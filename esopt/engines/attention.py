"""Decode-step attention for CPUs: two batched matmuls instead of torch's fused SDPA kernel.

With one query token per row, torch's CPU SDPA kernel is slow: 19 ms for 128 rows x 250 keys (SmolLM2's
9 query / 3 key-value heads, bf16, 2 threads) where `softmax(q K^T) V` as two batched matmuls over the
key-value heads takes 1.9 ms. Prefill (many query tokens) stays on SDPA, which is faster there. Decoding
many rows at once is exactly what batched ES populations do, so this is registered as an attention
implementation of `transformers` and switched on for CPU models by `HFEngine`.

The same implementation attends over a prompt prefix that many rows share without copying it into each row
(`SharedPrefix`, passed as the model call's `shared_prefix` keyword; `prefix.py` builds it): the rows' queries
meet each shared prefix in one call of torch's fused kernel, the rows folded into its query length, and only
the rows' own positions are per row. At 128 rows of an 800-token prefix that per-row copy, and attention over
it, cost several times the model's own matmuls per decode step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "esopt_cpu_decode"
# torch's fused (flash) CPU attention, which also returns the log-sum-exp that merging two parts needs
_fused_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class SharedPrefix(NamedTuple):
    """A prefix's KV cache that runs of rows share: per layer (entries, kv heads, P, dim) keys and values; row
    r reads entry e for every (start, end, e) run with start <= r < end. The rows' cache holds only their own
    positions, which follow the prefix's P (masks count them after it)."""
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    runs: list[tuple[int, int, int]]


def prefix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     prefix: tuple[torch.Tensor, torch.Tensor], runs: list[tuple[int, int, int]], scale: float
                     ) -> torch.Tensor:
    """softmax(q [K_prefix | K_own]^T) [V_prefix | V_own] with the prefix shared by runs of rows and visible to
    every query: query (B, H, L, D), key/value (B, KV, S, D) the rows' own positions, prefix (E, KV, P, D),
    mask (B or 1, 1, L, P + S) over both (its prefix part is not read). Returns (B, L, H, D).

    Two calls of torch's fused CPU kernel (scores in fp32 blocks, never a whole score matrix in memory): the
    rows' own positions, masked, and per run the prefix, with the run's rows folded into one long query so
    that they read the one prefix. The two partial results are merged by their log-sum-exps. Writing the
    (rows x heads x L, P) scores out in fp32 instead made a 128-row prefill over a 1400-token prefix 2x slower."""
    batch, heads, q_len, dim = query.shape
    kv_heads, (kp, vp), own_len = key.shape[1], prefix, key.shape[2]
    group = heads // kv_heads  # query heads h = k * group + j read kv head k
    q = query.reshape(batch, kv_heads, group * q_len, dim)
    if not own_len:  # nothing of the rows' own yet: the prefix part alone (weight 0 on this empty part)
        out, lse = torch.zeros(q.shape), torch.full(q.shape[:3], float("-inf"))
    else:
        own_mask = None
        if mask is not None:  # bool keeps, float adds; the same for every head of a kv group
            part = mask[:, :, :, kp.shape[2]:kp.shape[2] + own_len]
            if part.dtype == torch.bool:
                part = torch.zeros(part.shape, dtype=query.dtype).masked_fill_(~part, float("-inf"))
            own_mask = part.to(query.dtype).repeat(1, 1, group, 1)  # (B or 1, 1, group x L, S)
        own, own_lse = _fused_attention(q, key, value, 0.0, False, attn_mask=own_mask, scale=scale)
        if own_mask is not None:  # the kernel gives a query that sees none of its own positions lse 0, not -inf
            own_lse = own_lse.masked_fill((own_mask == float("-inf")).all(-1), float("-inf"))
        out, lse = own.float(), own_lse
    for start, end, e in runs:
        n = end - start
        rows = q[start:end].transpose(0, 1).reshape(1, kv_heads, n * group * q_len, dim)
        part_out, part_lse = _fused_attention(rows, kp[e:e + 1], vp[e:e + 1], 0.0, False, scale=scale)
        part_out = part_out.reshape(kv_heads, n, group * q_len, dim).transpose(0, 1).float()
        part_lse = part_lse.reshape(kv_heads, n, group * q_len).transpose(0, 1)
        top = torch.maximum(lse[start:end], part_lse)  # finite: every query sees the prefix
        mine, theirs = (lse[start:end] - top).exp(), (part_lse - top).exp()
        out[start:end] = (out[start:end] * mine[..., None] + part_out * theirs[..., None]) / (mine + theirs)[..., None]
    return out.to(value.dtype).reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous()


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Same contract as `transformers`' `sdpa_attention_forward`: query (B, H, L, D), key and value
    (B, KV, S, D) with H a multiple of KV; returns (B, L, H, D)."""
    batch, heads, q_len, dim = query.shape
    unsupported = (dropout and module.training) or kwargs.get("position_bias") is not None or \
        kwargs.get("softcap") is not None or heads % key.shape[1]
    shared = kwargs.get("shared_prefix")
    if shared is not None:
        if unsupported:  # SDPA cannot read it either: the rows' cache lacks the prefix
            raise ValueError(f"{type(module).__name__} needs dropout, a position bias or a softcap, which the "
                             "shared-prefix attention does not implement")
        return prefix_attention(query, key, value, attention_mask, shared.layers[module.layer_idx], shared.runs,
                                dim ** -0.5 if scaling is None else scaling), None
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
