/*
 * graphmem.c — stream capture and the memory of CUDA graphs.
 *
 * Capture: the process counts the captures it has begun and not ended, so a launch or allocation
 * asks the driver whether its stream is capturing only while one is (the common path makes no
 * call), and the slot's NN_PROC_F_CAPTURING tells the agent.
 *
 * Graph memory: cuMemAllocAsync / cuMemFreeAsync on a capturing stream
 * allocate nothing when called: they become memory nodes of the graph. They are recorded per
 * capture (memory.c hands them here), follow the capture into its graph (cuStreamEndCapture,
 * launch.c) and into every executable instantiated from it, and are charged when an executable is
 * launched (launch.c): a launch that does not fit is refused, as is one with an allocation on a
 * device the container was not given. Memory nodes added explicitly (graphnodes.c) are recorded
 * per graph the same way. An allocation freed inside the same graph is charged only until that
 * launch ends; a free of memory allocated outside the graph gives it back at launch.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_captures; /* captures begun and not ended in this process */

/* ---- capture ---------------------------------------------------------------------------------------- */

int nn_capturing(CUstream stream, int ptds) {
    if (__atomic_load_n(&g_captures, __ATOMIC_ACQUIRE) <= 0) return 0; /* the common case: no call */
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    __typeof__(nn_real.cuStreamIsCapturing) fn = ptds ? nn_real.cuStreamIsCapturing_ptsz : nn_real.cuStreamIsCapturing;
    if (fn == NULL || fn(stream, &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

uint64_t nn_capture_id(CUstream stream, int ptds) {
    __typeof__(nn_real.cuStreamGetCaptureInfo_v3) fn =
        ptds ? nn_real.cuStreamGetCaptureInfo_v3_ptsz : nn_real.cuStreamGetCaptureInfo_v3;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (fn == NULL || fn(stream, &status, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS) return 0;
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (uint64_t)id : 0;
}

static void capture_flag(int delta) {
    int now = __atomic_add_fetch(&g_captures, delta, __ATOMIC_ACQ_REL);
    if (now < 0) __atomic_store_n(&g_captures, 0, __ATOMIC_RELEASE);
    if (nn_g.region != NULL && nn_g.slot >= 0) {
        nn_proc_slot *s = &nn_g.region->state->procs[nn_g.slot];
        if (now > 0) __atomic_fetch_or(&s->flags, NN_PROC_F_CAPTURING, __ATOMIC_RELEASE);
        else __atomic_fetch_and(&s->flags, ~NN_PROC_F_CAPTURING, __ATOMIC_RELEASE);
    }
}

#define NN_BEGIN_CAPTURE_HOOK(name, params, args)                  \
    NN_EXPORT CUresult name params {                               \
        CUresult rc = nn_ready();                                  \
        if (rc != CUDA_SUCCESS) return rc;                         \
        if (nn_real.name == NULL) return CUDA_ERROR_NOT_FOUND;     \
        rc = nn_real.name args;                                    \
        if (rc == CUDA_SUCCESS) capture_flag(+1);                  \
        return rc;                                                 \
    }

NN_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture, (CUstream s), (s))
NN_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture_ptsz, (CUstream s), (s))
NN_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode m), (s, m))
NN_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode m), (s, m))
NN_BEGIN_CAPTURE_HOOK(cuStreamBeginCaptureToGraph,
                      (CUstream s, CUgraph g, const CUgraphNode *d, const CUgraphEdgeData *e, size_t n,
                       CUstreamCaptureMode m),
                      (s, g, d, e, n, m))
NN_BEGIN_CAPTURE_HOOK(cuStreamBeginCaptureToGraph_ptsz,
                      (CUstream s, CUgraph g, const CUgraphNode *d, const CUgraphEdgeData *e, size_t n,
                       CUstreamCaptureMode m),
                      (s, g, d, e, n, m))

