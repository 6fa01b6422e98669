"""Shared policy-gradient machinery: masks, batching, log-probs, losses, optimisation, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from esopt.engines.base import SamplingParams
from esopt.engines.hf import HFEngine
from esopt.models.tiny import build_tiny_model
from esopt.rollout import Trajectory, Turn
from esopt.train.pg import (
    STATE_FILE,
    Norm,
    PGSection,
    TurnSample,
    aggregate,
    batch_logprobs,
    collate,
    kl_k3,
    latest_pg_checkpoint,
    make_optimizer,
    micro_batches,
    minibatch_norm,
    optimize,
    policy_loss,
    prefix_once,
    shared_prefix_forward,
    shuffle_generator,
    token_logprobs,
    turn_samples,
)
from esopt.train.rundir import RunDir
from tests.tolerance import assert_close_up_to_rounding, network_rtol, rounded_chain_rtol, ulps

PAD = 0


def make_turn(prompt_ids, token_ids, reward=0.0, done=False, **info) -> Turn:
    return Turn(prompt="p", prompt_ids=list(prompt_ids), token_ids=list(token_ids), text="t", logprobs=None,
                reward=reward, terminated=done, truncated=False, info=info)


def test_collate_mask_covers_exactly_generated_tokens():
    samples = [TurnSample([5, 6, 7], [8, 9]), TurnSample([5], [8, 9, 10]), TurnSample([5, 6], [])]
    b = collate(samples, PAD)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 10, 0], [5, 6, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    # mask position t scores target input_ids[:, t+1]: exactly the generated ids, never prompt or padding
    assert b.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]]
    targets = b.input_ids[:, 1:]
    assert [targets[i][b.mask[i].bool()].tolist() for i in range(3)] == [[8, 9], [8, 9, 10], []]
    assert b.prompt_last.tolist() == [2, 0, 1]
    assert b.lengths.tolist() == [5, 4, 2]
    part = b.select(torch.tensor([2]))  # trimmed to its own length
    assert part.input_ids.shape == (1, 2) and part.mask.shape == (1, 1)


def test_turn_samples_drop_empty_generations_unless_asked():
    t = Trajectory(task_seed=0)
    t.add(make_turn([1, 2], [3]))
    t.add(make_turn([1, 2], []))  # model output is untrusted: an empty generation
    t.add(make_turn([1, 4], [5, 6], done=True))
    kept = turn_samples([t], [[0.1, 0.2, 0.3]])
    assert [(s.turn, s.advantage) for s in kept] == [(0, 0.1), (2, 0.3)]
    assert len(turn_samples([t], [[0.1, 0.2, 0.3]], keep_empty=True)) == 3
    with pytest.raises(ValueError, match="advantages"):
        turn_samples([t], [[0.1]])


def test_token_logprobs_match_the_generation_logprobs():
    """Right-padded teacher forcing reproduces the left-padded sampler's log-probs (same temperature)."""
    model, tok = build_tiny_model(seed=3)
    policy = HFEngine(model, tok)
    sampling = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=6)
    gens = policy.generate(["1 .2\n>", "12 34 .1\n>"], sampling, seed=5, return_logprobs=True)
    batch = collate([TurnSample(g.prompt_ids, g.token_ids) for g in gens], tok.pad_token_id)
    lp = batch_logprobs(model, batch, 0.7, micro=1)
    for i, g in enumerate(gens):
        got = lp[i][batch.mask[i].bool()]
        assert_close_up_to_rounding(got, torch.tensor(g.logprobs), 2 * network_rtol(model))  # via log_softmax
    with torch.no_grad():
        assert_close_up_to_rounding(token_logprobs(model, batch, 0.7) * batch.mask, lp, 2 * network_rtol(model))


