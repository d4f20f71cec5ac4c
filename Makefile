# mptc — build, test, run.
#   make            build build/mptc
#   make run        install what is missing, build, train the default example
#   make test       build and run the whole test suite
#   make bench      CPU benchmarks (bench/)
#   make static     build-static/mptc with LLVM linked in (= make STATIC=1)
#   make package-gpu  .gpu/: static binaries and data for the GPU machine
#   make test-gpu   on the GPU machine: run the tests from .gpu/ (docs/GPU.md)

CC       ?= cc
LLVM_CONFIG ?= $(shell command -v llvm-config-14 || command -v llvm-config)
BUILD    := build
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -Wswitch-enum -Wno-unused-parameter -MMD -MP \
            -I. -I$(BUILD) -D_GNU_SOURCE -fno-strict-aliasing -pthread
LLVM_CFLAGS := $(shell $(LLVM_CONFIG) --cflags 2>/dev/null | sed 's/-Werror[^ ]*//g')
LLVM_COMPONENTS := core orcjit native passes analysis target ipo perfjitevents
ifeq ($(STATIC),1)
# For machines without LLVM (docs/GPU.md): LLVM, libstdc++, libgcc, zlib,
# libpng, libjpeg and libtinfo are linked from their .a files. glibc stays
# shared because a static glibc cannot dlopen libcuda/libnvrtc/libcublasLt.
# Debian ships no libcjson.a, so libcjson.so.1 is copied into $(BUILD)/lib and
# found through the $ORIGIN rpath. Objects go to build-static, leaving build/ alone.
BUILD    := build-static
LLVM_LIBS := $(shell $(LLVM_CONFIG) --link-static --ldflags --libs $(LLVM_COMPONENTS) 2>/dev/null)
LDFLAGS  += -static-libgcc -Wl,--gc-sections -Wl,-rpath,'$$ORIGIN/lib:$$ORIGIN/../lib'
LDLIBS   += $(LLVM_LIBS) -Wl,-Bstatic -lpng16 -ljpeg -lz -ltinfo -lstdc++ -Wl,-Bdynamic \
            -lcjson -lm -ldl -lpthread -lrt
else
LLVM_LIBS := $(shell $(LLVM_CONFIG) --libs $(LLVM_COMPONENTS) 2>/dev/null)
LDLIBS   += $(LLVM_LIBS) -lcjson -lpng -ljpeg -lz -lm -ldl -lpthread
endif

GEN      := $(BUILD)/lang/lexer.c $(BUILD)/lang/parser.c
# Data parallelism's MPI calls (runtime/dist/mpi_shim.c), a library of their
# own that mptc loads only under mpirun; built where mpicc is (.ci/deps.sh
# installs Open MPI), left out elsewhere and in the static build
MPICC    ?= $(shell command -v mpicc)
ifneq ($(STATIC),1)
MPI_SHIM := $(if $(MPICC),$(BUILD)/lib/libmptc_mpi.so)
endif
# every C file of the stage folders (lang ir fusion codegen runtime, and the
# folders inside them), main.c aside
STAGES   := lang ir fusion codegen runtime
LIB_SRC  := $(filter-out runtime/cli/main.c runtime/dist/mpi_shim.c,$(shell find $(STAGES) -name '*.c' | sort))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(GEN:.c=.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: $(BUILD)/mptc $(MPI_SHIM)

$(BUILD)/lang/lexer.c: lang/lexer.l $(BUILD)/lang/parser.c
	@mkdir -p $(dir $@)
	flex -o $@ --header-file=$(BUILD)/lang/lexer.h $<

$(BUILD)/lang/parser.c: lang/parser.y
	@mkdir -p $(dir $@)
	bison -Wall -o $@ --defines=$(BUILD)/lang/parser.h $<

$(BUILD)/lang/lexer.o: $(BUILD)/lang/lexer.c
	$(CC) $(CFLAGS) -Wno-sign-compare -Wno-unused-function -c $< -o $@
$(BUILD)/lang/parser.o: $(BUILD)/lang/parser.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/codegen/cpu/%.o: codegen/cpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LLVM_CFLAGS) -c $< -o $@

# pooling, the convolutions' data movement and batch_matmul run as C loops:
# -O3 vectorizes them (ResNet-50's first max pooling, see emit_opaque.c)
$(BUILD)/codegen/cpu/emit_opaque.o: CFLAGS += -O3
$(BUILD)/codegen/cpu/batch_matmul.o: CFLAGS += -O3
$(BUILD)/codegen/cpu/opaque_index.o: CFLAGS += -O3
# (attention's loops over a tile carry `omp simd`: -fopenmp-simd honours it)
$(BUILD)/codegen/cpu/attention.o: CFLAGS += -O3 -fopenmp-simd
$(BUILD)/codegen/cpu/attention_grad.o: CFLAGS += -O3 -fopenmp-simd
$(BUILD)/codegen/cpu/attention_amx.o: CFLAGS += -O3

