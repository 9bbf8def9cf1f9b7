# r3 — the two commands a newcomer needs: `make demo` and `make test`.
# Both install missing Debian packages (scripts/install-deps.sh), configure and build first.

BUILD_DIR      ?= build
SANITIZE_DIR   ?= build-sanitize
BUILD_TYPE     ?= Release
JOBS           ?= $(shell nproc)
DEMO_MODEL     ?= tests/data/qwen3_moe
DEMO_IDS       ?= 17,42,7,99,3,250,61,8

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

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR)
