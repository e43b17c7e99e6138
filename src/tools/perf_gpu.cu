/*
 * ema_perf's GPU side (built with nvcc when configure finds it): device
 * buffers, the data pattern written and checked by kernels, and the timings
 * that the GPU itself takes with CUDA events: a cudaMemcpy of the same bytes
 * (the reference of a reclaim) and a kernel streaming over a window.
 *
 * The CUDA runtime is linked statically and loads the driver on first use,
 * so ema_perf still starts on a machine with no GPU; these functions are
 * only called when EMA runs on the cuda memory kind.
 */
#define EMA_PERF_GPU 1
#include "perf_gpu.h"

#include <cuda_runtime.h>
#include <stdio.h>

static char perf_gpu_errbuf[256] = "";
static cudaStream_t perf_gpu_stream;

static int perf_gpu_fail(const char *what, cudaError_t err)
{
    snprintf(perf_gpu_errbuf, sizeof(perf_gpu_errbuf), "%s: %s", what, cudaGetErrorString(err));
    return -1;
}

#define GPU_CALL(_call) do { cudaError_t e_ = (_call); \
    if (e_ != cudaSuccess) return perf_gpu_fail(#_call, e_); } while (0)

extern "C" const char *perf_gpu_error(void)
{
    return perf_gpu_errbuf;
}

extern "C" int perf_gpu_init(int device)
{
    GPU_CALL(cudaSetDevice(device));
    GPU_CALL(cudaStreamCreateWithFlags(&perf_gpu_stream, cudaStreamNonBlocking));
    return 0;
}

extern "C" void *perf_gpu_alloc(size_t len)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, len ? len : 1);
    if (e != cudaSuccess) {
        perf_gpu_fail("cudaMalloc", e);
        return NULL;
    }
    return p;
}

extern "C" void perf_gpu_free(void *p)
{
    cudaFree(p);
}

/* The pattern of ema_perf.c's perf_word, word k with salt, plus @add. */
__device__ static inline uint64_t perf_gpu_word(uint64_t salt, size_t k)
{
    uint64_t x = salt + (uint64_t)k * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return x | 1;
}

__global__ static void perf_gpu_fill_k(unsigned char *p, size_t len, uint64_t salt, int zero)
{
    size_t nw = len / 8;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k <= nw;
         k += (size_t)gridDim.x * blockDim.x) {
        uint64_t w = zero ? 0 : perf_gpu_word(salt, k);
        if (k < nw) {
            ((uint64_t *)p)[k] = w;
        } else {
            for (size_t i = 0; i < len % 8; i++) { /* the tail, byte by byte */
                p[nw * 8 + i] = (unsigned char)(w >> (8 * i));
            }
        }
    }
}

/* The first wrong byte's offset into *bad (which starts at len). */
__global__ static void perf_gpu_check_k(const unsigned char *p, size_t len, uint64_t salt,
                                        uint64_t add, unsigned long long *bad)
{
    size_t nw = len / 8;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k <= nw;
         k += (size_t)gridDim.x * blockDim.x) {
        uint64_t w = perf_gpu_word(salt, k) + add;
        if (k < nw) {
            uint64_t v = ((const uint64_t *)p)[k];
            if (v != w) {
                int i = 0;
                while (((v >> (8 * i)) & 0xff) == ((w >> (8 * i)) & 0xff)) {
                    i++;
                }
                atomicMin(bad, (unsigned long long)(k * 8 + i));
            }
        } else {
            for (size_t i = 0; i < len % 8; i++) {
                if (p[nw * 8 + i] != (unsigned char)(w >> (8 * i))) {
                    atomicMin(bad, (unsigned long long)(nw * 8 + i));
                    break;
                }
            }
        }
    }
}

/* One pass of a streaming kernel: every word read and written (+1). */
__global__ static void perf_gpu_pass_k(uint64_t *p, size_t nw)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < nw;
         k += (size_t)gridDim.x * blockDim.x) {
        p[k] += 1;
    }
}

static unsigned perf_gpu_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 132 * 16 ? 132 * 16 : b);
}

extern "C" int perf_gpu_fill(void *p, size_t len, uint64_t salt, int zero)
{
    perf_gpu_fill_k<<<perf_gpu_blocks(len / 8 + 1), 256, 0, perf_gpu_stream>>>(
        (unsigned char *)p, len, salt, zero);
    GPU_CALL(cudaGetLastError());
    GPU_CALL(cudaStreamSynchronize(perf_gpu_stream));
    return 0;
}

extern "C" int perf_gpu_check(const void *p, size_t len, uint64_t salt, uint64_t add,
                              size_t *bad_p)
{
    unsigned long long *bad = NULL, h = len;
    GPU_CALL(cudaMalloc(&bad, sizeof(*bad)));
    cudaMemcpyAsync(bad, &h, sizeof(h), cudaMemcpyHostToDevice, perf_gpu_stream);
    perf_gpu_check_k<<<perf_gpu_blocks(len / 8 + 1), 256, 0, perf_gpu_stream>>>(
        (const unsigned char *)p, len, salt, add, bad);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        e = cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, perf_gpu_stream);
    }
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(perf_gpu_stream);
    }
    cudaFree(bad);
    if (e != cudaSuccess) {
        return perf_gpu_fail("check kernel", e);
    }
    *bad_p = (h < len) ? (size_t)h : (size_t)-1;
    return 0;
}

extern "C" int perf_gpu_copy(void *dst, const void *src, size_t len)
{
    GPU_CALL(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, perf_gpu_stream));
    GPU_CALL(cudaStreamSynchronize(perf_gpu_stream));
    return 0;
}

/* Time what @enqueue puts on the stream, with CUDA events around it. */
template <typename F> static int perf_gpu_timed(const char *what, F enqueue, double *us_p)
{
    cudaEvent_t e0, e1;
    float ms = 0;
    GPU_CALL(cudaEventCreate(&e0));
    GPU_CALL(cudaEventCreate(&e1));
    cudaEventRecord(e0, perf_gpu_stream);
    cudaError_t e = enqueue();
    cudaEventRecord(e1, perf_gpu_stream);
    if (e == cudaSuccess) {
        e = cudaEventSynchronize(e1);
    }
    if (e == cudaSuccess) {
        e = cudaEventElapsedTime(&ms, e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (e != cudaSuccess) {
        return perf_gpu_fail(what, e);
    }
    *us_p = ms * 1e3;
    return 0;
}

extern "C" int perf_gpu_memcpy_us(void *dst, const void *src, size_t len, double *us_p)
{
    return perf_gpu_timed("timed cudaMemcpy", [=]() {
        return cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToDevice, perf_gpu_stream);
    }, us_p);
}

extern "C" int perf_gpu_passes_us(void *p, size_t len, int passes, double *us_p)
{
    size_t nw = len / 8;
    return perf_gpu_timed("timed kernel", [=]() {
        for (int i = 0; i < passes; i++) {
            perf_gpu_pass_k<<<perf_gpu_blocks(nw), 256, 0, perf_gpu_stream>>>((uint64_t *)p, nw);
        }
        return cudaGetLastError();
    }, us_p);
}
