/*
 * The lending pool: policy, not data.  What each rank can lend, which
 * lender a borrower asks (topology, then lendable memory), borrowing and
 * giving back segments, and reclaiming lent segments (explicitly, or
 * implicitly when the lender's own windows grow).  The windows own their
 * segments and move them (win/migrate.c); the pool is their memory
 * provider (ema__win_mem_ops_t) and never takes a window's lock.  Control
 * messages travel on EMA_AM_POOL (src/pool/msg.c has the diagram) and are
 * serviced by the progress engine.
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
    int    cuda_spill;    /* EMA_CUDA_SPILL: a spill tier on the cuda kind too */
    int    stats;         /* print a summary at finalize */
    double reclaim_timeout; /* seconds, implicit reclaim */
    int    reclaim_wait;  /* EMA_RECLAIM_WAIT: EMA_POOL_RECLAIM_WAIT_* */
} ema__pool_config_t;

/* How a reclaim waits for the give-backs (EMA_RECLAIM_WAIT) */
enum {
    EMA_POOL_RECLAIM_WAIT_AUTO = 0, /* spin where every rank's threads have cores, else nap */
    EMA_POOL_RECLAIM_WAIT_SPIN,
    EMA_POOL_RECLAIM_WAIT_NAP
};

extern const ema_config_field_t ema__pool_config_table[];

/* How a pool message leaves this rank: @hdr and @payload go to @peer as one
 * message, contiguous at the receiver (as UCX delivers it with
 * UCP_AM_FLAG_WHOLE_MSG), and the call returns once they may be reused.
 * ema__pool_init installs the UCX active message on EMA_AM_POOL; the unit
 * tests replace it, after init, with a loopback that queues the message
 * and later hands it to ema__pool_dispatch of the target's pool
 * (tests/unit/test_lend_protocol.c). */
typedef ema_status_t (*ema__pool_send_cb)(void *arg, int peer, const void *hdr, size_t hlen,
                                          const void *payload, size_t plen);

typedef struct ema__pool {
    ema__pool_config_t cfg;
    ema__win_ctx_t    *win;
    ema__xport_t      *xp;
    ema__mem_arena_t  *arena;
    ema__mem_arena_t  *spill;        /* NULL with EMA_SPILL=none */
    int                rank;
    int                size;
    uint32_t           reserve_segs;
    ema__pool_send_cb  send;         /* every message of the protocol */
    void              *send_arg;

    pthread_mutex_t    lock;         /* lender-side bookkeeping below */
    int16_t           *lent_to;      /* [nsegs]: borrower of a lent segment, -1 */
    uint8_t           *recalling;    /* [nsegs]: recall sent, not yet given back */
    uint8_t           *refused_seg;  /* [nsegs]: its last recall was refused (a reclaim
                                        counts its own refusals by it) */
    uint8_t           *granting;     /* [nsegs]: lent, grant not sent yet */
    uint32_t           withheld;     /* free segments not to be lent or used */
    atomic_int         recall_pending;
    _Atomic uint64_t   recall_answers; /* answers to recalls so far (give-backs,
                                          refusals, losses): a reclaim looks at its
                                          own again when this moves */
    atomic_int         recall_refused; /* recalled segments borrowers could not move */
    struct ema_pool_job *parked;      /* recalls waiting for a release or a map
                                         (under lock) */
    _Atomic uint64_t   release_gen;   /* ema__pool_unpark calls so far: releases, and
                                         granted segments mapped or given back */
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
    _Atomic uint64_t   bytes_unmet;  /* peers' borrow requests this rank could not meet */
    double             reclaim_last_us;
    double             reclaim_max_us;
} ema__pool_t;

extern ema__pool_t *ema__pool_world;

ema_status_t ema__pool_init(ema__pool_t *pool, ema__win_ctx_t *win, ema__mem_arena_t *spill);
/* Start faulting in the lendable memory in the background. */
void         ema__pool_start(ema__pool_t *pool);
void         ema__pool_cleanup(ema__pool_t *pool);
void         ema__pool_print_stats(ema__pool_t *pool, FILE *stream);

/* The owner released held segments (or shrank or freed a window), or
 * granted segments left the granted set (mapped or given back): parked
 * recalls look again. */
void         ema__pool_unpark(ema__pool_t *pool);
/* This rank's lendable memory changed: tell the peers, for their lender
 * order (ADVERT).  Not from an AM handler. */
void         ema__pool_advertise(ema__pool_t *pool);
/* Recall until @target segments are free and withheld.  EMA_ERR_TIMEOUT at
 * the timeout, EMA_ERR_NO_MEMORY when a borrower had nowhere to move some
 * (both: what came back stays withheld, the rest stays lent; *withheld_p
 * says whether @target was withheld at all).  With EMA_POOL_RECLAIM_FAIL_FAST
 * (ema_reclaim(3)) a refusal ends the wait at once; without it (a grow's
 * implicit reclaim, which takes whatever came back) the wait goes on for
 * the recalls still pending, up to the timeout. */
#define EMA_POOL_RECLAIM_FAIL_FAST 1u
ema_status_t ema__pool_reclaim(ema__pool_t *pool, uint32_t target, uint64_t timeout_ms,
                               unsigned flags, int *withheld_p);

#endif
