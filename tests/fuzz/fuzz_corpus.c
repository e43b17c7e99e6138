/*
 * The fuzz corpus, as code: valid messages of every type that the world of
 * fuzz_world.c accepts, and one reproducer per class of malformed message
 * (the crash classes an earlier fuzzer found, and the ones this one did).
 * gen_corpus writes them into tests/fuzz/corpus/; the replay test runs
 * both these and the files.
 */
#include "fuzz_world.h"

#include "pool/pool_priv.h"
#include "win/coherence.h"

#include <string.h>

#define ME EMA_FUZZ_ME
#define D  EMA_TIER_DEVICE
#define S  EMA_TIER_SPILL
#define SEG ((uint64_t)EMA_FUZZ_SEG)

typedef struct {
    ema_fuzz_corpus_cb cb;
    void              *arg;
    int                n;
    /* a sequence being built (seq_begin .. seq_end): emit appends to it */
    int                in_seq;
    uint8_t            seq[2048];
    size_t             seq_len;
} corpus_t;

/* One entry: id, sender, then @hlen bytes of header and @plen of payload;
 * inside a sequence, one record of it. */
static void emit(corpus_t *c, const char *name, unsigned id, int32_t src, const void *hdr,
                 size_t hlen, const void *payload, size_t plen)
{
    uint8_t buf[EMA_FUZZ_HDR + 512];
    if (EMA_FUZZ_HDR + hlen + plen > sizeof(buf)) {
        return;
    }
    if (c->in_seq) {
        uint16_t n = (uint16_t)(hlen + plen);
        uint8_t *p = c->seq + c->seq_len;
        if (c->seq_len + EMA_FUZZ_HDR + 2 + n > sizeof(c->seq)) {
            return;
        }
        p[0] = (uint8_t)id;
        memcpy(p + 1, &src, sizeof(src));
        memcpy(p + EMA_FUZZ_HDR, &n, sizeof(n));
        if (hlen > 0) {
            memcpy(p + EMA_FUZZ_HDR + 2, hdr, hlen);
        }
        if (plen > 0) {
            memcpy(p + EMA_FUZZ_HDR + 2 + hlen, payload, plen);
        }
        c->seq_len += EMA_FUZZ_HDR + 2 + n;
        return;
    }
    buf[0] = (uint8_t)id;
    memcpy(buf + 1, &src, sizeof(src));
    if (hlen > 0) {
        memcpy(buf + EMA_FUZZ_HDR, hdr, hlen);
    }
    if (plen > 0) {
        memcpy(buf + EMA_FUZZ_HDR + hlen, payload, plen);
    }
    c->cb(name, buf, EMA_FUZZ_HDR + hlen + plen, c->arg);
    c->n++;
}

/* Several messages to one world: the emits between these two. */
static void seq_begin(corpus_t *c)
{
    c->in_seq  = 1;
    c->seq[0]  = EMA_FUZZ_SEQ;
    c->seq_len = 1;
}

static void seq_end(corpus_t *c, const char *name)
{
    c->in_seq = 0;
    c->cb(name, c->seq, c->seq_len, c->arg);
    c->n++;
}

/* --- window messages ------------------------------------------------------- */

static ema_win_msg_t wmsg(uint32_t type, uint32_t win, int32_t part, uint32_t first,
                          uint32_t count, uint64_t token)
{
    return (ema_win_msg_t){.type  = type,  .win_id = win,   .part  = part,
                           .first = first, .count  = count, .token = token};
}

static void win(corpus_t *c, const char *name, int32_t src, const ema_win_msg_t *m,
                const ema__loc_t *locs, uint32_t nlocs)
{
    emit(c, name, EMA_AM_WIN, src, m, sizeof(*m), locs, nlocs * sizeof(*locs));
}

/* An UPDATE (or TABLE_REP) of @part from its owner. */
static void table(corpus_t *c, const char *name, uint32_t type, int32_t src, uint32_t w,
                  int32_t part, uint64_t version, uint64_t size, uint32_t nsegs,
                  uint32_t first, uint32_t count, const ema__loc_t *locs, uint64_t token)
{
    ema_win_msg_t m = wmsg(type, w, part, first, count, token);
    m.version = version;
    m.size    = size;
    m.nsegs   = nsegs;
    win(c, name, src, &m, locs, count);
}

