/*
 * kv_serving's GPU side (kv_gpu.cu, built with nvcc when configure finds
 * it; without it every call fails and says why).  Used on the cuda memory
 * kind, where the window's base pointer is device memory.  All calls return
 * 0, or -1 with kv_gpu_error() saying why.
 *
 * One step of the engine is kv_gpu_step(): for each request of the batch,
 *  1. write the K/V of positions [w_from, w_to) (the tokens this step
 *     computes: the prompt in a prefill, one token in a decode);
 *  2. paged attention over positions [0, r_to): one query per head reads
 *     every K and V element through the block table, checks it against
 *     kv_pattern.h and counts mismatches, with an online softmax
 *     (split-K, flash-decoding style) and a combine;
 *  3. @weight_passes passes of a matrix-vector product over a local
 *     cudaMalloc weight buffer (the weights a real decode step streams).
 * It returns when the GPU is done, so the caller may release the window.
 */
#ifndef KV_GPU_H_
#define KV_GPU_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t uid;          /* request: the K/V pattern's seed */
    uint32_t w_from, w_to; /* positions written this step */
    uint32_t r_to;         /* positions attended: [0, r_to) */
    uint32_t tab_off;      /* first entry of its block table in @tab */
    uint32_t nblk;
} kv_gpu_req_t;

#ifdef KV_GPU
const char *kv_gpu_error(void);
/* @tok_elems 32-bit elements per token (K then V), @heads heads of
 * tok_elems / 2 / heads elements each (a multiple of 128). */
int  kv_gpu_init(int device, size_t weight_bytes, uint32_t tok_elems, uint32_t heads,
                 uint32_t max_reqs, uint32_t max_tab);
void kv_gpu_fini(void);
int  kv_gpu_step(char *base, size_t blk_bytes, const kv_gpu_req_t *rq, uint32_t n,
                 const uint32_t *tab, uint32_t ntab, int weight_passes, uint64_t *mismatch_p);
/* move whole KV blocks inside the window (the give-back's compaction) */
int  kv_gpu_copy_blocks(char *base, size_t blk_bytes, const uint32_t *src, const uint32_t *dst,
                        uint32_t n);
/* milliseconds of one weight pass alone, and of a step over @n requests */
int  kv_gpu_time_weights(int passes, double *ms_p);
#else
static inline const char *kv_gpu_error(void)
{
    return "kv_serving was built without nvcc: no GPU kernels";
}
static inline int kv_gpu_init(int device, size_t weight_bytes, uint32_t tok_elems,
                              uint32_t heads, uint32_t max_reqs, uint32_t max_tab)
{
    (void)device; (void)weight_bytes; (void)tok_elems; (void)heads; (void)max_reqs;
    (void)max_tab;
    return -1;
}
static inline void kv_gpu_fini(void) {}
static inline int kv_gpu_step(char *base, size_t blk_bytes, const kv_gpu_req_t *rq, uint32_t n,
                              const uint32_t *tab, uint32_t ntab, int weight_passes,
                              uint64_t *mismatch_p)
{
    (void)base; (void)blk_bytes; (void)rq; (void)n; (void)tab; (void)ntab;
    (void)weight_passes; (void)mismatch_p;
    return -1;
}
static inline int kv_gpu_copy_blocks(char *base, size_t blk_bytes, const uint32_t *src,
                                     const uint32_t *dst, uint32_t n)
{
    (void)base; (void)blk_bytes; (void)src; (void)dst; (void)n;
    return -1;
}
static inline int kv_gpu_time_weights(int passes, double *ms_p)
{
    (void)passes; (void)ms_p;
    return -1;
}
#endif

#ifdef __cplusplus
}
#endif

#endif
