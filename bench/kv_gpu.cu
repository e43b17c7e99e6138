/*
 * kv_serving's kernels (cuda memory kind): see kv_gpu.h for the contract.
 *
 * A token's K/V is tok_elems 32-bit words, K[H][D] then V[H][D] with
 * D = 128, stored 16 tokens to a block, blocks anywhere in the window (the
 * block table).  The window's memory is EMA's: local VMM memory or a
 * peer's, mapped at the owner's base pointer, so these kernels read
 * borrowed pages as they read local ones.
 *
 * Paged attention (decode): one CUDA block of 4 warps per (request, head,
 * split of the positions).  A warp takes one position at a time: each lane
 * loads 4 K and 4 V words (16 B each, 512 B per warp: coalesced), checks
 * all 8 against the pattern, the warp sums q.k into a score, and an online
 * softmax accumulates V.  The 4 warps merge in shared memory; a second
 * kernel merges the splits (flash-decoding).  Scores and values are the
 * words' top 16 bits as floats in [-0.5, 0.5).
 *
 * The CUDA runtime is linked statically and loads the driver at run time,
 * so the binary runs (host kind) where there is no GPU.
 */
#define KV_GPU 1
#include "kv_gpu.h"
#include "kv_pattern.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define KV_D       128 /* words per head */
#define KV_WARPS   4
#define KV_MAXSPLIT 8
#define KV_SPLIT_TOKENS 256

static char kv_gpu_errbuf[256];
static cudaStream_t kv_stream;
static uint32_t kv_tok_elems, kv_heads, kv_max_reqs, kv_max_tab;
static kv_gpu_req_t *h_req, *d_req;
static uint32_t *h_tab, *d_tab, *h_pref, *d_pref;
static unsigned long long *d_bad, *h_bad;
static float *d_part, *d_out;
static uint4 *d_w;
static __half *d_x;
static float *d_y;
static size_t kv_w_rows, kv_w_cols; /* cols in halves */

