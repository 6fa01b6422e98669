"""Batched decoding that computes the KV cache of the prompts' shared prefix once.

In an agent rollout every prompt of a batch starts with the same system prompt and worked examples
(79% of a few-shot Sudoku prompt for SmolLM2). Plain batched `generate` re-encodes that prefix for
every row. Here the prefix is encoded once at batch 1 and only the per-episode suffixes are encoded
(left-padded *between* prefix and suffix, masked out, with position ids that continue the prefix), then a
plain decode loop samples with the same rules as `transformers` (temperature, then top-k, then top-p; greedy
when temperature is 0). With the CPU attention of `attention.py` the rows read the one prefix cache
(`SharedPrefix`) and hold only their own positions; otherwise each row starts with a copy of it.

A multi-turn rollout calls this once per turn with the same prefix. `PrefixKV` keeps the prefix's cache
from one call to the next; the caller must drop it whenever the weights change (`HFEngine` keeps it for
one rollout only, during which the weights are fixed). Batched ES keeps one prefix per member. `RowKV` keeps
each row's own positions too: where a conversation grows turn by turn (the last prompt, its reply, the env's
answer), a row encodes only what is new since its last call, not its whole history again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

import numpy as np
import torch
from transformers import DynamicCache, LlamaForCausalLM
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from esopt.engines.attention import NAME as ATTENTION
from esopt.engines.attention import SharedPrefix
from esopt.engines.base import SamplingParams

# transformers 5.x renamed the forward's `past_key_values` to `cache`
CACHE_ARG = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


class PrefixKV:
    """The KV cache of one token prefix, per weight group, kept across generate calls (one entry)."""

    def __init__(self) -> None:
        self.reused_tokens = 0  # prefix tokens (per group) taken from the store instead of encoded: a statistic
        self.clear()

    def clear(self) -> None:
        self.ids: tuple[int, ...] = ()
        self.groups: dict[int, int] = {}  # group -> its row in the stored tensors
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def match(self, prefix: Sequence[int], groups: Sequence[int]) -> tuple[int, list[int]]:
        """(tokens of `prefix` already cached, the stored row of every group); 0 tokens on a miss."""
        if not self.layers or any(g not in self.groups for g in groups):
            return 0, []
        n = 0
        for a, b in zip(self.ids, prefix):
            if a != b:
                break
            n += 1
        return n, [self.groups[g] for g in groups]

    def keep(self, prefix: Sequence[int], groups: Sequence[int], layers: list[tuple[torch.Tensor, torch.Tensor]]
             ) -> None:
        """Hold `layers` ((groups, kv heads, len(prefix), dim) per layer) as the cache of `prefix` per group."""
        self.ids = tuple(prefix)
        self.groups = {g: i for i, g in enumerate(groups)}
        self.layers = layers


class RowKV:
    """Each row's own KV (its positions after the shared prefix), kept from one generate call to the next while
    the weights are fixed; a new row reuses the longest stored run of its own tokens (same group, same prefix)."""

    KEY = 8  # own tokens that index an entry (an entry is found by its first tokens, then matched in full)

    def __init__(self) -> None:
        self.reused_tokens = 0  # own tokens taken from the store instead of encoded: a statistic
        self.clear()

    def clear(self) -> None:
        self.prefix: tuple[int, ...] = ()
        self.entries: dict[tuple, list[RowEntry]] = {}

    def match(self, group: int, ids: Sequence[int], prefix_len: int) -> tuple[int, RowEntry | None]:
        """(own tokens of `ids` whose KV is stored, leaving at least one to encode; the entry holding them)."""
        if len(self.prefix) != prefix_len or tuple(ids[:prefix_len]) != self.prefix:
            return 0, None
        own = ids[prefix_len:]
        best: tuple[int, RowEntry | None] = (0, None)
        for entry in self.entries.get((group, tuple(own[:self.KEY])), []):
            n = common_length(entry.ids, own[:-1])
            if n > best[0]:
                best = (n, entry)
        return best

    def replace(self, prefix: Sequence[int], used: Sequence[RowEntry], new: Sequence[RowEntry]) -> None:
        """Drop the entries `used` (their rows continue in `new`) and add `new` under `prefix`. Entries of rows
        that do not come back (ended episodes, or rows of another `max_batch_size` chunk not yet called) stay
        until the caller clears the store: the engine does at the end of each rollout."""
        if tuple(prefix) != self.prefix:
            self.entries, self.prefix = {}, tuple(prefix)
        gone = {id(e) for e in used}
        for key in {(e.group, tuple(e.ids[:self.KEY])) for e in used}:
            self.entries[key] = [e for e in self.entries.get(key, []) if id(e) not in gone]
        for e in new:
            self.entries.setdefault((e.group, tuple(e.ids[:self.KEY])), []).append(e)


class RowEntry(NamedTuple):
    group: int
    ids: tuple[int, ...]  # the row's own tokens (after the prefix) whose KV is stored
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # (kv heads, len(ids), dim) keys and values per layer


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common start of two token sequences."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def shared_prefix_length(ids: Sequence[Sequence[int]]) -> int:
    """Length of the longest common token prefix, leaving at least one suffix token in every row."""
    if not ids:
        return 0
    shortest = min(len(x) for x in ids)
    first = ids[0]
    n = 0
    while n < shortest - 1 and all(x[n] == first[n] for x in ids):
        n += 1
    return n


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p (nucleus) in the order `transformers` applies them; (B, V) float."""
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= 1 - sampling.top_p
        remove_sorted[:, -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def next_tokens(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """(B,) next token ids from (B, V) raw logits."""
    if sampling.greedy:
        return logits.argmax(-1)
    probs = filter_logits(logits.float(), sampling).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.inference_mode()
def generate_with_shared_prefix(
    model: torch.nn.Module,
    ids: Sequence[Sequence[int]],
    prefix_len: int,
    sampling: SamplingParams,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    seed: int | None = None,
    return_logprobs: bool = False,
    groups: Sequence[int] | None = None,
    set_rows: Callable[[list[int]], None] | None = None,
    store: PrefixKV | None = None,
    min_reuse: int = 1,
    rows_store: RowKV | None = None,
    on_step: Callable[[list[int]], Sequence[bool] | None] | None = None,
) -> tuple[list[list[int]], list[list[float]] | None]:
    """Generated ids per row (cut after the first EOS) and, if asked, their log-probabilities under
    softmax(raw logits / temperature) (temperature 1 when greedy).

    `groups` (one id per row): rows of one group share weights, rows of different groups do not (batched ES
    members). The prefix is then encoded once per group, not once for all, and `set_rows(ids)` is told the
    group of every row of each forward pass: first the distinct groups (the prefix pass), then the rows.

    With a `store`, a prefix cached by an earlier call (same weights: the caller's duty) is reused, at least
    `min_reuse` tokens of it; only the rest of this call's prefix is encoded. With a `rows_store` (and the CPU
    attention that reads a shared prefix), each row also reuses the KV of its own tokens that an earlier call
    encoded or generated under the same prefix, and leaves its own positions there for the next call.
    `on_step`: told each step's tokens, may end rows (see `esopt.engines.base.Engine.generate`)."""
    dev = next(model.parameters()).device
    generator = None
    if seed is not None and not sampling.greedy:
        generator = torch.Generator(device=dev)
        generator.manual_seed(seed)
    plain = _plain_layers(model)
    shared_attention = plain and getattr(model.config, "_attn_implementation", None) == ATTENTION
    rows_store = rows_store if shared_attention else None  # rows' own KV lives beside a shared prefix only
    row_groups = list(groups) if groups is not None else [0] * len(ids)
    if rows_store is not None and store is not None and 0 < len(store.ids) < prefix_len and \
            all(tuple(x[:len(store.ids)]) == store.ids for x in ids):
        prefix_len = len(store.ids)  # keep the rollout's prefix: the rows' own KV was stored after it
    reuse = [rows_store.match(g, x, prefix_len) if rows_store is not None else (0, None)
             for g, x in zip(row_groups, ids)]
    cached = max(n for n, _ in reuse)  # the rows' stored own positions fill the cache's first slots
    starts = [prefix_len + n for n, _ in reuse]
    input_ids, mask, positions = _suffix_batch(ids, starts, prefix_len, cached, pad_token_id, dev)
    layers, entries = _prefix_layers(model, ids, prefix_len, row_groups, set_rows, store if plain else None, min_reuse)
    if groups is not None and set_rows is not None:
        set_rows(row_groups)
    own = cached + input_ids.shape[1] + sampling.max_new_tokens  # positions each row adds to the prefix
    shared = None
    if shared_attention:
        shared = SharedPrefix(layers, _runs(entries))
        own_layers = [SuffixLayer(prefix_len, own) for _ in layers]
        cache = Cache(layers=cast(list, own_layers))
        if cached:
            _fill_own(own_layers, layers, reuse, cached)
    else:  # each row starts with a copy of its prefix
        cache = Cache(layers=[_static_rows(k, v, entries, prefix_len + own) for k, v in layers])
    del layers
    tokens, logprobs = _decode(model, cache, input_ids, mask, positions, prefix_len + cached, sampling,
                               eos_token_ids, pad_token_id, generator, return_logprobs, shared, on_step)
    if rows_store is not None:
        rows_store.reused_tokens += sum(n for n, _ in reuse)
        kept = _own_entries(own_layers, ids, starts, prefix_len, cached, input_ids.shape[1], tokens, row_groups)
        rows_store.replace(ids[0][:prefix_len], [e for _, e in reuse if e is not None], kept)
    return tokens, logprobs


def _fill_own(own_layers: list[SuffixLayer], prefix: list[tuple[torch.Tensor, torch.Tensor]],
              reuse: Sequence[tuple[int, RowEntry | None]], cached: int) -> None:
    """Write each row's stored own KV (n of its positions) into slots [cached - n, cached) of every layer."""
    rows = len(reuse)
    for layer_idx, (layer, (k, v)) in enumerate(zip(own_layers, prefix)):
        layer.lazy_initialization(k[:1, :, :1].expand(rows, -1, -1, -1), v[:1, :, :1].expand(rows, -1, -1, -1))
        keys, values = cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)
        for r, (n, entry) in enumerate(reuse):
            if entry is not None:
                ek, ev = entry.layers[layer_idx]
                keys[r, :, cached - n:cached] = ek[:, :n]
                values[r, :, cached - n:cached] = ev[:, :n]
        layer.cumulative_length.fill_(cached)


def _own_entries(own_layers: list[SuffixLayer], ids: Sequence[Sequence[int]], starts: Sequence[int],
                 prefix_len: int, cached: int, width: int, tokens: Sequence[Sequence[int]],
                 row_groups: Sequence[int]) -> list[RowEntry]:
    """Each row's own positions after a decode, packed: its cached slots, its encoded tokens, then its generated
    tokens but the last (whose KV no step computed)."""
    out, dev = [], cast(torch.Tensor, own_layers[0].keys).device
    for r, (x, start, gen) in enumerate(zip(ids, starts, tokens)):
        slots = torch.cat([torch.arange(cached - (start - prefix_len), cached),
                           torch.arange(cached + width - (len(x) - start), cached + width + len(gen) - 1)]).to(dev)
        layers = [(cast(torch.Tensor, layer.keys)[r].index_select(1, slots),
                   cast(torch.Tensor, layer.values)[r].index_select(1, slots)) for layer in own_layers]
        out.append(RowEntry(row_groups[r], (*x[prefix_len:], *gen[:-1]), layers))
    return out


# Tokens per forward pass when the prefix is encoded for many weight groups (batched ES members): one pass
# over all G x P tokens allocates activations of tens of MB that glibc keeps after the pass (at G=32, P=200:
# RSS 1.3 GB above the model for a 0.3 GB cache). Chunks of groups, copied into one preallocated cache, cut
# the peak of a SmolLM2 generation by 0.5 GB at the same FLOPs.
PREFIX_CHUNK_TOKENS = 1024


def _prefix_layers(model: torch.nn.Module, ids: Sequence[Sequence[int]], prefix_len: int,
                   row_groups: Sequence[int], set_rows: Callable[[list[int]], None] | None,
                   store: PrefixKV | None, min_reuse: int
                   ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
    """The KV of the shared prefix per layer, (entries, kv heads, P, dim), once per group (taken from `store`
    where it holds it, and kept there), and each row's entry."""
    dev = next(model.parameters()).device
    distinct = sorted(set(row_groups))
    reused, rows = store.match(ids[0][:prefix_len], distinct) if store is not None else (0, [])
    if reused < min_reuse:
        reused = 0
    if reused and store is not None:
        store.reused_tokens += reused
    if store is not None and reused == prefix_len == len(store.ids):  # all of it stored: no copy
        return store.layers, [store.groups[g] for g in row_groups]
    todo = list(ids[0][reused:prefix_len])
    per_pass = max(1, PREFIX_CHUNK_TOKENS // max(1, len(todo)))
    layers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (groups, kv heads, tokens, dim) per layer, filled by chunks
    for start in range(0, len(distinct), per_pass):
        chunk = distinct[start:start + per_pass]
        part = DynamicCache(config=model.config)  # type: ignore[arg-type]
        if reused and store is not None:
            index = torch.tensor(rows[start:start + per_pass], device=dev)
            for layer, (k, v) in enumerate(store.layers):
                part.update(k[index, :, :reused], v[index, :, :reused], layer)
        if todo:
            if set_rows is not None:
                set_rows(chunk)
            prefix = torch.tensor([todo] * len(chunk), device=dev)
            model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{CACHE_ARG: part})
        kv = [(cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)) for layer in part.layers]  # type: ignore[union-attr]
        if len(chunk) == len(distinct):
            layers = kv
            break
        if not layers:  # preallocated, so chunks are copied in once (no second copy from a concatenation)
            layers = [(k.new_empty((len(distinct), *k.shape[1:])), v.new_empty((len(distinct), *v.shape[1:])))
                      for k, v in kv]
        for (k_all, v_all), (k, v) in zip(layers, kv):
            k_all[start:start + len(chunk)] = k
            v_all[start:start + len(chunk)] = v
        del part, kv
    if store is not None:
        store.keep(ids[0][:prefix_len], distinct, layers)
    where = {g: k for k, g in enumerate(distinct)}
    return layers, [where[g] for g in row_groups]


def _plain_layers(model: torch.nn.Module) -> bool:
    """Whether every layer of the model's cache is plain full attention (sliding windows drop tokens)."""
    layers = DynamicCache(config=model.config).layers  # type: ignore[arg-type]
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _runs(entries: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, end, entry) for each run of consecutive rows of one entry."""
    runs, start = [], 0
    for end in range(1, len(entries) + 1):
        if end == len(entries) or entries[end] != entries[start]:
            runs.append((start, end, entries[start]))
            start = end
    return runs


class SuffixLayer(StaticLayer):
    """A static cache layer of the rows' own positions after a `prefix_len`-token prefix that they read from a
    `SharedPrefix`: lengths and masks count the prefix first. Static: a decode step writes its token in
    place, where `DynamicLayer` copies the whole cache into fresh memory every step."""

    def __init__(self, prefix_len: int, max_cache_len: int) -> None:
        super().__init__(max_cache_len=max_cache_len)
        self.prefix_len = prefix_len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prefix_len + self.max_cache_len, 0

    def get_seq_length(self) -> int:
        return self.prefix_len + int(super().get_seq_length())


def _static_rows(keys: torch.Tensor, values: torch.Tensor, entries: Sequence[int], capacity: int) -> StaticLayer:
    """A `StaticLayer` of `capacity` positions whose row r starts with entry `entries[r]` of keys and values
    ((entries, kv heads, S, dim)): for attention implementations that cannot read a `SharedPrefix`."""
    layer = StaticLayer(max_cache_len=capacity)
    rows = len(entries)
    layer.lazy_initialization(keys[:1].expand(rows, *keys.shape[1:]), values[:1].expand(rows, *values.shape[1:]))
    for start, end, e in _runs(entries):
        for buffer, src in ((layer.keys, keys), (layer.values, values)):
            cast(torch.Tensor, buffer)[start:end, :, :keys.shape[2]] = src[e:e + 1]
    layer.cumulative_length.fill_(keys.shape[2])
    return layer


def _suffix_batch(ids: Sequence[Sequence[int]], starts: Sequence[int], prefix_len: int, cached: int,
                  pad_token_id: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[prefix | own cached | pad ... | new_i]: row i encodes ids[i][starts[i]:]; its own tokens before that
    (starts[i] - prefix_len of them) are already in the cache's first `cached` slots, right-aligned. Input ids
    (B, W), attention mask (B, P + cached + W), positions (B, W); pads are masked and positions continue each
    row's tokens without gaps."""
    news = [list(x[s:]) for x, s in zip(ids, starts)]
    batch, width = len(ids), max(len(s) for s in news)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((batch, prefix_len + cached + width), dtype=torch.long)
    mask[:, :prefix_len] = 1
    positions = torch.zeros((batch, width), dtype=torch.long)
    for i, (start, new) in enumerate(zip(starts, news)):
        mask[i, prefix_len + cached - (start - prefix_len):prefix_len + cached] = 1
        input_ids[i, width - len(new):] = torch.tensor(new)
        mask[i, prefix_len + cached + width - len(new):] = 1
        positions[i, width - len(new):] = torch.arange(start, start + len(new))
    return input_ids.to(dev), mask.to(dev), positions.to(dev)


def _decode(model: torch.nn.Module, cache: Cache, input_ids: torch.Tensor, mask: torch.Tensor,
            positions: torch.Tensor, offset: int, sampling: SamplingParams, eos_token_ids: Sequence[int],
            pad_token_id: int, generator: torch.Generator | None, return_logprobs: bool,
            shared: SharedPrefix | None = None,
            on_step: Callable[[list[int]], Sequence[bool] | None] | None = None,
            ) -> tuple[list[list[int]], list[list[float]] | None]:
    """The decode loop over the suffixes (the first at mask position `offset`): token ids per row, cut after the
    first EOS or where `on_step` ended the row (and their log-probs)."""
    dev, (batch, width) = input_ids.device, input_ids.shape
    cache_position = torch.arange(offset, offset + width, device=dev)
    eos = torch.tensor(list(eos_token_ids), device=dev)
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    lengths = torch.full((batch,), sampling.max_new_tokens, device=dev)  # a row's tokens: up to its EOS or its end
    steps: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    temperature = 1.0 if sampling.greedy else sampling.temperature
    extra = {} if shared is None else {"shared_prefix": shared}
    for t in range(sampling.max_new_tokens):
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache_position=cache_position,
                    use_cache=True, logits_to_keep=1, **{CACHE_ARG: cache}, **extra)
        logits = out.logits[:, -1].float()  # (B, V)
        token = next_tokens(logits, sampling, generator)
        token = torch.where(done, torch.full_like(token, pad_token_id), token)
        steps.append(token)
        if return_logprobs:
            logprobs.append(torch.log_softmax(logits / temperature, -1).gather(1, token[:, None]).squeeze(1))
        ended = done | torch.isin(token, eos)
        if on_step is not None and (ends := on_step(token.tolist())) is not None:
            ended |= torch.tensor(list(ends), dtype=torch.bool, device=dev)
        lengths = torch.where(ended & ~done, torch.full_like(lengths, t + 1), lengths)
        done = ended
        if bool(done.all()) or t + 1 == sampling.max_new_tokens:
            break
        input_ids = token[:, None]
        positions = positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=dev)], dim=1)
        cache_position = cache_position[-1:] + 1
    table = torch.stack(steps, dim=1).tolist()  # (B, S)
    lengths = lengths.clamp(max=len(steps))
    token_lists = [row[:n] for row, n in zip(table, lengths.tolist())]
    logprob_lists = None
    if return_logprobs:
        lp = torch.stack(logprobs, dim=1).tolist()
        logprob_lists = [row[:n] for row, n in zip(lp, lengths.tolist())]
    return token_lists, logprob_lists
