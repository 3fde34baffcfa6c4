#!/usr/bin/env python3
"""The peer for `ingot bench`: transformers on the same shapes (a config.json, random weights), bf16,
same prompt length, new tokens and batch sizes, eager and with its static cache (which transformers
compiles with torch.compile during generate). Prints one JSON line per (mode, batch) with time to
first token and decode tokens/s, plus one line with the bf16 matrix rate measured on this card. That
output, saved to a file, is what `ingot bench --svg OUT --peer FILE` reads to draw these points.

Usage: python3 bench/peer_hf.py --config bench/shapes/qwen3-8b.json [--batch 1,64] [--compile-batch 1]
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer


def sync():
    torch.cuda.synchronize()


class FirstTokenClock(BaseStreamer):
    """Notes when generate hands over its first new token (its second put: the first is the prompt)."""

    def __init__(self):
        self.puts = 0
        self.first = None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            sync()
            self.first = time.perf_counter()

    def end(self):
        pass


def generate(model, ids, n, static, streamer=None):
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, streamer=streamer)
    if static:
        kw["cache_implementation"] = "static"
    with torch.inference_mode():
        return model.generate(ids, **kw)


def run(model, name, mode, batch, prompt_len, new_tokens, vocab):
    static = mode != "eager"
    ids = torch.randint(0, vocab, (batch, prompt_len), device="cuda")
    # Warm-up with the timed run's exact lengths: the static cache is sized by prompt + new tokens, and
    # any other size would make torch.compile trace again inside the timed run.
    for _ in range(2 if static else 1):
        generate(model, ids, new_tokens, static)
    sync()
    torch.cuda.reset_peak_memory_stats()
    # One generate, timed: the first token's arrival splits it into TTFT and decode.
    clock = FirstTokenClock()
    t0 = time.perf_counter()
    out = generate(model, ids, new_tokens, static, clock)
    sync()
    t_end = time.perf_counter()
    assert out.shape[1] == prompt_len + new_tokens and clock.first is not None
    ttft = clock.first - t0
    decode = max(t_end - clock.first, 1e-9)
    steps = new_tokens - 1
    return {"engine": "transformers", "mode": mode, "shape": name, "batch": batch, "prompt_len": prompt_len,
            "new_tokens": new_tokens, "ttft_ms": ttft * 1e3, "decode_tok_s_per_seq": steps / decode,
            "decode_tok_s": batch * steps / decode, "peak_memory_bytes": torch.cuda.max_memory_allocated()}


def matmul_tflops():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--compile-batch", default="1", help="batches also run with the static cache + compile ('' = none)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    a = ap.parse_args()
    with open(a.config) as f:
        cfg_dict = json.load(f)
    name = os.path.splitext(os.path.basename(a.config))[0]
    model_type = cfg_dict.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **cfg_dict)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    model.generation_config.eos_token_id = None
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "matmul_tflops_bf16": matmul_tflops()}), flush=True)
    batches = [int(b) for b in a.batch.split(",") if b]
    compiled = {int(b) for b in a.compile_batch.split(",") if b}
    # Batch 1 in both modes first: those are the headline figures if a time limit cuts the run short.
    plan = [("eager", b) for b in batches if b == 1] + [("static+compile", b) for b in batches if b in compiled]
    plan += [("eager", b) for b in batches if b != 1]
    for mode, b in plan:
        try:
            print(json.dumps(run(model, name, mode, b, a.prompt_len, a.new_tokens, cfg.vocab_size)), flush=True)
        except Exception as e:  # report and go on: one failing mode must not hide the others
            print(json.dumps({"engine": "transformers", "mode": mode, "shape": name, "batch_failed": b,
                              "error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
