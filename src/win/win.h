/*
 * Windows: each rank's part is a list of segments, each living in some rank's
 * arena (its own, for now).  The owner sees its part as one contiguous range
 * of address space; every rank routes put/get on (rank, offset) through the
 * part's segment table to (arena owner, arena offset) and issues UCX RMA
 * against that arena's registration.  One registration per arena, made at
 * init, so allocating a window registers nothing.
 */
#ifndef EMA_WIN_H_
#define EMA_WIN_H_

#include <ema.h>
#include <stdatomic.h>

#include "mem/mem.h"
#include "xport/xport.h"

#define EMA_WIN_MAGIC      0x454d4157u /* "EMAW" */
#define EMA_WIN_MAGIC_DEAD 0x44454144u /* "DEAD" */

/* Where one segment of a window part lives. */
typedef struct ema__seg_loc {
    int32_t  rank; /* whose arena */
    uint32_t seg;  /* segment index in that arena */
} ema__seg_loc_t;

typedef struct ema__win_part {
    size_t          size;   /* bytes */
    uint32_t        nsegs;
    ema__seg_loc_t *loc;    /* [nsegs] */
    int            *ranks;  /* distinct ranks holding the part (for flush) */
    int             nranks;
} ema__win_part_t;

/* The win layer's state, one per world. */
typedef struct ema__win_ctx {
    ema__xport_t      *xp;
    ema__mem_arena_t  *arena;
    ema__xport_mr_t    arena_mr;   /* the arena of every rank, registered */
    ema__mem_export_t *exports;    /* [size]: how to map each rank's segments */
    int                rank;
    int                size;
    size_t             seg_size;
    struct ema_win    *wins;       /* live windows */
    struct ema_win    *dead;       /* freed handles, kept until finalize so a
                                      stale handle is detected, not followed */
    uint32_t           next_id;
} ema__win_ctx_t;

struct ema_win {
    uint32_t         magic;
    uint32_t         id;
    ema__win_ctx_t  *ctx;
    void            *base;     /* own part */
    size_t           reserved; /* address space reserved at base */
    ema__win_part_t *parts;    /* [size] */
    struct ema_win  *next;
};

/* Request handles.  A request is either a UCX request (its user area holds
 * this struct), an aggregate of several UCX operations (malloc'ed), or the
 * static "already complete" request. */
#define EMA_REQ_MAGIC_UCX  0x52455155u
#define EMA_REQ_MAGIC_AGG  0x52454741u
#define EMA_REQ_MAGIC_DONE 0x52454444u

struct ema_request {
    uint32_t      magic;
    atomic_int    pending; /* aggregate: operations not yet complete */
    atomic_int    status;  /* aggregate: first error */
    ema__xport_t *xp;
};

ema_status_t ema__win_ctx_init(ema__win_ctx_t *ctx, ema__xport_t *xp, ema__mem_arena_t *arena,
                               int rank, int size);
/* Complete the setup once every rank's arena export and rkey are known. */
ema_status_t ema__win_ctx_connect(ema__win_ctx_t *ctx, void *const *blobs, const size_t *lens);
/* The blob this rank contributes to the modex: export + packed rkey. */
ema_status_t ema__win_ctx_blob(ema__win_ctx_t *ctx, void **blob_p, size_t *len_p);
void         ema__win_ctx_cleanup(ema__win_ctx_t *ctx);

/* Check a handle: EMA_ERR_INVALID_HANDLE for NULL, freed or foreign handles. */
static inline ema_status_t ema__win_check(ema_win_h win)
{
    if (win == NULL || win->magic != EMA_WIN_MAGIC) {
        return EMA_ERR_INVALID_HANDLE;
    }
    return EMA_SUCCESS;
}

#endif
