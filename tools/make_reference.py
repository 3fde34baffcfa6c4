#!/usr/bin/env python3
"""Makes tiny random-weight Hugging Face checkpoints plus reference outputs for ingot's correctness tests.

Each checkpoint folder gets config.json (written by hand, in the "classic" rope_theta/rope_scaling form or the
"new" transformers-5 rope_parameters form), generation_config.json, the weights as one model.safetensors or as
shards + model.safetensors.index.json, and reference.safetensors holding input ids, the logits of one eager fp32
forward of transformers on the CPU and a greedy continuation. The format is described in docs/reference-format.md.

Modes:
  --fixtures OUTDIR                     the small committed fixture set + OUTDIR/manifest.json
  --unseen OUTDIR --count K --seed S    K randomized checkpoints, all choices derived from S
  --one OUTDIR/name [options]           one checkpoint with explicit options
  --dry-run                             with any mode: only config files and the planned tensor/shard layout,
                                        needs neither torch nor transformers

Needs (except --dry-run): torch, transformers >= 5, safetensors. Runs on the CPU even when a GPU exists, so no
TF32 or GPU kernel choice can touch the references.

Qwen3.5 (family "qwen3_5": hybrid Gated DeltaNet + gated attention) has its own options (config_form "text" for
Qwen3_5ForCausalLM / model_type qwen3_5_text, "wrapped" for the published Qwen3_5ForConditionalGeneration with
text_config + a tiny vision tower and weights under model.language_model.*). Facts used here were read from
huggingface/transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py at commit
d8c1e2844cbfeae1e342a1723d7f4e69ff1adcc0 and configuration_qwen3_5.py at commit
8116e632367180f6edec221d17cd36513334d169 (stored snapshots), then checked against the installed transformers
5.17.0 / torch 2.11.0 (modeling_qwen3_5.py there: @strict configs, kernels chosen at import through
use_kernel_func_from_hub_with_fallback). The run itself checks what the installed transformers does; see also
tools/check_qwen3_5_facts.py.
"""

import argparse
import copy
import json
import math
import os
import random
import sys
import tempfile

FAMILIES = ("llama", "qwen2", "qwen3")  # the --unseen generator draws from these (unchanged, so its sets stay)
HYBRID_FAMILIES = ("qwen3_5",)
ALL_FAMILIES = FAMILIES + HYBRID_FAMILIES
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
FORMAT_VERSION = "1"

# Defaults shared by --one and the fixtures (the brief's fixture geometry).
DEFAULTS = dict(
    family="llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=0, write_head_dim=None, intermediate=128,
    vocab=512, max_pos=0, rms_eps=1e-6, rope="default", rope_theta=10000.0, rope_factor=0.0, rope_original_max=0,
    yarn_beta_fast=0.0, yarn_beta_slow=0.0, config_form="classic", sliding_window=0, max_window_layers=0,
    shard_bytes=0, expect_shards=0, tie=False, bias=None, eos_list=False, bos=1, rows=4, seq=24, greedy_prompt=8,
    greedy_new=8, init_std=0.08, seed=0,
)


# ----------------------------------------------------------------------------------------------------------------
# Options -> config dicts and expected tensor layout (pure Python, also used by --dry-run)
# ----------------------------------------------------------------------------------------------------------------

class OptionError(Exception):
    pass


def normalize(o):
    """Fills family-dependent defaults and rejects combinations transformers would not mean the way we intend."""
    o = dict(o)
    fam = o["family"]
    if fam not in ALL_FAMILIES:
        raise OptionError(f"family {fam!r} not in {ALL_FAMILIES}")
    if fam in HYBRID_FAMILIES:
        return normalize_hybrid(o)
    stray = sorted(k for k in HYBRID_DEFAULTS if k in o)
    if stray:
        raise OptionError(f"options {stray} exist only for family qwen3_5")
    if o["hidden"] % o["heads"] != 0:
        # LlamaConfig rejects this outright; keep every family to the same rule.
        raise OptionError(f"hidden {o['hidden']} is not a multiple of heads {o['heads']}")
    if o["heads"] % o["kv_heads"] != 0:
        raise OptionError(f"heads {o['heads']} is not a multiple of kv_heads {o['kv_heads']}")
    natural = o["hidden"] // o["heads"]
    if not o["head_dim"]:
        o["head_dim"] = natural
    if o["head_dim"] % 2:
        raise OptionError(f"head_dim {o['head_dim']} must be even for rotary embeddings")
    if fam == "qwen2" and o["head_dim"] != natural:
        # Qwen2Config has no head_dim field; real Qwen2 checkpoints always use hidden/heads.
        raise OptionError("qwen2 needs head_dim == hidden/heads")
    if o["write_head_dim"] is None:
        o["write_head_dim"] = o["head_dim"] != natural
    if fam == "qwen3":
        # Qwen3Config's head_dim default is 128, not hidden/heads, so a qwen3 config must always state it.
        o["write_head_dim"] = True
    if fam == "qwen2":
        o["write_head_dim"] = False
    if o["head_dim"] != natural and not o["write_head_dim"]:
        raise OptionError("head_dim differs from hidden/heads, so it must be written to config.json")
    if fam == "qwen2":
        if o["bias"] is False:
            raise OptionError("qwen2 always has q/k/v biases; --no-bias is not possible")
        o["bias"] = True
    elif o["bias"] is None:
        o["bias"] = False
    if o["rope"] not in ROPE_TYPES:
        raise OptionError(f"rope {o['rope']!r} not in {ROPE_TYPES}")
    if o["rope"] != "default" and not o["rope_factor"]:
        o["rope_factor"] = {"linear": 2.0, "llama3": 8.0, "yarn": 4.0}[o["rope"]]
    if o["rope"] in ("llama3", "yarn") and not o["rope_original_max"]:
        o["rope_original_max"] = 32 if o["rope"] == "llama3" else 16
    if not o["max_pos"]:
        o["max_pos"] = int(o["rope_factor"] * o["rope_original_max"]) if o["rope"] == "yarn" else 256
    if o["rope"] == "yarn" and o["rope_factor"] * o["rope_original_max"] != o["max_pos"]:
        # transformers warns and keeps the explicit factor when max_position_embeddings disagrees with
        # factor * original_max_position_embeddings; older versions used the ratio instead. Keeping them equal
        # makes the reference independent of that choice.
        raise OptionError(f"yarn needs max_pos == factor * original_max ({o['rope_factor']} * "
                          f"{o['rope_original_max']}), got {o['max_pos']}")
    if o["config_form"] not in ("classic", "new"):
        raise OptionError(f"config_form {o['config_form']!r} not in (classic, new)")
    if o["sliding_window"]:
        if fam == "llama":
            raise OptionError("llama has no sliding-window attention")
        if not 0 <= o["max_window_layers"] < o["layers"]:
            raise OptionError(f"max_window_layers {o['max_window_layers']} leaves no sliding layer "
                              f"among {o['layers']} layers")
    if o["greedy_prompt"] < 1 or o["greedy_prompt"] > o["seq"]:
        raise OptionError(f"greedy_prompt {o['greedy_prompt']} must be in 1..seq ({o['seq']})")
    longest = max(o["seq"], o["greedy_prompt"] + o["greedy_new"])
    if longest > o["max_pos"]:
        raise OptionError(f"sequences of {longest} tokens exceed max_position_embeddings {o['max_pos']}")
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "rows", "seq", "greedy_new"):
        if o[k] < 1:
            raise OptionError(f"{k} must be >= 1, got {o[k]}")
    if o["bos"] >= o["vocab"] or o["vocab"] < 4:
        raise OptionError("vocab too small for the special token ids")
    return o


def layer_types(o):
    w = o["sliding_window"]
    return ["sliding_attention" if w and i >= o["max_window_layers"] else "full_attention"
            for i in range(o["layers"])]


def eos_ids(o):
    return [2, o["vocab"] - 1] if o["eos_list"] else 2


def rope_fields(o):
    """The scaling fields shared by both config forms (everything but theta)."""
    r = o["rope"]
    if r == "default":
        return {"rope_type": "default"}
    d = {"rope_type": r, "factor": float(o["rope_factor"])}
    if r == "llama3":
        d.update(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=o["rope_original_max"])
    elif r == "yarn":
        d["original_max_position_embeddings"] = o["rope_original_max"]
        if o["yarn_beta_fast"]:
            d["beta_fast"] = float(o["yarn_beta_fast"])
        if o["yarn_beta_slow"]:
            d["beta_slow"] = float(o["yarn_beta_slow"])
    return d


