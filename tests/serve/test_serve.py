"""`esopt serve` on loopback, driven by the official `openai` client (and raw HTTP where the client would
refuse to send a bad body), plus the HTTP reflector against it and against endpoints that fail, hang or
answer garbage.

The served model is the tiny Llama with its weights redrawn at a larger scale, so that its greedy replies
depend on the prompt (the stock init answers ">>>>" to everything, which could not show a reply routed to
the wrong client)."""

import asyncio
import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from esopt.engines.base import SamplingParams  # noqa: E402
from esopt.prompt.reflector import HTTPReflector, PolicyReflector  # noqa: E402
from esopt.serve import (  # noqa: E402
    ServedPrompt,
    build_app,
    load_prompt_program,
    start_in_thread,
    text_pieces,
)
from tests.policies import SlowForward, distinct_tiny_policy  # noqa: E402


@pytest.fixture(scope="module")
def server():
    policy = distinct_tiny_policy()
    app = build_app(policy, "tiny", system_prompt="You play Sudoku.", wait_s=0.05)
    running = start_in_thread(app)
    yield running.base_url, app, policy
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server[0], api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def post(url: str, body, raw: bool = False) -> tuple[int, str]:
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def assert_error_shape(text: str, status: int) -> dict:
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"}, (status, text)
    assert isinstance(err["message"], str) and err["message"]
    return err


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# --- the basics ------------------------------------------------------------------------------------------

def test_models_and_chat_completion(server):
    base, app, _ = server
    models = json.loads(urllib.request.urlopen(f"{base}/models", timeout=10).read())
    assert models["data"][0]["id"] == "tiny"
    status, text = post(f"{base}/chat/completions", {"messages": user("1 12.4"), "max_tokens": 5, "seed": 1})
    reply = json.loads(text)
    assert status == 200 and reply["object"] == "chat.completion"
    assert isinstance(reply["choices"][0]["message"]["content"], str)
    assert 1 <= reply["usage"]["completion_tokens"] <= 5


def test_openai_client_chat_matches_the_policy(client, server):
    _, _, policy = server
    reply = client.chat.completions.create(model="tiny", messages=user("3 4 1"), max_tokens=8, temperature=0)
    want = policy.generate([policy.build_prompt(user("3 4 1"))], SamplingParams(0, 1, 0, 8))[0]
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].finish_reason == ("stop" if want.token_ids[-1] == policy.tokenizer.eos_token_id
                                              else "length")
    assert reply.usage.prompt_tokens == len(want.prompt_ids)
    assert reply.usage.completion_tokens == len(want.token_ids)
    assert client.models.retrieve("tiny").id == "tiny"


