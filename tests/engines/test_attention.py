"""The CPU decode-step attention gives the same logits as transformers' SDPA (fp32), padding included."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from esopt.engines.attention import NAME, prefix_attention, use_decode_attention
from esopt.engines.prefix import CACHE_ARG
from tests.tolerance import assert_close_up_to_rounding, network_rtol, reduction_rtol, unit_roundoff


def gqa_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def decode_three_steps(model, ids, mask):
    """Logits of a left-padded prefill and of three single-token decode steps after it."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    logits, cache = [out.logits[:, -1]], out.past_key_values
    for _ in range(3):
        token = logits[-1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=token, attention_mask=mask, use_cache=True, **{CACHE_ARG: cache})
        logits.append(out.logits[:, -1])
    return torch.stack(logits)


@torch.inference_mode()
def test_decode_attention_matches_sdpa_with_padding():
    base = gqa_llama()
    ids = torch.randint(0, 97, (5, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[3, :7] = 0
    expected = decode_three_steps(base, ids, mask)
    model = copy.deepcopy(base)
    assert use_decode_attention(model) and model.config._attn_implementation == NAME
    got = decode_three_steps(model, ids, mask)
    assert_close_up_to_rounding(got, expected, network_rtol(base))
    # no mask at all (every row the same length)
    assert_close_up_to_rounding(decode_three_steps(model, ids, torch.ones_like(ids)),
                                decode_three_steps(base, ids, torch.ones_like(ids)), network_rtol(base))


def test_only_cpu_sdpa_models_are_switched():
    eager = gqa_llama()
    eager.set_attn_implementation("eager")
    assert not use_decode_attention(eager) and eager.config._attn_implementation == "eager"


def sdpa_over_copies(query, key, value, mask, kp, vp, runs):
    """The reference: SDPA over [the row's own copy of its prefix | its own keys], the prefix always visible."""
    heads, kv_heads, p_len = query.shape[1], key.shape[1], kp.shape[2]
    entry = [e for start, end, e in runs for _ in range(start, end)]
    full_k = torch.cat([kp[entry], key], 2).repeat_interleave(heads // kv_heads, 1)
    full_v = torch.cat([vp[entry], value], 2).repeat_interleave(heads // kv_heads, 1)
    visible = mask.clone()
    visible[..., :p_len] = True
    return torch.nn.functional.scaled_dot_product_attention(query, full_k, full_v, attn_mask=visible).transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("own", [4, 0])
def test_prefix_attention_matches_sdpa_over_each_rows_own_copy_of_its_prefix(q_len, own):
    """Runs of rows sharing one of three prefixes, grouped query heads, masked own positions (a padded query
    sees none of them), one or several queries per row, or no own positions at all: the same as SDPA over
    [the row's prefix | its own keys]."""
    g = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, dim, p_len = 6, 6, 2, 8, 5
    runs = [(0, 2, 1), (2, 3, 0), (3, 6, 2)]
    query = torch.randn(batch, heads, q_len, dim, generator=g)
    key, value = (torch.randn(batch, kv_heads, own, dim, generator=g) for _ in range(2))
    kp, vp = (torch.randn(3, kv_heads, p_len, dim, generator=g) for _ in range(2))
    mask = torch.rand(batch, 1, q_len, p_len + own, generator=g) > 0.4
    mask[..., :p_len] = False  # the prefix part of the mask is not read: the prefix is visible to every query
    if own:
        mask[1:, :, :, p_len] = True
        mask[0, :, 0, p_len:] = False  # a padded query: none of its own positions, only the prefix
    got = prefix_attention(query, key, value, mask, (kp, vp), runs, dim ** -0.5)  # (B, L, H, D)
    assert got.shape == (batch, q_len, heads, dim)
    expected = sdpa_over_copies(query, key, value, mask, kp, vp, runs)
    rtol = reduction_rtol(torch.float32, max(dim, p_len + own), depth=3)  # scores, softmax's sum, weights x values
    assert_close_up_to_rounding(got, expected, rtol)
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))  # a float mask adds
    assert_close_up_to_rounding(prefix_attention(query, key, value, additive, (kp, vp), runs, dim ** -0.5), got, rtol)
    # bf16: within the rounding of its bf16 inputs and output (the fused kernel keeps the scores in fp32): q and
    # k each move a score by u of its terms, the output is a convex mix of values rounded by u, rounded again
    half = [x.bfloat16() for x in (query, key, value, kp, vp)]
    low = prefix_attention(*half[:3], mask, (half[3], half[4]), runs, dim ** -0.5)
    bound = 16 * unit_roundoff(torch.bfloat16) * float(expected.abs().max())
    assert low.dtype == torch.bfloat16 and (low.float() - expected).abs().max() < bound


def test_a_shared_prefix_with_a_softcap_is_refused_not_ignored():
    from esopt.engines.attention import SharedPrefix, decode_attention
    module = gqa_llama().model.layers[0].self_attn
    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 3, 16)
    shared = SharedPrefix([(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16))] * 2, [(0, 2, 0)])
    with pytest.raises(ValueError, match="softcap"):
        decode_attention(module, q, k, k, None, softcap=30.0, shared_prefix=shared)
