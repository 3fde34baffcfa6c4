#!/usr/bin/env python3
"""16-bit numerics study for the CUDA backend (issue 4, item 3): ingot in bf16/fp16 and transformers in
bf16/fp16 are both judged against transformers in fp32 on the same weights and the same contexts.

Runs on the GPU machine with the staged binary (scripts/gpu-build):
    python3 tools/compare_16bit.py --config bench/shapes/qwen3-0.6b.json --ingot build-gpu/bin/ingot \
        --contexts 500 --workdir /tmp/c16 --out $OUT/qwen3-0.6b.json

Steps: random weights of the config's shapes (normal, std = initializer_range, norms 1), rounded to
bf16 so every engine sees the same values; saved as a bf16 checkpoint; N contexts of random ids with
lengths drawn from [--min-len, --max-len]; last-position logits from transformers in fp32 (TF32 off),
bf16 and fp16, and from `ingot eval-logits --dtype bf16|fp16`; then per dtype: next-token agreement with
the fp32 argmax, max and mean |Δlogit|. Prints one table per model x dtype with both engines.
"""
import argparse
import json
import os
import shutil
import subprocess
import time

import torch
from safetensors.torch import load_file, save_file

from random_checkpoint import random_model


def last_logits(model, ids, lengths, dtype):
    out = []
    with torch.no_grad():
        for n in range(ids.shape[0]):
            x = ids[n:n + 1, :lengths[n]].cuda()
            out.append(model(input_ids=x).logits[0, -1].float().cpu())
    return torch.stack(out)


def stats(ref, got):
    d = (got - ref).abs()
    return {"agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
            "max_abs": float(d.max()), "mean_abs": float(d.mean()), "nan": bool(torch.isnan(got).any())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--contexts", type=int, default=500)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/compare16")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = os.path.join(a.workdir, "model")
    t0 = time.time()
    model, cfg = random_model(a.config, model_dir, a.seed)
    print(f"weights ready in {time.time() - t0:.1f}s", flush=True)

    g = torch.Generator().manual_seed(a.seed + 1)
    lengths = torch.randint(a.min_len, a.max_len + 1, (a.contexts,), generator=g)
    ids = torch.randint(0, cfg.vocab_size, (a.contexts, a.max_len), generator=g)
    ctx_path = os.path.join(a.workdir, "contexts.safetensors")
    save_file({"input_ids": ids.contiguous(), "lengths": lengths.contiguous()}, ctx_path)

    model.eval()
    ref = last_logits(model, ids, lengths.tolist(), torch.float32)
    results = {"config": a.config, "contexts": a.contexts, "lengths": [a.min_len, a.max_len], "rows": []}
    for dname, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        model.to(dt)
        hf = last_logits(model, ids, lengths.tolist(), dt)
        out_path = os.path.join(a.workdir, f"ingot_{dname}.safetensors")
        subprocess.run([a.ingot, "eval-logits", "--model", model_dir, "--contexts", ctx_path, "--out", out_path, "--force",
                        "--dtype", dname, "--device", "cuda"], check=True)
        ours = load_file(out_path)["logits"]
        row = {"dtype": dname, "transformers": stats(ref, hf), "ingot": stats(ref, ours)}
        results["rows"].append(row)
        print(f"{os.path.basename(a.config):22} {dname}  next-token agreement  transformers {row['transformers']['agreement']:.4f}"
              f"  ingot {row['ingot']['agreement']:.4f} | max |dlogit| {row['transformers']['max_abs']:.4f} vs "
              f"{row['ingot']['max_abs']:.4f} | mean |dlogit| {row['transformers']['mean_abs']:.5f} vs "
              f"{row['ingot']['mean_abs']:.5f}", flush=True)
    json.dump(results, open(a.out, "w"), indent=2)
    shutil.rmtree(model_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
