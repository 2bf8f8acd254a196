# The user's interface to cddp. Every target installs the Debian packages it needs first
# (scripts/deps.sh: nothing happens when they are present), then drives CMake in build/.
#
#   make          build everything into build/ (programs in build/bin/)
#   make test     build with -Wall -Wextra -Werror and run the whole suite (ctest)
#   make demo     train on Fashion-MNIST with 2 data-parallel ranks
#   make bench    bench/compare: cddp side by side with PyTorch and Open MPI (installs
#                 python3-torch): training, data, launching, allreduce, data-parallel training;
#                 writes docs/BENCHMARKS.md, docs/img/ and README.md's headline table
#   make install  headers, libraries, pkg-config and CMake files under PREFIX (default /usr/local)

BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_CONFIGURE = cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCDDP_WERROR=ON \
                  -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null

.PHONY: all build test demo bench install clean

all: build

build:
	@scripts/deps.sh build
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)

test:
	@scripts/deps.sh test
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo:
	@scripts/deps.sh demo
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS) --target fashion_mnist cddprun
	$(BUILD)/bin/cddprun --nproc_per_node 2 --logdir $(BUILD)/demo/logs --tee \
		$(BUILD)/bin/fashion_mnist --epochs 2 --out $(BUILD)/demo
	@echo
	@echo "Trained data-parallel on 2 ranks. Find:"
	@echo "  the checkpoint  $(BUILD)/demo/checkpoint.safetensors (every epoch; --resume continues from it)"
	@echo "  the curves      $(BUILD)/demo/curves.svg (loss and test accuracy per epoch)"
	@echo "  the metrics     $(BUILD)/demo/metrics.csv"
	@echo "  the logs        $(BUILD)/demo/logs/ (one folder per rank)"

bench:
	@scripts/deps.sh bench
	@$(CMAKE_CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)
	bench/compare $(BUILD)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
