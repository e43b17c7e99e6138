/*
 * EMA: elastic memory across GPUs.
 *
 * One process runs per GPU (or, on a host without GPUs, per capacity-limited
 * host arena).  Together the processes form an "ema world".  Each process
 * exposes parts of memory windows that every process can read and write with
 * one-sided put/get.  See ema(7) for the model and the thread contract, and
 * the man page of each call for its full contract.
 *
 * Conventions (they hold for every call):
 *  - Every call returns an ema_status_t: EMA_SUCCESS (0), EMA_INPROGRESS (1)
 *    or a negative EMA_ERR_* code.  No call aborts the process.
 *  - Output parameters end in _p and are written only on success.
 *  - A call that fails changes nothing.
 *  - Calls made before ema_init() or after ema_finalize() fail with
 *    EMA_ERR_STATE (ema_strerror(), ema_version_string(),
 *    ema_config_print() and ema_info_print() excepted).
 */
#ifndef EMA_H_
#define EMA_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EMA_VERSION_MAJOR 0
#define EMA_VERSION_MINOR 1
#define EMA_VERSION_PATCH 0
#define EMA_VERSION       ((EMA_VERSION_MAJOR << 16) | (EMA_VERSION_MINOR << 8) | \
                           EMA_VERSION_PATCH)

#if defined(__GNUC__)
#  define EMA_EXPORT __attribute__((visibility("default")))
#else
#  define EMA_EXPORT
#endif

/**
 * Status codes.  Errors are negative and grouped: argument errors first,
 * then resource errors, then runtime and peer errors.  Values are never
 * renumbered.
 */
typedef enum {
    EMA_SUCCESS             = 0,   /**< The call succeeded. */
    EMA_INPROGRESS          = 1,   /**< The operation has not completed yet. */

    EMA_ERR_INVALID_PARAM   = -1,  /**< A NULL pointer, bad value or bad flag. */
    EMA_ERR_INVALID_HANDLE  = -2,  /**< A window or request handle that is not live. */
    EMA_ERR_INVALID_RANK    = -3,  /**< A rank outside [0, world size). */
    EMA_ERR_RANGE           = -4,  /**< An offset/length outside the target part. */
    EMA_ERR_ALIGNMENT       = -5,  /**< An atomic offset that is not 8-byte aligned. */
    EMA_ERR_STATE           = -6,  /**< Not initialised, already finalised, or in use. */

    EMA_ERR_NO_MEMORY       = -10, /**< No memory can back the request. */
    EMA_ERR_NO_RESOURCE     = -11, /**< Out of handles, address space or descriptors. */
    EMA_ERR_UNSUPPORTED     = -12, /**< Not supported by this build or memory kind. */

    EMA_ERR_BOOTSTRAP       = -20, /**< The launcher (PMIx) failed or is unreachable. */
    EMA_ERR_TRANSPORT       = -21, /**< UCX reported an error. */
    EMA_ERR_PEER_LOST       = -22, /**< A peer died; data only it held is gone. */
    EMA_ERR_TIMEOUT         = -23, /**< A bounded wait expired. */
    EMA_ERR_IO              = -24, /**< A system call failed (see the log). */
    EMA_ERR_DEVICE          = -25  /**< The GPU driver reported an error. */
} ema_status_t;

/** Memory kinds a rank's memory can be made of. */
typedef enum {
    EMA_MEMORY_KIND_AUTO = 0, /**< cuda where a GPU is usable, else host. */
    EMA_MEMORY_KIND_HOST = 1, /**< A capacity-limited host arena standing in for a GPU. */
    EMA_MEMORY_KIND_CUDA = 2  /**< CUDA device memory (VMM allocations). */
} ema_memory_kind_t;

/** Opaque handles. */
typedef struct ema_win     *ema_win_h;
typedef struct ema_request *ema_request_h;

/* ------------------------------------------------------------------------- */
/* World                                                                      */
/* ------------------------------------------------------------------------- */

