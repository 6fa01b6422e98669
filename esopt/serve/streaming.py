"""`stream: true`: a finished answer cut into server-sent events.

Streaming is cut from the finished batched result, not token by token: the batcher answers a request only
when its whole `generate` call is done, then its text is cut into one chunk per decoded token and all the
chunks go out in one write. So streaming here is a wire format, not lower latency; the streamed text always
equals the text of the same request without streaming."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

from esopt.serve.batcher import Choice, tokens_generated
from esopt.serve.protocol import STREAM_END, ResponseHead, generation_failed, sse, usage


def text_pieces(ids: list[int], text: str, decode: Callable[[list[int]], str]) -> list[tuple[str, int]]:
    """The completion's text cut into one piece per decoded token: [(piece, tokens it covers)], pieces
    joining to exactly `text`. Incremental detokenization over a short window (no piece ends inside a
    multi-byte character); if the pieces would not join to `text` (a tokenizer whose decode is not
    prefix-stable), one piece holds it all."""
    pieces: list[tuple[str, int]] = []
    prefix, read, pending = 0, 0, 0
    for k in range(1, len(ids) + 1):
        pending += 1
        before = decode(ids[prefix:read]) if read > prefix else ""
        now = decode(ids[prefix:k])
        if len(now) > len(before) and now.startswith(before) and not now.endswith("\ufffd"):
            piece = now[len(before):]
            pieces.append((piece, pending))
            prefix, read, pending = read, k, 0
    if pending:
        pieces.append(("", pending))
    joined = "".join(p for p, _ in pieces)
    if not joined.startswith(text):
        return [(text, len(ids))]
    out, at = [], 0
    for piece, count in pieces:  # clip at the text's end (a stop string cut it short)
        keep = piece[: max(0, len(text) - at)]
        at += len(keep)
        out.append((keep, count))
    return out


class StreamedReply:
    """What chat and legacy completion streams share: the chunk envelope, the closing usage chunk and
    `[DONE]`, and the event stream around the batcher's future. Subclasses say how one choice is chunked."""

    chunk_object = ""  # the `object` of each chunk

    def __init__(self, head: ResponseHead, include_usage: bool, prompt_tokens: int):
        self.head, self.include_usage, self.prompt_tokens = head, include_usage, prompt_tokens

    def chunk(self, choices: list[dict], usage_: dict | None = None) -> str:
        body = self.head.body(choices, object=self.chunk_object)
        if self.include_usage:
            body["usage"] = usage_
        return sse(body)

    def choice_chunks(self, index: int, choice: Choice) -> Iterator[str]:
        raise NotImplementedError

    def answer_chunks(self, choices: list[Choice]) -> Iterator[str]:
        for i, ch in enumerate(choices):
            yield from self.choice_chunks(i, ch)
        if self.include_usage:
            yield self.chunk([], usage(self.prompt_tokens, tokens_generated(choices)))
        yield STREAM_END

    def response(self, future: asyncio.Future, opening: str = ""):
        """The StreamingResponse: `opening` at once (if any), the answer's chunks when it is done."""
        from fastapi.responses import StreamingResponse

        async def events() -> AsyncIterator[str]:
            try:
                if opening:
                    yield opening
                try:
                    choices = await future
                except Exception as e:
                    yield sse(generation_failed(e, detail=False).body())
                    return
                yield "".join(self.answer_chunks(choices))  # the chunks of a finished answer: one write
            finally:
                future.cancel()  # a client gone before its turn: the batcher skips it

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
