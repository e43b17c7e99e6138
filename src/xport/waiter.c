/*
 * Live waiters: a request that expects a reply (an invalidation's
 * acknowledgements, a table, an atomic's result, a grant) registers its
 * waiter here and sends the id it gets, never an address.  The reply's
 * handler finds the waiter by that id, under the table's lock, and the
 * waiter leaves the table before its memory goes away.  A reply with an id
 * that is not live (malformed, or for a waiter that gave up) is dropped:
 * it can never write through a stale or forged pointer.
 *
 * An id is (generation << 32) | slot, generation counted per slot from 1,
 * so a slot reused by a later waiter does not answer to the old id.  Each
 * waiter has a kind (the AM id of the layer that waits), and a reply finds
 * only its own layer's waiters: a window's reply with a pool waiter's id
 * is dropped, not applied to a waiter of another type.
 */
#include "xport.h"

#include <stdlib.h>

#define EMA_WAITER_SLOT(_id) ((uint32_t)(_id))
#define EMA_WAITER_GEN(_id)  ((uint32_t)((_id) >> 32))

void ema__xport_waiters_init(ema__xport_t *xp)
{
    pthread_mutex_init(&xp->waiters.lock, NULL);
    xp->waiters.slots = NULL;
    xp->waiters.cap   = 0;
    xp->waiters.free  = UINT32_MAX;
}

void ema__xport_waiters_cleanup(ema__xport_t *xp)
{
    free(xp->waiters.slots);
    xp->waiters.slots = NULL;
    xp->waiters.cap   = 0;
}

uint64_t ema__xport_waiter_add(ema__xport_t *xp, void *waiter, unsigned kind)
{
    ema__waiters_t *t = &xp->waiters;
    uint64_t id = 0;

    pthread_mutex_lock(&t->lock);
    if (t->free == UINT32_MAX) {
        uint32_t cap = t->cap ? 2 * t->cap : 64;
        ema__waiter_slot_t *s = realloc(t->slots, cap * sizeof(*s));
        if (s == NULL) {
            pthread_mutex_unlock(&t->lock);
            return 0;
        }
        for (uint32_t i = t->cap; i < cap; i++) {
            s[i].waiter    = NULL;
            s[i].kind      = 0;
            s[i].gen       = 0;
            s[i].next_free = (i + 1 < cap) ? i + 1 : UINT32_MAX;
        }
        t->slots = s;
        t->free  = t->cap;
        t->cap   = cap;
    }
    uint32_t i = t->free;
    ema__waiter_slot_t *s = &t->slots[i];
    t->free   = s->next_free;
    s->waiter = waiter;
    s->kind   = kind;
    s->gen    = (s->gen + 1 == 0) ? 1 : s->gen + 1;
    id        = ((uint64_t)s->gen << 32) | i;
    pthread_mutex_unlock(&t->lock);
    return id;
}

void ema__xport_waiter_del(ema__xport_t *xp, uint64_t id)
{
    ema__waiters_t *t = &xp->waiters;
    uint32_t i = EMA_WAITER_SLOT(id);

    pthread_mutex_lock(&t->lock);
    if (i < t->cap && t->slots[i].waiter != NULL && t->slots[i].gen == EMA_WAITER_GEN(id)) {
        t->slots[i].waiter    = NULL;
        t->slots[i].next_free = t->free;
        t->free               = i;
    }
    pthread_mutex_unlock(&t->lock);
}

int ema__xport_waiter_call(ema__xport_t *xp, uint64_t id, unsigned kind, ema__waiter_cb cb,
                           const void *arg)
{
    ema__waiters_t *t = &xp->waiters;
    uint32_t i = EMA_WAITER_SLOT(id);
    int found  = 0;

    pthread_mutex_lock(&t->lock);
    if (i < t->cap && t->slots[i].waiter != NULL && t->slots[i].gen == EMA_WAITER_GEN(id) &&
        t->slots[i].kind == kind) {
        cb(t->slots[i].waiter, arg);
        found = 1;
    }
    pthread_mutex_unlock(&t->lock);
    return found;
}