/** Fields of ema_init_params_t that are set. */
enum {
    EMA_INIT_PARAM_FIELD_MEMORY_KIND   = 1ull << 0,
    EMA_INIT_PARAM_FIELD_DEVICE_MEMORY = 1ull << 1,
    EMA_INIT_PARAM_FIELD_SEGMENT_SIZE  = 1ull << 2
};

/**
 * Options of ema_init().  A field set here overrides the matching EMA_*
 * environment variable, which is then not read at all.
 */
typedef struct {
    uint64_t          field_mask;    /**< EMA_INIT_PARAM_FIELD_* bits. */
    ema_memory_kind_t memory_kind;   /**< Overrides EMA_MEMORY_KIND. */
    size_t            device_memory; /**< Capacity in bytes, at least one segment, rounded
                                          down to whole segments; overrides
                                          EMA_DEVICE_MEMORY. */
    size_t            segment_size;  /**< Segment size; overrides EMA_SEGMENT_SIZE. */
} ema_init_params_t;

/**
 * Join the ema world.  Collective over every process of the job.  Under
 * mpirun/prterun the world is the PMIx job; a process started with no
 * launcher is a world of one.  @a params may be NULL.  A failed ema_init()
 * changes nothing and may be retried (by every rank); under a launcher
 * PMIx stays connected across failed tries until ema_finalize().
 * EMA_ERR_INVALID_PARAM when the capacity is less than one segment.
 * Cost: one PMIx fence plus endpoint creation to every peer.
 * Released by ema_finalize().
 */
EMA_EXPORT ema_status_t ema_init(const ema_init_params_t *params);

/** Leave the world; collective.  Frees every window still allocated. */
EMA_EXPORT ema_status_t ema_finalize(void);

/** This process's rank in the world. */
EMA_EXPORT ema_status_t ema_world_rank(int *rank_p);

/** The number of processes in the world. */
EMA_EXPORT ema_status_t ema_world_size(int *size_p);

/**
 * Block until every rank has called ema_barrier().  Collective.  Does not
 * complete puts or gets (flush first), but the owner's plain stores to its
 * own part before the barrier are seen by peers' ema_get() after it (cuda:
 * once the kernel or copy that wrote them has completed), and a grow before
 * it by peers' ema_win_size() after it.  Without a progress thread it runs
 * this rank's migrations and their reclaim callbacks (ema(7) MIGRATION).
 */
EMA_EXPORT ema_status_t ema_barrier(void);

/**
 * Make communication progress from the calling thread.  Needed only when the
 * progress thread is disabled (EMA_PROGRESS_THREAD=0); it then also runs this
 * rank's migrations (a lender's recall, a prefetch) and their reclaim
 * callbacks, which never wait for ranges held with ema_win_acquire(), so it
 * never blocks.  Returns EMA_SUCCESS if anything progressed, EMA_INPROGRESS
 * if there was nothing to do.
 */
EMA_EXPORT ema_status_t ema_progress(void);

/** A static string naming @a status.  Safe to call at any time. */
EMA_EXPORT const char *ema_strerror(ema_status_t status);

/** The library version as "major.minor.patch".  Safe to call at any time. */
EMA_EXPORT const char *ema_version_string(void);

/**
 * Print every EMA_* environment variable with its value, default, syntax and
 * help text, in the form "EMA_NAME=value".  Safe to call before ema_init().
 */
EMA_EXPORT ema_status_t ema_config_print(FILE *stream);

/** What ema_info_print() reports. */
enum {
    EMA_INFO_VERSION   = 1u << 0, /**< library and dependency versions */
    EMA_INFO_TOPOLOGY  = 1u << 1, /**< GPUs, NUMA nodes and links (works before init) */
    EMA_INFO_WORLD     = 1u << 2, /**< rank, size, memory kind, capacity (needs init) */
    EMA_INFO_TRANSPORT = 1u << 3, /**< UCX transports in use between ranks (needs init) */
    EMA_INFO_ALL       = 0xffu    /**< all parts; bits 4-7 are reserved for later ones */
};