# --- streaming ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["3 4 1", "a longer question, with punctuation!?", "\u00e9t\u00e9 \u2603"])
def test_streamed_chat_equals_the_non_streamed_reply(client, content):
    kwargs = dict(model="tiny", messages=user(content), max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # token by token
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage  # include_usage: the last chunk
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_wire_format_ends_with_done(server):
    base, _, _ = server
    status, text = post(f"{base}/chat/completions", {"messages": user("hi"), "max_tokens": 4, "stream": True})
    assert status == 200
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert all("usage" not in json.loads(e[6:]) for e in events[:-1])  # no stream_options: no usage field


def test_streamed_completions_equal_the_non_streamed_ones(client):
    kwargs = dict(model="tiny", prompt=["1 2 3", "abc"], max_tokens=10, temperature=0, n=2, echo=True)
    plain = client.completions.create(**kwargs)
    texts: dict[int, str] = {}
    for c in client.completions.create(**kwargs, stream=True):
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert texts == {ch.index: ch.text for ch in plain.choices}
    assert plain.choices[0].text.startswith("1 2 3") and plain.choices[2].text.startswith("abc")  # echo


@pytest.fixture
def slow_server():
    policy = distinct_tiny_policy()
    slow = SlowForward(policy, 0.03)
    running = start_in_thread(build_app(policy, "tiny", wait_s=0.0))
    yield running.base_url, slow
    running.stop()
    slow.handle.remove()


def test_a_streaming_client_gets_its_first_chunk_long_before_the_completion_is_done(slow_server):
    base, _ = slow_server
    kwargs = dict(model="tiny", messages=user("3 4 1"), max_tokens=64, temperature=0)
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as c:
        plain = c.chat.completions.create(**kwargs)
        assert plain.usage.completion_tokens == 64 and plain.choices[0].finish_reason == "length"
        t0, first, parts = time.perf_counter(), None, []
        for chunk in c.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                first = first if first is not None else time.perf_counter() - t0
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage_ = chunk.usage
        total = time.perf_counter() - t0
    assert first is not None and first < total / 2, (first, total)  # ~64 x 30 ms in all: the first after ~2
    assert "".join(parts) == plain.choices[0].message.content and usage_ == plain.usage
    assert len(parts) > 32  # token by token, not one piece at the end


def test_a_client_that_disconnects_midway_frees_its_rows(slow_server):
    base, slow = slow_server
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as c:
        before = slow.calls
        stream = c.chat.completions.create(model="tiny", messages=user("3 4 1"), max_tokens=400, temperature=0,
                                           stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()  # gone after its first token
        # the batcher answers one call at a time: this reply comes after the abandoned call has ended
        after = c.chat.completions.create(model="tiny", messages=user("hi"), max_tokens=2, temperature=0)
    assert after.choices[0].message.content
    forwards = slow.calls - before - 3  # the short request: its prefill and one decode step (and a spare)
    assert forwards < 100, f"the abandoned request ran {forwards} of its 400 steps"


def test_live_text_holds_back_what_a_stop_string_may_claim():
    from esopt.serve.streaming import LiveText

    def decode(ids):
        return "".join(chr(i) for i in ids)

    row = LiveText(decode, {0}, max_tokens=100, stop=("END",))
    sent = [row.add(ord(ch)) for ch in "abEN"]
    assert "".join(sent) == "ab"  # "EN" may be the start of "END"
    assert row.add(ord("x")) == "E"  # "ENx": "E" is safe now, "Nx" may still start "END"
    row = LiveText(decode, {0}, max_tokens=100, stop=("END",))
    out = "".join(row.add(ord(ch)) for ch in "abENDcd")
    assert out == "ab" and row.closed  # nothing from the stop string on
    assert row.finish("ab") == ""
    row = LiveText(decode, {0}, max_tokens=3)
    assert "".join(row.add(ord(ch)) for ch in "abcdef") == "abc"  # its max_tokens
    row = LiveText(decode, {0}, max_tokens=9)
    assert "".join(row.add(t) for t in [ord("a"), 0, ord("b")]) == "a"  # nothing after EOS
    row = LiveText(lambda ids: "x\ufffd" if len(ids) == 1 else "x\u00e9", {0}, max_tokens=9)
    assert row.add(1) == "x" and row.add(2) == "\u00e9"  # an incomplete character waits for its bytes
    assert row.finish("x\u00e9!") == "!"


def test_text_pieces_join_to_the_text():
    from esopt.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    ids = tok("hello world", add_special_tokens=False)["input_ids"]
    pieces = text_pieces(ids, decode(ids), decode)
    assert "".join(p for p, _ in pieces) == "hello world" and len(pieces) == len(ids)
    assert sum(k for _, k in pieces) == len(ids)
    cut = text_pieces(ids, "hello w", decode)  # a stop string cut the text short
    assert "".join(p for p, _ in cut) == "hello w"


# --- n, seed, stop, logprobs ----------------------------------------------------------------------------

def test_n_sampled_choices_and_seed(client):
    kwargs = dict(model="tiny", messages=user("2 2"), max_tokens=8, temperature=1.0, n=3)
    a = client.chat.completions.create(**kwargs, seed=7)
    b = client.chat.completions.create(**kwargs, seed=7)
    c = client.chat.completions.create(**kwargs, seed=8)
    texts = [ch.message.content for ch in a.choices]
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert texts == [ch.message.content for ch in b.choices]  # same seed, same choices
    assert len(set(texts)) > 1  # sampled rows differ
    assert texts != [ch.message.content for ch in c.choices]
    assert 3 <= a.usage.completion_tokens <= 3 * 8
    greedy = client.chat.completions.create(model="tiny", messages=user("2 2"), max_tokens=6, temperature=0, n=2)
    assert len(greedy.choices) == 2 and greedy.choices[0].message.content == greedy.choices[1].message.content


def test_a_seeded_request_is_not_changed_by_concurrent_ones(server):
    base, _, _ = server
    kwargs = dict(model="tiny", messages=user("6 1"), max_tokens=8, temperature=1.0, n=2, seed=11)
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as c:
        alone = [ch.message.content for ch in c.chat.completions.create(**kwargs).choices]
        with ThreadPoolExecutor(8) as pool:  # sampled neighbours with the same settings, arriving together
            others = [pool.submit(c.chat.completions.create, model="tiny", messages=user(f"n{i}"), max_tokens=8,
                                  temperature=1.0, seed=None if i % 2 else 11) for i in range(6)]
            mine = pool.submit(c.chat.completions.create, **kwargs)
            [f.result() for f in others]
            assert [ch.message.content for ch in mine.result().choices] == alone


def test_a_vanishing_temperature_is_greedy(client):
    greedy = client.chat.completions.create(model="tiny", messages=user("8 8"), max_tokens=6, temperature=0)
    tiny = client.chat.completions.create(model="tiny", messages=user("8 8"), max_tokens=6, temperature=5e-324)
    assert tiny.choices[0].message.content == greedy.choices[0].message.content  # found by the fuzz: was a 500


def test_streamed_chat_with_n_choices(client):
    kwargs = dict(model="tiny", messages=user("1 1"), max_tokens=6, temperature=1.0, n=3, seed=5)
    plain = client.chat.completions.create(**kwargs)
    texts = {}
    for c in client.chat.completions.create(**kwargs, stream=True):
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    assert texts == {ch.index: ch.message.content for ch in plain.choices}  # seeded: the same rows


def test_stop_strings_cut_the_reply(client, server):
    _, _, policy = server
    full = client.chat.completions.create(model="tiny", messages=user("7 7 7"), max_tokens=16, temperature=0)
    text = full.choices[0].message.content
    stop = text[5:7]
    cut = client.chat.completions.create(model="tiny", messages=user("7 7 7"), max_tokens=16, temperature=0,
                                         stop=[stop])
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    want = policy.generate([policy.build_prompt(user("7 7 7"))], SamplingParams(0, 1, 0, 16, (stop,)))[0]
    assert cut.choices[0].message.content == want.text
    assert cut.usage.completion_tokens == len(want.token_ids)


def test_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=user("5 1"), max_tokens=6, temperature=0,
                                       logprobs=True)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(t.logprob <= 0 for t in content)
    c = client.completions.create(model="tiny", prompt="5 1", max_tokens=6, temperature=0, logprobs=0)
    assert "".join(c.choices[0].logprobs.tokens) == c.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=user("x"), logprobs=True, top_logprobs=3)


