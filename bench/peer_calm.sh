#!/usr/bin/env bash
# calm (github.com/zeux/calm) as a decode-speed peer: its fp16 and 4-bit `gf4` modes on a checkpoint of
# the same shapes as ingot's benchmark, so the INT4 and decode-speed tables hold a third engine's
# figures from the same device call. Two steps, because the GPU machine has no network:
#
#   bench/peer_calm.sh build [SRC]      here: builds calm for sm_90 from SRC (a snapshot folder or bare
#                                        git directory; default the `fetch` tool's mirror) into
#                                        build-gpu/calm (the binary `run` and calm's tools/convert.py)
#   bench/peer_calm.sh run SHAPE [N]    on the GPU machine, from the repository root (build-gpu/calm and
#                                        .cache/tokenizers/llama3 carried): a random bf16 checkpoint of
#                                        bench/shapes/SHAPE.json (tools/random_checkpoint.py), converted
#                                        by calm's own convert.py to fp16 and to gf4, each run greedy for
#                                        N steps (default 384: a 128-token prompt, which calm feeds one token
#                                        a step, then 256 new) and one JSON line printed per mode
#
# calm's throughput line counts every step (prompt steps cost what decode steps do in calm), so it is
# its per-token decode rate. The config copy given to calm has a single eos id (its converter stores the
# field as a string) and the checkpoint's llama3 tokenizer; random weights make the text meaningless,
# which calm does not mind: a step reads the same bytes whatever the token. Only llama-architecture
# shapes (calm has no Qwen3 q/k norm).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build-gpu/calm
case "${1:-}" in
build)
  src="${2:-/work/.mirror/zeux+calm/repo}"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if [ -d "$src/objects" ] || [ -f "$src/HEAD" ]; then
    git --git-dir="$src" archive HEAD | tar x -C "$tmp"  # a bare snapshot
    rev=$(git --git-dir="$src" rev-parse --short HEAD)
  else
    cp -r "$src/." "$tmp"
    rev=unknown
  fi
  # CUDA 13 removed two things calm's snapshot uses: the internal _ALIGNAS macro (standard alignas is
  # the same) and cudaDeviceProp::memoryClockRate (only in its banner line; printed as 0 here).
  sed -i 's/_ALIGNAS(/alignas(/' "$tmp/src/helpers.cuh"
  sed -i 's/(double)devprop.memoryClockRate/0.0/' "$tmp/src/infer.cu"
  # It links with the C compiler; CUDA 13's host stubs need the C++ runtime (static-local guards).
  echo 'LDFLAGS+=-lstdc++' >> "$tmp/Makefile"
  make -C "$tmp" CUARCH=sm_90 -j"${JOBS:-2}" >/dev/null
  rm -rf "$dest" && mkdir -p "$dest"
  cp "$tmp/build/run" "$tmp/tools/convert.py" "$dest/"
  echo "$rev" > "$dest/REVISION"
  echo "calm $rev built in $dest"
  ;;
run)
  shape="${2:?usage: bench/peer_calm.sh run SHAPE [STEPS]}"
  steps="${3:-384}"
  [ -x "$dest/run" ] || { echo "peer_calm: $dest/run is missing (run 'bench/peer_calm.sh build' here and carry build-gpu/calm)" >&2; exit 2; }
  grep -q '"LlamaForCausalLM"' "bench/shapes/$shape.json" || { echo "peer_calm: $shape is not a llama-architecture shape" >&2; exit 2; }
  work="${CALM_WORK:-/tmp/calm_$shape}"
  model="$work/hf"
  [ -s "$model/model.safetensors" ] || python3 tools/random_checkpoint.py --config "bench/shapes/$shape.json" \
    --out "$model" --tokenizer .cache/tokenizers/llama3 >&2
  python3 - "$model/config.json" "$work/calm_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if isinstance(c.get("eos_token_id"), list):
    c["eos_token_id"] = c["eos_token_id"][0]
c.pop("rope_scaling", None)  # calm reads no llama3 scaling; speed does not depend on it
json.dump(c, open(sys.argv[2], "w"))
PY
  # A prompt of 128 tokens for the llama3 tokenizer: one common word repeated.
  prompt=$(python3 -c "print(' the' * 127)")
  for dt in fp16 gf4; do
    [ -s "$work/model_$dt.calm" ] || python3 "$dest/convert.py" "$work/model_$dt.calm" --config "$work/calm_config.json" \
      --tokenizer "$model/tokenizer.json" --models "$model/model.safetensors" --dtype "$dt" >"$work/convert_$dt.log" 2>&1 \
      || { tail -5 "$work/convert_$dt.log" >&2; exit 1; }
    line=$("$dest/run" "$work/model_$dt.calm" -i "$prompt" -n "$steps" -t 0 -c 4096 2>&1 >/dev/null | grep 'throughput:' | tail -1)
    python3 - "$shape" "$dt" "$line" "$(cat "$dest/REVISION" 2>/dev/null || echo unknown)" <<'PY'
import json, re, sys
shape, dt, line, rev = sys.argv[1:5]
m = re.search(r"# (\d+) tokens: throughput: ([\d.]+) tok/s; latency: ([\d.]+) ms/tok; bandwidth: ([\d.]+) GB/s", line)
if not m:
    print(json.dumps({"engine": "calm", "shape": shape, "dtype": dt, "error": line or "no throughput line"}))
else:
    print(json.dumps({"engine": "calm", "revision": rev, "shape": shape, "dtype": dt, "steps": int(m[1]),
                      "tok_s": float(m[2]), "ms_per_tok": float(m[3]), "calm_gb_s": float(m[4])}))
PY
  done
  ;;
*)
  sed -n 2,19p "$0" >&2
  exit 2
  ;;
esac
