# vkc developer entry points. Each target sets up .venv with only what it needs (stamp per install set).
#   make regen               the regen toolchain only (`.[regen]`: pinned Triton 3.9.0, no torch), compile every
#                            kernel for all 7 archs (CPU only), then the drift check
#   make test                regen toolchain + test deps (`.[test]`: torch for Triton's interpreter, transformers),
#                            drift check + the CPU test suite (what CI runs)
#   make wheel ARCH=sm_90a   a wheel with that arch's artifacts + the native launcher (ARCH=all | none | a,b,...)
#   make cute-env            .venv-cute: the CuTe DSL lane's compiler (pinned nvidia-cutlass-dsl, cu12 flavor only),
#                            which `vkc regen` runs in fresh subprocesses (env VKC_CUTE_PYTHON names another one)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml CMakeLists.txt csrc/*.cpp 2>/dev/null | sha256sum | cut -c1-16)
REGEN_STAMP := $(VENV)/.installed-regen-$(HASH)
# where aot/vkc/cute_lane.py looks when VKC_CUTE_PYTHON is unset
CUTE_VENV ?= .venv-cute
# keep in step with aot/vkc/toolchain.py CUTLASS_DSL (regen refuses any other version or flavor)
CUTE_PINS := nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
             nvidia-cutlass-dsl-libs-cu12==4.8.1
CUTE_STAMP := $(CUTE_VENV)/.installed-dsl-4.8.1-cu12
TEST_STAMP := $(VENV)/.installed-test-$(HASH)

.PHONY: regen verify test wheel clean cute-env

# `make wheel` without ARCH used to build a wheel with no kernels (an empty VKC_ARCHES): refuse before any work.
ifneq ($(filter wheel,$(MAKECMDGOALS)),)
ifeq ($(strip $(ARCH)),)
ARCHS_KNOWN := $(shell $(PY) -c "import sys; sys.path.insert(0, 'contract'); from vkc_contract.arch import ALL_ARCHS; print(','.join(ALL_ARCHS))")
$(error make wheel needs ARCH: e.g. make wheel ARCH=sm_90a (comma-separated archs of $(ARCHS_KNOWN), or all, or none))
endif
endif

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# one install set per stamp; the test set includes the regen set, so it satisfies both
$(REGEN_STAMP): | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[regen]'
	rm -f $(VENV)/.installed-regen-*
	touch $@

$(TEST_STAMP): | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@ $(REGEN_STAMP)

$(CUTE_STAMP):
	$(PY) -m venv $(CUTE_VENV)
	$(CUTE_VENV)/bin/python -m pip install -q $(CUTE_PINS)
	touch $@

cute-env: $(CUTE_STAMP)

regen: $(REGEN_STAMP) $(CUTE_STAMP)
	VKC_CUTE_PYTHON="$${VKC_CUTE_PYTHON:-$(CUTE_VENV)/bin/python}" $(BIN)/vkc regen --all
	$(BIN)/vkc verify

verify: $(REGEN_STAMP)
	$(BIN)/vkc verify

test: $(TEST_STAMP)
	$(BIN)/vkc verify
	$(BIN)/python -m pytest -q

wheel: | $(BIN)/python
	VKC_ARCHES=$(ARCH) $(BIN)/python -m pip wheel --no-deps -w dist .

clean:
	rm -rf build dist $(VENV) $(CUTE_VENV)