def test_streamed_logprobs_are_the_unstreamed_ones_token_for_token(client):
    """Each streamed chunk carries the log-probs of its own tokens, not of the completion's first ones."""
    kw = {"model": "tiny", "max_tokens": 8, "temperature": 0}
    whole = client.chat.completions.create(messages=user("5 1"), logprobs=True, **kw).choices[0].logprobs.content
    streamed = [t for ch in client.chat.completions.create(messages=user("5 1"), logprobs=True, stream=True, **kw)
                if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole]
    assert len({t.logprob for t in whole}) > 1  # distinct values, so a shifted stream would show
    text = client.completions.create(prompt="5 1", logprobs=0, **kw).choices[0].logprobs
    chunks = [ch.choices[0].logprobs for ch in client.completions.create(prompt="5 1", logprobs=0, stream=True, **kw)
              if ch.choices and ch.choices[0].logprobs]
    assert [x for lp in chunks for x in lp.token_logprobs] == text.token_logprobs


def test_completions_endpoint(client, server):
    _, _, policy = server
    one = client.completions.create(model="tiny", prompt="9 8 7", max_tokens=7, temperature=0)
    want = policy.generate(["9 8 7"], SamplingParams(0, 1, 0, 7))[0]
    assert one.object == "text_completion" and one.choices[0].text == want.text  # raw text: no chat template
    many = client.completions.create(model="tiny", prompt=["9 8 7", "x", "hello"], max_tokens=3, temperature=0)
    assert [ch.index for ch in many.choices] == [0, 1, 2] and many.choices[0].text == want.text[: len(
        many.choices[0].text)]
    assert many.usage.prompt_tokens == 5 + 1 + 5
    with pytest.raises(openai.BadRequestError, match="token-id"):
        client.completions.create(model="tiny", prompt=[1, 2, 3])


