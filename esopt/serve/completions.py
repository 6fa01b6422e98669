"""`POST /v1/completions`: OpenAI's legacy completions, raw text in (one prompt or a list of them), no chat
template and no prompt program; `echo` puts the prompt in front of its choices."""

from __future__ import annotations

from collections.abc import Iterator

from esopt.engines.base import Completion
from esopt.serve.batcher import Choice, tokens_generated
from esopt.serve.protocol import APIError, CompletionRequest, ResponseHead, usage
from esopt.serve.served import ServedModel, await_choices
from esopt.serve.streaming import StreamedReply, text_pieces

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_ROWS = 1024  # prompts x n of one request


async def text_completion(served: ServedModel, req: CompletionRequest):
    """The completion (or its event stream) for a validated request."""
    prompts = req.prompts
    if len(prompts) * req.n > MAX_ROWS:
        raise APIError(400, f"at most {MAX_ROWS} choices (prompts x n) per request, "
                       f"got {len(prompts) * req.n}", "n")
    counts = [served.count_tokens(p, "prompt") for p in prompts]
    # the prompts share one call, so the longest bounds max_tokens for all of them
    max_tokens = min(served.max_tokens(k, req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, "prompt")
                     for k in counts)
    sampling = req.sampling(max_tokens, req.stops or ())
    reply = CompletionReply(served, req, sum(counts))
    if req.stream:
        return reply.stream(served.batcher, prompts, sampling, req.generation_seed, req.n, reply.logprobs,
                            opening=reply.echo_chunks())
    future = served.batcher.enqueue(prompts, sampling, req.generation_seed, req.n, reply.logprobs)
    return reply.body(await await_choices(future))


class CompletionReply(StreamedReply):
    """The answer to one completions request, whole (`body`) or as `text_completion` events."""

    chunk_object = "text_completion"

    def __init__(self, served: ServedModel, req: CompletionRequest, prompt_tokens: int):
        super().__init__(ResponseHead.new("cmpl", "text_completion", served.name), req.include_usage,
                         prompt_tokens)
        self.batcher, self.prompts, self.n, self.echo = served.batcher, req.prompts, req.n, req.echo
        self.logprobs = req.logprobs is not None

    def echoed(self, index: int) -> str:
        """What choice `index` starts with: its prompt when `echo` is on."""
        return self.prompts[index // self.n] if self.echo else ""

    def token_logprobs(self, c: Completion, ids: list[int], offset: int, start: int = 0) -> dict | None:
        """Log-probs of `ids`, the completion's tokens from position `start` on; text offsets from `offset`."""
        if not self.logprobs:
            return None
        tokens = [self.batcher.decode([t]) for t in ids]
        offsets, at = [], offset
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens, "token_logprobs": list((c.logprobs or [])[start: start + len(ids)]),
                "top_logprobs": None, "text_offset": offsets}

    def body(self, choices: list[Choice]) -> dict:
        out = []
        for i, ch in enumerate(choices):
            head = self.echoed(i)
            ids = self.batcher.visible(ch.completion.token_ids)
            out.append({"index": i, "text": head + ch.completion.text,
                        "logprobs": self.token_logprobs(ch.completion, ids, len(head)),
                        "finish_reason": ch.finish_reason})
        return self.head.body(out, usage=usage(self.prompt_tokens, tokens_generated(choices)))

    def echo_chunks(self) -> str:
        """The prompts of the choices, sent before generation ends, when `echo` is on."""
        return "".join(self.chunk([{"index": i, "text": head, "logprobs": None, "finish_reason": None}])
                       for i in range(len(self.prompts) * self.n) if (head := self.echoed(i)))

    def choice_chunks(self, index: int, choice: Choice) -> Iterator[str]:
        c = choice.completion
        head = self.echoed(index)
        ids = self.batcher.visible(c.token_ids)
        at, offset = 0, len(head)
        for piece, count in text_pieces(ids, c.text, self.batcher.decode):
            lp = self.token_logprobs(c, ids[at: at + count], offset, at)
            at += count
            offset += len(piece)
            if piece or (lp and lp["tokens"]):
                yield self.chunk([{"index": index, "text": piece, "logprobs": lp, "finish_reason": None}])
        yield self.finish_chunk(index, choice)

    def text_chunk(self, index: int, piece: str) -> str:
        return self.chunk([{"index": index, "text": piece, "logprobs": None, "finish_reason": None}])

    def finish_chunk(self, index: int, choice: Choice) -> str:
        return self.chunk([{"index": index, "text": "", "logprobs": None, "finish_reason": choice.finish_reason}])
