"""Requests that arrive together answered by one batched `generate` call: the batch grows with load, which is
what a CPU's AMX units and a GPU need.

Greedy requests share a call whatever their `stop` and with `max_tokens` in the same power-of-two range (the
call runs to the longest, every row is cut to its own request's), unseeded sampled ones share a call per
(temperature, top_p) as well; a seeded sampled request gets a call of its own, so the same request with the
same seed gives the same choices. Every row's answer is its own prompt's.

Where the engine takes an `on_step` listener (`esopt.engines.base.Engine.generate`), each decode step's tokens
go to the token queues of the streaming requests in the call as they are made, and a row ends as soon as it
has its own request's `max_tokens` or its client has gone, so a disconnected client frees its rows."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from esopt.engines.base import Completion, SamplingParams, cut_at_stop

log = logging.getLogger("esopt.serve")


@dataclass(eq=False)
class _Job:
    prompts: list[str]
    sampling: SamplingParams  # this request's own max_new_tokens and stop
    seed: int | None
    n: int
    logprobs: bool
    future: asyncio.Future = field(repr=False)
    tokens: asyncio.Queue | None = field(default=None, repr=False)  # streaming: (step, ids of its rows)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    def key(self) -> tuple:
        """Jobs with equal keys may share a `generate` call."""
        s = self.sampling
        length = s.max_new_tokens.bit_length()  # calls run to their longest row: similar lengths share one
        if s.greedy:
            return ("greedy", length, self.logprobs)
        if self.seed is None:
            return ("sample", length, s.temperature, s.top_p, s.top_k, self.logprobs)
        return ("seeded", id(self))  # alone: its rows do not depend on who else is waiting


@dataclass
class Choice:
    completion: Completion
    finish_reason: str  # "stop" (EOS or a stop string) or "length"


def tokens_generated(choices: Sequence[Choice]) -> int:
    """The completion tokens of a request's choices, as its `usage` counts them."""
    return sum(len(ch.completion.token_ids) for ch in choices)


