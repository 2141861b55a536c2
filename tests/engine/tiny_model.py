"""A tiny Llama-architecture model directory that SGLang serves with `--load-format dummy` (random
weights, nothing downloaded): 2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 32, and a byte-level
BPE tokenizer trained here with `<|im_start|>`/`<|im_end|>` chat specials.

Two layouts of the chat template, both read by SGLang through transformers: inside
`tokenizer_config.json` (`chat_template` key, the older layout) or in `chat_template.jinja` beside it
(the layout current Hugging Face repositories use; transformers prefers it).

Only `tokenizers` is needed (a test dependency): `tokenizer_config.json` is written by hand with the
fields `PreTrainedTokenizerFast` reads.
"""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# enough distinct words that prompts of a few hundred tokens are easy to write
_CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3,
           "You are the billing assistant of a bank. Policy: every clause applies to every account. ",
           "user assistant system What is the capital of France? Paris is the capital of France.",
           "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ !?.,;:'\"-_()[]{}"] * 50


def write(out: str, *, template_file: bool = False, context: int = 4096) -> str:
    """Write the model directory `out`; returns it."""
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    bos, eos = tok.token_to_id(SPECIALS[0]), tok.token_to_id(SPECIALS[1])
    cfg: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
        "pad_token": SPECIALS[1], "model_max_length": context, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(tok.token_to_id(s)): {"content": s, "special": True, "lstrip": False,
                                                           "rstrip": False, "normalized": False,
                                                           "single_word": False} for s in SPECIALS},
    }
    if template_file:
        with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as fh:
            fh.write(TEMPLATE)
    else:
        cfg["chat_template"] = TEMPLATE
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, indent=1)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024,
              "max_position_embeddings": context, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": bos, "eos_token_id": eos,
              "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False}
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=1)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"bos_token_id": bos, "eos_token_id": eos}, fh)
    return out
