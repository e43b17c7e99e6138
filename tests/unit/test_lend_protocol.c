/*
 * The lending protocol's state machine (src/pool; msg.c has the diagram),
 * run between three pools of one process, without mpirun: a lender L
 * (rank 0), a borrower B (rank 1) and a second lender L2 (rank 2).  Each
 * has a real host arena of 8 segments of 64 KiB, a real UCX context and
 * worker (no peer connected: nothing travels through UCX) and a window
 * context with every rank's arena export, as the modex would give it.
 *
 * Messages go through a loopback (pool->send): each is queued whole, header
 * and payload in one buffer as UCX delivers them (UCP_AM_FLAG_WHOLE_MSG).
 * The pump delivers the queue in order with ema__pool_dispatch, then runs
 * each side's deferred jobs, until nothing moves: every exchange is
 * deterministic.  A side that waits in the library's own loop (a borrow
 * waiting for its GRANT in ema__win_wait_flag, a reclaim waiting for its
 * give-backs in ema__pool_reclaim) runs the pump as a quick deferred job of
 * its own worker, which those loops run at every step.
 *
 * There are no windows.  Where win/migrate.c would move the recalled data
 * and give the old segments back, or refuse them, the pump answers a RECALL
 * delivered to B as the test asks: B releases them through the pool's
 * memory ops (a GIVEBACK, as a move does), or B sends REFUSE, or nothing.
 */
#include "pool/pool_priv.h"

#include "util/clock.h"
#include "check_main.h"

#include <check.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NRANKS 3
#define NSEGS  8u
#define SEG    ((size_t)64 * 1024)
enum { L = 0, B = 1, L2 = 2 };

typedef struct {
    ema__xport_t      xp;
    ema__mem_arena_t *arena;
    ema__win_ctx_t    win;
    ema__pool_t       pool;
} side_t;

static side_t side[NRANKS];

/* --- the loopback -------------------------------------------------------- */

typedef struct qmsg {
    struct qmsg *next;
    int          src, dst;
    size_t       len;
    char         data[]; /* header and payload, contiguous */
} qmsg_t;

static qmsg_t  *q_head;
static qmsg_t **q_tail = &q_head;

/* Every message sent, in order, for the tests to read. */
typedef struct {
    int      src, dst;
    uint32_t type, count;
    uint64_t left;
} sent_t;
#define MAXSENT 512
static sent_t sent[MAXSENT];
static int    nsent;

static ema_status_t loop_send(void *arg, int peer, const void *hdr, size_t hlen,
                              const void *payload, size_t plen)
{
    side_t *s = arg;
    ema_pool_msg_t m;

    ck_assert_int_ge(peer, 0);
    ck_assert_int_lt(peer, NRANKS);
    ck_assert_int_ne(peer, s->pool.rank);
    ck_assert_uint_eq(hlen, sizeof(m));
    qmsg_t *q = malloc(sizeof(*q) + hlen + plen);
    ck_assert_ptr_nonnull(q);
    q->next = NULL;
    q->src  = s->pool.rank;
    q->dst  = peer;
    q->len  = hlen + plen;
    memcpy(q->data, hdr, hlen);
    if (plen > 0) {
        memcpy(q->data + hlen, payload, plen);
    }
    *q_tail = q;
    q_tail  = &q->next;
    memcpy(&m, hdr, sizeof(m));
    ck_assert_int_lt(nsent, MAXSENT);
    sent[nsent++] = (sent_t){q->src, peer, m.type, m.count, m.left};
    return EMA_SUCCESS;
}

/* How B answers a RECALL (in place of win/migrate.c's ema__win_recall). */
enum { ANSWER_NOTHING, ANSWER_GIVEBACK, ANSWER_REFUSE };
static int recall_answer;

/* How the pump mangles a GRANT on its way to B. */
enum {
    TAMPER_NONE,
    TAMPER_TRUNCATE,       /* one byte short of its handles */
    TAMPER_COUNT_OVER_WANT, /* one segment more than asked for */
    TAMPER_SEG_OUT_OF_RANGE, /* a segment past the lender's arena */
    TAMPER_LEFT_OVER_ARENA, /* more left than the lender's arena holds */
    TAMPER_FROM_OTHER_RANK, /* a copy from L2 first, then the real one */
    TAMPER_TWICE           /* the real one, then a copy */
};
static int tamper;

static void send_raw(int from, int to, uint32_t type, uint32_t count, const uint32_t *segs,
                     uint32_t npayload, uint64_t left)
{
    ema_pool_msg_t m = {.type = type, .count = count, .left = left};
    ck_assert_int_eq(ema__pool_send(&side[from].pool, to, &m, segs,
                                    (size_t)npayload * sizeof(uint32_t)),
                     EMA_SUCCESS);
}

/* Hand @m and @payload to @dst's dispatch as rank @src, as UCX would. */
static void inject(int dst, int src, const ema_pool_msg_t *m, const void *payload, size_t plen)
{
    char buf[sizeof(*m) + 4 * NSEGS * sizeof(int64_t)];
    ck_assert_uint_le(plen, sizeof(buf) - sizeof(*m));
    memcpy(buf, m, sizeof(*m));
    if (plen > 0) {
        memcpy(buf + sizeof(*m), payload, plen);
    }
    ema__pool_dispatch(&side[dst].pool, src, buf, sizeof(*m) + plen);
}

static void inject_grant(int src, ema_pool_msg_t m, uint32_t k, const uint32_t *segs,
                         const int64_t *h)
{
    char payload[NSEGS * 2 * (sizeof(uint32_t) + sizeof(int64_t))];
    ck_assert_uint_le(k, 2 * NSEGS);
    m.count = k;
    memcpy(payload, segs, k * sizeof(uint32_t));
    memcpy(payload + k * sizeof(uint32_t), h, k * sizeof(int64_t));
    inject(B, src, &m, payload, k * (sizeof(uint32_t) + sizeof(int64_t)));
}