static int kv_gpu_fail(const char *what, cudaError_t e)
{
    snprintf(kv_gpu_errbuf, sizeof(kv_gpu_errbuf), "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

#define GPU_CALL(_call) \
    do { \
        cudaError_t e_ = (_call); \
        if (e_ != cudaSuccess) return kv_gpu_fail(#_call, e_); \
    } while (0)

extern "C" const char *kv_gpu_error(void)
{
    return kv_gpu_errbuf;
}

__device__ __forceinline__ float kv_val(uint32_t w)
{
    return (float)(w >> 16) * (1.0f / 65536.0f) - 0.5f;
}

/* the query of head @h, dimension @d: any fixed values */
__device__ __forceinline__ float kv_q(uint32_t uid, uint32_t h, uint32_t d)
{
    return kv_val(kv_tok_hash(uid ^ 0x5bd1e995u, h * KV_D + d));
}

/* 1. write the K/V of positions [w_from, w_to) of every request: one
 * CUDA block per token (pref: prefix sums of the tokens written) */
__global__ void kv_write(char *base, size_t blk_bytes, size_t tok_bytes, uint32_t tok_elems,
                         const kv_gpu_req_t *rq, uint32_t n, const uint32_t *tab,
                         const uint32_t *pref)
{
    uint32_t t = blockIdx.x;
    uint32_t lo = 0, hi = n; /* the request: pref[i] <= t < pref[i + 1] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (pref[mid] <= t) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    const kv_gpu_req_t r = rq[lo];
    uint32_t pos = r.w_from + (t - pref[lo]);
    uint32_t blk = tab[r.tab_off + pos / KV_BLOCK_TOKENS];
    uint4 *tok = (uint4 *)(base + (size_t)blk * blk_bytes + (size_t)(pos % KV_BLOCK_TOKENS) * tok_bytes);
    uint32_t h = kv_tok_hash(r.uid, pos);
    for (uint32_t v = threadIdx.x; v < tok_elems / 4; v += blockDim.x) {
        uint32_t j = 4 * v;
        tok[v] = make_uint4(kv_elem(h, j), kv_elem(h, j + 1), kv_elem(h, j + 2), kv_elem(h, j + 3));
    }
}

/* 2. attention: grid (n, heads, splits), KV_WARPS warps */
__global__ void __launch_bounds__(32 * KV_WARPS)
kv_attend(const char *base, size_t blk_bytes, size_t tok_bytes, uint32_t heads,
          const kv_gpu_req_t *rq, const uint32_t *tab, uint32_t splits, float *part,
          unsigned long long *bad)
{
    __shared__ float s_m[KV_WARPS], s_l[KV_WARPS], s_o[KV_WARPS][KV_D];
    const kv_gpu_req_t r = rq[blockIdx.x];
    const uint32_t h = blockIdx.y, s = blockIdx.z;
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t len = r.r_to, chunk = (len + splits - 1) / splits;
    const uint32_t p0 = s * chunk, p1 = min(len, p0 + chunk);
    const uint32_t hd = heads * KV_D;
    float q[4], o[4] = {0, 0, 0, 0}, m = -INFINITY, l = 0;
    unsigned long long nbad = 0;

    for (int c = 0; c < 4; c++) {
        q[c] = kv_q(r.uid, h, lane * 4 + c);
    }
    for (uint32_t pos = p0 + warp; pos < p1; pos += KV_WARPS) {
        uint32_t blk = tab[r.tab_off + pos / KV_BLOCK_TOKENS];
        const char *tok = base + (size_t)blk * blk_bytes + (size_t)(pos % KV_BLOCK_TOKENS) * tok_bytes;
        uint4 k = ((const uint4 *)(tok + (size_t)h * KV_D * 4))[lane];
        uint4 v = ((const uint4 *)(tok + ((size_t)hd + (size_t)h * KV_D) * 4))[lane];
        uint32_t th = kv_tok_hash(r.uid, pos);
        uint32_t jk = h * KV_D + lane * 4, jv = hd + jk;
        nbad += (k.x != kv_elem(th, jk)) + (k.y != kv_elem(th, jk + 1)) +
                (k.z != kv_elem(th, jk + 2)) + (k.w != kv_elem(th, jk + 3)) +
                (v.x != kv_elem(th, jv)) + (v.y != kv_elem(th, jv + 1)) +
                (v.z != kv_elem(th, jv + 2)) + (v.w != kv_elem(th, jv + 3));
        float sc = q[0] * kv_val(k.x) + q[1] * kv_val(k.y) + q[2] * kv_val(k.z) + q[3] * kv_val(k.w);
        for (int off = 16; off > 0; off /= 2) {
            sc += __shfl_xor_sync(0xffffffffu, sc, off);
        }
        sc *= 0.0884f; /* 1 / sqrt(128) */
        float mn = fmaxf(m, sc), scale = __expf(m - mn), pw = __expf(sc - mn);
        l = l * scale + pw;
        o[0] = o[0] * scale + pw * kv_val(v.x);
        o[1] = o[1] * scale + pw * kv_val(v.y);
        o[2] = o[2] * scale + pw * kv_val(v.z);
        o[3] = o[3] * scale + pw * kv_val(v.w);
        m = mn;
    }
    for (int off = 16; off > 0; off /= 2) {
        nbad += __shfl_xor_sync(0xffffffffu, nbad, off);
    }
    if (lane == 0) {
        if (nbad) {
            atomicAdd(bad, nbad);
        }
        s_m[warp] = m;
        s_l[warp] = l;
    }
    for (int c = 0; c < 4; c++) {
        s_o[warp][lane * 4 + c] = o[c];
    }
    __syncthreads();
    /* merge the warps: thread d of the block takes dimension d */
    float *out = part + (((size_t)blockIdx.x * heads + h) * splits + s) * (KV_D + 2);
    for (uint32_t d = threadIdx.x; d < KV_D; d += blockDim.x) {
        float mm = -INFINITY, ll = 0, oo = 0;
        for (int w = 0; w < KV_WARPS; w++) {
            mm = fmaxf(mm, s_m[w]);
        }
        for (int w = 0; w < KV_WARPS; w++) {
            float f = (s_m[w] == -INFINITY) ? 0 : __expf(s_m[w] - mm);
            ll += s_l[w] * f;
            oo += s_o[w][d] * f;
        }
        out[2 + d] = oo;
        if (d == 0) {
            out[0] = mm;
            out[1] = ll;
        }
    }
}

/* 2b. merge the splits: grid (n, heads), KV_D threads */
__global__ void kv_combine(const float *part, uint32_t heads, uint32_t splits, float *out)
{
    const uint32_t i = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const float *p = part + ((size_t)i * heads + h) * splits * (KV_D + 2);
    float mm = -INFINITY, ll = 0, oo = 0;
    for (uint32_t s = 0; s < splits; s++) {
        mm = fmaxf(mm, p[s * (KV_D + 2)]);
    }
    for (uint32_t s = 0; s < splits; s++) {
        float ms = p[s * (KV_D + 2)];
        float f  = (ms == -INFINITY) ? 0 : __expf(ms - mm);
        ll += p[s * (KV_D + 2) + 1] * f;
        oo += p[s * (KV_D + 2) + 2 + d] * f;
    }
    out[((size_t)i * heads + h) * KV_D + d] = ll > 0 ? oo / ll : 0;
}

/* 3. y = W x over the local weights: one CUDA block per row */
__global__ void kv_matvec(const uint4 *w, const __half *x, size_t cols, float *y)
{
    __shared__ float red[256 / 32];
    const size_t row = blockIdx.x, nv = cols / 8;
    const uint4 *wr = w + row * nv;
    const uint4 *xv = (const uint4 *)x;
    float acc = 0;
    for (size_t k = threadIdx.x; k < nv; k += blockDim.x) {
        uint4 a = wr[k], b = xv[k];
        const __half2 *ah = (const __half2 *)&a, *bh = (const __half2 *)&b;
        for (int c = 0; c < 4; c++) {
            float2 fa = __half22float2(ah[c]), fb = __half22float2(bh[c]);
            acc += fa.x * fb.x + fa.y * fb.y;
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        acc += __shfl_xor_sync(0xffffffffu, acc, off);
    }
    if (threadIdx.x % 32 == 0) {
        red[threadIdx.x / 32] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < (int)(blockDim.x / 32); i++) {
            s += red[i];
        }
        y[row] = s;
    }
}

extern "C" int kv_gpu_init(int device, size_t weight_bytes, uint32_t tok_elems, uint32_t heads,
                           uint32_t max_reqs, uint32_t max_tab)
{
    if (tok_elems != 2 * heads * KV_D) {
        snprintf(kv_gpu_errbuf, sizeof(kv_gpu_errbuf),
                 "a token of %u words is not 2 x %u heads x %d", tok_elems, heads, KV_D);
        return -1;
    }
    GPU_CALL(cudaSetDevice(device < 0 ? 0 : device));
    GPU_CALL(cudaStreamCreateWithFlags(&kv_stream, cudaStreamNonBlocking));
    kv_tok_elems = tok_elems;
    kv_heads     = heads;
    kv_max_reqs  = max_reqs;
    kv_max_tab   = max_tab;
    GPU_CALL(cudaHostAlloc((void **)&h_req, max_reqs * sizeof(kv_gpu_req_t), 0));
    GPU_CALL(cudaHostAlloc((void **)&h_tab, (size_t)max_tab * sizeof(uint32_t), 0));
    GPU_CALL(cudaHostAlloc((void **)&h_pref, ((size_t)max_reqs + 1) * sizeof(uint32_t), 0));
    GPU_CALL(cudaHostAlloc((void **)&h_bad, sizeof(*h_bad), 0));
    GPU_CALL(cudaMalloc((void **)&d_req, max_reqs * sizeof(kv_gpu_req_t)));
    GPU_CALL(cudaMalloc((void **)&d_tab, (size_t)max_tab * sizeof(uint32_t)));
    GPU_CALL(cudaMalloc((void **)&d_pref, ((size_t)max_reqs + 1) * sizeof(uint32_t)));
    GPU_CALL(cudaMalloc((void **)&d_bad, sizeof(*d_bad)));
    GPU_CALL(cudaMemset(d_bad, 0, sizeof(*d_bad)));
    GPU_CALL(cudaMalloc((void **)&d_part,
                        (size_t)max_reqs * heads * KV_MAXSPLIT * (KV_D + 2) * sizeof(float)));
    GPU_CALL(cudaMalloc((void **)&d_out, (size_t)max_reqs * heads * KV_D * sizeof(float)));
    /* the weights: rows of cols halves, cols a multiple of 8 */
    kv_w_rows = 8192;
    kv_w_cols = weight_bytes / 2 / kv_w_rows / 8 * 8;
    if (kv_w_cols < 8) {
        kv_w_cols = 8;
    }
    GPU_CALL(cudaMalloc((void **)&d_w, kv_w_rows * kv_w_cols * 2));
    GPU_CALL(cudaMalloc((void **)&d_x, kv_w_cols * 2));
    GPU_CALL(cudaMalloc((void **)&d_y, kv_w_rows * sizeof(float)));
    GPU_CALL(cudaMemset(d_w, 0x11, kv_w_rows * kv_w_cols * 2)); /* small halves */
    GPU_CALL(cudaMemset(d_x, 0x11, kv_w_cols * 2));
    GPU_CALL(cudaDeviceSynchronize());
    return 0;
}

extern "C" void kv_gpu_fini(void)
{
    cudaStreamSynchronize(kv_stream);
    cudaFree(d_req);
    cudaFree(d_tab);
    cudaFree(d_pref);
    cudaFree(d_bad);
    cudaFree(d_part);
    cudaFree(d_out);
    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_y);
    cudaFreeHost(h_req);
    cudaFreeHost(h_tab);
    cudaFreeHost(h_pref);
    cudaFreeHost(h_bad);
    cudaStreamDestroy(kv_stream);
}

static int kv_weights(int passes)
{
    for (int i = 0; i < passes; i++) {
        kv_matvec<<<(unsigned)kv_w_rows, 256, 0, kv_stream>>>(d_w, d_x, kv_w_cols, d_y);
    }
    GPU_CALL(cudaGetLastError());
    return 0;
}

extern "C" int kv_gpu_step(char *base, size_t blk_bytes, const kv_gpu_req_t *rq, uint32_t n,
                           const uint32_t *tab, uint32_t ntab, int weight_passes,
                           uint64_t *mismatch_p)
{
    size_t tok_bytes = (size_t)kv_tok_elems * 4;
    uint32_t maxlen = 0, nwrite = 0;

    if (n > kv_max_reqs || ntab > kv_max_tab) {
        snprintf(kv_gpu_errbuf, sizeof(kv_gpu_errbuf), "a batch of %u requests, %u blocks: "
                 "more than the %u, %u set up", n, ntab, kv_max_reqs, kv_max_tab);
        return -1;
    }
    h_pref[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        h_req[i] = rq[i];
        nwrite += rq[i].w_to - rq[i].w_from;
        h_pref[i + 1] = nwrite;
        maxlen = rq[i].r_to > maxlen ? rq[i].r_to : maxlen;
    }
    memcpy(h_tab, tab, (size_t)ntab * sizeof(uint32_t));
    if (n > 0) {
        GPU_CALL(cudaMemcpyAsync(d_req, h_req, n * sizeof(kv_gpu_req_t), cudaMemcpyHostToDevice,
                                 kv_stream));
        GPU_CALL(cudaMemcpyAsync(d_tab, h_tab, (size_t)ntab * sizeof(uint32_t),
                                 cudaMemcpyHostToDevice, kv_stream));
        GPU_CALL(cudaMemcpyAsync(d_pref, h_pref, (n + 1) * sizeof(uint32_t),
                                 cudaMemcpyHostToDevice, kv_stream));
        if (nwrite > 0) {
            kv_write<<<nwrite, 256, 0, kv_stream>>>(base, blk_bytes, tok_bytes, kv_tok_elems,
                                                    d_req, n, d_tab, d_pref);
            GPU_CALL(cudaGetLastError());
        }
        uint32_t splits = (maxlen + KV_SPLIT_TOKENS - 1) / KV_SPLIT_TOKENS;
        splits = splits < 1 ? 1 : splits > KV_MAXSPLIT ? KV_MAXSPLIT : splits;
        kv_attend<<<dim3(n, kv_heads, splits), 32 * KV_WARPS, 0, kv_stream>>>(
            base, blk_bytes, tok_bytes, kv_heads, d_req, d_tab, splits, d_part, d_bad);
        GPU_CALL(cudaGetLastError());
        kv_combine<<<dim3(n, kv_heads), KV_D, 0, kv_stream>>>(d_part, kv_heads, splits, d_out);
        GPU_CALL(cudaGetLastError());
    }
    if (kv_weights(weight_passes) != 0) {
        return -1;
    }
    GPU_CALL(cudaMemcpyAsync(h_bad, d_bad, sizeof(*h_bad), cudaMemcpyDeviceToHost, kv_stream));
    GPU_CALL(cudaMemsetAsync(d_bad, 0, sizeof(*d_bad), kv_stream));
    GPU_CALL(cudaStreamSynchronize(kv_stream));
    *mismatch_p = *h_bad;
    return 0;
}

extern "C" int kv_gpu_copy_blocks(char *base, size_t blk_bytes, const uint32_t *src,
                                  const uint32_t *dst, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        GPU_CALL(cudaMemcpyAsync(base + (size_t)dst[i] * blk_bytes,
                                 base + (size_t)src[i] * blk_bytes, blk_bytes,
                                 cudaMemcpyDeviceToDevice, kv_stream));
    }
    GPU_CALL(cudaStreamSynchronize(kv_stream));
    return 0;
}

extern "C" int kv_gpu_time_weights(int passes, double *ms_p)
{
    cudaEvent_t a, b;
    float ms = 0;
    GPU_CALL(cudaEventCreate(&a));
    GPU_CALL(cudaEventCreate(&b));
    GPU_CALL(cudaEventRecord(a, kv_stream));
    if (kv_weights(passes) != 0) {
        return -1;
    }
    GPU_CALL(cudaEventRecord(b, kv_stream));
    GPU_CALL(cudaEventSynchronize(b));
    GPU_CALL(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    *ms_p = ms;
    return 0;
}
