/*
 * Windows: each rank's part is a table of segments, each living in some
 * rank's memory: its own arena, a lender's arena, or its own host spill
 * tier.  The owner sees its part as one contiguous range of address space
 * whose base never moves; every rank routes put/get on (rank, offset)
 * through its cached copy of the part's segment table to (rank, tier, seg)
 * and issues UCX RMA against that tier's registration.  Each tier of each
 * rank is registered once, at init, so neither allocating nor growing a
 * window registers memory.
 *
 * Cached tables are versioned.  A segment that is about to move is marked
 * MOVING in every rank's cache (an invalidation, acknowledged once no
 * operation to it is in flight), so no operation uses a stale location; a
 * grown part is learned from an update message, or fetched from the owner
 * when an offset falls past the cached size.
 *
 * Lock order (src/README.md has the edges and the exceptions):
 *   win->lock -> pool->advert_lock -> UCX worker lock -> pool->lock
 *     -> segment pool lock;
 *   leaves: ctx->lock, pool->acq_lock, ctx->amo_lock, xp->defer_lock,
 *   xp->coll_lock, mem/host.c's fd-cache lock.
 * One window's lock at a time.  No EMA mutex but win->lock and advert_lock
 * is held across a UCX call: the AM handlers take pool->lock, acq_lock,
 * ctx->lock, coll_lock and defer_lock under UCX's lock.  The pool never
 * takes win->lock.
 *
 * win->lock is taken only with ema__win_lock/ema__win_unlock, which record
 * the owning thread (below, "win->lock: owner tracking and assertions").
 * A function that requires it starts with EMA_WIN_ASSERT_LOCKED(win); one
 * that takes it, or must not run under it, with EMA_WIN_ASSERT_UNLOCKED(win)
 * or, where no window's lock may be held (the reclaim callback, recalls,
 * long jobs, waits on peers' migrations, the pool's reclaims),
 * EMA_WIN_ASSERT_NONE_LOCKED().  Taking a second window's lock, or the same
 * one twice, aborts too.  On by default (make check runs them); compiled
 * out with NDEBUG or configure --disable-assertions.  The declarations
 * carry the same rules for clang -Wthread-safety (EMA_REQUIRES, _EXCLUDES).
 *
 * Threads:
 * - application threads: put/get/atomics take no EMA mutex (on cuda the
 *   holder of an atomic's word takes amo_lock); every wait progresses UCX,
 *   and a wait for peers (or for MOVING to clear) also runs quick jobs;
 *   ema_progress runs one long job too, and so do ema_barrier without a
 *   progress thread and ema_win_free waiting for a prefetch;
 *   ema_win_shrink migrates in the caller.
 * - the progress thread: UCX progress, quick jobs, one long job a pass;
 *   it leaves the worker alone while the application uses it (and
 *   EMA_PROGRESS_HOLDOFF us after, forcing a pass every 1 ms).
 * - UCX callbacks (AM handlers, any thread): never send, wait or take
 *   win->lock; what must send or wait becomes a job.
 * - quick jobs (BORROW, INVAL, TABLE_REQ, AMO, ADVERT) never wait for
 *   another rank and run in every wait for peers, under win->lock too;
 *   long jobs (recall, prefetch, prefault) run only where no EMA lock is
 *   held.
 * - migrations (ema__win_move) run in a recall or prefetch job or in
 *   ema_win_shrink, under win->lock, never dropped; the owner's reclaim
 *   callback runs on that thread just before, without win->lock.
 */
#ifndef EMA_WIN_H_
#define EMA_WIN_H_

#include <ema.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "mem/mem.h"
#include "util/assertion.h"
#include "util/state.h"
#include "xport/xport.h"

#define EMA_WIN_MAGIC      0x454d4157u /* "EMAW" */
#define EMA_WIN_MAGIC_DEAD 0x44454144u /* "DEAD" */

/* The most segments a window part may have: 2^28, so max_size up to 512T
 * with 2 MiB segments and 1T with 4 KiB ones.  Every count and index of a
 * part fits a uint32_t with room to spare (sums of two cannot wrap), and its
 * table costs at most 2 GiB of address space on each rank.  ema_win_allocate
 * refuses more, with EMA_ERR_INVALID_PARAM. */
#define EMA_WIN_MAX_SEGS (1u << 28)

/* Memory tiers a segment can live in. */
enum {
    EMA_TIER_DEVICE = 0, /* a rank's arena (its "GPU") */
    EMA_TIER_SPILL  = 1, /* a rank's host spill tier */
    EMA_TIER_MAX    = 2
};

/* Where one segment of a part lives, packed in 64 bits so that it is read
 * and written atomically: rank (16) | tier (8) | flags (8) | seg (32). */
typedef uint64_t ema__loc_t;
#define EMA_LOC_MOVING          (1ull << 32)
#define EMA_LOC_FLAGS           (0xffull << 32)
#define EMA_LOC(_rank, _tier, _seg) \
    (((uint64_t)(uint16_t)(_rank) << 48) | ((uint64_t)(uint8_t)(_tier) << 40) | (uint64_t)(_seg))
#define EMA_LOC_RANK(_l)        ((int)(int16_t)((_l) >> 48))
#define EMA_LOC_TIER(_l)        ((int)(((_l) >> 40) & 0xff))
#define EMA_LOC_SEG(_l)         ((uint32_t)(_l))

