/*
 * The UCX transport: one context and one worker per rank, an endpoint to
 * every peer, registered memory with each peer's rkey, RMA and atomics,
 * active messages for control traffic, and small collectives built on them.
 *
 * The worker is created UCS_THREAD_MODE_MULTI: the application's threads and
 * the progress thread share it.  UCX serialises access internally; EMA adds no
 * lock of its own on the put/get path.
 */
#ifndef EMA_XPORT_H_
#define EMA_XPORT_H_

#include <ema.h>

#include "util/config.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "util/log.h"

/* Active-message ids.  Each layer that sends control traffic owns one. */
enum {
    EMA_AM_COLL   = 1, /* barrier / allgather (xport/coll.c) */
    EMA_AM_WIN    = 2, /* window control (win) */
    EMA_AM_POOL   = 3, /* lending protocol (pool) */
    EMA_AM_MAX    = 8
};

/* Handler of an active message.  Runs in whichever thread progresses the
 * worker; @data is valid only during the call.  Must not block on progress. */
typedef void (*ema__am_handler_cb)(void *arg, int src, const void *data, size_t len);

/* Deferred work: run by the progress engine outside ucp_worker_progress(),
 * where blocking on the network is allowed. */
typedef void (*ema__defer_cb)(void *arg);

typedef struct ema__xport_config {
    int      wakeup;        /* use UCX wakeup (event fd) so idle threads sleep */
    int      peer_errors;   /* EMA_UCX_PEER_ERRORS: endpoints in UCX's peer error mode */
    double   peer_timeout;  /* EMA_PEER_TIMEOUT: seconds a peer may leave a request
                               unanswered before it counts as lost (0: no limit) */
} ema__xport_config_t;

/* What an upper layer does when a rank is lost (xport/peer.c); runs as a
 * quick job, outside UCX callbacks, once per rank. */
typedef void (*ema__lost_cb)(void *arg, int peer);

typedef struct ema__coll_slot {
    uint64_t  seq;
    int       count;  /* blobs in for seq; -1 once taken (complete) */
    void    **blobs;
    size_t   *lens;
} ema__coll_slot_t;

typedef struct ema__defer {
    ema__defer_cb      cb;
    void              *arg;
    int                owned; /* arg is malloc'ed: freed if dropped at teardown */
    struct ema__defer *next;
} ema__defer_t;

/* Deferred jobs (xport/sched.c): quick ones answer a peer and wait on
 * nothing remote; long ones (migrations) wait on peers. */
enum {
    EMA_JOB_QUICK = 0,
    EMA_JOB_LONG  = 1
};

/* Wait modes (xport/sched.c): what a waiting thread runs while it waits. */
enum {
    EMA_WAIT_NONE      = 0,   /* nothing: a local condition (in-flight counts) */
    EMA_WAIT_XPORT     = 1,   /* the UCX worker (its own UCX request) */
    EMA_WAIT_QUICK     = 2,   /* the worker and quick jobs: holds a lock of EMA's */
    EMA_WAIT_LONG      = 3,   /* and one long job per pass: holds no lock of EMA's */
    EMA_WAIT_MODE_MASK = 0xf,
    EMA_WAIT_NAP       = 0x10 /* a wait of milliseconds: sleep when idle */
};

/* A condition waited for; the flag form is the common one. */
typedef int (*ema__wait_cond_cb)(void *arg);
typedef struct {
    atomic_int *counter;
    int         target;
} ema__wait_flag_t;

/* The table of live waiters (xport/waiter.c). */
typedef struct ema__waiter_slot {
    void     *waiter;    /* NULL: free */
    unsigned  kind;      /* whose waiter: the AM id of the layer that waits */
    uint32_t  gen;       /* of the id last given out for this slot */
    uint32_t  next_free;
} ema__waiter_slot_t;

typedef struct ema__waiters {
    pthread_mutex_t     lock;
    ema__waiter_slot_t *slots;
    uint32_t            cap;
    uint32_t            free; /* first free slot, UINT32_MAX: none */
} ema__waiters_t;

/* What a reply does to its waiter; runs under the table's lock, so it
 * must only copy into the waiter and set its flags. */
typedef void (*ema__waiter_cb)(void *waiter, const void *arg);