static void tamper_grant(const qmsg_t *q)
{
    ema_pool_msg_t m;
    uint32_t segs[NSEGS + 1];
    int64_t h[NSEGS + 1];

    memcpy(&m, q->data, sizeof(m));
    uint32_t k = m.count;
    ck_assert_uint_le(k, NSEGS);
    memcpy(segs, q->data + sizeof(m), k * sizeof(uint32_t));
    memcpy(h, q->data + sizeof(m) + k * sizeof(uint32_t), k * sizeof(int64_t));
    switch (tamper) {
    case TAMPER_TRUNCATE:
        ema__pool_dispatch(&side[B].pool, q->src, q->data, q->len - 1);
        break;
    case TAMPER_COUNT_OVER_WANT:
        segs[k] = NSEGS - 1;
        h[k]    = h[0];
        inject_grant(q->src, m, k + 1, segs, h);
        break;
    case TAMPER_SEG_OUT_OF_RANGE:
        segs[k - 1] = NSEGS;
        inject_grant(q->src, m, k, segs, h);
        break;
    case TAMPER_LEFT_OVER_ARENA:
        m.left = NSEGS + 1;
        inject_grant(q->src, m, k, segs, h);
        break;
    case TAMPER_FROM_OTHER_RANK:
        ema__pool_dispatch(&side[B].pool, L2, q->data, q->len);
        ema__pool_dispatch(&side[B].pool, q->src, q->data, q->len);
        break;
    case TAMPER_TWICE:
        ema__pool_dispatch(&side[B].pool, q->src, q->data, q->len);
        ema__pool_dispatch(&side[B].pool, q->src, q->data, q->len);
        break;
    }
}

static void answer_recall(int lender, const ema_pool_msg_t *m, const char *payload)
{
    uint32_t segs[NSEGS];
    ema__loc_t locs[NSEGS];
    uint32_t n = m->count;

    ck_assert_uint_le(n, NSEGS);
    memcpy(segs, payload, n * sizeof(uint32_t));
    if (recall_answer == ANSWER_GIVEBACK) {
        /* what a move does with the old segments once the data is out */
        for (uint32_t i = 0; i < n; i++) {
            locs[i] = EMA_LOC(lender, EMA_TIER_DEVICE, segs[i]);
        }
        ema__pool_mem_ops.release(&side[B].pool, locs, n);
    } else if (recall_answer == ANSWER_REFUSE) {
        send_raw(B, lender, EMA_POOL_MSG_REFUSE, n, segs, n, 0);
    }
}

static void deliver(const qmsg_t *q)
{
    ema_pool_msg_t m;
    memcpy(&m, q->data, sizeof(m));
    if (m.type == EMA_POOL_MSG_GRANT && q->dst == B && tamper != TAMPER_NONE) {
        tamper_grant(q);
        return;
    }
    ema__pool_dispatch(&side[q->dst].pool, q->src, q->data, q->len);
    if (m.type == EMA_POOL_MSG_RECALL && q->dst == B) {
        answer_recall(q->src, &m, q->data + sizeof(m));
    }
}

/* --- the pump ------------------------------------------------------------ */

static ema__xport_t *waiting; /* a side in the library's own wait loop */

/* Deliver every queued message in order, then run each side's deferred
 * jobs (not the waiting side's: its own loop runs them).  Returns how much
 * happened. */
static int pump_round(void)
{
    int n = 0;
    while (q_head != NULL) {
        qmsg_t *q = q_head;
        q_head    = q->next;
        if (q_head == NULL) {
            q_tail = &q_head;
        }
        deliver(q);
        free(q);
        n++;
    }
    for (int r = 0; r < NRANKS; r++) {
        if (&side[r].xp != waiting) {
            n += ema__xport_run_deferred(&side[r].xp, EMA_WAIT_LONG);
        }
    }
    return n;
}

/* Until nothing moves, or a bound. */
static void pump(void)
{
    for (int rounds = 0; pump_round() > 0 && rounds < 1000; rounds++) {
    }
}

static void pump_job(void *arg)
{
    (void)arg; /* NULL: ema__xport_destroy frees what is left queued */
    if (waiting == NULL) {
        return;
    }
    pump_round();
    ema__xport_defer_ref(waiting, EMA_JOB_QUICK, pump_job, NULL);
}

/* Rank @r is about to wait in the library's own loop: pump from inside it. */
static void wait_begin(int r)
{
    waiting = &side[r].xp;
    ema__xport_defer_ref(waiting, EMA_JOB_QUICK, pump_job, NULL);
}

static void wait_end(void)
{
    ema__xport_t *xp = waiting;
    waiting = NULL;
    ema__xport_run_deferred(xp, EMA_WAIT_QUICK); /* the pump job ends */
    pump();
}

/* Rank @r's pool finds @want segments at its peers, as a grow does
 * (ema__pool_mem_ops.acquire), never at @exclude; returns how many. */
static uint32_t borrow(int r, uint32_t want, int exclude, ema__loc_t *locs, int64_t *handles)
{
    wait_begin(r);
    uint32_t got = ema__pool_mem_ops.acquire(&side[r].pool, want, exclude, EMA_WIN_FROM_PEERS,
                                             locs, handles);
    wait_end();
    return got;
}

/* B borrows all of L's arena, and maps it (as a grow would). */
static void borrow_all_of_l(void)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ck_assert_uint_eq(borrow(B, NSEGS, L2, locs, h), NSEGS);
    ema__pool_mem_ops.mapped(&side[B].pool, locs, NSEGS);
}

static ema_status_t reclaim(uint32_t target, uint64_t timeout_ms, int *withheld_p)
{
    wait_begin(L);
    ema_status_t status = ema__pool_reclaim(&side[L].pool, target, timeout_ms,
                                            EMA_POOL_RECLAIM_FAIL_FAST, withheld_p);
    wait_end();
    return status;
}

/* Rank @r's own windows take @n of its segments. */
static void use_own(int r, uint32_t n)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ck_assert_uint_eq(ema__pool_mem_ops.acquire(&side[r].pool, n, -1, EMA_WIN_FROM_LOCAL, locs,
                                                h),
                      n);
    ema__pool_mem_ops.changed(&side[r].pool, EMA_WIN_CHANGED_MEMORY);
    pump();
}

static uint32_t lendable(int r)
{
    pthread_mutex_lock(&side[r].pool.lock);
    uint32_t n = ema__pool_lendable_locked(&side[r].pool);
    pthread_mutex_unlock(&side[r].pool.lock);
    return n;
}

static void expect_sent(int i, int src, int dst, uint32_t type, uint32_t count)
{
    ck_assert_msg(i < nsent, "message %d never sent (%d sent)", i, nsent);
    ck_assert_msg(sent[i].src == src && sent[i].dst == dst && sent[i].type == type &&
                      sent[i].count == count,
                  "message %d: type %u count %u from %d to %d; expected type %u count %u "
                  "from %d to %d", i, sent[i].type, sent[i].count, sent[i].src, sent[i].dst,
                  type, count, src, dst);
}

/* --- the observable state of a pool, to prove that nothing changed ------- */

