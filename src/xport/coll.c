/*
 * Barrier and allgather over active messages, for collectives after init
 * (window allocation, barriers).  PMIx fences cost milliseconds; these cost a
 * few round trips over shared memory.
 *
 * Sequence: each rank numbers its collectives 1, 2, 3...  For collective k,
 * rank r sends {k, blob} to every peer and waits for size-1 blobs tagged k.
 * A peer can be at most one collective ahead (it cannot finish k+1 before
 * this rank has sent its blob for k+1), so two slots, k%2, hold everything
 * that can arrive.
 */
#include "xport.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t seq;
} ema_coll_hdr_t;

void ema__xport_coll_am(void *arg, int src, const void *data, size_t len)
{
    ema__xport_t *xp = arg;
    ema_coll_hdr_t hdr;

    if (src < 0 || src >= xp->size || src == xp->rank) {
        ema_malformed("collective message from rank %d, not a peer: dropped", src);
        return;
    }
    if (len < sizeof(hdr)) {
        ema_malformed("short collective message from rank %d (%zu bytes): dropped", src, len);
        return;
    }
    memcpy(&hdr, data, sizeof(hdr));
    size_t plen = len - sizeof(hdr);
    void *copy  = malloc(plen ? plen : 1);
    if (copy == NULL) {
        ema_error("out of memory receiving a collective message");
        return;
    }
    memcpy(copy, (const char *)data + sizeof(hdr), plen);

    pthread_mutex_lock(&xp->coll_lock);
    /* A peer is in this rank's collective or at most one ahead (see the
     * top), and sends one blob per collective: any other sequence number,
     * a second blob, or a blob for a collective already complete here is
     * malformed, and would make the collective complete without a blob or
     * never. */
    ema__coll_slot_t *slot = &xp->coll_slot[hdr.seq & 1];
    const char *bad = NULL;
    if (hdr.seq == 0 || (hdr.seq != xp->coll_seq && hdr.seq != xp->coll_seq + 1)) {
        bad = "out of sequence";
    } else if (slot->seq == hdr.seq && slot->count < 0) {
        bad = "for a collective already complete";
    } else if (slot->seq == hdr.seq && slot->blobs[src] != NULL) {
        bad = "repeated";
    }
    if (bad != NULL) {
        uint64_t cur = xp->coll_seq;
        pthread_mutex_unlock(&xp->coll_lock);
        free(copy);
        ema_malformed("collective message %llu from rank %d %s (this rank is at %llu): dropped",
                      (unsigned long long)hdr.seq, src, bad, (unsigned long long)cur);
        return;
    }
    if (slot->seq != hdr.seq) {
        /* first message of a new collective in this slot; the previous one
         * using it has completed */
        for (int r = 0; r < xp->size; r++) {
            free(slot->blobs[r]);
            slot->blobs[r] = NULL;
        }
        slot->seq   = hdr.seq;
        slot->count = 0;
    }
    slot->blobs[src] = copy;
    slot->lens[src]  = plen;
    slot->count++;
    pthread_mutex_unlock(&xp->coll_lock);
}

void ema__xport_coll_init(ema__xport_t *xp)
{
    pthread_mutex_init(&xp->coll_lock, NULL);
    xp->coll_seq = 0;
    for (int i = 0; i < 2; i++) {
        xp->coll_slot[i].seq   = 0;
        xp->coll_slot[i].count = 0;
        xp->coll_slot[i].blobs = calloc((size_t)xp->size, sizeof(void *));
        xp->coll_slot[i].lens  = calloc((size_t)xp->size, sizeof(size_t));
    }
}

void ema__xport_coll_cleanup(ema__xport_t *xp)
{
    for (int i = 0; i < 2; i++) {
        for (int r = 0; xp->coll_slot[i].blobs && r < xp->size; r++) {
            free(xp->coll_slot[i].blobs[r]);
        }
        free(xp->coll_slot[i].blobs);
        free(xp->coll_slot[i].lens);
        xp->coll_slot[i].blobs = NULL;
        xp->coll_slot[i].lens  = NULL;
    }
    pthread_mutex_destroy(&xp->coll_lock);
}

static ema_status_t ema_xport_allgather(ema__xport_t *xp, const void *blob, size_t len,
                                        void ***blobs_p, size_t **lens_p, unsigned mode)
{
    void **blobs  = calloc((size_t)xp->size, sizeof(void *));
    size_t *lens  = calloc((size_t)xp->size, sizeof(size_t));
    void *mine    = malloc(len ? len : 1); /* our own blob, in the result */
    ema_status_t status = EMA_SUCCESS;
    ema_coll_hdr_t hdr;

    if (blobs == NULL || lens == NULL || mine == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err;
    }
    if (xp->coll_slot[0].blobs == NULL || xp->coll_slot[1].blobs == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err;
    }
    if (atomic_load(&xp->nlost) > 0) {
        status = EMA_ERR_PEER_LOST; /* a collective needs every rank */
        goto err;
    }
    pthread_mutex_lock(&xp->coll_lock); /* the AM handler reads it */
    hdr.seq = ++xp->coll_seq;
    pthread_mutex_unlock(&xp->coll_lock);
    if (len) {
        memcpy(mine, blob, len);
    }
    for (int i = 1; i < xp->size; i++) {
        int peer = (xp->rank + i) % xp->size;
        status   = ema__xport_am_send(xp, peer, EMA_AM_COLL, &hdr, sizeof(hdr), blob, len);
        if (status != EMA_SUCCESS) {
            goto err;
        }
    }

    ema__coll_slot_t *slot = &xp->coll_slot[hdr.seq & 1];
    for (;;) {
        pthread_mutex_lock(&xp->coll_lock);
        int done = (slot->seq == hdr.seq && slot->count == xp->size - 1);
        if (done) {
            for (int r = 0; r < xp->size; r++) {
                blobs[r]        = slot->blobs[r];
                lens[r]         = slot->lens[r];
                slot->blobs[r]  = NULL;
            }
            slot->count = -1; /* complete: a late copy is dropped */
        }
        pthread_mutex_unlock(&xp->coll_lock);
        if (done || xp->size == 1) {
            break;
        }
        if (atomic_load(&xp->nlost) > 0) {
            status = EMA_ERR_PEER_LOST; /* a rank died: it never sends its blob */
            goto err;
        }
        ema__xport_wait_step(xp, mode);
    }
    blobs[xp->rank] = mine;
    lens[xp->rank]  = len;
    *blobs_p = blobs;
    *lens_p  = lens;
    return EMA_SUCCESS;

err:
    free(mine);
    free(blobs);
    free(lens);
    return status;
}

ema_status_t ema__xport_allgather(ema__xport_t *xp, const void *blob, size_t len,
                                  void ***blobs_p, size_t **lens_p)
{
    return ema_xport_allgather(xp, blob, len, blobs_p, lens_p, EMA_WAIT_QUICK);
}

void ema__xport_free_blobs(ema__xport_t *xp, void **blobs, size_t *lens)
{
    for (int r = 0; blobs && r < xp->size; r++) {
        free(blobs[r]);
    }
    free(blobs);
    free(lens);
}

ema_status_t ema__xport_barrier(ema__xport_t *xp, unsigned mode)
{
    void **blobs;
    size_t *lens;
    ema_status_t status = ema_xport_allgather(xp, NULL, 0, &blobs, &lens, mode);
    if (status == EMA_SUCCESS) {
        ema__xport_free_blobs(xp, blobs, lens);
    }
    return status;
}
