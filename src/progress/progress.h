/*
 * The progress engine: one thread per rank (EMA_PROGRESS_THREAD=y) that keeps
 * the UCX worker progressing, so passive-target RMA and control messages are
 * serviced while the application computes, and that runs deferred control
 * work (borrow, reclaim) outside UCX callbacks.  When idle it sleeps on UCX's
 * event fd instead of spinning: ranks are often oversubscribed on few cores.
 */
#ifndef EMA_PROGRESS_H_
#define EMA_PROGRESS_H_

#include <ema.h>

#include "util/config.h"
#include <pthread.h>
#include <stdatomic.h>

#include "xport/xport.h"

typedef struct ema__progress_config {
    int      thread; /* run the progress thread */
    unsigned spin;   /* empty polls before yielding */
    unsigned yield;  /* then empty polls with sched_yield before sleeping */
    unsigned holdoff; /* us off the worker after an application thread used it */
} ema__progress_config_t;

extern const ema_config_field_t ema__progress_config_table[];

typedef struct ema__progress {
    ema__progress_config_t cfg;
    ema__xport_t          *xp;
    pthread_t              thread;
    int                    running;
    atomic_int             stop;
    uint64_t               app_gen;  /* xp's exit count when last seen to change */
    double                 app_seen; /* and when (ema__now_us) */
    double                 progressed; /* when it last progressed the worker */
    int                    held;     /* the last pass left the worker to the application */
} ema__progress_t;

ema_status_t ema__progress_start(ema__progress_t *pg, ema__xport_t *xp);
void         ema__progress_stop(ema__progress_t *pg);
/* One pass from the calling thread: UCX progress and deferred work. */
unsigned     ema__progress_once(ema__progress_t *pg);

#endif
