"""CUDA graphs of the fast forward's decode steps (`target.engine: graphs`).

Why: on a GPU a decode forward is host-bound: Python and one launch per kernel take several
times the kernels' own time (docs/design.md, "Measured figures"). A CUDA graph
replays all of a forward's kernels with one launch.

Invariants:
- One graph per shape. A graph is captured on the first forward of its kind (batch, new
  positions q <= MAX_GRAPH_WIDTH, taps, logits kept, cache buffer) and replayed after. Other
  forwards (prefill, tree verification's masks, wider inputs) run `FastForward.forward`.
- Any cache length, one graph. The step's first position is a device scalar: keys and values
  go to [start, start + q) of the cache's buffers by index, and attention reads the whole
  capacity under the mask key <= query position (masked keys add exact zeros). The cache's
  `length` moves on the host as in the fast forward. When the cache grows (new buffers,
  `StaticCache.reserve`) the old buffers' graphs are dropped and captured again: capacity
  doubles, so a decode captures each width a few times at most.
- Same numbers as the fast forward: `static_step` runs the fast forward's weights through
  PyTorch's ops (float32 logits within 1e-5 on CPU, greedy output identical:
  tests/engine/test_graphs.py). Our CPU kernels do not run here: graphs are CUDA's.
- A replay overwrites the graph's buffers: `forward` returns copies.
- Without CUDA, or with a rotary embedding that reads positions on the host
  (`HOST_ROPE_TYPES`), `TargetModel` keeps the fast forward (one log line); a
  `GraphedForward` built over CPU tensors runs `static_step` uncaptured, which is how CI checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash.engine.forward import FastForward, StaticCache, _ordered, add_rms_norm, qkv_heads, rope_tables, silu_mul

#: widest forward replayed from a graph (a verify of B tokens is B wide)
MAX_GRAPH_WIDTH = 16
#: rotary embeddings that choose their frequencies from the positions on the host
#: (transformers' `dynamic_rope_update`): a graph cannot capture them
HOST_ROPE_TYPES = ("dynamic", "longrope")


def static_step(fast: FastForward, ids, positions, start, keys, values, layer_ids, logits_to_keep):
    """One forward of `fast` over `ids` (b, q) at cache positions [start, start + q), with no
    host reads: `start` is a 0-d device tensor, `keys`/`values` a `StaticCache`'s buffers.
    Returns (logits float32, features or None) as `FastForward.forward`."""
    batch, q = ids.shape
    capacity = keys.shape[3]
    slots = start + torch.arange(q, device=ids.device)
    heads, kv_heads, head_dim = fast.num_heads, fast.num_kv_heads, fast.head_dim
    group = heads // kv_heads
    # the query heads of one kv head as rows of one attention: (group * q, capacity) visible keys
    visible = (torch.arange(capacity, device=ids.device) <= slots.unsqueeze(1)).repeat(group, 1)
    hidden = fast.embed_tokens(ids)
    cos, sin = rope_tables(fast.rotary, hidden, positions)
    taps = set(layer_ids or ())
    last = len(fast.layers) - 1
    features = []
    for index, layer in enumerate(fast.layers):
        hidden, x = add_rms_norm(None, hidden, layer.input_norm)
        query, key, value = qkv_heads(fast, layer, layer.qkv(x), cos, sin)
        keys[index].index_copy_(2, slots, key)
        values[index].index_copy_(2, slots, value)
        grouped = query.reshape(batch, kv_heads, group * q, head_dim)
        out = F.scaled_dot_product_attention(grouped, keys[index], values[index], attn_mask=visible)
        out = out.reshape(batch, heads, q, head_dim).transpose(1, 2).reshape(batch, q, heads * head_dim)
        hidden, x = add_rms_norm(None, hidden, layer.post_norm, layer.o(out))
        gate_up = layer.gate_up(x)
        hidden = hidden + layer.down(silu_mul(None, gate_up, layer.intermediate))
        if index in taps and index != last:
            features.append(hidden)
    _, normed = add_rms_norm(None, hidden, fast.final_norm)
    if last in taps:
        features.append(normed)
    if logits_to_keep:
        normed = normed[:, -logits_to_keep:]
    return fast.lm_head(normed).float(), _ordered(features, layer_ids)


@dataclass
class _Graph:
    graph: object  # torch.cuda.CUDAGraph, or None: run uncaptured
    inputs: tuple  # the static copies of the step's inputs that `run` reads
    run: object
    outputs: object = None


class StepGraphs:
    """CUDA graphs of one kind of step, one per input shape, all writing one cache's buffers
    (module invariants); the target's forward and the drafter's propose each keep one."""

    def __init__(self):
        self.graphs: dict[tuple, _Graph] = {}
        self._buffers = None  # the cache buffers the graphs write (a new cache drops them)
        self._start = None
        self._pool = None

    def step(self, key: tuple, buffers: tuple, start: int, inputs: tuple, make_run):
        """The outputs of the step `key` (its graph's buffers: copy them before the next step)
        on `inputs`, its cache's first new position `start`; `make_run(static_inputs,
        start_tensor)` gives the step's function the first time this key meets these buffers."""
        if buffers != self._buffers:
            self.graphs.clear()  # their memory pool goes with the last of them: a new one for the next
            self._buffers, self._pool = buffers, None
        device = inputs[0].device
        if self._start is None or self._start.device != device:
            self._start = torch.zeros((), dtype=torch.long, device=device)
        self._start.fill_(start)
        entry = self.graphs.get(key)
        if entry is None:
            static = tuple(x.clone() for x in inputs)
            entry = self.graphs[key] = self._record(static, make_run(static, self._start))
            return entry.outputs
        for target, value in zip(entry.inputs, inputs):
            target.copy_(value)
        if entry.graph is None:
            entry.outputs = entry.run()
        else:
            entry.graph.replay()
        return entry.outputs

    def _record(self, inputs: tuple, run) -> _Graph:
        entry = _Graph(None, inputs, run)
        if not inputs[0].is_cuda:  # CPU (tests): the same step, uncaptured
            entry.outputs = run()
            return entry
        # warm-up on a side stream, as capture requires; it writes the slots the replay writes
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            entry.outputs = run()
        graph.replay()
        entry.graph = graph
        return entry


def cache_buffers(cache: StaticCache) -> tuple:
    """What identifies the buffers a cache's graphs write."""
    return cache.keys.data_ptr(), cache.values.data_ptr(), tuple(cache.keys.shape)


class GraphedForward:
    """`FastForward.forward` with its decode steps replayed from CUDA graphs (module invariants)."""

    def __init__(self, fast: FastForward):
        self.fast = fast
        self.steps = StepGraphs()

    def kernel_path(self) -> str:
        return f"{self.fast.kernel_path()}; cuda graphs (1-{MAX_GRAPH_WIDTH} positions)"

    @torch.inference_mode()
    def forward(self, input_ids, position_ids, cache: StaticCache, layer_ids=None, logits_to_keep=0, attention_mask=None):
        batch, q = input_ids.shape
        if attention_mask is not None or q > MAX_GRAPH_WIDTH or cache.length == 0:
            return self.fast.forward(input_ids, position_ids, cache, layer_ids, logits_to_keep, attention_mask)
        cache.reserve(cache.length + q, batch)
        keys, values = cache.keys, cache.values

        def make_run(inputs, start):
            return lambda: static_step(self.fast, *inputs, start, keys, values, layer_ids, logits_to_keep)

        key = (batch, q, tuple(layer_ids or ()), logits_to_keep)
        logits, features = self.steps.step(key, cache_buffers(cache), cache.length, (input_ids, position_ids), make_run)
        cache.length += q
        return logits.clone(), None if features is None else features.clone()
