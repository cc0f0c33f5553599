"""A target directory with random weights and another directory's architecture and tokenizer:
what the GPU runs time when the real weights cannot travel (a forward's cost does not depend
on its weights).

    python benchmarks/random_weight_target.py CONFIG_DIR OUT_DIR [DTYPE]
"""

import os
import shutil
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(source: str, out: str, dtype: str = "bfloat16") -> None:
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    for name in os.listdir(source):  # tokenizer, chat template, generation config
        if not os.path.exists(os.path.join(out, name)):
            shutil.copy(os.path.join(source, name), out)


if __name__ == "__main__":
    main(*sys.argv[1:])
