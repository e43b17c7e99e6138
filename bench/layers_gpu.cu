/*
 * bench/layers' kernels (layers_gpu.h): fill the pattern, and one layer's
 * pass over its slice of the window (a check of every word against the
 * pattern, then a settable number of multiply-adds per word), on one
 * stream, timed with CUDA events.
 */
#define LAYERS_GPU 1 /* the real calls, not the stubs */
#include "layers_gpu.h"

#include <cuda_runtime.h>
#include <stdio.h>

static char          gpu_err[256];
static cudaStream_t  gpu_stream;
static cudaEvent_t   gpu_ev[2];
static unsigned long long *gpu_count; /* [0] mismatches, [1] the arithmetic's sink */

#define GPU_CALL(_c)                                                                   \
    do {                                                                               \
        cudaError_t e_ = (_c);                                                         \
        if (e_ != cudaSuccess) {                                                       \
            snprintf(gpu_err, sizeof(gpu_err), "%s: %s", #_c, cudaGetErrorString(e_)); \
            return -1;                                                                 \
        }                                                                              \
    } while (0)

extern "C" const char *layers_gpu_error(void)
{
    return gpu_err;
}

extern "C" int layers_gpu_init(int device)
{
    GPU_CALL(cudaSetDevice(device));
    GPU_CALL(cudaStreamCreateWithFlags(&gpu_stream, cudaStreamNonBlocking));
    GPU_CALL(cudaEventCreate(&gpu_ev[0]));
    GPU_CALL(cudaEventCreate(&gpu_ev[1]));
    GPU_CALL(cudaMalloc(&gpu_count, 2 * sizeof(*gpu_count)));
    return 0;
}

extern "C" void layers_gpu_fini(void)
{
    cudaFree(gpu_count);
    cudaEventDestroy(gpu_ev[0]);
    cudaEventDestroy(gpu_ev[1]);
    cudaStreamDestroy(gpu_stream);
}

__device__ uint64_t dpat(uint64_t w)
{
    return (w + 1) * 0x9e3779b97f4a7c15ull;
}

__global__ void layers_fill(uint64_t *p, uint64_t w0, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        p[i] = dpat(w0 + i);
    }
}

__global__ void layers_layer(const uint64_t *p, uint64_t w0, size_t n, int ops,
                             unsigned long long *count)
{
    unsigned long long bad = 0;
    float acc = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t v = p[i];
        bad += (v != dpat(w0 + i));
        float x = (float)(v & 0xffff);
        for (int k = 0; k < ops; k++) {
            x = fmaf(x, 1.0000001f, 0.5f);
        }
        acc += x;
    }
    if (bad) {
        atomicAdd(&count[0], bad);
    }
    if (acc == -1.f) { /* never: keeps the arithmetic */
        atomicAdd(&count[1], 1ull);
    }
}

static int grid_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (int)(b < 132 * 16 ? (b ? b : 1) : 132 * 16);
}

extern "C" int layers_gpu_fill(char *base, size_t off, size_t len)
{
    size_t n = len / 8;
    layers_fill<<<grid_for(n), 256, 0, gpu_stream>>>((uint64_t *)(base + off), off / 8, n);
    GPU_CALL(cudaGetLastError());
    GPU_CALL(cudaStreamSynchronize(gpu_stream));
    return 0;
}

extern "C" int layers_gpu_layer(const char *base, size_t off, size_t len, int ops,
                                uint64_t *mismatch_p)
{
    size_t n = len / 8;
    unsigned long long h[2];
    GPU_CALL(cudaMemsetAsync(gpu_count, 0, sizeof(h), gpu_stream));
    layers_layer<<<grid_for(n), 256, 0, gpu_stream>>>((const uint64_t *)(base + off), off / 8,
                                                      n, ops, gpu_count);
    GPU_CALL(cudaGetLastError());
    GPU_CALL(cudaMemcpyAsync(h, gpu_count, sizeof(h), cudaMemcpyDeviceToHost, gpu_stream));
    GPU_CALL(cudaStreamSynchronize(gpu_stream));
    *mismatch_p += h[0];
    return 0;
}

extern "C" int layers_gpu_timer_start(void)
{
    GPU_CALL(cudaEventRecord(gpu_ev[0], gpu_stream));
    return 0;
}

extern "C" int layers_gpu_timer_stop(double *ms_p)
{
    float ms = 0;
    GPU_CALL(cudaEventRecord(gpu_ev[1], gpu_stream));
    GPU_CALL(cudaEventSynchronize(gpu_ev[1]));
    GPU_CALL(cudaEventElapsedTime(&ms, gpu_ev[0], gpu_ev[1]));
    *ms_p = ms;
    return 0;
}