typedef struct {
    int16_t    lent_to[NSEGS];
    uint8_t    recalling[NSEGS], granting[NSEGS], state[NSEGS];
    uint32_t   withheld, nfree, nlent;
    int        recall_pending, recall_refused;
    uint64_t   peer_lendable[NRANKS];
    size_t     nacq;
    ema__loc_t acq[4 * NSEGS];
    unsigned   borrowed;
    int        deferred;
} snap_t;

static void snap(int r, snap_t *s)
{
    ema__pool_t *p = &side[r].pool;
    memset(s, 0, sizeof(*s));
    memcpy(s->lent_to, p->lent_to, sizeof(s->lent_to));
    memcpy(s->recalling, p->recalling, sizeof(s->recalling));
    memcpy(s->granting, p->granting, sizeof(s->granting));
    memcpy(s->state, p->arena->pool.state, sizeof(s->state));
    s->withheld       = p->withheld;
    s->nfree          = ema__seg_pool_nfree(&p->arena->pool);
    s->nlent          = p->arena->pool.nlent;
    s->recall_pending = atomic_load(&p->recall_pending);
    s->recall_refused = atomic_load(&p->recall_refused);
    for (int q = 0; q < NRANKS; q++) {
        s->peer_lendable[q] = atomic_load(&p->peer_lendable[q]);
    }
    ck_assert_uint_le(p->nacq, 4 * NSEGS);
    s->nacq = p->nacq;
    if (p->nacq > 0) {
        memcpy(s->acq, p->acq, p->nacq * sizeof(*p->acq));
    }
    s->borrowed = atomic_load(&p->borrowed_segs);
    s->deferred = atomic_load(&side[r].xp.defer_count[0]) +
                  atomic_load(&side[r].xp.defer_count[1]);
}

#define SAME_FIELD(_a, _b, _f, _r, _what)                                                    \
    ck_assert_msg(memcmp(&(_a)->_f, &(_b)->_f, sizeof((_a)->_f)) == 0,                       \
                  "rank %d: %s changed by %s", (_r), #_f, (_what))

static void assert_same(int r, const snap_t *a, const char *what)
{
    snap_t b;
    snap(r, &b);
    SAME_FIELD(a, &b, lent_to, r, what);
    SAME_FIELD(a, &b, recalling, r, what);
    SAME_FIELD(a, &b, granting, r, what);
    SAME_FIELD(a, &b, state, r, what);
    SAME_FIELD(a, &b, withheld, r, what);
    SAME_FIELD(a, &b, nfree, r, what);
    SAME_FIELD(a, &b, nlent, r, what);
    SAME_FIELD(a, &b, recall_pending, r, what);
    SAME_FIELD(a, &b, recall_refused, r, what);
    SAME_FIELD(a, &b, peer_lendable, r, what);
    SAME_FIELD(a, &b, nacq, r, what);
    SAME_FIELD(a, &b, acq, r, what);
    SAME_FIELD(a, &b, borrowed, r, what);
    SAME_FIELD(a, &b, deferred, r, what);
}

/* --- the world ------------------------------------------------------------ */

static void world_up(size_t lend_reserve)
{
    for (int r = 0; r < NRANKS; r++) {
        side_t *s = &side[r];
        memset(s, 0, sizeof(*s));
        ck_assert_int_eq(ema__xport_create(&s->xp, r, NRANKS), EMA_SUCCESS);
        ck_assert_int_eq(ema__mem_arena_create(&ema__mem_host_ops, NSEGS * SEG, SEG, 0, 0,
                                               &s->arena),
                         EMA_SUCCESS);
        ck_assert_int_eq(ema__win_ctx_init(&s->win, &s->xp, s->arena, NULL, r, NRANKS),
                         EMA_SUCCESS);
    }
    /* what ema__win_ctx_connect learns from the modex: every rank's arena */
    for (int r = 0; r < NRANKS; r++) {
        for (int q = 0; q < NRANKS; q++) {
            ema__mem_arena_export(side[q].arena, &side[r].win.exports[EMA_TIER_DEVICE][q]);
        }
    }
    for (int r = 0; r < NRANKS; r++) {
        side_t *s = &side[r];
        s->pool.cfg.lend_reserve    = lend_reserve;
        s->pool.cfg.reclaim_timeout = 2;
        ck_assert_int_eq(ema__pool_init(&s->pool, &s->win, NULL), EMA_SUCCESS);
        s->pool.send     = loop_send;
        s->pool.send_arg = s;
    }
    nsent         = 0;
    waiting       = NULL;
    recall_answer = ANSWER_NOTHING;
    tamper        = TAMPER_NONE;
}

static void setup(void)         { world_up(0); }
/* 2 segments never lent: a reserve that is not a whole number of them */
static void setup_reserve(void) { world_up(2 * SEG - 1); }

static void teardown(void)
{
    tamper        = TAMPER_NONE;
    recall_answer = ANSWER_NOTHING;
    pump(); /* deferred jobs' args are not all malloc'ed (advertise: the pool) */
    while (q_head != NULL) {
        qmsg_t *q = q_head;
        q_head    = q->next;
        free(q);
    }
    q_tail = &q_head;
    for (int r = NRANKS - 1; r >= 0; r--) {
        side_t *s = &side[r];
        ema__pool_cleanup(&s->pool);
        ema__win_ctx_cleanup(&s->win);
        ema__xport_destroy(&s->xp);
        ema__mem_arena_destroy(s->arena);
    }
}

/* --- borrowing ------------------------------------------------------------ */

EMA_TEST("loopback", test_borrow_grants_up_to_lendable_and_marks_lent)
{
    ema__loc_t locs[2 * NSEGS];
    int64_t h[2 * NSEGS];

    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), NSEGS); /* until told */
    ck_assert_uint_eq(borrow(B, 3, L2, locs, h), 3);
    expect_sent(0, B, L, EMA_POOL_MSG_BORROW, 3);
    expect_sent(1, L, B, EMA_POOL_MSG_GRANT, 3);
    ck_assert_uint_eq(sent[1].left, NSEGS - 3);
    expect_sent(2, L, B, EMA_POOL_MSG_ADVERT, 0);
    expect_sent(3, L, L2, EMA_POOL_MSG_ADVERT, 0);
    ck_assert_uint_eq(sent[3].left, NSEGS - 3);
    ck_assert_int_eq(nsent, 4);

    /* the lender: the first run of free segments, lent to B, grants out */
    ema__pool_t *l = &side[L].pool;
    for (uint32_t s = 0; s < NSEGS; s++) {
        ck_assert_int_eq(l->lent_to[s], s < 3 ? B : -1);
        ck_assert_uint_eq(l->arena->pool.state[s], s < 3 ? EMA_SEG_LENT : EMA_SEG_FREE);
        ck_assert_uint_eq(l->granting[s], 0);
        ck_assert_uint_eq(l->recalling[s], 0);
    }
    ck_assert_uint_eq(l->arena->pool.nlent, 3);
    ck_assert_uint_eq(lendable(L), NSEGS - 3);

    /* the borrower: where they are and how to map them; tracked until
     * mapped; what the lender has left, from the grant and its advert */
    ema__pool_t *b = &side[B].pool;
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(locs[i], EMA_LOC(L, EMA_TIER_DEVICE, i));
        ck_assert_int_eq(h[i], side[L].arena->fd);
    }
    ck_assert_uint_eq(b->nacq, 3);
    ck_assert_uint_eq(atomic_load(&b->borrowed_segs), 3);
    ck_assert_uint_eq(atomic_load(&b->peer_lendable[L]), NSEGS - 3);
    ck_assert_uint_eq(atomic_load(&side[L2].pool.peer_lendable[L]), NSEGS - 3);
    ema__pool_mem_ops.mapped(b, locs, 3);
    ck_assert_uint_eq(b->nacq, 0);

    /* more than is left: what is left */
    ck_assert_uint_eq(borrow(B, 2 * NSEGS, L2, locs, h), NSEGS - 3);
    expect_sent(4, B, L, EMA_POOL_MSG_BORROW, 2 * NSEGS);
    expect_sent(5, L, B, EMA_POOL_MSG_GRANT, NSEGS - 3);
    ck_assert_uint_eq(sent[5].left, 0);
    ck_assert_uint_eq(l->arena->pool.nlent, NSEGS);
    ck_assert_uint_eq(lendable(L), 0);
    ck_assert_uint_eq(atomic_load(&b->peer_lendable[L]), 0);

    /* nothing left: an empty grant, and no advert (nothing changed) */
    int n0 = nsent;
    ck_assert_uint_eq(borrow(B, 1, L2, locs, h), 0);
    ck_assert_int_eq(nsent, n0 + 2);
    expect_sent(n0 + 1, L, B, EMA_POOL_MSG_GRANT, 0);
    ck_assert_uint_eq(l->arena->pool.nlent, NSEGS);
}
END_TEST

