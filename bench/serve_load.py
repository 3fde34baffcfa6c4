#!/usr/bin/env python3
"""Load on a running `ingot serve`: N concurrent streaming clients, M requests each, random prompt and
reply lengths (prompts are random token ids, so their lengths are exact), optionally some streams
dropped midway (a soak of cancellation), optionally arriving at random moments. Prints one JSON line:
requests/s, output tokens/s, time to first token and time per output token (p50/p99), errors, and
whether every slot was free afterwards. With --duration S, each client sends requests for S seconds
(instead of --requests) and the throughput of the steady state is reported too: the output tokens
streamed between --warmup and S seconds (every client busy throughout; each request's tokens placed
evenly between its first and last), which excludes the ramp-up and the drain of the last requests
that a fixed count per client includes. With --compare-alone, every completed request is then sent
again on its own, one at a time, and its text compared with what it gave under load (the batch
invariance test of issue 11: greedy output must not depend on what runs beside it).
With --prompt-ids FILE (a JSON array of token ids, e.g. real text tokenized), each prompt is a random
window of that sequence instead: a trained model then continues text it knows (random ids can land on
tokens a small model never learned, whose embeddings are zero, and it answers with tokens that decode to
no text, so no time to first text can be measured).
Python's standard library only, so it runs wherever the server does.

Usage: python3 bench/serve_load.py --url http://127.0.0.1:8080 --clients 64 --requests 10 \
         [--duration 60 --warmup 10] [--prompt-tokens 32:512] [--max-tokens 16:256] [--drop 0.1] [--arrival-ms 2000] \
         [--compare-alone] [--api-key KEY] [--seed 1]
"""
import argparse
import http.client
import json
import math
import random
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor


def span(text):
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100.0 * len(v)))]


