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
"""

import argparse
import copy
import json
import math
import os
import random
import sys
import tempfile

FAMILIES = ("llama", "qwen2", "qwen3")
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
    if fam not in FAMILIES:
        raise OptionError(f"family {fam!r} not in {FAMILIES}")
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

    # 1. Load our hand-written config and check transformers read it the way we meant.
    config = AutoConfig.from_pretrained(path)
    check_loaded_config(name, o, config)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.eval()
    check_tensor_layout(name, o, model.state_dict())

    # 2. Random init: named_parameters() lists a tied weight once, so tying survives.
    torch.manual_seed(o["seed"])
    gen = torch.Generator().manual_seed(o["seed"])
    with torch.no_grad():
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
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    check_loaded_config(name, o, model.config)
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        fail(name, f"attention implementation is {model.config._attn_implementation!r}, not eager")
    reloaded = model.state_dict()
    for n, t in data.items():
        if n not in reloaded or reloaded[n].dtype != torch.float32 or not torch.equal(reloaded[n], t):
            fail(name, f"tensor {n} did not round-trip through the saved files")
    if o["tie"] and not torch.equal(model.get_output_embeddings().weight, data["model.embed_tokens.weight"]):
        fail(name, "reloaded lm_head is not tied to embed_tokens")
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

    ref = {
        "input_ids": input_ids.contiguous(),
        "logits": logits,
        "greedy_prompt_len": torch.tensor([P], dtype=torch.int64),
        "greedy_ids": seqs.contiguous(),
        "greedy_margin": greedy_margin,
    }
    rt = rope_tables(model)
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
    ref_path = os.path.join(path, "reference.safetensors")
    save_file(ref, ref_path, metadata=meta)

    weight_bytes = sum(os.path.getsize(os.path.join(path, f)) for f in files)
    ref_bytes = os.path.getsize(ref_path)
    print(f"{name}: {describe(o)} params={params} "
          f"weights={weight_bytes}B in {len(files)} file(s) reference={ref_bytes}B "
          f"min_greedy_margin={float(greedy_margin.min()):.4g}")
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
    ap.add_argument("--family", choices=FAMILIES, default=d["family"])
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
    ap.add_argument("--config-form", dest="config_form", choices=("classic", "new"), default=d["config_form"])
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
            o = normalize(o)
            path = os.path.normpath(a.one)
            run_all(os.path.dirname(path) or ".", [(os.path.basename(path), o)], a.dry_run, manifest=False)
    except OptionError as e:
        raise SystemExit(f"make_reference: bad options: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
