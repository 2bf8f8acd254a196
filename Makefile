# The user's interface to cddp. Every target installs the Debian packages it needs first
# (scripts/deps.sh: nothing happens when they are present), then drives CMake in build/.
#
#   make          build everything into build/ (programs in build/bin/)
#   make test     build with -Wall -Wextra -Werror and run the whole suite (ctest)
#   make demo     train on Fashion-MNIST with 2 data-parallel ranks
#   make demo-gpt train a small GPT on Debian's fortunes with 2 data-parallel ranks (about 3
#                 minutes), then sample text from it
#   make bench    bench/compare: cddp side by side with PyTorch and Open MPI (installs
#                 python3-torch): training, data, launching, allreduce, data-parallel training;
#                 writes docs/BENCHMARKS.md, docs/img/ and README.md's headline table
#   make install  headers, libraries, pkg-config and CMake files under PREFIX (default /usr/local)

BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Only `make test` builds the tests: the other targets must not need the test framework.
CMAKE_CONFIGURE = cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCDDP_WERROR=ON \
                  -DCMAKE_INSTALL_PREFIX=$(PREFIX) -DCDDP_BUILD_TESTS=$(TESTS) $(CMAKE_FLAGS) >/dev/null
TESTS = OFF

.PHONY: all build test demo demo-gpt bench install clean

all: build

build:
	@scripts/deps.sh build
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)

test: TESTS = ON
test:
	@scripts/deps.sh test
	@scripts/pydeps.sh
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --output-log ctest.log

demo:
	@scripts/deps.sh demo
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS) --target fashion_mnist cddprun
	$(BUILD)/bin/cddprun --standalone --nproc_per_node 2 --logdir $(BUILD)/demo/logs --tee \
		$(BUILD)/bin/fashion_mnist --epochs 2 --out $(BUILD)/demo
	@echo
	@echo "Trained data-parallel on 2 ranks. Find:"
	@echo "  the checkpoint  $(BUILD)/demo/checkpoint.safetensors (every epoch; --resume continues from it)"
	@echo "  the curves      $(BUILD)/demo/curves.svg (the loss at every step, the test accuracy"
	@echo "                  after every epoch; the numbers in loss.csv and eval.csv beside it)"
	@echo "  the metrics     $(BUILD)/demo/metrics.csv (per epoch: loss, accuracy, samples/s)"
	@echo "  the logs        $(BUILD)/demo/logs/ (one folder per rank)"

demo-gpt:
	@scripts/deps.sh demo-gpt
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS) --target gpt_train cddprun
	$(BUILD)/bin/cddprun --standalone --nproc_per_node 2 --logdir $(BUILD)/demo-gpt/logs \
		$(BUILD)/bin/gpt_train --max_iters 2000 --log_interval 100 --sample 400 --out $(BUILD)/demo-gpt
	@echo
	@echo "The validation loss (iteration, loss) at its last evaluations:"
	@tail -n 4 $(BUILD)/demo-gpt/eval.csv | cut -d, -f1,3 | sed 's/^/  /'
	@echo "Trained a GPT data-parallel on 2 ranks. Find:"
	@echo "  the checkpoint  $(BUILD)/demo-gpt/checkpoint.safetensors (nanoGPT's names; --resume continues)"
	@echo "  the curves      $(BUILD)/demo-gpt/curves.svg (loss.csv and eval.csv beside it)"
	@echo "  the logs        $(BUILD)/demo-gpt/logs/ (one folder per rank)"

bench:
	@scripts/deps.sh bench
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)
	bench/compare $(BUILD)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
