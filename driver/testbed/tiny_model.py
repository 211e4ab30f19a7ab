"""Our test model: a tiny LlamaForCausalLM config and a byte-level BPE tokenizer trained here, offline.

vLLM serves it with `--load-format dummy` (random weights), so there are no weights to ship:
outputs are random text, and lengths are set with `max_tokens` + `ignore_eos`. The tokenizer is
trained on the workload catalog's prompts, tasks and tool schemas only (about 3.2 characters a token on catalog text),
so that it is the same on every machine whatever else is on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# 2 layers × 2 KV heads × 64 dims × (K, V) × 2 bytes = 1,024 bytes of KV per token.
MODEL_SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)
KV_BYTES_PER_TOKEN = 2 * 2 * 64 * 2 * 2


def training_texts() -> list[str]:
    """Text for the tokenizer: the catalog's system prompts and tasks and its tools' schemas (nothing read from disk:
    a tokenizer trained on the repository's files or installed packages changed with them, and with it every token
    count a test sizes its prompts by)."""
    from pipelines.agent_tools import TOOLS
    from pipelines.catalog import APPS

    texts = [r.system_prompt for a in APPS.values() for r in a.roles.values()]
    return texts + [t for a in APPS.values() for t in a.tasks] + [json.dumps(t.schema()) for t in TOOLS.values()]


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def build_tiny_model(out: str | Path, max_position_embeddings: int = 4096) -> Path:
    """Write config.json, tokenizer files and generation_config.json into `out`; returns `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(training_texts())
    tokenizer.save(str(out / "tokenizer.json"))
    ids = {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}
    _write(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|pad|>",
            "unk_token": None,
            "model_max_length": max_position_embeddings,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write(
        out / "special_tokens_map.json",
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"},
    )
    token_ids = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
    }
    _write(
        out / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": VOCAB_SIZE,
            **MODEL_SHAPE,
            "hidden_act": "silu",
            "max_position_embeddings": max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            **token_ids,
        },
    )
    _write(out / "generation_config.json", token_ids)
    return out


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    import sys

    print(build_tiny_model(sys.argv[1]))