static CUresult end_capture(CUstream s, CUgraph *graph, int ptds, __typeof__(nn_real.cuStreamEndCapture) call) {
    CUresult rc = nn_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (call == NULL) return CUDA_ERROR_NOT_FOUND;
    uint64_t id = nn_capture_id(s, ptds);
    rc = call(s, graph);
    if (id != 0) capture_flag(-1); /* the capture is over, successfully or not */
    if (rc == CUDA_SUCCESS && id != 0 && graph != NULL) nn_capture_to_graph(id, *graph);
    return rc;
}

NN_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(s, g, 0, nn_real.cuStreamEndCapture); }
NN_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    return end_capture(s, g, 1, nn_real.cuStreamEndCapture_ptsz);
}


typedef struct nn_mem_node {
    uint64_t ptr, size;
    int dev;
    int is_free; /* a captured free of `ptr` */
} nn_mem_node;

/* Memory nodes of one capture, graph or executable graph. */
typedef struct nn_mem_graph {
    struct nn_mem_graph *next;
    int stage;    /* NN_STAGE_* */
    uint64_t key; /* capture id, CUgraph or CUgraphExec */
    nn_mem_node *nodes;
    size_t count, cap;
} nn_mem_graph;

enum { NN_STAGE_CAPTURE, NN_STAGE_GRAPH, NN_STAGE_EXEC };
static nn_mem_graph *g_graphs; /* under g_lock */

static nn_mem_graph *graph_find(int stage, uint64_t key) {
    for (nn_mem_graph *g = g_graphs; g != NULL; g = g->next)
        if (g->stage == stage && g->key == key) return g;
    return NULL;
}

static nn_mem_graph *graph_get(int stage, uint64_t key) {
    nn_mem_graph *g = graph_find(stage, key);
    if (g != NULL) return g;
    g = calloc(1, sizeof *g);
    if (g == NULL) return NULL;
    g->stage = stage;
    g->key = key;
    g->next = g_graphs;
    g_graphs = g;
    return g;
}

static void graph_drop(int stage, uint64_t key) {
    for (nn_mem_graph **p = &g_graphs; *p != NULL; p = &(*p)->next) {
        if ((*p)->stage == stage && (*p)->key == key) {
            nn_mem_graph *g = *p;
            *p = g->next;
            free(g->nodes);
            free(g);
            return;
        }
    }
}

static void graph_add(nn_mem_graph *g, nn_mem_node n) {
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 8;
        nn_mem_node *nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (nodes == NULL) return; /* host OOM: the node goes uncharged; the agent's NVML check remains */
        g->nodes = nodes;
        g->cap = cap;
    }
    g->nodes[g->count++] = n;
}

void nn_capture_record(CUstream stream, int ptds, uint64_t ptr, uint64_t size, int dev, int is_free) {
    nn_mem_node node = {ptr, size, dev, is_free};
    uint64_t id = nn_capture_id(stream, ptds);
    if (id == 0) return;
    pthread_mutex_lock(&g_lock);
    nn_mem_graph *g = graph_get(NN_STAGE_CAPTURE, id);
    if (g != NULL) graph_add(g, node);
    pthread_mutex_unlock(&g_lock);
}

enum { NN_PASS_MOVE, NN_PASS_COPY };

/* Move (or copy) the nodes of one stage's key to another's: they replace what the destination had
 * (a new executable or clone) or are added to it (a capture into an existing graph, a child graph
 * moved into its parent). */
static void graph_pass(int from, uint64_t from_key, int to, uint64_t to_key, int how, int replace) {
    pthread_mutex_lock(&g_lock);
    nn_mem_graph *src = graph_find(from, from_key);
    if (replace) graph_drop(to, to_key);
    if (src != NULL) {
        nn_mem_graph *dst = graph_get(to, to_key);
        for (size_t i = 0; dst != NULL && i < src->count; i++) graph_add(dst, src->nodes[i]);
        if (how == NN_PASS_MOVE) graph_drop(from, from_key);
    }
    pthread_mutex_unlock(&g_lock);
}

/* ---- graphs: memory nodes follow the capture into the graph and its executables ---------------------------- */