typedef struct ema__xport {
    int                 rank;
    int                 size;
    ucp_context_h       context;
    ucp_worker_h        worker;
    ucp_address_t      *address;
    size_t              address_len;
    ucp_ep_h           *eps;
    int                 efd;
    ema__xport_config_t cfg;
    size_t              request_size; /* user space in each UCX request */
    unsigned            idle_mask;    /* ema__xport_idle yields every idle_mask+1 calls */
    long                cpus;         /* ema__cpus_usable() at start-up; 0 unknown */

    struct {
        ema__am_handler_cb cb;
        void              *arg;
    } am[EMA_AM_MAX];
    atomic_int am_closed; /* ema__xport_am_close: every message dropped */

    /* collectives: a rank can be at most one collective ahead of another */
    pthread_mutex_t  coll_lock;
    uint64_t         coll_seq;
    ema__coll_slot_t coll_slot[2];

    /* deferred work: [0] quick jobs (bounded local waits, e.g. answering an
     * invalidation), [1] long jobs (migrations).  Any waiting loop may run
     * quick jobs; only the progress engine's top level runs long ones. */
    pthread_mutex_t  defer_lock;
    ema__defer_t    *defer_head[2];
    ema__defer_t   **defer_tail[2];
    atomic_int       defer_count[2];

    /* Application threads on the worker (bits 0-15) and their exits (the
     * bits above, in EMA_XPORT_APP_EXIT units): the progress thread leaves
     * the worker to them meanwhile, and for a while after the last exit
     * (see ema_progress_thread_once).  One word on a line of its own: the
     * progress thread reads it at every pass, and an application thread
     * changes it twice per operation. */
    _Alignas(64) _Atomic uint64_t app_state;
    char             app_pad[64 - sizeof(uint64_t)];

    /* Lost peers (xport/peer.c): the one mark of a dead rank, read by
     * every wait on a peer and by put/get; set once, never cleared. */
    _Atomic uint8_t *lost;           /* [size] */
    atomic_uint      nlost;          /* ranks lost so far: ends waits on all */
    int32_t         *pid;            /* [size] the peers' processes (one node) */
    int             *pidfd;          /* [size] pidfd_open of each, -1: none */
    _Atomic uint64_t next_check_us;  /* when the pids are polled next */
    int              closing;        /* ema__xport_destroy: endpoint errors are expected */
    ema__lost_cb     lost_cb;        /* ema__xport_on_lost: the pool's */
    void            *lost_arg;

    char             transports[256]; /* as UCX reports them, for ema_info */
    ema__waiters_t   waiters;         /* ids sent in requests, for the replies */

    /* Tests only (tests/fuzz: a world without UCX, worker NULL): where
     * ema__xport_am_send hands its messages when set. */
    ema_status_t   (*send_hook)(void *arg, int peer, unsigned id, const void *hdr,
                                size_t hdr_len, const void *data, size_t len);
    void            *send_hook_arg;
} ema__xport_t;

/* A registered memory range: the local memh and packed rkey, and for each
 * peer the unpacked rkey and base address of that peer's matching range. */
/* A tier of every rank, registered as nreg regions of unit bytes each
 * (one region unless the memory kind needs one per allocation). */
typedef struct ema__xport_mr {
    ucp_mem_h   *memh;     /* [nreg] */
    uint32_t     nreg;
    size_t       unit;
    void        *rkey_buf; /* packed, for the peers */
    size_t       rkey_len;
    ucp_rkey_h **rkeys;    /* [size][nreg] */
    uint64_t    *bases;    /* [size] */
} ema__xport_mr_t;

#define EMA_XPORT_APP_MASK 0xffffu
#define EMA_XPORT_APP_EXIT ((uint64_t)1 << 16)

/* How deep this thread is in enter/leave pairs: only the outermost pair
 * touches the shared word (a blocking put enters, and so do the waits
 * inside it).  A process has one transport. */
extern __thread unsigned ema__xport_app_depth;

/* An application thread starts or stops using the worker (issuing or
 * waiting); the progress thread keeps off it meanwhile. */
static inline void ema__xport_app_enter(ema__xport_t *xp)
{
    if (ema__xport_app_depth++ == 0) {
        atomic_fetch_add_explicit(&xp->app_state, 1, memory_order_relaxed);
    }
}

static inline void ema__xport_app_leave(ema__xport_t *xp)
{
    if (--ema__xport_app_depth == 0) {
        /* one exit more, one thread less, in one step */
        atomic_fetch_add_explicit(&xp->app_state, EMA_XPORT_APP_EXIT - 1, memory_order_relaxed);
    }
}

/* The key for @raddr in @peer's registered memory. */
static inline ucp_rkey_h ema__xport_mr_rkey(const ema__xport_mr_t *mr, int peer, uint64_t raddr)
{
    return mr->rkeys[peer][(mr->nreg > 1) ? (raddr - mr->bases[peer]) / mr->unit : 0];
}

extern const ema_config_field_t ema__xport_config_table[];

ema_status_t ema__xport_create(ema__xport_t *xp, int rank, int size);
/* Connect to every peer given their worker addresses (from the modex). */
ema_status_t ema__xport_connect(ema__xport_t *xp, void *const *addrs);
void         ema__xport_destroy(ema__xport_t *xp);

