#!/usr/bin/env python3
"""Makes the tokenizer goldens: what the Hugging Face `tokenizers` library (the reference) returns for
every string of tests/data/tokenizer/corpus.jsonl, for the Qwen3, Llama 3 and Llama 2 tokenizer.json
files laid out by scripts/fetch-tokenizers. tests/test_tokenizer.cpp checks our C++ tokenizer against
these files id for id.

Runs where `tokenizers` is installed (the GPU machine; no network needed):
  python3 tools/make_tokenizer_goldens.py --tokenizers-dir .cache/tokenizers \
      --corpus tests/data/tokenizer/corpus.jsonl --out tests/data/tokenizer/

Writes <out>/golden_<name>.jsonl for name in qwen3, llama3, llama2. Line 1 is
  {"meta": {"tokenizer": name, "tokenizers_version": V, "tokenizer_json_sha256": H,
            "corpus_sha256": H, "count": N}}
so the test can tell a stale golden from a real mismatch. Line k+2 belongs to corpus record k:
  "ids":          encode(text, add_special_tokens=False).ids
  "ids_special":  encode(text, add_special_tokens=True).ids      -- only when it is not of the form
                  prefix + ids + suffix; otherwise "special_prefix" and "special_suffix" hold the
                  ids the post-processor added (each absent when empty)
  "decoded":      decode(ids, skip_special_tokens=False)          -- absent when equal to text
  "decoded_skip": decode(ids_special, skip_special_tokens=True)   -- absent when equal to decoded
The omissions keep the committed files small; each is exact, never an approximation.
"""
import argparse
import hashlib
import json
import os
import sys

NAMES = ("qwen3", "llama3", "llama2")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dump(obj):
    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    # Same rule as the corpus: Unicode line breaks are escaped so one record stays one line.
    for ch in ("\u0085", "\u2028", "\u2029"):
        line = line.replace(ch, "\\u%04x" % ord(ch))
    return line


def special_parts(ids, ids_special):
    """The golden fields that describe ids_special relative to ids (see the module docstring)."""
    n, m = len(ids), len(ids_special)
    for p in range(m - n + 1):
        if ids_special[p:p + n] == ids:
            parts = {}
            if p:
                parts["special_prefix"] = ids_special[:p]
            if p + n < m:
                parts["special_suffix"] = ids_special[p + n:]
            return parts
    return {"ids_special": ids_special}


def main():
    ap = argparse.ArgumentParser(description="Make tokenizer goldens with the `tokenizers` library.")
    ap.add_argument("--tokenizers-dir", required=True, help="folder with qwen3/, llama3/, llama2/")
    ap.add_argument("--corpus", required=True, help="tests/data/tokenizer/corpus.jsonl")
    ap.add_argument("--out", required=True, help="output folder, e.g. tests/data/tokenizer/")
    args = ap.parse_args()

    import tokenizers  # imported here so --help works without it

    with open(args.corpus, "rb") as f:
        corpus_bytes = f.read()
    corpus_sha = hashlib.sha256(corpus_bytes).hexdigest()
    # split("\n") rather than splitlines(): only \n ends a record.
    records = [json.loads(l) for l in corpus_bytes.decode("utf-8").split("\n") if l]
    texts = [r["text"] for r in records]

    os.makedirs(args.out, exist_ok=True)
    for name in NAMES:
        path = os.path.join(args.tokenizers_dir, name, "tokenizer.json")
        if not os.path.isfile(path):
            sys.exit(f"make_tokenizer_goldens: {path} not found (run scripts/fetch-tokenizers and carry .cache/tokenizers)")
        tok = tokenizers.Tokenizer.from_file(path)
        out_path = os.path.join(args.out, f"golden_{name}.jsonl")
        n_tokens = 0
        n_roundtrip = 0
        with open(out_path, "w", encoding="utf-8", newline="\n") as f:
            meta = {"tokenizer": name, "tokenizers_version": tokenizers.__version__,
                    "tokenizer_json_sha256": sha256_file(path), "corpus_sha256": corpus_sha,
                    "count": len(texts)}
            f.write(dump({"meta": meta}) + "\n")
            for text in texts:
                ids = tok.encode(text, add_special_tokens=False).ids
                ids_special = tok.encode(text, add_special_tokens=True).ids
                decoded = tok.decode(ids, skip_special_tokens=False)
                decoded_skip = tok.decode(ids_special, skip_special_tokens=True)
                rec = {"ids": ids}
                rec.update(special_parts(ids, ids_special))
                if decoded != text:
                    rec["decoded"] = decoded
                else:
                    n_roundtrip += 1
                if decoded_skip != decoded:
                    rec["decoded_skip"] = decoded_skip
                f.write(dump(rec) + "\n")
                n_tokens += len(ids)
        print(f"{name}: {len(texts)} strings, {n_tokens} tokens, {n_roundtrip} exact round trips, "
              f"{os.path.getsize(out_path)} bytes -> {out_path}")
    print(f"tokenizers {tokenizers.__version__}, corpus sha256 {corpus_sha}")


if __name__ == "__main__":
    main()