/**
 * Print a human-readable report to @a stream.  Parts that need a world
 * (EMA_INFO_WORLD, EMA_INFO_TRANSPORT) are skipped with a note before
 * ema_init().  Used by ema_info(1).
 */
EMA_EXPORT ema_status_t ema_info_print(FILE *stream, unsigned flags);

/* ------------------------------------------------------------------------- */
/* Windows                                                                    */
/* ------------------------------------------------------------------------- */

/** Fields of ema_win_params_t that are set. */
enum {
    EMA_WIN_PARAM_FIELD_MAX_SIZE = 1ull << 0
};

/** Options of ema_win_allocate(). */
typedef struct {
    uint64_t field_mask; /**< EMA_WIN_PARAM_FIELD_* bits. */
    size_t   max_size;   /**< Largest size this rank's part may grow to.
                              Address space for it is reserved up front.
                              Default: the size given, rounded to segments. */
} ema_win_params_t;

/**
 * Allocate a window.  Collective.  Each rank gives the size of its own part
 * (0 is allowed) and receives the base address of its own part, which stays
 * the same for the window's lifetime.  @a params may be NULL.  Ends with a
 * barrier, so every rank knows the window before any rank uses it.
 * Cost: one allgather, one barrier, one map per segment.
 * Released by ema_win_free().
 */
EMA_EXPORT ema_status_t ema_win_allocate(size_t size, const ema_win_params_t *params,
                                         void **base_p, ema_win_h *win_p);

/** Free a window.  Collective; completes outstanding operations first. */
EMA_EXPORT ema_status_t ema_win_free(ema_win_h win);

/**
 * The size in bytes of @a rank's part of @a win: for another rank's part,
 * this rank's cached size, updated asynchronously after the owner's grow
 * returns and certainly after a barrier that follows it.  Put and get past
 * the cached size ask the owner first, so they never fail for grown bytes.
 */
EMA_EXPORT ema_status_t ema_win_size(ema_win_h win, int rank, size_t *size_p);

/* ------------------------------------------------------------------------- */
/* One-sided communication                                                    */
/* ------------------------------------------------------------------------- */

/**
 * Write @a len bytes from @a buf to @a rank's part of @a win at @a offset.
 * Returns when @a buf may be reused; the data is visible at the target after
 * ema_win_flush().  Fails with EMA_ERR_RANGE, writing nothing, when
 * [offset, offset+len) is not inside the part.
 */
EMA_EXPORT ema_status_t ema_put(ema_win_h win, int rank, size_t offset,
                                const void *buf, size_t len);

/** Read @a len bytes at @a offset of @a rank's part into @a buf; returns when
 *  the data has arrived. */
EMA_EXPORT ema_status_t ema_get(ema_win_h win, int rank, size_t offset,
                                void *buf, size_t len);

/**
 * Non-blocking put.  On EMA_SUCCESS *req_p is a request that must be passed
 * to ema_wait() or to ema_test() until it completes; @a buf must not be
 * changed before then.  Remote completion still needs ema_win_flush().
 */
EMA_EXPORT ema_status_t ema_put_nb(ema_win_h win, int rank, size_t offset,
                                   const void *buf, size_t len, ema_request_h *req_p);

/** Non-blocking get; @a buf holds the data once the request completes. */
EMA_EXPORT ema_status_t ema_get_nb(ema_win_h win, int rank, size_t offset,
                                   void *buf, size_t len, ema_request_h *req_p);

/** Wait for @a req to complete and release it.  Returns the operation's status. */
EMA_EXPORT ema_status_t ema_wait(ema_request_h req);

/**
 * Test @a req.  EMA_INPROGRESS: not complete, the request stays valid.
 * Anything else: complete, the request is released, and the value is the
 * operation's status.
 */
EMA_EXPORT ema_status_t ema_test(ema_request_h req);

/** Complete, at the target, every put and get this rank issued to @a rank's part. */
EMA_EXPORT ema_status_t ema_win_flush(ema_win_h win, int rank);

/** Complete every outstanding operation of this rank on @a win. */
EMA_EXPORT ema_status_t ema_win_flush_all(ema_win_h win);