# --- errors ------------------------------------------------------------------------------------------------

def test_unknown_model_is_a_404_in_openai_shape(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=user("x"))
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    status, text = post(f"{server[0]}/no/such/route", {})
    assert status == 404 and assert_error_shape(text, status)["code"] == "not_found"


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": user("x"), "temperature": 9}, "temperature"),
    ({"messages": user("x"), "top_p": 0}, "top_p"),
    ({"messages": user("x"), "n": 0}, "n"),
    ({"messages": user("x"), "max_tokens": 0}, "max_tokens"),
    ({"messages": user("x"), "stop": [""]}, "stop"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages.0.content"),
    ({"messages": user("\ud800")}, "messages"),  # a lone surrogate: the tokenizer cannot encode it
])
def test_bad_requests_are_400_in_openai_shape(server, body, param):
    status, text = post(f"{server[0]}/chat/completions", body)
    assert status == 400
    assert assert_error_shape(text, status)["param"] == param


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'{"messages": [{"role": "user", "content": "x"}], '
                                                                 b'"temperature": NaN}'])
def test_malformed_bodies_are_400(server, raw):
    status, text = post(f"{server[0]}/chat/completions", raw, raw=True)
    assert status == 400
    assert_error_shape(text, status)


def test_client_sees_a_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=user("x"), temperature=5)
    assert e.value.body["param"] == "temperature" and e.value.body["type"] == "invalid_request_error"


def test_prompt_over_the_context_length_is_a_clear_400(client, server):
    _, app, _ = server
    ctx = app.state.context_length
    assert ctx == 512  # the tiny Llama's position table
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=user("x" * 600))
    assert e.value.body["code"] == "context_length_exceeded" and "512" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # fits alone, not with the asked completion
        client.chat.completions.create(model="tiny", messages=user("x" * 400), max_tokens=200)
    assert e.value.body["code"] == "context_length_exceeded"
    # no max_tokens asked: the default is clipped to what fits
    ok = client.completions.create(model="tiny", prompt="x" * 508, max_tokens=None, temperature=0)
    assert ok.usage.completion_tokens <= 4


# --- batching and routing ------------------------------------------------------------------------------------

def test_concurrent_requests_share_batched_generate_calls(server):
    base, app, policy = server
    prompts = [f"q{i}: {i * 5 % 7} {'y' * (i % 3)}" for i in range(8)]
    alone = [PolicyReflector(policy, max_new_tokens=6).complete(user(p)) for p in prompts]  # greedy, one by one
    assert len(set(alone)) >= 6  # the replies tell the prompts apart, so a misrouted one would show
    before = app.state.batcher.batches
    reflector = HTTPReflector(base, model="tiny", max_tokens=6, timeout_s=30, log=lambda m: None)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda p: reflector.complete(user(p)), prompts))
    assert replies == alone  # each request got its own prompt's answer
    assert app.state.batcher.batches - before <= 8


class EchoPolicy:
    """generate() answers each prompt with its own text reversed (so every row's owner is visible) and records
    the calls."""

    def __init__(self):
        from esopt.models.tiny import build_char_tokenizer

        self.tokenizer, self.calls = build_char_tokenizer(), []

    def generate(self, prompts, sampling, seed=None, return_logprobs=False):
        from esopt.engines.base import Completion

        self.calls.append((list(prompts), sampling.max_new_tokens))
        out = []
        for p in prompts:
            text = p[::-1][: sampling.max_new_tokens]
            out.append(Completion([0], self.tokenizer(text, add_special_tokens=False)["input_ids"], text))
        return out


