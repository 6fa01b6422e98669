"""`POST /v1/chat/completions`: a conversation rendered with the model's chat template, the prompt program
put in front of it when it brings no system message of its own."""

from __future__ import annotations

from collections.abc import Iterator

from esopt.engines.base import Completion
from esopt.serve.batcher import Choice, tokens_generated
from esopt.serve.prompt import ServedPrompt
from esopt.serve.protocol import APIError, ChatRequest, ResponseHead, usage
from esopt.serve.served import ServedModel, await_choices
from esopt.serve.streaming import StreamedReply, text_pieces

DEFAULT_CHAT_MAX_TOKENS = 256  # when the request sets none (clipped to what fits the context)


def chat_messages(req: ChatRequest,
                  program: ServedPrompt | None) -> tuple[list[dict], tuple[str, ...] | None]:
    """The conversation as the chat template takes it, and its stop strings (None: the request set none)."""
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in req.messages]
    stop = req.stops
    if program is not None and not any(m["role"] == "system" for m in messages):
        messages = program.preamble() + messages
        if stop is None:
            stop = program.stop
    return messages, stop


def render_prompt(policy, messages: list[dict]) -> str:
    try:
        return policy.build_prompt(messages)
    except Exception as e:
        raise APIError(400, f"messages: the model's chat template cannot render them ({type(e).__name__}: "
                       f"{str(e)[:200]})", "messages") from None


async def chat_completion(served: ServedModel, req: ChatRequest):
    """The chat completion (or its event stream) for a validated request."""
    messages, stop = chat_messages(req, served.program)
    prompt = render_prompt(served.policy, messages)
    prompt_tokens = served.count_tokens(prompt, "messages")
    asked = req.max_completion_tokens or req.max_tokens
    max_tokens = served.max_tokens(prompt_tokens, asked, DEFAULT_CHAT_MAX_TOKENS, "messages")
    sampling = req.sampling(max_tokens, stop or ())
    reply = ChatReply(served, req, prompt_tokens)
    if req.stream:
        return reply.stream(served.batcher, [prompt], sampling, req.generation_seed, req.n, req.logprobs,
                            opening=reply.role_chunks())
    future = served.batcher.enqueue([prompt], sampling, req.generation_seed, req.n, req.logprobs)
    return reply.body(await await_choices(future))


class ChatReply(StreamedReply):
    """The answer to one chat request, whole (`body`) or as `chat.completion.chunk` events."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, served: ServedModel, req: ChatRequest, prompt_tokens: int):
        super().__init__(ResponseHead.new("chatcmpl", "chat.completion", served.name), req.include_usage,
                         prompt_tokens)
        self.batcher, self.n, self.logprobs = served.batcher, req.n, req.logprobs

    def token_logprobs(self, c: Completion, ids: list[int], start: int = 0) -> dict | None:
        """Log-probs of `ids`, the completion's tokens from position `start` on."""
        if not self.logprobs:
            return None
        content = []
        for tid, lp in zip(ids, (c.logprobs or [])[start:]):
            tok = self.batcher.decode([tid])
            content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8", "replace")),
                            "top_logprobs": []})
        return {"content": content, "refusal": None}

    def body(self, choices: list[Choice]) -> dict:
        out = [{"index": i, "message": {"role": "assistant", "content": ch.completion.text, "refusal": None},
                "logprobs": self.token_logprobs(ch.completion, self.batcher.visible(ch.completion.token_ids)),
                "finish_reason": ch.finish_reason} for i, ch in enumerate(choices)]
        return self.head.body(out, usage=usage(self.prompt_tokens, tokens_generated(choices)))

    def role_chunks(self) -> str:
        """The first chunk of every choice, sent before generation ends: the assistant's (empty) turn."""
        return "".join(self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]) for i in range(self.n))

    def choice_chunks(self, index: int, choice: Choice) -> Iterator[str]:
        c = choice.completion
        ids = self.batcher.visible(c.token_ids)
        at = 0
        for piece, count in text_pieces(ids, c.text, self.batcher.decode):
            lp = self.token_logprobs(c, ids[at: at + count], at)
            at += count
            if piece or (lp and lp["content"]):
                yield self.chunk([{"index": index, "delta": {"content": piece}, "logprobs": lp,
                                   "finish_reason": None}])
        yield self.finish_chunk(index, choice)

    def text_chunk(self, index: int, piece: str) -> str:
        return self.chunk([{"index": index, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}])

    def finish_chunk(self, index: int, choice: Choice) -> str:
        return self.chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.finish_reason}])
