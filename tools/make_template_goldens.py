#!/usr/bin/env python3
"""Renders every chat-template case with transformers' apply_chat_template and writes the results.

The C++ chat template renderer (src/template) must reproduce these strings byte for byte
(tests/test_template.cpp). Runs offline on the GPU machine:

  python3 tools/make_template_goldens.py --tokenizers-dir .cache/tokenizers \
      --cases tests/data/template/cases.json --out tests/data/template/goldens.json

A case names a tokenizer folder under --tokenizers-dir (qwen3, llama3, ...), the messages, optional
tools, add_generation_prompt, optional enable_thinking, an optional inline chat_template (for cases
that exercise the template language rather than a model's template) and optional extra keyword
arguments, which transformers passes on to the template. A case whose rendering raises is recorded
with its error, so the C++ side can check that it fails too.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jinja2  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402


def find_tokenizer_dir(root, name):
    """The folder under root/name holding tokenizer_config.json (the npm packages nest it in models/)."""
    base = os.path.join(root, name)
    for dirpath, _dirs, files in sorted(os.walk(base)):
        if "tokenizer_config.json" in files and "tokenizer.json" in files:
            return dirpath
    sys.exit(f"make_template_goldens: no tokenizer_config.json + tokenizer.json under {base}")


def load_tokenizer(path):
    try:
        return AutoTokenizer.from_pretrained(path), "AutoTokenizer"
    except Exception as e:  # the config's tokenizer_class may need files the npm package lacks
        print(f"  AutoTokenizer failed for {path} ({type(e).__name__}: {e}); using PreTrainedTokenizerFast")
    with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
               if isinstance(cfg.get(k), str)}
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"), **special)
    tok.chat_template = cfg["chat_template"]
    return tok, "PreTrainedTokenizerFast"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers-dir", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)["cases"]

    tokenizers, loaders = {}, {}
    results = {}
    n_ok = n_err = 0
    for case in cases:
        name = case["tokenizer"]
        if name not in tokenizers:
            tokenizers[name], loaders[name] = load_tokenizer(find_tokenizer_dir(args.tokenizers_dir, name))
        tok = tokenizers[name]
        kwargs = dict(tools=case.get("tools"), add_generation_prompt=case["add_generation_prompt"], tokenize=False)
        if "enable_thinking" in case:
            kwargs["enable_thinking"] = case["enable_thinking"]
        if "chat_template" in case:
            kwargs["chat_template"] = case["chat_template"]
        kwargs.update(case.get("extra", {}))
        try:
            rendered = tok.apply_chat_template(case["messages"], **kwargs)
            if not isinstance(rendered, str):
                raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, not str")
            results[case["name"]] = {"rendered": rendered}
            n_ok += 1
        except Exception as e:
            results[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
            n_err += 1

    doc = {
        "generator": {
            "script": "tools/make_template_goldens.py",
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "loaders": loaders,
            "special_tokens": {n: {"bos_token": getattr(t, "bos_token", None), "eos_token": getattr(t, "eos_token", None)}
                               for n, t in tokenizers.items()},
        },
        "cases": results,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"make_template_goldens: {n_ok} rendered, {n_err} raised (recorded as errors), "
          f"transformers {transformers.__version__}, jinja2 {jinja2.__version__} -> {args.out}")
    for n, r in results.items():
        if "error" in r:
            print(f"  {n}: {r['error'][:160]}")


if __name__ == "__main__":
    main()