/* An executable graph gets a copy of its graph's memory nodes. */
#define NN_INSTANTIATE_HOOK(name, extra_type)                                                            \
    NN_EXPORT CUresult name(CUgraphExec *exec, CUgraph graph, extra_type extra) {                         \
        NN_REQUIRE(nn_real.name);                                                                        \
        CUresult rc = nn_real.name(exec, graph, extra);                                                  \
        if (rc == CUDA_SUCCESS)                                                                          \
            graph_pass(NN_STAGE_GRAPH, (uint64_t)graph, NN_STAGE_EXEC, (uint64_t)*exec, NN_PASS_COPY, 1); \
        return rc;                                                                                       \
    }

NN_INSTANTIATE_HOOK(cuGraphInstantiateWithFlags, unsigned long long)

/* The legacy form (error node and log buffer), still exported and handed out by cuGetProcAddress
 * for "cuGraphInstantiate" at the versions before 12.0: the same memory-node hand-over. */
#define NN_INSTANTIATE_LEGACY_HOOK(name)                                                                  \
    NN_EXPORT CUresult name(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t log_size) { \
        NN_REQUIRE(nn_real.name);                                                                        \
        CUresult rc = nn_real.name(exec, graph, error_node, log, log_size);                              \
        if (rc == CUDA_SUCCESS) graph_pass(NN_STAGE_GRAPH, (uint64_t)graph, NN_STAGE_EXEC, (uint64_t)*exec, NN_PASS_COPY, 1); \
        return rc;                                                                                       \
    }

NN_INSTANTIATE_LEGACY_HOOK(cuGraphInstantiate)
NN_INSTANTIATE_LEGACY_HOOK(cuGraphInstantiate_v2)
NN_INSTANTIATE_HOOK(cuGraphInstantiateWithParams, CUDA_GRAPH_INSTANTIATE_PARAMS *)
NN_INSTANTIATE_HOOK(cuGraphInstantiateWithParams_ptsz, CUDA_GRAPH_INSTANTIATE_PARAMS *)

/* Destroying a graph or an executable forgets its memory nodes (a handle may be reused). */
static CUresult destroyed(CUresult rc, int stage, uint64_t key) {
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_lock);
        graph_drop(stage, key);
        pthread_mutex_unlock(&g_lock);
    }
    return rc;
}

NN_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
    NN_REQUIRE(nn_real.cuGraphExecDestroy);
    return destroyed(nn_real.cuGraphExecDestroy(exec), NN_STAGE_EXEC, (uint64_t)exec);
}

NN_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
    NN_REQUIRE(nn_real.cuGraphDestroy);
    return destroyed(nn_real.cuGraphDestroy(graph), NN_STAGE_GRAPH, (uint64_t)graph);
}

/* The capture on `stream` became `graph` (launch.c calls this from the cuStreamEndCapture hooks). */
void nn_capture_to_graph(uint64_t capture_id, CUgraph graph) {
    graph_pass(NN_STAGE_CAPTURE, capture_id, NN_STAGE_GRAPH, (uint64_t)graph, NN_PASS_MOVE, 0);
}

void nn_graph_record(CUgraph graph, uint64_t ptr, uint64_t size, int dev, int is_free) {
    pthread_mutex_lock(&g_lock);
    nn_mem_graph *g = graph_get(NN_STAGE_GRAPH, (uint64_t)graph);
    if (g != NULL) graph_add(g, (nn_mem_node){ptr, size, dev, is_free});
    pthread_mutex_unlock(&g_lock);
}

void nn_graph_copy(CUgraph from, CUgraph to) {
    graph_pass(NN_STAGE_GRAPH, (uint64_t)from, NN_STAGE_GRAPH, (uint64_t)to, NN_PASS_COPY, 1);
}

void nn_graph_move(CUgraph child, CUgraph parent) {
    graph_pass(NN_STAGE_GRAPH, (uint64_t)child, NN_STAGE_GRAPH, (uint64_t)parent, NN_PASS_MOVE, 0);
}

