/*
 * The lending pool's lifecycle: configuration, setup and teardown, the
 * background prefault of lendable memory, advertisements of it to the
 * peers, and the statistics printed at finalize.
 */
#include "pool_priv.h"

#include "util/log.h"

#include <inttypes.h>
#include <sys/mman.h>

ema__pool_t *ema__pool_world;

/*
 * Borrowers order lenders by their lendable memory (ema(7) LENDER ORDER),
 * so each rank tells every peer when its own figure changes: after a call
 * or job that took or freed segments.  Sends are serialised, so a peer never
 * keeps an older figure sent late.  A grant also carries the figure, to
 * the borrower.
 */
void ema__pool_advertise(ema__pool_t *pool)
{
    ema_pool_msg_t m;

    if (pool->size <= 1) {
        return;
    }
    pthread_mutex_lock(&pool->advert_lock);
    pthread_mutex_lock(&pool->lock);
    uint64_t left = ema__pool_lendable_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    if (left != pool->advertised) {
        pool->advertised = left;
        memset(&m, 0, sizeof(m));
        m.type = EMA_POOL_MSG_ADVERT;
        m.left = left;
        for (int r = 0; r < pool->size; r++) {
            if (r != pool->rank && !ema__xport_peer_lost(pool->xp, r) &&
                ema__pool_send(pool, r, &m, NULL, 0) != EMA_SUCCESS) {
                ema_debug("cannot tell rank %d of %" PRIu64 " lendable segments", r, left);
            }
        }
    }
    pthread_mutex_unlock(&pool->advert_lock);
}

void ema__pool_advertise_job(void *arg)
{
    ema__pool_advertise(arg);
}

#define EMA_POOL_CFG(_f) offsetof(ema__pool_config_t, _f)
static const char *ema_spill_names[] = {"none", "host", NULL};
static const ema_config_parser_t ema_spill_parser = EMA_CONFIG_ENUM(ema_spill_names);
static const char *ema_reclaim_wait_names[] = {"auto", "spin", "nap", NULL}; /* _RECLAIM_WAIT_* */
static const ema_config_parser_t ema_reclaim_wait_parser = EMA_CONFIG_ENUM(ema_reclaim_wait_names);

const ema_config_field_t ema__pool_config_table[] = {
    {"LEND_RESERVE", "0", "memory of each rank that is never lent to peers",
     EMA_POOL_CFG(lend_reserve), &ema__config_size},
    {"SPILL", "host",
     "where a window grows when no peer can lend: host (a host-memory spill tier) or none",
     EMA_POOL_CFG(spill), &ema_spill_parser},
    {"SPILL_SIZE", "4G", "capacity of each rank's host spill tier (address space until used)",
     EMA_POOL_CFG(spill_size), &ema__config_size},
    {"CUDA_SPILL", "n",
     "opt-in (pins all of it at init): give the cuda memory kind the spill tier too, "
     "as pinned host memory mapped for the GPU (CUDA 12.2+ driver), all EMA_SPILL_SIZE "
     "allocated at ema_init",
     EMA_POOL_CFG(cuda_spill), &ema__config_bool},
    {"STATS", "n", "print each rank's memory statistics at ema_finalize",
     EMA_POOL_CFG(stats), &ema__config_bool},
    {"RECLAIM_TIMEOUT", "2",
     "seconds a window's grow waits for the memory it lent to come back (implicit reclaim)",
     EMA_POOL_CFG(reclaim_timeout), &ema__config_double},
    {"RECLAIM_WAIT", "auto",
     "how a reclaim waits for its memory to come back: spin (poll without sleeping), nap "
     "(sleep 20 us whenever idle, leaving the CPU to the ranks that copy) or auto (spin "
     "where each rank and its progress thread have a core of their own, else nap)",
     EMA_POOL_CFG(reclaim_wait), &ema_reclaim_wait_parser},
    EMA_CONFIG_TABLE_END};

static void ema_pool_prefault_job(void *arg);

typedef struct {
    ema__pool_t *pool;
    uint32_t     next;
} ema_pool_prefault_t;

/* Fault the arena in, 8 segments a step, so that a borrow finds its memory
 * resident (a first touch costs milliseconds per 2 MiB) while the progress
 * thread stays responsive between steps. */
static void ema_pool_prefault_job(void *arg)
{
    ema_pool_prefault_t *pf = arg;
    ema__pool_t *pool = pf->pool;
    uint32_t nsegs = pool->arena->pool.nsegs;
    uint32_t n = (nsegs - pf->next < 8) ? nsegs - pf->next : 8;

    if (n > 0 && pool->arena->ops->prefault != NULL) {
        pool->arena->ops->prefault(pool->arena, pf->next, n);
    }
#ifdef MADV_POPULATE_WRITE
    /* And the page tables of our mappings of the peers' arenas, which put,
     * get and migrations write through: a fault per 4 KiB page otherwise. */
    for (int r = 0; n > 0 && pool->win->direct && r < pool->size; r++) {
        char *b = pool->win->peer_base[EMA_TIER_DEVICE][r];
        if (r != pool->rank && b != NULL) {
            madvise(b + (size_t)pf->next * pool->win->seg_size, (size_t)n * pool->win->seg_size,
                    MADV_POPULATE_WRITE);
        }
    }
#endif
    pf->next += n;
    if (pf->next < nsegs) {
        ema__xport_defer(pool->xp, EMA_JOB_LONG, ema_pool_prefault_job, pf);
    } else {
        free(pf);
    }
}

