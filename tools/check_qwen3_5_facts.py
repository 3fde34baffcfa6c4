#!/usr/bin/env python3
"""Prints the Qwen3.5 facts ingot must get right (issue 10, section 2), measured on transformers itself.

Loads Qwen3.5 fixtures made by tools/make_reference.py (fp32, CPU, eager, transformers' torch fallback for the
Gated DeltaNet), hooks every token mixer and compares what transformers computes with a from-scratch
re-implementation written from the stated facts, and with the plausible wrong alternatives. A fact holds when its
re-implementation matches to fp32 noise and each alternative does not. The output is meant to be pasted into docs.

Usage (from the repo root, on a machine with torch + transformers >= 5 that knows qwen3_5):
  python3 tools/check_qwen3_5_facts.py [FIXTURE_DIR ...]
Default: tests/data/models/qwen3_5_{text,wrapped,pattern}. Exit status 1 when a fact does not hold.

Written against huggingface/transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py at commit
d8c1e2844cbfeae1e342a1723d7f4e69ff1adcc0 and first run on transformers 5.17.0 / torch 2.11.0 (every fact held);
the script prints the installed file and the line of each piece it checks, so the docs can cite the version that
was really run.
"""

import inspect
import json
import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: a CPU-only fp32 run

TOL = 2e-5     # a re-implementation "matches" below this (fp32, tiny models)
APART = 1e-3   # an alternative is "ruled out" above this
FAILED = []


def fact(label, diff, alternatives, tol=TOL):
    """One line: the claim's max |diff| and each alternative's."""
    ok = diff <= tol and all(d > APART for d in alternatives.values())
    alt = "; ".join(f"{k}: {v:.2e}" for k, v in alternatives.items())
    print(f"  [{'OK' if ok else 'FAILED'}] {label}: max |diff| {diff:.2e}" + (f" (alternatives: {alt})" if alt else ""))
    if not ok:
        FAILED.append(label)


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = argv or [os.path.join("tests", "data", "models", n)
                    for n in ("qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern")]
    import torch
    import torch.nn.functional as F
    import transformers
    sys.path.insert(0, here)
    import make_reference as mr

    torch.set_default_dtype(torch.float32)
    M, forced = mr.hybrid_modeling_module("check_qwen3_5_facts")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"modeling file: {inspect.getsourcefile(M)}")
    print(f"fast-path kernels present and switched off for this run: {forced or 'none'}")
    src = os.path.basename(inspect.getsourcefile(M))
    for obj in ("Qwen3_5RMSNorm", "Qwen3_5RMSNormGated", "Qwen3_5GatedDeltaNet", "Qwen3_5Attention",
                "Qwen3_5TextRotaryEmbedding", "apply_rotary_pos_emb", "rotate_half", "l2norm",
                "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "torch_causal_conv1d_update",
                "eager_attention_forward", "Qwen3_5DecoderLayer", "Qwen3_5PreTrainedModel"):
        o = getattr(M, obj, None)
        if o is None:
            print(f"  {obj}: not in this version")
            continue
        lines, start = inspect.getsourcelines(o)
        print(f"  {src}:{start}-{start + len(lines) - 1} {obj}")
        if obj in ("Qwen3_5GatedDeltaNet", "Qwen3_5Attention", "Qwen3_5RMSNorm", "Qwen3_5RMSNormGated"):
            fwd = getattr(o, "forward", None)
            if fwd is not None:
                fl, fs = inspect.getsourcelines(fwd)
                print(f"  {src}:{fs}-{fs + len(fl) - 1} {obj}.forward")
    try:
        import transformers.models.qwen3_5.configuration_qwen3_5 as C
        cl, cs = inspect.getsourcelines(C.Qwen3_5TextConfig)
        print(f"  {os.path.basename(inspect.getsourcefile(C))}:{cs}-{cs + len(cl) - 1} Qwen3_5TextConfig")
        for i, line in enumerate(cl):
            if "full_attention_interval" in line or "partial_rotary_factor" in line:
                print(f"    line {cs + i}: {line.strip()}")
    except Exception as e:  # noqa: BLE001 - informational only
        print(f"  configuration source not inspected: {e}")

    for d in dirs:
        check_fixture(d, torch, F, mr, M)
    print()
    if FAILED:
        print(f"{len(FAILED)} fact(s) did not hold: {FAILED}")
        return 1
    print("every fact held")
    return 0