typedef struct ema__win_part {
    _Atomic size_t     size;     /* bytes */
    _Atomic uint64_t   version;
    _Atomic uint32_t   nsegs;
    uint32_t           max_segs;
    _Atomic ema__loc_t *loc;     /* [max_segs], allocated once */
    /* The owner's side, in its own window, under win->lock: rank r (this
     * part's index) missed a version of the owner's own part (a publish
     * could not reach it), so its next UPDATE carries the whole table
     * (coherence.c ema__win_publish). */
    uint8_t            behind;
} ema__win_part_t;

typedef struct ema__win_stats {
    _Atomic uint64_t migrations; /* added to under the lock, read without */
    /* Borrowed segments of the own part that their lenders asked back and
     * that had nowhere to go (REFUSE), by location: ema_win_stat reports
     * those still in the part as bytes_wanted, and forgets the others.
     * Under the window's lock; freed with the window.  wanted_bytes is
     * their bytes as ema__win_wanted_bytes last counted them, for an
     * ema_win_stat that finds the lock taken (a migration). */
    ema__loc_t *wanted;
    uint32_t    nwanted, wanted_cap;
    _Atomic size_t wanted_bytes;
} ema__win_stats_t;

/* Where ema__win_mem_ops.acquire may take memory from. */
enum {
    EMA_WIN_FROM_LOCAL = 1u << 0, /* the own arena's free memory */
    EMA_WIN_FROM_PEERS = 1u << 1, /* borrowed, in lender order */
    EMA_WIN_FROM_SPILL = 1u << 2, /* the own host spill tier */
    EMA_WIN_FROM_ANY   = 7u
};

/* What changed, for ema__win_mem_ops.changed. */
enum {
    EMA_WIN_CHANGED_MEMORY   = 1u << 0, /* the own memory in use (lendable memory) */
    EMA_WIN_CHANGED_RELEASED = 1u << 1  /* held segments released, or dropped */
};

/*
 * The memory provider of the windows (the pool implements it).  Every call
 * may be made with a window's lock held, except reclaim_for_self, which
 * waits on peers' migrations.
 */
typedef struct ema__win_mem_ops {
    /* Find memory for @want segments from @sources, never at rank @exclude:
     * fills @locs and @handles, returns how many were found. */
    uint32_t (*acquire)(void *arg, uint32_t want, int exclude, unsigned sources,
                        ema__loc_t *locs, int64_t *handles);
    /* Give the memory behind @locs[0..n) back, wherever it is. */
    void     (*release)(void *arg, const ema__loc_t *locs, uint32_t n);
    /* The acquired @locs[0..n) are now in a window's table. */
    void     (*mapped)(void *arg, const ema__loc_t *locs, uint32_t n);
    /* Take back up to @need segments this rank lent (a grow's implicit
     * reclaim), and give the caller what came back, as acquire gives the
     * own free memory: fills @locs and @handles, returns how many (the
     * caller maps or releases them).  Called without any window lock. */
    uint32_t (*reclaim_for_self)(void *arg, uint32_t need, ema__loc_t *locs,
                                 int64_t *handles);
    /* EMA_WIN_CHANGED_* bits: tell the peers, retry parked recalls. */
    void     (*changed)(void *arg, unsigned what);
    /* How many segments acquire(EMA_WIN_FROM_LOCAL) could take now: the
     * own arena's free ones, less those ema_reclaim withholds. */
    uint32_t (*local_free)(void *arg);
} ema__win_mem_ops_t;

/* EMA_CUDA_PATH: how put and get reach the cuda kind's memory. */
enum {
    EMA_CUDA_PATH_AUTO   = 0, /* direct where UCX is not zero-copy or is slower */
    EMA_CUDA_PATH_UCX    = 1, /* UCX (cuda_ipc, or whatever it selects) */
    EMA_CUDA_PATH_DIRECT = 2  /* EMA's own: peers' segments mapped here, copy engines */
};

/*
 * The cuda kind's direct path (cuda_path.c): every peer's arena is mirrored
 * in a reserved range of this process, and a segment is mapped there on
 * first use from its exported handle (the same import as a borrow); put and
 * get are then copies on the copy engines, on a stream of EMA's own.
 */
typedef struct ema__win_cpath {
    int              cfg;      /* EMA_CUDA_PATH_*, as set */
    int              on;       /* put and get take the direct path */
    int              tried;    /* the probe ran (ema__win_cuda_path_select) */
    uint32_t        *nh;       /* [size] segments (handles) each rank exported */
    int32_t        **handles;  /* [size][nh]: the modex's handles */
    char           **mirror;   /* [size] the mirror of rank r's arena (own: its base) */
    _Atomic uint8_t **mapped;  /* [size][nh] */
    pthread_mutex_t  lock;     /* a leaf: maps into the mirrors */
    /* The probe, GB/s by peer (0: not measured): UCX put and get to the
     * peer's arena, and a copy through the mirror. */
    double          *ucx_put, *ucx_get, *direct;
} ema__win_cpath_t;

