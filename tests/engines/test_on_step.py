"""`Engine.generate(on_step=...)`: the listener sees every decode step's tokens and may end rows early,
through both decode paths (transformers' generate, and the shared-prefix loop), without changing any row's
tokens."""

import pytest

from esopt.engines.base import SamplingParams
from tests.policies import SlowForward, distinct_tiny_policy

SHARED = "1 2 3 4 | " * 4  # 40 tokens in common: over the engine's 32, so the prefix path decodes them
PROMPTS = [SHARED + "5 6", SHARED + "7 8 9", SHARED + "2"]


@pytest.fixture(scope="module")
def policy():
    policy = distinct_tiny_policy()
    SlowForward(policy)  # no delay, never EOS: every row runs to max_new_tokens
    return policy


@pytest.mark.parametrize("logprobs", [False, True])  # True: transformers' generate (no shared-prefix path)
@pytest.mark.parametrize("sampling", [SamplingParams(0, 1, 0, 12), SamplingParams(0.8, 1, 0, 12)])
def test_a_listener_sees_each_step_and_ends_one_row_without_touching_the_others(policy, sampling, logprobs,
                                                                               monkeypatch):
    import esopt.engines.hf as hf

    prefix_calls = []
    real = hf.generate_with_shared_prefix
    monkeypatch.setattr(hf, "generate_with_shared_prefix", lambda *a, **k: prefix_calls.append(1) or real(*a, **k))
    plain = policy.generate(PROMPTS, sampling, seed=3, return_logprobs=logprobs)
    assert len(prefix_calls) == (0 if logprobs else 1)
    assert all(len(c.token_ids) == 12 for c in plain)
    steps: list[list[int]] = []

    def on_step(tokens):
        steps.append(list(tokens))
        return [False, len(steps) >= 3, False]  # row 1's client leaves after its third token

    out = policy.generate(PROMPTS, sampling, seed=3, return_logprobs=logprobs, on_step=on_step)
    assert out[0].token_ids == plain[0].token_ids and out[2].token_ids == plain[2].token_ids
    assert out[1].token_ids == plain[1].token_ids[:3]
    assert out[1].text == policy.tokenizer.decode(plain[1].token_ids[:3], skip_special_tokens=True)
    assert [s[0] for s in steps] == plain[0].token_ids  # each step's tokens, in order, as they were made
    assert [s[1] for s in steps[:3]] == plain[1].token_ids[:3]
    if logprobs:
        assert out[1].logprobs == pytest.approx(plain[1].logprobs[:3])


def test_the_call_ends_when_the_listener_has_ended_every_row(policy):
    count = 0

    def on_step(tokens):
        nonlocal count
        count += 1
        return [count >= 2] * len(tokens)

    out = policy.generate(PROMPTS, SamplingParams(0, 1, 0, 50), on_step=on_step)
    assert count == 2 and [len(c.token_ids) for c in out] == [2, 2, 2]