def check_fixture(path, torch, F, mr, M):
    import transformers
    with open(os.path.join(path, "config.json")) as f:
        cfg_json = json.load(f)
    arch = cfg_json["architectures"][0]
    cls = getattr(transformers, arch)
    model = cls.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    wrapped = arch == "Qwen3_5ForConditionalGeneration"
    tm = model.model.language_model if wrapped else model.model
    c = model.config.text_config if wrapped else model.config
    nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eps = c.rms_norm_eps
    print(f"\n{path}: {arch} (model_type {model.config.model_type}), text model_type {c.model_type}")
    print(f"  layer_types {list(c.layer_types)}; config.json gave "
          f"{'layer_types' if 'layer_types' in (cfg_json.get('text_config') or cfg_json) else ''} "
          f"{'full_attention_interval' if 'full_attention_interval' in (cfg_json.get('text_config') or cfg_json) else ''}")

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, c.vocab_size, (2, 20), generator=gen)
    captured = []

    def hook(mod, args, kwargs, out):
        x = kwargs.get("hidden_states", args[0] if args else None)
        captured.append((mod, x.detach().clone(), (out[0] if isinstance(out, tuple) else out).detach().clone()))
    hooks = []
    for layer in tm.layers:
        m = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        hooks.append(m.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    for h in hooks:
        h.remove()

    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    # --- norms ------------------------------------------------------------------------------------------------
    norm = tm.layers[0].input_layernorm
    x = torch.randn(4, c.hidden_size, generator=gen)
    with torch.no_grad():
        y = norm(x)
        fact(f"RMSNorm ({type(norm).__name__}) is x * rsqrt(mean(x^2) + eps) * (1 + w), weights stored around 0 "
             f"(|mean w| {float(norm.weight.mean()):.3f})",
             float((y - rms(x) * (1 + norm.weight)).abs().max()),
             {"x * w": float((y - rms(x) * norm.weight).abs().max())})
        xb = x.to(torch.bfloat16)
        nb = type(norm)(c.hidden_size, eps=eps).to(torch.bfloat16)
        nb.weight.copy_(norm.weight.to(torch.bfloat16))
        yb = nb(xb)
        exact = (rms(xb.float()) * (1 + nb.weight.float())).to(torch.bfloat16)
        folded = (rms(xb.float()).to(torch.bfloat16) * (1 + nb.weight)).to(torch.bfloat16)
        fact("  ... in fp32 for a bf16 model: (norm(x) * (1 + w)) computed in fp32, then rounded once",
             float((yb.float() - exact.float()).abs().max()),
             {"1 + w folded into a bf16 weight": float((yb.float() - folded.float()).abs().max())})

    # --- rotary -----------------------------------------------------------------------------------------------
    rot = tm.rotary_emb
    inv = rot.inv_freq.float()
    rd = inv.numel() * 2
    rp = c.rope_parameters if isinstance(c.rope_parameters, dict) else {}
    theta = float(rp.get("rope_theta"))
    prf = rp.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    print(f"  rotary: inv_freq has {inv.numel()} entries -> rotary dims {rd} of head_dim {hd} "
          f"(partial_rotary_factor {prf}); theta {theta}; mrope_section {rot.mrope_section}")
    i = torch.arange(0, rd, 2, dtype=torch.float32)
    fact(f"inv_freq[i] = theta^(-2i/rotary_dim), rotary_dim = int(head_dim * partial_rotary_factor) = {rd}",
         float((inv - theta ** (-i / rd)).abs().max() / inv.abs().max()),
         {"theta^(-2i/head_dim)": float((inv - theta ** (-i / hd)).abs().max() / inv.abs().max())}
         if rd != hd else {})
    with torch.no_grad():
        pos = torch.arange(20)[None]
        cos, sin = rot(torch.zeros(1, 20, hd), pos[None].expand(3, -1, -1))  # (t, h, w) positions all equal
        ang = pos[0, :, None].float() * inv[None]
        plain = torch.cat([ang, ang], -1)
        fact("text-only mRoPE reduces to 1-D positions: cos/sin = cos/sin(pos * inv_freq), halves repeated",
             float(max((cos[0] - plain.cos()).abs().max(), (sin[0] - plain.sin()).abs().max())), {})

    # --- token mixers -----------------------------------------------------------------------------------------
    def rope(t, denominator):
        S = t.shape[1]
        fr = theta ** (-torch.arange(0, rd, 2, dtype=torch.float32) / denominator)
        a = torch.arange(S, dtype=torch.float32)[:, None] * fr[None]
        cs, sn = a.cos()[None, :, None, :], a.sin()[None, :, None, :]
        t1, t2, rest = t[..., :rd // 2], t[..., rd // 2:rd], t[..., rd:]
        return torch.cat([t1 * cs - t2 * sn, t2 * cs + t1 * sn, rest], -1)

    def attention(at, x, gate_layout="per_head", gated=True, denominator=None, qk_norm_plus_one=True):
        B, S, _ = x.shape
        qg = x @ at.q_proj.weight.T
        if gate_layout == "per_head":
            v4 = qg.view(B, S, nh, 2 * hd)
            q, gate = v4[..., :hd], v4[..., hd:]
        else:
            q, gate = qg[..., :nh * hd].view(B, S, nh, hd), qg[..., nh * hd:].view(B, S, nh, hd)
        k = (x @ at.k_proj.weight.T).view(B, S, nkv, hd)
        v = (x @ at.v_proj.weight.T).view(B, S, nkv, hd)
        off = 1.0 if qk_norm_plus_one else 0.0
        q = rms(q) * (off + at.q_norm.weight)
        k = rms(k) * (off + at.k_norm.weight)
        q, k = rope(q, denominator or rd), rope(k, denominator or rd)
        k = k.repeat_interleave(nh // nkv, dim=2)  # query head h reads kv head h // (nh / nkv)
        v = v.repeat_interleave(nh // nkv, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * hd ** -0.5
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)
        if gated:
            o = o * torch.sigmoid(gate)
        return o.reshape(B, S, nh * hd) @ at.o_proj.weight.T

    def deltanet(la, x, grouping="interleave", q_scale=True, dt_bias=True, gated_norm_plus_one=False):
        B, S, _ = x.shape
        nk, nv, dk, dv = la.num_k_heads, la.num_v_heads, la.head_k_dim, la.head_v_dim
        K = la.conv1d.weight.shape[-1]
        qkv = (x @ la.in_proj_qkv.weight.T).transpose(1, 2)               # [B, C, S]
        w = la.conv1d.weight[:, 0, :]                                      # [C, K]
        padded = F.pad(qkv, (K - 1, 0))                                    # causal: K-1 zeros on the left
        conv = sum(w[None, :, j, None] * padded[:, :, j:j + S] for j in range(K))
        conv = F.silu(conv).transpose(1, 2)
        q, k, v = torch.split(conv, [nk * dk, nk * dk, nv * dv], -1)
        q, k, v = q.reshape(B, S, nk, dk), k.reshape(B, S, nk, dk), v.reshape(B, S, nv, dv)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        if q_scale:
            q = q * dk ** -0.5
        r = nv // nk
        idx = torch.arange(nv) // r if grouping == "interleave" else torch.arange(nv) % nk
        q, k = q[:, :, idx], k[:, :, idx]
        z = (x @ la.in_proj_z.weight.T).view(B, S, nv, dv)
        beta = torch.sigmoid(x @ la.in_proj_b.weight.T)
        a = x @ la.in_proj_a.weight.T
        g = -la.A_log.float().exp() * F.softplus(a + (la.dt_bias if dt_bias else 0.0))
        state = torch.zeros(B, nv, dk, dv)
        outs = []
        for t in range(S):
            state = state * g[:, t].exp()[..., None, None]
            kv = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
            delta = beta[:, t][..., None] * (v[:, t] - kv)
            state = state + k[:, t][..., None] * delta[..., None, :]
            outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
        o = torch.stack(outs, 1)                                           # [B, S, nv, dv]
        wn = la.norm.weight + (1.0 if gated_norm_plus_one else 0.0)
        o = rms(o) * wn * F.silu(z)
        return o.reshape(B, S, nv * dv) @ la.out_proj.weight.T

    seen_attn = seen_lin = False
    with torch.no_grad():
        for mod, x, out in captured:
            if hasattr(mod, "in_proj_qkv") and not seen_lin:
                seen_lin = True
                la = mod
                print(f"  linear layer: heads k {la.num_k_heads} / v {la.num_v_heads} (each key head serves "
                      f"{la.num_v_heads // la.num_k_heads} value heads), dk {la.head_k_dim}, dv {la.head_v_dim}, "
                      f"conv1d weight {tuple(la.conv1d.weight.shape)} groups {la.conv1d.groups} padding "
                      f"{la.conv1d.padding} bias {la.conv1d.bias is not None}, conv channels q|k|v = "
                      f"{la.key_dim}|{la.key_dim}|{la.value_dim}, norm {type(la.norm).__name__} "
                      f"(mean w {float(la.norm.weight.mean()):.3f})")
                alts = {"no 1/sqrt(dk) on q": deltanet(la, x, q_scale=False),
                        "g without dt_bias": deltanet(la, x, dt_bias=False),
                        "gated norm (1 + w)": deltanet(la, x, gated_norm_plus_one=True)}
                if la.num_v_heads // la.num_k_heads > 1 and la.num_k_heads > 1:
                    alts["value head j -> key head j % nk (tiled)"] = deltanet(la, x, grouping="tile")
                fact("Gated DeltaNet: in_proj_qkv -> depthwise causal conv1d (K-1 left zeros) + SiLU over q|k|v; "
                     "q, k L2-normalised (x * rsqrt(sum x^2 + 1e-6)), q * 1/sqrt(dk); value head j uses key head "
                     "j // (nv/nk); beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias); S <- exp(g) S; "
                     "S <- S + k (beta (v - S^T k))^T; o = S^T q; w * rmsnorm(o) * silu(z) per value head; out_proj",
                     float((deltanet(la, x) - out).abs().max()),
                     {k: float((v - out).abs().max()) for k, v in alts.items()})
            if hasattr(mod, "q_proj") and not seen_attn:
                seen_attn = True
                at = mod
                print(f"  attention layer: q_proj {tuple(at.q_proj.weight.shape)} = 2 x heads {nh} x hd {hd}, "
                      f"k/v_proj {tuple(at.k_proj.weight.shape)}, scaling {getattr(at, 'scaling', None)}")
                alts = {"q_proj = all queries then all gates": attention(at, x, gate_layout="split"),
                        "no output gate": attention(at, x, gated=False),
                        "q/k norm x * w": attention(at, x, qk_norm_plus_one=False)}
                if rd != hd:
                    alts["rotary denominator head_dim"] = attention(at, x, denominator=hd)
                fact("gated attention: q_proj rows per head = [hd query | hd gate]; q/k RMSNorm x(1+w) per head "
                     f"before RoPE; RoPE (rotate-half pairs i, i+{rd // 2}) on the first {rd} dims only; GQA; "
                     "softmax(q k^T / sqrt(hd)); output * sigmoid(gate) before o_proj",
                     float((attention(at, x) - out).abs().max()),
                     {k: float((v - out).abs().max()) for k, v in alts.items()})

        # --- whole model from the facts -----------------------------------------------------------------------
        h = tm.embed_tokens(ids)
        for layer in tm.layers:
            n = rms(h) * (1 + layer.input_layernorm.weight)
            h = h + (deltanet(layer.linear_attn, n) if hasattr(layer, "linear_attn") else attention(layer.self_attn, n))
            n = rms(h) * (1 + layer.post_attention_layernorm.weight)
            mlp = layer.mlp
            h = h + (F.silu(n @ mlp.gate_proj.weight.T) * (n @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
        h = rms(h) * (1 + tm.norm.weight)
        ours = h @ model.get_output_embeddings().weight.T
        fact("whole model re-implemented from these facts reproduces transformers' logits",
             float((ours - logits).abs().max()), {}, tol=1e-4)
    if not (seen_attn and seen_lin):
        print("  (this fixture lacks one of the two layer kinds)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
