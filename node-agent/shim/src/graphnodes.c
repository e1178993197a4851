/*
 * graphnodes.c — graph memory nodes added explicitly rather than by stream capture:
 * cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, and cuGraphAddNode (all three versions) with a
 * CU_GRAPH_NODE_TYPE_MEM_ALLOC / MEM_FREE node. The driver allocates nothing when the node is
 * added (it returns the address in dptr); it allocates when an executable graph is launched. So
 * the nodes go into the same per-graph records as captured ones (graphmem.c) and follow the graph
 * into its executables, which are charged at launch (launch.c): a launch that does not fit is
 * refused with CUDA_ERROR_OUT_OF_MEMORY and runs nothing.
 *
 * A child graph node that takes its graph over (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, the only way
 * a graph with memory nodes can become a child) brings the child's memory nodes into the parent,
 * which allocates them when launched. cuGraphClone copies the records to the clone (the driver
 * refuses to clone a graph that has memory nodes today, CUDA_ERROR_NOT_SUPPORTED, so this is for a
 * driver that will not).
 */
#define _GNU_SOURCE
#include "shim.h"

/* An allocation node on `props->location`: recorded for its region entry (-1, a device the
 * container was not given, is refused at launch); memory on the host is not the GPU's. */
static void record_alloc(CUgraph graph, const CUmemPoolProps *props, size_t size, CUdeviceptr dptr) {
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return;
    nn_graph_record(graph, (uint64_t)dptr, size, nn_device_entry_of(props->location.id), 0);
}

NN_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    NN_REQUIRE(nn_real.cuGraphAddMemAllocNode);
    CUresult rc = nn_real.cuGraphAddMemAllocNode(node, graph, deps, ndeps, params);
    if (rc == CUDA_SUCCESS && params != NULL) record_alloc(graph, &params->poolProps, params->bytesize, params->dptr);
    return rc;
}

NN_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                         CUdeviceptr dptr) {
    NN_REQUIRE(nn_real.cuGraphAddMemFreeNode);
    CUresult rc = nn_real.cuGraphAddMemFreeNode(node, graph, deps, ndeps, dptr);
    if (rc == CUDA_SUCCESS) nn_graph_record(graph, (uint64_t)dptr, 0, -1, 1);
    return rc;
}

/* cuGraphAddNode* returned `rc` for `params`; `child` is the child graph it was given to take
 * over (read before the call: the driver may write the node's own handle back). */
static CUresult added(CUresult rc, CUgraph graph, const CUgraphNodeParams *params, CUgraph child) {
    if (rc != CUDA_SUCCESS || params == NULL) return rc;
    switch (params->type) {
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
        record_alloc(graph, &params->alloc.poolProps, params->alloc.bytesize, params->alloc.dptr);
        break;
    case CU_GRAPH_NODE_TYPE_MEM_FREE: nn_graph_record(graph, (uint64_t)params->free.dptr, 0, -1, 1); break;
    case CU_GRAPH_NODE_TYPE_GRAPH:
        if (child != NULL) nn_graph_move(child, graph);
        break;
    default: break;
    }
    return rc;
}

static CUgraph child_of(const CUgraphNodeParams *params) {
    if (params == NULL || params->type != CU_GRAPH_NODE_TYPE_GRAPH) return NULL;
    return params->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE ? params->graph.graph : NULL;
}

/* CUDA 12.2: no edge data. */
NN_EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                  CUgraphNodeParams *params) {
    NN_REQUIRE(nn_real.cuGraphAddNode);
    CUgraph child = child_of(params);
    return added(nn_real.cuGraphAddNode(node, graph, deps, ndeps, params), graph, params, child);
}

#define NN_ADD_NODE_HOOK(name)                                                                                  \
    NN_EXPORT CUresult name(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const CUgraphEdgeData *edges, \
                            size_t ndeps, CUgraphNodeParams *params) {                                        \
        NN_REQUIRE(nn_real.name);                                                                             \
        CUgraph child = child_of(params);                                                                     \
        return added(nn_real.name(node, graph, deps, edges, ndeps, params), graph, params, child);            \
    }

NN_ADD_NODE_HOOK(cuGraphAddNode_v2) /* CUDA 12.3: edge data */
#if CUDA_VERSION >= 13040
NN_ADD_NODE_HOOK(cuGraphAddNode_v3) /* CUDA 13.4 */
#endif

NN_EXPORT CUresult cuGraphClone(CUgraph *clone, CUgraph original) {
    NN_REQUIRE(nn_real.cuGraphClone);
    CUresult rc = nn_real.cuGraphClone(clone, original);
    if (rc == CUDA_SUCCESS && clone != NULL) nn_graph_copy(original, *clone);
    return rc;
}
