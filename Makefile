# ingot's entry points. `make demo` and `make test` install what is missing, build, and run.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: quant-quality all deps build test test-sanitize fuzz demo bench-cpu clean

all: build

deps:
	scripts/install-deps
	scripts/fetch-tokenizers

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# The malformed-input (checkpoints, engine files), bad-input (the CLI) and cache tests again under AddressSanitizer
# and UBSan (CPU build).
test-sanitize: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DINGOT_SANITIZE=ON -DINGOT_CUDA=OFF
	cmake --build build-asan -j$(JOBS) --target ingot test_checkpoint_io test_kv_cache test_engine_file test_bad_input test_qwen3_5
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 INGOT_TEST_TIMEOUT_SCALE=10 \
	  ctest --test-dir build-asan --output-on-failure \
	  -R "Safetensors|Checkpoint|BuildEngine|Config|KvCache|AttentionOp|Engine|Refusal|RoundTrip|BadInput|Qwen3_5"

# Each libFuzzer target for a bounded time (FUZZ_SECONDS each).
FUZZ_SECONDS ?= 20
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DINGOT_CUDA=OFF -DINGOT_FUZZ=ON -DBUILD_TESTING=OFF
	cmake --build build-fuzz -j$(JOBS) --target $$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$$//' | tr '\n' ' ')
	set -e; for f in tests/fuzz/fuzz_*.cpp; do n=$$(basename $$f .cpp); mkdir -p build-fuzz/corpus-$$n; \
	  echo "fuzzing $$n for $(FUZZ_SECONDS)s"; \
	  build-fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 build-fuzz/corpus-$$n >build-fuzz/$$n.log 2>&1 \
	    || { tail -40 build-fuzz/$$n.log; exit 1; }; done

# Generation on the model shipped in the repo (models/demo: a tiny Qwen3-architecture model trained by
# tools/train_demo_model.py, with the Llama 2 tokenizer fetched from npm), on the GPU if there is one,
# else the CPU; then its parity check against transformers.
DEMO_DIR = $(BUILD)/demo-model
TOKENIZERS = $(or $(INGOT_CACHE),.cache)/tokenizers
demo: build
	mkdir -p $(DEMO_DIR)
	cp models/demo/* $(DEMO_DIR)/
	cp $(TOKENIZERS)/llama2/tokenizer.json $(TOKENIZERS)/llama2/tokenizer_config.json $(DEMO_DIR)/
	$(BUILD)/ingot generate --model $(DEMO_DIR) --prompt "Once upon a time," --max-new-tokens 60
	$(BUILD)/ingot generate --model $(DEMO_DIR) --prompt "Tom had a" --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 60
	$(BUILD)/ingot check --model $(DEMO_DIR) --reference $(DEMO_DIR)/reference.safetensors --dtype fp32

# The INT4 quality table of docs/quantization.md: the demo model unquantized, RTN and activation-aware
# at groups 32/64/128, on held-out stories (CPU).
quant-quality: build
	mkdir -p $(DEMO_DIR)
	cp models/demo/* $(DEMO_DIR)/
	cp $(TOKENIZERS)/llama2/tokenizer.json $(TOKENIZERS)/llama2/tokenizer_config.json $(DEMO_DIR)/
	$(BUILD)/ingot_quant_quality --model $(DEMO_DIR) --calibration tests/data/quant/demo_calibration.txt \
	  --heldout tests/data/quant/demo_heldout.txt

# Decode speed of Qwen3-0.6B shapes with random bf16 weights on this CPU.
bench-cpu: build
	$(BUILD)/ingot bench --config bench/shapes/qwen3-0.6b.json --device cpu --dtype bf16 --prompt-len 16 --new-tokens 16

clean:
	rm -rf $(BUILD) build-asan build-fuzz