void ema__xport_set_am_handler(ema__xport_t *xp, unsigned id, ema__am_handler_cb cb,
                               void *arg);
/* From here on every active message is dropped unread and unlogged: at
 * finalize, before the layers whose handlers they would reach are torn
 * down, while the endpoints' teardown still progresses the worker. */
void ema__xport_am_close(ema__xport_t *xp);
/* The one dispatch point of every active message (after UCX's callback
 * checked its header): drops, logged once per kind, a message on an id
 * with no handler or from a rank that is not a peer (outside the world, or
 * this rank), hands a misaligned payload over as an aligned copy, and calls
 * the id's handler, which checks the length and the type.  The fuzz
 * harness (tests/fuzz) calls it directly, without UCX. */
void ema__xport_am_dispatch(ema__xport_t *xp, unsigned id, int32_t src, const void *data,
                            size_t len);
/* Send an active message made of a header and a payload (either may be
 * empty) and wait for its local completion.  Must not be called from an AM
 * handler. */
ema_status_t ema__xport_am_send(ema__xport_t *xp, int peer, unsigned id, const void *hdr,
                                size_t hdr_len, const void *data, size_t len);

/* --- the wait primitive (xport/sched.c): every wait in EMA goes here ----- */

/* Wait until @cond(@arg) holds, running what @mode says (EMA_WAIT_*) in
 * each pass; EMA_ERR_TIMEOUT once ema__now_us() passes @deadline_us (0:
 * no deadline).  A long job's own waits use EMA_WAIT_QUICK. */
ema_status_t ema__xport_wait_until(ema__xport_t *xp, unsigned mode, double deadline_us,
                                   ema__wait_cond_cb cond, void *arg);
/* Whether *@arg (an ema__wait_flag_t) reached its target. */
int          ema__xport_flag_reached(void *arg);
/* A wait on @peer's answer (xport/peer.c): EMA_ERR_PEER_LOST as soon as
 * @peer is lost (-1: as soon as any rank is lost, for collectives), or
 * when it leaves the wait unanswered past EMA_PEER_TIMEOUT (it then counts
 * as lost); EMA_SUCCESS once @cond holds. */
ema_status_t ema__xport_wait_peer(ema__xport_t *xp, unsigned mode, int peer,
                                  ema__wait_cond_cb cond, void *arg);
ema_status_t ema__xport_wait_flag_peer(ema__xport_t *xp, unsigned mode, int peer,
                                       atomic_int *counter, int target);
/* Lost peers (xport/peer.c). */
void ema__xport_peers_init(ema__xport_t *xp);
void ema__xport_peers_cleanup(ema__xport_t *xp);
/* Watch @peer's process @pid (this node): its exit marks it lost. */
void ema__xport_peers_watch(ema__xport_t *xp, int peer, int32_t pid);
/* Poll the watched processes, at most every 2 ms (any thread). */
void ema__xport_peers_check(ema__xport_t *xp);
/* Mark @peer lost, once; any thread, UCX callbacks too. */
void ema__xport_mark_lost(ema__xport_t *xp, int peer, const char *why);
/* Run @cb(@arg, rank) (a quick job) for each rank lost (one hook: the
 * pool's; the windows read xp->lost directly). */
void ema__xport_on_lost(ema__xport_t *xp, ema__lost_cb cb, void *arg);

static inline int ema__xport_peer_lost(const ema__xport_t *xp, int peer)
{
    return xp->lost != NULL &&
           atomic_load_explicit(&xp->lost[peer], memory_order_relaxed) != 0;
}

/* One pass of a wait of @mode, then the idle policy if nothing happened:
 * for loops whose condition cannot be a callback. */
void         ema__xport_wait_step(ema__xport_t *xp, unsigned mode);
/* One pass: what it progressed and ran (0: nothing), no idling. */
unsigned     ema__xport_wait_pass(ema__xport_t *xp, unsigned mode);
/* The waiters' idle policy after an empty pass: yield now and then (see
 * ema__xport_idle), or with EMA_WAIT_NAP sleep once @idle empty passes
 * pile up; *@idle counts them (reset it after a pass that did something). */
void         ema__xport_wait_idle(ema__xport_t *xp, unsigned mode, unsigned *idle);
void         ema__xport_sched_init(ema__xport_t *xp);
void         ema__xport_sched_cleanup(ema__xport_t *xp);

ema_status_t ema__xport_mr_register(ema__xport_t *xp, void *addr, size_t len, size_t unit,
                                    int cuda, ema__xport_mr_t *mr);
ema_status_t ema__xport_mr_add_peer(ema__xport_t *xp, ema__xport_mr_t *mr, int peer,
                                    uint64_t base, const void *rkey_buf, size_t rkey_len);
void         ema__xport_mr_deregister(ema__xport_t *xp, ema__xport_mr_t *mr);

