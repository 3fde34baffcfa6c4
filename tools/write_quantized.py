#!/usr/bin/env python3
"""The published INT4 checkpoint formats, written by us from their published layouts (no quantization
library is reachable here), as test fixtures with transformers fp32 reference logits on the
dequantized weights. Runs on the GPU machine (torch + transformers); one command writes them all:

    python3 tools/write_quantized.py --out tests/data/models/int4

For each case it reads a committed fixture (tests/data/models/<source>: fp32 weights and a
reference.safetensors whose input ids it reuses), quantizes the decoder layers' q/k/v/o/gate/up/down
projections round-to-nearest per group (the rounding step GPTQ/AWQ/llm-compressor use, without their
error feedback or scale search, which only choose other values in the same layout), packs them in the
format, and writes:

    <out>/<name>/config.json              the source config + quantization_config
    <out>/<name>/model.safetensors        packed tensors; embeddings, norms, biases, head as fp16
    <out>/<name>/reference.safetensors    input_ids, logits, greedy ids/margins (the ingot-reference format)
    <out>/manifest.json                   the cases (tests/test_int4_formats.cpp runs parity on each)

The reference is transformers' eager fp32 forward of the source model with every quantized weight
replaced by its dequantized value (q - zero) * scale (fp16 scale widened to fp32) and every other
weight rounded to fp16 as stored: exactly what a reader of the folder must compute.

Layouts (docs/quantization.md cites the projects that define them):
  GPTQ  qweight int32 [in/8, out] (input i at bits 4*(i%8) of row i/8), qzeros int32 [groups, out/8]
        (output o at bits 4*(o%8)), stored zero - 1 by checkpoint_format "gptq", zero by "gptq_v2",
        scales fp16 [groups, out], g_idx int32 [in] (group of each input feature; act-order scatters it).
  AWQ   gemm: qweight int32 [in, out/8] and qzeros int32 [groups, out/8], nibble j of column c holding
        output 8c + [0, 2, 4, 6, 1, 3, 5, 7][j]; scales fp16 [groups, out].
  compressed-tensors pack-quantized: weight_packed int32 [out, in/8] (signed value + 8, input i at bits
        4*(i%8)), weight_scale [out, groups], weight_zero_point int32 [out/8, groups] packed along the
        rows (asymmetric only, signed + 8), weight_shape int32 [2].
"""
import argparse
import json
import os
import shutil
import sys
import zlib

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Modules that read one input (fused by ingot into one weight): one act-order permutation per group.
SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "o_proj": "o",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "down"}

# name, source fixture, method, format/strategy, group size (-1: whole row), symmetric, act-order
CASES = [
    ("gptq_v1_sym_g32", "llama3", "gptq", "gptq", 32, True, False),
    ("gptq_v1_asym_actorder_g32", "llama3", "gptq", "gptq", 32, False, True),
    ("gptq_v2_asym_row_qwen2", "qwen2", "gptq", "gptq_v2", -1, False, False),
    ("gptq_v2_sym_actorder_g64_qwen3", "qwen3", "gptq", "gptq_v2", 64, True, True),
    ("awq_gemm_g32", "llama3", "awq", "gemm", 32, False, False),
    ("ct_group_sym_g32_qwen3", "qwen3", "compressed-tensors", "group", 32, True, False),
    ("ct_group_asym_g64", "llama3", "compressed-tensors", "group", 64, False, False),
    ("ct_channel_sym_qwen2", "qwen2", "compressed-tensors", "channel", -1, True, False),
    ("ct_channel_asym", "llama3", "compressed-tensors", "channel", -1, False, False),
]
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def fail(name, msg):
    print(f"error: {name}: {msg}", file=sys.stderr)
    sys.exit(1)


def quant_config(method, fmt, group, sym, act):
    if method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym, "desc_act": act,
                "checkpoint_format": fmt, "true_sequential": True, "damp_percent": 0.01}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
    w = {"num_bits": 4, "type": "int", "symmetric": sym, "strategy": fmt, "dynamic": False, "actorder": None,
         "observer": "minmax"}
    if fmt == "group":
        w["group_size"] = group
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "global_compression_ratio": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                          "output_activations": None, "format": "pack-quantized"}}}


def to_i32(x):
    """int64 values in [0, 2^32) as int32 with the same bits."""
    import torch
    return torch.where(x >= 2 ** 31, x - 2 ** 32, x).to(torch.int32)


