"""From conversation text to prompt token ids, and the token ids that end a reply.

With a chat template (when the tokenizer has one and it is enabled) each user turn and
each earlier answer is a chat message, rendered with `add_generation_prompt=True` and
`enable_thinking`; the rendered text already holds any BOS token, so it is tokenized
without adding special tokens. Without one, the turns and answers are joined with blank
lines as plain text and the tokenizer adds its usual special tokens.
"""

from __future__ import annotations

import torch

from dflash.errors import ConfigError

# End-of-turn markers of common chat formats (ChatML, Llama 3, Gemma, Phi-3).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


class PromptBuilder:
    """Turns a conversation (alternating user turns and answers) into prompt ids."""

    def __init__(self, tokenizer, use_chat_template: bool = True, enable_thinking: bool = False):
        self.tokenizer = tokenizer
        self.use_chat_template = bool(use_chat_template and getattr(tokenizer, "chat_template", None))
        self.enable_thinking = enable_thinking

    def text(self, conversation: list[str]) -> str:
        """The prompt text for `conversation` = [user, answer, user, ...], ending on a user turn."""
        if not self.use_chat_template:
            return "\n\n".join(conversation)
        roles = ("user", "assistant")
        messages = [{"role": roles[i % 2], "content": content} for i, content in enumerate(conversation)]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=self.enable_thinking
        )

    def encode(self, conversation: list[str]) -> torch.Tensor:
        """(1, P) prompt ids for `conversation`."""
        ids = self.tokenizer(self.text(conversation), add_special_tokens=not self.use_chat_template)["input_ids"]
        return torch.tensor([ids], dtype=torch.long)


def stop_token_ids(tokenizer, generation_config=None, extra: list | tuple = ()) -> list[int]:
    """Token ids that end a reply, sorted.

    The tokenizer's eos, the model's generation-config eos ids, any end-of-turn marker
    the tokenizer knows (e.g. `<|im_end|>`), and `extra`: token strings or ids
    (config key `decoding.stop_tokens`).
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_OF_TURN_TOKENS if token in vocab)
    for token in extra:
        if isinstance(token, int):
            ids.add(token)
        elif token in vocab:
            ids.add(vocab[token])
        else:
            raise ConfigError("decoding.stop_tokens", f"{token!r} is not a token of the target's tokenizer")
    return sorted(ids)