static int freed_inside(const nn_mem_graph *g, uint64_t ptr) {
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i].is_free && g->nodes[i].ptr == ptr) return 1;
    return 0;
}

CUresult nn_graph_charge(CUgraphExec exec, uint64_t transient[NN_MAX_DEVICES], uint64_t **charged, size_t *count) {
    *charged = NULL;
    *count = 0;
    uint64_t sums[NN_MAX_DEVICES] = {0};
    nn_mem_node *keep = NULL;
    size_t kept = 0;
    pthread_mutex_lock(&g_lock);
    nn_mem_graph *g = graph_find(NN_STAGE_EXEC, (uint64_t)exec);
    if (g != NULL && g->count > 0) keep = calloc(g->count, sizeof *keep);
    for (size_t i = 0; keep != NULL && i < g->count; i++) {
        nn_mem_node n = g->nodes[i];
        if (n.is_free) continue;
        if (n.dev < 0 || n.dev >= (int)NN_MAX_DEVICES) { /* a device the container was not given */
            pthread_mutex_unlock(&g_lock);
            free(keep);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (nn_tracked(n.ptr)) continue; /* still allocated from a previous launch */
        sums[n.dev] += n.size;
        if (freed_inside(g, n.ptr)) transient[n.dev] += n.size;
        else keep[kept++] = n;
    }
    pthread_mutex_unlock(&g_lock);
    if (g != NULL && g->count > 0 && keep == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int d = 0; d < (int)NN_MAX_DEVICES; d++) {
        if (sums[d] == 0) continue;
        if (nn_charge(d, sums[d]) != CUDA_SUCCESS) {
            for (int u = 0; u < d; u++) nn_uncharge(u, sums[u]);
            memset(transient, 0, NN_MAX_DEVICES * sizeof transient[0]);
            free(keep);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    uint64_t *keys = kept > 0 ? calloc(kept, sizeof *keys) : NULL;
    for (size_t i = 0; i < kept; i++) {
        nn_track(keep[i].ptr, keep[i].size, keep[i].dev, NN_KIND_ALLOC);
        if (keys != NULL) keys[i] = keep[i].ptr;
    }
    free(keep);
    *charged = keys;
    *count = keys != NULL ? kept : 0;
    return CUDA_SUCCESS;
}

void nn_graph_unwind(const uint64_t *charged, size_t count) {
    for (size_t i = 0; i < count; i++) nn_untrack_and_uncharge(charged[i]);
}

/* After a graph launch: frees captured for memory allocated outside the graph happened now. */
void nn_graph_settle(CUgraphExec exec) {
    uint64_t ptrs[64];
    size_t n = 0;
    pthread_mutex_lock(&g_lock);
    nn_mem_graph *g = graph_find(NN_STAGE_EXEC, (uint64_t)exec);
    for (size_t i = 0; g != NULL && i < g->count && n < 64; i++) {
        nn_mem_node *node = &g->nodes[i];
        int allocated_inside = 0;
        for (size_t j = 0; j < g->count && node->is_free; j++)
            allocated_inside |= !g->nodes[j].is_free && g->nodes[j].ptr == node->ptr;
        if (node->is_free && !allocated_inside) ptrs[n++] = node->ptr;
    }
    pthread_mutex_unlock(&g_lock);
    for (size_t i = 0; i < n; i++) nn_untrack_and_uncharge(ptrs[i]);
}

void nn_release_transient(const uint64_t transient[NN_MAX_DEVICES]) {
    for (int d = 0; d < (int)NN_MAX_DEVICES; d++)
        if (transient[d] != 0) nn_uncharge(d, transient[d]);
}

void nn_graphmem_after_fork(void) {
    g_captures = 0;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&g_lock, &fresh, sizeof fresh);
    while (g_graphs != NULL) {
        nn_mem_graph *g = g_graphs;
        g_graphs = g->next;
        free(g->nodes);
        free(g);
    }
}
