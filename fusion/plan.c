/* fusion/plan.c — what is built on top of the kernels: their names, the
 * memory plan (buffers, liveness, reuse), the traffic count, printing and
 * the memory breakdown `mptc check` shows. */
#include <assert.h>
#include <ctype.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "fusion/fusion_impl.h"

#define NAME_MAX_CHARS 100
#define ARENA_ALIGN 64

void mpt_fusion_opts_default(mpt_fusion_opts *o) {
    o->enabled = 1;
    o->disable = 0;
    o->max_ops = 64;
}

static const struct {
    const char *word;
    unsigned bit;
} pattern_words[] = {
    {"epilogue", MPT_FUSE_EPILOGUE},   {"prologue", MPT_FUSE_PROLOGUE},
    {"loop", MPT_FUSE_LOOP},           {"reduction", MPT_FUSE_REDUCTION},
    {"multi_output", MPT_FUSE_MULTI_OUTPUT}, {"epilogue_reduce", MPT_FUSE_EPILOGUE_REDUCE},
    {"gemm_extra", MPT_FUSE_GEMM_EXTRA}, {"reduction_chain", MPT_FUSE_REDUCTION_CHAIN},
    {"attention", MPT_FUSE_ATTENTION}, {"attention_layout", MPT_FUSE_ATTENTION_LAYOUT},
};

