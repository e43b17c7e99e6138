/*
 * kv_serving: LLM serving with the KV cache in an EMA elastic window, one
 * engine per rank, under a load that moves between ranks.
 *
 *   mpirun -n 4 bench/kv_serving --config static|elastic|double|oracle
 *          [--scenario rotating|stationary|allbusy] [--seed N] [--out DIR] ...
 *
 * One run is one configuration and one seed: each configuration needs its
 * own EMA_DEVICE_MEMORY, so bench/kv_serving.py launches one mpirun per
 * (configuration, seed), in a random order, and gathers the CSV files.
 * `kv_serving --help` lists the options; doc/kv_serving.md describes the
 * model and the results.
 *
 * The engine, as vLLM's (v0) scheduler:
 *  - requests arrive (kv_load.c) into a FCFS queue;
 *  - a step is a prefill step when the head of the queue can be admitted:
 *    requests are admitted in order while their prompt fits the step's
 *    token budget and their KV blocks can be had with a free-block
 *    watermark left over (the head blocks the rest: no overtaking); the
 *    prefill writes the K/V of every prompt token and yields the first
 *    output token;
 *  - otherwise a decode step: every running request writes the K/V of its
 *    last token (a new block each 16 tokens) and reads all of its K/V
 *    (attention), yielding one token;
 *  - when a decode step lacks blocks (and, elastic, the window cannot
 *    grow) the youngest running request is preempted: its blocks are
 *    freed, it goes back to the head of the queue, and is later prefilled
 *    again over its prompt and the tokens generated so far (recompute,
 *    the generated tokens are kept);
 *  - lenders' pressure (bytes_wanted, kv_cache.c) preempts the youngest
 *    requests, only for the blocks the part lacks to give back.
 *
 * Two kinds of step:
 *  - host kind: a CPU loop writes and reads every K/V element through the
 *    block tables and checks it; the step takes the modelled time of a GPU
 *    step (kv_model_step) plus the measured time of the EMA calls made in
 *    it, on a virtual clock that the ranks keep in step (kv_shm.c), so a
 *    loaded machine changes the time taken, not the result;
 *  - cuda kind: the kernels of kv_gpu.cu on the window's device memory
 *    (paged attention with checks, and a weight-streaming mat-vec over a
 *    few GB of local memory), timed by the wall clock.
 * Either way the window is pinned (ema_win_acquire) around the step.
 */
#define _GNU_SOURCE /* qsort_r */
#include "kv_serving.h"
#include "kv_gpu.h"
#include "kv_pattern.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *kv_cfg_name[KV_NCFG] = {"static", "elastic", "double", "oracle"};
const char *kv_scn_name[KV_NSCN] = {"rotating", "stationary", "allbusy"};

typedef struct {
    kv_params_t p;
    int         rank, nranks, gpu;
    kv_load_t   ld;
    kv_req_t   *rq;
    size_t      nrq, next;
    kv_cache_t *kc;
    kv_stats_t *st;
    uint32_t   *wq;        /* waiting: a ring of request indices */
    size_t      wq_head, wq_len, wq_cap;
    uint32_t   *run;       /* running, in admission order */
    size_t      nrun;
    uint32_t   *batch;
    size_t      nbatch;
    uint32_t   *victims;
    double      vt, t0, next_sample;
    uint64_t    corrupt;
    uint32_t    tok_elems;
    size_t      wm;        /* watermark, blocks */
    /* cuda */
    kv_gpu_req_t *greq;
    uint32_t     *gtab;
    size_t        gtab_cap;
} kv_engine_t;

static int g_rank;

