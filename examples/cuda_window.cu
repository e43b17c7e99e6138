/*
 * cuda_window: CUDA kernels reading and writing an elastic EMA window.
 *
 *   mpirun -n 2 ./examples/cuda_window [MiB]
 *
 * Every rank joins with the cuda memory kind and MiB of device memory
 * (default 256).  Rank 0 allocates a window part that fills all of its own
 * memory and writes a pattern into it with a kernel.  It then grows the part
 * to twice that size: with no local memory left, the new half is borrowed
 * from the other ranks and mapped behind the first, at the same base
 * pointer.  A second kernel reads and updates every element of the whole,
 * half-borrowed, range; the host then checks every element.  The other
 * ranks lend.  In a world of one, rank 0 fills half of its memory and grows
 * locally.
 *
 * Uses only the public API (ema.h) and the CUDA runtime.  Prints one
 * "PASS" or "FAIL" line per rank; exits 0, 1 (fail) or 77 (skip: no GPU).
 */
#include <ema.h>

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define EXIT_SKIP 77

/* Run @_call, a call returning @_type, @_ok on success; on failure print
 * it (@_text) and @_strerror's name of its error, and exit. */
#define CHECK_CALL(_type, _ok, _strerror, _call, _text) \
    do { \
        _type r_ = (_call); \
        if (r_ != (_ok)) { \
            fprintf(stderr, "cuda_window: rank %d: %s failed: %s\n", rank, _text, \
                    _strerror(r_)); \
            exit(1); \
        } \
    } while (0)

#define CUDA_CHECK(_call) CHECK_CALL(cudaError_t, cudaSuccess, cudaGetErrorString, _call, #_call)
#define EMA_CHECK(_call)  CHECK_CALL(ema_status_t, EMA_SUCCESS, ema_strerror, _call, #_call)

static int rank = -1;

__host__ __device__ static inline uint64_t pattern(uint64_t i, uint64_t salt)
{
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;
    return x ^ (x >> 29);
}

#define SALT_FIRST  0x1111ull
#define SALT_SECOND 0x2222ull
#define UPDATE_MASK 0xa5a5a5a5a5a5a5a5ull

/* Fill [begin, end) with pattern(i, salt). */
__global__ void fill(uint64_t *p, uint64_t begin, uint64_t end, uint64_t salt)
{
    for (uint64_t i = begin + blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < end;
         i += (uint64_t)gridDim.x * blockDim.x) {
        p[i] = pattern(i, salt);
    }
}

/* Read every element, count those that are not what fill() wrote, and
 * update each in place. */
__global__ void check_update(uint64_t *p, uint64_t half, uint64_t n,
                             unsigned long long *errors)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t want = pattern(i, i < half ? SALT_FIRST : SALT_SECOND);
        uint64_t v    = p[i];
        if (v != want) {
            atomicAdd(errors, 1ull);
        }
        p[i] = v ^ UPDATE_MASK;
    }
}

