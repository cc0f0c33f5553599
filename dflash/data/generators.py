"""Response generators for regeneration: the HF target in-process, or an
OpenAI-compatible server (vLLM, SGLang) through its chat completions endpoint.

A generator is a callable taking a batch of prompts (each a list of chat messages)
and returning one `Generated` per prompt, in order.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from dflash.data.chat import end_of_turn_token_id, prompt_token_ids
from dflash.engine import greedy_batch
from dflash.errors import ConfigError, require
from dflash.target.cache import decode_attention


@dataclass
class Generated:
    """One response: its text, how many tokens were generated, and whether it ended on
    its own (False: cut at max_new_tokens).

    prompt_ids / response_ids: when the generator knows them (the HF target), the exact
    ids fed to the model and the exact ids it generated (through the stop token if it
    stopped on one; no padding); None from servers, which return text only.
    """

    text: str
    num_tokens: int
    finished: bool = True
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None


class Generator(Protocol):
    """Answers a batch of prompts; `name` identifies the model in manifests."""

    name: str

    def __call__(self, prompts: list[list[dict]]) -> list[Generated]: ...


class HFGenerator:
    """Batched HF `generate` on the target: left padding, explicit attention mask, KV cache.

    Prompts are laid out by `dflash.data.chat.prompt_token_ids`; generation stops at EOS or the
    template's end-of-turn token. temperature 0 is greedy; top_k 0 disables top-k (never the model's
    default). Every answer carries its token ids (`dflash.data.token_ids`). Greedy generation on a
    target with the fast engine runs on it (`dflash.engine.batched.greedy_batch`).
    """

    def __init__(
        self,
        target,
        max_new_tokens: int = 2048,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        enable_thinking: bool | None = False,
    ):
        self.model = target.model
        self.target = target
        self.tokenizer = target.tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.enable_thinking = enable_thinking
        self.name = getattr(self.model, "name_or_path", "") or type(self.model).__name__
        tokenizer = self.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(self.model, tokenizer, enable_thinking)
        require(
            self.pad_id is not None and bool(self.stop_ids),
            "target.path",
            "the tokenizer has neither a pad nor an EOS token; generation can neither batch nor stop",
        )

    @torch.no_grad()
    def __call__(self, prompts: list[list[dict]]) -> list[Generated]:
        encoded = [prompt_token_ids(self.tokenizer, p, self.enable_thinking) for p in prompts]
        if self.temperature == 0 and getattr(self.target, "fast", None) is not None:
            self.target.fast.prepare()
            responses = greedy_batch(self.target.fast, encoded, self.max_new_tokens, self.stop_ids, self.pad_id)
            return [self._generated(ids, response) for ids, response in zip(encoded, responses)]
        width = max(len(ids) for ids in encoded)
        device = self.model.device
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long, device=device)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long, device=device)
        for row, ids in enumerate(encoded):  # left padding: every row continues at the right edge
            input_ids[row, width - len(ids) :] = torch.tensor(ids, device=device)
            attention_mask[row, width - len(ids) :] = 1
        sampling = self.temperature > 0
        with decode_attention():  # no cuDNN graph build per new key length (dflash.target.cache)
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=self.max_new_tokens,
                do_sample=sampling,
                temperature=self.temperature if sampling else None,
                top_p=self.top_p if sampling else None,
                top_k=self.top_k if sampling else None,
                eos_token_id=sorted(self.stop_ids),
                pad_token_id=self.pad_id,
                use_cache=True,
            )
        results = []
        for prompt_ids, new_ids in zip(encoded, output[:, width:].tolist()):
            stop = next((i for i, token in enumerate(new_ids) if token in self.stop_ids), None)
            # A row that never stopped ran the full max_new_tokens, so it holds no padding;
            # a row that stopped is padded after its stop token.
            results.append(self._generated(prompt_ids, new_ids if stop is None else new_ids[: stop + 1]))
        return results

    def _generated(self, prompt_ids: list[int], response_ids: list[int]) -> Generated:
        """A response whose ids end at its stop token (finished) or at max_new_tokens."""
        stop = len(response_ids) - 1 if response_ids and response_ids[-1] in self.stop_ids else None
        text = self.tokenizer.decode(response_ids[:stop], skip_special_tokens=True)
        return Generated(text, len(response_ids), finished=stop is not None, prompt_ids=list(prompt_ids), response_ids=response_ids)


def stop_token_ids(model, tokenizer, enable_thinking: bool | None) -> set[int]:
    """EOS ids of the model's generation config and the tokenizer, plus the chat
    template's end-of-turn token."""
    stop = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is not None:
        stop.update(configured if isinstance(configured, list) else [configured])
    if tokenizer.eos_token_id is not None:
        stop.add(tokenizer.eos_token_id)
    end_of_turn = end_of_turn_token_id(tokenizer, enable_thinking)
    if end_of_turn is not None:
        stop.add(end_of_turn)
    return stop