int mpt_fusion_parse_disable(const char *s, unsigned *bits, char *err, size_t n) {
    *bits = 0;
    const char *p = s ? s : "";
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (size_t i = 0; i < sizeof pattern_words / sizeof *pattern_words; i++)
            if (strlen(pattern_words[i].word) == len && strncmp(p, pattern_words[i].word, len) == 0) {
                *bits |= pattern_words[i].bit;
                found = 1;
            }
        if (!found && len > 0) {
            snprintf(err, n,
                     "unknown fusion pattern '%.*s' (hint: use a comma-separated list of "
                     "epilogue, prologue, loop, reduction, multi_output, epilogue_reduce, "
                     "gemm_extra, reduction_chain, attention, attention_layout)",
                     (int)len, p);
            return -1;
        }
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

static int64_t node_bytes(const mpt_graph *g, int id) {
    const mpt_node *n = &g->nodes[id];
    return mpt_shape_numel(n->shape) * (int64_t)mpt_dtype_size(n->dtype);
}

/* ---- names --------------------------------------------------------------- */

static const char *kind_word(mpt_kernel_kind k) {
    switch (k) {
    case MPT_KERNEL_GEMM: return "gemm";
    case MPT_KERNEL_CONV: return "conv";
    case MPT_KERNEL_LOOP: return "loop";
    case MPT_KERNEL_REDUCTION: return "reduce";
    case MPT_KERNEL_OPAQUE: return "opaque";
    case MPT_KERNEL_COUNT: break;
    }
    return "?";
}

/* A cast whose every reader in the kernel is a GEMM/conv or an index op is
 * a prologue: part of how the operand is read, not a step of its own. */
static int is_prologue_cast(const mpt_graph *g, const mpt_kernel *K, int id) {
    if (g->nodes[id].op != MPT_OP_CAST) return 0;
    int readers = 0;
    for (int i = 0; i < K->n_nodes; i++) {
        const mpt_node *u = &g->nodes[K->nodes[i]];
        for (int k = 0; k < u->n_in; k++) {
            if (u->in[k] != id) continue;
            mpt_fusion_class c = mpt_fusion_class_of(u->op);
            if (c != MPT_FCLS_GEMM && c != MPT_FCLS_CONV && c != MPT_FCLS_INDEX) return 0;
            readers++;
        }
    }
    return readers > 0;
}

/* The word a fused op contributes to its kernel's name, or NULL for index
 * plumbing (broadcast, reshape) and prologue casts. */
static const char *op_word(const mpt_graph *g, const mpt_kernel *K, int id, char *buf, size_t n) {
    const mpt_node *nd = &g->nodes[id];
    if (nd->op == MPT_OP_BROADCAST || nd->op == MPT_OP_RESHAPE) return NULL;
    if (is_prologue_cast(g, K, id)) return NULL;
    if (nd->op == MPT_OP_CAST) {
        snprintf(buf, n, "cast_%s", mpt_dtype_name(nd->dtype));
        return buf;
    }
    if (nd->op == MPT_OP_ADD)
        for (int k = 0; k < 2; k++) {
            const mpt_node *b = &g->nodes[nd->in[k]];
            if (b->op == MPT_OP_BROADCAST && g->nodes[b->in[0]].shape.rank == 1) return "bias";
        }
    return mpt_op_name(nd->op);
}

static void append_word(char *dst, size_t cap, const char *w) {
    size_t len = strlen(dst);
    for (; *w && len + 1 < cap; w++) dst[len++] = isalnum((unsigned char)*w) ? *w : '_';
    dst[len] = 0;
}

static char *kernel_name(const mpt_graph *g, const mpt_kernel *K) {
    char name[NAME_MAX_CHARS + 64] = "", word[32];
    const char *layer = NULL;
    if (K->root >= 0) layer = g->nodes[K->root].layer;
    /* a loop is named after the layer most of its ops came from */
    for (int i = 0, best = 0; i < K->n_nodes && !(K->root >= 0); i++) {
        const char *l = g->nodes[K->nodes[i]].layer;
        int count = 0;
        for (int j = 0; l && j < K->n_nodes; j++) {
            const char *m = g->nodes[K->nodes[j]].layer;
            count += m && strcmp(m, l) == 0;
        }
        if (count > best) best = count, layer = l;
    }
    append_word(name, sizeof name,
                K->kind == MPT_KERNEL_OPAQUE ? mpt_op_name(g->nodes[K->root].op) : kind_word(K->kind));
    if (layer) {
        append_word(name, sizeof name, "_");
        append_word(name, sizeof name, layer);
    }
    int words = 0, left = 0;
    for (int i = 0; i < K->n_nodes; i++) {
        if (K->nodes[i] == K->root) continue;
        const char *w = op_word(g, K, K->nodes[i], word, sizeof word);
        if (!w) continue;
        if (strlen(name) + strlen(w) + 2 > NAME_MAX_CHARS) {
            left++;
            continue;
        }
        append_word(name, sizeof name, words++ ? "_" : "__");
        append_word(name, sizeof name, w);
    }
    if (left) {
        snprintf(word, sizeof word, "_and_%d_more", left);
        append_word(name, sizeof name, word);
    }
    return strdup(name);
}

/* A set of strings with a counter each (open addressing), so naming stays
 * linear in the number of kernels: ResNet-50 unfused has thousands. */
typedef struct {
    char **key;
    int *next; /* for a base name: the next suffix worth trying */
    size_t cap;
} name_set;

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The slot of s: where it is, or the empty slot where it would go. */
static size_t name_slot(const name_set *t, const char *s) {
    size_t i = (size_t)name_hash(s) & (t->cap - 1);
    while (t->key[i] && strcmp(t->key[i], s) != 0) i = (i + 1) & (t->cap - 1);
    return i;
}

static void name_kernels(mpt_plan *p) {
    name_set t = {0};
    t.cap = 16;
    while (t.cap < (size_t)p->n_kernels * 4 + 16) t.cap *= 2; /* at most 2 keys per kernel */
    t.key = calloc(t.cap, sizeof *t.key);
    t.next = calloc(t.cap, sizeof *t.next);
    assert(t.key && t.next);
    for (int k = 0; k < p->n_kernels; k++) {
        char *base = kernel_name(p->g, &p->kernels[k]);
        size_t bs = name_slot(&t, base);
        char *name = strdup(base);
        if (t.key[bs]) { /* taken: the smallest free suffix from the base's counter on */
            int suffix = t.next[bs] > 2 ? t.next[bs] : 2;
            size_t len = strlen(base) + 16;
            for (;; suffix++) {
                name = realloc(name, len);
                assert(name);
                snprintf(name, len, "%s_%d", base, suffix);
                if (!t.key[name_slot(&t, name)]) break;
            }
            t.next[bs] = suffix + 1;
        }
        size_t ns = name_slot(&t, name);
        t.key[ns] = name;
        if (!t.next[ns]) t.next[ns] = 2;
        free(base);
        p->kernels[k].name = name;
    }
    free(t.key); /* the names themselves belong to the kernels */
    free(t.next);
}

/* ---- memory plan --------------------------------------------------------- */

static int64_t align_up(int64_t x) { return (x + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

static int buffer_order(const void *a, const void *b) {
    const mpt_buffer *x = a, *y = b;
    if (x->arena != y->arena) return x->arena - y->arena;
    if (x->first != y->first) return x->first - y->first;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return x->node - y->node;
}

static int longest_first(const void *a, const void *b) {
    const mpt_buffer *x = a, *y = b;
    if (x->arena != y->arena) return x->arena - y->arena;
    int lx = x->last - x->first, ly = y->last - y->first;
    if (lx != ly) return ly - lx;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    if (x->first != y->first) return x->first - y->first;
    return x->node - y->node;
}

/* Greedy first fit by liveness: each buffer, in the array's order, takes
 * the lowest offset that overlaps no buffer alive at the same time. */
static int64_t place_arena0(mpt_buffer *b, int n) {
    int64_t peak = 0;
    int *live = malloc(((size_t)n + 1) * sizeof *live);
    assert(live);
    for (int i = 0; i < n; i++) {
        if (b[i].arena != 0) continue;
        int nl = 0;
        for (int j = 0; j < i; j++)
            if (b[j].arena == 0 && b[j].first <= b[i].last && b[i].first <= b[j].last) live[nl++] = j;
        int64_t off = 0;
        for (int moved = 1; moved;) {
            moved = 0;
            for (int k = 0; k < nl; k++) {
                const mpt_buffer *o = &b[live[k]];
                if (off < o->offset + o->bytes && o->offset < off + b[i].bytes) {
                    off = align_up(o->offset + o->bytes);
                    moved = 1;
                }
            }
        }
        b[i].offset = off;
        if (off + b[i].bytes > peak) peak = off + b[i].bytes;
    }
    free(live);
    return peak;
}

static int kernel_has(const mpt_kernel *K, int id) {
    for (int i = 0; i < K->n_nodes; i++)
        if (K->nodes[i] == id) return 1;
    return 0;
}

/* Traffic of a GEMM/conv's prologue casts: the backends convert such an
 * operand once into scratch (written, then read by the GEMM), since a GEMM
 * reads its operands many times over; cuBLASLt cannot read through a cast
 * at all. Counting it keeps bytes_moved honest about what fusing a cast
 * into two GEMMs costs against materialising it once. */
static int64_t prologue_bytes(const mpt_graph *g, const mpt_kernel *K) {
    if (K->kind != MPT_KERNEL_GEMM && K->kind != MPT_KERNEL_CONV) return 0;
    const mpt_node *r = &g->nodes[K->root];
    int64_t b = 0;
    for (int k = 0; k < r->n_in; k++) {
        int q = r->in[k], dup = 0;
        for (int j = 0; j < k; j++) dup |= r->in[j] == q;
        if (!dup && kernel_has(K, q)) b += 2 * node_bytes(g, q);
    }
    return b;
}

static void plan_memory(mpt_plan *p) {
    const mpt_graph *g = p->g;
    int n = g->n_nodes;
    int *first = malloc(((size_t)n + 1) * sizeof *first);
    int *last = malloc(((size_t)n + 1) * sizeof *last);
    char *ext = calloc((size_t)n + 1, 1);
    assert(first && last && ext);
    for (int i = 0; i < n; i++) first[i] = last[i] = -1;
    for (int i = 0; i < g->n_outputs; i++) ext[g->outputs[i].node] = 1;
    for (int i = 0; i < g->n_updates; i++) ext[g->updates[i].value] = 1;
    int cap = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        cap += K->n_outputs;
        for (int i = 0; i < K->n_outputs; i++) first[K->outputs[i]] = last[K->outputs[i]] = k;
        for (int i = 0; i < K->n_inputs; i++) {
            int q = mpt_plan_storage(p, K->inputs[i]); /* a view keeps its root alive */
            if (first[q] < 0) first[q] = k;
            last[q] = k;
        }
    }
    for (int i = 0; i < n; i++) cap += g->nodes[i].op == MPT_OP_VARIABLE || g->nodes[i].op == MPT_OP_INPUT;
    p->buffers = calloc((size_t)cap + 1, sizeof *p->buffers);
    assert(p->buffers);
    int nb = 0;
    int end = p->n_kernels ? p->n_kernels - 1 : 0;
    for (int k = 0; k < p->n_kernels; k++)
        for (int i = 0; i < p->kernels[k].n_outputs; i++) {
            int o = p->kernels[k].outputs[i];
            p->buffers[nb++] = (mpt_buffer){.node = o, .bytes = node_bytes(g, o), .first = k,
                                            .last = ext[o] ? end : last[o], .arena = 0};
        }
    /* state and feeds live across steps: their arenas never reuse space */
    int64_t off[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        int arena = g->nodes[i].op == MPT_OP_VARIABLE ? 1 : g->nodes[i].op == MPT_OP_INPUT ? 2 : -1;
        if (arena < 0) continue;
        int64_t bytes = node_bytes(g, i);
        p->buffers[nb++] = (mpt_buffer){.node = i, .offset = off[arena], .bytes = bytes,
                                        .first = first[i] < 0 ? 0 : first[i], .last = end,
                                        .arena = arena};
        off[arena] = align_up(off[arena] + bytes);
    }
    p->n_buffers = nb;
    /* first fit in order of first use, and again with the longest-lived
     * buffers placed first (then the largest): the saved activations of a
     * training step live from their forward kernel to their backward one,
     * and placed among short-lived ones they can leave holes that nothing
     * later fits (ResNet-50 float32 batch 8: 793 MiB in order of first
     * use, for 655 MiB live at once). The smaller arena wins; the buffers
     * stay sorted by first use. */
    qsort(p->buffers, (size_t)nb, sizeof *p->buffers, buffer_order);
    int64_t peak = place_arena0(p->buffers, nb);
    mpt_buffer *alt = malloc(((size_t)nb + 1) * sizeof *alt);
    assert(alt);
    memcpy(alt, p->buffers, (size_t)nb * sizeof *alt);
    qsort(alt, (size_t)nb, sizeof *alt, longest_first);
    int64_t alt_peak = place_arena0(alt, nb);
    if (alt_peak < peak) {
        qsort(alt, (size_t)nb, sizeof *alt, buffer_order);
        memcpy(p->buffers, alt, (size_t)nb * sizeof *alt);
        peak = alt_peak;
    }
    free(alt);
    p->peak_bytes = peak;

    p->bytes_moved = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        for (int i = 0; i < K->n_inputs; i++)
            if (g->nodes[K->inputs[i]].op != MPT_OP_CONST) p->bytes_moved += node_bytes(g, K->inputs[i]);
        for (int i = 0; i < K->n_outputs; i++) p->bytes_moved += node_bytes(g, K->outputs[i]);
        p->bytes_moved += prologue_bytes(g, K);
    }
    free(ext);
    free(last);
    free(first);
}

void mpt_plan_finish(mpt_plan *p) {
    name_kernels(p);
    plan_memory(p);
}

/* Marks each trainable variable's raw gradient: walking back from its
 * update value through values of the variable's size, the first GEMM, conv,
 * reduction or scatter met. */
static void mark_gradients(const mpt_graph *g, char *mark) {
    for (int u = 0; u < g->n_updates; u++) {
        const mpt_node *v = &g->nodes[g->updates[u].var];
        if (!v->attr.i[3]) continue; /* only trainable variables have gradients */
        int64_t want = mpt_shape_numel(v->shape);
        char *reach = calloc((size_t)g->n_nodes + 1, 1);
        assert(reach);
        reach[g->updates[u].value] = 1;
        for (int i = g->updates[u].value; i >= 0; i--) {
            if (!reach[i] || mpt_shape_numel(g->nodes[i].shape) != want) continue;
            mpt_fusion_class c = mpt_fusion_class_of(g->nodes[i].op);
            if (c == MPT_FCLS_GEMM || c == MPT_FCLS_CONV || c == MPT_FCLS_REDUCE ||
                g->nodes[i].op == MPT_OP_SCATTER_ADD) {
                mark[i] = 1;
                continue;
            }
            for (int k = 0; k < g->nodes[i].n_in; k++) reach[g->nodes[i].in[k]] = 1;
        }
        free(reach);
    }
}

void mpt_plan_memory(const mpt_plan *p, mpt_memory_breakdown *out) {
    const mpt_graph *g = p->g;
    memset(out, 0, sizeof *out);
    out->activations = p->peak_bytes;
    char *mark = calloc((size_t)g->n_nodes + 1, 1);
    assert(mark);
    mark_gradients(g, mark);
    for (int i = 0; i < p->n_buffers; i++) {
        const mpt_buffer *b = &p->buffers[i];
        const mpt_node *nd = &g->nodes[b->node];
        if (b->arena == 0 && mark[b->node]) out->gradients += b->bytes;
        if (b->arena == 1) {
            if (nd->attr.i[3]) out->weights += b->bytes;
            else out->optimizer_state += b->bytes;
        }
        if (b->arena == 2) out->inputs += b->bytes;
    }
    free(mark);
    out->total = out->activations + out->weights + out->optimizer_state + out->inputs;
}

/* ---- printing ------------------------------------------------------------- */

static void print_bytes(FILE *f, int64_t b) {
    if (b >= 1 << 20) fprintf(f, "%.2f MiB", (double)b / (1 << 20));
    else if (b >= 1 << 10) fprintf(f, "%.1f KiB", (double)b / (1 << 10));
    else fprintf(f, "%lld B", (long long)b);
}

static void print_node_ref(FILE *f, const mpt_graph *g, int id) {
    const mpt_node *nd = &g->nodes[id];
    char sh[96];
    fprintf(f, "%%%d %s %s%s", id, mpt_op_name(nd->op), mpt_dtype_name(nd->dtype),
            mpt_shape_str(nd->shape, sh, sizeof sh));
    if (nd->name) fprintf(f, " \"%s\"", nd->name);
    if (nd->layer) fprintf(f, " @%s", nd->layer);
}

/* One line: kernels by kind, then refusals by reason, most frequent first
 * (reasons are static strings, so equal reasons are equal pointers or
 * equal text). */
static void print_summary(const mpt_plan *p, FILE *f) {
    int by_kind[MPT_KERNEL_COUNT] = {0};
    for (int k = 0; k < p->n_kernels; k++) by_kind[p->kernels[k].kind]++;
    fprintf(f, "summary: kernels");
    for (int k = 0; k < MPT_KERNEL_COUNT; k++)
        fprintf(f, "%s %d %s", k ? "," : "", by_kind[k], kind_word((mpt_kernel_kind)k));
    const char **reason = malloc(((size_t)p->n_refusals + 1) * sizeof *reason);
    int *count = calloc((size_t)p->n_refusals + 1, sizeof *count), n = 0;
    assert(reason && count);
    for (int i = 0; i < p->n_refusals; i++) {
        int j = 0;
        while (j < n && strcmp(reason[j], p->refusals[i].reason) != 0) j++;
        if (j == n) reason[n++] = p->refusals[i].reason;
        count[j]++;
    }
    fprintf(f, "; refusals");
    for (int done = 0; done < n; done++) {
        int best = -1;
        for (int j = 0; j < n; j++)
            if (count[j] > 0 && (best < 0 || count[j] > count[best])) best = j;
        fprintf(f, "%s %d \"%s\"", done ? "," : "", count[best], reason[best]);
        count[best] = -count[best];
    }
    if (!n) fprintf(f, " none");
    fputc('\n', f);
    free(count);
    free(reason);
}

void mpt_plan_print(const mpt_plan *p, FILE *f, int explain) {
    const mpt_graph *g = p->g;
    fprintf(f, "kernel plan of %s: %d kernels, %d refusals, activation peak ", g->name,
            p->n_kernels, p->n_refusals);
    print_bytes(f, p->peak_bytes);
    fprintf(f, ", bytes moved ");
    print_bytes(f, p->bytes_moved);
    fputc('\n', f);
    if (explain) print_summary(p, f);
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        fprintf(f, "k%-4d %-9s %s:", k, kind_word(K->kind), K->name);
        for (int i = 0; i < K->n_nodes; i++) {
            const mpt_node *nd = &g->nodes[K->nodes[i]];
            fprintf(f, " %s", mpt_op_name(nd->op));
            if (nd->layer) fprintf(f, "@%s", nd->layer);
        }
        fputc('\n', f);
        if (!explain) continue;
        for (int i = 0; i < K->n_nodes; i++) {
            int id = K->nodes[i], out = 0;
            for (int j = 0; j < K->n_outputs; j++) out |= K->outputs[j] == id;
            fprintf(f, "        ");
            print_node_ref(f, g, id);
            if (id == K->root) fprintf(f, "  [root]");
            if (p->kernel_of[id] != k) fprintf(f, "  [recomputed]");
            if (out) fprintf(f, "  [output]");
            fputc('\n', f);
        }
        fprintf(f, "        reads:");
        for (int i = 0; i < K->n_inputs; i++) {
            fprintf(f, " %%%d", K->inputs[i]);
            if (mpt_plan_storage(p, K->inputs[i]) != K->inputs[i])
                fprintf(f, "(view of %%%d)", mpt_plan_storage(p, K->inputs[i]));
        }
        fputc('\n', f);
    }
    if (!explain) return;
    fprintf(f, "refusals (%d):\n", p->n_refusals);
    for (int i = 0; i < p->n_refusals; i++) {
        const mpt_refusal *r = &p->refusals[i];
        fprintf(f, "  ");
        print_node_ref(f, g, r->producer);
        fprintf(f, "  ->  ");
        print_node_ref(f, g, r->consumer);
        fprintf(f, ": %s\n", r->reason);
    }
    fprintf(f, "views (%d): reshapes read in their root's buffer, never copied\n", p->n_views);
    for (int i = 0; i < g->n_nodes; i++) {
        if (mpt_plan_storage(p, i) == i) continue;
        fprintf(f, "  ");
        print_node_ref(f, g, i);
        fprintf(f, "  =  buffer of ");
        print_node_ref(f, g, p->view_of[i]);
        fputc('\n', f);
    }
    fprintf(f, "buffers (%d): arena 0 peak ", p->n_buffers);
    print_bytes(f, p->peak_bytes);
    fputc('\n', f);
    for (int i = 0; i < p->n_buffers; i++) {
        const mpt_buffer *b = &p->buffers[i];
        fprintf(f, "  arena %d +%-10lld %10lld B  k%d..k%d  ", b->arena, (long long)b->offset,
                (long long)b->bytes, b->first, b->last);
        print_node_ref(f, g, b->node);
        fputc('\n', f);
    }
}

void mpt_plan_free(mpt_plan *p) {
    if (!p) return;
    for (int k = 0; k < p->n_kernels; k++) {
        free(p->kernels[k].name);
        free(p->kernels[k].nodes);
        free(p->kernels[k].inputs);
        free(p->kernels[k].outputs);
    }
    free(p->kernels);
    free(p->refusals);
    free(p->kernel_of);
    free(p->view_of);
    free(p->buffers);
    free(p);
}
