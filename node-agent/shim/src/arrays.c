/*
 * arrays.c — CUDA arrays and mipmapped arrays (textures, surfaces): cuArrayCreate_v2,
 * cuArray3DCreate_v2, cuMipmappedArrayCreate, and their destroys.
 *
 * The driver does not say how much memory an array will take, so the shim charges an estimate
 * before the driver allocates (arraysize.h: element bytes x width x height x depth or layers,
 * padded to the driver's block-linear blocks, every mip level, rounded up to 2 MiB — never below
 * what an H100 was measured to use), refuses with CUDA_ERROR_OUT_OF_MEMORY when it does not fit,
 * gives it back if the driver fails, and keeps it until cuArrayDestroy / cuMipmappedArrayDestroy.
 *
 * The legacy cuArrayCreate / cuArray3DCreate (32-bit descriptors, CUDA < 3.2) return
 * CUDA_ERROR_NOT_SUPPORTED like the other legacy entry points (a current driver answers them with
 * CUDA_ERROR_INVALID_CONTEXT anyway).
 */
#define _GNU_SOURCE
#include "shim.h"

#include "arraysize.h"

NN_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    NN_REQUIRE(nn_real.cuArrayCreate_v2);
    if (handle == NULL || desc == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = nn_array_bytes(desc->Format, desc->NumChannels, desc->Width, desc->Height, 0, 0, 1);
    NN_CHARGED_CALL(nn_current_entry(), bytes, (uintptr_t)*handle, NN_KIND_ARRAY,
                    nn_real.cuArrayCreate_v2(handle, desc));
}

NN_EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    NN_REQUIRE(nn_real.cuArray3DCreate_v2);
    if (handle == NULL || desc == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = nn_array_bytes(desc->Format, desc->NumChannels, desc->Width, desc->Height, desc->Depth,
                                    desc->Flags, 1);
    NN_CHARGED_CALL(nn_current_entry(), bytes, (uintptr_t)*handle, NN_KIND_ARRAY,
                    nn_real.cuArray3DCreate_v2(handle, desc));
}

NN_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int levels) {
    NN_REQUIRE(nn_real.cuMipmappedArrayCreate);
    if (handle == NULL || desc == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = nn_array_bytes(desc->Format, desc->NumChannels, desc->Width, desc->Height, desc->Depth,
                                    desc->Flags, levels);
    NN_CHARGED_CALL(nn_current_entry(), bytes, (uintptr_t)*handle, NN_KIND_ARRAY,
                    nn_real.cuMipmappedArrayCreate(handle, desc, levels));
}

NN_EXPORT CUresult cuArrayDestroy(CUarray array) {
    NN_REQUIRE(nn_real.cuArrayDestroy);
    CUresult rc = nn_real.cuArrayDestroy(array);
    if (rc == CUDA_SUCCESS) nn_untrack_and_uncharge((uint64_t)(uintptr_t)array);
    return rc;
}

NN_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    NN_REQUIRE(nn_real.cuMipmappedArrayDestroy);
    CUresult rc = nn_real.cuMipmappedArrayDestroy(array);
    if (rc == CUDA_SUCCESS) nn_untrack_and_uncharge((uint64_t)(uintptr_t)array);
    return rc;
}

/* Legacy 32-bit descriptors: never accounted, so refused. */
NN_EXPORT CUresult cuArrayCreate(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    (void)handle, (void)desc;
    return CUDA_ERROR_NOT_SUPPORTED;
}

NN_EXPORT CUresult cuArray3DCreate(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    (void)handle, (void)desc;
    return CUDA_ERROR_NOT_SUPPORTED;
}