def test_requests_waiting_together_share_one_call_and_each_gets_its_own_rows():
    """The batcher itself, deterministically: jobs already queued when it collects are answered by one
    `generate` call (or max_batch-row calls), each job's rows are its own, cut to its own max_tokens."""
    from esopt.serve.batcher import Batcher

    async def scenario(max_batch):
        policy = EchoPolicy()
        batcher = Batcher(policy, max_batch=max_batch, wait_s=0.0)
        jobs = [("abcdef", 6, 1), ("ghijkl", 2, 1), ("mnopqr", 4, 2), ("stuvwx", 5, 1)]  # prompt, max_tokens, n
        futures = [batcher.enqueue([p], SamplingParams(0, 1, 0, k), None, n) for p, k, n in jobs]
        while not all(f.done() for f in futures):
            await batcher._answer(await batcher._collect())
        replies = [[c.completion.text for c in f.result()] for f in futures]
        return policy.calls, replies

    want = [["fedcba"], ["lk"], ["rqpo", "rqpo"], ["xwvut"]]  # reversed prompt, cut to the job's max_tokens
    calls, replies = asyncio.run(scenario(max_batch=32))
    assert replies == want
    # max_tokens 6, 4, 5 share a power-of-two range (4-7) and one call, run to the longest; 2 gets its own
    assert calls == [(["abcdef", "mnopqr", "mnopqr", "stuvwx"], 6), (["ghijkl"], 2)]
    calls, replies = asyncio.run(scenario(max_batch=3))
    assert replies == want
    # the first collect stops at 4 >= 3 rows (stuvwx waits for the next); no call holds more than 3 rows
    assert calls == [(["abcdef", "mnopqr", "mnopqr"], 6), (["ghijkl"], 2), (["stuvwx"], 5)]


def test_a_call_never_exceeds_max_batch_and_seeded_sampled_requests_run_alone():
    """Jobs of one key that a collect took together are split when they would exceed `max_batch` rows; a
    seeded sampled request always gets its own call (its rows must not depend on who else is waiting)."""
    from esopt.serve.batcher import Batcher

    async def scenario(jobs, max_batch):
        policy = EchoPolicy()
        batcher = Batcher(policy, max_batch=max_batch, wait_s=0.0)
        futures = [batcher.enqueue([p], sampling, seed, n) for p, sampling, seed, n in jobs]
        while not all(f.done() for f in futures):
            await batcher._answer(await batcher._collect())
        return policy.calls, [[c.completion.text for c in f.result()] for f in futures]

    greedy = SamplingParams(0, 1, 0, 2)
    calls, replies = asyncio.run(scenario([("ab", greedy, None, 1), ("cd", greedy, None, 2)], max_batch=2))
    assert calls == [(["ab"], 2), (["cd", "cd"], 2)] and replies == [["ba"], ["dc", "dc"]]
    sampled = SamplingParams(0.7, 1, 0, 2)
    calls, _ = asyncio.run(scenario([("ab", sampled, 1, 1), ("cd", sampled, 2, 1), ("ef", sampled, 1, 1)], 32))
    assert sorted(calls) == [(["ab"], 2), (["cd"], 2), (["ef"], 2)]


def test_64_concurrent_streaming_clients_each_get_their_own_answer(server):
    base, app, _ = server
    prompts = [f"client {i}: {i * 7 % 13} {'x' * (i % 5)}" for i in range(64)]
    alone = {}
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as sync:
        for p in prompts:  # one at a time: the answer each prompt gets alone
            alone[p] = sync.chat.completions.create(model="tiny", messages=user(p), max_tokens=6,
                                                    temperature=0).choices[0].message.content
    assert len(set(alone.values())) > 32  # the replies tell the prompts apart

    async def one(c, p):
        stream = await c.chat.completions.create(model="tiny", messages=user(p), max_tokens=6, temperature=0,
                                                 stream=True)
        return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])

    async def all_clients():
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120) as c:
            return await asyncio.gather(*(one(c, p) for p in prompts))

    before, rows_before = app.state.batcher.batches, app.state.batcher.rows
    got = asyncio.run(all_clients())
    calls = app.state.batcher.batches - before
    assert app.state.batcher.rows - rows_before == 64
    assert calls <= 16, f"{calls} generate calls for 64 concurrent clients"
    assert got == [alone[p] for p in prompts]  # nobody got someone else's answer