static void amo(corpus_t *c, const char *name, int32_t src, uint32_t tier, uint32_t cswap,
                uint64_t off, int absolute)
{
    /* @off into this rank's memory of @tier, or an address (@absolute) */
    ema_win_msg_t m = wmsg(EMA_WIN_MSG_AMO, 0, 0, tier, cswap, 0x5a5a);
    m.arg[0] = absolute ? off : off + (tier == S ? EMA_FUZZ_SPILL_BASE : EMA_FUZZ_BASE);
    m.arg[1] = 5;
    m.arg[2] = 9;
    win(c, name, src, &m, NULL, 0);
}

/* --- pool messages ------------------------------------------------------- */

static void pool(corpus_t *c, const char *name, int32_t src, uint32_t type, uint32_t count,
                 uint64_t token, uint64_t left, const void *payload, size_t plen)
{
    ema_pool_msg_t m = {.type = type, .count = count, .token = token, .left = left};
    emit(c, name, EMA_AM_POOL, src, &m, sizeof(m), payload, plen);
}

static void grant(corpus_t *c, const char *name, int32_t src, uint64_t token, uint32_t k,
                  const uint32_t *segs, int64_t handle, uint64_t left)
{
    uint8_t p[16 * (sizeof(uint32_t) + sizeof(int64_t))];
    for (uint32_t i = 0; i < k; i++) {
        memcpy(p + i * sizeof(uint32_t), &segs[i], sizeof(uint32_t));
        memcpy(p + k * sizeof(uint32_t) + i * sizeof(int64_t), &handle, sizeof(int64_t));
    }
    pool(c, name, src, EMA_POOL_MSG_GRANT, k, token, left, p,
         k * (sizeof(uint32_t) + sizeof(int64_t)));
}

static void coll(corpus_t *c, const char *name, int32_t src, uint64_t seq, const char *blob)
{
    emit(c, name, EMA_AM_COLL, src, &seq, sizeof(seq), blob, blob ? strlen(blob) : 0);
}

/* A window allocation's description (win.c's ema_win_desc_t). */
static void desc(corpus_t *c, const char *name, int32_t r, int32_t status, uint32_t nsegs,
                 uint32_t max_segs, uint64_t size, const ema__loc_t *locs, uint32_t nlocs)
{
    struct {
        int32_t  status;
        uint32_t nsegs, max_segs, pad;
        uint64_t size;
    } d = {status, nsegs, max_segs, 0, size};
    emit(c, name, EMA_FUZZ_DESC, r, &d, sizeof(d), locs, nlocs * sizeof(ema__loc_t));
}

int ema_fuzz_corpus(ema_fuzz_corpus_cb cb, void *arg)
{
    corpus_t c = {cb, arg, 0};
    ema_win_msg_t m;

    /* === valid ============================================================= */

    /* collectives: this one (5) from a peer, the next one (6) early */
    coll(&c, "valid-coll-current", 2, EMA_FUZZ_COLL_SEQ, "rank 2 blob");
    coll(&c, "valid-coll-next", 0, EMA_FUZZ_COLL_SEQ + 1, "0123456789abcdef");
    coll(&c, "valid-coll-empty-blob", 3, EMA_FUZZ_COLL_SEQ, NULL);

    /* invalidations by the owner, acknowledged */
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 0, 1, 2, 0x1234);
    win(&c, "valid-inval", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN1, 2, 0, 5, 0x99);
    win(&c, "valid-inval-win1", 2, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN1, 3, 30, 2, 0x98); /* the table's end */
    win(&c, "valid-inval-to-end", 3, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_NOWIN, 3, 0, 4, 0x77);
    win(&c, "valid-inval-unknown-window", 3, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 2, 0, 0, 0x76);
    win(&c, "valid-inval-empty", 2, &m, NULL, 0);

    /* acknowledgements of the invalidation waiting (rank 2 acked both) */
    m = wmsg(EMA_WIN_MSG_ACK, EMA_FUZZ_WIN0, ME, 0, 0, EMA_FUZZ_TOK_INVAL);
    win(&c, "valid-ack", 0, &m, NULL, 0);
    win(&c, "valid-ack-rank3", 3, &m, NULL, 0);

    /* updates from the owner: a grow, a move with a borrowed, a spilled and
     * a moving segment, a shrink, and two that change nothing */
    table(&c, "valid-update-grow", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 2, 5 * SEG - 1, 5,
          3, 2, (ema__loc_t[]){EMA_LOC(0, D, 9), EMA_LOC(0, D, 10)}, 0);
    table(&c, "valid-update-move", EMA_WIN_MSG_UPDATE, 3, EMA_FUZZ_WIN1, 3, 7, 3 * SEG, 3, 0,
          3, (ema__loc_t[]){EMA_LOC(ME, D, 12), EMA_LOC(0, S, 2),
                            EMA_LOC(3, D, 2) | EMA_LOC_MOVING}, 0);
    table(&c, "valid-update-shrink", EMA_WIN_MSG_UPDATE, 2, EMA_FUZZ_WIN0, 2, 3, 100, 1, 1, 0,
          NULL, 0);
    table(&c, "valid-update-full-table", EMA_WIN_MSG_UPDATE, 2, EMA_FUZZ_WIN0, 2, 4, 8 * SEG,
          8, 0, 8,
          (ema__loc_t[]){EMA_LOC(2, D, 0), EMA_LOC(2, D, 1), EMA_LOC(2, D, 2), EMA_LOC(2, D, 3),
                         EMA_LOC(2, D, 4), EMA_LOC(2, D, 5), EMA_LOC(2, D, 6),
                         EMA_LOC(2, D, 15)}, 0);
    table(&c, "valid-noop-update-unknown-window", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_NOWIN, 0, 9,
          SEG, 1, 0, 1, (ema__loc_t[]){EMA_LOC(0, D, 1)}, 0);
    table(&c, "valid-noop-update-stale", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 1, SEG, 1, 0,
          1, (ema__loc_t[]){EMA_LOC(0, D, 1)}, 0);

    /* table requests for this rank's part, answered; one for a window this
     * rank does not know, answered empty */
    m = wmsg(EMA_WIN_MSG_TABLE_REQ, EMA_FUZZ_WIN0, ME, 0, 0, 0x4242);
    win(&c, "valid-table-req", 2, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_TABLE_REQ, EMA_FUZZ_WIN1, ME, 0, 0, 0x4343);
    win(&c, "valid-table-req-win1", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_TABLE_REQ, EMA_FUZZ_NOWIN, ME, 0, 0, 0x4444);
    win(&c, "valid-table-req-unknown-window", 3, &m, NULL, 0);

    /* the table this rank asked rank 2 for; an empty one (rank 2 did not
     * know the window) ends the request too */
    table(&c, "valid-table-rep", EMA_WIN_MSG_TABLE_REP, 2, EMA_FUZZ_WIN1, 2, 5, 6 * SEG, 6, 0,
          6, (ema__loc_t[]){EMA_LOC(2, D, 10), EMA_LOC(2, D, 11), EMA_LOC(2, D, 12),
                            EMA_LOC(2, D, 13), EMA_LOC(3, D, 5), EMA_LOC(2, S, 7)},
          EMA_FUZZ_TOK_FETCH);
    table(&c, "valid-table-rep-empty", EMA_WIN_MSG_TABLE_REP, 2, EMA_FUZZ_WIN1, 2, 0, 0, 0, 0,
          0, NULL, EMA_FUZZ_TOK_FETCH);

    /* atomics on this rank's memory, and the answer to its own */
    amo(&c, "valid-amo-fetch-add", 3, D, 0, 8 * 3, 0);
    amo(&c, "valid-amo-cswap", 0, D, 1, EMA_FUZZ_NSEGS * SEG - 8, 0);
    amo(&c, "valid-amo-spill", 2, S, 0, 64, 0);
    m = wmsg(EMA_WIN_MSG_AMO_REP, 0, 0, 0, 0, EMA_FUZZ_TOK_AMO);
    m.arg[0] = 42;
    win(&c, "valid-amo-rep", 3, &m, NULL, 0);
    m.first = (uint32_t)EMA_ERR_RANGE;
    win(&c, "valid-amo-rep-error", 3, &m, NULL, 0);

    /* the lending protocol */
    pool(&c, "valid-borrow", 0, EMA_POOL_MSG_BORROW, 2, 0x51, 0, NULL, 0);
    pool(&c, "valid-borrow-more-than-lendable", 3, EMA_POOL_MSG_BORROW, 100, 0x52, 0, NULL, 0);
    grant(&c, "valid-grant", 0, EMA_FUZZ_TOK_GRANT, 2, (uint32_t[]){4, 5}, EMA_FUZZ_FD(0), 10);
    grant(&c, "valid-grant-empty", 0, EMA_FUZZ_TOK_GRANT, 0, NULL, 0, 3);
    pool(&c, "valid-giveback", 0, EMA_POOL_MSG_GIVEBACK, 2, 0, 0, (uint32_t[]){6, 7}, 8);
    pool(&c, "valid-giveback-rank3", 3, EMA_POOL_MSG_GIVEBACK, 1, 0, 0, (uint32_t[]){9}, 4);
    pool(&c, "valid-advert", 2, EMA_POOL_MSG_ADVERT, 0, 0, 7, NULL, 0);
    pool(&c, "valid-refuse", 0, EMA_POOL_MSG_REFUSE, 1, 0, 0, (uint32_t[]){7}, 4);
    pool(&c, "valid-recall", 2, EMA_POOL_MSG_RECALL, 2, 0, 0, (uint32_t[]){3, 2}, 8);
    pool(&c, "valid-noop-recall-not-mapped", 0, EMA_POOL_MSG_RECALL, 1, 0, 0, (uint32_t[]){15}, 4);

    /* descriptions of a part in an allocation */
    desc(&c, "valid-noop-desc", 2, EMA_SUCCESS, 2, 4, 2 * SEG - 5,
         (ema__loc_t[]){EMA_LOC(2, D, 0), EMA_LOC(2, D, 1)}, 2);
    desc(&c, "valid-noop-desc-failed", 3, EMA_ERR_NO_MEMORY, 0, 4, 0, NULL, 0);
    desc(&c, "valid-noop-desc-empty", 0, EMA_SUCCESS, 0, 0, 0, NULL, 0);

    /* sequences: a borrow granted then given back; an invalidation, then
     * the update that clears it; a collective completed */
    seq_begin(&c);
    pool(&c, "", 0, EMA_POOL_MSG_BORROW, 2, 0x51, 0, NULL, 0);
    pool(&c, "", 0, EMA_POOL_MSG_GIVEBACK, 2, 0, 0, (uint32_t[]){10, 11}, 8);
    seq_end(&c, "valid-seq-borrow-giveback");
    seq_begin(&c);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 0, 0, 3, 0x1234);
    win(&c, "", 0, &m, NULL, 0);
    table(&c, "", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 2, 3 * SEG - 10, 3, 0, 3,
          (ema__loc_t[]){EMA_LOC(0, D, 5), EMA_LOC(3, D, 6), EMA_LOC(0, S, 1)}, 0);
    seq_end(&c, "valid-seq-inval-update");
    seq_begin(&c);
    coll(&c, "", 2, EMA_FUZZ_COLL_SEQ, "two");
    coll(&c, "", 3, EMA_FUZZ_COLL_SEQ, "three");
    coll(&c, "", 0, EMA_FUZZ_COLL_SEQ + 1, "next");
    seq_end(&c, "valid-seq-coll");

    /* === reproducers: each must be dropped and change nothing ============== */

    /* reply tokens: never an address; only a live waiter of the reply's
     * layer and type, answered by the rank asked, as often as asked */
    m = wmsg(EMA_WIN_MSG_ACK, EMA_FUZZ_WIN0, ME, 0, 0, 0x00007ffc12345678ull);
    win(&c, "repro-reply-token-as-pointer", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_AMO_REP, 0, 0, 0, 0, EMA_FUZZ_TOK_GRANT);
    m.arg[0] = 0x4141414141414141ull;
    win(&c, "repro-reply-token-other-layer", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_AMO_REP, 0, 0, 0, 0, EMA_FUZZ_TOK_FETCH);
    win(&c, "repro-reply-token-other-type", 2, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_AMO_REP, 0, 0, 0, 0, EMA_FUZZ_TOK_AMO);
    win(&c, "repro-reply-from-rank-not-asked", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_ACK, EMA_FUZZ_WIN0, ME, 0, 0, EMA_FUZZ_TOK_INVAL);
    win(&c, "repro-reply-ack-repeated", 2, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_ACK, EMA_FUZZ_WIN0, ME, 0, 0, EMA_FUZZ_ID(9));
    win(&c, "repro-reply-token-no-waiter", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_ACK, EMA_FUZZ_WIN0, ME, 0, 0, ((uint64_t)2 << 32) | 0);
    win(&c, "repro-reply-token-old-generation", 3, &m, NULL, 0);

    /* the sender's rank: outside the world, or this rank itself */
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, EMA_FUZZ_RANKS, 0, 1, 1);
    win(&c, "repro-src-out-of-range-win", EMA_FUZZ_RANKS, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, -1, 0, 1, 1);
    win(&c, "repro-src-negative-win", -1, &m, NULL, 0);
    pool(&c, "repro-src-out-of-range-pool", 70000, EMA_POOL_MSG_GIVEBACK, 1, 0, 0,
         (uint32_t[]){6}, 4);
    coll(&c, "repro-src-out-of-range-coll", -5, EMA_FUZZ_COLL_SEQ, "x");
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, ME, 0, 1, 1);
    win(&c, "repro-src-self", ME, &m, NULL, 0);

    /* invalidations: of a part the sender does not own, of this rank's own
     * part (its segments would stay MOVING), a run whose end wraps */
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 2, 0, 2, 1);
    win(&c, "repro-inval-part-not-owned", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, ME, 0, 4, 1);
    win(&c, "repro-inval-own-part", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 0, 0xfffffff0u, 0x20, 1);
    win(&c, "repro-inval-first-count-wrap", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 0, 4, 5, 1);
    win(&c, "repro-inval-past-table", 0, &m, NULL, 0);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 4, 0, 1, 1);
    win(&c, "repro-inval-part-out-of-range", 0, &m, NULL, 0);

    /* updates: of a part the sender does not own, of this rank's own part,
     * a run whose end wraps in 32 bits, counts past the table */
    table(&c, "repro-update-part-not-owned", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 2, 9, SEG, 1,
          0, 1, (ema__loc_t[]){EMA_LOC(0, D, 3)}, 0);
    table(&c, "repro-update-own-part", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, ME, 9, SEG, 1, 0,
          1, (ema__loc_t[]){EMA_LOC(0, D, 3)}, 0);
    table(&c, "repro-update-first-count-wrap", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG,
          1, 0xffffffffu, 1, (ema__loc_t[]){EMA_LOC(0, D, 3)}, 0);
    table(&c, "repro-update-past-table", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG, 1, 7,
          2, (ema__loc_t[]){EMA_LOC(0, D, 3), EMA_LOC(0, D, 4)}, 0);
    table(&c, "repro-update-nsegs-past-table", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9,
          9 * SEG, 9, 0, 0, NULL, 0);
    /* sizes against counts: a size past the segments */
    table(&c, "repro-update-size-past-segments", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9,
          2 * SEG + 1, 2, 0, 0, NULL, 0);
    table(&c, "repro-update-size-huge", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN1, 0, 9, UINT64_MAX,
          1, 0, 0, NULL, 0);
    /* locations: not a segment of any rank's memory */
    table(&c, "repro-update-loc-rank", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG, 1, 0, 1,
          (ema__loc_t[]){EMA_LOC(0x7fff, D, 0)}, 0);
    table(&c, "repro-update-loc-rank-negative", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG,
          1, 0, 1, (ema__loc_t[]){EMA_LOC(0xffff, D, 0)}, 0);
    table(&c, "repro-update-loc-tier", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG, 1, 0, 1,
          (ema__loc_t[]){EMA_LOC(0, 5, 0)}, 0);
    table(&c, "repro-update-loc-seg-past-arena", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9,
          SEG, 1, 0, 1, (ema__loc_t[]){EMA_LOC(0, D, EMA_FUZZ_NSEGS)}, 0);
    table(&c, "repro-update-loc-no-spill-tier", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG,
          1, 0, 1, (ema__loc_t[]){EMA_LOC(EMA_FUZZ_NOSPILL, S, 0)}, 0);
    table(&c, "repro-update-loc-flags", EMA_WIN_MSG_UPDATE, 0, EMA_FUZZ_WIN0, 0, 9, SEG, 1, 0, 1,
          (ema__loc_t[]){EMA_LOC(0, D, 0) | (1ull << 35)}, 0);
    /* lengths: a count past the payload, bytes past the locations */
    m = wmsg(EMA_WIN_MSG_UPDATE, EMA_FUZZ_WIN0, 0, 0, 100, 0);
    m.version = 9;
    m.nsegs   = 1;
    m.size    = SEG;
    win(&c, "repro-update-count-past-payload", 0, &m, (ema__loc_t[]){EMA_LOC(0, D, 0)}, 1);
    m = wmsg(EMA_WIN_MSG_INVAL, EMA_FUZZ_WIN0, 0, 0, 1, 1);
    win(&c, "repro-inval-trailing-bytes", 0, &m, (ema__loc_t[]){0}, 1);
    /* a table answering a request, from a rank that does not own the part */
    table(&c, "repro-table-rep-part-not-owned", EMA_WIN_MSG_TABLE_REP, 0, EMA_FUZZ_WIN1, 2, 9,
          SEG, 1, 0, 1, (ema__loc_t[]){EMA_LOC(0, D, 3)}, 0xabc);

    /* table requests for another rank's part */
    m = wmsg(EMA_WIN_MSG_TABLE_REQ, EMA_FUZZ_WIN0, 2, 0, 0, 0x4242);
    win(&c, "repro-table-req-part-not-here", 0, &m, NULL, 0);

    /* atomics: bounds that wrap, outside the memory, unaligned, no such
     * tier, neither fetch-and-add nor compare-and-swap */
    amo(&c, "repro-amo-bounds-wrap", 3, D, 0, UINT64_MAX - 3, 1);
    amo(&c, "repro-amo-below-base", 3, D, 0, EMA_FUZZ_BASE - 8, 1);
    amo(&c, "repro-amo-past-end", 3, D, 0, EMA_FUZZ_NSEGS * SEG - 4, 0);
    amo(&c, "repro-amo-unaligned", 3, D, 0, 12, 0);
    amo(&c, "repro-amo-tier", 3, 7, 0, 8, 0);
    amo(&c, "repro-amo-op", 3, D, 2, 8, 0);

    /* the lending protocol: give-backs of segments not lent to the sender
     * or twice (all or nothing), refusals of those, recalls past the
     * sender's arena, counts past the payload, adverts past the arena */
    pool(&c, "repro-giveback-not-lent", 0, EMA_POOL_MSG_GIVEBACK, 2, 0, 0, (uint32_t[]){6, 9}, 8);
    pool(&c, "repro-giveback-twice", 0, EMA_POOL_MSG_GIVEBACK, 2, 0, 0, (uint32_t[]){6, 6}, 8);
    pool(&c, "repro-giveback-past-arena", 0, EMA_POOL_MSG_GIVEBACK, 1, 0, 0,
         (uint32_t[]){UINT32_MAX}, 4);
    pool(&c, "repro-giveback-count-past-payload", 0, EMA_POOL_MSG_GIVEBACK, UINT32_MAX, 0, 0,
         (uint32_t[]){6}, 4);
    pool(&c, "repro-refuse-not-lent", 0, EMA_POOL_MSG_REFUSE, 2, 0, 0, (uint32_t[]){7, 8}, 8);
    pool(&c, "repro-recall-past-arena", 2, EMA_POOL_MSG_RECALL, 1, 0, 0,
         (uint32_t[]){EMA_FUZZ_NSEGS}, 4);
    pool(&c, "repro-recall-count-past-payload", 2, EMA_POOL_MSG_RECALL, 3, 0, 0,
         (uint32_t[]){1}, 4);
    pool(&c, "repro-borrow-payload", 0, EMA_POOL_MSG_BORROW, 1, 0, 0, (uint32_t[]){1}, 4);
    pool(&c, "repro-advert-past-arena", 2, EMA_POOL_MSG_ADVERT, 0, 0, EMA_FUZZ_NSEGS + 1, NULL,
         0);
    pool(&c, "repro-pool-unknown-type", 2, 77, 0, 0, 0, NULL, 0);

    /* collectives: out of sequence, a second blob from one rank */
    coll(&c, "repro-coll-out-of-sequence", 2, EMA_FUZZ_COLL_SEQ + 2, "late");
    coll(&c, "repro-coll-seq-zero", 2, 0, "zero");
    coll(&c, "repro-coll-repeated", 0, EMA_FUZZ_COLL_SEQ, "again");

    /* the dispatch: no handler for the id, short messages, unknown types */
    emit(&c, "repro-am-id-no-handler", 6, 0, "abcdefgh", 8, NULL, 0);
    emit(&c, "repro-am-id-past-table", 0x7f, 0, "abcdefgh", 8, NULL, 0);
    emit(&c, "repro-win-short", EMA_AM_WIN, 0, "abc", 3, NULL, 0);
    emit(&c, "repro-pool-short", EMA_AM_POOL, 0, "abc", 3, NULL, 0);
    emit(&c, "repro-coll-short", EMA_AM_COLL, 0, "abc", 3, NULL, 0);
    m = wmsg(99, EMA_FUZZ_WIN0, 0, 0, 0, 0);
    win(&c, "repro-win-unknown-type", 0, &m, NULL, 0);

    /* descriptions in an allocation: segments past the part, a length that
     * disagrees, another rank's memory, a status that is not one */
    desc(&c, "repro-desc-nsegs-past-max", 2, EMA_SUCCESS, 3, 2, SEG,
         (ema__loc_t[]){EMA_LOC(2, D, 0), EMA_LOC(2, D, 1), EMA_LOC(2, D, 2)}, 3);
    desc(&c, "repro-desc-count-past-payload", 2, EMA_SUCCESS, 4, 4, SEG,
         (ema__loc_t[]){EMA_LOC(2, D, 0)}, 1);
    desc(&c, "repro-desc-other-rank", 2, EMA_SUCCESS, 1, 4, SEG,
         (ema__loc_t[]){EMA_LOC(0, D, 0)}, 1);
    desc(&c, "repro-desc-size-past-segments", 2, EMA_SUCCESS, 1, 4, 2 * SEG,
         (ema__loc_t[]){EMA_LOC(2, D, 0)}, 1);
    desc(&c, "repro-desc-status", 2, 12345, 0, 4, 0, NULL, 0);
    emit(&c, "repro-desc-short", EMA_FUZZ_DESC, 2, "abcdefgh", 8, NULL, 0);

    /* the reply that corrupted a borrow's waiter (an atomic's answer with
     * the borrow's id), then the grant that wrote through it */
    seq_begin(&c);
    m = wmsg(EMA_WIN_MSG_AMO_REP, 0, 0, 0x41414141, 0, EMA_FUZZ_TOK_GRANT);
    m.arg[0] = 0x4141414141414141ull;
    win(&c, "", 0, &m, NULL, 0);
    grant(&c, "", 0, EMA_FUZZ_TOK_GRANT, 2, (uint32_t[]){4, 5}, EMA_FUZZ_FD(0), 10);
    seq_end(&c, "seq-reply-token-other-layer-then-grant");

    /* === malformed answers to live requests: dropped, the request ends ===== */
    m = wmsg(EMA_WIN_MSG_AMO_REP, 0, 0, 12345, 0, EMA_FUZZ_TOK_AMO);
    win(&c, "ends-amo-rep-status", 3, &m, NULL, 0);
    table(&c, "ends-table-rep-loc", EMA_WIN_MSG_TABLE_REP, 2, EMA_FUZZ_WIN1, 2, 9, SEG, 1, 0, 1,
          (ema__loc_t[]){EMA_LOC(9, D, 0)}, EMA_FUZZ_TOK_FETCH);
    grant(&c, "ends-grant-handle-forged", 0, EMA_FUZZ_TOK_GRANT, 1, (uint32_t[]){4}, 3, 10);
    grant(&c, "ends-grant-seg-twice", 0, EMA_FUZZ_TOK_GRANT, 2, (uint32_t[]){4, 4},
          EMA_FUZZ_FD(0), 10);
    grant(&c, "ends-grant-seg-past-arena", 0, EMA_FUZZ_TOK_GRANT, 1,
          (uint32_t[]){EMA_FUZZ_NSEGS}, EMA_FUZZ_FD(0), 10);
    return c.n;
}
