/* fusion/ — from a typed train-step graph to a kernel plan (and its memory
 * plan), which every backend executes.
 *
 * This header is the whole public surface of fusion/.
 */
#ifndef MPT_FUSION_H
#define MPT_FUSION_H

#include <stdio.h>
#include "ir/ir.h"

typedef enum {
    MPT_KERNEL_GEMM,      /* one MATMUL (root) + prologue casts + epilogue */
    MPT_KERNEL_CONV,      /* one CONV2D* (root) + the same */
    MPT_KERNEL_LOOP,      /* elementwise ops and movement that index 1:1 */
    MPT_KERNEL_REDUCTION, /* one or more reductions over the same input shape + elementwise */
    MPT_KERNEL_OPAQUE,    /* a single op with its own kernel (pooling, gather, ...) */
    MPT_KERNEL_COUNT
} mpt_kernel_kind;

/* Pattern switches for --fusion-disable=... */
enum {
    MPT_FUSE_EPILOGUE = 1 << 0,  /* elementwise after GEMM/conv */
    MPT_FUSE_PROLOGUE = 1 << 1,  /* casts before GEMM/conv */
    MPT_FUSE_LOOP = 1 << 2,      /* elementwise chains */
    MPT_FUSE_REDUCTION = 1 << 3, /* elementwise into/out of reductions */
    MPT_FUSE_MULTI_OUTPUT = 1 << 4,
    MPT_FUSE_EPILOGUE_REDUCE = 1 << 5, /* reduce_all over rows in a GEMM/conv epilogue */
    /* a matmul's epilogue beyond [add bias] [relu] [cast], and casts of its
     * operands: what a GEMM library's epilogue cannot take (CUDA with
     * cuBLASLt, so the GEMM runs there; convolutions keep theirs) */
    MPT_FUSE_GEMM_EXTRA = 1 << 6,
    /* a reduction's result read by row-sized work of its own kernel (batch
     * norm's gradient): one kernel on a CPU; cut into passes where each
     * block reduces a slice of the rows (CUDA) */
    MPT_FUSE_REDUCTION_CHAIN = 1 << 7,
    /* attention's core as one kernel per direction: the rewrite into the
     * attention op before autodiff (ir/attention.c), which the session
     * runs unless this is disabled */
    MPT_FUSE_ATTENTION = 1 << 8,
    /* the attention op reading q, k, v where multi_head_attention's
     * projections put them, [B, T, H, E], instead of after transposes
     * (ops.def's bthd); the session disables it on the CPU, where it
     * measured slower (docs/DECISIONS.md) */
    MPT_FUSE_ATTENTION_LAYOUT = 1 << 9,
};

typedef struct {
    int enabled;            /* 0: one kernel per op (--no-xla) */
    unsigned disable;       /* MPT_FUSE_* bits */
    int max_ops;            /* size cap per kernel (default 64) */
} mpt_fusion_opts;

void mpt_fusion_opts_default(mpt_fusion_opts *o);
/* "epilogue,reduction" -> bits; 0 ok, -1 with the bad word in err */
int mpt_fusion_parse_disable(const char *s, unsigned *bits, char *err, size_t n);

typedef struct {
    mpt_kernel_kind kind;
    char *name;    /* lists its source ops, e.g. gemm_dense_1__bias_relu_cast_f16 */
    int root;      /* the GEMM/conv/reduction/opaque node, or -1 for loops */
    int *nodes;    /* graph node ids, ascending (topological) */
    int n_nodes;
    int *inputs;   /* nodes outside the kernel that it reads, ascending */
    int n_inputs;
    int *outputs;  /* its nodes read outside it, or outputs/updates of the graph */
    int n_outputs;
} mpt_kernel;

typedef struct {
    int producer, consumer; /* node ids */
    const char *reason;     /* static string */
} mpt_refusal;

/* Memory plan: one buffer per value that crosses a kernel boundary. */
typedef struct {
    int node;            /* the value */
    int64_t offset;      /* within its arena */
    int64_t bytes;
    int first, last;     /* kernel indices that write/last read it */
    int arena;           /* 0 activations/temporaries, 1 variables (state), 2 inputs */
} mpt_buffer;

typedef struct {
    const mpt_graph *g;        /* not owned */
    mpt_kernel *kernels;       /* in execution order */
    int n_kernels;
    mpt_refusal *refusals;
    int n_refusals;
    int *kernel_of;            /* node id -> kernel index, -1 for sources/state */
    mpt_buffer *buffers;
    int n_buffers;
    /* node id -> the node whose buffer holds its bytes, for a view: a
     * row-major reshape of a materialised value has that value's bytes, so
     * no kernel writes it and its readers read the root's buffer (XLA's
     * bitcast). -1 for every other node. A view's root is never a view,
     * and kernel_of[view] is its root's writer (-1 for a source). */
    int *view_of;
    int n_views;
    int64_t peak_bytes;        /* arena 0 with reuse */
    int64_t bytes_moved;       /* sum over kernels of bytes read + written */
    /* f32 GEMMs may round their operands to TF32 (10-bit mantissas) on
     * Tensor Cores (--tf32; CUDA's cuBLASLt calls and generated kernels):
     * 0 is true fp32 */
    int tf32;
} mpt_plan;

