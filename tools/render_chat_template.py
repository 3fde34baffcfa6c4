#!/usr/bin/env python3
"""Renders one chat template file over a list of contexts and prints (or compares) the results as JSON.

Used to prove ingot's renderer byte-identical to transformers on a template that is not committed
(a model's own template, kept under the ignored .cache/), over the contexts of a file written for
that purpose (tests/data/template/qwen3_5_contexts.json). On the GPU machine, which has transformers:

  python3 tools/render_chat_template.py --template .cache/qwen3_5/chat_template.jinja \
      --contexts tests/data/template/qwen3_5_contexts.json --tokenizer .cache/tokenizers/qwen3 \
      --out .cache/qwen3_5/transformers.json --compare .cache/qwen3_5/ingot.json

--tokenizer DIR: a tokenizer folder; each context goes through its apply_chat_template(...,
chat_template=<the file>, tokenize=False), so the special tokens it passes are that tokenizer's.
Without it the script calls transformers' own renderer (render_jinja_template) with no special tokens,
and without transformers at all it builds the Jinja environment transformers documents (sandboxed,
trim_blocks and lstrip_blocks, loopcontrols, the json.dumps tojson, raise_exception, strftime_now):
the output's "renderer" field says which one ran, so a result is never mistaken for transformers'.

The contexts file is {"cases": [{"name", "messages", "add_generation_prompt", optional "tools",
"enable_thinking", "extra" (more keyword arguments)}]}, the shape of tests/data/template/cases.json.
The output is {"generator": {...}, "cases": {name: {"rendered": text} or {"error": message}}}, the
shape of goldens.json. --compare FILE checks every case against another such file (ingot's, written by
`test_template --gtest_filter=*WriteRenders*`, docs/chat-templates.md): the rendered texts must be
equal and a case must fail in both or in neither; exit 1 on any difference, with the first differing
character of each.
"""
import argparse
import json
import os
import sys
from datetime import datetime

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jinja2  # noqa: E402


def plain_jinja_renderer(source):
    """transformers' environment rebuilt from its documented settings; used only without transformers."""
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # {% generation %}...{% endgeneration %} renders its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    template = env.from_string(source)

    def render(messages, tools, add_generation_prompt, kwargs):
        return template.render(messages=messages, tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **kwargs)
    return render, f"jinja2 {jinja2.__version__} in transformers' documented environment (not transformers)"


def make_renderer(source, tokenizer_dir):
    try:
        import transformers
    except ImportError:
        if tokenizer_dir:
            sys.exit("render_chat_template: --tokenizer needs transformers")
        return plain_jinja_renderer(source)
    if tokenizer_dir:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)

        def render(messages, tools, add_generation_prompt, kwargs):
            out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                          chat_template=source, tokenize=False, **kwargs)
            if not isinstance(out, str):
                raise TypeError(f"apply_chat_template returned {type(out).__name__}, not str")
            return out
        return render, (f"transformers {transformers.__version__} apply_chat_template, tokenizer {tokenizer_dir}, "
                        f"jinja2 {jinja2.__version__}")
    from transformers.utils.chat_template_utils import render_jinja_template

    def render(messages, tools, add_generation_prompt, kwargs):
        texts, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=source,
                                         add_generation_prompt=add_generation_prompt, **kwargs)
        return texts[0]
    return render, f"transformers {transformers.__version__} render_jinja_template, jinja2 {jinja2.__version__}"


def first_difference(a, b):
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n, a[max(0, n - 30):n + 30], b[max(0, n - 30):n + 30]


def compare(ours, theirs):
    """The cases that differ between two result maps, as printable lines."""
    bad = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a is None or b is None:
            bad.append(f"{name}: only in {'this run' if b is None else 'the compared file'}")
        elif ("error" in a) != ("error" in b):
            bad.append(f"{name}: this run {'raised ' + a['error'] if 'error' in a else 'rendered'}, "
                       f"the compared file {'raised ' + b['error'] if 'error' in b else 'rendered'}")
        elif "rendered" in a and a["rendered"] != b["rendered"]:
            at, x, y = first_difference(a["rendered"], b["rendered"])
            bad.append(f"{name}: differs at character {at}: {x!r} vs {y!r}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", required=True, help="the chat template file (Jinja text)")
    ap.add_argument("--contexts", required=True)
    ap.add_argument("--tokenizer", help="a tokenizer folder: render through its apply_chat_template")
    ap.add_argument("--out", help="write the results here (default: stdout)")
    ap.add_argument("--compare", help="a results file to compare with (exit 1 on any difference)")
    args = ap.parse_args()

    with open(args.template, encoding="utf-8") as f:
        source = f.read()
    with open(args.contexts, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    render, renderer = make_renderer(source, args.tokenizer)

    results = {}
    for c in cases:
        kwargs = dict(c.get("extra", {}))
        if "enable_thinking" in c:
            kwargs["enable_thinking"] = c["enable_thinking"]
        try:
            results[c["name"]] = {"rendered": render(c["messages"], c.get("tools"), c["add_generation_prompt"], kwargs)}
        except Exception as e:  # a template's raise_exception, or a type error while rendering
            results[c["name"]] = {"error": f"{type(e).__name__}: {e}"}
    doc = {"generator": {"script": "tools/render_chat_template.py", "renderer": renderer,
                         "template": os.path.basename(args.template), "contexts": args.contexts},
           "cases": results}
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    n_err = sum("error" in r for r in results.values())
    print(f"render_chat_template: {len(results) - n_err} rendered, {n_err} raised; {renderer}", file=sys.stderr)
    if args.compare:
        with open(args.compare, encoding="utf-8") as f:
            other = json.load(f)
        bad = compare(results, other["cases"])
        for line in bad:
            print("  " + line, file=sys.stderr)
        who = other.get("generator", {}).get("renderer", args.compare)
        print(f"render_chat_template: {len(results) - len(bad)} of {len(results)} cases agree with {who}",
              file=sys.stderr)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
