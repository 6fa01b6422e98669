"""Token log-probs, the clipped surrogate, the k3 KL penalty and their minibatch-level aggregation.

Log-probs are taken under log_softmax(logits / T) with the run's sampling temperature T (1 when greedy);
top-k/top-p truncation is not applied (the usual convention of PPO/GRPO implementations).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from esopt.engines.prefix import CACHE_ARG
from esopt.train.config import PGSection
from esopt.train.pg.batch import TokenBatch

MIN_SHARED_PREFIX = 16  # below this, encoding the prefix once saves less than the extra pass costs


def common_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """How many leading tokens every row shares, at most `limit` and leaving each row a token of its own."""
    same = (input_ids == input_ids[:1]).all(0).long().cumprod(0)  # (L,) 1 while every row agrees
    return min(int(same.sum()), int(limit), int(attention_mask.sum(1).min()) - 1)


class PrefixKV:
    """The KV cache of one token prefix under one model, encoded once at batch 1 (with grad where grad is
    on); `cache(rows)` repeats it to every row. Detached (the default), calls attach to leaf copies and
    `backward()` sends the gradient they left there through the one encoding: summed over a minibatch's
    micro-batches, the gradient of encoding the prefix in each of them, exact up to float order."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, detach: bool = True) -> None:  # ids: (P,)
        self.model, self.ids = model, ids
        cache = DynamicCache(config=model.config)
        head = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        model(input_ids=ids[None], use_cache=True, **head, **{CACHE_ARG: cache})
        self.encoded = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in self.encoded] if detach else self.encoded

    def cache(self, rows: int) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        for i in range(len(self.leaves) // 2):
            cache.update(self.leaves[2 * i], self.leaves[2 * i + 1], i)
        cache.batch_repeat_interleave(rows)
        return cache

    def backward(self) -> None:
        pairs = [(t, leaf.grad) for t, leaf in zip(self.encoded, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


# inside `prefix_once`: id(model) -> the prefix it encoded for the minibatch
_ENCODED: ContextVar[dict[int, PrefixKV] | None] = ContextVar("encoded_prefixes", default=None)


@contextlib.contextmanager
def prefix_once(models: Sequence[torch.nn.Module], batch: TokenBatch) -> Iterator[None]:
    """Inside the block, `shared_prefix_forward` over any of `models` reuses one encoding of the prompt prefix
    every row of `batch` shares, and on a clean exit the gradient its calls accumulated there goes through
    that encoding (`PrefixKV`). Wrap a minibatch's micro-batches, forward and backward, in it: the few-shot
    prefix is then encoded and back-propagated once per minibatch instead of once per micro-batch (at
    Sudoku H*=8 it is ~1440 of the ~3100 tokens of a 16-row micro-batch)."""
    shared = common_prefix(batch.input_ids, batch.attention_mask, int(batch.prompt_last.min())) if len(batch) else 0
    if shared < MIN_SHARED_PREFIX or not models:
        yield
        return
    encoded = {id(m): PrefixKV(m, batch.input_ids[0, :shared]) for m in models if hasattr(m, "config")}
    token = _ENCODED.set({**(_ENCODED.get() or {}), **encoded})
    try:
        yield
    finally:
        _ENCODED.reset(token)
    for prefix in encoded.values():
        prefix.backward()


def shared_prefix_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          limit: int, **kwargs) -> tuple[object, int]:
    """`model` over right-padded rows, with the tokens every row starts with (at most `limit` of them) encoded
    once at batch 1 and their KV repeated to every row; returns (the output for positions P.., P).

    Exact up to float summation order, gradients included: autograd flows through the repeated cache into
    the one prefix pass. Agent prompts share their system prompt and worked examples (~80% of a few-shot
    Sudoku prompt), so a policy-gradient step encodes, and back-propagates through, that prefix once per
    micro-batch instead of once per sample, or once per minibatch inside `prefix_once`. P = 0 (one plain
    pass) when the rows share fewer tokens."""
    n, width = input_ids.shape
    shared = common_prefix(input_ids, attention_mask, limit)
    prefix = (_ENCODED.get() or {}).get(id(model))  # one encoded for the whole minibatch (`prefix_once`)
    if prefix is None or len(prefix.ids) > shared or not bool((input_ids[:, : len(prefix.ids)] == prefix.ids).all()):
        if n < 2 or shared < MIN_SHARED_PREFIX or not hasattr(model, "config"):
            return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs), 0
        prefix = PrefixKV(model, input_ids[0, :shared], detach=False)  # this call's own; autograd flows through
    shared, cache = len(prefix.ids), prefix.cache(n)
    positions = torch.arange(shared, width, device=input_ids.device).expand(n, -1)
    out = model(input_ids=input_ids[:, shared:], attention_mask=attention_mask, position_ids=positions,
                use_cache=True, **kwargs, **{CACHE_ARG: cache})
    return out, shared


def token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """(N, L-1) log p(input_ids[:, t+1] | prefix) under log_softmax(logits / temperature), in fp32.

    Only positions from the shortest prompt on are scored (`logits_to_keep`): the (N, L, V) logits of
    long prompts are never built. Positions before that window hold 0 (they are masked anyway). The
    prompts' shared prefix is encoded once (`shared_prefix_forward`).
    """
    width = batch.input_ids.shape[1]
    first = int(batch.prompt_last.min()) if len(batch) else 0
    keep = width - first
    try:
        out, _ = shared_prefix_forward(model, batch.input_ids, batch.attention_mask, first, logits_to_keep=keep)
        logits = out.logits  # (N, keep, V)
    except TypeError:  # a model without `logits_to_keep` or a KV cache
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, width - keep:]
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logp.gather(-1, batch.input_ids[:, width - keep + 1:, None]).squeeze(-1)  # (N, keep-1)
    return torch.nn.functional.pad(picked, (width - keep, 0))


