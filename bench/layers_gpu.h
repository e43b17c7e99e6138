/*
 * bench/layers' GPU side (layers_gpu.cu, built with nvcc when configure
 * finds it; without it every call fails and says why).  Used on the cuda
 * memory kind, where the window's base pointer is device memory.  Every
 * call returns 0, or -1 with layers_gpu_error() saying why.
 *
 * The data pattern is the one of layers.c: the 64-bit word at byte offset
 * 8*w of the window holds layers_pat(w).
 */
#ifndef LAYERS_GPU_H_
#define LAYERS_GPU_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint64_t layers_pat(uint64_t word)
{
    return (word + 1) * 0x9e3779b97f4a7c15ull;
}

#ifdef LAYERS_GPU
const char *layers_gpu_error(void);
int  layers_gpu_init(int device);
void layers_gpu_fini(void);
/* Write the pattern into [off, off+len) of the window at @base. */
int  layers_gpu_fill(char *base, size_t off, size_t len);
/* One layer: every word of [off, off+len) is checked against the pattern
 * (mismatches added to *@mismatch_p) and goes through @ops multiply-adds;
 * returns when the kernel is done (so the caller may release the range). */
int  layers_gpu_layer(const char *base, size_t off, size_t len, int ops, uint64_t *mismatch_p);
/* CUDA events around a pass: start, then stop gives the milliseconds. */
int  layers_gpu_timer_start(void);
int  layers_gpu_timer_stop(double *ms_p);
#else
static inline const char *layers_gpu_error(void)
{
    return "bench/layers was built without nvcc: no GPU kernels (configure --with-cuda "
           "with nvcc on PATH)";
}
static inline int layers_gpu_init(int device) { (void)device; return -1; }
static inline void layers_gpu_fini(void) {}
static inline int layers_gpu_fill(char *base, size_t off, size_t len)
{
    (void)base; (void)off; (void)len;
    return -1;
}
static inline int layers_gpu_layer(const char *base, size_t off, size_t len, int ops,
                                   uint64_t *mismatch_p)
{
    (void)base; (void)off; (void)len; (void)ops; (void)mismatch_p;
    return -1;
}
static inline int layers_gpu_timer_start(void) { return -1; }
static inline int layers_gpu_timer_stop(double *ms_p) { (void)ms_p; return -1; }
#endif

#ifdef __cplusplus
}
#endif

#endif
