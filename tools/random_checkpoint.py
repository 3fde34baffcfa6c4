#!/usr/bin/env python3
"""A Hugging Face checkpoint folder of a config's shapes with random weights, for measurements that need
a real folder (ingot serve, eval-logits) without downloading a model. Runs on the GPU machine.

Weights: normal with std = initializer_range, norms 1, rounded to bf16 so every engine that reads the
folder sees the same values; saved as one bf16 model.safetensors beside the config (torch_dtype
bfloat16). --tokenizer DIR copies tokenizer.json and tokenizer_config.json from DIR (e.g. one that
scripts/fetch-tokenizers filled), so text-in/text-out commands work.

    python3 tools/random_checkpoint.py --config bench/shapes/qwen3-8b.json --out /tmp/q8b \
        --tokenizer .cache/tokenizers/qwen3
"""
import argparse
import json
import os
import shutil
import time

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM


def random_model(config_path, model_dir, seed=0):
    """Writes config.json and model.safetensors to model_dir; returns the fp32 model (on the GPU) and its config."""
    torch.manual_seed(seed)
    os.makedirs(model_dir, exist_ok=True)
    cfg_json = json.load(open(config_path))
    cfg_json["torch_dtype"] = "bfloat16"
    json.dump(cfg_json, open(os.path.join(model_dir, "config.json"), "w"), indent=2)
    cfg = AutoConfig.from_pretrained(model_dir)
    std = getattr(cfg, "initializer_range", 0.02)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
            p.copy_(p.to(torch.bfloat16).float())  # bf16-representable: all engines see the same weights
    sd = {k: v.to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()
          if not (k == "lm_head.weight" and cfg.tie_word_embeddings)}
    save_file(sd, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    return model, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="", help="folder whose tokenizer.json and tokenizer_config.json are copied")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.time()
    model, _ = random_model(a.config, a.out, a.seed)
    del model
    if a.tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.tokenizer, f), os.path.join(a.out, f))
    print(f"{a.out}: random checkpoint of {a.config} in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