/**
 * Atomically add @a value to the 64-bit word at @a offset (8-byte aligned) of
 * @a rank's part; the previous value is stored in *old_p.  old_p may be NULL.
 * Returns when the operation has completed at the target.
 */
EMA_EXPORT ema_status_t ema_fetch_add(ema_win_h win, int rank, size_t offset,
                                      uint64_t value, uint64_t *old_p);

/**
 * Atomically replace the 64-bit word at @a offset with @a value if it equals
 * @a compare; the previous value is stored in *old_p (may be NULL).
 */
EMA_EXPORT ema_status_t ema_compare_swap(ema_win_h win, int rank, size_t offset,
                                         uint64_t compare, uint64_t value,
                                         uint64_t *old_p);

/* ------------------------------------------------------------------------- */
/* Elastic windows: grow, shrink, reclaim                                     */
/* ------------------------------------------------------------------------- */

/** A timeout that never expires. */
#define EMA_TIMEOUT_INFINITE UINT64_MAX

/**
 * Grow this rank's part of @a win to @a new_size bytes (not collective).
 * Takes free local memory first, then memory this rank has lent out (an
 * implicit reclaim), then borrows segments from peers in lender order (the
 * most lendable memory by each peer's current figure), then spills to host
 * memory (EMA_SPILL=host).  The base pointer does not move;
 * new bytes are mapped after the old ones.  @a new_size must not exceed the
 * window's max_size.  EMA_ERR_NO_MEMORY, with the part unchanged, when
 * nothing can supply the memory.  Cost: one round trip per lender asked,
 * plus a map per segment.
 */
EMA_EXPORT ema_status_t ema_win_grow(ema_win_h win, size_t new_size);

/**
 * Shrink this rank's part of @a win to @a new_size bytes (not collective).
 * The segments past the new size are dropped wherever they live (borrowed
 * ones given back, spilled ones freed, local ones freed); then the kept
 * segments that are away come home into free local memory, spilled first,
 * then borrowed, held ones skipped (a migration: ema(7) MIGRATION; the
 * reclaim callback runs on the calling thread).  The data of the first
 * @a new_size bytes is kept.  Waits until every rank has stopped using the
 * dropped memory.  Never drops held memory: EMA_ERR_STATE, with the part
 * unchanged, while a segment with bytes past @a new_size is held with
 * ema_win_acquire() (release it first).
 */
EMA_EXPORT ema_status_t ema_win_shrink(ema_win_h win, size_t new_size);

/**
 * Make @a bytes of this rank's capacity free and withheld (neither lent nor
 * used) until ema_reclaim_release(): free memory counts first, the lending
 * reserve included, then memory lent to peers is recalled.  To take back
 * everything lent, pass bytes_free + bytes_lent (ema_mem_stat()).  The
 * borrowers move their data elsewhere (their own free memory, another
 * lender, or the spill tier); no byte is lost.  Segments a borrower holds
 * with ema_win_acquire() stay until released, the others move at once.
 * Waits at most @a timeout_ms milliseconds (EMA_TIMEOUT_INFINITE: no limit).
 * On EMA_ERR_TIMEOUT or EMA_ERR_NO_MEMORY what came back stays withheld,
 * the rest is still lent, and the whole of @a bytes counts as withheld
 * (bytes_withheld); the clean retry is ema_reclaim_release(bytes_withheld)
 * then ema_reclaim(bytes).
 */
EMA_EXPORT ema_status_t ema_reclaim(size_t bytes, uint64_t timeout_ms);

/** Let @a bytes withheld by ema_reclaim() be lent (and used) again. */
EMA_EXPORT ema_status_t ema_reclaim_release(size_t bytes);

