"""Toy targets built here, offline: tiny random models of many architectures with a byte
tokenizer (`tiny`), and a tiny code LM pre-trained on the Python standard library
(`tiny_code`, `pretrain`) with the function-header prompts cut from the same corpus
(`tiny_code_prompts`). Used by the tests, the toy demo, the CPU sweeps and the scripts."""
