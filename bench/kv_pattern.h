/*
 * The value of every K/V element, shared by the CPU loop (kv_serving.c) and
 * the CUDA kernels (kv_gpu.cu).  A token's elements are 32-bit words: K
 * first, then V.  Element j of token @pos of request @uid holds
 * kv_elem(kv_tok_hash(uid, pos), j): a block that belongs to another
 * request or position, stale or zeroed memory, or a torn copy shows up as
 * mismatches (two different tokens collide with probability 2^-32).
 */
#ifndef KV_PATTERN_H_
#define KV_PATTERN_H_

#include <stdint.h>

#define KV_BLOCK_TOKENS 16 /* tokens per KV block, as vLLM's default */

#if defined(__CUDACC__)
#  define KV_HD __host__ __device__ __forceinline__
#else
#  define KV_HD static inline
#endif

KV_HD uint32_t kv_tok_hash(uint32_t uid, uint32_t pos)
{
    uint32_t x = uid * 0x9e3779b1u ^ (pos + 1u) * 0x85ebca77u;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    x *= 0x297a2d39u;
    x ^= x >> 15;
    return x | 1u; /* never 0: zeroed memory never matches */
}

KV_HD uint32_t kv_elem(uint32_t h, uint32_t j)
{
    return h + j * 0x9e3779b9u;
}

#endif
