# The README's two commands: `make demo` and `make test`. Both install the Debian packages they
# need when missing, configure and build in build/, then run.
BUILD ?= build
JOBS ?= $(shell nproc)
APT_PACKAGES := cmake g++ make libdnnl-dev libopenmpi-dev openmpi-bin libcli11-dev \
	nlohmann-json3-dev libfmt-dev libgtest-dev libtomlplusplus-dev libhwy-dev libxxhash-dev iproute2 \
	python3

# One thread per rank (OpenMP spin-waiting with more threads than cores is 3-4x slower), and
# OpenMPI may run as root in containers and CI.
export OMP_NUM_THREADS ?= 1
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: deps deps-sanitize configure build demo test bench clean format configure-sanitize build-sanitize \
	test-sanitize test-sanitize-unit fuzz

deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Debian's python3, where python3-matplotlib is installed.
PYTHON ?= /usr/bin/python3
MPIRUN := mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1
DEMO_RANKS ?= 2

demo: build
	$(MPIRUN) -np $(DEMO_RANKS) ./$(BUILD)/upipe demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build in $(SANITIZE_BUILD) (-DUPIPE_SANITIZE=ON;
# any UB report aborts the test), compiled with clang++: g++ 12's UBSan does not report pointer
# arithmetic on null (the meta device's old bug), clang's does. `test-sanitize` runs the whole suite there, multi-rank tests
# under mpirun included; `test-sanitize-unit` only the unit tests (ctest -L unit). LeakSanitizer
# is on for unit tests and off (ASAN_OPTIONS=detect_leaks=0, set per test in
# tests/CMakeLists.txt) for everything under mpirun, because OpenMPI itself leaks.
SANITIZE_BUILD ?= build-sanitize
SANITIZE_CXX ?= clang++
export UBSAN_OPTIONS ?= print_stacktrace=1

deps-sanitize: deps
	@command -v $(SANITIZE_CXX) >/dev/null 2>&1 || { echo "installing Debian package: clang"; \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq clang; }

configure-sanitize: deps-sanitize
	cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUPIPE_SANITIZE=ON \
	  -DCMAKE_CXX_COMPILER=$(SANITIZE_CXX)

build-sanitize: configure-sanitize
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)

test-sanitize: build-sanitize
	cd $(SANITIZE_BUILD) && ctest --output-on-failure -j $(JOBS)

test-sanitize-unit: build-sanitize
	cd $(SANITIZE_BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

# libFuzzer harnesses over the readers of users' files (tools/fuzz, docs/training.md), built with
# clang in $(FUZZ_BUILD) (-DUPIPE_FUZZ=ON: ASan, UBSan and coverage), their seed corpora written
# to $(FUZZ_BUILD)/corpus/. Never part of `make test` or CI: run each fuzzer by hand.
FUZZ_BUILD ?= build-fuzz

fuzz: deps-sanitize
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUPIPE_FUZZ=ON \
	  -DCMAKE_CXX_COMPILER=$(SANITIZE_CXX)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target upipe_fuzzers
	$(PYTHON) tools/fuzz/seeds.py $(FUZZ_BUILD)/corpus

# Benchmarks (never part of `make test`): regenerates docs/results.md and docs/img/.
bench: build
	@dpkg -s python3-matplotlib >/dev/null 2>&1 || { sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq python3-matplotlib; }
	$(PYTHON) bench/run_benchmarks.py --build $(BUILD)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu')

clean:
	rm -rf $(BUILD) $(SANITIZE_BUILD)
