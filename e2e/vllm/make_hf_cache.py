"""Writes an offline Hugging Face cache in which ``facebook/opt-125m`` resolves without
the hub: the model's config.json (its public architecture values) and a small byte-level
BPE tokenizer generated here with the ``tokenizers`` library (vLLM's NIXL unit tests only
need the model name to resolve and prompts to tokenize; no weights are loaded).

Usage: python make_hf_cache.py HF_HOME
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = "facebook/opt-125m"
# Any fixed 40-hex id: the cache's refs/main points at this snapshot.
REVISION = "0" * 39 + "1"

# OPT-125m's architecture (config.json as published with the model).
CONFIG = {
    "_name_or_path": REPO,
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "enable_bias": True,
    "eos_token_id": 2,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "init_std": 0.02,
    "layer_norm_elementwise_affine": True,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3, as in OPT (bos = eos = 2)


def _corpus() -> list[str]:
    words = (
        "the quick brown fox jumps over lazy dog hello world prompt request token "
        "prefill decode cache block transfer read write lease expire abort finish "
        "red green blue one two three four five six seven eight nine ten"
    ).split()
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))] + [
        "".join(chr(c) for c in range(32, 127))
    ]


def main(hf_home: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    snap = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    files = snap / "snapshots" / REVISION
    files.mkdir(parents=True, exist_ok=True)
    (snap / "refs").mkdir(exist_ok=True)
    (snap / "refs" / "main").write_text(REVISION)

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.save(str(files / "tokenizer.json"))
    (files / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (files / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "</s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "model_max_length": 2048,
            },
            indent=2,
        )
    )
    (files / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})
    )
    (files / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1})
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