def build_config(o):
    fam = o["family"]
    if fam in HYBRID_FAMILIES:
        return build_hybrid_config(o)
    eos = eos_ids(o)
    c = {
        "architectures": [ARCH[fam]],
        "model_type": fam,
        "hidden_size": o["hidden"],
        "intermediate_size": o["intermediate"],
        "num_hidden_layers": o["layers"],
        "num_attention_heads": o["heads"],
        "num_key_value_heads": o["kv_heads"],
        "hidden_act": "silu",
        "rms_norm_eps": o["rms_eps"],
        "vocab_size": o["vocab"],
        "max_position_embeddings": o["max_pos"],
        "initializer_range": 0.02,
        "tie_word_embeddings": o["tie"],
        "bos_token_id": o["bos"],
        # config.json carries one id like real Qwen2/Llama 3 configs; generation_config.json may carry a list.
        "eos_token_id": eos[0] if isinstance(eos, list) else eos,
        "use_cache": True,
        "attention_dropout": 0.0,
    }
    if o["write_head_dim"]:
        c["head_dim"] = o["head_dim"]
    if fam == "llama":
        c["attention_bias"] = o["bias"]
        c["mlp_bias"] = False
        if o["config_form"] == "classic":
            c["pretraining_tp"] = 1
    elif fam == "qwen3":
        c["attention_bias"] = o["bias"]
    if fam in ("qwen2", "qwen3"):
        w = o["sliding_window"]
        c["use_sliding_window"] = bool(w)
        # With the window off, classic configs carry a dormant number (as Qwen2.5 does) and new ones null, so the
        # engine must honour use_sliding_window rather than the mere presence of sliding_window.
        c["sliding_window"] = w if w else (4096 if o["config_form"] == "classic" else None)
        c["max_window_layers"] = o["max_window_layers"] if w else o["layers"]
        if o["config_form"] == "new":
            c["layer_types"] = layer_types(o)
    if o["config_form"] == "classic":
        c["rope_theta"] = float(o["rope_theta"])
        c["rope_scaling"] = None if o["rope"] == "default" else rope_fields(o)
        c["torch_dtype"] = "float32"
    else:
        rp = rope_fields(o)
        rp["rope_theta"] = float(o["rope_theta"])
        c["rope_parameters"] = rp
        c["dtype"] = "float32"
    return c


def build_generation_config(o):
    return {"bos_token_id": o["bos"], "eos_token_id": eos_ids(o)}


