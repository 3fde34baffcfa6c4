#!/usr/bin/env python3
"""Load on a running `ingot serve`: N concurrent streaming clients, M requests each, random prompt and
reply lengths (prompts are random token ids, so their lengths are exact), optionally some streams
dropped midway (a soak of cancellation). Prints one JSON line: requests/s, output tokens/s, time to
first token and time per output token (p50/p99), errors, and whether every slot was free afterwards.
Python's standard library only, so it runs wherever the server does.

Usage: python3 bench/serve_load.py --url http://127.0.0.1:8080 --clients 64 --requests 10 \
         [--prompt-tokens 32:512] [--max-tokens 16:256] [--drop 0.1] [--api-key KEY] [--seed 1]
"""
import argparse
import http.client
import json
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

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", path, headers=self.headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {r.status} {body[:200]!r}")
        return json.loads(body)

    def one(self, rng, vocab):
        a = self.args
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(*a.prompt_tokens))]
        body = {"prompt": prompt, "max_tokens": rng.randint(*a.max_tokens), "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        drop_after = rng.randint(1, 8) if rng.random() < a.drop else None
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
                if any(ch.get("text") for ch in chunk.get("choices", [])):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                events += 1
                if drop_after is not None and events >= drop_after:
                    with self.lock:
                        self.dropped += 1
                    return
        except Exception as e:  # every failure is counted and shown, none stops the run
            with self.lock:
                self.errors.append(str(e))
            return
        finally:
            c.close()
        n = usage["completion_tokens"] if usage else 0
        with self.lock:
            self.done += 1
            self.tokens += n
            if first:
                self.ttft.append(first - t0)
            if first and n > 1:
                self.tpot.append((last - first) / (n - 1))

    def client(self, i, vocab):
        rng = random.Random(self.args.seed * 1000003 + i)
        for _ in range(self.args.requests):
            self.one(rng, vocab)

    def run(self):
        meta = self.get("/v1/models")["data"][0].get("meta", {})
        vocab = int(meta.get("vocab", 32000))
        t0 = time.perf_counter()
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
        }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=10, help="per client")
    p.add_argument("--prompt-tokens", type=span, default=(32, 512), help="LO:HI, drawn per request")
    p.add_argument("--max-tokens", type=span, default=(16, 256), help="LO:HI, drawn per request")
    p.add_argument("--drop", type=float, default=0.0, help="fraction of streams the client drops midway")
    p.add_argument("--api-key", default="")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    out = Load(args).run()
    print(json.dumps(out))
    raise SystemExit(1 if out["errors"] or out["slots_busy_after"] else 0)


if __name__ == "__main__":
    main()