EMA_TEST("reserve", test_grant_respects_reserve_and_withheld)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ema__pool_t *l = &side[L].pool;

    ck_assert_uint_eq(l->reserve_segs, 2);
    /* what every rank assumes of a peer until told: its arena less the reserve */
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), NSEGS - 2);
    pthread_mutex_lock(&l->lock);
    l->withheld = 1; /* as a reclaim leaves it */
    pthread_mutex_unlock(&l->lock);

    ck_assert_uint_eq(borrow(B, NSEGS, L2, locs, h), NSEGS - 3);
    expect_sent(1, L, B, EMA_POOL_MSG_GRANT, NSEGS - 3);
    ck_assert_uint_eq(sent[1].left, 0);
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 3); /* reserve + withheld stay free */
    ck_assert_uint_eq(lendable(L), 0);
    ck_assert_uint_eq(borrow(B, 1, L2, locs, h), 0);

    /* the withheld segment is released: lendable again, and said so */
    pthread_mutex_lock(&l->lock);
    l->withheld = 0;
    pthread_mutex_unlock(&l->lock);
    int n0 = nsent;
    ema__pool_advertise(l);
    pump();
    expect_sent(n0, L, B, EMA_POOL_MSG_ADVERT, 0);
    ck_assert_uint_eq(sent[n0].left, 1);
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), 1);
    ck_assert_uint_eq(borrow(B, 4, L2, locs, h), 1);
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 2); /* the reserve */
}
END_TEST

EMA_TEST("loopback", test_borrow_asks_most_lendable_lender_first_then_the_next)
{
    ema__loc_t locs[2 * NSEGS];
    int64_t h[2 * NSEGS];

    use_own(L, NSEGS - 2); /* L advertises 2 left; L2 still has all 8 */
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), 2);
    int n0 = nsent;
    ck_assert_uint_eq(borrow(B, NSEGS + 2, -1, locs, h), NSEGS + 2);
    expect_sent(n0, B, L2, EMA_POOL_MSG_BORROW, NSEGS + 2);
    expect_sent(n0 + 1, L2, B, EMA_POOL_MSG_GRANT, NSEGS);
    expect_sent(n0 + 4, B, L, EMA_POOL_MSG_BORROW, 2);
    expect_sent(n0 + 5, L, B, EMA_POOL_MSG_GRANT, 2);
    for (uint32_t i = 0; i < NSEGS + 2; i++) {
        ck_assert_int_eq(EMA_LOC_RANK(locs[i]), i < NSEGS ? L2 : L);
    }
    ck_assert_uint_eq(side[L2].pool.arena->pool.nlent, NSEGS);
    ck_assert_uint_eq(side[L].pool.arena->pool.nlent, 2);
    ck_assert_uint_eq(atomic_load(&side[B].pool.borrowed_segs), NSEGS + 2);
}
END_TEST

/* --- giving back ----------------------------------------------------------- */

EMA_TEST("loopback", test_giveback_frees_lent_segments)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ema__pool_t *l = &side[L].pool;

    ck_assert_uint_eq(borrow(B, 3, L2, locs, h), 3);
    ema__pool_mem_ops.mapped(&side[B].pool, locs, 3);
    int n0 = nsent;
    ema__pool_mem_ops.release(&side[B].pool, locs, 2); /* a shrink */
    pump();
    expect_sent(n0, B, L, EMA_POOL_MSG_GIVEBACK, 2); /* one message per lender */
    expect_sent(n0 + 1, L, B, EMA_POOL_MSG_ADVERT, 0);
    ck_assert_uint_eq(sent[n0 + 1].left, NSEGS - 1);
    ck_assert_int_eq(l->lent_to[0], -1);
    ck_assert_int_eq(l->lent_to[1], -1);
    ck_assert_int_eq(l->lent_to[2], B);
    ck_assert_uint_eq(l->arena->pool.state[0], EMA_SEG_FREE);
    ck_assert_uint_eq(l->arena->pool.nlent, 1);
    ck_assert_uint_eq(lendable(L), NSEGS - 1);
    ck_assert_uint_eq(atomic_load(&side[B].pool.borrowed_segs), 1);
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), NSEGS - 1);
    ck_assert_uint_eq(atomic_load(&side[L2].pool.peer_lendable[L]), NSEGS - 1);

    /* granted and never mapped (a failed grow): given back as well */
    ck_assert_uint_eq(borrow(B, 1, L2, locs + 3, h), 1);
    ck_assert_uint_eq(side[B].pool.nacq, 1);
    ema__pool_mem_ops.release(&side[B].pool, locs + 2, 2);
    pump();
    ck_assert_uint_eq(side[B].pool.nacq, 0);
    ck_assert_uint_eq(l->arena->pool.nlent, 0);
    ck_assert_uint_eq(lendable(L), NSEGS);
    for (uint32_t s = 0; s < NSEGS; s++) {
        ck_assert_int_eq(l->lent_to[s], -1);
    }
}
END_TEST