$(BUILD)/%.o: %.c | $(GEN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/lib/libmptc_mpi.so: runtime/dist/mpi_shim.c runtime/dist/mpi_shim_impl.h
	@mkdir -p $(dir $@)
	$(MPICC) -O2 -g -std=gnu11 -Wall -Wextra -I. -fPIC -shared $< -o $@

$(BUILD)/libmptc.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# `mptc --version` names the commit main.o was built at
$(BUILD)/runtime/cli/main.o: CFLAGS += -DMPTC_COMMIT='"$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)"'

$(BUILD)/mptc: $(BUILD)/runtime/cli/main.o $(BUILD)/libmptc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(BUILD)/libmptc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LLVM_CFLAGS) $< $(BUILD)/libmptc.a $(LDFLAGS) $(LDLIBS) -o $@

$(BUILD)/bench/%: bench/%.c $(BUILD)/libmptc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LLVM_CFLAGS) $< $(BUILD)/libmptc.a $(LDFLAGS) $(LDLIBS) -lopenblas -o $@

test: $(BUILD)/mptc $(MPI_SHIM) $(TEST_BIN) $(BUILD)/fuzz/fuzz_lang
	@bash tests/run_all.sh $(BUILD)

# The front end's fuzz target (tests/fuzz_lang.c, run by tests/fuzz.t.sh):
# lang/, ir/ and fusion/ built again by clang with libFuzzer, ASan and UBSan.
# Where clang or its fuzzer runtime is missing the target is not built and
# the test says so.
FUZZ_CC  ?= $(shell command -v clang-14 || command -v clang)
FUZZ_SRC := tests/fuzz_lang.c $(shell find lang ir fusion -name '*.c' | sort) $(GEN)
$(BUILD)/fuzz/fuzz_lang: $(FUZZ_SRC) $(wildcard lang/*.h ir/*.h ir/*.def fusion/*.h)
	@mkdir -p $(dir $@)
	@if [ -z "$(FUZZ_CC)" ]; then echo "note: no clang: the fuzz test will be skipped"; \
	else echo "$(FUZZ_CC) -fsanitize=fuzzer,address,undefined ... -o $@"; \
	$(FUZZ_CC) -g -O1 -std=gnu11 -I. -I$(BUILD) -D_GNU_SOURCE -fno-strict-aliasing \
	    -Wno-unused-command-line-argument -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all $(FUZZ_SRC) -lm -o $@ || \
	{ rm -f $@; echo "note: clang could not build the fuzz target: the fuzz test will be skipped"; }; fi

deps:
	@bash .ci/deps.sh

run: deps
	$(MAKE) $(BUILD)/mptc
	$(BUILD)/mptc train examples/$$( $(BUILD)/mptc devices --has-gpu >/dev/null 2>&1 && echo mnist_mlp || echo mlp_small ).mpt

bench: $(BUILD)/mptc $(BENCH_BIN)
	@for b in $(BENCH_BIN); do echo "== $$b"; $$b || exit 1; done

clean:
	rm -rf $(BUILD)

.PHONY: all test deps run bench clean
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# mptc beside PyTorch, TensorFlow and JAX (those installed), written into
# docs/BENCHMARKS.md; options: make bench-peers PEERS_ARGS="--threads 4"
bench-peers: $(BUILD)/mptc
	@bash bench/run_peers.sh $(PEERS_ARGS)
.PHONY: bench-peers

# Static build and GPU-machine bundle (docs/GPU.md). The bundle is made here
# because the GPU machine has no LLVM, flex or bison; there it only runs.
ifeq ($(STATIC),1)
$(BUILD)/lib/libcjson.so.1:
	@mkdir -p $(dir $@)
	cp -L "$$($(CC) -print-file-name=libcjson.so.1)" $@
$(BUILD)/mptc $(TEST_BIN) $(BENCH_BIN): | $(BUILD)/lib/libcjson.so.1
endif

static:
	$(MAKE) STATIC=1

package-gpu:
	@bash scripts/gpu_bundle.sh

test-gpu:
	@bash scripts/gpu_run.sh tests
.PHONY: static package-gpu test-gpu

# The recording CUDA driver, cuBLASLt and NCCL the host-side CUDA tests load
# (tests/fake/cuda.c, tests/fake/nccl.c, tests/fake/streams.c)
$(BUILD)/tests/fake/libfakecuda.so: tests/fake/cuda.c tests/fake/nccl.c tests/fake/streams.c tests/fake/fake.h
	@mkdir -p $(dir $@)
	$(CC) -O1 -g -std=gnu11 -D_GNU_SOURCE -fPIC -shared $(filter %.c,$^) -o $@
$(BUILD)/tests/test_cuda_exec $(BUILD)/tests/test_cuda_steps $(BUILD)/tests/test_cuda_nccl: \
    $(BUILD)/tests/fake/libfakecuda.so