/* The win layer's state, one per world. */
typedef struct ema__win_ctx {
    ema__xport_t      *xp;
    ema__mem_arena_t  *tier[EMA_TIER_MAX];  /* own arena and spill tier */
    ema__xport_mr_t    mr[EMA_TIER_MAX];    /* every rank's tiers, registered */
    ema__mem_export_t *exports[EMA_TIER_MAX]; /* [size] each */
    int                rank;
    int                size;
    size_t             seg_size;
    atomic_int         inflight[2]; /* RMA issues in progress, by the epoch they
                                       started in (rma.c, rma_in) */
    atomic_int         epoch;       /* flipped by each invalidation */
    pthread_mutex_t    inval_lock;  /* one invalidation's flip and drain at a time
                                       (ema__win_inval_local); a leaf */
    /* Direct access (host kind): every rank's tiers are mapped here, and
     * put/get/atomics are loads and stores, with no work for the target.
     * UCX 1.13 performs RMA to registered host memory with active messages
     * that need the target's CPU (8 B put+flush measured at 58 us to 3.6 ms
     * against a busy target), so the host kind does not use it for data. */
    int                direct;
    int                no_direct;   /* EMA_HOST_DIRECT=n: never direct */
    int                migrate_alias; /* EMA_MIGRATE_ALIAS (segment_table.c) */
    char             **peer_base[EMA_TIER_MAX]; /* [size] */
    /* Atomics the transport cannot do on this memory kind (UCX has no
     * atomics on CUDA memory and would fall back to an emulation in which
     * the target's CPU dereferences the device pointer): the rank holding
     * the word performs them, serialized by amo_lock (ema__win_amo). */
    int                amo_by_holder;
    /* A blocking put issues the flush of its target with it (when it has one) and waits for
     * both together, so the ema_win_flush after it has nothing left to do.
     * On the cuda kind (cuda_ipc) a put completes when the copy engine has
     * written the target's memory, so that flush costs nothing more, while
     * a separate flush afterwards is one more pass through UCX (measured
     * 0.5-1 us of a 13 us put + flush of 2 MiB on an H200). */
    int                put_flush;
    /* Operations a flush must complete (puts, non-blocking gets) issued to
     * each rank and to all, and how many of those a flush has completed: a
     * flush with nothing to complete (after blocking gets, say) costs
     * nothing. */
    _Atomic uint64_t  *issued;  /* [size] */
    _Atomic uint64_t  *flushed; /* [size] */
    _Atomic uint64_t   issued_all;
    _Atomic uint64_t   flushed_all;
    pthread_mutex_t    amo_lock;
    pthread_mutex_t    lock;      /* the window list */
    struct ema_win    *wins;      /* live windows */
    struct ema_win    *dead;      /* freed handles, kept until finalize so a
                                     stale handle is detected, not followed */
    uint32_t           next_id;
    /* Where segments come from and go back to: the lending pool, a layer
     * above, registers it at init (ema__pool_init). */
    const struct ema__win_mem_ops *mem_ops;
    void              *mem_arg;
    _Atomic uint64_t   bytes_migrated; /* moved by ema__win_move, all windows */
    unsigned           debug_link_delay_us; /* EMA_DEBUG_WIN_LINK_DELAY */
    unsigned           debug_grow_delay_us; /* EMA_DEBUG_GROW_MAP_DELAY */
    ema__win_cpath_t   cpath;   /* the cuda kind's direct path */
    /* Recall jobs queued or running (not parked), counted by the pool
     * (ema__win_recall_begin/_end): prefetch policies yield to them, and
     * @policy_yielded says one did, so the last recall's end restarts them. */
    atomic_int         recalls;
    atomic_int         policy_yielded;
    /* Passes of ema__win_recall completed: an acquire waits for the passes
     * of the recalls due when it came (ema_win_hold), where a progress
     * thread runs them (@progress_thread, set once at ema_init). */
    atomic_uint        recall_passes;
    int                progress_thread;
    /* Reclaim callbacks running now, on any thread (ema__win_notify): an
     * acquire does not wait for a recall while one runs, since the callback
     * may be the acquiring thread's own or wait for it (an application
     * lock). */
    atomic_int         callbacks;
} ema__win_ctx_t;

/* A window's lock: a pthread mutex that clang's -Wthread-safety knows as a
 * capability (util/assertion.h). */
typedef pthread_mutex_t ema__win_mutex_t EMA_CAPABILITY("mutex");

struct ema_win {
    uint32_t         magic;
    uint32_t         id;
    ema__win_ctx_t  *ctx;
    void            *base;     /* own part */
    size_t           reserved; /* address space reserved at base */
    ema__win_part_t *parts;    /* [size]; NULL once freed and unreferenced */
    /* References to the tables (parts, held): 1 for the list while the
     * window is linked, 1 for each ema__win_find not yet matched by its
     * ema__win_put.  Taken only under ctx->lock on a linked window, so once
     * ema__win_free has unlinked it and dropped the list's, the count only
     * falls; whoever drops the last frees the tables (ema__win_put). */
    atomic_int       refs;
    struct ema_win  *next;
    struct ema_win  *dead_next; /* ctx->dead, once freed (next stays as it was) */