def expected_tensors(o):
    """Hugging Face names and shapes in the order we write them (also the sharding order)."""
    if o["family"] in HYBRID_FAMILIES:
        return hybrid_tensors(o)
    H, hd, nh, nkv, I, V = o["hidden"], o["head_dim"], o["heads"], o["kv_heads"], o["intermediate"], o["vocab"]
    fam = o["family"]
    qkv_bias = o["bias"]
    o_bias = o["bias"] and fam != "qwen2"
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(o["layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (H,)))
        for proj, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
            out.append((p + f"self_attn.{proj}_proj.weight", (rows, H)))
            if qkv_bias:
                out.append((p + f"self_attn.{proj}_proj.bias", (rows,)))
        out.append((p + "self_attn.o_proj.weight", (H, nh * hd)))
        if o_bias:
            out.append((p + "self_attn.o_proj.bias", (H,)))
        if fam == "qwen3":
            out.append((p + "self_attn.q_norm.weight", (hd,)))
            out.append((p + "self_attn.k_norm.weight", (hd,)))
        out.append((p + "post_attention_layernorm.weight", (H,)))
        out.append((p + "mlp.gate_proj.weight", (I, H)))
        out.append((p + "mlp.up_proj.weight", (I, H)))
        out.append((p + "mlp.down_proj.weight", (H, I)))
    out.append(("model.norm.weight", (H,)))
    if not o["tie"]:
        out.append(("lm_head.weight", (V, H)))
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def plan_shards(tensors, shard_bytes):
    """Greedy split in write order: a new shard starts when the next tensor would push past the byte budget."""
    if not shard_bytes:
        return [[name for name, _ in tensors]]
    shards, cur, cur_bytes = [], [], 0
    for name, shape in tensors:
        size = numel(shape) * 4
        if cur and cur_bytes + size > shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += size
    shards.append(cur)
    return shards


def shard_file_names(n):
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------------------
# Qwen3.5: options -> config dicts and tensor layout (pure Python, also used by --dry-run)
# ----------------------------------------------------------------------------------------------------------------

# Keys only a qwen3_5 option dict has (so the existing families' options, and thus their committed manifest and
# reference metadata, stay byte-identical). Shared keys (hidden, layers, heads, ...) come from DEFAULTS.
HYBRID_DEFAULTS = dict(
    layer_config="interval",    # "interval": write full_attention_interval only; "types": layer_types only;
                                # "both": both, agreeing (as the published configs do)
    full_attention_interval=2,  # layer i is full attention iff (i + 1) % interval == 0 (transformers' rule)
    layer_pattern="",           # with layer_config "types": one letter per layer, F = full, L = linear
    lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16, conv_kernel=4,
    partial_rotary=0.25,        # RoPE on the first partial_rotary * head_dim dims of each head
    partial_rotary_top=False,   # also write partial_rotary_factor at the top of the text config
    mrope_section=None,         # [t, h, w] written into rope_parameters with mrope_interleaved (published form)
    vision=None,                # wrapped only: a tiny vision tower whose weights are saved too (model.visual.*);
                                # None: on for wrapped (without vision_config transformers builds its 27-block
                                # default tower, randomly initialised)
    # Widened init so that decays, betas and gates spread over their ranges (see init_hybrid()).
    a_log_range=[-2.5, 1.0], dt_bias_std=1.0, ab_proj_std=0.25, conv_std=0.3, norm_std=0.1,
)
HYBRID_ARCH = {"text": "Qwen3_5ForCausalLM", "wrapped": "Qwen3_5ForConditionalGeneration"}
HYBRID_MODEL_TYPE = {"text": "qwen3_5_text", "wrapped": "qwen3_5"}


def tiny_vision_config(o):
    # Qwen3_5VisionConfig fields; out_hidden_size must be the text hidden size. num_position_embeddings is a square.
    return dict(depth=1, hidden_size=16, hidden_act="gelu_pytorch_tanh", intermediate_size=32, num_heads=2,
                in_channels=3, patch_size=2, spatial_merge_size=2, temporal_patch_size=2,
                out_hidden_size=o["hidden"], num_position_embeddings=4, initializer_range=0.02)


def hybrid_layer_types(o):
    if o["layer_config"] == "types":
        return ["full_attention" if c == "F" else "linear_attention" for c in o["layer_pattern"]]
    n = o["full_attention_interval"]
    return ["linear_attention" if (i + 1) % n else "full_attention" for i in range(o["layers"])]


def rotary_dim(o):
    return int(round(o["head_dim"] * o["partial_rotary"]))


def normalize_hybrid(o):
    for k, v in HYBRID_DEFAULTS.items():
        o.setdefault(k, copy.deepcopy(v))
    unknown = sorted(set(o) - set(DEFAULTS) - set(HYBRID_DEFAULTS))
    if unknown:
        raise OptionError(f"unknown options {unknown}")
    if o["config_form"] not in HYBRID_ARCH:
        raise OptionError(f"qwen3_5 config_form {o['config_form']!r} not in {tuple(HYBRID_ARCH)}")
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "rows", "seq", "greedy_new",
              "lin_k_heads", "lin_v_heads", "lin_k_dim", "lin_v_dim"):
        if o[k] < 1:
            raise OptionError(f"{k} must be >= 1, got {o[k]}")
    if o["heads"] % o["kv_heads"]:
        raise OptionError(f"heads {o['heads']} is not a multiple of kv_heads {o['kv_heads']}")
    if o["lin_v_heads"] % o["lin_k_heads"]:
        raise OptionError(f"lin_v_heads {o['lin_v_heads']} is not a multiple of lin_k_heads {o['lin_k_heads']}")
    if not o["head_dim"]:
        o["head_dim"] = o["hidden"] // o["heads"]
    o["write_head_dim"] = True  # Qwen3_5TextConfig's head_dim default is 256, so it is always written
    if not 0.0 < o["partial_rotary"] <= 1.0:
        raise OptionError(f"partial_rotary {o['partial_rotary']} must be in (0, 1]")
    rd = o["head_dim"] * o["partial_rotary"]
    if abs(rd - round(rd)) > 1e-9 or int(round(rd)) % 2 or rd < 2:
        raise OptionError(f"head_dim * partial_rotary = {rd} must be an even integer >= 2")
    if o["conv_kernel"] < 2:
        raise OptionError(f"conv_kernel {o['conv_kernel']} must be >= 2")
    # Settings of the dense families that Qwen3.5 does not have (or that these fixtures do not vary).
    if o["rope"] != "default" or o["rope_factor"] or o["rope_original_max"] or o["yarn_beta_fast"] \
            or o["yarn_beta_slow"]:
        raise OptionError("qwen3_5 fixtures use rope_type default (no scaling)")
    if o["sliding_window"] or o["max_window_layers"]:
        raise OptionError("qwen3_5 has no sliding-window layers")
    if o["bias"]:
        raise OptionError("qwen3_5 fixtures have no attention bias (attention_bias false, as published)")
    o["bias"] = False
    if o["layer_config"] not in ("interval", "types", "both"):
        raise OptionError(f"layer_config {o['layer_config']!r} not in (interval, types, both)")
    if o["layer_config"] == "types":
        if len(o["layer_pattern"]) != o["layers"] or set(o["layer_pattern"]) - set("FL"):
            raise OptionError(f"layer_pattern {o['layer_pattern']!r} must be {o['layers']} letters F/L")
    else:
        if o["layer_pattern"]:
            raise OptionError("layer_pattern needs layer_config types")
        if o["full_attention_interval"] < 1:
            raise OptionError("full_attention_interval must be >= 1")
    lt = hybrid_layer_types(o)
    if "full_attention" not in lt or "linear_attention" not in lt:
        raise OptionError(f"layer types {lt} must hold both kinds (transformers' hybrid cache needs both)")
    if o["mrope_section"] is not None:
        ms = list(o["mrope_section"])
        if len(ms) != 3 or any(int(x) != x or x < 0 for x in ms):
            raise OptionError(f"mrope_section {ms} must be three non-negative ints")
        o["mrope_section"] = [int(x) for x in ms]
    if o["vision"] is None:
        o["vision"] = o["config_form"] == "wrapped"
    if o["vision"] and o["config_form"] != "wrapped":
        raise OptionError("vision needs config_form wrapped")
    lo, hi = o["a_log_range"]
    if not lo < hi:
        raise OptionError(f"a_log_range {o['a_log_range']} must be increasing")
    o["a_log_range"] = [float(lo), float(hi)]
    if not o["max_pos"]:
        o["max_pos"] = 256
    if o["greedy_prompt"] < 1 or o["greedy_prompt"] > o["seq"]:
        raise OptionError(f"greedy_prompt {o['greedy_prompt']} must be in 1..seq ({o['seq']})")
    if max(o["seq"], o["greedy_prompt"] + o["greedy_new"]) > o["max_pos"]:
        raise OptionError("sequences exceed max_position_embeddings")
    if o["bos"] >= o["vocab"] or o["vocab"] < 8:
        raise OptionError("vocab too small for the special token ids")
    return o


def build_hybrid_config(o):
    eos = eos_ids(o)
    lt = hybrid_layer_types(o)
    t = {
        "model_type": "qwen3_5_text",
        "hidden_size": o["hidden"],
        "intermediate_size": o["intermediate"],
        "num_hidden_layers": o["layers"],
        "num_attention_heads": o["heads"],
        "num_key_value_heads": o["kv_heads"],
        "head_dim": o["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": o["rms_eps"],
        "vocab_size": o["vocab"],
        "max_position_embeddings": o["max_pos"],
        "initializer_range": 0.02,
        "tie_word_embeddings": o["tie"],
        "bos_token_id": o["bos"],
        "eos_token_id": eos[0] if isinstance(eos, list) else eos,
        "use_cache": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": o["conv_kernel"],
        "linear_key_head_dim": o["lin_k_dim"],
        "linear_value_head_dim": o["lin_v_dim"],
        "linear_num_key_heads": o["lin_k_heads"],
        "linear_num_value_heads": o["lin_v_heads"],
    }
    if o["layer_config"] in ("interval", "both"):
        t["full_attention_interval"] = o["full_attention_interval"]
    if o["layer_config"] in ("types", "both"):
        t["layer_types"] = lt
    rp = {"rope_type": "default", "rope_theta": float(o["rope_theta"]),
          "partial_rotary_factor": float(o["partial_rotary"])}
    if o["mrope_section"] is not None:
        rp["mrope_interleaved"] = True
        rp["mrope_section"] = list(o["mrope_section"])
    t["rope_parameters"] = rp
    if o["partial_rotary_top"]:
        t["partial_rotary_factor"] = float(o["partial_rotary"])
    t["dtype"] = "float32"
    if o["config_form"] == "text":
        return {"architectures": [HYBRID_ARCH["text"]], **t}
    # The published wrapper: extra keys the published text_config carries (transformers ignores them).
    t["attn_output_gate"] = True
    t["mlp_only_layers"] = []
    t["mamba_ssm_dtype"] = "float32"
    V = o["vocab"]
    c = {
        "architectures": [HYBRID_ARCH["wrapped"]],
        "model_type": "qwen3_5",
        "text_config": t,
        "tie_word_embeddings": o["tie"],
        # Inside the vocabulary, as published; without pixel inputs they are plain text tokens.
        "vision_start_token_id": V - 6, "vision_end_token_id": V - 5, "image_token_id": V - 4,
        "video_token_id": V - 3,
        "dtype": "float32",
    }
    if o["vision"]:
        # model_type "qwen3_5" as in the published config.json (transformers 5.17 maps it to qwen3_5_vision).
        c["vision_config"] = {"model_type": "qwen3_5", **tiny_vision_config(o)}
    return c


def vision_tensors(o):
    v = tiny_vision_config(o)
    vh, vi, m = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"]
    mh = vh * m * m
    p = "model.visual."
    out = [(p + "patch_embed.proj.weight", (vh, v["in_channels"], v["temporal_patch_size"], v["patch_size"],
                                            v["patch_size"])),
           (p + "patch_embed.proj.bias", (vh,)),
           (p + "pos_embed.weight", (v["num_position_embeddings"], vh))]
    for i in range(v["depth"]):
        b = f"{p}blocks.{i}."
        out += [(b + "norm1.weight", (vh,)), (b + "norm1.bias", (vh,)),
                (b + "norm2.weight", (vh,)), (b + "norm2.bias", (vh,)),
                (b + "attn.qkv.weight", (3 * vh, vh)), (b + "attn.qkv.bias", (3 * vh,)),
                (b + "attn.proj.weight", (vh, vh)), (b + "attn.proj.bias", (vh,)),
                (b + "mlp.linear_fc1.weight", (vi, vh)), (b + "mlp.linear_fc1.bias", (vi,)),
                (b + "mlp.linear_fc2.weight", (vh, vi)), (b + "mlp.linear_fc2.bias", (vh,))]
    out += [(p + "merger.norm.weight", (vh,)), (p + "merger.norm.bias", (vh,)),
            (p + "merger.linear_fc1.weight", (mh, mh)), (p + "merger.linear_fc1.bias", (mh,)),
            (p + "merger.linear_fc2.weight", (v["out_hidden_size"], mh)),
            (p + "merger.linear_fc2.bias", (v["out_hidden_size"],))]
    return out


def hybrid_prefix(o):
    return "model.language_model." if o["config_form"] == "wrapped" else "model."


def hybrid_tensors(o):
    """Hugging Face names and shapes of a Qwen3.5 checkpoint in write order."""
    H, hd, nh, nkv, I, V = o["hidden"], o["head_dim"], o["heads"], o["kv_heads"], o["intermediate"], o["vocab"]
    kd = o["lin_k_heads"] * o["lin_k_dim"]
    vd = o["lin_v_heads"] * o["lin_v_dim"]
    conv = 2 * kd + vd
    P = hybrid_prefix(o)
    out = [(P + "embed_tokens.weight", (V, H))]
    for i, kind in enumerate(hybrid_layer_types(o)):
        p = f"{P}layers.{i}."
        out.append((p + "input_layernorm.weight", (H,)))
        if kind == "linear_attention":
            a = p + "linear_attn."
            out += [(a + "in_proj_qkv.weight", (conv, H)),     # rows: q (kd) | k (kd) | v (vd)
                    (a + "in_proj_z.weight", (vd, H)),
                    (a + "in_proj_b.weight", (o["lin_v_heads"], H)),
                    (a + "in_proj_a.weight", (o["lin_v_heads"], H)),
                    (a + "conv1d.weight", (conv, 1, o["conv_kernel"])),
                    (a + "dt_bias", (o["lin_v_heads"],)),
                    (a + "A_log", (o["lin_v_heads"],)),
                    (a + "norm.weight", (o["lin_v_dim"],)),
                    (a + "out_proj.weight", (H, vd))]
        else:
            a = p + "self_attn."
            out += [(a + "q_proj.weight", (2 * nh * hd, H)),     # per head: hd query rows, then hd gate rows
                    (a + "k_proj.weight", (nkv * hd, H)),
                    (a + "v_proj.weight", (nkv * hd, H)),
                    (a + "o_proj.weight", (H, nh * hd)),
                    (a + "q_norm.weight", (hd,)),
                    (a + "k_norm.weight", (hd,))]
        out += [(p + "post_attention_layernorm.weight", (H,)),
                (p + "mlp.gate_proj.weight", (I, H)),
                (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I))]
    out.append((P + "norm.weight", (H,)))
    if not o["tie"]:
        out.append(("lm_head.weight", (V, H)))
    if o["vision"]:
        out += vision_tensors(o)
    return out


def describe_hybrid(o):
    lt = "".join("F" if t == "full_attention" else "L" for t in hybrid_layer_types(o))
    return (f"qwen3_5 form={o['config_form']} layers={lt} ({o['layer_config']}) H={o['hidden']} "
            f"heads={o['heads']}/{o['kv_heads']} hd={o['head_dim']} rotary={rotary_dim(o)} "
            f"lin_heads={o['lin_k_heads']}/{o['lin_v_heads']} dk={o['lin_k_dim']} dv={o['lin_v_dim']} "
            f"conv={o['conv_kernel']} V={o['vocab']} tie={int(o['tie'])} vision={int(o['vision'])}")


# ----------------------------------------------------------------------------------------------------------------
# Fixture set and randomized "unseen" set
# ----------------------------------------------------------------------------------------------------------------

FIXTURES = [
    ("llama3", dict(family="llama", config_form="classic", rope="llama3", rope_factor=8.0, rope_original_max=32,
                    rope_theta=500000.0, tie=False, bias=False, eos_list=False, seed=11)),
    ("qwen2", dict(family="qwen2", config_form="new", rope="default", rope_theta=1000000.0, tie=True,
                   eos_list=True, seed=12)),
    # yarn: max_pos = factor * original_max (4 * 16) so the factor is unambiguous (see normalize()).
    ("qwen3", dict(family="qwen3", config_form="classic", rope="yarn", rope_factor=4.0, rope_original_max=16,
                   max_pos=64, rope_theta=1000000.0, head_dim=32, tie=True, eos_list=True,
                   shard_bytes=200000, expect_shards=3, seed=13)),
    ("qwen3_swa", dict(family="qwen3", config_form="new", rope="linear", rope_factor=2.0, rope_theta=1000000.0,
                       layers=3, sliding_window=6, max_window_layers=1, tie=False, eos_list=False, seed=14)),
    # Qwen3.5 (issue 10): text-only form, layers from full_attention_interval 2 (L F L F), v heads = 2 x k heads,
    # partial rotary 0.5 written both in rope_parameters and at the top (Qwen3-Next style), tied.
    ("qwen3_5_text", dict(family="qwen3_5", config_form="text", layers=4, heads=4, kv_heads=2, head_dim=16,
                          intermediate=64, layer_config="interval", full_attention_interval=2, lin_k_heads=2,
                          lin_v_heads=4, lin_k_dim=16, lin_v_dim=16, partial_rotary=0.5, partial_rotary_top=True,
                          rope_theta=10000.0, tie=True, eos_list=False, seed=21)),
    # The published form: Qwen3_5ForConditionalGeneration, text settings under text_config, weights under
    # model.language_model.*, a tiny vision tower (model.visual.*, to be skipped), interval 4 and layer_types both
    # written (L L L F), v heads = k heads with dv != dk, partial rotary 0.25 of hd 32, mrope keys, sharded.
    ("qwen3_5_wrapped", dict(family="qwen3_5", config_form="wrapped", layers=4, heads=2, kv_heads=1, head_dim=32,
                             intermediate=64, layer_config="both", full_attention_interval=4, lin_k_heads=2,
                             lin_v_heads=2, lin_k_dim=16, lin_v_dim=32, partial_rotary=0.25, mrope_section=[2, 1, 1],
                             rope_theta=10000000.0, tie=True, eos_list=True, vision=True, shard_bytes=400000,
                             expect_shards=2, seed=22)),
    # An explicit layer_types pattern no interval gives (F L L F: layer 0 is full attention), GQA 4:1,
    # v heads = 2 x k heads with dk != dv, untied.
    ("qwen3_5_pattern", dict(family="qwen3_5", config_form="text", layers=4, heads=4, kv_heads=1, head_dim=16,
                             intermediate=64, layer_config="types", layer_pattern="FLLF", lin_k_heads=1,
                             lin_v_heads=2, lin_k_dim=32, lin_v_dim=16, partial_rotary=0.25,
                             mrope_section=[11, 11, 10], rope_theta=1000000.0, tie=False, eos_list=False, seed=23)),
]


def fixture_options():
    out = []
    for name, over in FIXTURES:
        o = dict(DEFAULTS)
        o.update(over)
        out.append((name, normalize(o)))
    return out


def unseen_options(count, seed):
    rng = random.Random(seed)
    out = []
    for k in range(count):
        while True:
            o = dict(DEFAULTS)
            fam = rng.choice(FAMILIES)
            heads = rng.choice([1, 2, 3, 4, 6, 8])
            dims = [d for d in range(8, 33, 2) if 32 <= heads * d <= 128]
            if not dims:
                continue
            natural = rng.choice(dims)
            hidden = heads * natural
            kv = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
            head_dim = natural
            if fam != "qwen2" and rng.random() < 0.4:
                head_dim = rng.choice([d for d in range(8, 33, 2) if d != natural])
            layers = rng.randint(1, 3)
            seq = rng.randint(8, 40)
            prompt = rng.randint(1, min(8, seq))
            rope = rng.choice(ROPE_TYPES)
            o.update(family=fam, hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim,
                     write_head_dim=(head_dim != natural) or rng.random() < 0.5,
                     intermediate=rng.randint(hidden, 3 * hidden), vocab=rng.randint(97, 600), layers=layers,
                     rms_eps=rng.choice([1e-6, 1e-5]), rope=rope,
                     rope_theta=rng.choice([10000.0, 500000.0, 1000000.0]),
                     config_form=rng.choice(["classic", "new"]), tie=rng.random() < 0.5,
                     bias=None if fam == "qwen2" else rng.random() < 0.4, eos_list=rng.random() < 0.5,
                     rows=rng.randint(1, 4), seq=seq, greedy_prompt=prompt, greedy_new=rng.randint(1, 8),
                     seed=rng.randrange(1 << 30))
            if rope == "linear":
                o["rope_factor"] = rng.choice([1.5, 2.0, 4.0])
            elif rope == "llama3":
                o["rope_factor"] = rng.choice([2.0, 4.0, 8.0])
                o["rope_original_max"] = rng.choice([16, 32])
            elif rope == "yarn":
                o["rope_factor"], o["rope_original_max"] = rng.choice([(4.0, 16), (2.0, 32), (4.0, 32)])
                if rng.random() < 0.5:
                    o["yarn_beta_fast"], o["yarn_beta_slow"] = rng.choice([(32.0, 1.0), (24.0, 2.0)])
            if fam != "llama" and seq > 3 and rng.random() < 0.4:
                o["sliding_window"] = rng.randint(2, seq - 1)
                o["max_window_layers"] = rng.randint(0, layers - 1)
            try:
                o = normalize(o)
            except OptionError:
                continue
            if rng.random() < 0.4:
                total = sum(numel(s) for _, s in expected_tensors(o)) * 4
                o["shard_bytes"] = total // rng.choice([2, 3]) + 1
            break
        out.append((f"unseen_{k:03d}_{o['family']}", o))
    return out


# ----------------------------------------------------------------------------------------------------------------
# The torch / transformers part
# ----------------------------------------------------------------------------------------------------------------

def fail(name, msg):
    raise SystemExit(f"make_reference: {name}: {msg}")


def loaded_rope(config):
    rp = getattr(config, "rope_parameters", None)
    if rp is None:
        rp = dict(getattr(config, "rope_scaling", None) or {})
        rp.setdefault("rope_theta", getattr(config, "rope_theta", None))
    rp = dict(rp)
    if "full_attention" in rp and isinstance(rp["full_attention"], dict):
        rp = dict(rp["full_attention"])
    rp.setdefault("rope_type", rp.get("type", "default"))
    return rp


def check_loaded_config(name, o, config):
    """Catches a config.json field that transformers silently ignored or read differently than intended."""
    want = {"model_type": o["family"], "hidden_size": o["hidden"], "num_hidden_layers": o["layers"],
            "num_attention_heads": o["heads"], "num_key_value_heads": o["kv_heads"], "vocab_size": o["vocab"],
            "intermediate_size": o["intermediate"], "max_position_embeddings": o["max_pos"],
            "tie_word_embeddings": o["tie"]}
    for k, v in want.items():
        if getattr(config, k, None) != v:
            fail(name, f"loaded config.{k} = {getattr(config, k, None)!r}, intended {v!r}")
    if abs(float(config.rms_norm_eps) - o["rms_eps"]) > 1e-12:
        fail(name, f"loaded rms_norm_eps {config.rms_norm_eps}, intended {o['rms_eps']}")
    rp = loaded_rope(config)
    if rp["rope_type"] != o["rope"]:
        fail(name, f"loaded rope_type {rp['rope_type']!r}, intended {o['rope']!r} (rope parameters {rp})")
    if rp.get("rope_theta") is None or float(rp["rope_theta"]) != float(o["rope_theta"]):
        fail(name, f"loaded rope_theta {rp.get('rope_theta')!r}, intended {o['rope_theta']}")
    for k, v in rope_fields(o).items():
        # Some versions may keep original_max_position_embeddings on the config instead of in the rope dict.
        got = rp.get(k, getattr(config, k, None) if k == "original_max_position_embeddings" else None)
        if k != "rope_type" and (got is None or float(got) != float(v)):
            fail(name, f"loaded rope parameter {k} = {got!r}, intended {v!r}")
    lt = getattr(config, "layer_types", None)
    if o["family"] != "llama" or lt is not None:
        if lt is None or list(lt) != layer_types(o):
            fail(name, f"loaded layer_types {lt!r}, intended {layer_types(o)!r}")
    if o["sliding_window"] and getattr(config, "sliding_window", None) != o["sliding_window"]:
        fail(name, f"loaded sliding_window {getattr(config, 'sliding_window', None)!r}, "
                   f"intended {o['sliding_window']}")


def check_tensor_layout(name, o, state):
    """The model's own parameter names and shapes must match the layout docs/reference-format.md promises."""
    want = dict(expected_tensors(o))
    have = {k: tuple(v.shape) for k, v in state.items()}
    if o["tie"]:
        have.pop("lm_head.weight", None)
    if have != want:
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        fail(name, f"tensor layout differs: missing {missing}, unexpected {extra}, "
                   f"shape mismatch {[(k, want[k], have[k]) for k in wrong]}")


def rope_tables(model):
    """inv_freq and attention scaling of the rotary module(s), so an engine can diff its RoPE table directly."""
    import torch
    found = [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    if not found:
        return None
    first = found[0]
    for m in found[1:]:
        if not torch.equal(m.inv_freq, first.inv_freq):
            return None  # per-layer tables differ; one stored table would mislead
    return first.inv_freq.detach().to(torch.float32).contiguous().clone(), float(getattr(first, "attention_scaling", 1.0))


def describe(o):
    if o["family"] in HYBRID_FAMILIES:
        return describe_hybrid(o)
    sw = f" window={o['sliding_window']}/from_layer={o['max_window_layers']}" if o["sliding_window"] else ""
    return (f"{o['family']} form={o['config_form']} rope={o['rope']} L={o['layers']} H={o['hidden']} "
            f"heads={o['heads']}/{o['kv_heads']} hd={o['head_dim']} V={o['vocab']} tie={int(o['tie'])} "
            f"bias={int(o['bias'])}{sw}")


def make_checkpoint(path, o, dry_run):
    name = os.path.basename(os.path.normpath(path))
    os.makedirs(path, exist_ok=True)
    cfg = build_config(o)
    write_json(os.path.join(path, "config.json"), cfg)
    write_json(os.path.join(path, "generation_config.json"), build_generation_config(o))
    tensors = expected_tensors(o)
    shards = plan_shards(tensors, o["shard_bytes"])
    if o["expect_shards"] and len(shards) != o["expect_shards"]:
        fail(name, f"shard budget {o['shard_bytes']} gives {len(shards)} files, fixture wants {o['expect_shards']}")
    params = sum(numel(s) for _, s in tensors)
    if dry_run:
        ref = o["rows"] * o["seq"] * (o["vocab"] * 4 + 8) + o["rows"] * (o["greedy_prompt"] + o["greedy_new"]) * 8
        print(f"{name}: {describe(o)} params={params} "
              f"weights={params * 4}B in {len(shards)} file(s) reference~{ref}B (dry run: configs only)")
        return params * 4 + ref

    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    hyb = o["family"] in HYBRID_FAMILIES
    if hyb:
        M, forced = hybrid_modeling_module(name)
        cls = hybrid_model_class(name, o)

    # 1. Load our hand-written config and check transformers read it the way we meant.
    if hyb:
        try:
            config = AutoConfig.from_pretrained(path)
        except (ValueError, KeyError) as e:
            fail(name, f"transformers {transformers.__version__} cannot read this Qwen3.5 config.json: {e}")
        check_loaded_hybrid_config(name, o, config)
        model = cls._from_config(config, attn_implementation="eager")
        model.eval()
        check_hybrid_modules(name, o, model, M, forced)
        planned = hybrid_tensors(o)
        tensors = check_hybrid_layout(name, o, model.state_dict())
        if tensors != planned:
            shards = plan_shards(tensors, o["shard_bytes"])
            params = sum(numel(s) for _, s in tensors)
            if o["expect_shards"] and len(shards) != o["expect_shards"]:
                warn(name, f"with the model's vision tensors the shard budget gives {len(shards)} files, "
                           f"not {o['expect_shards']}")
    else:
        config = AutoConfig.from_pretrained(path)
        check_loaded_config(name, o, config)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        model.eval()
        check_tensor_layout(name, o, model.state_dict())

    # 2. Random init: named_parameters() lists a tied weight once, so tying survives.
    torch.manual_seed(o["seed"])
    gen = torch.Generator().manual_seed(o["seed"])
    with torch.no_grad():
        if hyb:
            norm_forms = init_hybrid(name, o, model, gen)
        else:
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.normal_(1.0, 0.1, generator=gen)
                elif pname.endswith(".bias"):
                    p.normal_(0.0, 0.08, generator=gen)
                else:
                    p.normal_(0.0, o["init_std"], generator=gen)
    if o["tie"]:
        if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
            fail(name, "tie_word_embeddings is set but lm_head is not tied to embed_tokens after init")

    N, S, P, G = o["rows"], o["seq"], o["greedy_prompt"], o["greedy_new"]
    ids_gen = torch.Generator().manual_seed(o["seed"] + 1)
    input_ids = torch.randint(0, o["vocab"], (N, S), generator=ids_gen, dtype=torch.int64)
    with torch.no_grad():
        before = model(input_ids=input_ids, use_cache=False).logits.to(torch.float32)

    # 3. Save in our own tensor order, sharded by byte budget when asked.
    state = model.state_dict()
    data = {n: state[n].detach().to(torch.float32).contiguous().clone() for n, _ in tensors}
    files = shard_file_names(len(shards))
    for fname in os.listdir(path):
        if fname.endswith(".safetensors") or fname == "model.safetensors.index.json":
            os.remove(os.path.join(path, fname))  # a rerun with other sharding must not leave stale shards
    weight_map = {}
    for fname, names in zip(files, shards):
        save_file({n: data[n] for n in names}, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
    if len(files) > 1:
        write_json(os.path.join(path, "model.safetensors.index.json"),
                   {"metadata": {"total_size": params * 4}, "weight_map": weight_map})

    # 4. Reload from disk and take every reference from the reloaded model, proving the files round-trip.
    del model
    if hyb:
        model = cls.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        check_loaded_hybrid_config(name, o, model.config)
        check_hybrid_modules(name, o, model, M, forced)
        for c in (model.config, getattr(model.config, "text_config", None)):
            if c is not None and getattr(c, "_attn_implementation", "eager") != "eager":
                fail(name, f"attention implementation is {c._attn_implementation!r}, not eager")
    else:
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        check_loaded_config(name, o, model.config)
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            fail(name, f"attention implementation is {model.config._attn_implementation!r}, not eager")
    reloaded = model.state_dict()
    for n, t in data.items():
        if n not in reloaded or reloaded[n].dtype != torch.float32 or not torch.equal(reloaded[n], t):
            fail(name, f"tensor {n} did not round-trip through the saved files")
    embed = hybrid_prefix(o) + "embed_tokens.weight" if hyb else "model.embed_tokens.weight"
    if o["tie"] and not torch.equal(model.get_output_embeddings().weight, data[embed]):
        fail(name, "reloaded lm_head is not tied to embed_tokens")
    if o["tie"] and hyb and \
            model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        fail(name, "reloaded lm_head is a copy, not tied to embed_tokens")
    for fname in files:
        load_file(os.path.join(path, fname))  # each file must parse on its own

    with torch.no_grad():
        logits = model(input_ids=input_ids, use_cache=False).logits.to(torch.float32).contiguous()
        if tuple(logits.shape) != (N, S, o["vocab"]):
            fail(name, f"logits shape {tuple(logits.shape)}, expected {(N, S, o['vocab'])}")
        if not torch.isfinite(logits).all():
            fail(name, "logits contain non-finite values")
        # Also covers what the weight files cannot show, e.g. rotary tables rebuilt differently on reload.
        drift = (logits - before).abs().max().item()
        if drift > 1e-5:
            fail(name, f"reloaded model's logits differ from the in-memory model's by {drift:.3g}")

        # Manual greedy loop: a full forward of the growing sequence each step, EOS ignored, first index on ties.
        seqs = input_ids[:, :P].clone()
        margins = []
        for _ in range(G):
            last = model(input_ids=seqs, use_cache=False).logits[:, -1, :].to(torch.float32)
            top2 = torch.topk(last, 2, dim=-1).values
            margins.append(top2[:, 0] - top2[:, 1])
            nxt = torch.argmax(last, dim=-1, keepdim=True)
            seqs = torch.cat([seqs, nxt], dim=1)
        greedy_margin = torch.stack(margins, dim=1).contiguous()

        if o["sliding_window"]:
            check_window_effect(name, o, cfg, model, input_ids, logits)

    if hyb:
        spread = hybrid_gate_spread(name, o, model, input_ids)
        decode_diff = hybrid_decode_check(name, o, model, input_ids, logits)

    ref = {
        "input_ids": input_ids.contiguous(),
        "logits": logits,
        "greedy_prompt_len": torch.tensor([P], dtype=torch.int64),
        "greedy_ids": seqs.contiguous(),
        "greedy_margin": greedy_margin,
    }
    rt = hybrid_rope_table(name, o, model) if hyb else rope_tables(model)
    if rt is not None:
        ref["rope_inv_freq"] = rt[0]
        ref["rope_attention_scaling"] = torch.tensor([rt[1]], dtype=torch.float32)
    meta = {
        "format": "ingot-reference",
        "format_version": FORMAT_VERSION,
        "name": name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": str(o["seed"]),
        "family": o["family"],
        "config_form": o["config_form"],
        "rope_type": o["rope"],
        "options": json.dumps(o, sort_keys=True),
    }
    if hyb:
        meta["layer_types"] = json.dumps(hybrid_layer_types(o))
        meta["rotary_dim"] = str(rotary_dim(o))
        meta["torch_fallback_forced"] = json.dumps(forced)
        meta["hf_decode_vs_full_max_abs"] = "not run" if decode_diff is None else f"{decode_diff:.3g}"
    ref_path = os.path.join(path, "reference.safetensors")
    save_file(ref, ref_path, metadata=meta)

    weight_bytes = sum(os.path.getsize(os.path.join(path, f)) for f in files)
    ref_bytes = os.path.getsize(ref_path)
    print(f"{name}: {describe(o)} params={params} "
          f"weights={weight_bytes}B in {len(files)} file(s) reference={ref_bytes}B "
          f"min_greedy_margin={float(greedy_margin.min()):.4g}")
    if hyb:
        print(f"  {name}: norms {norm_forms}; fast path forced off: {forced or 'none present'}")
        print(f"  {name}: spread over the reference inputs (min/max/std): " +
              "; ".join(f"{k} {a:.3g}/{b:.3g}/{c:.3g}" for k, (a, b, c) in spread.items()))
        print(f"  {name}: rope_inv_freq {[round(float(x), 6) for x in rt[0]]} (rotary dims {rotary_dim(o)} of "
              f"{o['head_dim']}); transformers cached decode vs full forward: "
              f"{'not run' if decode_diff is None else f'{decode_diff:.3g}'}")
        if weight_bytes + ref_bytes > 1_000_000:
            warn(name, f"fixture is {weight_bytes + ref_bytes} bytes, over 1 MB")
    return weight_bytes + ref_bytes


def check_window_effect(name, o, cfg, model, input_ids, logits):
    """Proves the sliding window is really applied: the same weights with full attention everywhere must give the
    same logits before position W and different ones from W on (query i sees keys i-W+1..i)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    full = copy.deepcopy(cfg)
    full["use_sliding_window"] = False
    full["sliding_window"] = None
    if "layer_types" in full:
        full["layer_types"] = ["full_attention"] * o["layers"]
    with tempfile.TemporaryDirectory() as tmp:
        write_json(os.path.join(tmp, "config.json"), full)
        fcfg = AutoConfig.from_pretrained(tmp)
    fmodel = AutoModelForCausalLM.from_config(fcfg, attn_implementation="eager")
    fmodel.load_state_dict(model.state_dict())
    fmodel.eval()
    flog = fmodel(input_ids=input_ids, use_cache=False).logits.to(torch.float32)
    W = o["sliding_window"]
    per_pos = (flog - logits).abs().amax(dim=(0, 2))
    early = per_pos[:W].max().item()
    if early > 1e-4:
        fail(name, f"logits before the window edge differ from full attention by {early:.3g}")
    # Position W is the first whose query loses a key (key 0), so it must already differ: this pins the window
    # to W keys including the query itself, as docs/reference-format.md states.
    if W < o["seq"] and per_pos[W].item() <= max(1e-4, 10 * early):
        fail(name, f"sliding window has no visible effect at position {W} (max logit change "
                   f"{per_pos[W].item():.3g}); per-position changes {[round(x, 5) for x in per_pos.tolist()]}")


# ----------------------------------------------------------------------------------------------------------------
# Qwen3.5: the torch / transformers part
# ----------------------------------------------------------------------------------------------------------------

WARNINGS = []  # printed again at the end of the run, so a long log cannot hide them


def warn(name, msg):
    line = f"WARNING {name}: {msg}"
    WARNINGS.append(line)
    print(line)


def hybrid_modeling_module(name):
    """transformers' modeling_qwen3_5 with its optional fast path (the fla and causal-conv1d packages) kept out, so
    that the reference is transformers' torch code on the CPU. transformers 5.17 picks fla / causal_conv1d when it
    imports modeling_qwen3_5 (use_kernel_func_from_hub_with_fallback), so they are blocked before that import;
    older versions (a torch_causal_conv1d_update function and module-level kernel names) get those names set to None."""
    import importlib.util
    forced = []
    if "transformers.models.qwen3_5.modeling_qwen3_5" not in sys.modules:
        for pkg in ("fla", "causal_conv1d"):
            try:
                present = pkg in sys.modules or importlib.util.find_spec(pkg) is not None
            except (ImportError, ValueError):
                present = False
            if present:
                sys.modules[pkg] = None  # makes "import fla" fail, so transformers takes its torch path
                forced.append(pkg)
    try:
        import transformers.models.qwen3_5.modeling_qwen3_5 as M
    except ImportError as e:
        fail(name, f"this transformers has no Qwen3.5 (transformers.models.qwen3_5): {e}")
    if hasattr(M, "torch_causal_conv1d_update"):
        for attr in ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                     "fused_recurrent_gated_delta_rule", "FusedRMSNormGated"):
            if getattr(M, attr, None) is not None:
                setattr(M, attr, None)
                forced.append(attr)
    return M, forced


def hybrid_model_class(name, o):
    import transformers
    arch = HYBRID_ARCH[o["config_form"]]
    cls = getattr(transformers, arch, None)
    if cls is None:
        fail(name, f"transformers {transformers.__version__} has no class {arch}")
    return cls


def hybrid_text_model(name, o, model):
    try:
        return model.model.language_model if o["config_form"] == "wrapped" else model.model
    except AttributeError as e:
        fail(name, f"cannot find the text model inside {type(model).__name__}: {e}")


def check_loaded_hybrid_config(name, o, config):
    """Catches a config.json field that transformers silently ignored or read differently than intended."""
    form = o["config_form"]
    if getattr(config, "model_type", None) != HYBRID_MODEL_TYPE[form]:
        fail(name, f"loaded model_type {getattr(config, 'model_type', None)!r}, intended {HYBRID_MODEL_TYPE[form]!r}")
    tc = config
    if form == "wrapped":
        tc = getattr(config, "text_config", None)
        if tc is None or getattr(tc, "model_type", None) != "qwen3_5_text":
            fail(name, f"loaded text_config {tc!r} is not a qwen3_5_text config")
        if bool(getattr(config, "tie_word_embeddings", None)) != o["tie"]:
            fail(name, f"loaded top-level tie_word_embeddings {config.tie_word_embeddings!r}, intended {o['tie']}")
        if o["vision"]:
            vc = getattr(config, "vision_config", None)
            for k, v in tiny_vision_config(o).items():
                if getattr(vc, k, None) != v:
                    fail(name, f"loaded vision_config.{k} = {getattr(vc, k, None)!r}, intended {v!r}")
    want = {"hidden_size": o["hidden"], "num_hidden_layers": o["layers"], "num_attention_heads": o["heads"],
            "num_key_value_heads": o["kv_heads"], "head_dim": o["head_dim"], "vocab_size": o["vocab"],
            "intermediate_size": o["intermediate"], "max_position_embeddings": o["max_pos"],
            "tie_word_embeddings": o["tie"], "linear_conv_kernel_dim": o["conv_kernel"],
            "linear_key_head_dim": o["lin_k_dim"], "linear_value_head_dim": o["lin_v_dim"],
            "linear_num_key_heads": o["lin_k_heads"], "linear_num_value_heads": o["lin_v_heads"],
            "attention_bias": False, "hidden_act": "silu"}
    for k, v in want.items():
        if getattr(tc, k, None) != v:
            fail(name, f"loaded text config {k} = {getattr(tc, k, None)!r}, intended {v!r}")
    if abs(float(tc.rms_norm_eps) - o["rms_eps"]) > 1e-12:
        fail(name, f"loaded rms_norm_eps {tc.rms_norm_eps}, intended {o['rms_eps']}")
    lt = getattr(tc, "layer_types", None)
    if lt is None or list(lt) != hybrid_layer_types(o):
        fail(name, f"loaded layer_types {lt!r}, intended {hybrid_layer_types(o)!r} "
                   f"(from {o['layer_config']} in config.json)")
    rp = loaded_rope(tc)
    if rp["rope_type"] != "default":
        fail(name, f"loaded rope_type {rp['rope_type']!r}, intended 'default' (rope parameters {rp})")
    if rp.get("rope_theta") is None or float(rp["rope_theta"]) != float(o["rope_theta"]):
        fail(name, f"loaded rope_theta {rp.get('rope_theta')!r}, intended {o['rope_theta']}")
    prf = rp.get("partial_rotary_factor", getattr(tc, "partial_rotary_factor", None))
    if prf is None or float(prf) != float(o["partial_rotary"]):
        fail(name, f"loaded partial_rotary_factor {prf!r}, intended {o['partial_rotary']} (rope parameters {rp})")
    if o["mrope_section"] is not None and list(rp.get("mrope_section") or []) != o["mrope_section"]:
        fail(name, f"loaded mrope_section {rp.get('mrope_section')!r}, intended {o['mrope_section']}")


def check_hybrid_layout(name, o, state):
    """Parameter names and shapes against hybrid_tensors(). The text model must match exactly; the vision tower,
    which ingot skips, may differ between transformers versions: then its actual tensors are used, with a warning."""
    want = dict(hybrid_tensors(o))
    have = {k: tuple(v.shape) for k, v in state.items()}
    if o["tie"]:
        have.pop("lm_head.weight", None)
    is_vis = lambda k: k.startswith("model.visual.")  # noqa: E731
    wt = {k: v for k, v in want.items() if not is_vis(k)}
    ht = {k: v for k, v in have.items() if not is_vis(k)}
    if wt != ht:
        missing = sorted(set(wt) - set(ht))
        extra = sorted(set(ht) - set(wt))
        wrong = sorted(k for k in set(wt) & set(ht) if wt[k] != ht[k])
        fail(name, f"tensor layout differs: missing {missing}, unexpected {extra}, "
                   f"shape mismatch {[(k, wt[k], ht[k]) for k in wrong]}")
    wv = {k: v for k, v in want.items() if is_vis(k)}
    hv = {k: v for k, v in have.items() if is_vis(k)}
    tensors = hybrid_tensors(o)
    if wv != hv:
        warn(name, f"vision tower tensors differ from the planned layout (missing {sorted(set(wv) - set(hv))}, "
                   f"unexpected {sorted(set(hv) - set(wv))}); saving the model's own {len(hv)} vision tensors")
        tensors = [t for t in tensors if not is_vis(t[0])] + [(k, have[k]) for k in state if is_vis(k)]
    return tensors


def norm_center(module, dim, gated):
    """Probes a norm module with its weight set to zero: the x * (1 + w) form still passes x through (so its
    weights belong around 0), the w * x form gives zeros (weights around 1)."""
    import torch
    m = copy.deepcopy(module)
    with torch.no_grad():
        m.weight.zero_()
        x = torch.randn(3, dim, generator=torch.Generator().manual_seed(5))
        out = m(x, torch.randn(3, dim, generator=torch.Generator().manual_seed(6))) if gated else m(x)
    return 1.0 if float(out.abs().max()) < 1e-6 else 0.0


def init_hybrid(name, o, model, gen):
    """Seeded init in named_parameters() order. Norm weights are centred by probing each norm's form (x(1+w): around
    0; w*x: around 1); A_log uniform in a_log_range, dt_bias N(0, dt_bias_std), in_proj_a/b N(0, ab_proj_std) and
    conv1d N(0, conv_std), so that exp(g), beta and the attention gates spread over their ranges."""
    import torch
    centers, forms = {}, {}
    for pname, p in model.named_parameters():
        mname, attr = pname.rsplit(".", 1)
        mod = model.get_submodule(mname)
        cls = type(mod).__name__
        if attr == "A_log":
            p.uniform_(o["a_log_range"][0], o["a_log_range"][1], generator=gen)
        elif attr == "dt_bias":
            p.normal_(0.0, o["dt_bias_std"], generator=gen)
        elif "RMSNorm" in cls and attr == "weight":
            if cls not in centers:
                gated = "Gated" in cls
                centers[cls] = norm_center(mod, p.shape[0], gated)
                forms[cls] = ("w * norm(x) * silu(z)" if centers[cls] == 1.0 else "(1 + w) * norm(x) * silu(z)") \
                    if gated else ("x * (1 + w)" if centers[cls] == 0.0 else "x * w")
            p.normal_(centers[cls], o["norm_std"], generator=gen)
        elif isinstance(mod, torch.nn.LayerNorm):
            p.normal_(1.0 if attr == "weight" else 0.0, 0.1 if attr == "weight" else 0.08, generator=gen)
        elif mname.endswith((".in_proj_a", ".in_proj_b")) and attr == "weight":
            p.normal_(0.0, o["ab_proj_std"], generator=gen)
        elif mname.endswith(".conv1d") and attr == "weight":
            p.normal_(0.0, o["conv_std"], generator=gen)
        elif attr == "bias":
            p.normal_(0.0, 0.08, generator=gen)
        elif pname.endswith("norm.weight") or pname.endswith("layernorm.weight"):
            fail(name, f"{pname} belongs to a norm class {cls} this script does not know; its init would be wrong")
        else:
            p.normal_(0.0, o["init_std"], generator=gen)
    # What transformers' source says (commit in the module docstring): Qwen3_5RMSNorm is x * (1 + w), the gated
    # output norm Qwen3_5RMSNormGated is w * norm(x) * silu(z).
    expected = {"Qwen3_5RMSNorm": "x * (1 + w)", "Qwen3_5RMSNormGated": "w * norm(x) * silu(z)"}
    for cls, form in forms.items():
        if cls in expected and expected[cls] != form:
            warn(name, f"norm class {cls} behaves as {form}, the source read said {expected[cls]}")
    return forms


def check_hybrid_modules(name, o, model, M, forced):
    tm = hybrid_text_model(name, o, model)
    lt = hybrid_layer_types(o)
    if len(tm.layers) != len(lt):
        fail(name, f"model has {len(tm.layers)} layers, intended {len(lt)}")
    for i, (layer, kind) in enumerate(zip(tm.layers, lt)):
        got = "linear_attention" if hasattr(layer, "linear_attn") else \
            "full_attention" if hasattr(layer, "self_attn") else "?"
        if got != kind:
            fail(name, f"layer {i} is {got}, intended {kind}")
        if kind == "linear_attention":
            la = layer.linear_attn
            if "Fused" in type(la.norm).__name__:
                fail(name, f"layer {i} uses {type(la.norm).__name__}; the CPU reference needs the torch norm")
            for attr, ref in (("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
                              ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule")):
                f = getattr(la, attr, None)
                if f is not None and getattr(M, ref, None) is not None and f is not getattr(M, ref):
                    fail(name, f"layer {i} {attr} is {getattr(f, '__module__', '?')}.{getattr(f, '__name__', f)}, "
                               f"not transformers' torch fallback")
    inv = getattr(getattr(tm, "rotary_emb", None), "inv_freq", None)
    if inv is None or inv.numel() * 2 != rotary_dim(o):
        fail(name, f"rotary inv_freq has {None if inv is None else inv.numel()} entries, intended "
                   f"{rotary_dim(o) // 2} (head_dim {o['head_dim']} x partial_rotary_factor {o['partial_rotary']})")


def hybrid_rope_table(name, o, model):
    import torch
    rot = hybrid_text_model(name, o, model).rotary_emb
    return rot.inv_freq.detach().to(torch.float32).contiguous().clone(), float(getattr(rot, "attention_scaling", 1.0))


def hybrid_gate_spread(name, o, model, input_ids):
    """exp(g), beta and the attention output gate over the reference inputs; fails when one sits at one value."""
    import torch
    import torch.nn.functional as F
    tm = hybrid_text_model(name, o, model)
    got = {"decay exp(g)": [], "beta": [], "attn gate": []}
    hooks = []
    for layer in tm.layers:
        if hasattr(layer, "linear_attn"):
            la = layer.linear_attn
            hooks.append(la.in_proj_a.register_forward_hook(
                lambda m, i, out, la=la: got["decay exp(g)"].append(
                    torch.exp(-la.A_log.float().exp() * F.softplus(out.float() + la.dt_bias)).flatten())))
            hooks.append(la.in_proj_b.register_forward_hook(
                lambda m, i, out: got["beta"].append(torch.sigmoid(out.float()).flatten())))
        else:
            hd = o["head_dim"]
            hooks.append(layer.self_attn.q_proj.register_forward_hook(
                lambda m, i, out: got["attn gate"].append(
                    torch.sigmoid(out.view(*out.shape[:-1], -1, 2 * hd)[..., hd:].float()).flatten())))
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    stats = {}
    for k, v in got.items():
        t = torch.cat(v)
        stats[k] = (float(t.min()), float(t.max()), float(t.std()))
        lo, hi, sd = stats[k]
        if hi - lo < 0.5 or sd < 0.05:
            fail(name, f"{k} hardly varies (min {lo:.3g}, max {hi:.3g}, std {sd:.3g}); widen the init")
    return stats


def hybrid_decode_check(name, o, model, input_ids, logits):
    """transformers' own consistency: prefill P tokens with its hybrid cache, then one token at a time (its
    recurrent decode path and conv update), against the full forward's logits (its chunked path)."""
    import torch
    P, S = o["greedy_prompt"], o["seq"]
    inner = getattr(model, "model", None)
    try:
        with torch.no_grad():
            if hasattr(inner, "rope_deltas"):
                inner.rope_deltas = None
            out = model(input_ids=input_ids[:, :P], use_cache=True)
            diffs = [float((out.logits[:, -1].float() - logits[:, P - 1]).abs().max())]
            pkv = out.past_key_values
            for t in range(P, S):
                out = model(input_ids=input_ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
                pkv = out.past_key_values
                diffs.append(float((out.logits[:, -1].float() - logits[:, t]).abs().max()))
            if hasattr(inner, "rope_deltas"):
                inner.rope_deltas = None
    except Exception as e:  # an API change must not cost the fixtures; the warning is repeated at the end
        warn(name, f"transformers' cached decode could not be run ({type(e).__name__}: {e}); check skipped")
        return None
    worst = max(diffs)
    if worst > 1e-4:
        warn(name, f"transformers' cached decode differs from its own full forward by {worst:.3g} "
                   f"(per step: {[f'{d:.2g}' for d in diffs]})")
    return worst


def run_all(outdir, items, dry_run, manifest):
    if not dry_run:
        # Hiding GPUs before torch loads guarantees a CPU-only fp32 run (no TF32, no GPU kernel choices).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        import torch
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(True)
    os.makedirs(outdir, exist_ok=True)
    total = 0
    for name, o in items:
        total += make_checkpoint(os.path.join(outdir, name), o, dry_run)
    if manifest:
        write_json(os.path.join(outdir, "manifest.json"),
                   {"generator": "tools/make_reference.py", "format_version": FORMAT_VERSION,
                    "checkpoints": [{"name": n, "options": o} for n, o in items]})
    print(f"total {len(items)} checkpoint(s), {total} bytes{' (estimate)' if dry_run else ''}")
    if WARNINGS:
        print(f"{len(WARNINGS)} warning(s):")
        for w in WARNINGS:
            print("  " + w)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fixtures", metavar="OUTDIR")
    mode.add_argument("--unseen", metavar="OUTDIR")
    mode.add_argument("--one", metavar="OUTDIR/NAME")
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--dry-run", action="store_true")
    d = DEFAULTS
    ap.add_argument("--seed", type=int, default=None, help="--unseen: master seed; --one: weight seed")
    ap.add_argument("--family", choices=ALL_FAMILIES, default=d["family"])
    for flag, key in (("--hidden", "hidden"), ("--layers", "layers"), ("--heads", "heads"),
                      ("--kv-heads", "kv_heads"), ("--head-dim", "head_dim"), ("--intermediate", "intermediate"),
                      ("--vocab", "vocab"), ("--max-pos", "max_pos"), ("--sliding-window", "sliding_window"),
                      ("--max-window-layers", "max_window_layers"), ("--shard-bytes", "shard_bytes"),
                      ("--rows", "rows"), ("--seq", "seq"), ("--greedy-prompt", "greedy_prompt"),
                      ("--greedy-new", "greedy_new"), ("--rope-original-max", "rope_original_max"),
                      ("--bos", "bos")):
        ap.add_argument(flag, dest=key, type=int, default=d[key])
    for flag, key in (("--rope-theta", "rope_theta"), ("--rope-factor", "rope_factor"), ("--rms-eps", "rms_eps"),
                      ("--init-std", "init_std"), ("--yarn-beta-fast", "yarn_beta_fast"),
                      ("--yarn-beta-slow", "yarn_beta_slow")):
        ap.add_argument(flag, dest=key, type=float, default=d[key])
    ap.add_argument("--rope", choices=ROPE_TYPES, default=d["rope"])
    ap.add_argument("--config-form", dest="config_form", choices=("classic", "new", "text", "wrapped"), default=None,
                    help="classic/new (llama, qwen2, qwen3; default classic) or text/wrapped (qwen3_5; default text)")
    h = ap.add_argument_group("qwen3_5 only (defaults in HYBRID_DEFAULTS)")
    h.add_argument("--layer-config", dest="layer_config", choices=("interval", "types", "both"), default=None)
    h.add_argument("--layer-pattern", dest="layer_pattern", default=None, help="with --layer-config types: e.g. FLLF")
    for flag, key in (("--full-attention-interval", "full_attention_interval"), ("--lin-k-heads", "lin_k_heads"),
                      ("--lin-v-heads", "lin_v_heads"), ("--lin-k-dim", "lin_k_dim"), ("--lin-v-dim", "lin_v_dim"),
                      ("--conv-kernel", "conv_kernel")):
        h.add_argument(flag, dest=key, type=int, default=None)
    for flag, key in (("--partial-rotary", "partial_rotary"), ("--dt-bias-std", "dt_bias_std"),
                      ("--ab-proj-std", "ab_proj_std"), ("--conv-std", "conv_std"), ("--norm-std", "norm_std")):
        h.add_argument(flag, dest=key, type=float, default=None)
    h.add_argument("--partial-rotary-top", dest="partial_rotary_top", action=argparse.BooleanOptionalAction,
                   default=None)
    h.add_argument("--mrope-section", dest="mrope_section", default=None, help="t,h,w e.g. 11,11,10")
    h.add_argument("--a-log-range", dest="a_log_range", default=None, help="lo,hi")
    h.add_argument("--vision", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--tie", action=argparse.BooleanOptionalAction, default=d["tie"])
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--eos-list", dest="eos_list", action=argparse.BooleanOptionalAction, default=d["eos_list"])
    ap.add_argument("--write-head-dim", dest="write_head_dim", action=argparse.BooleanOptionalAction, default=None)
    return ap.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    try:
        if a.fixtures:
            run_all(a.fixtures, fixture_options(), a.dry_run, manifest=True)
        elif a.unseen:
            if a.count < 1:
                raise OptionError("--count must be >= 1")
            run_all(a.unseen, unseen_options(a.count, 0 if a.seed is None else a.seed), a.dry_run, manifest=True)
        else:
            o = dict(DEFAULTS)
            o.update({k: getattr(a, k) for k in DEFAULTS if hasattr(a, k)})
            o["seed"] = 0 if a.seed is None else a.seed
            hyb = {k: getattr(a, k) for k in HYBRID_DEFAULTS if getattr(a, k, None) is not None}
            if a.family in HYBRID_FAMILIES:
                if o["config_form"] is None:
                    o["config_form"] = "text"
                for k, conv in (("mrope_section", int), ("a_log_range", float)):
                    if k in hyb:
                        try:
                            hyb[k] = [conv(x) for x in hyb[k].split(",")]
                        except ValueError:
                            raise OptionError(f"--{k.replace('_', '-')} {hyb[k]!r} is not a comma-separated list")
                o.update(hyb)
            else:
                if hyb:
                    raise OptionError(f"options {sorted(hyb)} exist only for --family qwen3_5")
                if o["config_form"] is None:
                    o["config_form"] = DEFAULTS["config_form"]
            o = normalize(o)
            path = os.path.normpath(a.one)
            run_all(os.path.dirname(path) or ".", [(os.path.basename(path), o)], a.dry_run, manifest=False)
    except OptionError as e:
        raise SystemExit(f"make_reference: bad options: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