static void kv_die(const char *what, ema_status_t s)
{
    fprintf(stderr, "kv_serving rank %d: %s: %s\n", g_rank, what, ema_strerror(s));
    exit(1);
}
#define CHECK(_call) \
    do { \
        ema_status_t s_ = (_call); \
        if (s_ != EMA_SUCCESS) { \
            kv_die(#_call, s_); \
        } \
    } while (0)

/* --- queues ------------------------------------------------------------------ */

static void wq_push_back(kv_engine_t *e, uint32_t r)
{
    e->wq[(e->wq_head + e->wq_len++) % e->wq_cap] = r;
}

static void wq_push_front(kv_engine_t *e, uint32_t r)
{
    e->wq_head = (e->wq_head + e->wq_cap - 1) % e->wq_cap;
    e->wq[e->wq_head] = r;
    e->wq_len++;
}

static uint32_t wq_front(kv_engine_t *e)
{
    return e->wq[e->wq_head];
}

static void wq_pop(kv_engine_t *e)
{
    e->wq_head = (e->wq_head + 1) % e->wq_cap;
    e->wq_len--;
}

static void run_remove(kv_engine_t *e, uint32_t r)
{
    for (size_t i = 0; i < e->nrun; i++) {
        if (e->run[i] == r) {
            memmove(e->run + i, e->run + i + 1, (e->nrun - i - 1) * sizeof(uint32_t));
            e->nrun--;
            return;
        }
    }
}

static void blk_push(kv_req_t *r, uint32_t b)
{
    if (r->nblk == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 16;
        r->blk = realloc(r->blk, r->cap * sizeof(uint32_t));
    }
    r->blk[r->nblk++] = b;
}

static void req_free_blocks(kv_engine_t *e, kv_req_t *r)
{
    for (uint32_t k = 0; k < r->nblk; k++) {
        kv_cache_free(e->kc, r->blk[k]);
    }
    r->nblk = 0;
}

/* Preempt by recompute: the KV goes, the generated tokens stay. */
static void preempt(kv_engine_t *e, uint32_t i, double now)
{
    kv_req_t *r = &e->rq[i];
    req_free_blocks(e, r);
    kv_stats_preempt(e->st, now, r->kv_len);
    r->recomputed += r->kv_len;
    r->kv_len = 0;
    r->npreempt++;
    r->state = KV_REQ_WAITING;
    run_remove(e, i);
    wq_push_front(e, i);
}

static uint32_t blocks_for(uint32_t tokens)
{
    return (tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
}

/* --- the work of a step ------------------------------------------------------------- */

/* CPU: write the K/V of [w_from, w_to), then read and check [0, r_to). */
static void cpu_attend(kv_engine_t *e, const kv_req_t *r, uint32_t w_from, uint32_t w_to,
                       uint32_t r_to)
{
    char *base = kv_cache_base(e->kc);
    size_t bb  = kv_cache_blk_bytes(e->kc), tb = e->p.tok_bytes;
    uint32_t ne = e->tok_elems;
    uint64_t bad = 0;

    for (uint32_t pos = w_from; pos < w_to; pos++) {
        uint32_t *t = (uint32_t *)(base + (size_t)r->blk[pos / KV_BLOCK_TOKENS] * bb +
                                   (size_t)(pos % KV_BLOCK_TOKENS) * tb);
        uint32_t h = kv_tok_hash(r->uid, pos);
        for (uint32_t j = 0; j < ne; j++) {
            t[j] = kv_elem(h, j);
        }
    }
    for (uint32_t pos = 0; pos < r_to; pos++) {
        const uint32_t *t = (const uint32_t *)(base + (size_t)r->blk[pos / KV_BLOCK_TOKENS] * bb +
                                               (size_t)(pos % KV_BLOCK_TOKENS) * tb);
        uint32_t h = kv_tok_hash(r->uid, pos);
        for (uint32_t j = 0; j < ne; j++) {
            bad += t[j] != kv_elem(h, j);
        }
    }
    e->corrupt += bad;
}

/* Run the batch: prefill (@prefill) or decode; returns the K/V tokens read. */
static uint64_t execute(kv_engine_t *e, int prefill, uint32_t ntok)
{
    uint64_t kv = 0;

    if (!e->gpu) {
        for (size_t i = 0; i < e->nbatch; i++) {
            const kv_req_t *r = &e->rq[e->batch[i]];
            uint32_t from = prefill ? 0 : r->kv_len;
            uint32_t to   = prefill ? r->prompt + r->gen : r->kv_len + 1;
            cpu_attend(e, r, from, to, to);
            kv += to;
        }
        return kv;
    }
    size_t ntab = 0;
    for (size_t i = 0; i < e->nbatch; i++) {
        ntab += e->rq[e->batch[i]].nblk;
    }
    if (ntab > e->gtab_cap) {
        e->gtab_cap = 2 * ntab;
        e->gtab = realloc(e->gtab, e->gtab_cap * sizeof(uint32_t));
    }
    ntab = 0;
    for (size_t i = 0; i < e->nbatch; i++) {
        const kv_req_t *r = &e->rq[e->batch[i]];
        kv_gpu_req_t *g = &e->greq[i];
        g->uid     = r->uid;
        g->w_from  = prefill ? 0 : r->kv_len;
        g->w_to    = prefill ? r->prompt + r->gen : r->kv_len + 1;
        g->r_to    = g->w_to;
        g->tab_off = (uint32_t)ntab;
        g->nblk    = r->nblk;
        memcpy(e->gtab + ntab, r->blk, r->nblk * sizeof(uint32_t));
        ntab += r->nblk;
        kv += g->r_to;
    }
    /* a decode step streams the weights once; a prefill is a matrix
     * product, about one pass per 256 tokens on an H200 */
    int passes = prefill ? (int)((ntok + 255) / 256) : 1;
    uint64_t bad = 0;
    if (kv_gpu_step(kv_cache_base(e->kc), kv_cache_blk_bytes(e->kc), e->greq,
                    (uint32_t)e->nbatch, e->gtab, (uint32_t)ntab, passes, &bad) != 0) {
        fprintf(stderr, "kv_serving rank %d: %s\n", e->rank, kv_gpu_error());
        exit(1);
    }
    e->corrupt += bad;
    return kv;
}

/* --- scheduling ---------------------------------------------------------------------- */

/* Admit from the head of the queue; returns the prompt tokens (0: none). */
static uint32_t schedule_prefill(kv_engine_t *e, double now)
{
    uint32_t ntok = 0;
    e->nbatch = 0;
    while (e->wq_len > 0 && e->nrun + e->nbatch < (size_t)e->p.max_seqs) {
        uint32_t i  = wq_front(e);
        kv_req_t *r = &e->rq[i];
        uint32_t tokens = r->prompt + r->gen;
        if (e->nbatch > 0 && ntok + tokens > e->p.max_prefill_tokens) {
            break;
        }
        uint32_t need = blocks_for(tokens);
        if (kv_cache_reserve(e->kc, need + e->wm, now) != 0) {
            break; /* FCFS: the head waits, and so does everyone behind it */
        }
        for (uint32_t k = 0; k < need; k++) {
            blk_push(r, kv_cache_alloc(e->kc, (int32_t)i));
        }
        wq_pop(e);
        r->state = KV_REQ_RUNNING;
        e->batch[e->nbatch++] = i;
        ntok += tokens;
    }
    return ntok;
}

/* The decode batch: every running request, with a new block for each whose
 * last block is full. */
static void schedule_decode(kv_engine_t *e, double now)
{
    for (;;) {
        size_t need = 0;
        for (size_t i = 0; i < e->nrun; i++) {
            kv_req_t *r = &e->rq[e->run[i]];
            need += r->kv_len == r->nblk * KV_BLOCK_TOKENS;
        }
        if (need == 0 || kv_cache_reserve(e->kc, need, now) == 0) {
            break;
        }
        /* out of blocks: preempt the youngest (the latest to arrive) */
        size_t y = 0;
        for (size_t i = 1; i < e->nrun; i++) {
            if (e->rq[e->run[i]].arrive > e->rq[e->run[y]].arrive) {
                y = i;
            }
        }
        preempt(e, e->run[y], now);
    }
    e->nbatch = 0;
    for (size_t i = 0; i < e->nrun; i++) {
        uint32_t ri = e->run[i];
        kv_req_t *r = &e->rq[ri];
        if (r->kv_len == r->nblk * KV_BLOCK_TOKENS) {
            blk_push(r, kv_cache_alloc(e->kc, (int32_t)ri));
        }
        e->batch[e->nbatch++] = ri;
    }
}

static int cmp_younger_first(const void *a, const void *b, void *arg)
{
    const kv_req_t *rq = arg;
    double x = rq[*(const uint32_t *)a].arrive, y = rq[*(const uint32_t *)b].arrive;
    return (x < y) - (x > y);
}

static void sample(kv_engine_t *e, double now)
{
    size_t size, local, borrowed, lent;
    kv_cache_mem(e->kc, &size, &local, &borrowed, &lent);
    kv_stats_sample(e->st, now, size, local, borrowed,
                    kv_cache_used_blocks(e->kc) * kv_cache_blk_bytes(e->kc), lent, e->nrun,
                    e->wq_len);
}

static double clock_now(kv_engine_t *e)
{
    return e->gpu ? kv_now() - e->t0 : e->vt;
}

/* The engine's loop, until the drain is over. */
static void serve(kv_engine_t *e)
{
    const kv_load_t *ld = &e->ld;
    double t_stop = ld->end_s + e->p.drain_s;

    for (;;) {
        if (!e->gpu) {
            kv_vclock_publish(e->rank, e->vt);
            kv_vclock_wait(e->rank, e->vt, 0);
        }
        double now = clock_now(e), wall0 = kv_now();
        while (e->next < e->nrq && e->rq[e->next].arrive <= now) {
            e->rq[e->next].state = KV_REQ_WAITING;
            wq_push_back(e, (uint32_t)e->next);
            e->next++;
        }
        if (now >= t_stop ||
            (now >= ld->end_s && e->next == e->nrq && e->wq_len == 0 && e->nrun == 0)) {
            break;
        }
        if (now >= e->next_sample) {
            sample(e, now);
            e->next_sample = now + e->p.sample_s;
        }
        /* lenders' pressure, the oracle's debt, shrinking */
        size_t nv = kv_cache_maintain(e->kc, e->rq, now, e->wq_len == 0, e->victims, e->nrq);
        if (nv > 0) {
            qsort_r(e->victims, nv, sizeof(uint32_t), cmp_younger_first, e->rq);
            for (size_t i = 0; i < nv; i++) {
                if (e->rq[e->victims[i]].state == KV_REQ_RUNNING) {
                    preempt(e, e->victims[i], now);
                }
            }
        }
        kv_cache_finish_giveback(e->kc, e->rq);

        kv_cache_pin(e->kc);
        uint32_t ntok = schedule_prefill(e, now);
        int prefill   = e->nbatch > 0;
        if (!prefill) {
            schedule_decode(e, now);
            ntok = (uint32_t)e->nbatch;
        }
        if (e->nbatch == 0) {
            kv_cache_unpin(e->kc);
            /* idle: on to the next arrival (a little at a time, so that
             * pressure and sampling go on) */
            double ema_s = kv_cache_take_ema_us(e->kc) * 1e-6;
            if (e->gpu) {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            } else {
                double next = e->next < e->nrq ? e->rq[e->next].arrive : t_stop;
                next = fmin(next, e->vt + 0.01);
                e->vt = fmax(next, e->vt + 0.0005) + ema_s;
            }
            continue;
        }
        uint64_t kv = execute(e, prefill, ntok);
        kv_cache_unpin(e->kc);
        double ema_us = kv_cache_take_ema_us(e->kc);
        double dt;
        if (e->gpu) {
            dt = kv_now() - wall0;
        } else {
            dt = kv_model_step(&e->p, prefill, ntok, kv) + ema_us * 1e-6;
            e->vt += dt;
        }
        double t_end = clock_now(e);
        size_t size, local, borrowed, lent;
        kv_cache_mem(e->kc, &size, &local, &borrowed, &lent);
        kv_stats_step(e->st, t_end, prefill, (uint32_t)e->nbatch, ntok, kv, dt, ema_us,
                      size ? (double)borrowed / (double)size : 0);
        kv_stats_tokens(e->st, t_end, (uint32_t)e->nbatch);
        for (size_t i = 0; i < e->nbatch; i++) {
            uint32_t ri = e->batch[i];
            kv_req_t *r = &e->rq[ri];
            if (prefill) {
                r->kv_len = r->prompt + r->gen;
                if (r->gen == 0) {
                    r->t_first = t_end;
                }
                e->run[e->nrun++] = ri;
            } else {
                r->kv_len++;
            }
            r->gen++;
            if (r->gen >= r->output) {
                r->state  = KV_REQ_DONE;
                r->t_done = t_end;
                req_free_blocks(e, r);
                run_remove(e, ri);
            }
        }
    }
    if (!e->gpu) {
        kv_vclock_publish(e->rank, 1e300); /* nobody waits for us any more */
    }
}

/* --- calibration (cuda kind) ---------------------------------------------------- */

/* Fit the step model of this machine: every rank fills its cache with
 * requests (all ranks at once, as in a run), times decode steps at two KV
 * sizes and a prefill step, and rank 0 prints the averages. */
static void calibrate(kv_engine_t *e)
{
    double fill[2] = {0.05, 0.9}, ms[2] = {0, 0}, pf_ms = 0, pf_tok = 1;
    size_t c = kv_cache_c_blocks(e->kc);
    uint32_t nreq = 64;

    for (int k = 0; k < 2; k++) {
        uint32_t len = (uint32_t)(fill[k] * (double)c * KV_BLOCK_TOKENS / nreq);
        len = len < 2 ? 2 : len;
        e->nrun = 0;
        for (uint32_t i = 0; i < nreq && i < e->nrq; i++) {
            kv_req_t *r = &e->rq[i];
            req_free_blocks(e, r);
            r->prompt = len;
            r->gen    = 0;
            r->kv_len = 0;
        }
        /* prefill them, in one step */
        kv_cache_pin(e->kc);
        e->nbatch = 0;
        uint32_t ntok = 0;
        for (uint32_t i = 0; i < nreq && i < e->nrq; i++) {
            kv_req_t *r = &e->rq[i];
            if (kv_cache_reserve(e->kc, blocks_for(len + 8), 0) != 0) {
                break;
            }
            for (uint32_t b = 0; b < blocks_for(len + 8); b++) {
                blk_push(r, kv_cache_alloc(e->kc, (int32_t)i));
            }
            e->batch[e->nbatch++] = i;
            ntok += len;
        }
        CHECK(ema_barrier());
        double t0 = kv_now();
        execute(e, 1, ntok);
        double t1 = kv_now();
        kv_cache_unpin(e->kc);
        if (k == 1) {
            pf_ms  = (t1 - t0) * 1e3;
            pf_tok = ntok ? ntok : 1;
        }
        for (size_t i = 0; i < e->nbatch; i++) {
            e->rq[e->batch[i]].kv_len = len;
        }
        CHECK(ema_barrier());
        const int steps = 8;
        double t2 = kv_now();
        for (int s = 0; s < steps; s++) {
            kv_cache_pin(e->kc);
            execute(e, 0, (uint32_t)e->nbatch);
            kv_cache_unpin(e->kc);
            for (size_t i = 0; i < e->nbatch; i++) {
                e->rq[e->batch[i]].kv_len++;
            }
        }
        ms[k] = (kv_now() - t2) * 1e3 / steps;
        for (size_t i = 0; i < e->nbatch; i++) {
            req_free_blocks(e, &e->rq[e->batch[i]]);
        }
        fill[k] = (double)e->nbatch * (len + steps / 2);
    }
    double kv_us   = (ms[1] - ms[0]) * 1e3 / (fill[1] - fill[0]);
    double base_ms = ms[0] - fill[0] * kv_us * 1e-3;
    double pf_us   = (pf_ms - base_ms) * 1e3 / pf_tok;
    kv_shm_put_double(0, e->rank, base_ms);
    kv_shm_put_double(1, e->rank, kv_us);
    kv_shm_put_double(2, e->rank, pf_us);
    CHECK(ema_barrier());
    if (e->rank == 0) {
        double b = kv_shm_mean_double(0, e->nranks), kvu = kv_shm_mean_double(1, e->nranks);
        double pf = kv_shm_mean_double(2, e->nranks);
        printf("calibration: --model %.3f,0,%.5f,%.3f   (base ms, decode us/token, KV us/token, "
               "prefill us/token; %u requests)\n", b, kvu, pf > 0 ? pf : 0.0, nreq);
        if (e->p.out != NULL) {
            char path[4200];
            snprintf(path, sizeof(path), "%s/calibration.txt", e->p.out);
            FILE *f = fopen(path, "w");
            if (f != NULL) {
                fprintf(f, "%.3f,0,%.5f,%.3f\n", b, kvu, pf > 0 ? pf : 0.0);
                fclose(f);
            }
        }
    }
    printf("calibration rank %d: decode %.3f ms at %.0f KV tokens, %.3f ms at %.0f; "
           "corrupt %llu\n", e->rank, ms[0], fill[0], ms[1], fill[1],
           (unsigned long long)e->corrupt);
}

/* --- options ----------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: mpirun -n N kv_serving --config static|elastic|double|oracle [options]\n"
        "  --quiet             no per-rank summary on stdout (the CSV files only)\n"
        "  --help, -h          this text\n"
        "  --scenario S        rotating (default), stationary, allbusy\n"
        "  --seed N            arrivals and lengths (default 1)\n"
        "  --out DIR           write the CSV files there (else print the summary)\n"
        "  --kv-mem SIZE       C, the KV memory of a rank (default: EMA_DEVICE_MEMORY, /2\n"
        "                      for double, /oracle-mult for oracle)\n"
        "  --tok-bytes N       K+V bytes of a token (host 64, cuda 131072)\n"
        "  --oracle-mult X     oracle: the largest part, in C (default 3)\n"
        "  --phase S --warmup S --drain S --phases N   the schedule (15, 5, 15, ranks)\n"
        "  --hot X --cold X --busy X   KV demand in C (1.8, 0.25, 0.5)\n"
        "  --prompt MED,SIGMA,MIN,MAX --output MED,SIGMA,MIN,MAX   lognormal lengths\n"
        "  --lengths FILE      (prompt, output) pairs instead\n"
        "  --max-seqs N --max-prefill N --watermark X   scheduler (256, 4096, 0.01)\n"
        "  --shrink-keep N     elastic: free segments kept at the end (2)\n"
        "  --shrink-after-ms X elastic: give back only what was unused this long (1000)\n"
        "  --eager KEEP,EIGHTHS  elastic, while a peer is short of memory (ema_mem_stat's\n"
        "                      bytes_unmet rose in the last shrink-after): KEEP spare\n"
        "                      segments and the peak of EIGHTHS/8 of shrink-after (0,2)\n"
        "  --backoff-ms A,B    elastic: retry a failed grow after A ms, doubling up to B\n"
        "                      (5,320; after a refusal always A)\n"
        "  --grow-ahead N      elastic: grow N segments beyond the need, or just the need (0)\n"
        "  --hold-ms X         elastic: no grow for X ms after a give-back (50)\n"
        "  --model B,D,K,P     step model: base ms, decode us/token, KV us/token read,\n"
        "                      prefill us/token (8,20,0.1,40)\n"
        "  --slo TTFT,TPOT     goodput targets in seconds (2,0.05)\n"
        "  --weights-gb X      cuda: weights streamed per step (4)\n"
        "  --calibrate         cuda: print the step model of this machine and exit\n"
        "  --sample-ms X       timeline period (50)\n");
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1048576; break;
    case 'g': case 'G': v *= 1073741824.0; break;
    default: break;
    }
    return (size_t)v;
}

/* The options that take a value. */
static int kv_known_option(const char *a)
{
    static const char *const names[] = {
        "--config", "--scenario", "--seed", "--out", "--lengths", "--kv-mem", "--tok-bytes",
        "--oracle-mult", "--phase", "--warmup", "--drain", "--phases", "--hot", "--cold",
        "--busy", "--prompt", "--output", "--max-seqs", "--max-prefill", "--watermark",
        "--shrink-keep", "--shrink-after-ms", "--eager", "--backoff-ms", "--hold-ms",
        "--grow-ahead", "--model", "--slo", "--weights-gb", "--sample-ms", NULL};
    for (int i = 0; names[i] != NULL; i++) {
        if (!strcmp(a, names[i])) {
            return 1;
        }
    }
    return 0;
}

/* sscanf of @v by @fmt must fill @want fields. */
static int kv_scan_ok(const char *opt, const char *v, int got, int want)
{
    if (got != want) {
        fprintf(stderr, "kv_serving: %s wants %d comma-separated numbers, not %s\n", opt, want,
                v);
        return 0;
    }
    return 1;
}

static int parse_args(kv_params_t *p, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = (i + 1 < argc) ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--calibrate")) {
            p->calibrate = 1;
            used = 0;
        } else if (!strcmp(a, "--quiet")) {
            p->quiet = 1;
            used = 0;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            return 1;
        } else if (!kv_known_option(a)) {
            fprintf(stderr, "kv_serving: unknown option %s\n", a);
            return -1;
        } else if (v == NULL) {
            fprintf(stderr, "kv_serving: %s needs a value\n", a);
            return -1;
        } else if (!strcmp(a, "--config")) {
            int k;
            for (k = 0; k < KV_NCFG && strcmp(v, kv_cfg_name[k]); k++) {
            }
            if (k == KV_NCFG && !strcmp(v, "2x")) {
                k = KV_CFG_DOUBLE;
            }
            if (k == KV_NCFG) {
                fprintf(stderr, "kv_serving: unknown config %s\n", v);
                return -1;
            }
            p->cfg = (kv_cfg_t)k;
        } else if (!strcmp(a, "--scenario")) {
            int k;
            for (k = 0; k < KV_NSCN && strcmp(v, kv_scn_name[k]); k++) {
            }
            if (k == KV_NSCN) {
                fprintf(stderr, "kv_serving: unknown scenario %s\n", v);
                return -1;
            }
            p->scn = (kv_scn_t)k;
        } else if (!strcmp(a, "--seed")) p->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--out")) p->out = v;
        else if (!strcmp(a, "--lengths")) p->lengths_file = v;
        else if (!strcmp(a, "--kv-mem")) p->kv_mem = parse_size(v);
        else if (!strcmp(a, "--tok-bytes")) p->tok_bytes = parse_size(v);
        else if (!strcmp(a, "--oracle-mult")) p->oracle_mult = atof(v);
        else if (!strcmp(a, "--phase")) p->phase_s = atof(v);
        else if (!strcmp(a, "--warmup")) p->warmup_s = atof(v);
        else if (!strcmp(a, "--drain")) p->drain_s = atof(v);
        else if (!strcmp(a, "--phases")) p->nphases = atoi(v);
        else if (!strcmp(a, "--hot")) p->hot_mult = atof(v);
        else if (!strcmp(a, "--cold")) p->cold_mult = atof(v);
        else if (!strcmp(a, "--busy")) p->busy_mult = atof(v);
        else if (!strcmp(a, "--prompt")) {
            if (!kv_scan_ok(a, v, sscanf(v, "%lf,%lf,%u,%u", &p->p_median, &p->p_sigma,
                                         &p->p_min, &p->p_max), 4)) return -1;
        }
        else if (!strcmp(a, "--output")) {
            if (!kv_scan_ok(a, v, sscanf(v, "%lf,%lf,%u,%u", &p->o_median, &p->o_sigma,
                                         &p->o_min, &p->o_max), 4)) return -1;
        }
        else if (!strcmp(a, "--max-seqs")) p->max_seqs = atoi(v);
        else if (!strcmp(a, "--max-prefill")) p->max_prefill_tokens = (uint32_t)atoi(v);
        else if (!strcmp(a, "--watermark")) p->watermark = atof(v);
        else if (!strcmp(a, "--shrink-keep")) p->shrink_keep = atoi(v);
        else if (!strcmp(a, "--shrink-after-ms")) p->shrink_after_s = atof(v) * 1e-3;
        else if (!strcmp(a, "--eager")) {
            if (v == NULL || sscanf(v, "%d,%d", &p->eager_keep, &p->eager_buckets) != 2 ||
                p->eager_keep < 0 || p->eager_buckets < 1 || p->eager_buckets > 8) {
                fprintf(stderr, "kv_serving: --eager wants KEEP,EIGHTHS with KEEP >= 0 and "
                        "EIGHTHS 1..8, not %s\n", v);
                return -1;
            }
        }
        else if (!strcmp(a, "--backoff-ms")) {
            if (!kv_scan_ok(a, v, sscanf(v, "%lf,%lf", &p->grow_backoff_s,
                                         &p->grow_backoff_max_s), 2)) return -1;
        }
        else if (!strcmp(a, "--hold-ms")) p->giveback_hold_s = atof(v) * 1e-3;
        else if (!strcmp(a, "--grow-ahead")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || n < 0 || n > 1024) {
                fprintf(stderr, "kv_serving: --grow-ahead takes segments 0..1024, not %s\n", v);
                return -1;
            }
            p->grow_ahead = (int)n;
        }
        else if (!strcmp(a, "--model")) {
            if (!kv_scan_ok(a, v, sscanf(v, "%lf,%lf,%lf,%lf", &p->m_base_ms, &p->m_dec_us,
                                         &p->m_kv_us, &p->m_pf_us), 4)) return -1;
        }
        else if (!strcmp(a, "--slo")) {
            if (!kv_scan_ok(a, v, sscanf(v, "%lf,%lf", &p->slo_ttft_s, &p->slo_tpot_s), 2))
                return -1;
        }
        else if (!strcmp(a, "--weights-gb")) p->weights_gb = atof(v);
        else if (!strcmp(a, "--sample-ms")) p->sample_s = atof(v) * 1e-3;
        else {
            fprintf(stderr, "kv_serving: unknown option %s\n", a);
            return -1;
        }
        i += used;
    }
    return 0;
}

