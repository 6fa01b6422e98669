"""ReAct tool use: the call protocol, the Python sandbox, answer checking, the math and document-QA envs,
scripted oracle policies through the tools, and ES training on both envs from their smoke configs."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esopt.engines.base import Completion, SamplingParams
from esopt.engines.hf import HFEngine
from esopt.envs import DOCQA_ID, MATH_ID, check_env, make_env
from esopt.envs.docqa import ocr_lines, page_lines, parse_amount
from esopt.envs.tools import Answer, Malformed, Tool, ToolCall, make_tool, parse_turn
from esopt.envs.tools.answers import anls, exact_match, math_equal
from esopt.rollout import run_episodes

SUM = Tool(
    "add",
    "add two numbers",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}, "required": ["a", "b"]},
    lambda a, b: str(a + b),
)
ECHO = Tool("echo", "echo text", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            lambda text: text)
TOOLS = {"add": SUM, "echo": ECHO}


# -- protocol
@pytest.mark.parametrize("text, expected", [
    ("Thought: hi\n<echo>hello world</echo>", ToolCall("echo", {"text": "hello world"})),
    ("<echo>cut by a stop string", ToolCall("echo", {"text": "cut by a stop string"})),
    ('<add>{"a": 2, "b": 3.5}</add>', ToolCall("add", {"a": 2, "b": 3.5})),
    ("<add>2, 3.5</add>", ToolCall("add", {"a": 2, "b": 3.5})),
    ('<tool_call>{"name": "add", "arguments": {"a": "4", "b": 1}}</tool_call>', ToolCall("add", {"a": 4, "b": 1.0})),
    ("Thought: done\n<answer> 42 </answer>", Answer("42")),
    ('<tool_call>{"name": "answer", "arguments": {"answer": 7}}</tool_call>', Answer("7")),
    ("<answer>1</answer> then <echo>x</echo>", Answer("1")),  # the first of call or answer counts
    ("<b>bold</b> <echo>x</echo>", ToolCall("echo", {"text": "x"})),  # unknown tags are prose
])
def test_parse_turn_reads_calls_and_answers(text, expected):
    assert parse_turn(text, TOOLS) == expected


@pytest.mark.parametrize("text, reason", [
    ("just prose", "no tool call or answer"),
    ("<answer>   </answer>", "answer is empty"),
    ("<add>1, 2, 3</add>", "takes 2 inputs"),
    ("<add>one, 2</add>", "'a' must be an integer"),
    ("<add>2.5, 1</add>", "'a' must be an integer"),
    ('<add>{"a": 1}</add>', "missing input 'b'"),
    ('<add>{"a": 1, "b": 2, "c": 3}</add>', "unknown input 'c'"),
    ("<tool_call>{not json</tool_call>", "JSON object"),
    ('<add>{"a": ' + "[" * 5000 + "</add>", "not valid JSON"),
    ('<add>{"a": ' + "9" * 5000 + ', "b": 1}</add>', "not valid JSON"),
    ('<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5000 + "}}", "JSON object"),
    ('<tool_call>{"name": "rm"}</tool_call>', "unknown tool 'rm'"),
])
def test_parse_turn_explains_malformed_calls(text, reason):
    parsed = parse_turn(text, TOOLS)
    assert isinstance(parsed, Malformed) and reason in parsed.reason


FRAGMENTS = ["<echo>", "</echo>", "<add>", "</add>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "{", "}",
             '"name"', '"arguments"', ":", ",", "1", "-2.5e9", "nan", "\x00", "\n", "é", "'", '"', "[", "]", "null"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=20))
def test_fuzzed_replies_never_crash_the_parser_or_the_env(parts):
    text = "".join(parts)
    parsed = parse_turn(text, TOOLS)
    assert isinstance(parsed, (ToolCall, Answer, Malformed))
    if isinstance(parsed, ToolCall):
        assert set(parsed.arguments) <= set(TOOLS[parsed.name].parameters)
    if "<" not in text:  # every call and answer form is tagged: prose can only be malformed
        assert isinstance(parsed, Malformed)
    # whatever follows, a well-formed answer or call that comes first is the one read
    assert parse_turn("<answer>7</answer>" + text, TOOLS) == Answer("7")
    assert parse_turn("<echo>hi</echo>" + text, TOOLS) == ToolCall("echo", {"text": "hi"})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["<ocr>", "</ocr>", "<read>", "<find>", "x", "1, 2", "-5", "99", "{", '"page"', ":"]),
                max_size=10))
def test_fuzzed_replies_to_docqa_get_feedback(parts):
    env = make_env(DOCQA_ID, max_items=3)
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("".join(parts))  # unreadable pages never raise
    assert isinstance(obs, str) and info["action_is_valid"] in (True, False)
    # no fragment can answer, so the episode goes on unrewarded; an invalid reply is told so
    assert reward == 0.0 and not terminated and not truncated and not info["is_success"]
    if not info["action_is_valid"]:
        assert "invalid reply" in obs


# -- the python tool (the sandbox itself: tests/test_sandbox.py)
def test_python_tool_runs_code_and_reports_errors():
    python = make_tool("python", timeout=5)
    assert python.run(code="print(sum(range(10)))") == "45"
    assert python.run(code="1/0").splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert "no output" in python.run(code="x = 1")
    long = make_tool("python", max_output_bytes=100).run(code="print('y' * 5000)")
    assert len(long) <= 100 and "truncated" in long


# -- answers
@pytest.mark.parametrize(
    "answer, gold, same",
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("3/4", "0.75", True),
        (r"\frac{3}{4}", "0.75", True),
        (r"\boxed{12}", "12", True),
        ("1,234", "1234", True),
        ("x = 5", "5", True),
        ("288 apples", "288", True),
        ("-4", "−4", True),
        ("1e3", "1000", True),
        ("2*sqrt(2)", "sqrt(8)", True),
        ("6.32098837209", "6.320988372093023", True),
        ("0.3333", "1/3", False),
        ("8 - 4", "4", False),
        ("4", "-4", False),
        ("", "0", False),
        ("9^9^9^9", "1", False),
        ("__import__('os').system('true')", "0", False),
        ("abc", "12", False),
        ("3pi", "3", False),
        ("2 thousand", "2", False),
        (r"-\frac{3}{4}", "-0.75", True),
        (r"x = -\frac{1}{2}", "-1/2", True),
        (r"2\sqrt{2}", "2*sqrt(2)", True),
        ("2sqrt(2)", "2*sqrt(2)", True),
        ("9^9^9", "1", False),
        ("2^(10^20)", "1", False),
        ("9^((99999999))", "1", False),
        ("1e99999999", "1", False),
    ],
)
def test_math_answer_checking(answer, gold, same):
    assert math_equal(answer, gold) is same


def test_anls_and_exact_match():
    assert anls("ACME corp.", "Acme Corp") == 1.0 and exact_match(" acme corp ", ["Acme Corp"])
    assert anls("Acme Cop", "Acme Corp") == pytest.approx(1 - 1 / 9)
    assert anls("xyz", "Acme") == 0.0  # similarity under the 0.5 threshold scores 0
    assert anls("Notebook", ["Stapler", "Notebook"]) == 1.0 and not exact_match("Notebook!x", "Notebook")


# -- envs
@pytest.mark.parametrize("env_id", [MATH_ID, DOCQA_ID])
def test_tool_envs_keep_the_env_contract(env_id):
    env = make_env(env_id)
    check_env(env)
    assert env.reset(seed=9)[0] == env.reset(seed=9)[0]


def test_math_env_tasks_from_jsonl(tmp_path):
    data = tmp_path / "aime.jsonl"
    data.write_text('{"question": "What is 2+2?", "answer": 4}\n\n{"question": "Half of 1?", "answer": "1/2"}\n')
    env = make_env(MATH_ID, data_file=str(data))
    obs, _ = env.reset(seed=1)
    assert "Half of 1?" in obs
    info = env.step("<answer>0.5</answer>")[4]
    assert info["is_success"] and info["answer"] == "1/2"  # votes compare values: 0.5 and 1/2 agree
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        make_env(MATH_ID, data_file=str(bad))
    with pytest.raises(ValueError, match="unknown reasoning-gym task"):
        make_env(MATH_ID, tasks=["no_such_task"])


def test_math_env_turn_budget_and_feedback():
    env = make_env(MATH_ID, max_turns=2)
    env.reset(seed=4)
    obs, reward, terminated, truncated, info = env.step("I think it is big")
    assert not info["action_is_valid"] and "invalid reply" in obs and "last turn" in obs and not truncated
    obs, reward, terminated, truncated, info = env.step("<python>print(1)</python>")
    assert truncated and not terminated and reward == 0.0 and "Out of turns" in obs


def test_ocr_reads_the_rendered_page_back():
    from esopt.envs.docqa import make_document

    doc = make_document(5)
    truth = [x for x in page_lines(doc, 1) if x]
    read = ocr_lines(5, 8, 1)
    assert len(read) == len(truth)
    assert sum(anls(a, b) for a, b in zip(read, truth)) / len(truth) > 0.9


def test_docqa_tools_on_hand_cases():
    env = make_env(DOCQA_ID)
    env.reset(seed=5)
    doc = env.unwrapped.document
    number = dict(doc.fields)["Number"]
    obs = env.step("<find>number</find>")[0]
    assert re.search(rf"page 1 line 2: Number: {number}", obs)
    assert env.step("<read>1, 2, 3</read>")[0].startswith("Observation: 2: Number:")
    assert "does not exist" in env.step("<ocr>7</ocr>")[0]
    assert "no line contains" in env.step('<find>{"text": "zebra crossing"}</find>')[0]


class OraclePolicy:
    """Scripted: reads the question and the tools' observations in the prompt, and solves the task through
    the tools (never from the env's internals)."""

    model = None
    tokenizer = None

    def build_prompt(self, messages):
        return "\n".join(f"[{m['role']}] {m['content']}" for m in messages)

    def generate(self, prompts, sampling, seed=None, return_logprobs=False):
        return [Completion(prompt_ids=[1], token_ids=[1, 2], text=self.act(p.rsplit("[system]", 1)[-1]))
                for p in prompts]

    def act(self, prompt: str) -> str:
        episode = prompt.split("[user] ")[-(prompt.count("[user] ") - self.examples):]  # this episode only
        question = episode[0]
        observations = [m for m in episode[1:]]
        if "Calculate" in question:  # math: compute with Python, then answer what it printed
            if not observations:
                expr = re.search(r"Calculate (.*)\.", question).group(1)
                return f"Thought: compute.\n<python>print({expr})</python>"
            return f"<answer>{observations[-1].split('Observation: ')[1].split()[0]}</answer>"
        ask = re.search(r"Question: (.*)", question).group(1)
        if m := re.match(r"What is the (\w+) on", ask):
            if not observations:
                return f"<find>{m.group(1)}</find>"
            return f"<answer>{observations[-1].split(':', 3)[-1].strip().splitlines()[0]}</answer>"
        a, b = (re.search(r"amounts of (.+) and (.+)\?", ask) or re.search(r"amount: (.+) or (.+)\?", ask)).groups()
        if len(observations) < 2:
            return f"<find>{(a, b)[len(observations)]}</find>"
        amounts = [parse_amount(o.splitlines()[0]) for o in observations[-2:]]
        if ask.startswith("What is the sum"):
            return f"<answer>{amounts[0] + amounts[1]:,.2f}</answer>"
        return f"<answer>{a if amounts[0] > amounts[1] else b}</answer>"


@pytest.mark.parametrize("env_id, kwargs", [(MATH_ID, {"tasks": ["basic_arithmetic"]}), (DOCQA_ID, {"max_items": 6})])
def test_a_scripted_oracle_succeeds_through_the_tools(env_id, kwargs):
    policy = OraclePolicy()
    policy.examples = 0
    trajectories, _ = run_episodes(policy, lambda: make_env(env_id, **kwargs), list(range(12)),
                                   SamplingParams(0.0, 1.0, 0, 32), conversation="history")
    assert all(t.success for t in trajectories), [t.turns[-1].text for t in trajectories if not t.success]
    assert all(t.turns[0].info["tool"] for t in trajectories)  # every answer went through a tool


def test_tool_calls_of_a_batch_run_concurrently():
    """A slow tool in several episodes at once: the rollout engine steps them in threads."""
    live, peak, lock = [0], [0], threading.Lock()

    def slow(text: str) -> str:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.2)
        with lock:
            live[0] -= 1
        return text

    def make():
        env = make_env(MATH_ID)
        env.unwrapped.tools = {"echo": Tool("echo", "echo", ECHO.schema, slow)}
        return env

    class CallEcho(OraclePolicy):
        def generate(self, prompts, sampling, seed=None, return_logprobs=False):
            return [Completion(prompt_ids=[1], token_ids=[1], text="<echo>hi</echo>") for _ in prompts]

    run_episodes(CallEcho(), make, list(range(6)), SamplingParams(0.0, 1.0, 0, 8), max_turns=1)
    assert peak[0] > 1


