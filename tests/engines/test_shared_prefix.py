"""Shared-prefix decoding: the same tokens as plain batched `generate`, with the same sampling rules."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from esopt.engines.base import SamplingParams
from esopt.engines.hf import HFEngine
from esopt.engines.prefix import filter_logits, shared_prefix_length
from esopt.envs import make_env
from esopt.models.tiny import build_tiny_model
from esopt.rollout import build_markov_prompt, env_examples


@pytest.fixture
def prompts_and_policy():
    """A fresh engine per test (the tests toggle its prefix cache and fill its KV store) and 12 prompts."""
    model, tokenizer = build_tiny_model(seed=3)
    policy = HFEngine(model, tokenizer)
    env = make_env("esopt/Sudoku-v0", size=4, h_star=3, show_empty=True)
    examples = env_examples(env, 2)
    prompts = []
    for seed in range(12):
        obs, _ = env.reset(seed=seed)
        prompts.append(build_markov_prompt(policy, env.unwrapped.instructions, obs, examples))
    return policy, prompts


def test_shared_prefix_length_keeps_a_suffix_token():
    assert shared_prefix_length([[1, 2, 3], [1, 2, 4]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical rows: one token stays per row
    assert shared_prefix_length([[1, 2], [1, 2, 3, 4]]) == 1
    assert shared_prefix_length([[5], [6]]) == 0
    assert shared_prefix_length([]) == 0


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0, max_new_tokens=12),
                                      SamplingParams(temperature=0.9, top_p=0.9, top_k=30, max_new_tokens=12),
                                      SamplingParams(temperature=1.3, top_p=1.0, top_k=0, max_new_tokens=12)])
def test_shared_prefix_decoding_gives_the_plain_generate_tokens(prompts_and_policy, sampling):
    policy, prompts = prompts_and_policy
    ids = [policy.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert shared_prefix_length(ids) >= policy.min_prefix_tokens  # the fast path is taken
    policy.prefix_cache = True
    fast = policy.generate(prompts, sampling, seed=11)
    again = policy.generate(prompts, sampling, seed=11)
    policy.prefix_cache = False
    try:
        plain = policy.generate(prompts, sampling, seed=11)
    finally:
        policy.prefix_cache = True
    assert [g.token_ids for g in fast] == [g.token_ids for g in plain]
    assert [g.text for g in fast] == [g.text for g in plain]
    assert [g.prompt_ids for g in fast] == [g.prompt_ids for g in plain]
    assert [g.token_ids for g in fast] == [g.token_ids for g in again]
    if not sampling.greedy:  # the sampled rows differ from each other: the test is not trivially satisfied
        assert len({tuple(g.token_ids) for g in fast}) > 1


def test_without_the_cpu_attention_rows_copy_the_prefix_and_decode_the_same_tokens():
    """Attention implementations that cannot read a shared prefix (here torch's SDPA) get each row's own copy."""
    model, tokenizer = build_tiny_model(seed=3)
    policy = HFEngine(model, tokenizer, cpu_decode_attention=False)
    assert model.config._attn_implementation == "sdpa"
    env = make_env("esopt/Sudoku-v0", size=4, h_star=3, show_empty=True)
    examples = env_examples(env, 2)
    instructions = env.unwrapped.instructions
    prompts = [build_markov_prompt(policy, instructions, env.reset(seed=s)[0], examples) for s in range(6)]
    sampling = SamplingParams(temperature=0.9, top_p=0.9, top_k=30, max_new_tokens=12)
    fast = policy.generate(prompts, sampling, seed=5)
    policy.prefix_cache = False
    plain = policy.generate(prompts, sampling, seed=5)
    assert [g.token_ids for g in fast] == [g.token_ids for g in plain]
    assert len({tuple(g.token_ids) for g in fast}) > 1


def test_filter_logits_matches_transformers_warpers():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    for t, k, p in [(0.7, 20, 0.8), (1.0, 0, 0.5), (1.5, 5, 1.0)]:
        ours = filter_logits(logits, SamplingParams(temperature=t, top_k=k, top_p=p))
        ref = TemperatureLogitsWarper(t)(None, logits)
        if k:
            ref = TopKLogitsWarper(k)(None, ref)
        if p < 1:
            ref = TopPLogitsWarper(p)(None, ref)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        assert torch.equal(ours[~torch.isinf(ours)], ref[~torch.isinf(ref)])  # one division by t, masks only


def test_prefix_kv_is_kept_across_calls_only_inside_a_rollout_scope(prompts_and_policy):
    policy, prompts = prompts_and_policy
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    expected = [policy.generate(prompts[:6], greedy), policy.generate(prompts[6:], greedy)]
    store = policy.prefix_kv
    before = store.reused_tokens
    policy.generate(prompts[:6], greedy)
    assert store.reused_tokens == before and not store.layers  # outside a scope nothing outlives a call
    with policy.rollout_scope():
        first = policy.generate(prompts[:6], greedy)
        second = policy.generate(prompts[6:], greedy)  # other episodes, same system prompt and examples
        assert store.reused_tokens > before  # the second call took its prefix from the first
    assert not store.layers  # dropped when the scope ends
    assert [g.token_ids for g in first] == [g.token_ids for g in expected[0]]
    assert [g.token_ids for g in second] == [g.token_ids for g in expected[1]]


def test_a_weight_change_inside_the_scope_drops_the_prefix(prompts_and_policy):
    policy, prompts = prompts_and_policy
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    with policy.rollout_scope():
        policy.generate(prompts[:4], greedy)
        assert policy.prefix_kv.layers
        policy.weights_changed()
        assert not policy.prefix_kv.layers


def test_multi_turn_rollout_reuses_the_prefix_and_matches_a_rollout_without_it():
    from esopt.rollout import run_episodes

    class NoScope:  # the same policy without `rollout_scope`: every turn encodes its prefix again
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name == "rollout_scope":
                raise AttributeError(name)
            return getattr(self.inner, name)

    model, tokenizer = build_tiny_model(seed=3)
    policy = HFEngine(model, tokenizer)
    env = make_env("esopt/Sudoku-v0", size=4, h_star=3, show_empty=True)
    examples = env_examples(env, 2)
    make = lambda: make_env("esopt/Sudoku-v0", size=4, h_star=3, show_empty=True)  # noqa: E731
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    kept, _ = run_episodes(policy, make, list(range(8)), greedy, examples=examples)
    assert policy.prefix_kv.reused_tokens > 0 and max(t.num_turns for t in kept) > 1
    plain, _ = run_episodes(NoScope(policy), make, list(range(8)), greedy, examples=examples)
    assert [[u.text for u in t.turns] for t in kept] == [[u.text for u in t.turns] for t in plain]


@pytest.mark.parametrize("rows", [[0, 0, 1, 1, 2, 2, 3, 3], [3, 1, 0, 2, 1, 3, 0, 2]])
def test_rows_read_the_stored_prefix_of_their_member_without_copying_it(prompts_and_policy, rows):
    """Batched members each have their own prefix KV. The rows read it where the store holds it: the batch's
    cache holds only the rows' own positions, a second call reuses the stored tensors themselves, the store
    holds every member's prefix exactly as encoded, and every call decodes what a call without a store does."""
    from esopt.engines.prefix import PrefixKV, SuffixLayer, generate_with_shared_prefix
    from esopt.es import ES, ESConfig
    from esopt.es.batched import BatchedLowRank

    policy, prompts = prompts_and_policy
    model, tok = policy.model, policy.tokenizer
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts[:len(rows)]]
    prefix_len = shared_prefix_length(ids)
    es = ES(model, ESConfig(population_size=4, antithetic=True, sigma=0.3, sigma_schedule="constant", noise="lowrank"))
    host, store = BatchedLowRank(model, es.perturbation), PrefixKV()
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    own: list[int] = []  # positions the batch's cache holds per row, at every decoding forward

    def spy(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if kwargs["input_ids"].shape[0] == len(rows):  # a decoding forward, not a prefix pass
            assert all(isinstance(layer, SuffixLayer) for layer in cache.layers)
            own.append(max(layer.max_cache_len for layer in cache.layers))
    hook = model.register_forward_pre_hook(spy, with_kwargs=True)

    def generate(with_store):
        return generate_with_shared_prefix(model, ids, prefix_len, greedy, policy.eos_token_ids, tok.pad_token_id,
                                           groups=rows, set_rows=host.set_rows, store=store if with_store else None)
    try:
        with torch.no_grad(), host.members(es.ask(), 0.3):
            first = generate(True)
            kept = [(k.data_ptr(), k.clone(), v.clone()) for k, v in store.layers]
            second = generate(True)  # the whole prefix from the store: no prefix pass
            assert store.reused_tokens == prefix_len
            hook.remove()
            fresh = generate(False)
            host.set_rows([0, 1, 2, 3])  # each member's prefix, encoded as the first call encoded it
            alone = model(input_ids=torch.tensor([ids[0][:prefix_len]] * 4), use_cache=True, logits_to_keep=1)
    finally:
        hook.remove()
    width = max(len(x) for x in ids) - prefix_len
    assert own and set(own) == {width + greedy.max_new_tokens}  # the suffix and new tokens, never the prefix
    assert first == second == fresh and len({tuple(t) for t in first[0]}) > 1
    assert store.ids == tuple(ids[0][:prefix_len]) and store.groups == {0: 0, 1: 1, 2: 2, 3: 3}
    encoded = [(layer.keys, layer.values) for layer in alone.past_key_values.layers]
    for (k, v), (ptr, k0, v0), (k1, v1) in zip(store.layers, kept, encoded, strict=True):
        assert k.data_ptr() == ptr and torch.equal(k, k0) and torch.equal(v, v0)  # the same tensors, unchanged
        assert torch.equal(k, k1) and torch.equal(v, v1)  # and exactly the members' own prefix KV
    assert not torch.equal(encoded[-1][0][0], encoded[-1][0][1])  # the members' prefixes really differ


@pytest.mark.parametrize("rows", [None, [0, 1, 2, 3, 0, 1, 2, 3]])
def test_rows_continue_from_their_own_stored_kv_and_decode_what_a_fresh_call_does(prompts_and_policy, rows):
    """A call whose prompts extend an earlier call's prompts and replies (a conversation's next turn) encodes
    only the new tokens, each row continuing from its own stored positions (per member), and decodes exactly
    what a call without the row store does."""
    import contextlib

    from esopt.engines.prefix import PrefixKV, RowKV, generate_with_shared_prefix
    from esopt.es import ES, ESConfig
    from esopt.es.batched import BatchedLowRank

    policy, prompts = prompts_and_policy
    model, tok = policy.model, policy.tokenizer
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts[:8]]
    prefix_len = shared_prefix_length(ids)
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    store, row_store = PrefixKV(), RowKV()
    host, members = None, contextlib.nullcontext()
    if rows is not None:
        es = ES(model, ESConfig(population_size=4, antithetic=True, sigma=0.3, sigma_schedule="constant",
                                noise="lowrank"))
        host = BatchedLowRank(model, es.perturbation)
        members = host.members(es.ask(), 0.3)

    def generate(x, with_rows):
        return generate_with_shared_prefix(model, x, prefix_len, greedy, policy.eos_token_ids, tok.pad_token_id,
                                           groups=rows, set_rows=host and host.set_rows, store=store,
                                           rows_store=row_store if with_rows else None)[0]
    with torch.no_grad(), members:
        first = generate(ids, True)
        answer = tok(" row 2 col 3", add_special_tokens=False)["input_ids"]
        later = [x + t + answer for x, t in zip(ids, first)]
        second, fresh = generate(later, True), generate(later, False)
    assert second == fresh
    assert row_store.reused_tokens == sum(len(x) - prefix_len + len(t) - 1 for x, t in zip(ids, first))
    assert row_store.match(7, later[0], prefix_len) == (0, None)  # a group's rows never read another's
    n, entry = row_store.match(rows[0] if rows else 0, later[0] + second[0] + answer, prefix_len)
    assert n == len(later[0]) - prefix_len + len(second[0]) - 1 and entry is not None  # the second call's rows


