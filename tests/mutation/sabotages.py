"""The sabotages: (module, file, exact old text, new text, the tests that must catch it).

Each `old` must occur exactly once in its file (the runner refuses a sabotage that no longer applies, so an
edit of the code under test shows up here). Tests are pytest node ids or files; keep them fast."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sabotage:
    module: str  # the group it is reported under
    file: str
    old: str
    new: str
    why: str
    tests: tuple[str, ...] = field(default=())


ES = "tests/es/test_es_core.py"
PG = ("tests/train/test_pg.py", "tests/train/test_grpo.py::test_group_zscore_by_hand",
      "tests/train/test_grpo.py::test_advantage_broadcast_to_every_turn_and_mask_exactly_generated",
      "tests/train/test_grpo.py::test_one_update_changes_every_weight_and_lowers_its_loss",
      "tests/train/test_ppo.py::test_gae_by_hand",
      "tests/train/test_ppo.py::test_one_update_changes_policy_and_critic_and_lowers_its_loss")
GATE = ("tests/train/test_coevolution.py",)
BATCH = ("tests/serve/test_serve.py::test_requests_waiting_together_share_one_call_and_each_gets_its_own_rows",
         "tests/serve/test_serve.py::test_a_call_never_exceeds_max_batch_and_seeded_sampled_requests_run_alone",
         "tests/serve/test_serve.py::test_concurrent_requests_share_batched_generate_calls",
         "tests/serve/test_serve.py::test_64_concurrent_streaming_clients_each_get_their_own_answer",
         "tests/serve/test_serve.py::test_stop_strings_cut_the_reply",
         "tests/serve/test_serve.py::test_n_sampled_choices_and_seed",
         "tests/serve/test_serve.py::test_a_seeded_request_is_not_changed_by_concurrent_ones")
SANDBOX = ("tests/sandbox/test_sandbox.py",)
BATCHED = "tests/es/test_batched.py"

SHAPING, PERTURB, LEDGER = "esopt/es/shaping.py", "esopt/es/perturbation.py", "esopt/es/ledger.py"
SKILLS, COEVO, BATCHER = "esopt/prompt/skills.py", "esopt/train/coevolution.py", "esopt/serve/batcher.py"
LOSS, GRPO, PPO = "esopt/train/pg/loss.py", "esopt/train/pg/grpo.py", "esopt/train/pg/ppo.py"
BWRAP, SANDBOX_API = "esopt/sandbox/bwrap.py", "esopt/sandbox/__init__.py"

SABOTAGES: list[Sabotage] = [
    # --- es/shaping
    Sabotage("es/shaping", SHAPING, "return (r - r.mean()) / (std + eps)", "return (r.mean() - r) / (std + eps)",
             "z-score sign flipped", (ES,)),
    Sabotage("es/shaping", SHAPING, "    if std <= eps:\n        return _zero_update(r.size)",
             "    if std < 0:\n        return _zero_update(r.size)", "zero-variance guard of zscore dropped", (ES,)),
    Sabotage("es/shaping", SHAPING, "avg_rank = first_rank + (counts - 1) / 2.0", "avg_rank = first_rank",
             "tied rewards get the lowest rank, not the average", (ES,)),
    Sabotage("es/shaping", SHAPING, "return avg_rank[inverse] / (r.size - 1) - 0.5",
             "return avg_rank[inverse] / r.size - 0.5", "centered ranks not spread over [-0.5, 0.5]", (ES,)),
    Sabotage("es/shaping", SHAPING, "    if bad.size:\n", "    if False:\n", "non-finite rewards accepted", (ES,)),
    Sabotage("es/shaping", SHAPING, "z = np.where(std > eps, (s - s.mean(axis=0))",
             "z = np.where(std > eps, (s - s.mean())", "per-task baseline replaced by the global mean",
             ("tests/train/test_es_options.py",)),
    Sabotage("es/shaping", SHAPING, "return float(np.mean(r[0::2] != r[1::2]))",
             "return float(np.mean(r[0::2] == r[1::2]))", "pair disagreement inverted",
             ("tests/train/test_es_options.py",)),
    # --- es/perturbation
    Sabotage("es/perturbation", PERTURB, "            p.data.view(-1).copy_(m)\n", "            pass\n",
             "exact restore skipped", (ES,)),
    Sabotage("es/perturbation", PERTURB, "self._add_noise(k, flat, s, e, eps, scale)\n",
             "self._add_noise(k, flat, s, e, eps, -scale)\n", "perturbation sign flipped", (ES,)),
    Sabotage("es/perturbation", PERTURB, "scaled = {seed: c * step for seed, c in coefs.items()}",
             "scaled = {seed: -c * step for seed, c in coefs.items()}", "update sign flipped", (ES,)),
    Sabotage("es/perturbation", PERTURB, "coefs.get(int(seed), 0.0) + float(sign) * float(w)",
             "coefs.get(int(seed), 0.0) + float(w)", "antithetic sign ignored in the update", (ES,)),
    Sabotage("es/perturbation", PERTURB, 'step = record["alpha"] / record["population_size"]',
             'step = record["alpha"]', "update not divided by the population size", (ES,)),
    Sabotage("es/perturbation", PERTURB, "if decay:\n                    value.mul_(1.0 - decay)",
             "if False:\n                    value.mul_(1.0 - decay)",
             "weight decay ignored", (ES, "tests/train/test_es_options.py")),
    Sabotage("es/perturbation", PERTURB, "for s, e, eps in self.chunks(seed, name, done, p.device):",
             "for s, e, eps in self.chunks(seed, name, 0, p.device):",
             "a perturbation interrupted mid-tensor is not undone", (ES, "tests/es/test_noise_kinds.py")),
    Sabotage("es/perturbation", PERTURB, "                flat.copy_(self.masters[k].to(p.device))\n",
             "                pass\n",
             "the update reaches the fp32 master but not the weights", (ES,)),
    Sabotage("es/perturbation", PERTURB, "            for _ in self.perturb(seed, -scale, upto):",
             "            for _ in self.perturb(seed, scale, upto):", "subtract-mode restore adds the noise again",
             (ES,)),
    Sabotage("es/perturbation", "esopt/es/strategy.py", "build_perturbation(params, spec, self.config.restore,",
             'build_perturbation(params, spec, "subtract",', "exact restore silently replaced by subtraction",
             (ES,)),
    # --- es/ledger
    Sabotage("es/ledger", LEDGER, "            f.write(line)\n", "            f.write(line.rstrip())\n",
             "ledger lines written without their newline", (ES,)),
    Sabotage("es/ledger", LEDGER, "            if i == len(lines) - 1:\n", "            if True:\n",
             "a corrupt line in the middle is skipped as if torn", (ES,)),
    Sabotage("es/ledger", LEDGER, '        if r.get("generation") != i:\n', "        if False:\n",
             "generations out of order accepted", (ES,)),
    Sabotage("es/ledger", LEDGER, "    records = records[:upto]\n", "    records = records\n",
             "replay ignores `upto`", (ES, "tests/es/test_replay_fixture.py")),
    Sabotage("es/ledger", LEDGER, 'if r["noise"] != first["noise"] or r["scope"] != first["scope"]:',
             "if False:", "a ledger that changes its noise spec mid-run is replayed", (ES,)),
    Sabotage("es/ledger", LEDGER, "keep = read_history(self.path)[:generations]",
             "keep = read_history(self.path)[: max(generations - 1, 0)]", "truncate drops a complete line",
             ("tests/train/test_train_es.py::test_ctrl_c_checkpoints_and_says_there_was_no_final_eval",
              "tests/train/test_es_options.py", ES)),
    # --- the co-evolution gate
    Sabotage("gate", SKILLS, "return new > now + margin, now, new", "return new > now, now, new",
             "the gate ignores its margin", GATE),
    Sabotage("gate", SKILLS, "return new > now + margin, now, new", "return new >= now + margin, now, new",
             "a tie (at the margin) is accepted", GATE),
    Sabotage("gate", SKILLS, "return new > now + margin, now, new", "return new > now + margin, new, now",
             "the two scores reported swapped", GATE),
    Sabotage("gate", COEVO, "        spec = self.spec.replace(system_prompt=system_prompt)\n",
             "        spec = self.spec\n", "the gate scores the current prompt for both", GATE),
    Sabotage("gate", COEVO, "tasks = train_task_seeds(c.seed, 10**6 + generation, c.prompt.gate_tasks)",
             "tasks = train_task_seeds(c.seed, generation, c.prompt.gate_tasks)",
             "the gate scores on the generation's own training tasks", GATE),
    Sabotage("gate", COEVO, "            self.program = candidate\n", "            pass\n",
             "an accepted prompt is not adopted", GATE),
    # --- the serve batcher
    Sabotage("serve/batcher", BATCHER, "for c in out[at: at + j.rows]]", "for c in out[: j.rows]]",
             "every request gets the first request's rows", BATCH),
    Sabotage("serve/batcher", BATCHER, "                at += j.rows\n", "                at += 1\n",
             "rows of a request with n > 1 shifted onto the next request", BATCH),
    Sabotage("serve/batcher", BATCHER, "        if len(ids) > sampling.max_new_tokens:\n", "        if False:\n",
             "a shared call's rows not cut to their own max_tokens", BATCH),
    Sabotage("serve/batcher", BATCHER, "max(j.sampling.max_new_tokens for j in jobs)",
             "min(j.sampling.max_new_tokens for j in jobs)", "a shared call runs to the shortest request", BATCH),
    Sabotage("serve/batcher", BATCHER, "if call and sum(j.rows for j in call) + job.rows > self.max_batch:",
             "if False:", "max_batch ignored", BATCH),
    Sabotage("serve/batcher", BATCHER, 'return ("seeded", id(self))', 'return ("seeded",)',
             "seeded requests share a call (their rows then depend on the neighbours)", BATCH),
    Sabotage("serve/batcher", BATCHER, "        if sampling.stop:\n", "        if False:\n",
             "stop strings of a shared call not applied", BATCH),
    # --- GRPO / PPO losses
    Sabotage("pg/losses", LOSS, "per_token = -torch.minimum(ratio * adv,", "per_token = torch.minimum(ratio * adv,",
             "surrogate sign flipped (gradient ascent on the loss)", PG),
    Sabotage("pg/losses", LOSS, "per_token = -torch.minimum(ratio * adv,", "per_token = -torch.maximum(ratio * adv,",
             "pessimistic min replaced by max", PG),
    Sabotage("pg/losses", LOSS, "torch.clamp(ratio, 1 - eps, 1 + eps) * adv)", "ratio * adv)",
             "ratio clipping ignored", PG),
    Sabotage("pg/losses", LOSS, "d = (ref_logp - logp) * mask", "d = (logp - ref_logp) * mask",
             "k3 KL estimator of the wrong direction", PG),
    Sabotage("pg/losses", LOSS, "per_token = per_token + section.kl_beta * kl", "per_token = per_token",
             "KL penalty ignored", PG),
    Sabotage("pg/losses", LOSS, "return masked_sum(per_token, mask) / norm.tokens",
             "return masked_sum(per_token, mask) / max(float(mask.sum()), 1.0)",
             "token mean over the micro-batch, not the minibatch (accumulation breaks)", PG),
    Sabotage("pg/losses", LOSS, "return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / norm.seqs",
             "return (per_token * mask).sum() / norm.seqs", "seq_mean does not average within a sequence", PG),
    Sabotage("pg/losses", LOSS, "logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)",
             "logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)", "sampling temperature ignored", PG),
    Sabotage("pg/losses", LOSS, "logratio = (logp - old) * mask",
             "logratio = logp - old", "padding enters the ratio unmasked", PG),
    Sabotage("pg/losses", LOSS, "    for prefix in encoded.values():\n        prefix.backward()\n", "",
             "prefix_once drops the gradient through the shared prefix", PG),
    Sabotage("pg/losses", LOSS, "prefix.cache(n)", "PrefixKV(model, prefix.ids, detach=False).cache(n)",
             "prefix_once re-encodes the prefix in every micro-batch", PG),
    Sabotage("pg/losses", GRPO, "adv = np.where(std > eps, (g - mean) / (std + eps), 0.0)",
             "adv = np.where(std > eps, (mean - g) / (std + eps), 0.0)", "GRPO advantage sign flipped", PG),
    Sabotage("pg/losses", GRPO, "mean, std = g.mean(1, keepdims=True), g.std(1, keepdims=True)",
             "mean, std = g.mean(), g.std()", "GRPO normalises over the batch, not the group", PG),
    Sabotage("pg/losses", PPO, "running = delta + gamma * lam * running", "running = delta + gamma * running",
             "GAE ignores lambda", PG),
    Sabotage("pg/losses", PPO, "adv[t], next_value = running, values[t]", "adv[t], next_value = running, 0.0",
             "GAE bootstraps from 0 instead of the next value", PG),
    # --- the sandbox
    Sabotage("sandbox", BWRAP, '"--unshare-pid", "--unshare-net", ', '"--unshare-pid", ',
             "the network namespace dropped", SANDBOX),
    Sabotage("sandbox", BWRAP, '"--remount-ro", "/dev", "--remount-ro", "/", "--chdir"',
             '"--remount-ro", "/dev", "--chdir"', "the root left writable", SANDBOX),
    Sabotage("sandbox", BWRAP, "resource.setrlimit(resource.RLIMIT_AS, (mem, mem))", "pass",
             "no memory limit", SANDBOX),
    Sabotage("sandbox", BWRAP, "resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))", "pass",
             "no process limit", SANDBOX),
    Sabotage("sandbox", BWRAP, '"--die-with-parent", "--new-session", "--clearenv",',
             '"--die-with-parent", "--new-session",', "the parent's environment leaks in", SANDBOX),
    Sabotage("sandbox", BWRAP, "timed_out = wait_then_kill_group(proc, timeout)",
             "timed_out = wait_then_kill_group(proc, 30 * timeout)", "the wall-clock limit not enforced", SANDBOX),
    Sabotage("sandbox", SANDBOX_API, "        if first:\n", "        if False:\n",
             "the weak backend chosen without a warning", SANDBOX),
    # --- es/batched (full-rank) and the parallel sweep
    Sabotage("es/batched", "esopt/es/batched.py", "offset = torch.arange(g, device=x.device).view(g, 1) * vocab",
             "offset = torch.arange(g, device=x.device).view(g, 1) * 0",
             "member-ordered rows all read member 0's embedding table", (BATCHED,)),
    Sabotage("es/batched", "esopt/es/batched.py", "y = _with_weight(module, x[idx], w[m])",
             "y = _with_weight(module, x[idx], w[0])", "scattered rows all run on member 0's weights", (BATCHED,)),
    Sabotage("es/batched", PERTURB, "out[i, s:e].copy_(torch.add(base, eps, alpha=scale))",
             "out[i, s:e].copy_(torch.add(base, eps, alpha=abs(scale)))",
             "a batched member's copy loses its antithetic sign", (BATCHED,)),
    Sabotage("experiments/sweep", "esopt/experiments/sweep.py", "while pending and len(running) < jobs:",
             "while pending and len(running) <= jobs:", "one run more than --jobs at once",
             ("tests/experiments/test_sweep.py",)),
    Sabotage("experiments/variance", "esopt/experiments/variance.py", 'info, start, before = saved["info"], ',
             'info, start, before = info, ', "a resumed variance run forgets the scores of its saved repetitions",
             ("tests/experiments/test_bench.py::test_variance_smoke_gives_finite_variances_and_slopes",)),
]
