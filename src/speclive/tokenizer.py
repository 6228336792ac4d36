"""Thin wrapper over a Hugging Face tokenizer: one tokenizer layer for every backend.

Both backends use the same (HF) tokenizer for a model, so token ids are identical across
backends and outputs can be compared token by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Tokenizer:
    def __init__(self, hf: Any):
        self.hf = hf
        self.vocab_size = len(hf)
        eos: set[int] = set()
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        # chat models end a turn with a special token that is not always the declared EOS
        for tok in ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>"):
            tid = hf.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != hf.unk_token_id and tid >= 0:
                eos.add(tid)
        self.eos_ids = eos

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template."""
        if not self.has_chat_template:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            if add_generation_prompt:
                text += "assistant:"
            return self.encode(text, add_special_tokens=True)
        out = self.hf.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return [int(t) for t in out]