    /* owner side */
    ema__win_mutex_t lock;     /* structural changes of the own part; taken
                                  only with ema__win_lock/_unlock.  Kept
                                  until finalize, also once the window is
                                  freed (ema__win_recall may lock a dead
                                  window, and then skips it) */
    _Atomic uintptr_t lock_owner; /* the thread holding lock (pthread_self),
                                     0 if none: assertion builds only */
    ema_reclaim_cb   reclaim_cb;
    void            *reclaim_arg;
    atomic_int      *held;     /* [max_segs]: ema_win_acquire counts */
    atomic_int       prefetching; /* queued ema_win_prefetch and policy jobs */
    ema__win_stats_t stats;
    /* The prefetch policy (policy.c).  @policy under lock; ema_win_advance
     * reads and writes only the atomics, never the lock. */
    struct ema__win_policy *policy;
    _Atomic uint64_t policy_gc;     /* generation << 32 | group count (0: none) */
    _Atomic uint64_t policy_pos;    /* generation << 32 | group + 1 (0: not started) */
    atomic_int       policy_queued; /* a policy job is queued and not started */
    _Atomic uint64_t policy_t_queued; /* when it was queued (ns), kept at debug level only */
    /* FLAG_WAIT's tickets: each ema_win_advance takes policy_seq + 1 after it
     * stores its position; a policy run reads policy_seq as it starts, and
     * once done with its current group raises policy_done to that value (a
     * maximum: runs may overlap), so a waiter waits for policy_done >= its
     * ticket, a run that started after its advance. */
    _Atomic uint64_t policy_seq;
    _Atomic uint64_t policy_done;
    /* FLAG_WAIT (NULL without it): [0] the generation, [1 + g] group g's
     * segments as first << 32 | last + 1, read by ema_win_advance without
     * the lock while policy_readers counts it; ema_win_set_policy frees a
     * replaced one once no reader is left. */
    _Atomic(uint64_t *) policy_span;
    atomic_int       policy_readers;
    _Atomic uint64_t policy_ctr[6]; /* EMA_WIN_POLICY_CTR_* */
};

/* Request handles.  A request is either a UCX request (its user area holds
 * this struct), an aggregate of several UCX operations (malloc'ed), or the
 * static "already complete" request. */
#define EMA_REQ_MAGIC_UCX  0x52455155u
#define EMA_REQ_MAGIC_AGG  0x52454741u
#define EMA_REQ_MAGIC_DONE 0x52454444u

struct ema_request {
    uint32_t      magic;
    /* aggregate: operations not yet complete, plus EMA_REQ_ORPHAN once a
     * wait gave it up (rma.c, rma_req_give_up) */
    atomic_int    pending;
    atomic_int    status;  /* aggregate: first error */
    ema__xport_t *xp;
    int           rank;    /* UCX request: the rank of its one operation */
    /* an aggregate is followed by one struct ema_req_slot per rank of the
     * world (ema__req_slots): its operations to that rank, so that a wait
     * knows which are left */
};

/* An aggregate's operations to one rank; the UCX callback's user data. */
struct ema_req_slot {
    struct ema_request *agg;     /* NULL: no operation went to the rank */
    atomic_int          pending; /* those not yet complete */
};

static inline struct ema_req_slot *ema__req_slots(struct ema_request *agg)
{
    return (struct ema_req_slot *)(agg + 1);
}
#define EMA_REQ_ORPHAN (1 << 30)

extern ema__win_ctx_t *ema__win_world;

/* --- win->lock: owner tracking and assertions ------------------------------
 *
 * win->lock is taken and dropped only with ema__win_lock(win) and
 * ema__win_unlock(win).  Where assertions are built (util/assertion.h: by
 * default; not with NDEBUG or configure --disable-assertions) they record
 * the owning thread in win->lock_owner, and the window whose lock this
 * thread holds in ema__win_lock_held, and check:
 *   ema__win_lock       this thread holds no window's lock yet (the mutex is
 *                       not recursive, and one window's lock at a time);
 *   ema__win_unlock     this thread holds it;
 *   EMA_WIN_ASSERT_LOCKED(win)    this thread holds win->lock (a function
 *                                 that requires it; first in its body);
 *   EMA_WIN_ASSERT_UNLOCKED(win)  this thread does not hold win->lock (a
 *                                 function that takes it, or waits for what
 *                                 only its holder can finish);
 *   EMA_WIN_ASSERT_NONE_LOCKED()  this thread holds no window's lock (the
 *                                 reclaim callback, recalls, long jobs,
 *                                 waits on peers' migrations; the pool).
 * A failure logs the caller's file:line and function, and aborts.  Without
 * assertions the helpers are pthread_mutex_lock/unlock and the checks
 * nothing.  The same rules are clang -Wthread-safety annotations on the
 * functions below (EMA_REQUIRES, EMA_EXCLUDES).
 */

/* The window whose lock this thread holds, NULL if none (assertion builds). */
extern __thread struct ema_win *ema__win_lock_held;

static inline uintptr_t ema__win_self(void)
{
    return (uintptr_t)pthread_self();
}

static inline int ema__win_locked_by_self(const struct ema_win *win)
{
    return atomic_load_explicit(&win->lock_owner, memory_order_relaxed) == ema__win_self();
}

static inline void ema__win_lock_at(struct ema_win *win, const char *file, int line,
                                    const char *func)
    EMA_ACQUIRE(win->lock) EMA_NO_THREAD_SAFETY_ANALYSIS
{
#if EMA_ASSERTIONS
    struct ema_win *held = ema__win_lock_held;
    EMA_ASSERT_AT(held != win, file, line, func,
                  "window %u: this thread already holds its lock (not recursive)", win->id);
    EMA_ASSERT_AT(held == NULL, file, line, func,
                  "window %u: locking it while this thread holds window %u's lock (one "
                  "window's lock at a time)", win->id, held ? held->id : 0);
#endif
    int rc = pthread_mutex_lock(&win->lock);
#if EMA_ASSERTIONS
    EMA_ASSERT_AT(rc == 0, file, line, func, "window %u: pthread_mutex_lock: %s", win->id,
                  strerror(rc));
    atomic_store_explicit(&win->lock_owner, ema__win_self(), memory_order_relaxed);
    ema__win_lock_held = win;
#else
    (void)rc;
    (void)file, (void)line, (void)func;
#endif
}

