/*
 * The lending protocol's private header, shared by the files of src/pool:
 * the messages, the jobs, and the functions one side calls of another.
 *
 *   msg.c       the messages: the diagram, sending, the one dispatch point
 *   lender.c    the lender's side: grants, give-backs, refusals, reclaim
 *   borrower.c  the borrower's side: lender order, borrowing, giving back,
 *               recalls (the window moves the data: win/migrate.c)
 *   pool.c      lifecycle, configuration, prefault, advertisements, stats
 *   api.c       ema_reclaim, ema_reclaim_release, ema_mem_stat
 */
#ifndef EMA_POOL_PRIV_H_
#define EMA_POOL_PRIV_H_

#include "pool.h"

#include <stdlib.h>
#include <string.h>

enum {
    EMA_POOL_MSG_BORROW = 1,
    EMA_POOL_MSG_GRANT,
    EMA_POOL_MSG_GIVEBACK,
    EMA_POOL_MSG_RECALL,
    EMA_POOL_MSG_REFUSE, /* recalled segments the borrower has nowhere to move */
    EMA_POOL_MSG_ADVERT  /* the sender's lendable segments changed (left) */
};

typedef struct {
    uint32_t type;
    uint32_t count;
    uint64_t token;
    uint64_t left;   /* GRANT, ADVERT: lendable segments the sender has left */
    /* GRANT: count x uint32 segs, count x int64 handles; GIVEBACK/RECALL/
     * REFUSE: count x uint32 segs */
} ema_pool_msg_t;

/* A borrower waiting for a GRANT. */
typedef struct {
    atomic_int done;
    int        lender;   /* the rank asked: a grant from another is dropped */
    uint32_t   want;
    uint32_t   count;
    uint32_t  *segs;
    int64_t   *handles;
} ema_pool_waiter_t;

/* A message handled outside the UCX callback (BORROW, RECALL). */
typedef struct ema_pool_job {
    ema__pool_t         *pool;
    struct ema_pool_job *next;     /* parked: see ema_pool_park */
    int                  src;
    uint8_t             *told;     /* RECALL: [msg.count], the owner's callback heard of
                                      segs[k] (in the same allocation, after segs) */
    ema_pool_msg_t       msg;
    uint32_t             segs[];
} ema_pool_job_t;


/* Segments in rank @r's arena, as its export says: the bound of every
 * segment index and lendable figure that rank sends. */
static inline uint64_t ema__pool_peer_nsegs(const ema__pool_t *pool, int r)
{
    return pool->win->exports[EMA_TIER_DEVICE][r].capacity / pool->win->seg_size;
}

/* msg.c */
/* The default send (ema__pool_send_cb): an active message on EMA_AM_POOL
 * of @arg, the rank's ema__xport_t. */
ema_status_t ema__pool_send_ucx(void *arg, int peer, const void *hdr, size_t hlen,
                                const void *payload, size_t plen);
/* Send @m and @payload to @peer through pool->send. */
ema_status_t ema__pool_send(ema__pool_t *pool, int peer, const ema_pool_msg_t *m,
                            const void *payload, size_t plen);
/* The one dispatch point of EMA_AM_POOL: checks the sender, the length and
 * the type, then hands the message to its side, which checks its fields
 * before it changes anything; a malformed message is logged once per kind
 * and dropped.  Also the entry point of the unit tests' loopback. */
void         ema__pool_dispatch(void *arg, int src, const void *data, size_t len);
void         ema__pool_advertise_job(void *arg);
/* A rank is lost: take back what was lent to it (an ema__lost_cb). */
void         ema__pool_peer_lost(void *arg, int peer);

/* lender.c */
/* Lendable now: free segments beyond the reserve and the withheld ones.
 * Requires pool->lock. */
uint32_t     ema__pool_lendable_locked(ema__pool_t *pool);
void         ema__pool_borrow_job(void *arg);
/* GIVEBACK: every segment lent to @src, once, or nothing changes
 * (EMA_ERR_INVALID_PARAM, logged). */
ema_status_t ema__pool_take_back(ema__pool_t *pool, int src, uint32_t count,
                                 const uint32_t *segs);
void         ema__pool_refused(ema__pool_t *pool, int src, uint32_t count,
                               const uint32_t *segs);

/* borrower.c */
void         ema__pool_granted(ema__pool_t *pool, int src, const ema_pool_msg_t *m,
                               const char *payload, size_t plen);
void         ema__pool_recall_job(void *arg);
/* The memory provider of the windows (ema__win_mem_ops_t). */
extern const ema__win_mem_ops_t ema__pool_mem_ops;

#endif