/**
 * Called on the owner before [offset, offset+len) of its part moves to other
 * memory: once per recall (held ranges included), and before a shrink's or a
 * prefetch's moves home and a prefetch policy's moves (ema_win_set_policy()).
 * Runs without the window's lock (it may call ema_win_release(),
 * ema_win_acquire(), ema_win_stat()), on the progress thread for a recall,
 * a prefetch or a policy (without one: inside ema_progress(),
 * ema_barrier() or ema_win_free()), on the calling thread for a shrink.
 * A held range never moves, so the owner may keep using it until it
 * releases it; a range not held must be left alone by plain loads and
 * stores from then until the move is over (ema_win_acquire() it to use it
 * again).  Put/get through EMA need no care.  See ema(7) MIGRATION.
 */
typedef void (*ema_reclaim_cb)(ema_win_h win, size_t offset, size_t len, void *arg);

/** Register (or, with cb NULL, remove) the reclaim callback of @a win. */
EMA_EXPORT ema_status_t ema_win_set_reclaim_cb(ema_win_h win, ema_reclaim_cb cb, void *arg);

/**
 * Mark [offset, offset+len) of this rank's own part as in use: until
 * ema_win_release() its segments are not moved.  Migrations never wait for
 * them: a recall, a shrink's moves home and a prefetch leave them where they
 * are and move the rest of their batch at once; a recalled segment moves
 * once released (a lender whose timeout expires first gets EMA_ERR_TIMEOUT).
 * Waits out a move already in progress, then pins.  Acquires nest (counted
 * per segment).  A held segment is never dropped: ema_win_shrink() fails
 * with EMA_ERR_STATE while it is held.  See ema(7) MIGRATION.
 */
EMA_EXPORT ema_status_t ema_win_acquire(ema_win_h win, size_t offset, size_t len);

/** Release a range marked with ema_win_acquire(); a recall waiting for it
 *  moves it then. */
EMA_EXPORT ema_status_t ema_win_release(ema_win_h win, size_t offset, size_t len);

/**
 * Hint: bring [offset, offset+len) of this rank's own part into its own
 * memory.  Returns at once; the progress engine moves the borrowed and
 * spilled segments of the range into free local memory, spilled ones first,
 * then borrowed ones, each from @a offset on,
 * as far as there is free local memory (nothing is reclaimed or evicted for
 * it).  Segments held with ema_win_acquire() are left where they are.  The
 * moves are migrations (ema(7) MIGRATION; the reclaim callback runs where
 * the prefetch does): see ema_win_set_reclaim_cb() for the owner's plain
 * stores meanwhile.  ema_win_stat() shows the result.
 */
EMA_EXPORT ema_status_t ema_win_prefetch(ema_win_h win, size_t offset, size_t len);

/* ------------------------------------------------------------------------- */
/* Prefetch policy: a sliding window over the groups an application walks     */
/* ------------------------------------------------------------------------- */

/** A byte range of a window's own part. */
typedef struct {
    size_t offset; /**< byte offset in this rank's own part */
    size_t length; /**< bytes, at least 1 */
} ema_win_range_t;

/** Fields of ema_win_policy_params_t that are set. */
enum {
    EMA_WIN_POLICY_PARAM_FIELD_RANGES = 1ull << 0, /**< ranges and count */
    EMA_WIN_POLICY_PARAM_FIELD_DEPTH  = 1ull << 1, /**< depth; default 1 */
    EMA_WIN_POLICY_PARAM_FIELD_FLAGS  = 1ull << 2  /**< flags; default 0 */
};