def _shared_prefix_batch(tok, prefix_len=40):
    """Four samples whose prompts share `prefix_len` tokens, with prompts and replies of different lengths."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, tok.vocab_size, (prefix_len,), generator=g).tolist()
    samples = [TurnSample(prefix + torch.randint(3, tok.vocab_size, (k,), generator=g).tolist(),
                          torch.randint(3, tok.vocab_size, (r,), generator=g).tolist(), advantage=a)
               for k, r, a in [(3, 4, 1.0), (7, 2, -0.5), (1, 5, 0.3), (5, 1, -1.2)]]
    return collate(samples, tok.pad_token_id)


def test_shared_prefix_logprobs_and_gradients_equal_the_plain_pass():
    """Encoding the prompts' common prefix once (and back-propagating through its repeated KV) gives the
    log-probs and the gradient of one plain pass over every full row."""
    model, tok = build_tiny_model(seed=4)
    batch = _shared_prefix_batch(tok)
    out, shared = shared_prefix_forward(model, batch.input_ids, batch.attention_mask, int(batch.prompt_last.min()))
    assert shared == 40  # the common prefix, not more: the rows differ right after it

    def grads(fn):
        model.zero_grad(set_to_none=True)
        logp = fn()
        (logp * batch.mask * batch.advantages[:, None]).sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.parameters()]

    def plain():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        return lp * batch.mask

    want, want_grads = grads(plain)
    got, got_grads = grads(lambda: token_logprobs(model, batch, 1.0) * batch.mask)
    assert_close_up_to_rounding(got, want, 2 * network_rtol(model))
    for a, b in zip(got_grads, want_grads, strict=True):  # backward: the forward's chain again
        assert_close_up_to_rounding(a, b, 4 * network_rtol(model))
    assert max(float(g.abs().max()) for g in want_grads) > 1e-3  # the gradient compared is not all zero


def test_prefix_once_gives_the_micro_batches_gradient_with_one_prefix_pass():
    """A minibatch's micro-batches inside `prefix_once`: the log-probs and the accumulated gradient of encoding
    the shared prefix in every micro-batch, from one prefix pass (forward and backward) instead of one each."""
    model, tok = build_tiny_model(seed=4)
    batch = _shared_prefix_batch(tok)
    rows: list[int] = []  # the batch size of each forward call: the prefix passes are the ones at batch 1
    model.register_forward_pre_hook(lambda m, args, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                    with_kwargs=True)

    def accumulate(models):
        model.zero_grad(set_to_none=True)
        rows.clear()
        logps = []
        with prefix_once(models, batch):
            for idx in micro_batches(len(batch), 2):
                part = batch.select(idx)
                logp = token_logprobs(model, part, 1.0) * part.mask
                (logp * part.advantages[:, None]).sum().backward()
                logps.append(logp.detach())
        return logps, [p.grad.clone() for p in model.parameters()], list(rows)

    want, want_grads, each = accumulate([])
    got, got_grads, once = accumulate([model])
    assert (each, once) == ([1, 2, 1, 2], [1, 2, 2])  # prefix passes: one per micro-batch -> one
    for a, b in zip(got, want, strict=True):
        assert_close_up_to_rounding(a, b, 2 * network_rtol(model))
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close_up_to_rounding(a, b, 4 * network_rtol(model))
    assert max(float(g.abs().max()) for g in want_grads) > 1e-3
    # the no-grad passes (old and reference log-probs) use it too, with the same values
    rows.clear()
    lp = batch_logprobs(model, batch, 1.0, micro=2)
    assert rows == [1, 2, 2]
    padded = torch.cat([torch.nn.functional.pad(x, (0, lp.shape[1] - x.shape[1])) for x in want])
    assert_close_up_to_rounding(lp, padded, 2 * network_rtol(model))


def test_critic_values_with_a_shared_prefix_equal_the_plain_pass():
    from esopt.train.pg.ppo import Critic

    model, tok = build_tiny_model(seed=4)
    critic = Critic.from_model(model)
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # a zero head would hide any error in the hidden states
    batch = _shared_prefix_batch(tok)
    with torch.no_grad():
        hidden = critic.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        want = critic.head(hidden[torch.arange(len(batch)), batch.prompt_last]).squeeze(-1)
        assert_close_up_to_rounding(critic(batch), want, network_rtol(model))
        with prefix_once([critic.backbone], batch):  # the backbone's prefix encoded once for every micro-batch
            parts = [critic(batch.select(idx)) for idx in micro_batches(len(batch), 3)]
        assert_close_up_to_rounding(torch.cat(parts), want, network_rtol(model))


def _batch_with(logp_old, adv, mask):
    b = collate([TurnSample([1], [2] * logp_old.shape[1]) for _ in range(logp_old.shape[0])], PAD)
    b.mask, b.old_logprobs, b.advantages = mask, logp_old, adv
    return b


def test_policy_loss_unclipped_clipped_and_kl():
    sec = PGSection(clip_eps=0.2, kl_beta=0.0)
    old = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    b = _batch_with(old, torch.tensor([1.0, -2.0]), mask)
    norm = minibatch_norm(b, torch.arange(2))
    loss, stats = policy_loss(old.clone(), b, sec, norm)  # ratio 1: loss = -mean token advantage
    assert loss.item() == pytest.approx(-(1 + 1 - 2) / 3)
    assert stats["clipfrac"] == (0.0, 3.0) and stats["approx_kl"][0] == pytest.approx(0.0)
    logp = torch.full((2, 2), math.log(1.5))  # ratio 1.5: A>0 clipped at 1.2; A<0 takes the worse 1.5
    loss, stats = policy_loss(logp, b, sec, norm)
    assert loss.item() == pytest.approx(-(1.2 + 1.2 - 2 * 1.5) / 3)
    assert stats["clipfrac"] == (3.0, 3.0)
    sec_kl = PGSection(kl_beta=0.5)
    b.ref_logprobs = torch.zeros(2, 2)
    loss_kl, stats = policy_loss(logp, b, sec_kl, norm)
    k3 = math.exp(-math.log(1.5)) + math.log(1.5) - 1
    assert stats["kl"][0] / stats["kl"][1] == pytest.approx(k3)
    assert loss_kl.item() == pytest.approx(loss.item() + 0.5 * k3)


def test_kl_k3_is_nonnegative_and_masked_padding_never_overflows():
    logp = torch.tensor([[-1.0, -5.0, 80.0]])
    ref = torch.tensor([[-1.0, -2.0, -90.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    kl = kl_k3(logp, ref, mask)
    assert kl[0, 0] == 0 and kl[0, 1] > 0 and kl[0, 2] == 0 and torch.isfinite(kl).all()
    for adv in (1.0, -1.0):  # a negative advantage takes the unclipped ratio: an overflow there would be inf
        b = _batch_with(torch.tensor([[0.0, 0.0, -100.0]]), torch.tensor([adv]), mask)
        loss, stats = policy_loss(logp, b, PGSection(), minibatch_norm(b, torch.arange(1)))
        assert torch.isfinite(loss) and all(math.isfinite(total) for total, _ in stats.values()), (adv, stats)


def test_aggregate_token_vs_seq_mean_and_accumulation_equals_full_batch():
    x = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    norm = Norm(tokens=3, seqs=2, samples=3)
    assert aggregate(x, mask, "token_mean", norm).item() == pytest.approx((1 + 3 + 5) / 3)
    assert aggregate(x, mask, "seq_mean", norm).item() == pytest.approx((2 + 5) / 2)  # empty row adds nothing
    for agg in ("token_mean", "seq_mean"):
        parts = sum(aggregate(x[i : i + 1], mask[i : i + 1], agg, norm) for i in range(3))
        assert parts.item() == pytest.approx(aggregate(x, mask, agg, norm).item())


def test_optimize_skips_a_step_with_nonfinite_gradient():
    w = torch.nn.Parameter(torch.ones(3))
    sec = PGSection(lr=0.1, minibatch_size=2, micro_batch_size=1)
    opt = make_optimizer([("policy", [w], sec.lr)], sec)
    b = collate([TurnSample([1], [2]), TurnSample([1], [3])], PAD)

    def bad_loss(part, norm):
        return (w * float("nan")).sum(), {}

    out = optimize(b, bad_loss, opt, sec, shuffle_generator(0, 0))
    assert out["skipped_steps"] == 1 and torch.equal(w.detach(), torch.ones(3))

    def good_loss(part, norm):
        return (w ** 2).sum() / norm.samples, {"x": (1.0, 1.0)}

    out = optimize(b, good_loss, opt, sec, shuffle_generator(0, 0))
    assert out["optimizer_steps"] == 1 and out["grad_norm"] == pytest.approx(2 * math.sqrt(3))
    assert (w.detach() < 1).all()


def test_shuffle_generator_is_deterministic_per_seed_and_step():
    a = torch.randperm(20, generator=shuffle_generator(1, 4))
    assert torch.equal(a, torch.randperm(20, generator=shuffle_generator(1, 4)))
    assert not torch.equal(a, torch.randperm(20, generator=shuffle_generator(1, 5)))


def test_checkpoint_holds_state_and_resume_skips_incomplete_ones(tmp_path):
    model, tok = build_tiny_model()
    policy = HFEngine(model, tok)
    rd = RunDir(tmp_path)
    w = torch.nn.Parameter(torch.ones(2))
    opt = make_optimizer([("policy", [w], 1e-3)], PGSection())
    w.grad = torch.ones(2)
    opt.step()
    state = {"optimizer": opt.state_dict()}
    rd.save_checkpoint(policy, 3, {"algo": "grpo"}, keep=2, extra_files={STATE_FILE: lambda p: torch.save(state, p)})
    path = rd.checkpoints / "step_000003"
    assert (path / STATE_FILE).exists() and (path / "model.safetensors").exists()
    assert not list(rd.checkpoints.glob(".*"))  # no temp dirs left behind
    state = torch.load(path / STATE_FILE, weights_only=True)
    assert state["optimizer"]["adamw"]["param_groups"][0]["name"] == "policy"
    # a checkpoint dir without the trainer state (e.g. written by another tool) is never resumed from
    broken = rd.checkpoints / "step_000005"
    broken.mkdir()
    (broken / "trainer_state.json").write_text('{"step": 5}')
    assert latest_pg_checkpoint(rd) == (3, path)


def _tiny_bf16_grpo_batch():
    model, tok = build_tiny_model(seed=3)
    model = model.to(torch.bfloat16)
    samples = [TurnSample([5, 6, 7], [8, 9], advantage=a) for a in (1.0, -1.0, 0.5, -0.5)]
    samples[1].token_ids = [10, 11]
    batch = collate(samples, tok.pad_token_id)
    batch.old_logprobs = batch_logprobs(model, batch, 1.0, 4)
    return model, batch


@pytest.mark.parametrize("lr", [1e-6, 1e-5])
def test_one_step_on_a_bf16_model_moves_weights_as_fp32_adamw_intends(lr):
    """The masters receive the loss's gradient (up to bf16 rounding) and take the update that torch's AdamW,
    run independently on fp32 copies of those same gradients, intends; the bf16 weights are the masters
    rounded. Plain bf16 AdamW at this lr leaves most weights unchanged (the bug this guards against).

    The reference steps from the gradients the masters saw, not from a second backward pass: `optimize`
    shuffles the minibatch, so its bf16 backward sums the tokens in another order, and where |g| is below
    AdamW's eps the first step lr * g / (|g| + eps) turns that rounding into a 10% change of the step (seen on
    an Intel Xeon with AMX)."""
    model, batch = _tiny_bf16_grpo_batch()
    sec = PGSection(lr=lr, minibatch_size=4, micro_batch_size=4, max_grad_norm=0)
    names = [n for n, _ in model.named_parameters()]
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    opt = make_optimizer([("policy", list(model.parameters()), lr)], sec)

    def loss_fn(part, norm):
        return policy_loss(token_logprobs(model, part, 1.0), part, sec, norm)

    # the loss's gradient from a plain backward pass over the unshuffled batch
    model.zero_grad()
    loss_fn(batch, minibatch_norm(batch, torch.arange(4)))[0].backward()
    plain_grads = {n: p.grad.float() for n, p in model.named_parameters()}
    model.zero_grad()

    seen: dict[str, torch.Tensor] = {}  # the gradients on the masters when AdamW steps
    adamw_step = opt.optimizer.step

    def spying_step(*args, **kwargs):
        seen.update({n: m.grad.detach().clone() for n, (_, m) in zip(names, opt.pairs, strict=True)})
        return adamw_step(*args, **kwargs)

    opt.optimizer.step = spying_step
    out = optimize(batch, loss_fn, opt, sec, shuffle_generator(0, 0))
    assert out["optimizer_steps"] == 1 and len(seen) == len(names)

    # the reference: the same gradients through a fresh fp32 AdamW
    ref = {n: torch.nn.Parameter(before[n].clone()) for n in names}
    for n in names:
        ref[n].grad = seen[n].clone()
    torch.optim.AdamW(list(ref.values()), lr=lr, weight_decay=0.0).step()

    # the gradient flows back through each layer's two blocks and the head, rounded to bf16 after each
    grad_rtol = rounded_chain_rtol(torch.bfloat16, depth=2 * model.config.num_hidden_layers + 1)
    masters = dict(zip(names, [m for _, m in opt.pairs], strict=True))
    moved = 0
    for n, p in model.named_parameters():
        assert masters[n].dtype == torch.float32 and p.dtype == torch.bfloat16
        assert_close_up_to_rounding(seen[n], plain_grads[n], grad_rtol)  # the loss's gradient reached the master
        # two AdamW runs on the same fp32 gradients: a unit or two of w + step
        want = ref[n].detach()
        assert ((masters[n].detach() - want).abs() <= ulps(want, 2)).all()
        assert torch.equal(p.detach(), masters[n].detach().to(torch.bfloat16))  # weights = masters rounded
        step = (masters[n].detach() - before[n]).abs()
        has_grad = seen[n].abs() > 0
        # first AdamW step: |update| = lr * |g| / (|g| + eps) ~ lr wherever the gradient is not tiny
        big = seen[n].abs() > 1e-5
        spacing = torch.finfo(torch.float32).eps * before[n].abs()[big]  # fp32 rounding of w + step
        assert ((step[big] - lr).abs() <= 0.02 * lr + spacing).all()
        moved += int((step[has_grad] > 0).sum())
    total = sum(int((seen[n].abs() > 0).sum()) for n in names)
    assert moved == total  # every weight with a gradient moved in the master copy


def test_bf16_masters_accumulate_steps_that_bf16_alone_would_drop():
    """Fifty steps of 1e-6 on weights near 1.0 (norm gains): bf16 cannot represent one step (its spacing at
    1.0 is 2^-7), so a bf16 optimizer never moves them; the masters move by 5e-5 and resume exactly."""
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    sec = PGSection(lr=1e-6)
    opt = make_optimizer([("policy", [w], sec.lr)], sec)
    for _ in range(50):
        w.grad = torch.full((4,), 1.0, dtype=torch.bfloat16)
        opt.collect_grads()
        opt.step()
    master = opt.pairs[0][1].detach()
    torch.testing.assert_close(master, torch.full((4,), 1 - 50e-6), rtol=0, atol=0.05 * 50e-6)  # fp32 ulp 6e-8
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    bf16_adamw = torch.optim.AdamW([plain], lr=sec.lr, weight_decay=0.0)
    for _ in range(50):
        plain.grad = torch.full((4,), 1.0, dtype=torch.bfloat16)
        bf16_adamw.step()
    assert torch.equal(plain.detach(), torch.ones(4, dtype=torch.bfloat16))  # what the masters fix
    state = opt.state_dict()
    again = make_optimizer([("policy", [torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))], sec.lr)], sec)
    again.load_state_dict(state)
    assert torch.equal(again.pairs[0][1].detach(), master)
    with pytest.raises(ValueError, match="fp32 master"):
        make_optimizer([("policy", [torch.nn.Parameter(torch.ones(4))], sec.lr)], sec).load_state_dict(state)