def test_a_history_rollout_reuses_each_rows_kv_and_matches_one_without_it():
    """History prompts grow by the last reply and observation: with the row cache each turn encodes only that,
    and the episodes are token for token those without it. Markov prompts do not grow: nothing is kept."""
    from esopt.rollout import run_episodes

    model, tokenizer = build_tiny_model(seed=3)
    make = lambda: make_env("esopt/Sudoku-v0", size=4, h_star=3, show_empty=True)  # noqa: E731
    examples = env_examples(make(), 2)
    sampling = SamplingParams(temperature=0.8, max_new_tokens=10)
    out, reused = [], []
    for row_cache in (True, False):
        policy = HFEngine(model, tokenizer, row_cache=row_cache)
        trajectories, _ = run_episodes(policy, make, list(range(8)), sampling, examples=examples,
                                       conversation="history", seed=4)
        out.append([[u.token_ids for u in t.turns] for t in trajectories])
        reused.append(policy.row_kv and policy.row_kv.reused_tokens)
        assert max(t.num_turns for t in trajectories) > 2
    assert out[0] == out[1] and reused[0] > 1000 and reused[1] is None
    policy = HFEngine(model, tokenizer)
    run_episodes(policy, make, list(range(8)), sampling, examples=examples, conversation="markov", seed=4)
    assert policy.row_kv is not None and policy.row_kv.reused_tokens == 0
