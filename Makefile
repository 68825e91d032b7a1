# pysoftmax — builds libsoftmax.so for the GPU platform found, and runs the tests and the benchmark.
#
#   make                 the library for this machine's platform, copied into pysoftmax/, and the
#                        JAX handlers (pysoftmax/libsoftmax_jax.so) where jax imports
#   make test            Python dependencies (only those that do not import), the library, pytest
#   make bench           the main job: python3 -m pysoftmax bench
#   make gate            benchmark regression gate against this GPU's stored baseline
#   make amd             the AMD build (ROCm's hipcc, or Debian's clang-19 without ROCm) and its
#                        check: wave widths and a load (tools/amd_check.py; no AMD GPU needed)
#   make sanitize        compute-sanitizer memcheck/racecheck/synccheck over every kernel family
#   make spills          each kernel's registers and spills from the compiler's report, for this
#                        platform's build (tools/spills.py; no GPU needed; SPILLS_ARGS=--all)
#
# Overridable: HIP_PLATFORM=nvidia|amd, GPU_ARCHS (nvidia: "80 90"; amd: "gfx90a gfx942 ..."),
# FAST_MATH=1 (opt-in), NVCC, HIPCC, PYTHON.

PYTHON      ?= python3
BENCH_ARGS  ?= --json bench.json --plot bench.png
NVCC        ?= nvcc
HIPCC       ?= hipcc
VERSION     := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' pysoftmax/_version.py)

# ROCm's own hipcc (under /opt/rocm) means an AMD machine; otherwise nvcc means NVIDIA.
ifeq ($(origin HIP_PLATFORM),undefined)
  ifneq ($(wildcard /opt/rocm/bin/hipcc),)
    HIP_PLATFORM := amd
  else ifneq ($(shell command -v $(NVCC) 2>/dev/null),)
    HIP_PLATFORM := nvidia
  else ifneq ($(shell command -v $(HIPCC) 2>/dev/null),)
    HIP_PLATFORM := amd
  else
    HIP_PLATFORM := none
  endif
endif

SOURCES := hip/capi.cu hip/forward.cu hip/backward.cu
BUILD   := build/$(HIP_PLATFORM)
OBJECTS := $(SOURCES:hip/%.cu=$(BUILD)/%.o)
LIB     := $(BUILD)/libsoftmax.so
DEFINES := -DSOFTMAX_VERSION='"$(VERSION)"'

ifeq ($(HIP_PLATFORM),nvidia)
  GPU_ARCHS ?= 80 90
  COMPILER  := $(NVCC)
  # Machine code for each listed architecture, and PTX of the newest so later GPUs can JIT it.
  ARCH_FLAGS := $(foreach a,$(GPU_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a)) \
                -gencode=arch=compute_$(lastword $(GPU_ARCHS)),code=compute_$(lastword $(GPU_ARCHS))
  CXXFLAGS  ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-Wall --expt-relaxed-constexpr
  DEPFLAGS  := -MMD -MP
  LDFLAGS   ?= -shared
  ifeq ($(FAST_MATH),1)
    CXXFLAGS += -use_fast_math
  endif
  ARCH_NAMES := $(foreach a,$(GPU_ARCHS),sm_$(a))