/* Take win->lock if it is free: 1 if taken, 0 if another thread holds it. */
static inline int ema__win_trylock_at(struct ema_win *win, const char *file, int line,
                                      const char *func)
    EMA_TRY_ACQUIRE(1, win->lock) EMA_NO_THREAD_SAFETY_ANALYSIS
{
#if EMA_ASSERTIONS
    struct ema_win *held = ema__win_lock_held;
    EMA_ASSERT_AT(held == NULL, file, line, func,
                  "window %u: locking it while this thread holds window %u's lock (one "
                  "window's lock at a time)", win->id, held ? held->id : 0);
#endif
    if (pthread_mutex_trylock(&win->lock) != 0) {
        return 0;
    }
#if EMA_ASSERTIONS
    atomic_store_explicit(&win->lock_owner, ema__win_self(), memory_order_relaxed);
    ema__win_lock_held = win;
#else
    (void)file, (void)line, (void)func;
#endif
    return 1;
}

static inline void ema__win_unlock_at(struct ema_win *win, const char *file, int line,
                                      const char *func)
    EMA_RELEASE(win->lock) EMA_NO_THREAD_SAFETY_ANALYSIS
{
#if EMA_ASSERTIONS
    EMA_ASSERT_AT(ema__win_locked_by_self(win), file, line, func,
                  "window %u: unlocking a lock this thread does not hold", win->id);
    atomic_store_explicit(&win->lock_owner, 0, memory_order_relaxed);
    ema__win_lock_held = NULL;
#else
    (void)file, (void)line, (void)func;
#endif
    pthread_mutex_unlock(&win->lock);
}

static inline void ema__win_assert_locked_at(const struct ema_win *win, const char *file,
                                             int line, const char *func)
    EMA_ASSERT_CAPABILITY(win->lock) EMA_NO_THREAD_SAFETY_ANALYSIS
{
    EMA_ASSERT_AT(ema__win_locked_by_self(win), file, line, func,
                  "window %u: requires its lock, which this thread does not hold", win->id);
}

static inline void ema__win_assert_unlocked_at(const struct ema_win *win, const char *file,
                                               int line, const char *func)
{
    EMA_ASSERT_AT(!ema__win_locked_by_self(win), file, line, func,
                  "window %u: must not be called with its lock held", win->id);
}

#define ema__win_lock(_win)   ema__win_lock_at((_win), __FILE__, __LINE__, __func__)
#define ema__win_unlock(_win) ema__win_unlock_at((_win), __FILE__, __LINE__, __func__)
#define ema__win_trylock(_win) ema__win_trylock_at((_win), __FILE__, __LINE__, __func__)
#define EMA_WIN_ASSERT_LOCKED(_win) \
    ema__win_assert_locked_at((_win), __FILE__, __LINE__, __func__)
#define EMA_WIN_ASSERT_UNLOCKED(_win) \
    ema__win_assert_unlocked_at((_win), __FILE__, __LINE__, __func__)
#define EMA_WIN_ASSERT_NONE_LOCKED()                                                 \
    EMA_ASSERT(ema__win_lock_held == NULL,                                           \
               "must not be called with a window's lock held (this thread holds "    \
               "window %u's)", ema__win_lock_held ? ema__win_lock_held->id : 0)

ema_status_t ema__win_ctx_init(ema__win_ctx_t *ctx, ema__xport_t *xp, ema__mem_arena_t *arena,
                               ema__mem_arena_t *spill, int rank, int size);
/* The blob this rank contributes to the modex: exports + packed rkeys. */
ema_status_t ema__win_ctx_blob(ema__win_ctx_t *ctx, void **blob_p, size_t *len_p);
/* Check every rank's blob against this rank's settings: the memory kind,
 * EMA_SEGMENT_SIZE and EMA_SPILL must agree (EMA_ERR_INVALID_PARAM), and
 * host-kind memories must fit the machine together (EMA_ERR_NO_MEMORY).
 * Every rank reaches the same verdict; call it before connecting anything,
 * then ema__win_ctx_connect. */
ema_status_t ema__win_ctx_check(ema__win_ctx_t *ctx, void *const *blobs, const size_t *lens);
/* Complete the setup once every rank's exports and rkeys are known. */
ema_status_t ema__win_ctx_connect(ema__win_ctx_t *ctx, void *const *blobs, const size_t *lens);
void         ema__win_ctx_cleanup(ema__win_ctx_t *ctx);

/* The cuda kind's direct path (cuda_path.c).  The handles each rank
 * appends to its modex blob, and reading them back (connect). */
size_t       ema__win_cpath_blob_len(const ema__win_ctx_t *ctx);
void         ema__win_cpath_blob(const ema__win_ctx_t *ctx, char *p);
ema_status_t ema__win_cpath_connect(ema__win_ctx_t *ctx, int rank, const char *p,
                                    const char *end);
/* Collective, at the end of ema_init: measure each peer through UCX and
 * through the mirror, choose the path (EMA_CUDA_PATH), warn where it is
 * not zero-copy, and wait for every rank (the probe writes into the last
 * segment of each peer's arena, free until then). */
