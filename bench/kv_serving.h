/*
 * kv_serving: an LLM serving benchmark over an EMA elastic window.  The
 * pieces, one file each:
 *
 *   kv_serving.c  the engine of one rank (vLLM-style scheduler) and main()
 *   kv_load.c     request lengths, the phase schedule, Poisson arrivals
 *   kv_cache.c    the paged KV cache in the window: blocks, grow, shrink,
 *                 give-back on reclaim, the oracle pool
 *   kv_shm.c      a shared-memory page of the node: the virtual clock that
 *                 keeps the ranks in step (host kind) and the oracle's budget
 *   kv_stats.c    per-request, per-step and timeline records, CSV files,
 *                 per-phase summaries
 *   kv_gpu.cu     the cuda kind's kernels (paged attention with checks,
 *                 weight streaming); kv_gpu.h stubs them without nvcc
 *
 * Uses the public API (ema.h) only.  doc/kv_serving.md describes the model.
 */
#ifndef KV_SERVING_H_
#define KV_SERVING_H_

#include <ema.h>

#include "kv_pattern.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KV_MAX_RANKS    64

typedef enum { KV_CFG_STATIC, KV_CFG_ELASTIC, KV_CFG_DOUBLE, KV_CFG_ORACLE, KV_NCFG } kv_cfg_t;
typedef enum { KV_SCN_ROTATING, KV_SCN_STATIONARY, KV_SCN_ALLBUSY, KV_NSCN } kv_scn_t;

extern const char *kv_cfg_name[KV_NCFG];
extern const char *kv_scn_name[KV_NSCN];

/* Everything a run is told on the command line. */
typedef struct {
    kv_cfg_t    cfg;
    kv_scn_t    scn;
    uint64_t    seed;
    const char *out;          /* directory for the CSV files; NULL: none */
    const char *lengths_file; /* (prompt, output) pairs; NULL: lognormal */
    /* memory */
    size_t kv_mem;      /* C: KV memory of one rank, bytes (0: from capacity) */
    size_t tok_bytes;   /* K and V of one token (all layers), bytes */
    double oracle_mult; /* oracle: largest part, in C */
    /* load */
    double phase_s, warmup_s, drain_s;
    int    nphases;
    double hot_mult, cold_mult, busy_mult; /* KV demand in C; busy: stationary's others */
    double p_median, p_sigma, o_median, o_sigma;
    uint32_t p_min, p_max, o_min, o_max;
    /* scheduler */
    int      max_seqs;
    uint32_t max_prefill_tokens;
    double   watermark;   /* free blocks kept at admission, fraction of C */
    int      shrink_keep; /* elastic: free segments kept at the part's end */
    double   shrink_after_s; /* elastic: give back what was not needed for this long */
    int      eager_keep;     /* elastic, while a peer is short: shrink_keep then */
    int      eager_buckets;  /* ... and the peak over this many eighths of shrink_after_s */
    double   grow_backoff_s, grow_backoff_max_s;
    int      grow_ahead;     /* elastic: segments asked for beyond the need (falls back to the need) */
    double   giveback_hold_s;
    /* step model (virtual clock of the host kind; rates of every kind) */
    double m_base_ms, m_dec_us, m_kv_us, m_pf_us;
    /* service targets (goodput) */
    double slo_ttft_s, slo_tpot_s;
    /* cuda kind */
    double weights_gb;
    int    calibrate;
    /* output */
    double sample_s;
    int    quiet;
} kv_params_t;

/* --- requests --------------------------------------------------------------- */

enum { KV_REQ_FUTURE, KV_REQ_WAITING, KV_REQ_RUNNING, KV_REQ_DONE };

typedef struct {
    uint32_t uid;        /* unique in the world: rank and index */
    double   arrive;     /* seconds from the start */
    uint32_t prompt, output;
    int      phase;      /* phase of arrival: -1 warm-up, nphases: drain */
    int      state;
    uint32_t gen;        /* output tokens so far */
    uint32_t kv_len;     /* tokens whose K/V is in the cache */
    uint32_t nblk, cap;  /* the block table */
    uint32_t *blk;
    double   t_first, t_done;
    uint32_t npreempt, recomputed;
    int      victim;     /* kv_cache_maintain: chosen to be preempted */
} kv_req_t;

/* --- load (kv_load.c) ----------------------------------------------------- */

typedef struct {
    int     nranks, nphases;
    double  warmup_s, phase_s, end_s; /* arrivals stop at end_s */
    double  rate_hot, rate_cold, rate_busy; /* requests per second of one rank */
    double *rate;    /* [(nphases + 1) * nranks]: phase -1 (warm-up) first */
    double  mean_p, mean_o, mem_time; /* E[P], E[O], E[O*P + O^2/2] */
    double  c_tokens;
} kv_load_t;