EMA_TEST("loopback", test_giveback_of_segment_not_lent_is_rejected_and_changes_nothing)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    snap_t before[NRANKS];

    ck_assert_uint_eq(borrow(B, 2, L2, locs, h), 2); /* 0 and 1, lent to B */
    use_own(L, 2);                                    /* 2 and 3, L's own */
    for (int r = 0; r < NRANKS; r++) {
        snap(r, &before[r]);
    }
    int n0 = nsent;
    send_raw(L2, L, EMA_POOL_MSG_GIVEBACK, 1, (uint32_t[]){0}, 1, 0); /* lent to B */
    send_raw(B, L, EMA_POOL_MSG_GIVEBACK, 1, (uint32_t[]){2}, 1, 0);  /* L's own */
    send_raw(B, L, EMA_POOL_MSG_GIVEBACK, 1, (uint32_t[]){5}, 1, 0);  /* free */
    send_raw(B, L, EMA_POOL_MSG_GIVEBACK, 2, (uint32_t[]){NSEGS, UINT32_MAX}, 2, 0);
    pump();
    for (int r = 0; r < NRANKS; r++) {
        assert_same(r, &before[r], "a give-back of segments not lent to the sender");
    }
    ck_assert_int_eq(nsent, n0 + 4); /* and no advert */

    /* one segment lent to the sender among ones that are not, or the same
     * segment twice: malformed, so none of it is taken back */
    send_raw(B, L, EMA_POOL_MSG_GIVEBACK, 2, (uint32_t[]){0, 2}, 2, 0);
    send_raw(B, L, EMA_POOL_MSG_GIVEBACK, 2, (uint32_t[]){0, 0}, 2, 0);
    pump();
    for (int r = 0; r < NRANKS; r++) {
        assert_same(r, &before[r], "a give-back with a segment not lent, or twice");
    }
    ck_assert_int_eq(nsent, n0 + 6); /* and no advert */

    /* the real one: both back */
    send_raw(B, L, EMA_POOL_MSG_GIVEBACK, 2, (uint32_t[]){1, 0}, 2, 0);
    pump();
    ema__pool_t *l = &side[L].pool;
    ck_assert_int_eq(l->lent_to[0], -1);
    ck_assert_int_eq(l->lent_to[1], -1);
    ck_assert_uint_eq(l->arena->pool.nlent, 0);
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), before[L].nfree + 2);
}
END_TEST

/* --- reclaiming ------------------------------------------------------------ */

EMA_TEST("loopback", test_recall_then_giveback_completes_reclaim)
{
    ema__pool_t *l = &side[L].pool;
    int withheld = -1;

    borrow_all_of_l();
    recall_answer = ANSWER_GIVEBACK;
    int n0 = nsent;
    ck_assert_int_eq(reclaim(2, 5000, &withheld), EMA_SUCCESS);
    ck_assert_int_eq(withheld, 1);
    expect_sent(n0, L, B, EMA_POOL_MSG_RECALL, 2);
    expect_sent(n0 + 1, B, L, EMA_POOL_MSG_GIVEBACK, 2);
    for (uint32_t s = 0; s < NSEGS; s++) {
        ck_assert_int_eq(l->lent_to[s], s < 2 ? -1 : B);
        ck_assert_uint_eq(l->recalling[s], 0);
    }
    ck_assert_int_eq(atomic_load(&l->recall_pending), 0);
    ck_assert_int_eq(atomic_load(&l->recall_refused), 0);
    ck_assert_uint_eq(l->withheld, 2);
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 2);
    ck_assert_uint_eq(lendable(L), 0); /* withheld: not lent again */
    ck_assert_uint_eq(atomic_load(&l->reclaims), 1);
    ck_assert_uint_eq(atomic_load(&side[B].pool.borrowed_segs), NSEGS - 2);

    /* free memory counts first: a second reclaim of what came back recalls nothing */
    pthread_mutex_lock(&l->lock);
    l->withheld = 0;
    pthread_mutex_unlock(&l->lock);
    n0 = nsent;
    ck_assert_int_eq(reclaim(2, 5000, &withheld), EMA_SUCCESS);
    ck_assert_int_eq(withheld, 1);
    for (int i = n0; i < nsent; i++) {
        ck_assert_uint_ne(sent[i].type, EMA_POOL_MSG_RECALL);
    }
}
END_TEST

EMA_TEST("loopback", test_reclaim_for_self_makes_returned_segments_usable)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ema__pool_t *l = &side[L].pool;

    borrow_all_of_l();
    recall_answer = ANSWER_GIVEBACK;
    wait_begin(L);
    /* L's own window grows: what comes back is the grow's, used at once */
    ck_assert_uint_eq(ema__pool_mem_ops.reclaim_for_self(l, 3, locs, h), 3);
    wait_end();
    ck_assert_uint_eq(l->withheld, 0);
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 0);
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_int_eq(EMA_LOC_RANK(locs[i]), L);
        ck_assert_int_eq(EMA_LOC_TIER(locs[i]), EMA_TIER_DEVICE);
        ck_assert_uint_eq(l->arena->pool.state[EMA_LOC_SEG(locs[i])], EMA_SEG_USED);
        ck_assert_int_eq(l->lent_to[EMA_LOC_SEG(locs[i])], -1);
        ck_assert_int_eq(h[i], l->arena->fd);
    }
    ck_assert_uint_eq(l->arena->pool.nlent, NSEGS - 3);
}
END_TEST

/* What a grow's implicit reclaim got back is the grow's from the moment
 * it stops being withheld: a BORROW from another peer served right after
 * the reclaim and before the grow maps it (the progress thread runs quick
 * jobs whenever it likes) finds nothing to lend.  (It used to stop
 * withholding first and let the grow take it later with acquire: the
 * BORROW in between got all three.) */
