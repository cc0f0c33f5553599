"""Prompts and response spans under the target's chat template.

One rule serves regeneration, training and (through `prompt_token_ids`) evaluation,
so the drafter trains on exactly the token layout it will see when decoding
(docs/design.md invariant 8: template and thinking mode must match):

- chat template: the prompt is the template rendered with the generation prompt
  (`add_generation_prompt=True`, `enable_thinking` when set) and tokenised without
  extra special tokens; the response is what follows it, up to and including the
  template's end-of-turn token (e.g. <|im_end|>, <|eot_id|>), but not the newline the
  template writes after it (the target stops at end-of-turn and never emits it).
- plain text (no template): the prompt is the raw text of the prompt turns joined by
  blank lines, tokenised as the tokenizer does by default (BOS if it adds one); the
  response is the assistant text followed by EOS.
"""

from __future__ import annotations

from dflash.errors import require


class UnlocatableResponse(ValueError):
    """The chat template renders an assistant turn so that its text cannot be found; such
    conversations are counted and dropped rather than trained with a wrong mask."""


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def check_chat_template(tokenizer, required: bool, key: str = "data.require_chat_template") -> None:
    """ConfigError naming `key` when a template is required and the tokenizer has none."""
    require(
        not required or has_chat_template(tokenizer),
        key,
        f"the tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} has no chat template; "
        "set it to false to train on plain prompt + response text",
    )


def plain_prompt_text(prompt_messages: list[dict]) -> str:
    """Prompt text for models without a chat template: the raw turns joined by blank lines."""
    return "\n\n".join(m["content"] for m in prompt_messages)


def render(tokenizer, messages: list[dict], add_generation_prompt: bool, enable_thinking: bool | None) -> str:
    """The chat template's text for `messages` (thinking switch passed only when set)."""
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)


def prompt_token_ids(tokenizer, prompt_messages: list[dict], enable_thinking: bool | None = None) -> list[int]:
    """Token ids of the prompt as the target sees it before generating a response (the layout
    of the module docstring: use it wherever a prompt is fed to the target)."""
    if has_chat_template(tokenizer):
        text = render(tokenizer, prompt_messages, add_generation_prompt=True, enable_thinking=enable_thinking)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(plain_prompt_text(prompt_messages))["input_ids"]


def special_token_ids(tokenizer) -> set[int]:
    """Ids of every special token, including added ones the tokenizer marks special
    (ChatML markers are often not among `all_special_ids`)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return ids


def chat_pieces(
    tokenizer, messages: list[dict], assistant_turns: str = "last", enable_thinking: bool | None = None
) -> list[tuple[str, bool]]:
    """Split a rendered conversation into consecutive (text, is_response) pieces.

    Response pieces cover the selected assistant turns (all, or only the last) from the
    end of the generation prompt through the end-of-turn token. Text after the last
    response is left out. Raises `UnlocatableResponse` when a turn cannot be found.
    """
    full = render(tokenizer, messages, add_generation_prompt=False, enable_thinking=enable_thinking)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if assistant_turns == "last":
        turns = turns[-1:]
    special = special_token_ids(tokenizer)
    pieces, cursor = [], 0
    for turn in turns:
        start, end = _response_span(tokenizer, messages, turn, full, cursor, special, enable_thinking)
        if start > cursor:
            pieces.append((full[cursor:start], False))
        pieces.append((full[start:end], True))
        cursor = end
    return pieces


def end_of_turn_token_id(tokenizer, enable_thinking: bool | None = None) -> int | None:
    """The special token the template closes an assistant turn with, or None."""
    if not has_chat_template(tokenizer):
        return None
    probe = [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}]
    try:
        pieces = chat_pieces(tokenizer, probe, "last", enable_thinking)
    except UnlocatableResponse:
        return None
    ids = tokenizer(pieces[-1][0], add_special_tokens=False)["input_ids"]
    return ids[-1] if ids and ids[-1] in special_token_ids(tokenizer) else None


def _response_span(tokenizer, messages, turn, full, cursor, special, enable_thinking) -> tuple[int, int]:
    """Character span [start, end) in `full` of assistant turn `turn`."""
    upto = render(tokenizer, messages[: turn + 1], add_generation_prompt=False, enable_thinking=enable_thinking)
    prompt = render(tokenizer, messages[:turn], add_generation_prompt=True, enable_thinking=enable_thinking)
    if full.startswith(upto) and upto.startswith(prompt) and len(prompt) >= cursor:
        # The usual case: the turn is exactly what follows the generation prompt.
        return len(prompt), len(prompt) + _through_last_special(tokenizer, upto[len(prompt) :], special)
    # Templates that render earlier turns differently once a later turn exists (Qwen3
    # drops the thinking block of past turns): find the turn's text in the full render.
    content = messages[turn]["content"].strip()
    start = full.find(content, cursor) if content else -1
    if start < 0:
        raise UnlocatableResponse(f"assistant turn {turn} does not appear verbatim in the rendered conversation")
    end = start + len(content)
    following = tokenizer(full[end:], add_special_tokens=False, return_offsets_mapping=True)
    if following["input_ids"] and following["input_ids"][0] in special:
        end += following["offset_mapping"][0][1]
    return start, end


def _through_last_special(tokenizer, text: str, special: set[int]) -> int:
    """Length of `text` up to and including its last special token (all of it if none)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for token_id, (_, stop) in zip(reversed(encoded["input_ids"]), reversed(encoded["offset_mapping"])):
        if token_id in special:
            return stop
    return len(text)