class Batcher:
    """Collects requests for up to `wait_s` (or until `max_batch` rows) and answers them in batched calls.

    A request is `prompts x n` rows. Rows of compatible requests (see `_Job.key`) share a `generate` call of
    at most `max_batch` rows (a bigger request gets a call of its own); each row is then cut to its own
    request's `max_tokens` and stop strings."""

    def __init__(self, policy, max_batch: int = 32, wait_s: float = 0.005):
        self.policy, self.max_batch, self.wait_s = policy, max_batch, wait_s
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.batches = 0  # generate calls made (tests check that concurrent requests share them)
        self.rows = 0  # rows generated
        # the event loop's own tokenizer: a fast tokenizer used by two threads at once (generate encodes
        # with padding while a reply is decoded) can fail with "Already borrowed"
        try:
            self.tokenizer = copy.deepcopy(policy.tokenizer)
        except Exception:
            self.tokenizer = policy.tokenizer
        self.eos_ids = set(getattr(policy, "eos_token_ids", None) or [self.tokenizer.eos_token_id])
        try:
            self.streams = "on_step" in inspect.signature(policy.generate).parameters
        except (TypeError, ValueError):
            self.streams = False

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def visible(self, ids: list[int]) -> list[int]:
        """The ids a reply shows: without the EOS that ended it."""
        return ids[:-1] if ids and ids[-1] in self.eos_ids else ids

    def enqueue(self, prompts: list[str], sampling: SamplingParams, seed: int | None, n: int = 1,
                logprobs: bool = False, tokens: asyncio.Queue | None = None) -> asyncio.Future:
        """The future of the request's choices. With `tokens` (and an engine that streams, `self.streams`),
        each decode step puts `(step, [the token id of each of the request's rows])` there, all of them before
        the future is set (the loop runs its callbacks in order); a row's ids after its EOS or its `max_tokens`
        are padding."""
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Job(list(prompts), sampling, seed, n, logprobs, future,
                                   tokens if self.streams else None))
        return future

    async def submit(self, prompts: list[str], sampling: SamplingParams, seed: int | None, n: int = 1,
                     logprobs: bool = False) -> list[Choice]:
        """Choices prompt-major: prompt 0's n choices, then prompt 1's, ..."""
        return await self.enqueue(prompts, sampling, seed, n, logprobs)

    async def run(self) -> None:
        while True:
            pending = await self._collect()
            try:
                await self._answer(pending)
            except Exception as e:  # a bug here must not leave requests waiting forever
                log.exception("esopt serve: batching failed")
                _fail(pending, e)

    async def _collect(self) -> list[_Job]:
        """The next request and whatever joins it within `wait_s`, up to `max_batch` rows."""
        pending = [await self.queue.get()]
        rows = pending[0].rows
        deadline = time.monotonic() + self.wait_s
        while rows < self.max_batch:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), left)
                except asyncio.TimeoutError:
                    break
            pending.append(job)
            rows += job.rows
        return pending

    async def _answer(self, pending: list[_Job]) -> None:
        groups: dict[tuple, list[_Job]] = {}
        for job in pending:
            if not job.future.done():  # its client went away while it waited
                groups.setdefault(job.key(), []).append(job)
        for group in groups.values():
            call: list[_Job] = []
            for job in group:
                if call and sum(j.rows for j in call) + job.rows > self.max_batch:
                    await self._call(call)
                    call = []
                call.append(job)
            if call:
                await self._call(call)

    async def _call(self, jobs: list[_Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]
        if not jobs:
            return
        first = jobs[0].sampling
        sampling = SamplingParams(first.temperature, first.top_p, first.top_k,
                                  max(j.sampling.max_new_tokens for j in jobs), ())
        prompts = [p for j in jobs for p in j.prompts for _ in range(j.n)]
        seed = jobs[0].seed if jobs[0].key()[0] == "seeded" else None
        extra = {"on_step": self._listener(jobs, asyncio.get_running_loop())} if self.streams else {}
        if jobs[0].logprobs:
            extra["return_logprobs"] = True
        try:
            self.batches += 1
            self.rows += len(prompts)
            out = await asyncio.to_thread(self.policy.generate, prompts, sampling, seed, **extra)
            if len(out) != len(prompts):
                raise RuntimeError(f"generate returned {len(out)} completions for {len(prompts)} prompts")
            at = 0
            for j in jobs:
                mine = [self._finish(c, j.sampling) for c in out[at: at + j.rows]]
                at += j.rows
                if not j.future.done():
                    j.future.set_result(mine)
        except Exception as e:  # one bad batch answers its requests with the error, the server lives on
            log.exception("esopt serve: generate failed")
            _fail(jobs, e)

    @staticmethod
    def _listener(jobs: list[_Job], loop: asyncio.AbstractEventLoop):
        """The `on_step` of one call (it runs on generate's thread): each step's ids to the streaming jobs'
        queues, through the event loop; ends the rows of a job whose client has gone or that has its
        `max_tokens`."""
        spans, at = [], 0
        for j in jobs:
            spans.append((j, at, at + j.rows))
            at += j.rows
        ended = [False] * at
        step = 0

        def on_step(tokens: list[int]) -> list[bool]:
            nonlocal step
            step += 1
            for j, start, stop in spans:
                if ended[start]:
                    continue
                gone = j.future.done()  # cancelled: its client went away
                if j.tokens is not None and not gone:
                    with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
                        loop.call_soon_threadsafe(j.tokens.put_nowait, (step, tokens[start:stop]))
                if gone or step >= j.sampling.max_new_tokens:
                    ended[start:stop] = [True] * (stop - start)
            return ended

        return on_step

    def _finish(self, c: Completion, sampling: SamplingParams) -> Choice:
        """A row of a shared call cut to its own request's max_tokens and stop strings."""
        ids, lps, text = list(c.token_ids), c.logprobs, c.text
        if len(ids) > sampling.max_new_tokens:
            ids = ids[: sampling.max_new_tokens]
            lps = lps[: sampling.max_new_tokens] if lps is not None else None
            text = self.decode(ids)
        c = Completion(c.prompt_ids, ids, text, lps)
        if sampling.stop:
            cut = cut_at_stop(c, sampling.stop, self.decode)
            if cut is not c:
                return Choice(cut, "stop")
        return Choice(c, "stop" if ids and ids[-1] in self.eos_ids else "length")


def _fail(jobs: list[_Job], error: Exception) -> None:
    """Answer the jobs still waiting with `error`."""
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)
