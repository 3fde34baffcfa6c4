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
import os
import sys
import tempfile

from reference_options import (  # the options, configs, layouts and fixture sets (pure Python)
    ALL_FAMILIES, DEFAULTS, FORMAT_VERSION, HYBRID_ARCH, HYBRID_DEFAULTS, HYBRID_FAMILIES, HYBRID_MODEL_TYPE,
    OptionError, ROPE_TYPES, build_config, build_generation_config, describe_hybrid, expected_tensors,
    fixture_options, hybrid_layer_types, hybrid_prefix, hybrid_tensors, layer_types, normalize, numel,
    plan_shards, rope_fields, rotary_dim, shard_file_names, tiny_vision_config, unseen_options, write_json,
)

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
