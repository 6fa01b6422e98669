"""The CPU decode-step attention gives the same logits as transformers' SDPA (fp32), padding included."""

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from esopt.engines.attention import NAME, use_decode_attention


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
        out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
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
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    # no mask at all (every row the same length)
    assert torch.allclose(decode_three_steps(model, ids, torch.ones_like(ids)),
                          decode_three_steps(base, ids, torch.ones_like(ids)), atol=1e-5, rtol=1e-5)


def test_only_cpu_sdpa_models_are_switched():
    eager = gqa_llama()
    eager.set_attn_implementation("eager")
    assert not use_decode_attention(eager) and eager.config._attn_implementation == "eager"