/* Memory of one step under the plan, for `mptc check`. The caller finds the
 * largest batch that fits by fusing the step at several batch sizes. */
typedef struct {
    int64_t activations;     /* arena 0 peak: activations, gradients, temporaries */
    int64_t gradients;       /* the weight gradients' buffers among them (not added to total) */
    int64_t weights;         /* trainable variables (f32 master weights) */
    int64_t optimizer_state; /* other state: slots, iterations, loss scale, statistics */
    int64_t inputs;          /* one batch of feeds */
    int64_t total;           /* activations + weights + optimizer_state + inputs */
} mpt_memory_breakdown;

/* The node whose buffer holds node's bytes: its root when it is a view,
 * else itself. Backends bind every kernel operand through this. */
static inline int mpt_plan_storage(const mpt_plan *p, int node) {
    return p->view_of && p->view_of[node] >= 0 ? p->view_of[node] : node;
}

mpt_plan *mpt_fuse(const mpt_graph *g, const mpt_fusion_opts *opts);
void mpt_plan_free(mpt_plan *p);
void mpt_plan_memory(const mpt_plan *p, mpt_memory_breakdown *out);
/* One line per kernel (kind, name, ops with their layers); with explain,
 * every refusal with its reason. */
void mpt_plan_print(const mpt_plan *p, FILE *f, int explain);

/* Runs the plan on the reference interpreter kernel by kernel (values that
 * cross kernel boundaries are materialised at their dtype), so fused and
 * unfused plans can be compared exactly. Same contract as mpt_interp_run. */
int mpt_plan_interp_run(const mpt_plan *p, const mpt_tensor *inputs,
                        mpt_tensor *vars, mpt_tensor *outputs, char *err,
                        size_t errlen);

/* ---- facts about kernels, the same for every backend (kernel_info.c) ---- */

/* "gemm", "conv", "loop", "reduction", "opaque" */
const char *mpt_kernel_kind_name(mpt_kernel_kind k);
/* the layer a kernel belongs to: its root's, else its first tagged node's,
 * else "(step)" */
const char *mpt_kernel_layer(const mpt_graph *g, const mpt_kernel *k);
/* bytes its inputs (constants aside) and outputs hold */
int64_t mpt_kernel_bytes(const mpt_graph *g, const mpt_kernel *k);
/* flops of a GEMM or convolution kernel's core (2MNK); 0 for other kinds */
double mpt_kernel_flops(const mpt_graph *g, const mpt_kernel *k);
/* 1 when node is a convolution (forward or either gradient) with a 1x1
 * filter, stride 1 and no padding: in NHWC a plain GEMM over the pixels,
 * which a GEMM library can take */
int mpt_conv_is_gemm(const mpt_graph *g, int node);
/* 1 when update `update` (an index into g->updates) may be written over its
 * variable by the kernel computing it: no later kernel reads the variable,
 * that kernel reads it only elementwise at the variable's own shape (so each
 * element is read before the same element is written), and neither is a
 * step output or another update's value. */
int mpt_plan_update_in_place(const mpt_plan *p, int update);

/* Data parallelism's messages (fusion/buckets.c): the plan's ALLREDUCE
 * kernels grouped into buckets of up to bucket_bytes (<= 0: one each), as
 * PyTorch DDP's buckets and Horovod's tensor fusion send several gradients
 * in one message. A bucket's members are ALLREDUCE kernels in plan order;
 * it starts once its last member has run (start_after) and must be
 * complete before the first kernel that reads any member (wait_before;
 * n_kernels: the step's end), so it closes early where a member's reader
 * comes before the next ALLREDUCE. */
typedef struct {
    int *members;   /* kernel indices, ascending */
    int n_members;
    int start_after, wait_before;
    int64_t bytes;
} mpt_bucket;

typedef struct {
    mpt_bucket *b;
    int n;
} mpt_buckets;

/* 0, or -1 out of memory */
int mpt_plan_buckets(const mpt_plan *p, int64_t bucket_bytes, mpt_buckets *out);
void mpt_buckets_free(mpt_buckets *b);
/* --bucket-mb's default, PyTorch DDP's bucket_cap_mb */
#define MPT_BUCKET_BYTES_DEFAULT ((int64_t)25 << 20)

#endif