def test_the_env_stop_strings_reach_the_policy():
    seen = []

    class Recorder(OraclePolicy):
        def generate(self, prompts, sampling, seed=None, return_logprobs=False):
            seen.append(sampling.stop)
            return [Completion(prompt_ids=[1], token_ids=[1], text="<answer>1</answer>") for _ in prompts]

    run_episodes(Recorder(), lambda: make_env(DOCQA_ID), [1], SamplingParams(0.0, 1.0, 0, 8, stop=("STOP",)))
    assert seen == [("STOP", "</ocr>", "</find>", "</read>", "</answer>", "</tool_call>")]


def test_episode_token_budget_truncates():
    class Chatty(OraclePolicy):
        def generate(self, prompts, sampling, seed=None, return_logprobs=False):
            return [Completion(prompt_ids=[1], token_ids=[1] * 10, text="<python>print(1)</python>") for _ in prompts]

    trajectories, _ = run_episodes(Chatty(), lambda: make_env(MATH_ID, max_turns=6), [1, 2],
                                   SamplingParams(0.0, 1.0, 0, 8), max_episode_tokens=25)
    assert [t.num_turns for t in trajectories] == [3, 3] and all(t.turns[-1].truncated for t in trajectories)


def test_config_of_another_env_does_not_inherit_sudoku_kwargs():
    from esopt.train.config import load_config

    assert load_config("smollm2_math").env.kwargs["max_turns"] == 4
    assert "size" not in load_config("smollm2_docqa").env.kwargs


