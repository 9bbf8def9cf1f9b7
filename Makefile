# r3 — the two commands a newcomer needs: `make demo` and `make test`.
# Both install missing Debian packages (scripts/install-deps.sh), configure and build first.

BUILD_DIR      ?= build
SANITIZE_DIR   ?= build-sanitize
BUILD_TYPE     ?= Release
JOBS           ?= $(shell nproc)
DEMO_MODEL     ?= tests/data/qwen3_moe
DEMO_IDS       ?= 17,42,7,99,3,250,61,8
# The benchmark checkpoint: a deterministic random Qwen3-MoE (1.31 B params, bf16), written by the
# peer-comparison script of the shared folder (the same weights llama.cpp is timed on).
BENCH_MODEL    ?= $(BUILD_DIR)/qwen3moe-mid
PEER_DIR       ?= ../shared/peer-llamacpp
BENCH_THREADS  ?= 2

CMAKE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

FUZZ_DIR       ?= build-fuzz
# Seconds each fuzz target runs (`make fuzz`); CI runs them for FUZZ_SECONDS=60.
FUZZ_SECONDS   ?= 600
FUZZ_TARGETS   := safetensors config replay expert_loads expert_weights request

.PHONY: all deps build demo test test-sanitize fuzz bench clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/r3 generate --model $(DEMO_MODEL) --ids $(DEMO_IDS) --max-new-tokens 12

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The same suite built with AddressSanitizer and UndefinedBehaviorSanitizer. A unity build (one
# compiler run per library or test binary instead of one per file) without the benchmarks: from
# scratch it builds in a few minutes on 2 cores instead of about half an hour.
test-sanitize: deps
	@cmake -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DR3_SANITIZE=ON \
	  -DR3_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON >/dev/null
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	ctest --test-dir $(SANITIZE_DIR) --output-on-failure -j $(JOBS)

# libFuzzer targets (fuzz/), built with clang and ASan + UBSan, each run FUZZ_SECONDS on a scratch
# copy of its seed corpus (fuzz/corpus/<target>). A finding stops with the crashing input saved.
fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DR3_FUZZ=ON \
	  -DR3_WERROR=OFF -DR3_BUILD_TESTS=OFF -DR3_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/findings/$$t; \
	  echo "fuzz: r3_fuzz_$$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_DIR)/fuzz/r3_fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 \
	    -artifact_prefix=$(FUZZ_DIR)/findings/$$t/ -print_final_stats=1 \
	    $(FUZZ_DIR)/corpus/$$t fuzz/corpus/$$t 2>$(FUZZ_DIR)/$$t.log || { tail -40 $(FUZZ_DIR)/$$t.log; exit 1; }; \
	  grep -E "^(Done|stat::number_of_executed_units)" $(FUZZ_DIR)/$$t.log; \
	done

bench: build
	$(BUILD_DIR)/r3_bench
	@test -f $(BENCH_MODEL)/hf/model.safetensors || python3 $(PEER_DIR)/make_model.py --size mid --out $(BENCH_MODEL) --gguf ''
	$(BUILD_DIR)/r3_model_bench --model $(BENCH_MODEL)/hf --threads $(BENCH_THREADS) --prompt 32 --gen 64 --reps 3
	@test -f $(BENCH_MODEL)/fp8/model.safetensors || $(BUILD_DIR)/r3_quantize_fp8 --model $(BENCH_MODEL)/hf --out $(BENCH_MODEL)/fp8
	$(BUILD_DIR)/r3_model_bench --model $(BENCH_MODEL)/fp8 --threads $(BENCH_THREADS) --prompt 32 --gen 64 --reps 3
	$(BUILD_DIR)/r3_serving_bench --model $(BENCH_MODEL)/hf --threads $(BENCH_THREADS) --batch 16 --prefix 1024 --reps 3

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR) $(FUZZ_DIR)