def test_http_reflector_matches_the_policy_reflector(server):
    base, _, policy = server
    messages = [{"role": "system", "content": "You play Sudoku."}, {"role": "user", "content": "2 .4.2"}]
    http_text = HTTPReflector(base, max_tokens=6, log=lambda m: None).complete(messages)
    assert http_text == PolicyReflector(policy, max_new_tokens=6).complete(messages)  # greedy: same text


# --- the prompt program -----------------------------------------------------------------------------------

def test_the_prompt_program_is_put_before_conversations_without_a_system_message(server):
    _, _, policy = server
    program = ServedPrompt(system="You play Sudoku.", examples=(("1 2", "row 1 col 2 = 3"),), stop=("\n",))
    running = start_in_thread(build_app(policy, "agent", program=program, wait_s=0.01))
    try:
        with openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0) as c:
            got = c.chat.completions.create(model="agent", messages=user("4 4"), max_tokens=12, temperature=0)
            own = c.chat.completions.create(model="agent", max_tokens=12, temperature=0,
                                            messages=[{"role": "system", "content": "other"}, *user("4 4")])
    finally:
        running.stop()
    with_program = policy.build_prompt(program.preamble() + user("4 4"))
    assert "row 1 col 2 = 3" in with_program  # the worked exchange is in the prompt (the tiny template drops
    want = policy.generate([with_program], SamplingParams(0, 1, 0, 12, ("\n",)))[0]  # system messages)
    assert got.choices[0].message.content == want.text
    assert got.usage.prompt_tokens == len(want.prompt_ids)
    bare = policy.generate([policy.build_prompt([{"role": "system", "content": "other"}, *user("4 4")])],
                           SamplingParams(0, 1, 0, 12))[0]
    assert own.choices[0].message.content == bare.text  # the client's own system message: no program


def test_load_prompt_program_from_a_run_dir(tmp_path):
    from esopt.train.config import build_config, dump_config

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    config = build_config({"env": {"id": "esopt/Sudoku-v0", "kwargs": {"size": 4, "h_star": 3}, "few_shot": 2},
                           "sampling": {"stop": ["Observation:"]}})
    dump_config(config, run / "config.yaml")
    program = load_prompt_program(run / "final")
    assert program is not None and program.system  # the env's own instructions (no prompt.json)
    assert len(program.examples) == 2 and program.stop[0] == "Observation:"
    (run / "final" / "prompt.json").write_text(json.dumps({"system": "co-evolved\n\nSkills:\n- be brief",
                                                           "version": 3}))
    program = load_prompt_program(run / "final")
    assert program.system.startswith("co-evolved") and len(program.examples) == 2
    assert load_prompt_program(tmp_path / "nothing") is None
    lone = tmp_path / "model"
    lone.mkdir()
    (lone / "prompt.json").write_text(json.dumps({"system": "hi"}))
    assert load_prompt_program(lone) == ServedPrompt("hi", (), (), str(lone / "prompt.json"))


# --- fuzzing -------------------------------------------------------------------------------------------

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
_part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | _junk},
                              optional={"text": st.text(max_size=20) | _junk})
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | _junk},
    optional={"content": st.text(max_size=30) | st.lists(_part, max_size=2) | _junk, "name": st.text(max_size=5)})
_tokens = st.integers(-2, 6) | st.integers(600, 10**9) | _junk  # valid ones stay short; long ones overflow
_wild = st.fixed_dictionaries({}, optional={  # anything goes: nearly always a 400
    "model": st.sampled_from(["tiny", "default", "nope"]) | _junk,
    "messages": st.lists(_message, max_size=3) | _junk,
    "prompt": st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=3) | _junk,
    "max_tokens": _tokens, "max_completion_tokens": _tokens,
    "n": st.integers(-1, 3) | st.integers(129, 10**6) | _junk,
    "temperature": st.floats(-1, 3) | _junk, "top_p": st.floats(-0.5, 1.5) | _junk,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5) | _junk,
    "seed": st.integers(-(2**70), 2**70) | _junk, "stream": st.booleans() | _junk,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | _junk}) | _junk,
    "logprobs": st.booleans() | st.integers(-1, 6) | _junk, "top_logprobs": st.integers(-1, 21) | _junk,
    "echo": st.booleans() | _junk, "suffix": st.text(max_size=3) | _junk, "best_of": st.integers(-1, 3) | _junk,
})
_stop = st.text(min_size=1, max_size=3)
_common = {"model": st.sampled_from(["tiny", "default"]), "max_tokens": st.integers(1, 6), "n": st.integers(1, 3),
           "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "stop": _stop | st.lists(_stop, max_size=3),
           "seed": st.integers(-(2**63), 2**63), "stream": st.booleans(),
           "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})}
_valid = {  # bodies the server must answer (200), which a field of junk then spoils
    "chat/completions": st.fixed_dictionaries(
        {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user",
                                                                                 "assistant", "tool"]),
                                                      "content": st.text(max_size=30)}), min_size=1, max_size=3)},
        optional={**_common, "logprobs": st.booleans(), "max_completion_tokens": st.integers(1, 6)}),
    "completions": st.fixed_dictionaries(
        {"prompt": st.text(min_size=1, max_size=30) | st.lists(st.text(min_size=1, max_size=10), min_size=1,
                                                                max_size=3)},
        optional={**_common, "echo": st.booleans(), "logprobs": st.just(0)}),
}
_fields = sorted({*_common, "messages", "prompt", "logprobs", "echo", "max_completion_tokens", "top_logprobs"})