# -- ES on both envs, from the shipped smoke configs
class GatedOracle(HFEngine):
    """The tiny model decides, the oracle writes: a turn gets the scripted oracle's reply when the model, after
    the prompt's last 64 tokens, puts more weight on token 5 than on token 6, and prose otherwise. A fresh tiny
    model alone scores 0 on every tool task (it answers ">>>>" to everything), so every ES update would be a
    zero no-op; here the perturbed weights change which turns the oracle gets, so members score differently
    and the updates are real. The rewards still come from the env's tools and answer checks (sandboxed
    python, OCR)."""

    examples = 2  # the smoke configs' few_shot

    def build_prompt(self, messages):
        return OraclePolicy.build_prompt(self, messages)

    @torch.no_grad()
    def takes_the_oracle(self, prompt: str) -> bool:
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"][-64:]
        logits = self.model(torch.tensor([ids])).logits[0, -1]
        return bool(logits[5] > logits[6])

    def generate(self, prompts, sampling, seed=None, return_logprobs=False, members=None):
        out = super().generate(prompts, sampling, seed, return_logprobs, members)
        return [dataclasses.replace(c, text=OraclePolicy.act(self, p.rsplit("[system]", 1)[-1])
                                    if self.takes_the_oracle(p) else "Thought: no idea.")
                for p, c in zip(prompts, out)]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["math_smoke", "docqa_smoke"])