ema_status_t ema__pool_init(ema__pool_t *pool, ema__win_ctx_t *win, ema__mem_arena_t *spill)
{
    uint32_t nsegs = win->tier[EMA_TIER_DEVICE]->pool.nsegs;

    pool->win   = win;
    pool->xp    = win->xp;
    pool->arena = win->tier[EMA_TIER_DEVICE];
    pool->spill = spill;
    pool->rank  = win->rank;
    pool->size  = win->size;
    pool->reserve_segs = (uint32_t)((pool->cfg.lend_reserve + win->seg_size - 1) / win->seg_size);
    pool->send     = ema__pool_send_ucx;
    pool->send_arg = pool->xp;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_mutex_init(&pool->acq_lock, NULL);
    pthread_mutex_init(&pool->advert_lock, NULL);
    pool->parked  = NULL;
    atomic_init(&pool->release_gen, 0);
    pool->acq     = NULL;
    pool->nacq    = 0;
    pool->acq_cap = 0;
    pool->lent_to       = malloc(sizeof(int16_t) * nsegs);
    pool->recalling     = calloc(nsegs, 1);
    pool->refused_seg   = calloc(nsegs, 1);
    pool->granting      = calloc(nsegs, 1);
    pool->peer_lendable = calloc((size_t)(unsigned)pool->size, sizeof(*pool->peer_lendable));
    if (pool->lent_to == NULL || pool->recalling == NULL || pool->refused_seg == NULL ||
        pool->granting == NULL ||
        pool->peer_lendable == NULL) {
        ema__pool_cleanup(pool);
        return EMA_ERR_NO_MEMORY;
    }
    for (uint32_t s = 0; s < nsegs; s++) {
        pool->lent_to[s] = -1;
    }
    for (int r = 0; r < pool->size; r++) {
        uint64_t cap = win->exports[EMA_TIER_DEVICE][r].capacity / win->seg_size;
        atomic_init(&pool->peer_lendable[r], cap > pool->reserve_segs ? cap - pool->reserve_segs : 0);
    }
    /* what every peer assumes of us until we say otherwise */
    pool->advertised = atomic_load(&pool->peer_lendable[pool->rank]);
    atomic_init(&pool->recall_pending, 0);
    atomic_init(&pool->recall_answers, 0);
    atomic_init(&pool->recall_refused, 0);
    ema__xport_set_am_handler(pool->xp, EMA_AM_POOL, ema__pool_dispatch, pool);
    ema__xport_on_lost(pool->xp, ema__pool_peer_lost, pool);
    win->mem_ops = &ema__pool_mem_ops;
    win->mem_arg = pool;
    ema__pool_world = pool;
    return EMA_SUCCESS;
}

void ema__pool_start(ema__pool_t *pool)
{
    ema_pool_prefault_t *pf = malloc(sizeof(*pf));
    if (pf != NULL) {
        pf->pool = pool;
        pf->next = 0;
        ema__xport_defer(pool->xp, EMA_JOB_LONG, ema_pool_prefault_job, pf);
    }
}

void ema__pool_cleanup(ema__pool_t *pool)
{
    while (pool->parked != NULL) { /* recalls still waiting for a release */
        ema_pool_job_t *job = pool->parked;
        pool->parked = job->next;
        free(job);
    }
    free(pool->lent_to);
    free(pool->recalling);
    free(pool->refused_seg);
    pool->refused_seg = NULL;
    free(pool->granting);
    pool->granting = NULL;
    free(pool->acq);
    pool->acq = NULL;
    free((void *)pool->peer_lendable);
    pool->lent_to       = NULL;
    pool->recalling     = NULL;
    pool->peer_lendable = NULL;
    ema__pool_world     = NULL;
}

/* EMA_STATS: ema_mem_stat's fields, one line; called by ema_finalize
 * before it frees the windows left, so lent, borrowed and spilled are
 * those the application ended with. */
void ema__pool_print_stats(ema__pool_t *pool, FILE *stream)
{
    ema_mem_stat_t st;

    if (ema_mem_stat(&st) != EMA_SUCCESS) {
        return;
    }
    fprintf(stream,
            "[ema %d] stats: capacity %zu, reserve %zu, free %zu, used %zu, lent %zu, "
            "withheld %zu, borrowed %zu, spilled %zu bytes; unmet %" PRIu64 " bytes; %" PRIu64
            " reclaims (last %.0f us, max %.0f us), %" PRIu64 " bytes migrated\n",
            pool->rank, st.capacity, st.reserve, st.bytes_free, st.bytes_used, st.bytes_lent,
            st.bytes_withheld, st.bytes_borrowed, st.bytes_spilled, st.bytes_unmet, st.reclaims,
            st.reclaim_last_us, st.reclaim_max_us, st.bytes_migrated);
}
