/*
 * ema_perf's GPU side (perf_gpu.cu), used on the cuda memory kind.  Without
 * nvcc at build time every call fails with a message that says so.  All
 * return 0 on success, -1 with perf_gpu_error() saying why.
 */
#ifndef EMA_PERF_GPU_H_
#define EMA_PERF_GPU_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef EMA_PERF_GPU
const char *perf_gpu_error(void);
int   perf_gpu_init(int device);
void *perf_gpu_alloc(size_t len);
/* Device memory made like EMA's cuda arena: one CUDA VMM allocation
 * (cuMemCreate, exportable as a POSIX fd), mapped and given access. */
void *perf_gpu_alloc_vmm(size_t len);
void  perf_gpu_free(void *p); /* either kind */
/* Write the pattern of @salt (zeros with @zero) into device memory. */
int   perf_gpu_fill(void *p, size_t len, uint64_t salt, int zero);
/* *bad_p: the first byte that differs from the pattern of @salt with @add
 * added to every word, or (size_t)-1. */
int   perf_gpu_check(const void *p, size_t len, uint64_t salt, uint64_t add, size_t *bad_p);
int   perf_gpu_copy(void *dst, const void *src, size_t len);
/* The put/get rows' copy reference, one iteration: cudaMemcpyAsync device to
 * device on ema_perf's stream, then cudaStreamSynchronize (an op + flush). */
int   perf_gpu_copy_d2d(void *dst, const void *src, size_t len);
/* Timed with CUDA events: one cudaMemcpy device to device; @passes of a
 * kernel that reads and writes every word of [p, p+len) (adds 1). */
int   perf_gpu_memcpy_us(void *dst, const void *src, size_t len, double *us_p);
int   perf_gpu_passes_us(void *p, size_t len, int passes, double *us_p);
/* A stopwatch on the GPU's clock for work done on other streams: @n events
 * (reserve), event @i recorded now (mark), microseconds from event @a to
 * event @b, waiting for @b (mark_us). */
int   perf_gpu_marks_reserve(int n);
int   perf_gpu_mark(int i);
int   perf_gpu_mark_us(int a, int b, double *us_p);
#else
static inline const char *perf_gpu_error(void)
{
    return "ema_perf was built without nvcc: no GPU measurements";
}
static inline int   perf_gpu_init(int device) { (void)device; return -1; }
static inline void *perf_gpu_alloc(size_t len) { (void)len; return NULL; }
static inline void *perf_gpu_alloc_vmm(size_t len) { (void)len; return NULL; }
static inline void  perf_gpu_free(void *p) { (void)p; }
static inline int   perf_gpu_fill(void *p, size_t len, uint64_t salt, int zero)
{ (void)p; (void)len; (void)salt; (void)zero; return -1; }
static inline int   perf_gpu_check(const void *p, size_t len, uint64_t salt, uint64_t add,
                                   size_t *bad_p)
{ (void)p; (void)len; (void)salt; (void)add; (void)bad_p; return -1; }
static inline int   perf_gpu_copy(void *dst, const void *src, size_t len)
{ (void)dst; (void)src; (void)len; return -1; }
static inline int   perf_gpu_copy_d2d(void *dst, const void *src, size_t len)
{ (void)dst; (void)src; (void)len; return -1; }
static inline int   perf_gpu_memcpy_us(void *dst, const void *src, size_t len, double *us_p)
{ (void)dst; (void)src; (void)len; (void)us_p; return -1; }
static inline int   perf_gpu_passes_us(void *p, size_t len, int passes, double *us_p)
{ (void)p; (void)len; (void)passes; (void)us_p; return -1; }
static inline int   perf_gpu_marks_reserve(int n) { (void)n; return -1; }
static inline int   perf_gpu_mark(int i) { (void)i; return -1; }
static inline int   perf_gpu_mark_us(int a, int b, double *us_p)
{ (void)a; (void)b; (void)us_p; return -1; }
#endif

#ifdef __cplusplus
}
#endif

#endif