/* Progress the worker once; returns the number of events progressed. */
static inline unsigned ema__xport_progress(ema__xport_t *xp)
{
    return ucp_worker_progress(xp->worker);
}

/* Run queued deferred work: the quick jobs queued now, and with
 * EMA_WAIT_LONG one long job; returns how many ran. */
int  ema__xport_run_deferred(ema__xport_t *xp, unsigned mode);
/* Queue @cb(@arg) (EMA_JOB_QUICK or _LONG) to run outside UCX callbacks;
 * @arg is malloc'ed and freed if the job is dropped at teardown.  Quick
 * jobs must not wait on remote peers. */
void ema__xport_defer(ema__xport_t *xp, unsigned kind, ema__defer_cb cb, void *arg);
/* The same, but out of memory it returns EMA_ERR_NO_MEMORY, queues nothing
 * and runs nothing (ema__xport_defer then runs the job in place), for
 * callers that may hold a lock the job takes. */
ema_status_t ema__xport_try_defer(ema__xport_t *xp, unsigned kind, ema__defer_cb cb, void *arg);
/* The same for an @arg the job does not own (never freed here). */
void ema__xport_defer_ref(ema__xport_t *xp, unsigned kind, ema__defer_cb cb, void *arg);

/* Wait for a UCX request to complete (progressing), free it, map the status. */
ema_status_t ema__xport_wait(ema__xport_t *xp, ucs_status_ptr_t sp, const char *what);
/* The same for a request to @peer: EMA_ERR_PEER_LOST as soon as @peer is
 * lost (the request is left to UCX).  ema__xport_wait is this with -1:
 * it ends when any rank is lost meanwhile. */
ema_status_t ema__xport_wait_req(ema__xport_t *xp, ucs_status_ptr_t sp, int peer,
                                 const char *what);
ema_status_t ema__xport_status(ucs_status_t status);

ema_status_t ema__xport_flush_ep(ema__xport_t *xp, int peer);
ema_status_t ema__xport_flush(ema__xport_t *xp);

/* Collectives over active messages (xport/coll.c).  A barrier waits in
 * @mode: EMA_WAIT_LONG for a caller that holds no lock of EMA's, in a world
 * whose long jobs nothing else runs (no progress thread: ema_barrier). */
ema_status_t ema__xport_barrier(ema__xport_t *xp, unsigned mode);
/* Every rank contributes one blob; *blobs_p and *lens_p are arrays of size
 * (free with ema__xport_free_blobs). */
ema_status_t ema__xport_allgather(ema__xport_t *xp, const void *blob, size_t len,
                                  void ***blobs_p, size_t **lens_p);
void         ema__xport_free_blobs(ema__xport_t *xp, void **blobs, size_t *lens);
void         ema__xport_coll_init(ema__xport_t *xp);
void         ema__xport_coll_am(void *arg, int src, const void *data, size_t len);
void         ema__xport_coll_cleanup(ema__xport_t *xp);

/* Live waiters (xport/waiter.c): a request sends the id of its waiter,
 * never its address; the reply's handler reaches the waiter only through
 * ema__xport_waiter_call, which drops ids that are not live or not of its
 * @kind (the AM id of the layer waiting: EMA_AM_WIN, EMA_AM_POOL).  add
 * returns 0 when out of memory (0 is never a valid id); del before the
 * waiter's memory goes away. */
void     ema__xport_waiters_init(ema__xport_t *xp);
void     ema__xport_waiters_cleanup(ema__xport_t *xp);
uint64_t ema__xport_waiter_add(ema__xport_t *xp, void *waiter, unsigned kind);
void     ema__xport_waiter_del(ema__xport_t *xp, uint64_t id);
/* Run @cb(waiter, @arg) under the table's lock if @id is live and of
 * @kind: 1, else 0. */
int      ema__xport_waiter_call(ema__xport_t *xp, uint64_t id, unsigned kind,
                                ema__waiter_cb cb, const void *arg);

/* Yield the CPU inside a wait loop when nothing progressed: ranks are often
 * oversubscribed on few cores. */
void ema__xport_idle(ema__xport_t *xp);
/* How often ema__xport_idle yields, from the cores and the ranks. */
unsigned ema__xport_idle_mask(int size, long cpus);
/* Whether each rank and its progress thread can have a core of their own:
 * 2 * @size <= @cpus (cpus 0: unknown, so no). */
int      ema__xport_cores_plentiful(int size, long cpus);
/* The timer slack of EMA's short naps (the progress thread's, a reclaim's
 * wait): the default 50 us would stretch a 20 us nap to 70. */
#define EMA_NAP_TIMER_SLACK_NS 5000UL
/* The handler table's cells, one per AM id (xport/am.c). */
extern ema__xport_t *ema__xport_am_self[EMA_AM_MAX];

#endif