EMA_TEST("loopback", test_reclaim_for_self_keeps_returned_segments_from_other_borrowers)
{
    ema__loc_t locs[NSEGS], l2locs[NSEGS];
    int64_t h[NSEGS], l2h[NSEGS];
    ema__pool_t *l = &side[L].pool;

    borrow_all_of_l();
    recall_answer = ANSWER_GIVEBACK;
    wait_begin(L);
    uint32_t got = ema__pool_mem_ops.reclaim_for_self(l, 3, locs, h); /* L's window grows */
    wait_end();
    /* L2 asks L before the grow maps the memory */
    ck_assert_uint_eq(borrow(L2, 3, B, l2locs, l2h), 0);
    ck_assert_uint_eq(got, 3);
    ck_assert_uint_eq(l->arena->pool.nlent, NSEGS - 3);
    ck_assert_uint_eq(side[L2].pool.nacq, 0);
}
END_TEST

EMA_TEST("loopback", test_refuse_ends_recall_with_no_memory)
{
    ema__pool_t *l = &side[L].pool;
    int withheld = -1;

    borrow_all_of_l();
    recall_answer = ANSWER_REFUSE;
    int n0 = nsent;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(reclaim(2, 10000, &withheld), EMA_ERR_NO_MEMORY);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_msg(t1.tv_sec - t0.tv_sec < 5, "the refused reclaim waited for its timeout");
    ck_assert_int_eq(withheld, 1);
    expect_sent(n0, L, B, EMA_POOL_MSG_RECALL, 2);
    expect_sent(n0 + 1, B, L, EMA_POOL_MSG_REFUSE, 2);
    for (uint32_t s = 0; s < NSEGS; s++) {
        ck_assert_int_eq(l->lent_to[s], B); /* they stay lent */
        ck_assert_uint_eq(l->recalling[s], 0);
    }
    ck_assert_int_eq(atomic_load(&l->recall_pending), 0);
    ck_assert_int_eq(atomic_load(&l->recall_refused), 2);
    ck_assert_uint_eq(l->withheld, 2); /* withheld, to come back later */
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 0);

    /* a REFUSE of segments no longer recalled counts nothing */
    send_raw(B, L, EMA_POOL_MSG_REFUSE, 2, (uint32_t[]){0, 1}, 2, 0);
    pump();
    ck_assert_int_eq(atomic_load(&l->recall_refused), 2);
    ck_assert_int_eq(atomic_load(&l->recall_pending), 0);
}
END_TEST

EMA_TEST("loopback", test_silent_borrower_times_out_reclaim_and_late_giveback_clears_it)
{
    ema__pool_t *l = &side[L].pool;
    int withheld = -1;

    borrow_all_of_l();
    recall_answer = ANSWER_NOTHING;
    ck_assert_int_eq(reclaim(2, 100, &withheld), EMA_ERR_TIMEOUT);
    ck_assert_int_eq(withheld, 1);
    ck_assert_uint_eq(l->recalling[0], 1);
    ck_assert_uint_eq(l->recalling[1], 1);
    ck_assert_int_eq(atomic_load(&l->recall_pending), 2);
    ck_assert_uint_eq(l->withheld, 2);

    /* the give-back comes after all */
    ema__loc_t late[2] = {EMA_LOC(L, EMA_TIER_DEVICE, 0), EMA_LOC(L, EMA_TIER_DEVICE, 1)};
    ema__pool_mem_ops.release(&side[B].pool, late, 2);
    pump();
    ck_assert_uint_eq(l->recalling[0], 0);
    ck_assert_uint_eq(l->recalling[1], 0);
    ck_assert_int_eq(atomic_load(&l->recall_pending), 0);
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 2);
    ck_assert_uint_eq(lendable(L), 0); /* still withheld */
}
END_TEST

/* --- advertisements -------------------------------------------------------- */

EMA_TEST("loopback", test_advert_updates_peer_lendable)
{
    use_own(L, 3);
    expect_sent(0, L, B, EMA_POOL_MSG_ADVERT, 0);
    expect_sent(1, L, L2, EMA_POOL_MSG_ADVERT, 0);
    ck_assert_uint_eq(sent[0].left, NSEGS - 3);
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), NSEGS - 3);
    ck_assert_uint_eq(atomic_load(&side[L2].pool.peer_lendable[L]), NSEGS - 3);

    /* nothing changed: nothing said */
    ema__pool_mem_ops.changed(&side[L].pool, EMA_WIN_CHANGED_MEMORY);
    pump();
    ck_assert_int_eq(nsent, 2);

    send_raw(L2, B, EMA_POOL_MSG_ADVERT, 0, NULL, 0, 1);
    send_raw(L2, L, EMA_POOL_MSG_ADVERT, 0, NULL, 0, 0);
    pump();
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L2]), 1);
    ck_assert_uint_eq(atomic_load(&side[L].pool.peer_lendable[L2]), 0);
    ck_assert_uint_eq(atomic_load(&side[B].pool.peer_lendable[L]), NSEGS - 3);
}
END_TEST

/* --- malformed messages ------------------------------------------------------ */

EMA_TEST("loopback", test_malformed_messages_are_dropped_and_change_nothing)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    snap_t before[NRANKS];
    ema_pool_msg_t m;
    char raw[sizeof(m)];

    ck_assert_uint_eq(borrow(B, 3, L2, locs, h), 3); /* 0..2 lent to B, grants tracked */
    for (int r = 0; r < NRANKS; r++) {
        snap(r, &before[r]);
    }
    int n0 = nsent;