def quantize(torch, w, group, sym, method, fmt, order):
    """Round to nearest per group of the columns taken in `order` (act-order) or as they are.
    Returns q [out, in] 0..15 (input-feature order), zero [out, groups] 0..15, scale [out, groups] fp16,
    g_idx [in]."""
    out, inn = w.shape
    G = inn if group < 0 else group
    groups = inn // G
    g_idx = torch.empty(inn, dtype=torch.int64)
    g_idx[order] = torch.arange(inn) // G
    wg = w[:, order].reshape(out, groups, G).double()
    if sym:
        amax = wg.abs().amax(dim=2)
        # GPTQ: scale = 2 max|w| / 15, zero 8; compressed-tensors: max|w| / 7.5 (the same number).
        scale = (amax / 7.5).clamp_min(2 ** -14).to(torch.float16)  # never 0 or subnormal in fp16
        zero = torch.full((out, groups), 8, dtype=torch.int64)
    else:
        lo = wg.amin(dim=2).clamp_max(0)
        hi = wg.amax(dim=2).clamp_min(0)
        scale = ((hi - lo) / 15).clamp_min(2 ** -14).to(torch.float16)
        zero = torch.round(-lo / scale.double()).to(torch.int64)
        # checkpoint_format "gptq" stores zero - 1 and cannot hold zero 0 (the v1 overflow): keep it >= 1.
        zero = zero.clamp(1 if (method == "gptq" and fmt == "gptq") else 0, 15)
    s = scale.double().unsqueeze(2)
    q = torch.clamp(torch.round(wg / s) + zero.unsqueeze(2), 0, 15).to(torch.int64)
    q_in_order = torch.empty(out, inn, dtype=torch.int64)
    q_in_order[:, order] = q.reshape(out, inn)
    return q_in_order, zero, scale, g_idx


def dequantize(torch, q, zero, scale, g_idx):
    """(q - zero) * scale in fp32 with each feature's group: what every reader computes."""
    z = zero[:, g_idx]
    s = scale.float()[:, g_idx]
    return (q - z).float() * s