class Load:
    def __init__(self, args):
        self.args = args
        u = urllib.parse.urlparse(args.url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if args.api_key:
            self.headers["Authorization"] = "Bearer " + args.api_key
        self.lock = threading.Lock()
        self.ttft, self.tpot, self.errors = [], [], []
        self.tokens = self.done = self.dropped = 0
        self.finished = []  # (request body, text) of each completed request, for --compare-alone
        self.spans = []  # (first token time, last token time, tokens) of each completed request
        self.source = []  # --prompt-ids: the sequence prompts are windows of (checked in main)
        if args.prompt_ids:
            with open(args.prompt_ids) as f:
                self.source = json.load(f)
        self.t0 = 0.0

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", path, headers=self.headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {r.status} {body[:200]!r}")
        return json.loads(body)

    def one(self, rng, vocab, body=None):
        """Streams one request (a random one unless body is given); returns its text when it completed."""
        a = self.args
        if body is None:
            n = rng.randint(*a.prompt_tokens)
            if self.source:
                n = min(n, len(self.source))
                at = rng.randrange(0, len(self.source) - n + 1)
                prompt = self.source[at:at + n]
            else:
                prompt = [rng.randrange(100, vocab) for _ in range(n)]
            body = {"prompt": prompt, "max_tokens": rng.randint(*a.max_tokens), "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True}
            drop_after = rng.randint(1, 8) if rng.random() < a.drop else None
            if a.arrival_ms > 0:
                time.sleep(rng.uniform(0, a.arrival_ms) / 1e3)
        else:
            drop_after = None
        text = []
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        t0 = time.perf_counter()
        first = last = None
        usage = None
        events = 0
        try:
            c.request("POST", "/v1/completions", json.dumps(body), self.headers)
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
            while True:
                line = r.readline()
                if not line:
                    raise RuntimeError("the stream ended without [DONE]")
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                text.extend(ch.get("text", "") for ch in chunk.get("choices", []))
                if any(ch.get("text") for ch in chunk.get("choices", [])):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                events += 1
                if drop_after is not None and events >= drop_after:
                    with self.lock:
                        self.dropped += 1
                    return None
        except Exception as e:  # every failure is counted and shown, none stops the run
            with self.lock:
                self.errors.append(str(e))
            return None
        finally:
            c.close()
        n = usage["completion_tokens"] if usage else 0
        with self.lock:
            self.finished.append((body, "".join(text)))
            self.done += 1
            self.tokens += n
            if first:
                self.ttft.append(first - t0)
            if first and n > 1:
                self.tpot.append((last - first) / (n - 1))
            if first:
                self.spans.append((first, last, n))
        return "".join(text)

    def client(self, i, vocab):
        rng = random.Random(self.args.seed * 1000003 + i)
        if self.args.duration > 0:
            while time.perf_counter() < self.t0 + self.args.duration:
                self.one(rng, vocab)
        else:
            for _ in range(self.args.requests):
                self.one(rng, vocab)

    def tokens_between(self, a, b):
        """Output tokens streamed in [a, b]: each request's tokens placed evenly from its first to its last."""
        total = 0
        for first, last, n in self.spans:
            if n == 1 or last <= first:
                total += n if a <= first <= b else 0
                continue
            step = (last - first) / (n - 1)
            lo = max(0, math.ceil((a - first) / step))
            hi = min(n - 1, math.floor((b - first) / step))
            total += max(0, hi - lo + 1)
        return total

    def run(self):
        meta = self.get("/v1/models")["data"][0].get("meta", {})
        vocab = int(meta.get("vocab", 32000))
        t0 = self.t0 = time.perf_counter()
        with ThreadPoolExecutor(self.args.clients) as pool:
            for f in [pool.submit(self.client, i, vocab) for i in range(self.args.clients)]:
                f.result()
        wall = time.perf_counter() - t0
        slots = []
        for _ in range(100):  # dropped streams free their slots within a step; allow a moment
            slots = self.get("/slots")
            if not any(s["busy"] for s in slots):
                break
            time.sleep(0.05)
        ms = lambda v: None if v is None else round(v * 1e3, 2)
        return {
            "clients": self.args.clients, "requests": self.done + self.dropped + len(self.errors),
            "completed": self.done, "dropped": self.dropped, "errors": len(self.errors),
            "first_errors": self.errors[:3], "wall_s": round(wall, 3),
            "requests_per_s": round(self.done / wall, 3), "output_tok_s": round(self.tokens / wall, 1),
            "ttft_ms_p50": ms(pct(self.ttft, 50)), "ttft_ms_p99": ms(pct(self.ttft, 99)),
            "tpot_ms_p50": ms(pct(self.tpot, 50)), "tpot_ms_p99": ms(pct(self.tpot, 99)),
            "slots_busy_after": sum(1 for s in slots if s["busy"]),
            **(self.steady() if self.args.duration > 0 else {}),
            **(self.compare_alone() if self.args.compare_alone else {}),
        }

    def steady(self):
        a, b = self.t0 + self.args.warmup, self.t0 + self.args.duration
        n = self.tokens_between(a, b)
        return {"steady_window_s": round(b - a, 3), "steady_output_tokens": n,
                "steady_output_tok_s": round(n / (b - a), 1)}

    def compare_alone(self):
        """Each completed request again, alone: the same text, or the first difference is shown."""
        under_load = list(self.finished)
        same, first_diff = 0, None
        for body, text in under_load:
            alone = self.one(None, 0, body)
            if alone == text:
                same += 1
            elif first_diff is None:
                at = next((i for i, (x, y) in enumerate(zip(alone or "", text)) if x != y), min(len(alone or ""), len(text)))
                first_diff = {"prompt_tokens": len(body["prompt"]), "max_tokens": body["max_tokens"], "char": at,
                              "alone": (alone or "")[max(0, at - 20):at + 40], "under_load": text[max(0, at - 20):at + 40]}
        return {"alone_compared": len(under_load), "alone_identical": same, "alone_first_difference": first_diff}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=10, help="per client")
    p.add_argument("--duration", type=float, default=0.0,
                   help="seconds each client keeps sending requests (instead of --requests); adds the steady-state figures")
    p.add_argument("--warmup", type=float, default=10.0, help="with --duration: seconds left out of the steady state")
    p.add_argument("--prompt-tokens", type=span, default=(32, 512), help="LO:HI, drawn per request")
    p.add_argument("--max-tokens", type=span, default=(16, 256), help="LO:HI, drawn per request")
    p.add_argument("--drop", type=float, default=0.0, help="fraction of streams the client drops midway")
    p.add_argument("--arrival-ms", type=float, default=0.0,
                   help="each request waits a random 0..MS milliseconds before it is sent (random arrival times)")
    p.add_argument("--compare-alone", action="store_true",
                   help="then send each completed request alone and compare its text (batch invariance)")
    p.add_argument("--prompt-ids", default="",
                   help="JSON file of a token id array: prompts are random windows of it (default: random ids)")
    p.add_argument("--api-key", default="")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.duration > 0 and not 0 <= args.warmup < args.duration:
        p.error("--warmup must lie in [0, --duration)")
    if args.prompt_ids:
        try:
            with open(args.prompt_ids) as f:
                ids = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"--prompt-ids {args.prompt_ids}: {e}")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            p.error(f"--prompt-ids {args.prompt_ids}: need a non-empty JSON array of non-negative token ids")
    out = Load(args).run()
    print(json.dumps(out))
    differs = args.compare_alone and out["alone_identical"] != out["alone_compared"]
    raise SystemExit(1 if out["errors"] or out["slots_busy_after"] or differs else 0)


if __name__ == "__main__":
    main()