#define CHECK_NOTHING_CHANGED(_what)                         \
    do {                                                     \
        pump();                                              \
        for (int r_ = 0; r_ < NRANKS; r_++) {                \
            assert_same(r_, &before[r_], (_what));           \
        }                                                    \
        ck_assert_msg(nsent == n0, "%s sent a message", (_what)); \
    } while (0)

    /* shorter than a header */
    memset(raw, 0, sizeof(raw));
    ema__pool_dispatch(&side[L].pool, B, raw, 0);
    ema__pool_dispatch(&side[B].pool, L, raw, sizeof(m) - 1);
    CHECK_NOTHING_CHANGED("a short message");

    /* unknown types */
    memset(&m, 0, sizeof(m));
    m.count = 1;
    for (uint32_t t = 0; t < 3; t++) {
        m.type = (uint32_t[]){0, EMA_POOL_MSG_ADVERT + 1, UINT32_MAX}[t];
        inject(L, B, &m, (uint32_t[]){0}, sizeof(uint32_t));
        inject(B, L, &m, (uint32_t[]){0}, sizeof(uint32_t));
    }
    CHECK_NOTHING_CHANGED("an unknown type");

    /* from no peer: out of range, or the receiver itself */
    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_BORROW;
    m.count = 2;
    for (int i = 0; i < 4; i++) {
        inject(L, (int[]){-1, NRANKS, INT_MAX, L}[i], &m, NULL, 0);
    }
    m.type = EMA_POOL_MSG_GIVEBACK;
    inject(L, -1, &m, (uint32_t[]){0, 1}, 2 * sizeof(uint32_t));
    inject(L, L, &m, (uint32_t[]){0, 1}, 2 * sizeof(uint32_t));
    CHECK_NOTHING_CHANGED("a message from no peer");

    /* a give-back whose count is more than its payload holds: the segment
     * it does hold is lent to the sender, and must stay lent */
    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_GIVEBACK;
    m.count = 2;
    inject(L, B, &m, (uint32_t[]){0}, sizeof(uint32_t));
    m.count = UINT32_MAX;
    inject(L, B, &m, (uint32_t[]){0}, sizeof(uint32_t));
    CHECK_NOTHING_CHANGED("a give-back with a count past its payload");

    /* segment indices past the arena */
    m.count = 2;
    inject(L, B, &m, (uint32_t[]){NSEGS, UINT32_MAX}, 2 * sizeof(uint32_t));
    CHECK_NOTHING_CHANGED("a give-back of segments past the arena");

    /* refusals: count past the payload, past the arena, nothing recalled */
    m.type  = EMA_POOL_MSG_REFUSE;
    m.count = 3;
    inject(L, B, &m, (uint32_t[]){0}, sizeof(uint32_t));
    m.count = 2;
    inject(L, B, &m, (uint32_t[]){NSEGS, UINT32_MAX}, 2 * sizeof(uint32_t));
    inject(L, B, &m, (uint32_t[]){0, 1}, 2 * sizeof(uint32_t));
    CHECK_NOTHING_CHANGED("a malformed or unasked-for refusal");

    /* a recall whose count is past its payload queues no job */
    m.type  = EMA_POOL_MSG_RECALL;
    m.count = 2;
    inject(B, L, &m, (uint32_t[]){0}, sizeof(uint32_t));
    m.count = UINT32_MAX;
    inject(B, L, &m, (uint32_t[]){0}, sizeof(uint32_t));
    CHECK_NOTHING_CHANGED("a recall with a count past its payload");

    /* a grant that answers no borrow: no waiter has that id, or had it
     * and was answered (1: the borrow above) */
    memset(&m, 0, sizeof(m));
    m.type = EMA_POOL_MSG_GRANT;
    m.left = 1;
    for (int i = 0; i < 3; i++) {
        m.token = (uint64_t[]){0, 0xdeadbeefull, 1}[i];
        inject_grant(L, m, 1, (uint32_t[]){3}, (int64_t[]){side[L].arena->fd});
        inject_grant(L, m, 0, (uint32_t[]){0}, (int64_t[]){0});
    }
    /* The borrower gives such segments straight back (a lender's memory is
     * never leaked by a grant nobody took), and the lender refuses them as
     * not lent to it: messages, but no state changes anywhere. */
    pump();
    for (int r_ = 0; r_ < NRANKS; r_++) {
        assert_same(r_, &before[r_], "a grant that answers no borrow");
    }
    n0 = nsent;

    /* an advert of more than the sender's arena holds */
    memset(&m, 0, sizeof(m));
    m.type = EMA_POOL_MSG_ADVERT;
    m.left = NSEGS + 1;
    inject(B, L2, &m, NULL, 0);
    m.left = UINT64_MAX;
    inject(L, L2, &m, NULL, 0);
    CHECK_NOTHING_CHANGED("an advert past the sender's arena");
#undef CHECK_NOTHING_CHANGED
}
END_TEST

/* A borrower whose GRANT is mangled wakes with nothing, and tracks nothing:
 * it never maps memory it was not properly granted.  (The lender's
 * segments stay lent to it: the lender cannot know.) */
EMA_TEST("loopback", test_malformed_grant_wakes_borrower_with_nothing)
{
    static const int tampers[] = {TAMPER_TRUNCATE, TAMPER_COUNT_OVER_WANT,
                                  TAMPER_SEG_OUT_OF_RANGE, TAMPER_LEFT_OVER_ARENA};
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ema__pool_t *b = &side[B].pool;

    for (size_t i = 0; i < sizeof(tampers) / sizeof(tampers[0]); i++) {
        tamper = tampers[i];
        ck_assert_msg(borrow(B, 2, L2, locs, h) == 0, "tamper %d: segments taken", tamper);
        ck_assert_uint_eq(b->nacq, 0);
        ck_assert_uint_eq(atomic_load(&b->borrowed_segs), 0);
        /* the lender's figure is its advert's, never the mangled grant's */
        ck_assert_uint_eq(atomic_load(&b->peer_lendable[L]), lendable(L));
    }
}
END_TEST

EMA_TEST("loopback", test_grant_from_another_rank_or_twice_is_dropped)
{
    ema__loc_t locs[NSEGS];
    int64_t h[NSEGS];
    ema__pool_t *b = &side[B].pool;

    /* a copy from L2 first: B asked L, so it waits on for L's */
    tamper = TAMPER_FROM_OTHER_RANK;
    ck_assert_uint_eq(borrow(B, 2, L2, locs, h), 2);
    ck_assert_uint_eq(b->nacq, 2);
    for (size_t i = 0; i < b->nacq; i++) {
        ck_assert_int_eq(EMA_LOC_RANK(b->acq[i]), L);
    }
    ck_assert_uint_eq(atomic_load(&b->peer_lendable[L2]), NSEGS); /* not from that copy */

    /* the real one twice: the second answers a borrow that has ended */
    tamper = TAMPER_TWICE;
    ck_assert_uint_eq(borrow(B, 2, L2, locs, h), 2);
    ck_assert_uint_eq(b->nacq, 4);
    ck_assert_uint_eq(atomic_load(&b->borrowed_segs), 4);
}
END_TEST

/* L lends all it has to B, and a reclaim of one segment times out (B
 * holds it: its recall stays pending), then no longer withholds it (as a
 * grow's reclaim_for_self does).  Returns the segment still recalled. */
static uint32_t leave_a_timed_out_recall(void)
{
    ema__pool_t *l = &side[L].pool;
    int withheld = -1;
    uint32_t old = NSEGS;

    borrow_all_of_l();
    recall_answer = ANSWER_NOTHING;
    ck_assert_int_eq(reclaim(1, 50, &withheld), EMA_ERR_TIMEOUT);
    ck_assert_int_eq(atomic_load(&l->recall_pending), 1);
    pthread_mutex_lock(&l->lock);
    l->withheld = 0;
    for (uint32_t s = 0; s < NSEGS; s++) {
        old = l->recalling[s] ? s : old;
    }
    pthread_mutex_unlock(&l->lock);
    ck_assert_uint_lt(old, NSEGS);
    return old;
}