def test_es_trains_on_the_tool_envs(config, tmp_path, monkeypatch, run_weights):
    import json

    import esopt.train.es as es_module
    from esopt.es import replay
    from esopt.train.config import load_config
    from esopt.train.es import train

    real_load = es_module.load_model

    def gated(section, env_kwargs=None):
        engine = real_load(section, env_kwargs)
        engine.__class__ = GatedOracle
        return engine

    monkeypatch.setattr(es_module, "load_model", gated)
    c = load_config(config)
    summary = train(c, tmp_path / "run", progress=False)
    ledger = [json.loads(x) for x in Path(tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert len(ledger) == 2 and summary["steps_done"] == 2
    assert any(len(set(r["rewards"])) > 1 for r in ledger), [r["rewards"] for r in ledger]  # members differ
    assert all(0 <= x <= 1 for r in ledger for x in r["rewards"]) and any(x > 0 for r in ledger for x in r["rewards"])
    assert any(w != 0 for r in ledger for w in r["weights"])  # so some update is not a zero no-op
    base = real_load(c.model, c.env.kwargs).model
    before = {k: v.clone() for k, v in base.state_dict().items()}
    replay(base, tmp_path / "run" / "history.jsonl")
    final = run_weights(tmp_path / "run")
    assert all(torch.equal(base.state_dict()[k], v) for k, v in final.items())  # the ledger's updates, bit-exact
    assert sum(not torch.equal(before[k], v) for k, v in final.items()) > 0  # and they moved the weights
    assert os.path.exists(tmp_path / "run" / "config.yaml")
