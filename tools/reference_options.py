#!/usr/bin/env python3
"""The pure-Python half of tools/make_reference.py: its options, the config.json / generation_config.json
they give, the tensor layout a checkpoint of them must hold (all families, Qwen3.5's hybrid layers
included), and the committed fixture set and the randomized "unseen" sets. No torch, no transformers:
make_reference.py --dry-run runs on this alone, and tools/check_qwen3_5_facts.py reads it."""

import copy
import json
import random

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