def pack(torch, name, method, fmt, q, zero, scale, g_idx, sym):
    """The published tensors of one module."""
    out, inn = q.shape
    groups = zero.shape[1]
    t = {}
    if method == "gptq":
        qw = torch.zeros(inn // 8, out, dtype=torch.int64)
        for j in range(8):
            qw |= q[:, j::8].t() << (4 * j)
        stored = zero - 1 if fmt == "gptq" else zero
        qz = torch.zeros(groups, out // 8, dtype=torch.int64)
        for j in range(8):
            qz |= stored[j::8, :].t() << (4 * j)
        t = {"qweight": to_i32(qw), "qzeros": to_i32(qz), "scales": scale.t().contiguous(),
             "g_idx": g_idx.to(torch.int32)}
    elif method == "awq":
        qw = torch.zeros(inn, out // 8, dtype=torch.int64)
        qz = torch.zeros(groups, out // 8, dtype=torch.int64)
        for j in range(8):
            qw |= q[AWQ_ORDER[j]::8, :].t() << (4 * j)
            qz |= zero[AWQ_ORDER[j]::8, :].t() << (4 * j)
        t = {"qweight": to_i32(qw), "qzeros": to_i32(qz), "scales": scale.t().contiguous()}
    else:
        # pack_to_int32: the signed value (q - 8) shifted back by + 8, i.e. the nibble q itself.
        wp = torch.zeros(out, inn // 8, dtype=torch.int64)
        for j in range(8):
            wp |= q[:, j::8] << (4 * j)
        t = {"weight_packed": to_i32(wp), "weight_scale": scale.contiguous(),
             "weight_shape": torch.tensor([out, inn], dtype=torch.int32)}
        if not sym:
            zp = torch.zeros(out // 8, groups, dtype=torch.int64)
            for j in range(8):
                zp |= zero[j::8, :] << (4 * j)
            t["weight_zero_point"] = to_i32(zp)
    return {f"{name}.{k}": v.contiguous() for k, v in t.items()}


def unpack_check(torch, case, name, method, fmt, t, q, zero, sym):
    """Reads the written tensors back by the published unpack rule and compares: the writer's self-check."""
    u32 = lambda x: x.to(torch.int64) & 0xFFFFFFFF
    out, inn = q.shape
    if method in ("gptq", "awq"):
        qw, qz = u32(t[f"{name}.qweight"]), u32(t[f"{name}.qzeros"])
        if method == "gptq":
            got_q = torch.stack([(qw >> (4 * j)) & 15 for j in range(8)], dim=1).reshape(inn, out).t()
            got_z = torch.stack([(qz >> (4 * j)) & 15 for j in range(8)], dim=2).reshape(qz.shape[0], out).t()
            if fmt == "gptq":
                got_z = got_z + 1
        else:
            rev = [AWQ_ORDER.index(k) for k in range(8)]
            got_q = torch.stack([(qw >> (4 * rev[k])) & 15 for k in range(8)], dim=2).reshape(inn, out).t()
            got_z = torch.stack([(qz >> (4 * rev[k])) & 15 for k in range(8)], dim=2).reshape(qz.shape[0], out).t()
    else:
        wp = u32(t[f"{name}.weight_packed"])
        got_q = torch.stack([(wp >> (4 * j)) & 15 for j in range(8)], dim=2).reshape(out, inn)
        if sym:
            got_z = torch.full_like(zero, 8)
        else:
            zp = u32(t[f"{name}.weight_zero_point"])
            got_z = torch.stack([(zp >> (4 * j)) & 15 for j in range(8)], dim=1).reshape(out, zp.shape[1])
    if not torch.equal(got_q, q) or not torch.equal(got_z, zero):
        fail(case, f"{name}: the packed tensors do not unpack to the quantized values")


def write_case(torch, transformers, srcdir, outdir, case):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    name, source, method, fmt, group, sym, act = case
    src = os.path.join(srcdir, source)
    dst = os.path.join(outdir, name)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    model = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    tensors = {}
    perms = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            mod = pname.rsplit(".", 2)
            is_linear = pname.startswith("model.layers.") and pname.endswith(".weight") and mod[-2] in LINEAR
            if not is_linear:
                p.copy_(p.to(torch.float16).float())  # stored as fp16, so the reference sees fp16 values
                continue
            w = p.detach().cpu()
            layer = pname.split(".")[2]
            key = (layer, SHARED_INPUT[mod[-2]])
            if key not in perms:
                perms[key] = torch.randperm(w.shape[1], generator=gen) if act else torch.arange(w.shape[1])
            q, zero, scale, g_idx = quantize(torch, w, group, sym, method, fmt, perms[key])
            prefix = pname[: -len(".weight")]
            t = pack(torch, prefix, method, fmt, q, zero, scale, g_idx, sym)
            unpack_check(torch, name, prefix, method, fmt, t, q, zero, sym)
            tensors.update(t)
            p.copy_(dequantize(torch, q, zero, scale, g_idx).to(p.device))
        sd = model.state_dict()
        for k, v in sd.items():
            mod = k.rsplit(".", 2)
            if k.startswith("model.layers.") and k.endswith(".weight") and mod[-2] in LINEAR:
                continue
            if k == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            if k.endswith("rotary_emb.inv_freq"):
                continue
            tensors[k] = v.detach().cpu().to(torch.float16).contiguous()
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["torch_dtype"] = "float32"  # the reference's dtype; ingot builds f32 engines from it by default
    cfg["quantization_config"] = quant_config(method, fmt, group, sym, act)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    if os.path.exists(os.path.join(src, "generation_config.json")):
        shutil.copy(os.path.join(src, "generation_config.json"), dst)

    ref_src = load_file(os.path.join(src, "reference.safetensors"))
    input_ids = ref_src["input_ids"]
    P = int(ref_src["greedy_prompt_len"][0])
    G = ref_src["greedy_ids"].shape[1] - P
    with torch.no_grad():
        logits = model(input_ids=input_ids, use_cache=False).logits.to(torch.float32).contiguous()
        if not torch.isfinite(logits).all():
            fail(name, "logits contain non-finite values")
        seqs = input_ids[:, :P].clone()
        margins = []
        for _ in range(G):
            last = model(input_ids=seqs, use_cache=False).logits[:, -1, :].to(torch.float32)
            top2 = torch.topk(last, 2, dim=-1).values
            margins.append(top2[:, 0] - top2[:, 1])
            seqs = torch.cat([seqs, torch.argmax(last, dim=-1, keepdim=True)], dim=1)
    ref = {"input_ids": input_ids.contiguous(), "logits": logits,
           "greedy_prompt_len": torch.tensor([P], dtype=torch.int64), "greedy_ids": seqs.contiguous(),
           "greedy_margin": torch.stack(margins, dim=1).contiguous()}
    for k in ("rope_inv_freq", "rope_attention_scaling"):
        if k in ref_src:
            ref[k] = ref_src[k]
    meta = {"format": "ingot-reference", "format_version": "1", "name": name,
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "source_fixture": source, "quantization": json.dumps(cfg["quantization_config"], sort_keys=True),
            "note": "logits of the source model with each quantized weight replaced by (q - zero) * scale"}
    save_file(ref, os.path.join(dst, "reference.safetensors"), metadata=meta)
    size = sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst))
    print(f"{name}: {method} {fmt} group {group} {'sym' if sym else 'asym'}{' act-order' if act else ''} "
          f"from {source}: {len(tensors)} tensors, {size} bytes, min greedy margin "
          f"{float(ref['greedy_margin'].min()):.4g}", flush=True)
    return {"name": name, "source": source, "method": method, "format": fmt, "group_size": group,
            "symmetric": sym, "act_order": act}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "models", "int4"))
    ap.add_argument("--sources", default=os.path.join(here, "..", "tests", "data", "models"),
                    help="folder of the fp32 fixtures the cases start from")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    import torch
    import transformers
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    cases = [c for c in CASES if not only or c[0] in only]
    if only and len(cases) != len(only):
        fail("--only", f"unknown case names: {sorted(only - {c[0] for c in CASES})}")
    written = [write_case(torch, transformers, a.sources, a.out, c) for c in cases]
    manifest_path = os.path.join(a.out, "manifest.json")
    entries = {e["name"]: e for e in (json.load(open(manifest_path))["fixtures"] if only and os.path.exists(manifest_path) else [])}
    entries.update({e["name"]: e for e in written})
    manifest = {"generator": "tools/write_quantized.py", "format_version": "1",
                "fixtures": [entries[c[0]] for c in CASES if c[0] in entries]}
    json.dump(manifest, open(manifest_path, "w"), indent=2)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(a.out) for f in fs)
    print(f"wrote {len(written)} fixture(s) and {manifest_path}; {total} bytes under {a.out}")


if __name__ == "__main__":
    main()
