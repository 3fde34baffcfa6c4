#!/usr/bin/env python3
"""Trains the small model `make demo` runs: a Qwen3-architecture decoder with the Llama 2 tokenizer
(from the npm package fetched by scripts/fetch-tokenizers), on short stories this script writes itself
from a small grammar (text of our own, free to redistribute).

Runs on the GPU machine (torch, transformers, tokenizers, safetensors):
    python3 tools/train_demo_model.py --tokenizer-dir .cache/tokenizers/llama2 --out OUT/demo --seconds 150

Writes OUT/demo/{config.json, generation_config.json, model.safetensors (bf16), reference.safetensors}.
The reference is the transformers fp32 forward of the saved bf16 weights (docs/reference-format.md), so
`ingot check` proves the demo model too. Embedding rows of tokens the stories never use are held at
zero, so the committed weights compress to a small fraction of their size.
"""
import argparse
import json
import math
import os
import random
import time

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Qwen3Config

from demo_stories import story  # the grammar, shared with the INT4 quality table's text

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--seed", type=int, default=0)
    # The shipped demo model is the default; the INT4 quality table's larger model (docs/quantization.md)
    # is --layers 8 --hidden 256 --intermediate 768 --heads 8 --kv-heads 4.
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    tk = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    bos, eos = 1, 2
    stories = [story(rng) for _ in range(60000)]
    seqs = [[bos] + e.ids[1:] + [eos] if e.ids and e.ids[0] == bos else [bos] + e.ids + [eos]
            for e in tk.encode_batch(stories)]
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    used = torch.zeros(32000, dtype=torch.bool)
    used[flat.unique()] = True
    print(f"corpus: {len(stories)} stories, {flat.numel()} tokens, {int(used.sum())} distinct tokens")

    cfg = Qwen3Config(vocab_size=32000, hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=32, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos,
                      rms_norm_eps=1e-6)
    dev = "cuda"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dev)
    emb = model.get_input_embeddings().weight
    unused = (~used).to(dev)
    with torch.no_grad():
        emb[unused] = 0
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    T, B = 128, 256
    data = flat.to(dev)
    t0, step = time.time(), 0
    while time.time() - t0 < a.seconds:
        frac = (time.time() - t0) / a.seconds
        for g in opt.param_groups:
            g["lr"] = 3e-3 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        ix = torch.randint(0, data.numel() - T - 1, (B,), device=dev)
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 32000), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            emb[unused] = 0  # unused rows stay exactly zero
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
        step += 1
    print(f"trained {step} steps, final loss {loss.item():.3f}")

    os.makedirs(a.out, exist_ok=True)
    model = model.to("cpu").to(torch.bfloat16)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    conf = cfg.to_dict()
    conf["architectures"] = ["Qwen3ForCausalLM"]
    conf["dtype"] = "bfloat16"
    conf.pop("torch_dtype", None)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos}, f, indent=2)

    # Reference: the saved bf16 weights, run by transformers in fp32 on the CPU.
    ref = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="eager").eval()
    rows = [seqs[i][:24] for i in range(len(seqs)) if len(seqs[i]) >= 24][:2]
    ids = torch.tensor(rows, dtype=torch.long)
    P, G = 8, 16
    with torch.no_grad():
        logits = ref(input_ids=ids).logits.float().contiguous()
        g = ids[:, :P].clone()
        for _ in range(G):
            g = torch.cat([g, ref(input_ids=g).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        for prompt in ["Once upon a time,", "Tom had a"]:
            p = torch.tensor([tk.encode(prompt).ids])
            for _ in range(40):
                nxt = ref(input_ids=p).logits[:, -1].argmax(-1, keepdim=True)
                p = torch.cat([p, nxt], dim=1)
                if nxt.item() == eos:
                    break
            print("sample:", tk.decode(p[0].tolist()))
    save_file({"input_ids": ids.contiguous(), "logits": logits, "greedy_prompt_len": torch.tensor([P]),
               "greedy_ids": g.contiguous()}, os.path.join(a.out, "reference.safetensors"),
              metadata={"made_by": "tools/train_demo_model.py", "seed": str(a.seed)})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
