"""greedy_batch before (HEAD's copy) and after, interleaved in one process, on 32 prompts of the demo's mix."""
import sys, time, torch
sys.path.insert(0, "/tmp/oldeng")
torch.set_num_threads(2)
from old_greedy import greedy_batch as old
from dflash.target.engine import greedy_batch as new
from dflash.specs import TargetSpec, load_target
from dflash.data.builtin_prompts import builtin_rows
from dflash.data.chat import prompt_token_ids
from dflash.data.generators import HFGenerator
t = load_target(TargetSpec(path=sys.argv[1], dtype="bfloat16"))
res = []
for seed in ("x", "y"):
    rows = builtin_rows("builtin:code", 20, seed) + builtin_rows("builtin:math", 6, seed) + builtin_rows("builtin:chat", 6, seed)
    gen = HFGenerator(t, max_new_tokens=128)
    enc = [prompt_token_ids(t.tokenizer, r["messages"][:-1] if r["messages"][-1]["role"] == "assistant" else r["messages"], False) for r in rows]
    res.append(enc)
t.fast.prepare()
new(t.fast, res[0][:4], 4, gen.stop_ids, gen.pad_id); old(t.fast, res[0][:4], 4, gen.stop_ids, gen.pad_id)
tot = {"old": [0, 0.0], "new": [0, 0.0]}
for i, enc in enumerate(res * 2):
    outs = {}
    for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
        f = old if name == "old" else new
        t0 = time.perf_counter(); out = f(t.fast, enc, 128, gen.stop_ids, gen.pad_id); dt = time.perf_counter() - t0
        outs[name] = out; n = sum(map(len, out)); tot[name][0] += n; tot[name][1] += dt
        print(f"set {i} {name}: {n} tokens {dt:.1f}s {n/dt:.0f} tok/s", flush=True)
    print("identical" if outs["old"] == outs["new"] else "DIFFERENT: " + str(sum(a != b for a, b in zip(outs["old"], outs["new"]))) + " rows")
for name, (n, s) in tot.items():
    print(f"{name}: {n / s:.0f} tok/s")
