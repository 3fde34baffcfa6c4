#!/usr/bin/env python3
"""Runs ingot's ONNX exports in the Python onnxruntime (CUDA execution provider when the installed build has
it, else CPU) over the transformers references of the fixtures, with the same cases and tolerances as
tests/onnx/check.mjs (the CI's check in onnxruntime-node): full prefill, token-by-token decode, random chunk
splits, rows at different write indices in one call, and unwritten cache slots keeping their bytes (the
greedy-generation case is check.mjs's only).

  python3 tools/check_onnx.py --ingot build-gpu/bin/ingot [--provider cuda|cpu] [--out FILE.json]

Needs numpy and onnxruntime (1.23+ for opset 24's TensorScatter and Attention-24; the tensorrt-target exports,
opset 17, run on older ones); transformers is not needed, the references are the committed fixtures'. Says
what is missing and exits 2 when a package is absent. The exports are written by `ingot export` into a
temporary folder.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("tests/data/models/llama3", "tests/data/models/qwen2", "tests/data/models/qwen3",
          "tests/data/models/qwen3_swa", "tests/data/models/qwen3_5_text", "tests/data/models/qwen3_5_pattern",
          "tests/data/models/qwen3_5_wrapped", "models/demo")


def need(mod):
    try:
        return __import__(mod)
    except ImportError as e:
        print(f"check_onnx: python package {mod!r} is not installed here ({e}); cannot run", file=sys.stderr)
        sys.exit(2)


np = need("numpy")
ort = need("onnxruntime")


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(buf[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        out[name] = np.frombuffer(buf[8 + n + a:8 + n + b], dtype=dt).reshape(t["shape"])
    return out


def tolerances(dtype, compute, layers, ref):
    """check.mjs's: weights rounded (f32 compute) 48/4 u*s; f16 compute 64/4 u*s*sqrt(layers/2)."""
    if dtype == "f32":
        return dict(atol=1e-4, rtol=1e-4, mean=None, tie=None)
    s = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    u = 2.0 ** -8 if dtype == "bf16" else 2.0 ** -11
    act16 = compute != "f32"
    depth = float(np.sqrt(max(1.0, layers / 2.0))) if act16 else 1.0
    atol = (64 if act16 else 48) * u * s * depth
    return dict(atol=atol, rtol=0.0, mean=4 * u * s * depth, tie=atol)


class Judge:
    def __init__(self, tol):
        self.tol, self.d, self.flips, self.agree, self.n, self.bad = tol, [], 0, 0, 0, 0

    def add(self, ours, ref):  # [..., V] each
        d = np.abs(ours.astype(np.float64) - ref)
        self.d.append(d.ravel())
        self.bad += int(np.sum(~(d <= self.tol["atol"] + self.tol["rtol"] * np.abs(ref))))
        a, b = ours.reshape(-1, ours.shape[-1]), ref.reshape(-1, ref.shape[-1])
        same = a.argmax(-1) == b.argmax(-1)
        top2 = np.sort(b, -1)[:, -2:]
        needed = np.ones_like(same) if self.tol["tie"] is None else (top2[:, 1] - top2[:, 0]) >= self.tol["tie"]
        self.flips += int(np.sum(needed & ~same))
        self.agree += int(same.sum())
        self.n += len(same)

    def result(self):
        d = np.concatenate(self.d)
        ok = self.bad == 0 and self.flips == 0 and np.isfinite(d).all()
        if self.tol["mean"] is not None:
            ok = ok and d.mean() <= self.tol["mean"]
        return dict(max=float(d.max()), mean=float(d.mean()), agree=f"{self.agree}/{self.n}", ok=bool(ok))


