"""`esopt serve MODEL`: an OpenAI-compatible endpoint for a model or a run's checkpoint.

Routes: `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/chat/completions`, `POST /v1/completions`,
`GET /health`, on FastAPI + uvicorn, bound to 127.0.0.1 unless told otherwise. Any OpenAI client works
against it (the official `openai` package is what the tests drive it with):

- `stream: true` answers with server-sent events (`chat.completion.chunk` / `text_completion` chunks,
  ending with `data: [DONE]`; `stream_options.include_usage` adds a last chunk with the usage), token by
  token as the batched `generate` call makes them: the first text arrives after the first decode step, not
  when the completion is done (text a stop string may still claim is held back until it cannot). A client
  that disconnects frees its rows at the next decode step. The streamed text always equals the text of the
  same request without streaming. Requests with `logprobs` are streamed from the finished answer (one chunk
  per decoded token, with its log-prob). `esopt bench serve` measures first-token and total latency.
- `n` choices (sampled rows of one batch), `stop` (at most 16 strings), `seed` (a seeded sampled request is
  generated in a call of its own, so the same request with the same seed gives the same choices),
  `temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `logprobs` (the chosen tokens' log-probs
  under the sampling temperature; `top_logprobs` > 0 is refused: the policy does not return the top
  alternatives). `/v1/completions` takes a prompt string or a list of them (token-id prompts are refused)
  and honours `echo`.
- Errors come in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a bad body
  (any JSON that does not validate, a prompt over the model's context length: `context_length_exceeded`),
  404 for an unknown model (`model_not_found`) or route. A model may be named by its served name (the spec
  given on the command line unless `--served-model-name`), the last part of its path, or `default` (what
  `HTTPReflector` sends); a request with no `model` gets the served one.
- Fields the server does not honour (tools, response_format, penalties, logit_bias, user) are ignored.

Requests that arrive together are answered by one batched `generate` call: the batch grows with load, which
is what a CPU's AMX units and a GPU need. Greedy requests share a call whatever their `stop` and with
`max_tokens` in the same power-of-two range (the call runs to the longest, every row is cut to its own
request's), unseeded sampled ones share a call per (temperature, top_p) as well; every row's answer is its
own prompt's. A temperature under 1e-5 is greedy decoding.

The prompt program: when MODEL is a run's `final/` (or `checkpoints/step_N/`), the agent is served the way
it was trained. Its system prompt (`final/prompt.json`, which holds the co-evolved system prompt with its
skills, else the run config's `env.system_prompt`, else the env's own instructions), the env's
`env.few_shot` worked exchanges (as chat turns) are put in front of every chat conversation that brings no
system message of its own, and the run's stop strings (its `sampling.stop` and the env's) apply to it unless
the request sets `stop`. `--no-prompt` serves the bare weights. `/v1/completions` is raw text: no program.

    esopt serve runs/demo/final --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}]}'

The package: `protocol.py` (request bodies, OpenAI-shaped errors, the response envelope), `prompt.py` (the
prompt program), `batcher.py` (batched generation), `served.py` (the served model and the request checks the
routes share), `chat.py` and `completions.py` (the two completion routes), `streaming.py` (server-sent
events), `app.py` (the FastAPI app, a server on a thread, `serve()`).
"""

from esopt.serve.app import RunningServer, build_app, serve, start_in_thread
from esopt.serve.batcher import Batcher, Choice
from esopt.serve.prompt import ServedPrompt, load_prompt_program, load_system_prompt
from esopt.serve.protocol import APIError, ChatRequest, CompletionRequest
from esopt.serve.served import context_length
from esopt.serve.streaming import text_pieces

__all__ = ["APIError", "Batcher", "ChatRequest", "Choice", "CompletionRequest", "RunningServer",
           "ServedPrompt", "build_app", "context_length", "load_prompt_program", "load_system_prompt",
           "serve", "start_in_thread", "text_pieces"]