else ifeq ($(HIP_PLATFORM),amd)
  # Three toolchains, the first found: ROCm's own hipcc (an AMD machine: its default targets);
  # Debian's clang-19 with Debian's HIP headers and device libraries (the targets Debian's ROCm 5.2
  # does not know, on a machine without ROCm: README, "AMD"); Debian's hipcc alone (ROCm 5.2:
  # gfx90a and gfx1030 only, its gfx940 being no MI300 target). AMD_TOOLCHAIN=rocm|clang|hipcc forces one.
  CLANG_HIP ?= $(firstword $(wildcard /usr/lib/llvm-19/bin/clang++) $(shell command -v clang++-19 2>/dev/null))
  ifeq ($(origin AMD_TOOLCHAIN),undefined)
    ifneq ($(wildcard /opt/rocm/bin/hipcc),)
      AMD_TOOLCHAIN := rocm
    else ifneq ($(CLANG_HIP),)
      AMD_TOOLCHAIN := clang
    else
      AMD_TOOLCHAIN := hipcc
    endif
  endif
  ifeq ($(AMD_TOOLCHAIN),clang)
    GPU_ARCHS   ?= gfx90a gfx942 gfx1030 gfx1100 gfx1201
    HIP_PATH    ?= /usr
    DEVICE_LIBS ?= /usr/lib/x86_64-linux-gnu/amdgcn/bitcode
    # Debian's device libraries plus a generated ISA-version file for each target they lack.
    DEVLIB_DIR  := build/amd/devlibs
    COMPILER    := $(CLANG_HIP) --hip-path=$(HIP_PATH)
    CXXFLAGS    ?= -O3 -std=c++17 -fPIC -Wall -x hip --rocm-device-lib-path=$(DEVLIB_DIR)
    LDFLAGS     ?= -shared -fPIC --hip-link
  else
    ifeq ($(AMD_TOOLCHAIN),rocm)
      HIPCC := /opt/rocm/bin/hipcc
    else ifneq ($(AMD_TOOLCHAIN),hipcc)
      $(error AMD_TOOLCHAIN='$(AMD_TOOLCHAIN)': expected rocm, clang or hipcc)
    endif
    HIP_VERSION := $(shell $(HIPCC) --version 2>/dev/null | sed -n 's/^HIP version: \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
    HIP_MAJOR   := $(word 1,$(HIP_VERSION))
    HIP_MINOR   := $(word 2,$(HIP_VERSION))
    ifeq ($(HIP_MAJOR),5)
      GPU_ARCHS ?= gfx90a gfx1030
    else ifeq ($(HIP_MAJOR),6)
      GPU_ARCHS ?= gfx90a gfx942 gfx1030 gfx1100 $(if $(filter 0 1 2,$(HIP_MINOR)),,gfx1201)
    else
      GPU_ARCHS ?= gfx90a gfx942 gfx950 gfx1030 gfx1100 gfx1201
    endif
    COMPILER  := HIP_PLATFORM=amd $(HIPCC)
    CXXFLAGS  ?= -O3 -std=c++17 -fPIC -Wall -x hip
    LDFLAGS   ?= -shared -fPIC
  endif
  ARCH_FLAGS := $(foreach a,$(GPU_ARCHS),--offload-arch=$(a))
  DEPFLAGS   := -MMD -MP
  ifeq ($(FAST_MATH),1)
    CXXFLAGS += -ffast-math
  endif
  ARCH_NAMES := $(GPU_ARCHS)
else ifneq ($(HIP_PLATFORM),none)
  $(error HIP_PLATFORM='$(HIP_PLATFORM)': expected nvidia or amd)
endif

comma := ,
space := $() $()
DEFINES += -DSOFTMAX_ARCHS='"$(subst $(space),$(comma),$(strip $(ARCH_NAMES)))"'

.PHONY: all lib jax jax-if-found platform deps test bench gate baseline amd amd-check sanitize spills tune clean
all: lib jax-if-found

platform:  # what `make` builds for here (setup.py asks)
	@echo $(HIP_PLATFORM)

ifeq ($(HIP_PLATFORM),none)
lib:
	$(error no GPU compiler found: install the CUDA toolkit (nvcc) or ROCm (hipcc), or set HIP_PLATFORM)
else
lib: pysoftmax/libsoftmax.so
endif

pysoftmax/libsoftmax.so: $(LIB)
	cp $< $@

# The XLA FFI handlers of pysoftmax.jax (host C++, against jaxlib's headers), beside the library.
# `make` builds them where $(PYTHON) imports jax; `make jax` insists.
CXX         ?= g++
JAX_INCLUDE  = $(shell $(PYTHON) -c "import jax.ffi; print(jax.ffi.include_dir())" 2>/dev/null)
jax:
	@test -n "$(JAX_INCLUDE)" || { echo "make jax: $(PYTHON) cannot import jax.ffi (pip install jax)"; exit 1; }
	$(MAKE) pysoftmax/libsoftmax_jax.so JAX_INCLUDE_DIR="$(JAX_INCLUDE)"

# Optional: a handler that fails to build (no C++ compiler, other XLA headers) warns, and only
# pysoftmax.jax goes without it.
jax-if-found:
	@if [ -n "$(JAX_INCLUDE)" ]; then $(MAKE) pysoftmax/libsoftmax_jax.so JAX_INCLUDE_DIR="$(JAX_INCLUDE)" || \
	  echo "warning: the JAX handlers did not build (above); pysoftmax.jax will say so when used"; \
	else echo "jax not importable with $(PYTHON): the JAX handlers are not built (make jax)"; fi

pysoftmax/libsoftmax_jax.so: ffi/jax_ffi.cc hip/softmax.h
	@test -n "$(JAX_INCLUDE_DIR)" || { echo "build it with make jax (it finds jax's headers)"; exit 1; }
	$(CXX) -std=c++17 -O2 -fPIC -Wall -shared -isystem $(JAX_INCLUDE_DIR) $< -o $@

$(LIB): $(OBJECTS)
	$(COMPILER) $(ARCH_FLAGS) $(LDFLAGS) -o $@ $^

$(BUILD)/%.o: hip/%.cu Makefile | $(BUILD)
	$(COMPILER) $(CXXFLAGS) $(DEPFLAGS) $(ARCH_FLAGS) $(DEFINES) -c $< -o $@

$(BUILD):
	mkdir -p $@

# The objects remember what built them: another compiler, flags or architecture list rebuilds them.
ifneq ($(HIP_PLATFORM),none)
BUILD_STAMP := $(BUILD)/.flags
BUILD_LINE  := $(COMPILER) $(CXXFLAGS) $(ARCH_FLAGS) $(DEFINES)
$(shell mkdir -p $(BUILD) && (echo '$(BUILD_LINE)' | cmp -s - $(BUILD_STAMP) || echo '$(BUILD_LINE)' > $(BUILD_STAMP)))
$(OBJECTS): $(BUILD_STAMP)
endif

ifdef DEVLIB_DIR
# Debian's device libraries, linked, plus oclc_isa_version_<N>.bc for each target of gfx<N> they
# lack. Its one constant, __oclc_ISA_version, is major * 1000 + minor * 100 + stepping, where the
# last two digits of N are minor and stepping in hex: gfx942 -> 9402, gfx1201 -> 12001.
$(DEVLIB_DIR)/.made: $(BUILD_STAMP)
	rm -rf $(DEVLIB_DIR) && mkdir -p $(DEVLIB_DIR)
	ln -s $(DEVICE_LIBS)/*.bc $(DEVLIB_DIR)/
	set -e; for a in $(GPU_ARCHS); do \
	  n=$${a#gfx}; f=$(DEVLIB_DIR)/oclc_isa_version_$$n.bc; [ -e $$f ] && continue; \
	  major=$${n%??}; rest=$${n#$$major}; minor=$${rest%?}; step=$${rest#?}; \
	  v=$$(( major * 1000 + 0x$$minor * 100 + 0x$$step )); \
	  echo "const __constant int __oclc_ISA_version = $$v;" > $(DEVLIB_DIR)/isa_$$n.cl; \
	  $(CLANG_HIP) -x cl -cl-std=CL2.0 -target amdgcn-amd-amdhsa -nogpulib -emit-llvm -c \
	    $(DEVLIB_DIR)/isa_$$n.cl -o $$f; echo "generated $$f ($$v)"; done
	touch $@
$(OBJECTS): | $(DEVLIB_DIR)/.made
endif

-include $(OBJECTS:.o=.d)

deps:
	$(PYTHON) tools/deps.py --platform $(HIP_PLATFORM)

test: deps lib jax-if-found
	$(PYTHON) -m pytest

bench: deps lib
	$(PYTHON) -m pysoftmax bench $(BENCH_ARGS)

gate: deps lib
	$(PYTHON) -m pysoftmax gate

baseline: deps lib
	$(PYTHON) -m pysoftmax gate --save

# The AMD build on any machine (no AMD GPU needed), then its check: every kernel's wave width
# (64 on gfx9, 32 on RDNA) and a load with the HIP runtime (tools/amd_check.py).
amd:
	$(MAKE) HIP_PLATFORM=amd $(if $(AMD_ARCHS),GPU_ARCHS="$(AMD_ARCHS)") build/amd/libsoftmax.so
	$(PYTHON) tools/amd_check.py build/amd

amd-check:
	$(PYTHON) tools/amd_check.py build/amd

sanitize: deps lib
	$(PYTHON) tools/sanitize.py

ifeq ($(HIP_PLATFORM),none)
spills:
	@echo "spills: no nvcc or hipcc found (HIP_PLATFORM=nvidia|amd, NVCC=..., HIPCC=...)"; exit 1
else
spills:
	$(PYTHON) tools/spills.py --platform $(HIP_PLATFORM) $(SPILLS_ARGS) -- $(BUILD_LINE)
endif
ifdef DEVLIB_DIR
spills: | $(DEVLIB_DIR)/.made
endif

tune: deps lib
	$(PYTHON) tools/tune.py

clean:
	rm -rf build pysoftmax/libsoftmax.so pysoftmax/libsoftmax_jax.so