def micro_batches(n: int, size: int) -> Iterable[torch.Tensor]:
    return torch.arange(n).split(size)


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float, micro: int) -> torch.Tensor:
    """No-grad token log-probs of a whole batch, micro-batch by micro-batch; zero outside each row."""
    out = torch.zeros_like(batch.mask)
    with prefix_once([model], batch):
        for idx in micro_batches(len(batch), micro):
            idx = idx.to(out.device)
            part = batch.select(idx)
            out[idx, : part.mask.shape[1]] = token_logprobs(model, part, temperature) * part.mask
    return out


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


@dataclass
class Norm:
    """Minibatch-level denominators, so gradient accumulation over micro-batches equals one big batch."""

    tokens: float  # generated tokens in the minibatch
    seqs: float  # samples with at least one generated token
    samples: float  # all samples


def minibatch_norm(batch: TokenBatch, idx: torch.Tensor) -> Norm:
    m = batch.mask[idx.to(batch.mask.device)]
    return Norm(tokens=max(float(m.sum()), 1.0), seqs=max(float((m.sum(1) > 0).sum()), 1.0), samples=max(len(idx), 1))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str, norm: Norm) -> torch.Tensor:
    """This micro-batch's share of the minibatch mean (token_mean or seq_mean); masked-out tokens add 0."""
    if agg == "seq_mean":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / norm.seqs
    return masked_sum(per_token, mask) / norm.tokens


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref - logp (>= 0); 0 where masked."""
    d = (ref_logp - logp) * mask
    return torch.exp(d) - d - 1


def policy_loss(logp: torch.Tensor, batch: TokenBatch, section: PGSection, norm: Norm
                ) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
    """Clipped surrogate + kl_beta * k3 KL, aggregated over generated tokens; stats as (sum, count). Without
    `old_logprobs` the samples are on-policy (the single step at the rollout's weights): ratio 1, same gradient."""
    mask = batch.mask
    old = batch.old_logprobs if batch.old_logprobs is not None else logp.detach()  # None: on-policy, ratio 1
    logratio = (logp - old) * mask  # masked before exp: padding never overflows
    ratio = torch.exp(logratio)
    adv = batch.advantages[:, None]
    eps = section.clip_eps
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    tokens = float(mask.sum())
    with torch.no_grad():
        stats = {
            "pg_loss": (float(aggregate(per_token, mask, section.loss_agg, norm)), len(batch) / norm.samples),
            "clipfrac": (float(masked_sum(((ratio - 1).abs() > eps).float(), mask)), tokens),
            "approx_kl": (float(masked_sum((ratio - 1) - logratio, mask)), tokens),
        }
    if batch.ref_logprobs is not None and section.kl_beta > 0:
        kl = kl_k3(logp, batch.ref_logprobs, mask)
        per_token = per_token + section.kl_beta * kl
        stats["kl"] = (float(masked_sum(kl.detach(), mask)), tokens)
    return aggregate(per_token, mask, section.loss_agg, norm), stats
