"""The interface every inference engine implements, and the sampling settings they all read.

An engine turns chat messages into prompts and generates completions in batches. ES perturbs
`engine.model`'s parameters in place; GRPO/PPO train them. Generated token ids are kept as produced
(never re-tokenized from text) because the RL baselines need them for exact log-prob ratios.

Batched ES populations (many members in one forward pass) need the engine to know which member owns
each batch row: `generate(..., members=[...])` names it per prompt, and `route_members(router)` installs
the object that applies each member's weights to its rows (`esopt.es.batched.member_router`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable, Sequence

    import torch


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings for one turn. temperature == 0 means greedy decoding."""

    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_new_tokens: int = 64
    # generation ends after the first of these strings (ReAct: "Observation:"); the text excludes it, the
    # token ids keep the tokens that completed it (as vLLM does)
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stop)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    """One completion. token_ids exclude padding and include EOS if the model produced it."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    # log p(token) under softmax(raw_logits / temperature) (temperature 1 when greedy); None unless asked for
    logprobs: list[float] | None = None


@runtime_checkable
class Engine(Protocol):
    model: torch.nn.Module
    tokenizer: Any  # a `transformers` tokenizer (callable on text, `decode`, `pad_token_id`)

    @property
    def device(self) -> torch.device: ...

    def build_prompt(self, messages: list[dict[str, str]]) -> str:
        """Render chat messages ({"role", "content"}) into the prompt text, generation prompt included."""
        ...

    def generate(
        self,
        prompts: list[str],
        sampling: SamplingParams,
        seed: int | None = None,
        return_logprobs: bool = False,
        members: Sequence[int] | None = None,
        on_step: Callable[[list[int]], Sequence[bool] | None] | None = None,
    ) -> list[Completion]:
        """Generate one completion per prompt in one batched call; same seed => same output. `members`:
        the population member of every prompt (rows of one member share weights), when a router is set.
        `on_step(tokens)`: called after each decode step with every row's new token id (a finished row's is
        padding); it may return one flag per row, True ending that row now (its client went away, or it has
        the tokens its request asked for), and the call ends when every row has. It never changes a row's
        tokens. Optional for an engine: `esopt serve` streams through it where the engine has it."""
        ...

    def weights_changed(self) -> None:
        """Called whenever the model's weights were changed in place (perturb, restore, update): a
        backend drops whatever it cached for the old weights (KV/prefix caches, a copy on a device)."""
        ...

    def rollout_scope(self, growing: bool = False) -> contextlib.AbstractContextManager[None]:
        """The weights stay fixed for the block (one multi-turn rollout): caches may live across turns.
        `growing`: each row's next prompt extends its last prompt and reply (a history conversation)."""
        ...

    def route_members(self, router: MemberRouter) -> contextlib.AbstractContextManager[None]:
        """For the block, tell `router.set_rows` the member of every row of each forward pass."""
        ...


class MemberRouter(Protocol):
    """What a batched population backend exposes to an engine."""

    def set_rows(self, members_of_rows: Sequence[int]) -> None:
        """The member index of every row of the next forward passes."""
        ...


def cut_at_stop(completion: Completion, stop: tuple[str, ...], decode) -> Completion:
    """The generation ended at the first stop string: text before it, token ids (and log-probs) up to
    the token that completed it. `decode(ids) -> str`. Model output is untrusted: any text is fine."""
    hits = [i for i in (completion.text.find(s) for s in stop) if i >= 0]
    if not hits:
        return completion
    cut = min(hits)
    n = len(completion.token_ids)
    for k in range(1, n + 1):  # the shortest token prefix whose text reaches past the stop string
        text = decode(completion.token_ids[:k])
        if any(text.find(s) >= 0 for s in stop):
            n = k
            break
    logprobs = completion.logprobs[:n] if completion.logprobs is not None else None
    return Completion(completion.prompt_ids, completion.token_ids[:n], completion.text[:cut], logprobs)