int main(int argc, char **argv)
{
    kv_engine_t e;
    kv_params_t *p = &e.p;
    ema_mem_stat_t ms = {0}; /* field_mask 0 (where there is one): every field */

    memset(&e, 0, sizeof(e));
    p->cfg = KV_NCFG;
    p->scn = KV_SCN_ROTATING;
    p->seed = 1;
    p->oracle_mult = 3;
    p->phase_s = 15;
    p->warmup_s = 5;
    p->drain_s = 15;
    p->hot_mult = 1.8;
    p->cold_mult = 0.25;
    p->busy_mult = 0.5;
    p->p_median = 160;
    p->p_sigma = 0.9;
    p->p_min = 8;
    p->p_max = 2048;
    p->o_median = 120;
    p->o_sigma = 0.9;
    p->o_min = 4;
    p->o_max = 1024;
    p->max_seqs = 256;
    p->max_prefill_tokens = 4096;
    p->watermark = 0.01;
    /* Calm: 2 spare segments and the peak of the last second; while a peer
     * is short (ema_mem_stat's bytes_unmet), none and half a second
     * (kv_cache.c, kv_cache_maintain). */
    p->shrink_keep = 2;
    p->shrink_after_s = 1;
    p->eager_keep = 0;
    p->eager_buckets = 2;
    p->grow_backoff_s = 5;
    p->grow_backoff_max_s = 320;
    p->giveback_hold_s = 0.05;
    p->m_base_ms = 8;
    p->m_dec_us = 20;
    p->m_kv_us = 0.1;
    p->m_pf_us = 40;
    p->slo_ttft_s = 2;
    p->slo_tpot_s = 0.05;
    p->weights_gb = 4;
    p->sample_s = 0.05;
    int pa = parse_args(p, argc, argv);
    if (pa == 1) {
        usage(stdout);
        return 0;
    }
    if (pa != 0 || (p->cfg == KV_NCFG && !p->calibrate)) {
        usage(stderr);
        return 2;
    }
    if (p->cfg == KV_NCFG) {
        p->cfg = KV_CFG_STATIC; /* calibration */
    }
    p->grow_backoff_s *= 1e-3;
    p->grow_backoff_max_s *= 1e-3;
    CHECK(ema_init(NULL));
    CHECK(ema_world_rank(&e.rank));
    CHECK(ema_world_size(&e.nranks));
    g_rank = e.rank;
    CHECK(ema_mem_stat(&ms));
    e.gpu = ms.memory_kind == EMA_MEMORY_KIND_CUDA;
    if (p->tok_bytes == 0) {
        p->tok_bytes = e.gpu ? 131072 : 64;
    }
    if (p->kv_mem == 0) {
        double div = p->cfg == KV_CFG_DOUBLE ? 2 : p->cfg == KV_CFG_ORACLE ? p->oracle_mult : 1;
        p->kv_mem = (size_t)((double)ms.capacity / div);
    }
    if (p->cfg == KV_CFG_ELASTIC && ms.capacity > p->kv_mem + p->kv_mem / 64) {
        fprintf(stderr, "kv_serving: elastic needs EMA_DEVICE_MEMORY = --kv-mem (%zu MiB), "
                "has %zu MiB\n", p->kv_mem >> 20, ms.capacity >> 20);
        return 1;
    }
    if (e.nranks > KV_MAX_RANKS || p->tok_bytes % 4 != 0) {
        fprintf(stderr, "kv_serving: at most %d ranks; --tok-bytes a multiple of 4\n",
                KV_MAX_RANKS);
        return 1;
    }
    if (p->out != NULL && e.rank == 0 && kv_mkdirs(p->out) != 0) {
        fprintf(stderr, "kv_serving: cannot create %s\n", p->out);
        return 1;
    }
    if (kv_shm_open(e.rank, e.nranks) != 0) {
        return 1;
    }
    e.tok_elems = (uint32_t)(p->tok_bytes / 4);
    double c_tokens = (double)(p->kv_mem / p->tok_bytes);
    if (kv_load_init(&e.ld, p, e.nranks, c_tokens) != 0) {
        return 1;
    }
    e.rq = kv_load_arrivals(&e.ld, p, e.rank, &e.nrq);
    if (p->calibrate && e.nrq < 64) {
        e.rq  = realloc(e.rq, 64 * sizeof(kv_req_t));
        memset(e.rq + e.nrq, 0, (64 - e.nrq) * sizeof(kv_req_t));
        for (size_t i = e.nrq; i < 64; i++) {
            e.rq[i].uid = ((uint32_t)e.rank << 24) | (uint32_t)i;
        }
        e.nrq = 64;
    }
    e.wq_cap  = e.nrq + 1;
    e.wq      = calloc(e.wq_cap, sizeof(uint32_t));
    e.run     = calloc(e.nrq + 1, sizeof(uint32_t));
    e.batch   = calloc(e.nrq + 1, sizeof(uint32_t));
    e.victims = calloc(e.nrq + 1, sizeof(uint32_t));
    e.greq    = calloc(e.nrq + 1, sizeof(kv_gpu_req_t));
    e.st      = kv_stats_create(p, &e.ld, e.rank);
    if (e.gpu) {
        uint32_t heads = e.tok_elems / 2 / 128;
        if (heads == 0 || e.tok_elems % 256 != 0) {
            fprintf(stderr, "kv_serving: cuda: --tok-bytes must be a multiple of 1024\n");
            return 1;
        }
        /* a batch never has more than max_seqs requests (64 in calibration) */
        uint32_t maxb = (uint32_t)(p->max_seqs > 64 ? p->max_seqs : 64);
        size_t maxtab = (size_t)((p->p_max + p->o_max) / KV_BLOCK_TOKENS + 2) * maxb;
        if (kv_gpu_init(ms.device, (size_t)(p->weights_gb * 1073741824.0), e.tok_elems, heads,
                        maxb, (uint32_t)maxtab) != 0) {
            fprintf(stderr, "kv_serving rank %d: %s\n", e.rank, kv_gpu_error());
            return 1;
        }
    }
    e.kc = kv_cache_create(p, e.rank, e.nranks, ms.capacity, e.st);
    e.wm = (size_t)ceil(p->watermark * (double)kv_cache_c_blocks(e.kc));
    if (e.rank == 0 && !p->quiet) {
        printf("# kv_serving %s %s seed %llu: %d ranks, %s kind, C = %zu MiB = %.0f tokens, "
               "block %zu B, step model %.1f ms + %.0f us/token + %.2f us/KV token\n",
               kv_scn_name[p->scn], kv_cfg_name[p->cfg], (unsigned long long)p->seed, e.nranks,
               e.gpu ? "cuda" : "host", p->kv_mem >> 20, c_tokens,
               kv_cache_blk_bytes(e.kc), p->m_base_ms, p->m_dec_us, p->m_kv_us);
        printf("# load: hot %.1f req/s (%.2f C), cold %.1f req/s, busy %.1f req/s; E[prompt] "
               "%.0f, E[output] %.0f; %zu arrivals at rank 0\n", e.ld.rate_hot, p->hot_mult,
               e.ld.rate_cold, e.ld.rate_busy, e.ld.mean_p, e.ld.mean_o, e.nrq);
        fflush(stdout);
    }
    if (p->calibrate) {
        calibrate(&e);
    } else {
        CHECK(ema_barrier());
        if (e.rank == 0) {
            kv_shm_set_t0(kv_now());
        }
        CHECK(ema_barrier());
        e.t0 = kv_shm_t0();
        double w0 = kv_now();
        serve(&e);
        double wall = kv_now() - w0, t_end = clock_now(&e);
        kv_stats_finish(e.st, e.rq, e.nrq, t_end, e.corrupt, wall);
        if (e.corrupt != 0) {
            fprintf(stderr, "kv_serving rank %d: %llu corrupted K/V elements\n", e.rank,
                    (unsigned long long)e.corrupt);
        }
    }
    CHECK(ema_barrier());
    if (e.rank == 0 && p->out != NULL && !p->quiet && !p->calibrate) {
        printf("# rank class  tokens/s  req/s  ttft_p99  tpot_p99  preempt  borrowed_max_MiB "
               "grows refusals corrupt\n");
        for (int r = 0; r < e.nranks; r++) {
            char path[4200], line[2048];
            snprintf(path, sizeof(path), "%s/summary_r%d.csv", p->out, r);
            FILE *f = fopen(path, "r");
            if (f == NULL) {
                continue;
            }
            fgets(line, sizeof(line), f); /* header */
            while (fgets(line, sizeof(line), f) != NULL) {
                char *col[64];
                int n = 0;
                for (char *s = strtok(line, ",\n"); s && n < 64; s = strtok(NULL, ",\n")) {
                    col[n++] = s;
                }
                if (n >= 43) {
                    printf("  %4s %-6s %9s %6s %9s %9s %8s %16s %5s %8s %7s\n", col[3], col[4],
                           col[10], col[11], col[14], col[16], col[19], col[34], col[21],
                           col[24], col[42]);
                }
            }
            fclose(f);
        }
    }
    int bad = e.corrupt != 0;
    kv_cache_destroy(e.kc);
    if (e.gpu) {
        kv_gpu_fini();
    }
    kv_stats_destroy(e.st);
    kv_load_free(&e.ld);
    kv_shm_close();
    for (size_t i = 0; i < e.nrq; i++) {
        free(e.rq[i].blk);
    }
    free(e.rq);
    free(e.wq);
    free(e.run);
    free(e.batch);
    free(e.victims);
    free(e.greq);
    free(e.gtab);
    CHECK(ema_finalize());
    return bad ? 1 : 0;
}
