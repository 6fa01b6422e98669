"""`stream: true`: server-sent events, token by token as the batcher's `generate` call makes them.

Each decode step's tokens reach the request's stream while the call runs (`Batcher.enqueue(tokens=...)`);
`LiveText` turns a row's ids into text deltas, holding back what a stop string could still claim and any
incomplete multi-byte character. When the call is done, the rest of each choice comes from its finished text,
so the streamed text always equals the text of the same request without streaming. Requests with log-probs,
and engines without an `on_step` listener, are streamed from the finished answer instead (`text_pieces`:
one chunk per decoded token, in one write)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence

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


class LiveText:
    """One row's text as its tokens arrive: `add(id)` gives the new text that is safe to send. Safe: not after
    the row's EOS or past its `max_tokens`, before the first stop string, not the last `len(longest stop) - 1`
    characters (a stop string may still begin there), not a trailing incomplete character (U+FFFD), and only
    while the decoded text extends what was sent. `finish(text)` gives the rest of the finished choice."""

    def __init__(self, decode: Callable[[list[int]], str], eos_ids: Collection[int], max_tokens: int,
                 stop: Sequence[str] = ()):
        self.decode, self.eos_ids, self.max_tokens, self.stop = decode, eos_ids, max_tokens, tuple(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = ""
        self.closed = False

    def add(self, token: int) -> str:
        if self.closed:
            return ""
        if token in self.eos_ids or len(self.ids) >= self.max_tokens:
            self.closed = True
            return ""
        self.ids.append(token)
        text = self.decode(self.ids)
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            text, self.closed = text[: min(hits)], True
        else:
            text = text.rstrip("\ufffd")
            text = text[: max(0, len(text) - self.hold)]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece

    def finish(self, text: str) -> str:
        """What the finished choice `text` adds to what was sent (nothing if it does not extend it: a sent
        character cannot be taken back, and the live text only sends prefixes of what the decode settles on)."""
        return text[len(self.sent):] if text.startswith(self.sent) else ""


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
        """A finished choice's chunks: its text in pieces (with their log-probs), then its finish chunk."""
        raise NotImplementedError

    def text_chunk(self, index: int, piece: str) -> str:
        """A live chunk: `piece`, the next text of choice `index`."""
        raise NotImplementedError

    def finish_chunk(self, index: int, choice: Choice) -> str:
        raise NotImplementedError

    def answer_chunks(self, choices: list[Choice]) -> Iterator[str]:
        for i, ch in enumerate(choices):
            yield from self.choice_chunks(i, ch)
        yield self.closing(choices)

    def closing(self, choices: list[Choice]) -> str:
        """After every choice's finish chunk: the usage chunk (if asked for) and `[DONE]`."""
        if self.include_usage:
            return self.chunk([], usage(self.prompt_tokens, tokens_generated(choices))) + STREAM_END
        return STREAM_END

    async def live_chunks(self, future: asyncio.Future, tokens: asyncio.Queue,
                          rows: list[LiveText]) -> AsyncIterator[str]:
        """Each decode step's text deltas (one write per step), then every choice's rest, finish and usage."""
        while not (future.done() and tokens.empty()):
            getter = asyncio.ensure_future(tokens.get())
            await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            _, ids = getter.result()
            step = "".join(self.text_chunk(i, piece) for i, (row, t) in enumerate(zip(rows, ids))
                           if (piece := row.add(t)))
            if step:
                yield step
        choices = future.result()
        out = []
        for i, (row, ch) in enumerate(zip(rows, choices)):
            if rest := row.finish(ch.completion.text):
                out.append(self.text_chunk(i, rest))
            out.append(self.finish_chunk(i, ch))
        yield "".join(out) + self.closing(choices)

    def stream(self, batcher, prompts: list[str], sampling, seed: int | None, n: int, logprobs: bool,
               opening: str = ""):
        """Enqueue the request and answer with its event stream: live where the engine streams and no
        log-probs are asked for (they come with the finished answer), else from the finished answer."""
        if not batcher.streams or logprobs:
            return self.response(batcher.enqueue(prompts, sampling, seed, n, logprobs), opening)
        tokens: asyncio.Queue = asyncio.Queue()
        future = batcher.enqueue(prompts, sampling, seed, n, logprobs, tokens=tokens)
        rows = [LiveText(batcher.decode, batcher.eos_ids, sampling.max_new_tokens, sampling.stop)
                for _ in range(len(prompts) * n)]
        return self.response(future, opening, tokens, rows)

    def response(self, future: asyncio.Future, opening: str = "", tokens: asyncio.Queue | None = None,
                 rows: list[LiveText] | None = None):
        """The StreamingResponse: `opening` at once (if any); then, with a `tokens` queue the batcher fills,
        the text as it is generated (`rows`: one LiveText per choice), else the answer's chunks when done."""
        from fastapi.responses import StreamingResponse

        async def events() -> AsyncIterator[str]:
            try:
                if opening:
                    yield opening
                try:
                    if tokens is not None and rows is not None:
                        async for part in self.live_chunks(future, tokens, rows):
                            yield part
                        return
                    choices = await future
                except Exception as e:
                    yield sse(generation_failed(e, detail=False).body())
                    return
                yield "".join(self.answer_chunks(choices))  # the chunks of a finished answer: one write
            finally:
                future.cancel()  # a client gone: the batcher skips it, or ends its rows at the next step

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