/** ema_win_policy_params_t.flags. */
enum {
    /** The walk wraps: after the last group comes the first again (decode
     *  steps over the same layers).  Without it the groups ahead of the last
     *  are none, and a walk restarts with ema_win_advance(win, 0). */
    EMA_WIN_POLICY_FLAG_CYCLIC   = 1u << 0,
    /** Never move groups behind the walk out to make room: bring groups
     *  ahead home only into free local memory. */
    EMA_WIN_POLICY_FLAG_NO_EVICT = 1u << 1,
    /** The application does not write the groups while the policy is set
     *  (weights, say).  A group brought home from the spill tier keeps its
     *  copy there, and when it has to leave again it is remapped to that
     *  copy, with no copy back (counted in bytes_dropped).  A write to such
     *  a group (a kernel, ema_put, from any rank) may be lost at its next
     *  eviction.  The kept copies count against EMA_SPILL_SIZE until the
     *  policy is replaced or removed, or the window shrinks past them. */
    EMA_WIN_POLICY_FLAG_READ_ONLY = 1u << 2,
    /** ema_win_advance(win, g) makes group g itself local before the
     *  groups ahead (after the moves out that make room for all of them)
     *  and returns once it is, or once the policy's run for g ended without it
     *  (held, no room, or deferred for a lender's reclaim): compute that
     *  reads a group several times (a GEMM's tiles, say) then waits for one
     *  transfer instead of reading remote memory at every pass.  Without
     *  it ema_win_advance never waits, and a group the policy has not
     *  brought yet is read where it is. */
    EMA_WIN_POLICY_FLAG_WAIT = 1u << 3
};

/**
 * Options of ema_win_set_policy().  ranges[i] is group i, in the order the
 * application walks them (any offsets; groups must not overlap).  The
 * array is copied.
 */
typedef struct {
    uint64_t               field_mask; /**< EMA_WIN_POLICY_PARAM_FIELD_* bits */
    const ema_win_range_t *ranges;     /**< [count] groups in walk order */
    size_t                 count;      /**< groups; 0 removes the policy */
    unsigned               depth;      /**< groups kept local ahead of the
                                            current one, 1..count */
    unsigned               flags;      /**< EMA_WIN_POLICY_FLAG_* bits */
} ema_win_policy_params_t;

/**
 * Set (replace) the prefetch policy of this rank's own part of @a win, or
 * remove it (@a params NULL, or count 0).  The walk starts before group 0:
 * the progress engine at once starts making groups 0..depth-1 local.  Then
 * each ema_win_advance(win, g) makes groups g+1..g+depth local (wrapping
 * with EMA_WIN_POLICY_FLAG_CYCLIC), moving segments of groups behind g out
 * to borrowed or spilled memory only where free local memory is short.
 * Never moves a segment held with ema_win_acquire(); defers its moves while
 * a lender's reclaim of this rank's borrowed memory runs.  Not collective.
 * Cost: a copy of the ranges and a queued job.  Removed by
 * ema_win_set_policy(win, NULL) or ema_win_free().
 */
EMA_EXPORT ema_status_t ema_win_set_policy(ema_win_h win, const ema_win_policy_params_t *params);

/**
 * Report that the application now works on group @a group of the policy
 * (0..count-1; any order).  It records the position with atomics and, if
 * the policy's job is not queued already, queues it (a short insert under
 * the job queue's mutex and a wake-up of the progress engine).  Never
 * waits, but with EMA_WIN_POLICY_FLAG_WAIT: then it returns once group
 * @a group is local or the policy's run for it is over (and runs the job
 * itself where no progress thread does).
 * EMA_ERR_STATE when the window has no policy.
 */
EMA_EXPORT ema_status_t ema_win_advance(ema_win_h win, size_t group);

/** ema_win_policy_stat_t.group before the first ema_win_advance(). */
#define EMA_WIN_POLICY_NO_GROUP SIZE_MAX

/** Fields of ema_win_policy_stat_t, for its field_mask (output only). */
enum {
    EMA_WIN_POLICY_STAT_FIELD_COUNT             = 1ull << 0,
    EMA_WIN_POLICY_STAT_FIELD_DEPTH             = 1ull << 1,
    EMA_WIN_POLICY_STAT_FIELD_GROUP             = 1ull << 2,
    EMA_WIN_POLICY_STAT_FIELD_BYTES_AHEAD       = 1ull << 3,
    EMA_WIN_POLICY_STAT_FIELD_BYTES_AHEAD_LOCAL = 1ull << 4,
    EMA_WIN_POLICY_STAT_FIELD_BYTES_PREFETCHED  = 1ull << 5,
    EMA_WIN_POLICY_STAT_FIELD_BYTES_EVICTED     = 1ull << 6,
    EMA_WIN_POLICY_STAT_FIELD_SKIPPED_HELD      = 1ull << 7,
    EMA_WIN_POLICY_STAT_FIELD_DEFERRED          = 1ull << 8,
    EMA_WIN_POLICY_STAT_FIELD_RUNS              = 1ull << 9,
    EMA_WIN_POLICY_STAT_FIELD_BYTES_DROPPED     = 1ull << 10
};