class ServerGenerator:
    """Generates through an OpenAI-compatible chat completions endpoint.

    url: base URL ("http://host:8000/v1") or the full ".../chat/completions" URL.
    model: served model name; None takes the first one the server lists at /models.
    concurrency: requests in flight at once (a batch is sent concurrently).
    enable_thinking: sent as `chat_template_kwargs` (vLLM and SGLang read it). A reasoning
        part returned separately (`reasoning_content`) is put back in front of the answer
        as <think>...</think>, the way the model wrote it.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        max_new_tokens: int = 2048,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        enable_thinking: bool | None = False,
        concurrency: int = 8,
        timeout_s: float = 600.0,
        retries: int = 3,
    ):
        url = url.rstrip("/")
        suffix = "/chat/completions"
        self.base = url[: -len(suffix)] if url.endswith(suffix) else url if url.endswith("/v1") else f"{url}/v1"
        self.endpoint = f"{self.base}{suffix}"
        self.timeout_s = timeout_s
        self.retries = retries
        self.concurrency = concurrency
        self.model = model or self._first_served_model()
        self.name = f"server:{self.model}"
        self.body = {"model": self.model, "max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
        if top_k:
            self.body["top_k"] = top_k
        if enable_thinking is not None:
            self.body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}

    def __call__(self, prompts: list[list[dict]]) -> list[Generated]:
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
            return list(pool.map(self._complete, prompts))

    def _complete(self, messages: list[dict]) -> Generated:
        reply = self._request(self.endpoint, {**self.body, "messages": messages})
        try:
            choice = reply["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise ConfigError(
                "regenerate.server_url",
                f"{self.endpoint} did not answer like a chat completions endpoint: {str(reply)[:200]}",
            ) from None
        text = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            text = f"<think>\n{reasoning.strip()}\n</think>\n\n{text.lstrip()}"
        num_tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
        return Generated(text, num_tokens, finished=choice.get("finish_reason") != "length")

    def _first_served_model(self) -> str:
        listing = self._request(f"{self.base}/models", None)
        models = [entry.get("id") for entry in listing.get("data", []) if entry.get("id")]
        require(bool(models), "regenerate.server_model", f"{self.base}/models lists no model; set the model name")
        return models[0]

    def _request(self, url: str, body: dict | None) -> dict:
        """GET (body None) or POST JSON; retries transient failures with backoff."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read().decode())
            except urllib.error.HTTPError as err:
                # Client errors (wrong model name, bad parameters) do not get better by retrying.
                if err.code < 500 or attempt == self.retries:
                    detail = err.read().decode(errors="replace")[:200]
                    raise ConfigError("regenerate.server_url", f"{url} answered HTTP {err.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                if attempt == self.retries:
                    raise ConfigError("regenerate.server_url", f"cannot reach {url}: {err}") from None
            time.sleep(2**attempt)