def check(export_dir, ref_path, providers):
    c = json.load(open(os.path.join(export_dir, "ingot_export.json")))
    sess = ort.InferenceSession(os.path.join(export_dir, c["model"]), providers=providers)
    ref = read_safetensors(ref_path)
    ids, R = ref["input_ids"], ref["logits"].astype(np.float64)
    N, S = ids.shape
    cdt = np.float16 if c["cache"]["dtype"] == "float16" else np.float32
    shape = [i["shape"] for i in c["inputs"] if i["name"].startswith("past_key_values.")][0]
    names = [i["name"] for i in c["inputs"] if i["name"].startswith("past_key_values.")]
    # Qwen3.5's linear layers: f32 conv / recurrent states, each row's replaced whole by a call.
    states = {i["name"]: i["shape"] for i in c["inputs"] if i["name"].startswith(("past_conv_state.", "past_recurrent_state."))}
    saxis = c["cache"]["sequence_axis"]
    tol = tolerances(c["weight_dtype"], c.get("compute_dtype", "f32"), len(c["mask"]["window"]), R)

    def zeros(b):
        z = {n: np.zeros([b] + shape[1:], cdt) for n in names}
        z.update({n: np.zeros([b] + sh[1:], np.float32) for n, sh in states.items()})
        return z

    def present_name(n):
        return n.replace("past_key_values.", "present.") if n in names else n.replace("past_", "present_", 1)

    def run(x, wi, caches):
        out = sess.run(None, {"input_ids": x.astype(np.int64), "write_indices": np.asarray(wi, np.int64), **caches})
        onames = [o.name for o in sess.get_outputs()]
        res = dict(zip(onames, out))
        return res["logits"], {n: res[present_name(n)] for n in caches}

    cases = {}
    j = Judge(tol)
    lg, _ = run(ids, [0] * N, zeros(N))
    j.add(lg, R)
    cases["prefill"] = j.result()
    j, caches = Judge(tol), zeros(N)
    for s in range(S):
        lg, caches = run(ids[:, s:s + 1], [s] * N, caches)
        j.add(lg, R[:, s:s + 1])
    cases["decode"] = j.result()
    rng = np.random.default_rng(1234)
    j, caches, w = Judge(tol), zeros(N), 0
    while w < S:
        n = int(min(S - w, rng.integers(1, 8)))
        lg, caches = run(ids[:, w:w + n], [w] * N, caches)
        j.add(lg, R[:, w:w + n])
        w += n
    cases["chunks"] = j.result()
    k = 4
    offs = [S - k] if N == 1 else [round(r * (S - k) / (N - 1)) for r in range(N)]
    # Stale bytes everywhere, the states too: the row at write index 0 must not read its state.
    caches = {n: rng.uniform(-4, 4, [N] + shape[1:]).astype(cdt) for n in names}
    caches.update({n: rng.uniform(-4, 4, [N] + sh[1:]).astype(np.float32) for n, sh in states.items()})
    for r, w in enumerate(offs):
        if w:
            _, p = run(ids[r:r + 1, :w], [0], zeros(1))
            for n in states:  # a state is the whole carry of the row's first w tokens
                caches[n][r] = p[n][0]
            for n in names:
                idx = [slice(None)] * len(shape)
                idx[0], idx[saxis] = r, slice(0, w)
                src = [slice(None)] * len(shape)
                src[0], src[saxis] = 0, slice(0, w)
                caches[n][tuple(idx)] = p[n][tuple(src)]
    x = np.stack([ids[r, w:w + k] for r, w in enumerate(offs)])
    lg, present = run(x, offs, caches)
    j = Judge(tol)
    for r, w in enumerate(offs):
        j.add(lg[r], R[r, w:w + k])
    cases["mixed"] = j.result()
    kept = True
    for n in names:
        for r, w in enumerate(offs):
            a, b = np.moveaxis(caches[n][r], saxis - 1, 0), np.moveaxis(present[n][r], saxis - 1, 0)
            keep = np.ones(a.shape[0], bool)
            keep[w:w + k] = False
            kept &= a[keep].tobytes() == b[keep].tobytes()
    cases["unwritten slots keep their bytes"] = dict(ok=bool(kept))
    return c, cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out")
    a = ap.parse_args()
    avail = ort.get_available_providers()
    providers = ["CPUExecutionProvider"]
    if a.provider == "cuda":
        if "CUDAExecutionProvider" not in avail:
            print(f"check_onnx: onnxruntime {ort.__version__} here has no CUDAExecutionProvider ({avail}); "
                  "running on the CPU provider", file=sys.stderr)
        else:
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    print(f"onnxruntime {ort.__version__}, providers {providers}")
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            fix = os.path.basename(model)
            for target in ("onnxruntime", "tensorrt"):
                for layout in ("heads_first", "flattened"):
                    # fp16c: fp16 weights computing in fp16. Qwen3.5: f32 only, as tests/onnx/run.
                    dtypes = ("fp32", "fp16", "fp16c") + (("bf16",) if target == "onnxruntime" else ())
                    for dtype in (("fp32",) if fix.startswith("qwen3_5") else dtypes):
                        out = os.path.join(tmp, f"{fix}-{target}-{layout}-{dtype}")
                        mdir = os.path.join(REPO, model)
                        compute = "fp16" if dtype == "fp16c" else "fp32"
                        subprocess.run([a.ingot, "export", "--format", "onnx", "--model", mdir, "-o", out, "--dtype",
                                        dtype.rstrip("c"), "--compute", compute, "--layout", layout, "--target", target,
                                        "--capacity", "32"],
                                       check=True, stdout=subprocess.DEVNULL)
                        try:
                            c, cases = check(out, os.path.join(mdir, "reference.safetensors"), providers)
                        except Exception as e:  # a runtime refusing a form is a result to report
                            print(f"{os.path.basename(out)}: FAIL {type(e).__name__}: {e}")
                            failed += 1
                            rows.append(dict(export=os.path.basename(out), error=str(e)))
                            continue
                        ok = all(v["ok"] for v in cases.values())
                        failed += not ok
                        worst = max(v.get("max", 0) for v in cases.values())
                        print(f"{os.path.basename(out)} | max |dlogit| {worst:.2e} | "
                              + " | ".join(f"{k} {v.get('agree', '')} {'ok' if v['ok'] else 'FAIL'}" for k, v in cases.items()))
                        rows.append(dict(export=os.path.basename(out), cases=cases, ok=ok))
    print(f"{len(rows) - failed} of {len(rows)} exports pass")
    if a.out:
        json.dump(dict(onnxruntime=ort.__version__, providers=providers, rows=rows), open(a.out, "w"), indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
