/*
 * Bootstrap through PMIx: rank, size, local peers, the exchange of endpoint
 * information (modex) and a fence.  With no PMIx server in reach and no sign
 * of a launcher in the environment, the world is a singleton.
 */
#ifndef EMA_BOOT_H_
#define EMA_BOOT_H_

#include <ema.h>

#include "util/config.h"
#include <stddef.h>

typedef struct ema__boot_config {
    double timeout; /* seconds a fence may take before init fails */
} ema__boot_config_t;

extern const ema_config_field_t ema__boot_config_table[];

typedef struct ema__boot {
    int  rank;
    int  size;
    int  local_rank;
    int  local_size;
    int  singleton;         /* no launcher: a world of one, PMIx not used */
    int  exchanged;         /* this ema_init reached ema__boot_exchange */
    char nspace[256];
    ema__boot_config_t cfg;
} ema__boot_t;

ema_status_t ema__boot_init(ema__boot_t *boot);
/* After a failed ema_init: where it failed before the exchange, take part
 * in it all the same with @status, so that the other ranks' ema_init fails
 * at once (EMA_ERR_PEER_LOST) rather than waiting for this rank; then
 * forget the world, keeping PMIx up for the next try (PMIx is taken down
 * by ema__boot_finalize, at ema_finalize). */
void         ema__boot_abandon(ema__boot_t *boot, ema_status_t status);
void         ema__boot_finalize(ema__boot_t *boot);
/* Call @cb(@arg, rank) (from PMIx's thread) when the launcher reports a
 * process of this job aborted or terminated; unwatch before @arg goes.
 * Open MPI 4.1's mpirun sends none to a PMIx 4 client (see ema(7)). */
void         ema__boot_watch(ema__boot_t *boot, void (*cb)(void *arg, int rank), void *arg);
void         ema__boot_unwatch(ema__boot_t *boot);

/*
 * All-to-all exchange of one blob per rank through the PMIx key-value store
 * and a data-collecting fence; once per ema_init.  A rank whose ema_init
 * failed before it sends its status instead (ema__boot_abandon), and the
 * others fail with EMA_ERR_PEER_LOST, the log naming it.  On success
 * *blobs_p is an array of size pointers (each malloc'ed, free with
 * ema__boot_free_blobs) and *lens_p their lengths.
 */
ema_status_t ema__boot_exchange(ema__boot_t *boot, const void *blob, size_t len,
                                void ***blobs_p, size_t **lens_p);
void         ema__boot_free_blobs(ema__boot_t *boot, void **blobs, size_t *lens);


#endif
