/*
 * arraysize.h — the device memory a CUDA array (or mipmapped array) is charged for, before the
 * driver allocates it. Used by the shim (the charge) and the fake driver (its account).
 *
 * The driver lays arrays out block-linear: GOBs of 64 bytes x 8 rows, stacked into blocks of up to
 * 16 GOBs high (and 32 deep in 3D). The estimate pads each mip level to whole blocks, sums the
 * levels and rounds the total up to 2 MiB:
 *
 *     row    = roundup(element bytes x width, 64)
 *     rows   = roundup(max(height, 1), 8 x min(pow2ceil(ceil(max(height, 1) / 8)), 16))
 *     slices = the layers (layered, cubemap: faces), or roundup(depth, min(pow2ceil(depth), 32))
 *              for a 3D array, or 1
 *     level  = row x rows x slices
 *
 * Element bytes = the format's channel bytes (1 for 8-bit, 2 for 16-bit and half, 4 for 32-bit
 * and float) x NumChannels; block-compressed formats count 4x4-pixel blocks of 8 (BC1, BC4) or 16
 * bytes; a format not listed here (video/YUV, and any newer one) counts 16 bytes per channel.
 * Mipmapped: level l has max(width >> l, 1) x max(height >> l, 1) (a height of 0 stays 0), and
 * depth >> l for 3D arrays; layered and cubemap arrays keep their layer count; levels beyond the
 * full chain (which the driver clamps to) count nothing, and 0 levels count as 1. Sparse and
 * deferred-mapping arrays (CUDA_ARRAY3D_SPARSE, CUDA_ARRAY3D_DEFERRED_MAPPING) allocate nothing
 * (measured): their memory comes from cuMemCreate, charged there.
 *
 * Measured on an H100 (driver 580.159, CUDA 13.0) against what cuMemGetInfo lost: 25 chosen shapes
 * (1D to 4096x4096, 3D, layered, cubemap, BC, mipmapped) and 898 random ones (8-, 16- and 32-bit,
 * 1, 2 and 4 channels): never below. Equal for all 681 random 1D, 2D, layered, cubemap and 2D
 * mipmapped arrays; for 3D ones (plain and mipmapped) equal for 194 of 217 and above for the rest,
 * by up to 270 MiB (the driver sometimes keeps 3D blocks shallower than the bound). A 1D layered
 * float array of 8192 x 64 layers takes 16 MiB, not the 2 MiB of its data.
 */
#ifndef NN_ARRAYSIZE_H
#define NN_ARRAYSIZE_H

#include <stdint.h>

#define NN_ARRAY_PAGE (UINT64_C(2) << 20)

static inline uint64_t nn_sat_mul(uint64_t a, uint64_t b) { return (b != 0 && a > UINT64_MAX / b) ? UINT64_MAX : a * b; }
static inline uint64_t nn_sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static inline uint64_t nn_round_up(uint64_t x, uint64_t to) {
    return x % to == 0 ? x : nn_sat_mul(x / to + 1, to);
}

/* Bytes of one element (one 4x4 block when *block is set to 4). */
static inline uint64_t nn_array_element_bytes(CUarray_format format, unsigned channels, unsigned *block) {
    uint64_t ch = channels != 0 ? channels : 1;
    *block = 1;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return ch;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2 * ch;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4 * ch;
    case CU_AD_FORMAT_UNORM_INT8X1: case CU_AD_FORMAT_SNORM_INT8X1: return ch;
    case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: return ch > 2 ? ch : 2;
    case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: return ch > 4 ? ch : 4;
    case CU_AD_FORMAT_UNORM_INT16X1: case CU_AD_FORMAT_SNORM_INT16X1: return 2 * ch;
    case CU_AD_FORMAT_UNORM_INT16X2: case CU_AD_FORMAT_SNORM_INT16X2: return 2 * (ch > 2 ? ch : 2);
    case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: return 2 * (ch > 4 ? ch : 4);
    case CU_AD_FORMAT_UNORM_INT_101010_2: return 4;
    case CU_AD_FORMAT_BC1_UNORM: case CU_AD_FORMAT_BC1_UNORM_SRGB: case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
        *block = 4;
        return 8;
    case CU_AD_FORMAT_BC2_UNORM: case CU_AD_FORMAT_BC2_UNORM_SRGB: case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB: case CU_AD_FORMAT_BC5_UNORM: case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16: case CU_AD_FORMAT_BC6H_SF16: case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB:
        *block = 4;
        return 16;
    default: return 16 * ch; /* video/YUV formats and any format newer than this list */
    }
}

/* The smallest power of two >= x, at most `cap`. */
static inline uint64_t nn_pow2_up_to(uint64_t x, uint64_t cap) {
    uint64_t p = 1;
    while (p < x && p < cap) p <<= 1;
    return p;
}

/* One mip level of width x height elements: `layers` layers (layered, cubemap) or a 3D `depth`. */
static inline uint64_t nn_array_level_bytes(uint64_t element, unsigned block, uint64_t width, uint64_t height,
                                            uint64_t layers, uint64_t depth) {
    uint64_t w = (width + block - 1) / block, h = ((height ? height : 1) + block - 1) / block;
    uint64_t row = nn_round_up(nn_sat_mul(element, w ? w : 1), 64);
    uint64_t rows = nn_round_up(h, 8 * nn_pow2_up_to((h + 7) / 8, 16));
    uint64_t slices = depth ? nn_round_up(depth, nn_pow2_up_to(depth, 32)) : (layers ? layers : 1);
    return nn_sat_mul(nn_sat_mul(row, rows), slices);
}

/* The charge for an array of `levels` mip levels (1: a plain array) described by a 3D descriptor
 * (a 2D one has depth 0, flags 0). */
static inline uint64_t nn_array_bytes(CUarray_format format, unsigned channels, uint64_t width, uint64_t height,
                                      uint64_t depth, unsigned flags, unsigned levels) {
    if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) return 0;
    unsigned block;
    uint64_t element = nn_array_element_bytes(format, channels, &block);
    int layered = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    uint64_t largest = width > height ? width : height;
    if (!layered && depth > largest) largest = depth;
    unsigned chain = 1; /* the full mip chain: down to 1 x 1 x 1 */
    while (chain < 64 && (largest >> chain) != 0) chain++;
    if (levels == 0) levels = 1;
    if (levels > chain) levels = chain;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t w = width >> l, h = height >> l, d = layered ? depth : depth >> l;
        total = nn_sat_add(total, nn_array_level_bytes(element, block, w ? w : 1, height ? (h ? h : 1) : 0,
                                                       layered ? depth : 0, layered || !depth ? 0 : (d ? d : 1)));
    }
    return nn_round_up(total, NN_ARRAY_PAGE);
}

#endif