int  kv_load_init(kv_load_t *ld, const kv_params_t *p, int nranks, double c_tokens);
void kv_load_free(kv_load_t *ld);
int  kv_load_phase(const kv_load_t *ld, double t); /* -1 warm-up .. nphases (drain) */
double kv_load_rate(const kv_load_t *ld, int phase, int rank);
int  kv_load_is_hot(const kv_load_t *ld, int phase, int rank);
/* this rank's arrivals: same on every configuration for one seed */
kv_req_t *kv_load_arrivals(const kv_load_t *ld, const kv_params_t *p, int rank, size_t *n_p);
/* the step model: seconds of a step */
double kv_model_step(const kv_params_t *p, int prefill, uint32_t ntok, uint64_t kv_tokens);

/* --- shared page (kv_shm.c) ------------------------------------------------ */

int  kv_shm_open(int rank, int nranks); /* collective (two barriers) */
void kv_shm_close(void);
void kv_vclock_publish(int rank, double vt);
double kv_vclock_min_others(int rank);
void kv_vclock_wait(int rank, double vt, double slack);
void kv_shm_set_t0(double t0);
double kv_shm_t0(void);
/* the oracle's pool, in blocks: share each, total nranks * share */
void kv_pool_init(int nranks, int64_t share);
int  kv_pool_take(int rank, int64_t n);   /* 0 or -1 (nothing to borrow) */
void kv_pool_put(int rank, int64_t n);
int64_t kv_pool_owed(int rank);
int64_t kv_pool_used(int rank);
/* calibration: every rank's figure, averaged */
void kv_shm_put_double(int slot, int rank, double v);
double kv_shm_mean_double(int slot, int nranks);

/* --- KV cache (kv_cache.c) ------------------------------------------------- */

typedef struct kv_cache kv_cache_t;

struct kv_stats;
kv_cache_t *kv_cache_create(const kv_params_t *p, int rank, int nranks, size_t capacity,
                            struct kv_stats *st);
void   kv_cache_destroy(kv_cache_t *kc);
char  *kv_cache_base(kv_cache_t *kc);
size_t kv_cache_blk_bytes(kv_cache_t *kc);
size_t kv_cache_free_blocks(kv_cache_t *kc);
size_t kv_cache_used_blocks(kv_cache_t *kc);
size_t kv_cache_c_blocks(kv_cache_t *kc);
/* make @n blocks free (growing, or taking from the oracle's pool); 0 or -1 */
int    kv_cache_reserve(kv_cache_t *kc, size_t n, double now);
uint32_t kv_cache_alloc(kv_cache_t *kc, int32_t owner);
void   kv_cache_free(kv_cache_t *kc, uint32_t blk);
/* once a step, before scheduling: moves, bytes_wanted, shrink, oracle debt.
 * Fills @victims (request indices to preempt) and returns how many. */
size_t kv_cache_maintain(kv_cache_t *kc, kv_req_t *rq, double now, int idle,
                         uint32_t *victims, size_t max_victims);
/* after the victims are freed: move the blocks left past the cut, shrink */
void   kv_cache_finish_giveback(kv_cache_t *kc, kv_req_t *rq);
/* acquire the whole part around what a step touches, and release it */
void   kv_cache_pin(kv_cache_t *kc);
void   kv_cache_unpin(kv_cache_t *kc);
/* microseconds spent in EMA calls since the last call */
double kv_cache_take_ema_us(kv_cache_t *kc);
/* local and borrowed bytes of the part, bytes lent */
void   kv_cache_mem(kv_cache_t *kc, size_t *size_p, size_t *local_p, size_t *borrowed_p,
                    size_t *lent_p);

/* --- records (kv_stats.c) -------------------------------------------------- */

typedef struct kv_stats kv_stats_t;

kv_stats_t *kv_stats_create(const kv_params_t *p, const kv_load_t *ld, int rank);
void kv_stats_destroy(kv_stats_t *st);
void kv_stats_tokens(kv_stats_t *st, double t, uint32_t n);
void kv_stats_preempt(kv_stats_t *st, double t, uint32_t recomputed);
void kv_stats_step(kv_stats_t *st, double t, int prefill, uint32_t batch, uint32_t ntok,
                   uint64_t kv_tokens, double dt, double ema_us, double borrowed_frac);
void kv_stats_sample(kv_stats_t *st, double t, size_t size, size_t local, size_t borrowed,
                     size_t used, size_t lent, size_t running, size_t waiting);
void kv_stats_event(kv_stats_t *st, double t, const char *what, double bytes, double us);
/* writes the CSV files and the summary; prints the summary unless quiet */
int  kv_stats_finish(kv_stats_t *st, const kv_req_t *rq, size_t nrq, double t_end,
                     uint64_t corrupt, double wall_s);

/* --- helpers --------------------------------------------------------------- */

uint64_t kv_rnd(uint64_t *s);
double   kv_urand(uint64_t *s);
double   kv_now(void);
int      kv_mkdirs(const char *path);

#endif