/* A later reclaim that needs nothing recalled, since enough is free, does
 * not wait for that old recall (session 14: it waited its whole timeout,
 * and every grow that reclaims waited EMA_RECLAIM_TIMEOUT). */
EMA_TEST("loopback", test_timed_out_recall_does_not_hold_a_later_reclaim)
{
    ema__pool_t *l = &side[L].pool;
    int withheld = -1;

    leave_a_timed_out_recall();
    /* B gives back 2 other segments, not recalled: L has 2 free */
    ema__loc_t locs[2] = {EMA_LOC(L, EMA_TIER_DEVICE, NSEGS - 2),
                          EMA_LOC(L, EMA_TIER_DEVICE, NSEGS - 1)};
    ema__pool_mem_ops.release(&side[B].pool, locs, 2);
    pump();
    ck_assert_uint_eq(ema__seg_pool_nfree(&l->arena->pool), 2);
    double t0 = ema__now_us();
    ck_assert_int_eq(reclaim(1, 2000, &withheld), EMA_SUCCESS);
    ck_assert_msg(ema__now_us() - t0 < 1e6, "waited %.0f ms for another call's recall",
                  (ema__now_us() - t0) / 1e3);
}
END_TEST

/* The refusal of that old recall, arriving during a later reclaim whose
 * own recall is given back, does not fail the later one. */
EMA_TEST("loopback", test_an_earlier_recalls_refusal_does_not_fail_a_later_reclaim)
{
    int withheld = -1;
    uint32_t old = leave_a_timed_out_recall();

    send_raw(B, L, EMA_POOL_MSG_REFUSE, 1, &old, 1, 0); /* queued: the old one's answer */
    recall_answer = ANSWER_GIVEBACK;
    ck_assert_int_eq(reclaim(1, 2000, &withheld), EMA_SUCCESS);
    ck_assert_uint_ge(ema__seg_pool_nfree(&side[L].pool.arena->pool), 1);
}
END_TEST

/* --- a recall of segments granted and not mapped yet ---------------------- */

/* B borrows all of L's arena and does not map it yet (a grow between its
 * GRANT and its map); L's reclaim of one segment times out meanwhile.
 * Returns the recall passes B ran for it, while L waited and after. */
static unsigned recall_granted_unmapped(ema__loc_t *locs)
{
    ema__pool_t *b = &side[B].pool;
    int64_t h[NSEGS];
    int withheld = -1;

    ck_assert_uint_eq(borrow(B, NSEGS, L2, locs, h), NSEGS);
    ck_assert_uint_eq(b->nacq, NSEGS);
    recall_answer = ANSWER_NOTHING;
    unsigned p0 = atomic_load(&side[B].win.recall_passes);
    ck_assert_int_eq(reclaim(1, 50, &withheld), EMA_ERR_TIMEOUT);
    pump();
    ck_assert_int_eq(atomic_load(&side[L].pool.recall_pending), 1);
    return atomic_load(&side[B].win.recall_passes) - p0;
}

/* The recall parks until the segments leave the granted set: it does not
 * look again at every pass of B's progress (it did: thousands of passes in
 * L's 50 ms, each walking every window, with ctx->recalls > 0 all along so
 * that the policies yielded), and no recall counts as running meanwhile. */
EMA_TEST("loopback", test_recall_of_granted_segments_parks_until_mapped)
{
    ema__loc_t locs[NSEGS];
    ema__pool_t *b = &side[B].pool;

    unsigned passes = recall_granted_unmapped(locs);
    ck_assert_msg(passes <= 2, "the recall of a granted segment ran %u passes before the "
                  "map: it spins instead of parking", passes);
    ck_assert_uint_ge(passes, 1);
    ck_assert_ptr_nonnull(b->parked);
    ck_assert_uint_eq(atomic_load(&side[B].win.recalls), 0);

    /* the grow maps them: the recall is queued again, and runs once */
    unsigned p0 = atomic_load(&side[B].win.recall_passes);
    ema__pool_mem_ops.mapped(b, locs, NSEGS);
    ck_assert_ptr_null(b->parked);
    ck_assert_uint_eq(atomic_load(&side[B].win.recalls), 1);
    pump();
    ck_assert_uint_eq(atomic_load(&side[B].win.recall_passes) - p0, 1);
    ck_assert_uint_eq(atomic_load(&side[B].win.recalls), 0);
    ck_assert_ptr_null(b->parked); /* no window here: nothing found, the job ends */

    /* what the move of a window would do: give the old segments back */
    ema__pool_mem_ops.release(b, locs, NSEGS);
    pump();
    ck_assert_int_eq(atomic_load(&side[L].pool.recall_pending), 0);
    ck_assert_uint_eq(side[L].pool.arena->pool.nlent, 0);
}
END_TEST

/* A grow that fails gives its granted segments back unmapped: that wakes
 * the parked recall too, which ends, and the lender has its memory. */
EMA_TEST("loopback", test_recall_of_granted_segments_ends_when_given_back_unmapped)
{
    ema__loc_t locs[NSEGS];
    ema__pool_t *b = &side[B].pool;

    ck_assert_uint_le(recall_granted_unmapped(locs), 2);
    ck_assert_ptr_nonnull(b->parked);
    unsigned p0 = atomic_load(&side[B].win.recall_passes);
    ema__pool_mem_ops.release(b, locs, NSEGS);
    ck_assert_ptr_null(b->parked);
    pump();
    ck_assert_uint_eq(atomic_load(&side[B].win.recall_passes) - p0, 1);
    ck_assert_uint_eq(atomic_load(&side[B].win.recalls), 0);
    ck_assert_ptr_null(b->parked);
    ck_assert_uint_eq(b->nacq, 0);
    ck_assert_int_eq(atomic_load(&side[L].pool.recall_pending), 0);
    ck_assert_uint_eq(side[L].pool.arena->pool.nlent, 0);
}
END_TEST

/* A recall parked on granted segments when the pool goes (ema_finalize)
 * is freed with it (teardown; a leak checker sees it otherwise). */
EMA_TEST("loopback", test_recall_parked_on_granted_segments_is_freed_at_cleanup)
{
    ema__loc_t locs[NSEGS];

    ck_assert_uint_le(recall_granted_unmapped(locs), 2);
    ck_assert_ptr_nonnull(side[B].pool.parked);
}
END_TEST

int main(void)
{
    ema_check_tcase_options("loopback", 30, setup, teardown);
    ema_check_tcase_options("reserve", 30, setup_reserve, teardown);
    return ema_check_main("lend_protocol", CK_ENV);
}
