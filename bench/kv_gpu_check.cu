/*
 * kv_gpu_check: kv_serving's kernels alone, on cudaMalloc memory, no EMA.
 *
 *   bench/kv_gpu_check [MiB of KV, default 2048] [GB of weights, default 2]
 *
 * Lays out requests with random lengths over shuffled 2 MiB blocks (16
 * tokens of 128 KiB), then checks that:
 *   1. a prefill step writes and reads back every K/V element with 0
 *      mismatches;
 *   2. decode steps (a token written, all read) stay at 0;
 *   3. one word changed in the cache is found (1 mismatch);
 *   4. blocks moved with kv_gpu_copy_blocks and a new table read back at 0;
 * and prints the time of a decode step, the bandwidth of its K/V reads and
 * of a weight pass.  Exit status 0 if every check passed, 77 with no GPU.
 */
#include "kv_gpu.h"
#include "kv_pattern.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOK_BYTES (128u << 10)
#define BLK_BYTES ((size_t)TOK_BYTES * KV_BLOCK_TOKENS)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int fails;

static void expect(const char *what, uint64_t got, uint64_t want)
{
    printf("%-52s %8llu (want %llu) %s\n", what, (unsigned long long)got,
           (unsigned long long)want, got == want ? "ok" : "FAIL");
    fails += got != want;
}

int main(int argc, char **argv)
{
    size_t kv_mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 2048;
    double wgb    = argc > 2 ? atof(argv[2]) : 2;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no GPU\n");
        return 77;
    }
    const uint32_t tok_elems = TOK_BYTES / 4, heads = tok_elems / 2 / 128;
    const uint32_t nreq = 96;
    size_t nblk = (kv_mib << 20) / BLK_BYTES;
    char *base;
    if (cudaMalloc((void **)&base, nblk * BLK_BYTES) != cudaSuccess) {
        printf("FAIL: cudaMalloc of %zu MiB\n", kv_mib);
        return 1;
    }
    cudaMemset(base, 0, nblk * BLK_BYTES);
    if (kv_gpu_init(0, (size_t)(wgb * 1e9), tok_elems, heads, 256, 1u << 20) != 0) {
        printf("FAIL: kv_gpu_init: %s\n", kv_gpu_error());
        return 1;
    }
    /* a shuffled pool of blocks, and requests that fill most of it */
    uint32_t *pool = (uint32_t *)malloc(nblk * sizeof(uint32_t));
    for (size_t i = 0; i < nblk; i++) {
        pool[i] = (uint32_t)i;
    }
    uint64_t s = 42;
    for (size_t i = nblk - 1; i > 0; i--) {
        size_t j = rnd(&s) % (i + 1);
        uint32_t t = pool[i];
        pool[i] = pool[j];
        pool[j] = t;
    }
    kv_gpu_req_t rq[256];
    uint32_t *tab = (uint32_t *)malloc(nblk * sizeof(uint32_t));
    uint32_t len[256], used = 0, ntab = 0, steps = 16;
    size_t per = nblk * KV_BLOCK_TOKENS * 9 / 10 / nreq; /* tokens per request, about */
    uint32_t n = 0;
    for (; n < nreq; n++) {
        len[n] = (uint32_t)(per / 2 + rnd(&s) % per);
        uint32_t nb = (len[n] + steps + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
        if (used + nb > nblk) {
            break;
        }
        rq[n].uid = 0x1000000u + n;
        rq[n].tab_off = ntab;
        rq[n].nblk = nb;
        for (uint32_t b = 0; b < nb; b++) {
            tab[ntab++] = pool[used++];
        }
    }
    printf("%u requests, %u of %zu blocks of %zu KiB, %.1f GB of weights\n", n, used, nblk,
           BLK_BYTES >> 10, wgb);
    uint64_t bad = 0;
    /* 1. prefill */
    for (uint32_t i = 0; i < n; i++) {
        rq[i].w_from = 0;
        rq[i].w_to = rq[i].r_to = len[i];
    }
    double t0 = now_s();
    if (kv_gpu_step(base, BLK_BYTES, rq, n, tab, ntab, 1, &bad) != 0) {
        printf("FAIL: %s\n", kv_gpu_error());
        return 1;
    }
    printf("prefill of %u requests: %.2f ms\n", n, (now_s() - t0) * 1e3);
    expect("1. prefill: mismatches", bad, 0);
    /* 2. decode steps */
    double best = 1e9;
    uint64_t kvb = 0, sum = 0;
    for (uint32_t k = 0; k < steps; k++) {
        kvb = 0;
        for (uint32_t i = 0; i < n; i++) {
            rq[i].w_from = len[i];
            rq[i].w_to = rq[i].r_to = len[i] + 1;
            kvb += (uint64_t)rq[i].r_to * TOK_BYTES;
        }
        t0 = now_s();
        kv_gpu_step(base, BLK_BYTES, rq, n, tab, ntab, 0, &bad);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
        sum += bad;
        for (uint32_t i = 0; i < n; i++) {
            len[i]++;
        }
    }
    expect("2. decode steps: mismatches", sum, 0);
    printf("decode step (attention only): %.3f ms, %.2f GB of K/V read: %.0f GB/s\n",
           best * 1e3, kvb / 1e9, kvb / best / 1e9);
    double wms;
    kv_gpu_time_weights(10, &wms);
    printf("weight pass: %.3f ms, %.0f GB/s\n", wms / 10, wgb / (wms / 10 * 1e-3));
    /* 3. corrupt one word of request 3's block 0, token 5, element 77 */
    uint32_t word = 0xdeadbeefu;
    cudaMemcpy(base + (size_t)tab[rq[3].tab_off] * BLK_BYTES + 5 * TOK_BYTES + 77 * 4, &word, 4,
               cudaMemcpyHostToDevice);
    for (uint32_t i = 0; i < n; i++) {
        rq[i].w_from = rq[i].w_to = len[i];
        rq[i].r_to = len[i];
    }
    kv_gpu_step(base, BLK_BYTES, rq, n, tab, ntab, 0, &bad);
    expect("3. one word changed: mismatches", bad, 1);
    /* repair it */
    uint32_t h = kv_tok_hash(rq[3].uid, 5), w = kv_elem(h, 77);
    cudaMemcpy(base + (size_t)tab[rq[3].tab_off] * BLK_BYTES + 5 * TOK_BYTES + 77 * 4, &w, 4,
               cudaMemcpyHostToDevice);
    /* 4. move the first 32 blocks of the table to free ones (if any) */
    uint32_t src[64], dst[64], m = 0;
    for (uint32_t k = 0; k < 32 && used + k < nblk && k < ntab; k++) {
        src[m] = tab[k];
        dst[m] = pool[used + k];
        tab[k] = dst[m];
        m++;
    }
    if (m == 0) {
        printf("4. no free block to move to: skipped\n");
    } else {
        if (kv_gpu_copy_blocks(base, BLK_BYTES, src, dst, m) != 0) {
            printf("FAIL: %s\n", kv_gpu_error());
            return 1;
        }
        cudaMemset(base + (size_t)src[0] * BLK_BYTES, 0, BLK_BYTES); /* the old copy goes */
        kv_gpu_step(base, BLK_BYTES, rq, n, tab, ntab, 0, &bad);
        expect("4. after moving blocks: mismatches", bad, 0);
    }
    kv_gpu_fini();
    cudaFree(base);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
