/*
 * The EMA_AM_WIN messages (coherence.c has the protocol): their wire
 * format, and the waiter a request registers for its reply.  A header of
 * its own so that the fuzz harness (tests/fuzz) can build valid messages
 * and live waiters; nothing else in src/ includes it.
 */
#ifndef EMA_WIN_COHERENCE_H_
#define EMA_WIN_COHERENCE_H_

#include "win.h"

enum {
    EMA_WIN_MSG_INVAL = 1,
    EMA_WIN_MSG_ACK,
    EMA_WIN_MSG_UPDATE,
    EMA_WIN_MSG_TABLE_REQ,
    EMA_WIN_MSG_TABLE_REP,
    EMA_WIN_MSG_AMO,     /* an atomic for the holder of the word to perform */
    EMA_WIN_MSG_AMO_REP  /* its result */
};

typedef struct {
    uint32_t type;
    uint32_t win_id;
    int32_t  part;
    uint32_t first;   /* AMO: the tier; AMO_REP: the status */
    uint32_t count;   /* AMO: 1 compare-and-swap, 0 fetch-and-add */
    uint32_t nsegs;
    uint64_t version;
    uint64_t size;
    uint64_t token; /* the waiter's id (xport/waiter.c), echoed back */
    /* AMO: address, operand, swap value; AMO_REP: arg[0] the old value */
    uint64_t arg[3];
    /* UPDATE / TABLE_REP: count locations follow */
} ema_win_msg_t;

/* A request waiting for its reply, in xport's waiter table (kind
 * EMA_AM_WIN).  A reply reaches it only if it is of the type awaited and
 * comes from the rank asked; an invalidation counts at most per_peer
 * acknowledgements from each peer. */
typedef struct ema__win_waiter {
    atomic_int done;
    uint32_t   type;     /* the reply awaited: EMA_WIN_MSG_ACK, _TABLE_REP, _AMO_REP */
    int        peer;     /* the rank asked; -1 (ACK): every peer */
    uint32_t   per_peer; /* ACK: acknowledgements each peer owes (one per run) */
    uint32_t  *acked;    /* ACK: [size] counted so far, by peer */
    uint64_t   value;    /* AMO_REP: the old value */
    int32_t    status;   /* AMO_REP */
} ema__win_waiter_t;

#endif
