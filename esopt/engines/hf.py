"""`HFEngine`: the Engine protocol over any `transformers` causal LM.

One `generate` call is one batched `model.generate` (left padding). Generated token ids are returned
exactly as produced (cut after the first EOS), never re-tokenized from text. Sampling is reproducible:
with a seed, the RNG is forked so the caller's global RNG state is untouched.

When the prompts of a call share a long token prefix (the system prompt and worked examples of an agent
rollout), `generate` encodes that prefix once and only the suffixes per row (`prefix.py`): 4-5x faster
for SmolLM2's few-shot Sudoku prompts. That prefix cache outlives a call only inside `rollout_scope` (one
multi-turn rollout, whose weights are fixed); ES changes the weights between rollouts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteria, StoppingCriteriaList

from esopt.engines.attention import use_decode_attention
from esopt.engines.base import Completion, MemberRouter, SamplingParams, cut_at_stop
from esopt.engines.prefix import PrefixKV, RowKV, generate_with_shared_prefix, shared_prefix_length

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available: use device='cpu'")
    return dev


class HFEngine:
    """A chat policy around a `transformers` causal LM and its tokenizer.

    The policy owns decoding: on construction the tokenizer is switched to left padding (a pad token is
    set to EOS if missing) and `model.generation_config` is replaced by a clean one holding only the
    special-token ids, so checkpoint defaults (repetition penalty, sampling knobs) never leak in. A CPU model
    on SDPA decodes with `attention.decode_attention` (same results to rounding, several times faster).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, prefix_cache: bool = True,
                 min_prefix_tokens: int = 32, cpu_decode_attention: bool = True, row_cache: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        # share the KV cache of a common prompt prefix of at least this many tokens (log-prob calls excepted)
        self.prefix_cache = prefix_cache
        self.min_prefix_tokens = min_prefix_tokens
        self.router: MemberRouter | None = None  # see `route_members`
        self.prefix_kv, self.keep_prefix = PrefixKV(), False  # see `rollout_scope`
        # and each row's own KV (a growing conversation encodes only its new tokens each turn)
        self.row_kv, self.keep_rows = RowKV() if row_cache else None, False
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.eos_token_ids = self._collect_eos_ids(model, tokenizer)
        if not self.eos_token_ids:
            raise ValueError("the tokenizer/model defines no EOS token: generation could not stop")
        model.generation_config = GenerationConfig(  # type: ignore[assignment]
            bos_token_id=getattr(model.generation_config, "bos_token_id", None) or tokenizer.bos_token_id,
            eos_token_id=self.eos_token_ids,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.eval()
        if cpu_decode_attention:
            use_decode_attention(model)

    @staticmethod
    def _collect_eos_ids(model, tokenizer) -> list[int]:
        ids: list[int] = []
        for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            for i in source if isinstance(source, (list, tuple)) else [source]:
                if i is not None and int(i) not in ids:
                    ids.append(int(i))
        return ids

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        gguf_file: str | None = None,
    ) -> HFEngine:
        """Load a local safetensors dir, or a GGUF file (path to the .gguf, or dir + gguf_file name)."""
        torch_dtype = resolve_dtype(dtype)
        dev = resolve_device(device)
        path = Path(path).expanduser()
        if gguf_file is None and path.suffix == ".gguf":
            path, gguf_file = path.parent, path.name
        target = path / gguf_file if gguf_file else path
        if not target.exists():
            raise FileNotFoundError(f"model path does not exist: {target}")
        if gguf_file is None and not path.is_dir():
            raise ValueError(f"expected a model directory or a .gguf file, got {path}")
        kwargs: dict[str, Any] = {"local_files_only": True}
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
        tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, **kwargs)
        return cls(model.to(dev), tokenizer)  # type: ignore[arg-type]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def build_prompt(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _generation_config(self, sampling: SamplingParams, return_logprobs: bool) -> GenerationConfig:
        common = dict(
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True,
            output_logits=return_logprobs,
            use_cache=True,
            repetition_penalty=1.0,
        )
        if sampling.greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            **common,
        )

    def weights_changed(self) -> None:
        """Drop the prefix KV kept across the turns of a rollout (see `rollout_scope`)."""
        self._drop_kv()

    @contextlib.contextmanager
    def route_members(self, router: MemberRouter) -> Iterator[None]:
        """Batched ES members: for the block, `router.set_rows` hears the member of every row of each forward
        pass (first the distinct members, for their own shared-prefix pass; see `prefix.py`)."""
        if self.router is not None:
            raise RuntimeError("route_members is already active on this engine")
        self.router = router
        try:
            yield
        finally:
            self.router = None

    @contextlib.contextmanager
    def rollout_scope(self, growing: bool = False) -> Iterator[None]:
        """The weights stay fixed for the block (one multi-turn rollout), so the KV of the prompts' shared
        prefix is kept from turn to turn instead of being encoded again every turn. `growing`: each row's next
        prompt extends its last prompt and reply (a history conversation), so each row's own KV is kept too
        and the next turn encodes only what is new (elsewhere it would hold memory for a few shared tokens)."""
        self._drop_kv()
        self.keep_prefix, self.keep_rows = True, growing
        try:
            yield
        finally:
            self.keep_prefix = self.keep_rows = False
            self._drop_kv()

    def _drop_kv(self) -> None:
        self.prefix_kv.clear()
        if self.row_kv is not None:
            self.row_kv.clear()

    def generate(
        self,
        prompts: list[str],
        sampling: SamplingParams,
        seed: int | None = None,
        return_logprobs: bool = False,
        members: Sequence[int] | None = None,
        on_step: Callable[[list[int]], Sequence[bool] | None] | None = None,
    ) -> list[Completion]:
        if members is not None and len(members) != len(prompts):
            raise ValueError(f"{len(members)} members for {len(prompts)} prompts")
        if self.router is not None and members is None:
            raise ValueError("a member router is active: generate needs the member of every prompt")
        if self.router is not None and members is not None:  # every forward of a plain `generate` sees these rows
            self.router.set_rows(list(members))
        out = self._generate(prompts, sampling, seed, return_logprobs, members, on_step)
        if not sampling.stop:
            return out

        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        return [cut_at_stop(g, sampling.stop, decode) for g in out]

    @torch.inference_mode()
    def _generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None,
                  return_logprobs: bool, members: Sequence[int] | None = None,
                  on_step: Callable[[list[int]], Sequence[bool] | None] | None = None) -> list[Completion]:
        if not prompts:
            return []
        if self.prefix_cache and len(prompts) > 1 and not return_logprobs:
            ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
            prefix_len = shared_prefix_length(ids)
            if prefix_len >= self.min_prefix_tokens:
                tokens, _ = generate_with_shared_prefix(
                    self.model, ids, prefix_len, sampling, self.eos_token_ids, self.tokenizer.pad_token_id, seed,
                    groups=None if self.router is None or members is None else list(members),
                    set_rows=None if self.router is None else self.router.set_rows,
                    store=self.prefix_kv if self.keep_prefix else None, min_reuse=self.min_prefix_tokens,
                    rows_store=self.row_kv if self.keep_rows else None, on_step=on_step)
                texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
                return [Completion(prompt_ids=list(p), token_ids=t, text=x) for p, t, x in zip(ids, tokens, texts)]
        dev = self.device
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        input_ids = enc["input_ids"].to(dev)
        attention_mask = enc["attention_mask"].to(dev)
        gen_config = self._generation_config(sampling, return_logprobs)
        listener = None if on_step is None else _StepCriteria(on_step, len(prompts))
        with self._rng(seed, dev):
            out = self.model.generate(  # type: ignore[operator]
                input_ids=input_ids, attention_mask=attention_mask, generation_config=gen_config,
                **({} if listener is None else {"stopping_criteria": StoppingCriteriaList([listener])}),
            )
        new_tokens = out.sequences[:, input_ids.shape[1] :]  # (B, S)
        lengths = self._lengths(new_tokens)
        if listener is not None:  # a row the listener ended is padding after that step
            lengths = [min(n, end) for n, end in zip(lengths, listener.ended_at)]
        token_lists = [row[:n] for row, n in zip(new_tokens.tolist(), lengths)]
        logprob_lists = None
        if return_logprobs:
            logprob_lists = self._logprobs(out.logits, new_tokens, lengths, sampling)
        texts = self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)
        mask = enc["attention_mask"].bool()
        ids = enc["input_ids"]
        return [
            Completion(
                prompt_ids=ids[i][mask[i]].tolist(),
                token_ids=token_lists[i],
                text=texts[i],
                logprobs=None if logprob_lists is None else logprob_lists[i],
            )
            for i in range(len(prompts))
        ]

    @staticmethod
    @contextlib.contextmanager
    def _rng(seed: int | None, dev: torch.device):
        """Seeded sampling in a forked RNG (caller's state restored); seed None => the global RNG."""
        if seed is None:
            yield
            return
        if dev.type == "cpu":
            ctx = torch.random.fork_rng(devices=[])
        else:
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            ctx = torch.random.fork_rng(devices=[index], device_type=dev.type)
        with ctx:
            torch.manual_seed(seed)
            yield

    def _lengths(self, new_tokens: torch.Tensor) -> list[int]:
        """Tokens up to and including the first EOS (everything after it is padding)."""
        b, s = new_tokens.shape
        if s == 0:
            return [0] * b
        is_eos = torch.isin(new_tokens, torch.tensor(self.eos_token_ids, device=new_tokens.device))
        first = torch.where(
            is_eos.any(1), is_eos.int().argmax(1) + 1, torch.full((b,), s, device=is_eos.device)
        )
        return first.tolist()

    @staticmethod
    def _logprobs(
        logits: tuple[torch.Tensor, ...],
        new_tokens: torch.Tensor,
        lengths: list[int],
        sampling: SamplingParams,
    ) -> list[list[float]]:
        temperature = 1.0 if sampling.greedy else sampling.temperature
        steps = []
        for s, step_logits in enumerate(logits):  # step_logits: (B, V), raw (unprocessed)
            lp = torch.log_softmax(step_logits.float() / temperature, dim=-1)
            steps.append(lp.gather(1, new_tokens[:, s : s + 1]).squeeze(1))
        table = torch.stack(steps, dim=1).tolist()  # (B, S)
        return [row[:n] for row, n in zip(table, lengths)]


class _StepCriteria(StoppingCriteria):
    """`transformers`' generate calls its stopping criteria after each new token: the place to tell an
    `on_step` listener (see `Engine.generate`) the step's tokens and to end the rows it ends; `ended_at[row]`
    is how many tokens the row had when the listener ended it."""

    def __init__(self, on_step: Callable[[list[int]], Sequence[bool] | None], rows: int):
        self.on_step, self.steps = on_step, 0
        self.ended_at = [2**62] * rows

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.BoolTensor:
        self.steps += 1
        ends = self.on_step(input_ids[:, -1].tolist())
        if ends is None:
            ends = [False] * input_ids.shape[0]
        for row, end in enumerate(ends):
            if end and self.ended_at[row] > self.steps:
                self.ended_at[row] = self.steps
        return torch.tensor(list(ends), dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]
