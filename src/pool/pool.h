/*
 * The lending pool: what each rank can lend, borrowing and giving back
 * segments, reclaiming lent segments (explicitly, or implicitly when the
 * lender's own windows grow), and migrating a window's segments when their
 * memory is reclaimed or freed.  Control messages travel on EMA_AM_POOL and
 * are serviced by the progress engine.
 */
#ifndef EMA_POOL_H_
#define EMA_POOL_H_

#include <ema.h>
#include <pthread.h>
#include <stdatomic.h>

#include "util/config.h"
#include "win/win.h"

typedef struct ema__pool_config {
    size_t lend_reserve;  /* bytes never lent */
    int    spill;         /* 0 none, 1 host */
    size_t spill_size;    /* capacity of the host spill tier */
    int    stats;         /* print a summary at finalize */
    double reclaim_timeout; /* seconds, implicit reclaim */
} ema__pool_config_t;

/* Where ema__pool_acquire_segs may take memory from. */
enum {
    EMA_POOL_FROM_LOCAL = 1u << 0,
    EMA_POOL_FROM_PEERS = 1u << 1,
    EMA_POOL_FROM_SPILL = 1u << 2,
    EMA_POOL_FROM_ANY   = 7u
};

extern const ema_config_field_t ema__pool_config_table[];

typedef struct ema__pool {
    ema__pool_config_t cfg;
    ema__win_ctx_t    *win;
    ema__xport_t      *xp;
    ema__mem_arena_t  *arena;
    ema__mem_arena_t  *spill;        /* NULL with EMA_SPILL=none */
    int                rank;
    int                size;
    uint32_t           reserve_segs;

    pthread_mutex_t    lock;         /* lender-side bookkeeping below */
    int16_t           *lent_to;      /* [nsegs]: borrower of a lent segment, -1 */
    uint8_t           *recalling;    /* [nsegs]: recall sent, not yet given back */
    uint8_t           *granting;     /* [nsegs]: lent, grant not sent yet */
    uint32_t           withheld;     /* free segments not to be lent or used */
    atomic_int         recall_pending;
    atomic_int         recall_refused; /* recalled segments borrowers could not move */
    struct ema_pool_job *parked;      /* recalls waiting for a release (under lock) */
    _Atomic uint64_t   release_gen;   /* releases so far (ema__pool_unpark) */
    pthread_mutex_t    advert_lock;   /* one advertisement at a time */
    uint64_t           advertised;    /* lendable segments last advertised */

    pthread_mutex_t    acq_lock;      /* granted segments not mapped yet */
    ema__loc_t        *acq;
    size_t             nacq;
    size_t             acq_cap;

    _Atomic uint64_t  *peer_lendable; /* [size]: last known, in segments */
    const struct ema__topo *topo;     /* for the lender order, or NULL */
    const int         *gpu_of_rank;   /* [size] */
    const int         *numa_of_rank;  /* [size] */

    /* statistics */
    atomic_uint        borrowed_segs;
    atomic_uint        spilled_segs;
    _Atomic uint64_t   reclaims;
    _Atomic uint64_t   bytes_migrated;
    double             reclaim_last_us;
    double             reclaim_max_us;
} ema__pool_t;

extern ema__pool_t *ema__pool_world;

ema_status_t ema__pool_init(ema__pool_t *pool, ema__win_ctx_t *win, ema__mem_arena_t *spill);
/* Start faulting in the lendable memory in the background. */
void         ema__pool_start(ema__pool_t *pool);
void         ema__pool_cleanup(ema__pool_t *pool);
void         ema__pool_print_stats(ema__pool_t *pool, FILE *stream);

uint32_t     ema__pool_acquire_segs(ema__pool_t *pool, uint32_t want, int exclude,
                                    unsigned sources, ema__loc_t *locs, int64_t *handles);
void         ema__pool_release_loc(ema__pool_t *pool, ema__loc_t loc);
/* The granted segments @locs are now in a window table (or released). */
void         ema__pool_acq_done(ema__pool_t *pool, const ema__loc_t *locs, uint32_t n);
void         ema__pool_giveback(ema__pool_t *pool, int lender, uint32_t count,
                                const uint32_t *segs);
/* The bytes of @win's own part that lenders asked back and that are still
 * there (ema_win_stat's bytes_wanted); forgets the segments wanted back
 * that have left the part.  Called with win->lock held. */
size_t       ema__pool_wanted_bytes(ema_win_h win);
/* Move segments @idx[0..n) of the own part of @win to @targets (with
 * @handles), or, if NULL, to memory found anywhere but at @exclude, as one
 * batch (@idx is sorted in place).  Called with win->lock held, never
 * dropped.  Segments held with ema_win_acquire stay where they are: a
 * migration never waits for the application. */
ema_status_t ema__pool_migrate_batch(ema__pool_t *pool, ema_win_h win, uint32_t *idx,
                                     uint32_t n, int exclude, const ema__loc_t *targets,
                                     const int64_t *handles);
/* The owner's reclaim callback @cb for the runs of @idx[0..n) (ascending),
 * called without win->lock. */
void         ema__pool_notify(ema_win_h win, ema_reclaim_cb cb, void *cb_arg,
                              const uint32_t *idx, uint32_t n);
/* The owner released held segments (or shrank or freed a window): recalls
 * parked on held segments look again. */
void         ema__pool_unpark(ema__pool_t *pool);
/* This rank's lendable memory changed: tell the peers, for their lender
 * order (ADVERT).  Not from an AM handler. */
void         ema__pool_advertise(ema__pool_t *pool);
/* Recall until @target segments are free and withheld.  EMA_ERR_TIMEOUT at
 * the timeout, EMA_ERR_NO_MEMORY when a borrower had nowhere to move some
 * (both: what came back stays withheld, the rest stays lent; *withheld_p
 * says whether @target was withheld at all). */
ema_status_t ema__pool_reclaim(ema__pool_t *pool, uint32_t target, uint64_t timeout_ms,
                               int *withheld_p);

#endif