/* Compare [0, n) elements at @dev with the expected values, in chunks. */
static uint64_t verify_on_host(const uint64_t *dev, uint64_t half, uint64_t n, int updated)
{
    const uint64_t chunk = (64ull << 20) / sizeof(uint64_t);
    uint64_t *buf = (uint64_t *)malloc(chunk * sizeof(uint64_t));
    uint64_t bad = 0;

    if (buf == NULL) {
        fprintf(stderr, "cuda_window: rank %d: out of host memory\n", rank);
        exit(1);
    }
    for (uint64_t off = 0; off < n; off += chunk) {
        uint64_t len = (n - off < chunk) ? n - off : chunk;
        CUDA_CHECK(cudaMemcpy(buf, dev + off, len * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        for (uint64_t k = 0; k < len; k++) {
            uint64_t i = off + k;
            uint64_t want = pattern(i, i < half ? SALT_FIRST : SALT_SECOND);
            if (updated) {
                want ^= UPDATE_MASK;
            }
            if (buf[k] != want) {
                if (bad < 5) {
                    fprintf(stderr, "cuda_window: rank %d: element %llu is %#llx, want %#llx\n",
                            rank, (unsigned long long)i, (unsigned long long)buf[k],
                            (unsigned long long)want);
                }
                bad++;
            }
        }
    }
    free(buf);
    return bad;
}

int main(int argc, char **argv)
{
    size_t capacity = (size_t)(argc > 1 ? strtoull(argv[1], NULL, 0) : 256) << 20;
    ema_init_params_t ip = {};
    ema_win_params_t wp = {};
    cudaPointerAttributes attr;
    unsigned long long *d_errors, h_errors = 0;
    ema_win_stat_t st = {};
    ema_status_t status;
    int size, fail = 0, skip = 0;
    size_t part = 0;
    uint64_t *base = NULL;
    ema_win_h win;

    ip.field_mask    = EMA_INIT_PARAM_FIELD_MEMORY_KIND | EMA_INIT_PARAM_FIELD_DEVICE_MEMORY;
    ip.memory_kind   = EMA_MEMORY_KIND_CUDA;
    ip.device_memory = capacity;
    status = ema_init(&ip);
    if (status == EMA_ERR_UNSUPPORTED) {
        printf("cuda_window: SKIP: the cuda memory kind is not usable here (%s)\n",
               ema_strerror(status));
        return EXIT_SKIP;
    }
    EMA_CHECK(status);
    EMA_CHECK(ema_world_rank(&rank));
    EMA_CHECK(ema_world_size(&size));

    /* Rank 0 takes all of its memory, so growing must borrow; in a world of
     * one there is nobody to borrow from, so it takes half. */
    if (rank == 0) {
        part = (size > 1) ? capacity : capacity / 2;
    }
    wp.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE;
    wp.max_size   = 2 * part;
    EMA_CHECK(ema_win_allocate(part, &wp, (void **)&base, &win));

    if (rank == 0) {
        const uint64_t half = part / sizeof(uint64_t), n = 2 * half;
        const int threads = 256, blocks = 1024;

        /* Run on the GPU that holds the window (EMA picks it per rank). */
        CUDA_CHECK(cudaPointerGetAttributes(&attr, base));
        if (attr.type != cudaMemoryTypeDevice) {
            fprintf(stderr, "cuda_window: rank 0: the window base %p is not device memory\n",
                    (void *)base);
            exit(1);
        }
        CUDA_CHECK(cudaSetDevice(attr.device));
        CUDA_CHECK(cudaMalloc(&d_errors, sizeof(*d_errors)));
        CUDA_CHECK(cudaMemset(d_errors, 0, sizeof(*d_errors)));

        /* 1. a kernel writes the local part through the base pointer */
        fill<<<blocks, threads>>>(base, 0, half, SALT_FIRST);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());

        {
            /* 2. grow to twice the size: the new half comes from peers */
            EMA_CHECK(ema_win_grow(win, 2 * part));
            EMA_CHECK(ema_win_stat(win, &st));
            printf("cuda_window: rank 0: window of %zu MiB: %zu MiB local, %zu MiB borrowed, "
                   "%zu MiB spilled\n", st.size >> 20, st.bytes_local >> 20,
                   st.bytes_borrowed >> 20, st.bytes_spilled >> 20);
            if (st.size != 2 * part) {
                fprintf(stderr, "cuda_window: rank 0: size %zu after growing to %zu\n",
                        st.size, 2 * part);
                fail = 1;
            }
            if (size > 1 && st.bytes_borrowed == 0) {
                fprintf(stderr, "cuda_window: rank 0: grew with no local memory free, but "
                                "nothing was borrowed\n");
                fail = 1;
            }

            /* 3. kernels over the whole range: fill the new half, then read
             *    and update every element, local and borrowed alike */
            fill<<<blocks, threads>>>(base, half, n, SALT_SECOND);
            CUDA_CHECK(cudaGetLastError());
            check_update<<<blocks, threads>>>(base, half, n, d_errors);
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaMemcpy(&h_errors, d_errors, sizeof(h_errors),
                                  cudaMemcpyDeviceToHost));
            if (h_errors != 0) {
                fprintf(stderr, "cuda_window: rank 0: the kernel read %llu wrong elements\n",
                        h_errors);
                fail = 1;
            }

            /* 4. the host checks every element */
            uint64_t bad = verify_on_host(base, half, n, 1);
            if (bad != 0) {
                fprintf(stderr, "cuda_window: rank 0: %llu of %llu elements wrong\n",
                        (unsigned long long)bad, (unsigned long long)n);
                fail = 1;
            }
        }
        CUDA_CHECK(cudaFree(d_errors));
    }

    /* Lenders keep their memory mapped until the borrower is done. */
    EMA_CHECK(ema_barrier());
    EMA_CHECK(ema_win_free(win));
    EMA_CHECK(ema_finalize());

    if (rank == 0) {
        printf("cuda_window: %s (%d ranks, %zu MiB of device memory each)\n",
               fail ? "FAIL" : skip ? "SKIP" : "PASS", size, capacity >> 20);
    }
    return fail ? 1 : skip ? EXIT_SKIP : 0;
}