ema_status_t ema__win_cuda_path_select(ema__win_ctx_t *ctx);
void         ema__win_cpath_cleanup(ema__win_ctx_t *ctx);
/* The local address of @len bytes at @raddr of rank @rank's device tier,
 * mapping its segment on first use; NULL on failure (logged). */
char        *ema__win_cpath_addr(ema__win_ctx_t *ctx, int rank, uint64_t raddr);
/* Segment @seg of rank @rank's device memory in its mirror (mapped on first
 * use, then kept until finalize), or NULL where there is no mirror (host
 * kind, EMA_CUDA_PATH=ucx, no address space) or the map fails.  Migrations
 * read and write peers' memory there, not through a window's range. */
char        *ema__win_cpath_seg(ema__win_ctx_t *ctx, int rank, uint32_t seg);
/* One line per peer for ema_info: the path in use and the probe's figures. */
void         ema__win_cpath_print(const ema__win_ctx_t *ctx, FILE *stream);

/* Collective.  @arg is this rank's verdict on its arguments: an error there
 * allocates nothing and makes the call fail on every rank with it. */
ema_status_t ema__win_allocate(ema__win_ctx_t *ctx, ema_status_t arg, size_t size,
                               const ema_win_params_t *params, void **base_p, ema_win_h *win_p);
/* Rank @r's description of its part in an allocation's allgather (@len
 * bytes at @blob), before it is used: a status, or a well-formed part of
 * @r's own memory.  0 (logged once per kind): the allocation fails. */
int          ema__win_desc_check(const ema__win_ctx_t *ctx, int r, const void *blob,
                                 size_t len);
/* Collective: flush, barrier, then unmap the own part and give its
 * borrowed and spilled segments back (ctx->mem_ops). */
ema_status_t ema__win_free(ema__win_ctx_t *ctx, ema_win_h win) EMA_EXCLUDES(win->lock);
/* The live window @id, NULL if none, with a reference to its tables that
 * the caller drops with ema__win_put once it is done with them: a message
 * handler or job (an INVAL, an UPDATE, a table request) may use parts and
 * held after the owner freed the window meanwhile, never after its put.
 * Neither waits nor takes a window's lock; the put may free the tables (in
 * any thread, a UCX callback included). */
ema_win_h    ema__win_find(ema__win_ctx_t *ctx, uint32_t id);
void         ema__win_put(ema_win_h win);
ema_win_h    ema__win_list_next(ema__win_ctx_t *ctx, ema_win_h win) EMA_EXCLUDES(ctx->lock);

/* Whether @p may be a handle before it is read: aligned as every handle is
 * (calloc'd windows, malloc'd or UCX-pooled requests: 8 at least), not a
 * small integer (ema_put((ema_win_h)0x1000, ...)): nothing is mapped below
 * Linux's default vm.mmap_min_addr of 64 KiB, and on x86-64 not above
 * where user space ends (2^47, 2^56 with 5-level paging:
 * 0x8000000000000000, (ema_win_h)-8).  Such values are refused rather than
 * read.  Any other pointer is read for its type's mark: one into unmapped
 * memory still faults (ema(7) ERRORS). */
#define EMA_HANDLE_MIN ((uintptr_t)65536)
#if defined(__x86_64__)
/* not on arm64, where tagged heaps (MTE, HWASan) set the top byte of the
 * pointers malloc returns */
#define EMA_HANDLE_END ((uintptr_t)1 << 56)
#else
#define EMA_HANDLE_END UINTPTR_MAX
#endif
static inline int ema__handle_plausible(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    return a >= EMA_HANDLE_MIN && a < EMA_HANDLE_END && a % sizeof(void *) == 0;
}

/* Check a handle: EMA_ERR_INVALID_HANDLE for NULL, freed or foreign handles. */
static inline ema_status_t ema__win_check(ema_win_h win)
{
    if (!ema__handle_plausible(win) || win->magic != EMA_WIN_MAGIC) {
        return EMA_ERR_INVALID_HANDLE;
    }
    return EMA_SUCCESS;
}

/* The library is initialised and @win is a live window. */
static inline ema_status_t ema__win_check_live(ema_win_h win)
{
    ema_status_t status = ema__check_ready();
    return (status != EMA_SUCCESS) ? status : ema__win_check(win);
}

/* ema__win_check_live(), for a call that fills *@out: EMA_ERR_INVALID_PARAM
 * for a NULL @out. */
static inline ema_status_t ema__win_check_live_out(ema_win_h win, const void *out)
{
    ema_status_t status = ema__win_check_live(win);
    return (status == EMA_SUCCESS && out == NULL) ? EMA_ERR_INVALID_PARAM : status;
}

/* --- segment tables (win/segment_table.c) -------------------------------- */

/* The functions on @win's own part (map, move, unmap) require win->lock. */

/* Map segment @loc (handle @handle) at index @idx of the own part. */
ema_status_t ema__win_seg_map(ema_win_h win, uint32_t idx, ema__loc_t loc, int64_t handle)
    EMA_REQUIRES(win->lock);
/* Called by ema__win_seg_move_batch once the first @ncopied segments of
 * the batch are copied, before their window ranges are remapped. */