/**
 * The policy of one window part.  field_mask is output only, as in
 * ema_win_stat_t.  The counters cover the window's lifetime, across
 * policies.
 */
typedef struct {
    uint64_t field_mask;        /**< out: EMA_WIN_POLICY_STAT_FIELD_* bits written */
    size_t   count;             /**< groups of the policy (0: none) */
    unsigned depth;             /**< groups kept local ahead */
    size_t   group;             /**< last group advanced to, or EMA_WIN_POLICY_NO_GROUP */
    size_t   bytes_ahead;       /**< bytes of the groups to keep local now (the
                                     current one too with EMA_WIN_POLICY_FLAG_WAIT) */
    size_t   bytes_ahead_local; /**< of those, in this rank's own memory now */
    uint64_t bytes_prefetched;  /**< moved home by the policy (whole segments) */
    uint64_t bytes_evicted;     /**< moved out (borrowed or spilled) by the policy
                                     (whole segments) */
    uint64_t skipped_held;      /**< segment moves left out: held (ema_win_acquire) */
    uint64_t deferred;          /**< runs deferred for a lender's reclaim */
    uint64_t runs;              /**< runs of the policy's job */
    uint64_t bytes_dropped;     /**< of bytes_evicted, moved out with no copy
                                     (EMA_WIN_POLICY_FLAG_READ_ONLY) */
    uint64_t reserved[7];       /**< room for later fields; this version leaves it alone */
} ema_win_policy_stat_t;

/**
 * The prefetch policy of this rank's part of @a win and what it did.
 * Works without a policy (count 0, the counters so far).  Cost: one load
 * per segment of the groups ahead, under the window's lock.
 */
EMA_EXPORT ema_status_t ema_win_policy_stat(ema_win_h win, ema_win_policy_stat_t *stat_p);

/**
 * Fields of ema_win_stat_t, for its field_mask.  One bit per field; bits
 * are never renumbered, and a later version adds fields in reserved[].
 */
enum {
    EMA_WIN_STAT_FIELD_SIZE           = 1ull << 0,
    EMA_WIN_STAT_FIELD_MAX_SIZE       = 1ull << 1,
    EMA_WIN_STAT_FIELD_BYTES_LOCAL    = 1ull << 2,
    EMA_WIN_STAT_FIELD_BYTES_BORROWED = 1ull << 3,
    EMA_WIN_STAT_FIELD_BYTES_SPILLED  = 1ull << 4,
    EMA_WIN_STAT_FIELD_MIGRATIONS     = 1ull << 5,
    EMA_WIN_STAT_FIELD_BYTES_WANTED   = 1ull << 6
};

/**
 * Where the bytes of one window part live.  field_mask is output only: the
 * call fills every field this version knows and sets field_mask to their
 * EMA_WIN_STAT_FIELD_* bits; what the caller left in it is ignored, so an
 * uninitialised struct works.  reserved[] is never written: a later version
 * adds fields there and a bit for each.
 */
typedef struct {
    uint64_t field_mask;     /**< out: EMA_WIN_STAT_FIELD_* bits of the fields written */
    size_t   size;           /**< current size of this rank's part */
    size_t   max_size;       /**< reserved address space */
    size_t   bytes_local;    /**< in this rank's own memory */
    size_t   bytes_borrowed; /**< in peers' memory */
    size_t   bytes_spilled;  /**< in the host spill tier */
    uint64_t migrations;     /**< segments of this part moved so far */
    /** Borrowed bytes that lenders asked to have back but that could not
     *  move (no free local memory, no other lender, no spill tier): the
     *  lender's reclaim failed with EMA_ERR_NO_MEMORY.  Release that much
     *  (shrink the part) and the lender's next try finds room to move them
     *  to.  Counts those segments while they are in the part. */
    size_t   bytes_wanted;
    uint64_t reserved[8];    /**< room for later fields; this version leaves it alone */
} ema_win_stat_t;

