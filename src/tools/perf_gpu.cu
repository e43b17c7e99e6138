/*
 * ema_perf's GPU side (built with nvcc when configure finds it): device
 * buffers, the data pattern written and checked by kernels, and the timings
 * that the GPU itself takes with CUDA events: a cudaMemcpy of the same bytes
 * (the reference of a reclaim, and of put and get: perf_gpu_copy_d2d between
 * the marks) and a kernel streaming over a window.
 *
 * The CUDA runtime is linked statically and loads the driver on first use,
 * so ema_perf still starts on a machine with no GPU; these functions are
 * only called when EMA runs on the cuda memory kind.
 */
#define EMA_PERF_GPU 1
#include "perf_gpu.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

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

/* The driver's VMM calls, reached through the runtime (cudart is linked
 * statically and libcuda is not linked at all). */
static struct {
    int                                     loaded;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemCreate_v10020                  create;
    PFN_cuMemRelease_v10020                 release;
    PFN_cuMemAddressReserve_v10020          reserve;
    PFN_cuMemAddressFree_v10020             addr_free;
    PFN_cuMemMap_v10020                     map;
    PFN_cuMemUnmap_v10020                   unmap;
    PFN_cuMemSetAccess_v10020               set_access;
} perf_vmm;

/* The one VMM buffer ema_perf makes (the raw UCX target), for free */
static struct {
    void                        *p;
    size_t                       len;
    CUmemGenericAllocationHandle h;
} perf_vmm_buf;

static int perf_vmm_load(void)
{
#define PERF_VMM_SYM(_f, _name) \
    do { \
        cudaDriverEntryPointQueryResult q; \
        cudaError_t e_ = cudaGetDriverEntryPointByVersion(_name, (void **)&perf_vmm._f, 12000, \
                                                          cudaEnableDefault, &q); \
        if (e_ != cudaSuccess || q != cudaDriverEntryPointSuccess) { \
            snprintf(perf_gpu_errbuf, sizeof(perf_gpu_errbuf), "the driver has no %s", _name); \
            return -1; \
        } \
    } while (0)
    if (perf_vmm.loaded) {
        return 0;
    }
    PERF_VMM_SYM(granularity, "cuMemGetAllocationGranularity");
    PERF_VMM_SYM(create, "cuMemCreate");
    PERF_VMM_SYM(release, "cuMemRelease");
    PERF_VMM_SYM(reserve, "cuMemAddressReserve");
    PERF_VMM_SYM(addr_free, "cuMemAddressFree");
    PERF_VMM_SYM(map, "cuMemMap");
    PERF_VMM_SYM(unmap, "cuMemUnmap");
    PERF_VMM_SYM(set_access, "cuMemSetAccess");
#undef PERF_VMM_SYM
    perf_vmm.loaded = 1;
    return 0;
}

static void *perf_vmm_fail(const char *what, CUresult r)
{
    snprintf(perf_gpu_errbuf, sizeof(perf_gpu_errbuf), "%s failed: CUresult %d", what, (int)r);
    return NULL;
}

extern "C" void *perf_gpu_alloc_vmm(size_t len)
{
    CUmemAllocationProp prop = {};
    CUmemAccessDesc acc      = {};
    CUmemGenericAllocationHandle h;
    CUdeviceptr p;
    size_t gran;
    int dev;
    CUresult r;

    if (perf_vmm_buf.p != NULL) {
        snprintf(perf_gpu_errbuf, sizeof(perf_gpu_errbuf), "one VMM buffer at a time");
        return NULL;
    }
    if (perf_vmm_load() != 0) {
        return NULL;
    }
    if (cudaGetDevice(&dev) != cudaSuccess) {
        snprintf(perf_gpu_errbuf, sizeof(perf_gpu_errbuf), "cudaGetDevice failed");
        return NULL;
    }
    prop.type                 = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type        = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id          = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if ((r = perf_vmm.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) !=
        CUDA_SUCCESS) {
        return perf_vmm_fail("cuMemGetAllocationGranularity", r);
    }
    len = (len + gran - 1) / gran * gran;
    if ((r = perf_vmm.create(&h, len, &prop, 0)) != CUDA_SUCCESS) {
        return perf_vmm_fail("cuMemCreate", r);
    }
    if ((r = perf_vmm.reserve(&p, len, gran, 0, 0)) != CUDA_SUCCESS) {
        perf_vmm.release(h);
        return perf_vmm_fail("cuMemAddressReserve", r);
    }
    if ((r = perf_vmm.map(p, len, 0, h, 0)) != CUDA_SUCCESS) {
        perf_vmm.addr_free(p, len);
        perf_vmm.release(h);
        return perf_vmm_fail("cuMemMap", r);
    }
    acc.location = prop.location;
    acc.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = perf_vmm.set_access(p, len, &acc, 1)) != CUDA_SUCCESS) {
        perf_vmm.unmap(p, len);
        perf_vmm.addr_free(p, len);
        perf_vmm.release(h);
        return perf_vmm_fail("cuMemSetAccess", r);
    }
    perf_vmm_buf.p   = (void *)p;
    perf_vmm_buf.len = len;
    perf_vmm_buf.h   = h; /* kept, as EMA keeps its arena's handles */
    return (void *)p;
}

extern "C" void perf_gpu_free(void *p)
{
    if (p != NULL && p == perf_vmm_buf.p) {
        perf_vmm.unmap((CUdeviceptr)p, perf_vmm_buf.len);
        perf_vmm.addr_free((CUdeviceptr)p, perf_vmm_buf.len);
        perf_vmm.release(perf_vmm_buf.h);
        perf_vmm_buf.p = NULL;
        return;
    }
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

extern "C" int perf_gpu_copy_d2d(void *dst, const void *src, size_t len)
{
    GPU_CALL(cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToDevice, perf_gpu_stream));
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

/* The stopwatch of put and get: events recorded on ema_perf's own stream,
 * which holds no other work, so each is stamped on the GPU's clock as soon
 * as the host records it.  A mark recorded after a flush has returned comes
 * after the data movement it waited for on UCX's own streams. */
static cudaEvent_t *perf_gpu_marks;
static int          perf_gpu_nmarks;

extern "C" int perf_gpu_marks_reserve(int n)
{
    if (n <= perf_gpu_nmarks) {
        return 0;
    }
    cudaEvent_t *m = (cudaEvent_t *)realloc(perf_gpu_marks, (size_t)n * sizeof(*m));
    if (m == NULL) {
        return perf_gpu_fail("marks", cudaErrorMemoryAllocation);
    }
    perf_gpu_marks = m;
    for (; perf_gpu_nmarks < n; perf_gpu_nmarks++) {
        GPU_CALL(cudaEventCreate(&perf_gpu_marks[perf_gpu_nmarks]));
    }
    return 0;
}

extern "C" int perf_gpu_mark(int i)
{
    GPU_CALL(cudaEventRecord(perf_gpu_marks[i], perf_gpu_stream));
    return 0;
}

extern "C" int perf_gpu_mark_us(int a, int b, double *us_p)
{
    float ms = 0;
    GPU_CALL(cudaEventSynchronize(perf_gpu_marks[b]));
    GPU_CALL(cudaEventElapsedTime(&ms, perf_gpu_marks[a], perf_gpu_marks[b]));
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
