"""A tiny Llama with a character tokenizer, built entirely in code (no downloads).

The tokenizer covers printable ASCII (32..126) and "\\n", one token per character, plus `<pad>`,
`<bos>`, `<eos>`, `<unk>`. Its chat template drops system messages (the model is too small to follow
instructions) and renders a conversation as ``obs + "\\n>" + action + <eos> + obs + "\\n>" ...``, so the
markov prompt for an observation is just ``obs + "\\n>"``.

The default model (4 layers, width 128, 4 heads, MLP 512) has ~1.06M parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

# user turn: content + "\n"; assistant turn: ">" + content + eos; generation prompt: ">"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ message['content'] }}{{ '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ '>' }}{{ message['content'] }}{{ eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '>' }}{%- endif -%}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer; decode(encode(s)) == s for printable ASCII and newlines."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # every character becomes its own pre-token (newlines included), so WordLevel maps chars 1:1
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        padding_side="left",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass
class TinyConfig:
    """Shape of the tiny Llama."""

    n_layers: int = 4  # transformer blocks
    d_model: int = 128  # residual width
    n_heads: int = 4  # attention heads (head dim = d_model / n_heads)
    d_mlp: int = 512  # SwiGLU hidden width
    max_positions: int = 512  # longest sequence (prompt + generation)

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


def build_tiny_model(
    cfg: TinyConfig | None = None, seed: int = 0
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A freshly initialised tiny Llama and its char tokenizer; same seed => same weights.

    The caller's global torch RNG is left untouched.
    """
    cfg = cfg or TinyConfig()
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.02,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    gc = model.generation_config
    gc.pad_token_id = tokenizer.pad_token_id
    gc.bos_token_id = tokenizer.bos_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer
