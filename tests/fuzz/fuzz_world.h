/*
 * The decoders of EMA's active messages, driven without a world: no
 * PMIx, no UCX.  ema__am_fuzz_one builds a small world as rank
 * EMA_FUZZ_ME of EMA_FUZZ_RANKS sees it (fuzz_world.c: its windows, its
 * pool, live waiters, a collective in progress), hands one message to the
 * real dispatch point (ema__xport_am_dispatch), runs the jobs it queued
 * (their sends go to a stub), checks the world's invariants (abort() where
 * one fails: the fuzzer reports it as a crash), and tears the world down.
 *
 * An input: data[0] the AM id (EMA_AM_COLL, _WIN, _POOL; any other byte is
 * dispatched as an id too, and dropped), or EMA_FUZZ_DESC for a window
 * allocation's description (ema__win_desc_check, the decoder of what
 * EMA_AM_COLL carries for ema_win_allocate); data[1..4] the sender's rank,
 * as UCX's header carries it (int32, host order); the rest the message.
 * Or data[0] EMA_FUZZ_SEQ: several messages to one world, in order, each
 * as [id][rank: 4][length: uint16, host order][message] (the last one cut
 * at the input's end), the invariants checked after each.
 *
 * Used by the libFuzzer target (fuzz_am.c), the corpus writer
 * (gen_corpus.c) and the replay test (tests/unit/test_fuzz_replay.c).
 */
#ifndef EMA_TESTS_FUZZ_WORLD_H_
#define EMA_TESTS_FUZZ_WORLD_H_

#include <stddef.h>
#include <stdint.h>

#define EMA_FUZZ_RANKS    4
#define EMA_FUZZ_ME       1
#define EMA_FUZZ_SEG      4096u
#define EMA_FUZZ_NSEGS    16u  /* each rank's device arena */
#define EMA_FUZZ_NSPILL   8u   /* each rank's spill tier, but EMA_FUZZ_NOSPILL's */
#define EMA_FUZZ_NOSPILL  3    /* the rank with no spill tier */
#define EMA_FUZZ_DESC     0xd0 /* data[0]: a window allocation's description */
#define EMA_FUZZ_SEQ      0xd1 /* data[0]: a sequence of messages */
#define EMA_FUZZ_HDR      5    /* data[0] and the sender's rank */

/* Where the own arena and spill tier live: fixed, so that the corpus can
 * name words of them (atomics). */
#define EMA_FUZZ_BASE       0x500000000000ull
#define EMA_FUZZ_SPILL_BASE 0x500000100000ull

/* Rank r's arena memfd number, as its export gives it (host kind). */
#define EMA_FUZZ_FD(_r)   (100 + (_r))

/* The windows: id 0 of 8 segments at most per part, id 1 of 32. */
#define EMA_FUZZ_WIN0     0u
#define EMA_FUZZ_WIN1     1u
#define EMA_FUZZ_NOWIN    7u /* a window nobody has */

/* The live waiters, registered in this order in an empty table, so their
 * ids are (1 << 32) | slot. */
#define EMA_FUZZ_ID(_slot) (((uint64_t)1 << 32) | (_slot))
#define EMA_FUZZ_TOK_INVAL EMA_FUZZ_ID(0) /* an invalidation of 2 runs; rank 2 acked both */
#define EMA_FUZZ_TOK_FETCH EMA_FUZZ_ID(1) /* a table request to rank 2 */
#define EMA_FUZZ_TOK_AMO   EMA_FUZZ_ID(2) /* an atomic sent to rank 3 */
#define EMA_FUZZ_TOK_GRANT EMA_FUZZ_ID(3) /* a borrow of 4 segments from rank 0 */

/* The collective in progress: number 5, rank 0's blob in. */
#define EMA_FUZZ_COLL_SEQ 5u

/* The own arena: segments 0-5 back the own parts (win0: 0-3, win1: 4-5),
 * 6 and 7 are lent to rank 0 (7 recalled), 8 to rank 2 (its grant being
 * sent), 9 to rank 3; the rest free. */

typedef struct {
    int           changed;   /* the world's state differs after the message */
    int           sends;     /* messages the world sent (stub) */
    unsigned long malformed; /* messages dropped as malformed (ema_malformed) */
} ema_fuzz_result_t;

/* One input, in a fresh world; @res (may be NULL) says what it did.
 * Returns 0; abort()s where an invariant fails. */
int ema__am_fuzz_one(const uint8_t *data, size_t len);
int ema__am_fuzz_one_ex(const uint8_t *data, size_t len, ema_fuzz_result_t *res);

/* The corpus: valid messages ("valid-..."), and one reproducer per class of
 * malformed message ("repro-...", which must be dropped and change nothing)
 * or malformed answer to a live request ("ends-...", which ends it with
 * nothing).  Calls @cb once per entry; returns how many. */
typedef void (*ema_fuzz_corpus_cb)(const char *name, const uint8_t *data, size_t len,
                                   void *arg);
int ema_fuzz_corpus(ema_fuzz_corpus_cb cb, void *arg);

#endif
