"""The tiny model the real servers serve, made here (no hub), and its reference answers.

``python model.py DIR`` writes, once (a ``.complete`` marker is written last):

* ``DIR/model/``: a ``transformers`` Llama (2 layers, hidden 256, 4 heads / 2 KV heads,
  head_dim 64, ~1.4 M parameters, fixed seed, weights ~N(0, 0.08)) and a byte-level BPE
  tokenizer trained on a few sentences (vocab ~440), both ``save_pretrained``;
* ``DIR/prompts.json``: prompts as exact token-id lists (100 tokens each, fixed seed), so
  that no tokenizer round trip can blur a comparison;
* ``DIR/reference.json``: for each prompt, the greedy continuation of ``transformers``
  ``generate`` (``MAX_TOKENS`` tokens): what a correct server answers, token for token.

Greedy decoding of random weights is deterministic; that is all a corruption check needs:
a request whose KV cache was overwritten by another request's answers differently from the
token where the bytes landed.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any, Dict, List

N_PROMPTS = 24
PROMPT_TOKENS = 100
MAX_TOKENS = 24
SEED = 0

_TEXT = [
    "kvfence decides when a page of the KV cache may be reused.",
    "A prefill engine computes the cache; a decode engine reads it and generates tokens.",
    "When a transfer outlives its lease, the pages it touches must not be handed out again.",
    "Time never releases a page: only proof that every transfer has drained does.",
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
    "Disaggregated serving splits prefill and decode across machines joined by RDMA or TCP.",
]


def make(out: str) -> None:
    """Builds the model, the prompts and the references under ``out`` (idempotent)."""
    if os.path.exists(os.path.join(out, ".complete")):
        return
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    mdir = os.path.join(out, "model")
    torch.manual_seed(SEED)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=440,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_TEXT * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    vocab = fast.vocab_size
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    model.eval()
    model.save_pretrained(mdir)
    fast.save_pretrained(mdir)

    rng = random.Random(SEED)
    special = {fast.bos_token_id, fast.eos_token_id}
    ids = [i for i in range(vocab) if i not in special]
    prompts: List[List[int]] = [
        [rng.choice(ids) for _ in range(PROMPT_TOKENS)] for _ in range(N_PROMPTS)
    ]
    refs: List[List[int]] = []
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p])
            y = model.generate(
                x,
                max_new_tokens=MAX_TOKENS,
                min_new_tokens=MAX_TOKENS,
                do_sample=False,
                pad_token_id=fast.eos_token_id,
            )
            refs.append(y[0, len(p) :].tolist())
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"max_tokens": MAX_TOKENS, "tokens": refs}, f)
    open(os.path.join(out, ".complete"), "w").close()


def load(out: str) -> Dict[str, Any]:
    """The prompts and references made by :func:`make`."""
    with open(os.path.join(out, "prompts.json")) as f:
        prompts = json.load(f)
    with open(os.path.join(out, "reference.json")) as f:
        ref = json.load(f)
    return {"model": os.path.join(out, "model"), "prompts": prompts, **ref}


if __name__ == "__main__":
    make(sys.argv[1])
    print(os.path.join(sys.argv[1], "model"))
