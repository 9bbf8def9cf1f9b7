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

.PHONY: all deps build demo test test-sanitize bench clean

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

# The same suite built with AddressSanitizer and UndefinedBehaviorSanitizer.
test-sanitize: deps
	@cmake -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DR3_SANITIZE=ON >/dev/null
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	ctest --test-dir $(SANITIZE_DIR) --output-on-failure -j $(JOBS)

bench: build
	$(BUILD_DIR)/r3_bench
	@test -f $(BENCH_MODEL)/hf/model.safetensors || python3 $(PEER_DIR)/make_model.py --size mid --out $(BENCH_MODEL) --gguf ''
	$(BUILD_DIR)/r3_model_bench --model $(BENCH_MODEL)/hf --threads $(BENCH_THREADS) --prompt 32 --gen 64 --reps 3

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR)