typedef void (*ema__win_handover_fn)(void *arg, uint32_t ncopied);
/* Move segments idx[0..n) of the own part to @loc (with @hdl) where the
 * memory is not mapped everywhere (cuda): copies in flight on the copy
 * engines, then the window's ranges remapped, pipelined with the copies or,
 * with @handover, after it (segment_table.c).  *@ok_p counts those
 * remapped, from the first. */
ema_status_t ema__win_seg_move_batch(ema_win_h win, const uint32_t *idx, const ema__loc_t *loc,
                                     const int64_t *hdl, uint32_t n, uint32_t *ok_p,
                                     ema__win_handover_fn handover, void *ho_arg)
    EMA_REQUIRES(win->lock);
/* Map segments idx[0..n) of the own part at @loc (with @hdl) in place of
 * their memory, with no copy: per run, one map_many, after an unmap where
 * the kind cannot map over a mapping (cuda; on host one MAP_FIXED mmap
 * replaces it).  Behind every move of the host kind's direct path and the
 * no-copy moves.  *@ok_p counts those remapped, from the first. */
ema_status_t ema__win_seg_remap_batch(ema_win_h win, const uint32_t *idx, const ema__loc_t *loc,
                                      const int64_t *hdl, uint32_t n, uint32_t *ok_p)
    EMA_REQUIRES(win->lock);
/* The prefetch policy's kept copies (EMA_WIN_POLICY_FLAG_READ_ONLY) of
 * segments from @first on: released, as the part shrinks to @first. */
void         ema__win_policy_shrunk(ema_win_h win, uint32_t first) EMA_REQUIRES(win->lock);
/* Direct kind: copy @count segments from the memory at @src (and the
 * segments after it) to @dst, through this rank's mappings of every rank's
 * memory, not through any window. */
void         ema__win_seg_copy(ema__win_ctx_t *ctx, ema__loc_t dst, ema__loc_t src,
                               uint32_t count);
/* Map @count consecutive segments (@loc and the ones after it, all behind
 * @handle) at @idx and after, in one call where the kind allows. */
ema_status_t ema__win_seg_map_many(ema_win_h win, uint32_t idx, ema__loc_t loc, uint32_t count,
                                   int64_t handle) EMA_REQUIRES(win->lock);
/* Unmap segments [first, first+count) of the own part, keeping the
 * reservation. */
ema_status_t ema__win_seg_unmap(ema_win_h win, uint32_t first, uint32_t count)
    EMA_REQUIRES(win->lock);

/* Mark [first, first+count) of @part MOVING in this rank's cache and wait
 * until no RMA issued before is still in flight (flushes the worker).  The
 * own part's only under win->lock (ema__win_invalidate_runs); another
 * rank's part with or without a window's lock (the INVAL job). */
ema_status_t ema__win_inval_local(ema__win_ctx_t *ctx, ema_win_h win, int part, uint32_t first,
                                  uint32_t count);
/* @loc names a segment of some rank's memory: a rank of the world, a tier
 * that rank has, a segment inside it, no flag but MOVING. */
int          ema__win_loc_ok(const ema__win_ctx_t *ctx, ema__loc_t loc);
/* An update of @part from its owner, before it is applied: the segment
 * count and the run [@first, @first+@count) within the part's table, a
 * @size within the segments, every location ema__win_loc_ok.  0 (logged
 * once per kind): malformed, to be dropped. */
int          ema__win_update_check(ema_win_h win, int part, uint64_t size, uint32_t nsegs,
                                   uint32_t first, uint32_t count, const ema__loc_t *locs);
/* Apply an update of @part: set size, segment count and locations from
 * @first on, if @version is newer than the cached one. */
void         ema__win_apply_update(ema_win_h win, int part, uint64_t version, size_t size,
                                   uint32_t nsegs, uint32_t first, uint32_t count,
                                   const ema__loc_t *locs);

/* --- moving segments (win/migrate.c) ------------------------------------ */

/* Move segments @idx[0..n) of @win's own part to @targets (with @handles),
 * or, if NULL, to memory found anywhere but at @exclude, as one batch
 * (@idx is sorted in place, and targets[i] goes to the i-th segment of the
 * sorted order: pass @idx sorted where a target belongs to its segment).  Requires win->lock, which it never drops.
 * Held segments (ema_win_acquire) stay where they are: a move never waits
 * for the application.  EMA_ERR_NO_MEMORY: no memory for some of them. */
ema_status_t ema__win_move(ema_win_h win, uint32_t *idx, uint32_t n, int exclude,
                           const ema__loc_t *targets, const int64_t *handles, unsigned flags)
    EMA_REQUIRES(win->lock);
/* Put the own part's segments of runs [@first[k], @first[k]+@count[k]), k <
 * @nruns, back in service where they were, @old (in run order), after an
 * invalidation that failed or found some of them held: MOVING cleared in
 * the own table, then published (@buf: room for the longest run), so that
 * every rank uses them again.  The one restore path of ema__win_move and
 * ema_win_shrink.  Requires win->lock; returns the first error of the
 * publish. */
ema_status_t ema__win_restore(ema_win_h win, const uint32_t *first, const uint32_t *count,
                              uint32_t nruns, const ema__loc_t *old, ema__loc_t *buf)
    EMA_REQUIRES(win->lock);
/* ema__win_move's @flags: a lender waits for the old memory (a recall), so
 * it is given back as soon as the copies are done, before the window's
 * remaps (cuda; on the host kind's direct path a remap is one mmap). */
