#!/usr/bin/env python3
"""Precision study of issue 16: how often 16-bit inference picks the same next token as the fp32
reference, on contexts the model itself writes (in distribution, unlike random ids), for ingot with
16-bit activations, ingot with f32 activations over 16-bit weights (--activations f32), and
transformers in 16 bits beside them.

Runs on the GPU machine with the staged binary (scripts/gpu-build) and a trained checkpoint folder
(models/demo, or one from tools/train_demo_model.py):
    python3 tools/precision_study.py --model models/demo --ingot build-gpu/bin/ingot --contexts 1000 \
        --workdir /tmp/prec --out $OUT/precision_demo.json

Steps: N sequences sampled from the model in fp32 (TF32 off, temperature 1, no truncation) from BOS,
each cut at a random length in [--min-len, --max-len]; the last-position logits of every context from
transformers in fp32 (the reference), bf16 and fp16 (eager attention, the same weights), and from
`ingot eval-logits` per dtype x activations x path: prefill (whole contexts, the tensor-core path) and
decode (--decode --max-batch 1: token by token through batch-1 decode). Per row: next-token agreement
with the fp32 argmax, the same restricted to contexts whose fp32 top-2 margin exceeds 1e-3 (closer
calls are ties at fp32's own summation-order noise), max and mean |dlogit|, NaN. Prints one table.
"""
import argparse
import json
import os
import subprocess
import time

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def sample_contexts(model, n, min_len, max_len, bos, seed, batch=250):
    g = torch.Generator(device="cuda").manual_seed(seed)
    seqs = []
    with torch.no_grad():
        for b0 in range(0, n, batch):
            rows = min(batch, n - b0)
            ids = torch.full((rows, 1), bos, dtype=torch.long, device="cuda")
            for _ in range(max_len - 1):
                p = torch.softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
                ids = torch.cat([ids, torch.multinomial(p, 1, generator=g)], dim=1)
            seqs.append(ids.cpu())
    ids = torch.cat(seqs)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=torch.Generator().manual_seed(seed + 1))
    return ids, lengths


def last_logits(model, ids, lengths):
    out = []
    with torch.no_grad():
        for n in range(ids.shape[0]):
            out.append(model(input_ids=ids[n:n + 1, :int(lengths[n])].cuda()).logits[0, -1].float().cpu())
    return torch.stack(out)


def stats(ref, got, decided):
    d = (got - ref).abs()
    same = got.argmax(-1) == ref.argmax(-1)
    return {"agreement": float(same.float().mean()), "agreement_decided": float(same[decided].float().mean()),
            "max_abs": float(d.max()), "mean_abs": float(d.mean()), "nan": bool(torch.isnan(got).any())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--contexts", type=int, default=1000)
    ap.add_argument("--min-len", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/precision")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.workdir, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").cuda().eval()
    bos = model.config.bos_token_id if model.config.bos_token_id is not None else 1
    t0 = time.time()
    ids, lengths = sample_contexts(model, a.contexts, a.min_len, a.max_len, bos, a.seed)
    ctx_path = os.path.join(a.workdir, "contexts.safetensors")
    save_file({"input_ids": ids.contiguous(), "lengths": lengths.contiguous()}, ctx_path)
    ref = last_logits(model, ids, lengths)
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 1e-3
    print(f"{a.contexts} contexts sampled and scored in fp32 in {time.time() - t0:.1f}s; "
          f"{int(decided.sum())} with a top-2 margin above 1e-3", flush=True)
    rows = []
    for dname, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        model.to(dt)
        rows.append({"engine": "transformers", "dtype": dname, "activations": dname, "path": "prefill",
                     **stats(ref, last_logits(model, ids, lengths), decided)})
        for act in (dname, "f32"):
            for path in ("prefill", "decode"):
                out_path = os.path.join(a.workdir, f"ingot_{dname}_{act}_{path}.safetensors")
                cmd = [a.ingot, "eval-logits", "--model", a.model, "--contexts", ctx_path, "--out", out_path, "--force",
                       "--dtype", dname, "--activations", act, "--device", "cuda", "--quiet"]
                if path == "decode":
                    cmd += ["--decode", "--max-batch", "1"]
                t1 = time.time()
                subprocess.run(cmd, check=True)
                rows.append({"engine": "ingot", "dtype": dname, "activations": act, "path": path,
                             "seconds": time.time() - t1, **stats(ref, load_file(out_path)["logits"], decided)})
        model.to(torch.float32)
    name = os.path.basename(os.path.normpath(a.model))
    print(f"| model | engine | weights | activations | path | next-token agreement | where margin > 1e-3 | "
          f"max |dlogit| | mean |dlogit| | NaN |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {name} | {r['engine']} | {r['dtype']} | {r['activations']} | {r['path']} | {100 * r['agreement']:.1f}% | "
              f"{100 * r['agreement_decided']:.1f}% | {r['max_abs']:.4f} | {r['mean_abs']:.5f} | {'yes' if r['nan'] else 'no'} |")
    json.dump({"model": a.model, "contexts": a.contexts, "lengths": [a.min_len, a.max_len], "decided": int(decided.sum()),
               "rows": rows}, open(a.out, "w"), indent=2)


if __name__ == "__main__":
    main()
