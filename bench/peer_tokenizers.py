#!/usr/bin/env python3
"""Times the Hugging Face `tokenizers` library (the reference) encoding single-threaded on exactly
the inputs of bench/bench_tokenizer.cpp, and prints the same figures (bytes/s, tokens/s), so the
two can be compared from one run on the same machine.

Inputs: the conformance corpus (one encode per string, add_special_tokens=False) and a mixed text
of corpus strings drawn by the same 64-bit LCG as the C++ benchmark, joined with "\\n" until 4 MiB
(one encode).

  python3 bench/peer_tokenizers.py [--tokenizers-dir .cache/tokenizers]
                                   [--corpus tests/data/tokenizer/corpus.jsonl] [--seconds 3]
"""
import argparse
import json
import os
import statistics
import time

# Single-threaded: the library would otherwise be free to use a thread pool.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

NAMES = ("qwen3", "llama3", "llama2")
MIXED_BYTES = 4 << 20
MASK64 = (1 << 64) - 1


def mixed_text(texts):
    parts, size, x = [], 0, 20261130
    while size < MIXED_BYTES:
        x = (x * 6364136223846793005 + 1442695040888963407) & MASK64
        t = texts[(x >> 33) % len(texts)]
        parts.append(t)
        parts.append("\n")
        size += len(t.encode("utf-8")) + 1
    return "".join(parts)


def timed(fn, min_seconds):
    """Runs fn once to warm up, then repeatedly for at least min_seconds; median seconds per run."""
    fn()
    runs = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
        if time.perf_counter() - start >= min_seconds and len(runs) >= 3:
            break
    return statistics.median(runs), len(runs)


def main():
    ap = argparse.ArgumentParser(description="Time the tokenizers library on the benchmark inputs.")
    ap.add_argument("--tokenizers-dir", default=".cache/tokenizers")
    ap.add_argument("--corpus", default="tests/data/tokenizer/corpus.jsonl")
    ap.add_argument("--seconds", type=float, default=3.0, help="minimum timing per case")
    args = ap.parse_args()

    import tokenizers

    with open(args.corpus, "rb") as f:
        texts = [json.loads(l)["text"] for l in f.read().decode("utf-8").split("\n") if l]
    corpus_bytes = sum(len(t.encode("utf-8")) for t in texts)
    mixed = mixed_text(texts)
    mixed_bytes = len(mixed.encode("utf-8"))

    print(f"tokenizers {tokenizers.__version__}, single thread; corpus {len(texts)} strings "
          f"{corpus_bytes} bytes; mixed text {mixed_bytes} bytes")
    results = {}
    for name in NAMES:
        tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizers_dir, name, "tokenizer.json"))
        n_corpus = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
        n_mixed = len(tok.encode(mixed, add_special_tokens=False).ids)

        def corpus_run():
            for t in texts:
                tok.encode(t, add_special_tokens=False)

        def mixed_run():
            tok.encode(mixed, add_special_tokens=False)

        for case, fn, nbytes, ntok in (("encode_corpus", corpus_run, corpus_bytes, n_corpus),
                                       ("encode_mixed_4MiB", mixed_run, mixed_bytes, n_mixed)):
            secs, runs = timed(fn, args.seconds)
            results[f"{case}/{name}"] = {"bytes_per_second": nbytes / secs, "tokens_per_second": ntok / secs}
            print(f"{case}/{name:7s} {secs * 1e3:9.1f} ms/run ({runs} runs)  "
                  f"bytes_per_second={nbytes / secs / 1048576:.3f}M/s  tokens={ntok / secs / 1e6:.4f}M/s")
    print("json " + json.dumps(results))


if __name__ == "__main__":
    main()