/**
 * This rank's part of @a win: fills every field of *stat_p and sets
 * stat_p->field_mask to them.  Cost: one load per segment of the part.
 */
EMA_EXPORT ema_status_t ema_win_stat(ema_win_h win, ema_win_stat_t *stat_p);

/**
 * Fields of ema_mem_stat_t, for its field_mask.  One bit per field; bits
 * are never renumbered, and a later version adds fields in reserved[].
 */
enum {
    EMA_MEM_STAT_FIELD_CAPACITY        = 1ull << 0,
    EMA_MEM_STAT_FIELD_RESERVE         = 1ull << 1,
    EMA_MEM_STAT_FIELD_BYTES_FREE      = 1ull << 2,
    EMA_MEM_STAT_FIELD_BYTES_USED      = 1ull << 3,
    EMA_MEM_STAT_FIELD_BYTES_LENT      = 1ull << 4,
    EMA_MEM_STAT_FIELD_BYTES_WITHHELD  = 1ull << 5,
    EMA_MEM_STAT_FIELD_BYTES_BORROWED  = 1ull << 6,
    EMA_MEM_STAT_FIELD_BYTES_SPILLED   = 1ull << 7,
    EMA_MEM_STAT_FIELD_RECLAIMS        = 1ull << 8,
    EMA_MEM_STAT_FIELD_BYTES_MIGRATED  = 1ull << 9,
    EMA_MEM_STAT_FIELD_RECLAIM_LAST_US = 1ull << 10,
    EMA_MEM_STAT_FIELD_RECLAIM_MAX_US  = 1ull << 11,
    EMA_MEM_STAT_FIELD_MEMORY_KIND     = 1ull << 12,
    EMA_MEM_STAT_FIELD_DEVICE          = 1ull << 13,
    EMA_MEM_STAT_FIELD_BYTES_UNMET     = 1ull << 14
};

/**
 * This rank's memory and its lending.  field_mask is output only, as in
 * ema_win_stat_t, with EMA_MEM_STAT_FIELD_* bits.
 */
typedef struct {
    uint64_t field_mask;       /**< out: EMA_MEM_STAT_FIELD_* bits of the fields written */
    size_t   capacity;         /**< EMA_DEVICE_MEMORY, whole segments */
    size_t   reserve;          /**< never lent (EMA_LEND_RESERVE) */
    size_t   bytes_free;       /**< free, lendable or not */
    size_t   bytes_used;       /**< backing this rank's own windows */
    size_t   bytes_lent;       /**< backing peers' windows */
    size_t   bytes_withheld;   /**< reclaimed and withheld (ema_reclaim) */
    size_t   bytes_borrowed;   /**< peers' memory backing this rank's windows */
    size_t   bytes_spilled;    /**< spill tier backing this rank's windows */
    uint64_t reclaims;         /**< reclaims that recalled lent memory */
    uint64_t bytes_migrated;   /**< bytes of own windows moved (reclaims, shrink, prefetch),
                                    whole segments */
    double   reclaim_last_us;  /**< duration of the last reclaim */
    double   reclaim_max_us;   /**< longest reclaim */
    ema_memory_kind_t memory_kind; /**< host or cuda: what window base pointers point to */
    int      device;           /**< cuda: the CUDA device ordinal in use; host: -1 */
    uint64_t bytes_unmet;      /**< peers asked to borrow and this rank had none to lend */
    uint64_t reserved[7];      /**< room for later fields; this version leaves it alone */
} ema_mem_stat_t;

/**
 * Statistics of this rank's memory: fills every field of *stat_p and sets
 * stat_p->field_mask to them.  Cost: a few loads.
 */
EMA_EXPORT ema_status_t ema_mem_stat(ema_mem_stat_t *stat_p);

#ifdef __cplusplus
}
#endif

#endif /* EMA_H_ */