@st.composite
def _requests(draw):
    route = draw(st.sampled_from(sorted(_valid)))
    kind = draw(st.sampled_from(["valid", "spoiled", "wild", "junk"]))
    if kind == "wild":
        return route, kind, draw(_wild)
    if kind == "junk":
        return route, kind, draw(_junk)
    body = draw(_valid[route])
    if kind == "spoiled":
        body[draw(st.sampled_from(_fields))] = draw(_junk)
    return route, kind, body


@settings(derandomize=True, max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=_requests())
def test_fuzzed_bodies_never_give_a_500(server, request):
    route, kind, body = request
    status, text = post(f"{server[0]}/{route}", json.dumps(body).encode(), raw=True)
    assert status in (200, 400, 404), (status, text)
    if kind == "valid":
        assert status == 200, text
    if status != 200:
        assert_error_shape(text, status)
    elif text.startswith("data: "):  # streamed
        assert text.endswith("data: [DONE]\n\n") and "server_error" not in text
    else:
        assert json.loads(text)["choices"]


# --- the HTTP reflector against bad endpoints -----------------------------------------------------------------

class _Bad(http.server.BaseHTTPRequestHandler):
    mode = "500"
    requests = 0

    def do_POST(self):  # noqa: N802
        type(self).requests += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "slow":
            time.sleep(2)
        if self.mode == "500":
            self.send_response(500)
            self.end_headers()
            return
        try:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{not json" if self.mode == "garbage" else b'{"choices": []}')
        except BrokenPipeError:  # the client timed out first ("slow")
            pass

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("mode, why", [("500", "HTTP 500"), ("garbage", "malformed reply"),
                                       ("empty", "malformed reply"), ("slow", "no reply")])
def test_failing_endpoints_log_and_return_none(mode, why):
    handler = type("Handler", (_Bad,), {"mode": mode})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    logs = []
    try:
        reflector = HTTPReflector(f"http://127.0.0.1:{srv.server_port}/v1", timeout_s=0.5, retries=1,
                                  log=logs.append)
        assert reflector.complete([{"role": "user", "content": "x"}]) is None
    finally:
        srv.shutdown()
    assert len(logs) == 1 and why in logs[0] and "current prompt stays" in logs[0]
    if mode in ("500", "slow"):  # transient: the client retried (retries=1), so the server saw two requests
        assert handler.requests == 2


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_KEY"):
        HTTPReflector("http://127.0.0.1:9/v1", api_key_env="NO_SUCH_KEY")


def test_serve_benchmark_reports_first_token_before_the_whole_reply(capsys):
    """`esopt bench serve`: every level's row, time to first token measured on the streams and below the
    total latency (the server streams as it decodes)."""
    from esopt.experiments.serve_throughput import main as bench

    assert bench(["--model", "tiny", "--clients", "1", "3", "--requests", "6", "--max-tokens", "24",
                  "--threads", "1"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split("|")[1].strip() for ln in lines] == ["1", "3"]
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        requests, first, total = int(cells[1]), float(cells[5]), float(cells[7])
        assert requests == 6 and 0 < first < total, ln
