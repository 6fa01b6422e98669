"""Tiny policies the engine and serve tests share."""

from __future__ import annotations

import time

import torch


def distinct_tiny_policy():
    """The tiny Llama with its weights redrawn at a larger scale, so that its greedy replies depend on the
    prompt (the stock init answers ">>>>" to everything, which could not show a reply routed to the wrong
    row)."""
    from esopt.models import load_policy

    policy = load_policy("tiny")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15, generator=g)
    policy.weights_changed()
    return policy


class SlowForward:
    """A forward hook on the policy's model: every forward sleeps `delay` seconds and counts itself, and EOS is
    never chosen, so a request runs to its max_tokens at a known pace."""

    def __init__(self, policy, delay: float = 0.0):
        self.delay, self.calls, self.eos = delay, 0, policy.tokenizer.eos_token_id
        self.handle = policy.model.register_forward_hook(self)

    def __call__(self, module, args, output):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        output.logits[..., self.eos] = -1e9
        return output
