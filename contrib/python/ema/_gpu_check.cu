/*
 * _gpu_check: a GPU consumer of EMA window views for Python, with no torch
 * or CuPy: kernels called through ctypes with a view's device pointer
 * (from __cuda_array_interface__), and a DLPack consumer written in C (it
 * takes a DLManagedTensor[Versioned] from a capsule, runs a kernel on it,
 * and calls its deleter, as torch.from_dlpack would).
 *
 * Used by examples/python/cuda_consumer.py.  Built by the project's make
 * whenever nvcc is found (python/_gpu_check.so of the build tree); the CUDA
 * runtime is linked statically, so it loads where there is no driver and
 * ema_py_gpu_count() then says 0.
 *
 * Words are uint64_t; word i of a range filled with salt s holds
 * pattern(i, s).  Every function returns a cudaError_t (0: success).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#define EXPORT extern "C" __attribute__((visibility("default")))

__host__ __device__ static inline uint64_t pattern(uint64_t i, uint64_t salt)
{
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;
    return x ^ (x >> 29);
}

/* p[i] = pattern(i, salt) for i in [begin, end) */
__global__ void fill_kernel(uint64_t *p, uint64_t begin, uint64_t end, uint64_t salt)
{
    for (uint64_t i = begin + blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < end;
         i += (uint64_t)gridDim.x * blockDim.x) {
        p[i] = pattern(i, salt);
    }
}

/* Count the words of [0, n) that differ from pattern(i, i < half ? a : b)
 * ^ mask_in; then, if rewrite, store pattern(...) ^ mask_out in each. */
__global__ void check_kernel(uint64_t *p, uint64_t n, uint64_t half, uint64_t a, uint64_t b,
                             uint64_t mask_in, int rewrite, uint64_t mask_out,
                             unsigned long long *errors)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t want = pattern(i, i < half ? a : b);
        if (p[i] != (want ^ mask_in)) {
            atomicAdd(errors, 1ull);
        }
        if (rewrite) {
            p[i] = want ^ mask_out;
        }
    }
}

static const unsigned BLOCKS = 1024, THREADS = 256;

EXPORT int ema_py_gpu_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

EXPORT const char *ema_py_gpu_error_string(int err)
{
    return cudaGetErrorString((cudaError_t)err);
}

EXPORT int ema_py_gpu_fill(int device, uint64_t ptr, uint64_t begin, uint64_t end, uint64_t salt)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        return e;
    }
    fill_kernel<<<BLOCKS, THREADS>>>((uint64_t *)(uintptr_t)ptr, begin, end, salt);
    e = cudaGetLastError();
    return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

static int check_words(int device, uint64_t *p, uint64_t n, uint64_t half, uint64_t a,
                       uint64_t b, uint64_t mask_in, int rewrite, uint64_t mask_out,
                       unsigned long long *errors_p)
{
    unsigned long long *d_err = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) {
        e = cudaMalloc(&d_err, sizeof(*d_err));
    }
    if (e == cudaSuccess) {
        e = cudaMemset(d_err, 0, sizeof(*d_err));
    }
    if (e == cudaSuccess) {
        check_kernel<<<BLOCKS, THREADS>>>(p, n, half, a, b, mask_in, rewrite, mask_out, d_err);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        e = cudaMemcpy(errors_p, d_err, sizeof(*d_err), cudaMemcpyDeviceToHost);
    }
    if (d_err != NULL) {
        cudaFree(d_err);
    }
    return e;
}

/* The __cuda_array_interface__ consumer: check (and rewrite) n words at ptr. */
EXPORT int ema_py_gpu_check(int device, uint64_t ptr, uint64_t n, uint64_t half, uint64_t a,
                            uint64_t b, uint64_t mask_in, int rewrite, uint64_t mask_out,
                            unsigned long long *errors_p)
{
    return check_words(device, (uint64_t *)(uintptr_t)ptr, n, half, a, b, mask_in, rewrite,
                       mask_out, errors_p);
}

/* DLPack (dlpack.h): the structures a consumer reads. */
typedef struct {
    int32_t device_type; /* kDLCUDA = 2 */
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code; /* kDLUInt = 1 */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct DLManagedTensorVersioned {
    struct {
        uint32_t major, minor;
    } version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define EMA_PY_DLPACK_BAD ((int)cudaErrorInvalidValue)

/*
 * The DLPack consumer: @managed is the pointer of a capsule the caller has
 * renamed "used_dltensor[_versioned]" (so the capsule no longer owns it);
 * check (read-only) the tensor, a 1-d uint64 CUDA tensor, as check_words
 * does, then call its deleter: the consumer's side of the protocol.
 * *shape_n_p receives its length.
 */
EXPORT int ema_py_gpu_consume_dlpack(void *managed, int versioned, uint64_t half, uint64_t a,
                                     uint64_t b, uint64_t mask_in, unsigned long long *errors_p,
                                     uint64_t *shape_n_p)
{
    DLTensor *t = versioned ? &((DLManagedTensorVersioned *)managed)->dl_tensor
                            : &((DLManagedTensor *)managed)->dl_tensor;
    int rc = EMA_PY_DLPACK_BAD;

    if (versioned && ((DLManagedTensorVersioned *)managed)->version.major != 1) {
        goto out;
    }
    if (t->device.device_type != 2 || t->ndim != 1 || t->dtype.code != 1 ||
        t->dtype.bits != 64 || t->dtype.lanes != 1 ||
        (t->strides != NULL && t->strides[0] != 1)) {
        goto out;
    }
    *shape_n_p = (uint64_t)t->shape[0];
    rc = check_words(t->device.device_id,
                     (uint64_t *)((char *)t->data + t->byte_offset), (uint64_t)t->shape[0],
                     half, a, b, mask_in, 0, 0, errors_p);
out:
    if (versioned) {
        DLManagedTensorVersioned *m = (DLManagedTensorVersioned *)managed;
        if (m->deleter) {
            m->deleter(m);
        }
    } else {
        DLManagedTensor *m = (DLManagedTensor *)managed;
        if (m->deleter) {
            m->deleter(m);
        }
    }
    return rc;
}
