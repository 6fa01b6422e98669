"""`esopt serve` on loopback with the tiny model, and the HTTP reflector against it and against endpoints
that fail, hang or answer garbage."""

import http.server
import json
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from esopt.prompt.reflector import HTTPReflector, PolicyReflector  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    from esopt.policies import load_policy
    from esopt.serve import build_app

    policy = load_policy("tiny")
    app = build_app(policy, "tiny", system_prompt="You play Sudoku.", wait_s=0.05)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", app, policy
    srv.should_exit = True
    thread.join(timeout=10)


def test_models_and_chat_completion(server):
    base, app, _ = server
    models = json.loads(urllib.request.urlopen(f"{base}/models", timeout=10).read())
    assert models["data"][0]["id"] == "tiny"
    body = json.dumps({"messages": [{"role": "user", "content": "1 12.4"}], "max_tokens": 5, "seed": 1}).encode()
    req = urllib.request.Request(f"{base}/chat/completions", data=body, headers={"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(req, timeout=30).read())
    assert reply["object"] == "chat.completion" and isinstance(reply["choices"][0]["message"]["content"], str)
    assert 1 <= reply["usage"]["completion_tokens"] <= 5


def test_concurrent_requests_share_batched_generate_calls(server):
    base, app, _ = server
    before = app.state.batcher.batches
    reflector = HTTPReflector(base, model="tiny", max_tokens=4, timeout_s=30, log=lambda m: None)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: reflector.complete([{"role": "user", "content": f"q{i}"}]), range(8)))
    assert all(isinstance(r, str) for r in replies)
    assert app.state.batcher.batches - before < 8  # some requests were answered together


def test_http_reflector_matches_the_policy_reflector(server):
    base, _, policy = server
    messages = [{"role": "system", "content": "You play Sudoku."}, {"role": "user", "content": "2 .4.2"}]
    http_text = HTTPReflector(base, max_tokens=6, log=lambda m: None).complete(messages)
    assert http_text == PolicyReflector(policy, max_new_tokens=6).complete(messages)  # greedy: same text


class _Bad(http.server.BaseHTTPRequestHandler):
    mode = "500"

    def do_POST(self):  # noqa: N802
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
                                  backoff_s=0.01, log=logs.append)
        assert reflector.complete([{"role": "user", "content": "x"}]) is None
    finally:
        srv.shutdown()
    assert len(logs) == 3 and all(why in m for m in logs[:2]) and "current prompt stays" in logs[-1]


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_KEY"):
        HTTPReflector("http://127.0.0.1:9/v1", api_key_env="NO_SUCH_KEY")