#define EMA_WIN_MOVE_HANDOVER_FIRST 0x1u
/* The targets already hold the data (the prefetch policy's kept copies,
 * EMA_WIN_POLICY_FLAG_READ_ONLY): remap only, no copy. */
#define EMA_WIN_MOVE_NO_COPY        0x2u
/* Old memory in this rank's spill tier is not released: the caller keeps
 * it (as a copy of what moved home) and releases it later. */
#define EMA_WIN_MOVE_KEEP_SPILL     0x4u
/* The owner's reclaim callback @cb for the runs of @idx[0..n) (any order);
 * called WITHOUT any window's lock, so it may call any ema_win_* on the
 * window. */
void         ema__win_notify(ema_win_h win, ema_reclaim_cb cb, void *cb_arg,
                             const uint32_t *idx, uint32_t n) EMA_EXCLUDES(win->lock);
/* A lender's recall of @segs[0..n) of rank @src, in every window (see
 * win/migrate.c); @told[k]: the owner's callback heard of segs[k] (in/out).
 * Takes each window's lock itself: called with none held. */
void         ema__win_recall(ema__win_ctx_t *ctx, int src, const uint32_t *segs, uint32_t n,
                             uint8_t *told, uint8_t *found, uint8_t *held, uint32_t *refuse,
                             uint32_t *nrefuse_p);
/* The bytes of @win's own part that lenders asked back and that are still
 * there (ema_win_stat's bytes_wanted); forgets the segments wanted back
 * that have left the part.  Requires win->lock. */
size_t       ema__win_wanted_bytes(ema_win_h win) EMA_REQUIRES(win->lock);

/* --- the prefetch policy (win/policy.c) ---------------------------------- */

/* Counters of struct ema_win's policy_ctr[]. */
enum {
    EMA_WIN_POLICY_CTR_PREFETCHED = 0, /* bytes */
    EMA_WIN_POLICY_CTR_EVICTED    = 1, /* bytes */
    EMA_WIN_POLICY_CTR_SKIPPED    = 2, /* segment moves left out: held */
    EMA_WIN_POLICY_CTR_DEFERRED   = 3, /* runs that yielded to a recall */
    EMA_WIN_POLICY_CTR_RUNS       = 4,
    EMA_WIN_POLICY_CTR_DROPPED    = 5  /* bytes evicted with no copy (READ_ONLY) */
};

/* A lender's recall is queued (@begin) or has ended or parked (@end): the
 * pool calls these around each recall job, from any thread, no lock held
 * but in the dispatch (a UCX callback: begin only, which just counts).
 * The end of the last one queues the policy jobs that yielded. */
void         ema__win_recall_begin(ema__win_ctx_t *ctx);
void         ema__win_recall_end(ema__win_ctx_t *ctx);
/* A begin whose job was never queued: uncounted, without the end's wake-up
 * of the policies (it takes window locks, which the caller may hold); one
 * that yielded resumes at the next recall's end. */
void         ema__win_recall_cancel(ema__win_ctx_t *ctx);
/* Drop @win's policy once the window is freed (ema_win_free). */
void         ema__win_policy_drop(ema_win_h win) EMA_EXCLUDES(win->lock);

/* --- coherence of cached tables (win/coherence.c) ------------------------ */

void         ema__win_coherence_init(ema__win_ctx_t *ctx);
/* Owner: mark [first, first+count) of the own part MOVING on every rank and
 * wait for every acknowledgement.  Requires win->lock (one thread at a time
 * per window); runs quick deferred work while it waits. */
ema_status_t ema__win_invalidate(ema_win_h win, uint32_t first, uint32_t count)
    EMA_REQUIRES(win->lock);
/* The same for several runs, in one round of messages and acknowledgements. */
ema_status_t ema__win_invalidate_runs(ema_win_h win, const uint32_t *first,
                                     const uint32_t *count, uint32_t nruns)
    EMA_REQUIRES(win->lock);
/* Owner: send the own part's size and the locations [first, first+count)
 * to every rank (after a grow, shrink or move), as its next version.  @buf
 * has room for @count locations (NULL if 0): the caller allocates it before
 * it changes the table, so that the publish cannot fail for memory once
 * the change is made.  A rank that missed an earlier version (marked
 * behind) gets the whole table instead, from the owner's table itself.
 * An error: a send to a live peer failed (logged; the others were still
 * sent, and the version is spent), and that peer keeps its old table,
 * MOVING marks included, until a later publish reaches it with the whole
 * table.  Requires win->lock. */
ema_status_t ema__win_publish(ema_win_h win, uint32_t first, uint32_t count, ema__loc_t *buf)
    EMA_REQUIRES(win->lock);
/* Fetch @part's table from its owner, when an offset falls past the cached
 * size.  Blocking; from application threads only, never under win->lock. */
ema_status_t ema__win_fetch(ema_win_h win, int part) EMA_EXCLUDES(win->lock);
/* A 64-bit fetch-and-add (@cswap 0) or compare-and-swap (@cswap 1: swap in
 * @swap where the word equals @operand) on the word at @raddr of rank
 * @holder's tier @tier, performed by @holder itself; *@old gets the value
 * before.  Atomic with respect to every other ema__win_amo on that word. */
ema_status_t ema__win_amo(ema__win_ctx_t *ctx, int holder, int tier, uint64_t raddr, int cswap,
                          uint64_t operand, uint64_t swap, uint64_t *old);

#endif
