/*
 * What one rank records, and its summary per class of phase:
 *   hot    phases in which this rank is hot;
 *   after  (rotating) the phase right after its hot one, while its backlog
 *          drains;
 *   cold   the other measured phases (the rank lends, in elastic);
 *   all    every measured phase (the warm-up and the drain excluded).
 * Throughput counts the tokens generated inside the class's phases;
 * latencies, goodput and the preemption counts are those of the requests
 * that arrived in them (for "cold", and finished in a cold phase too; a
 * request unfinished at the end counts with the time it waited so far,
 * and never as good).
 *
 * Files (with --out DIR), one set per rank R:
 *   req_rR.csv       one line per request
 *   steps_rR.csv     one line per engine step
 *   timeline_rR.csv  memory and queues every sample_s
 *   events_rR.csv    grows, shrinks, recalls, refusals, give-backs, lender
 *                    waits, preemptions
 *   summary_rR.csv   the rows printed at the end
 */
#include "kv_serving.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double t; int prefill; uint32_t batch, ntok; uint64_t kv; double dt, ema_us, bf; } kv_step_rec_t;
typedef struct { double t; size_t size, local, borrowed, used, lent, running, waiting; } kv_sample_t;
typedef struct { double t; const char *what; double bytes, us; } kv_event_t;

#define KV_GROW(_arr, _n, _cap) \
    do { \
        if ((_n) == (_cap)) { \
            (_cap) = (_cap) ? 2 * (_cap) : 1024; \
            (_arr) = realloc((_arr), (_cap) * sizeof(*(_arr))); \
        } \
    } while (0)

struct kv_stats {
    const kv_params_t *p;
    const kv_load_t   *ld;
    int                rank;
    double            *tokens; /* per phase: [0] warm-up ... [nphases + 1] drain */
    kv_step_rec_t     *steps;
    size_t             nsteps, csteps;
    kv_sample_t       *samples;
    size_t             nsamples, csamples;
    kv_event_t        *events;
    size_t             nevents, cevents;
};

enum { KV_CL_HOT, KV_CL_AFTER, KV_CL_COLD, KV_CL_ALL, KV_NCL };
static const char *kv_cl_name[KV_NCL] = {"hot", "after", "cold", "all"};

kv_stats_t *kv_stats_create(const kv_params_t *p, const kv_load_t *ld, int rank)
{
    kv_stats_t *st = calloc(1, sizeof(*st));
    st->p      = p;
    st->ld     = ld;
    st->rank   = rank;
    st->tokens = calloc((size_t)ld->nphases + 2, sizeof(double));
    return st;
}

void kv_stats_destroy(kv_stats_t *st)
{
    free(st->tokens);
    free(st->steps);
    free(st->samples);
    free(st->events);
    free(st);
}

static int kv_class(const kv_load_t *ld, int k, int rank, int cl);

/* The requests a class's latencies are taken over: those that arrived in
 * its phases; for "cold", only those that also finished in a cold phase
 * (one that arrived just before the rank turned hot ran mostly in its hot
 * phase, and measures that phase's batch, not the lender's lot). */
static int kv_req_in(const kv_load_t *ld, const kv_req_t *r, int rank, int cl)
{
    if (!kv_class(ld, r->phase, rank, cl)) {
        return 0;
    }
    return cl != KV_CL_COLD || r->state != KV_REQ_DONE ||
           kv_class(ld, kv_load_phase(ld, r->t_done), rank, KV_CL_COLD);
}

static int kv_class(const kv_load_t *ld, int k, int rank, int cl)
{
    if (k < 0 || k >= ld->nphases) {
        return 0;
    }
    int hot   = kv_load_is_hot(ld, k, rank);
    int after = !hot && k > 0 && kv_load_is_hot(ld, k - 1, rank);
    switch (cl) {
    case KV_CL_HOT:   return hot;
    case KV_CL_AFTER: return after;
    case KV_CL_COLD:  return !hot && !after;
    default:          return 1;
    }
}

void kv_stats_tokens(kv_stats_t *st, double t, uint32_t n)
{
    st->tokens[kv_load_phase(st->ld, t) + 1] += n;
}

void kv_stats_preempt(kv_stats_t *st, double t, uint32_t recomputed)
{
    kv_stats_event(st, t, "preempt", recomputed, 0);
}

void kv_stats_step(kv_stats_t *st, double t, int prefill, uint32_t batch, uint32_t ntok,
                   uint64_t kv_tokens, double dt, double ema_us, double borrowed_frac)
{
    KV_GROW(st->steps, st->nsteps, st->csteps);
    st->steps[st->nsteps++] = (kv_step_rec_t){t, prefill, batch, ntok, kv_tokens, dt, ema_us,
                                              borrowed_frac};
}

void kv_stats_sample(kv_stats_t *st, double t, size_t size, size_t local, size_t borrowed,
                     size_t used, size_t lent, size_t running, size_t waiting)
{
    KV_GROW(st->samples, st->nsamples, st->csamples);
    st->samples[st->nsamples++] = (kv_sample_t){t, size, local, borrowed, used, lent, running,
                                                waiting};
}

void kv_stats_event(kv_stats_t *st, double t, const char *what, double bytes, double us)
{
    KV_GROW(st->events, st->nevents, st->cevents);
    st->events[st->nevents++] = (kv_event_t){t, what, bytes, us};
}

static int kv_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the q-quantile of v[0..n) (sorts it); NAN if empty */
static double kv_quantile(double *v, size_t n, double q)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, n, sizeof(double), kv_cmp_d);
    double x = q * (double)(n - 1);
    size_t i = (size_t)x;
    return (i + 1 < n) ? v[i] + (x - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

static FILE *kv_open(const kv_stats_t *st, const char *what)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s_r%d.csv", st->p->out, what, st->rank);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kv_serving: cannot write %s\n", path);
    }
    return f;
}

#define KV_SUMMARY_HEADER \
    "scenario,config,seed,rank,class,phases,offered_rps,arrived,completed,unfinished," \
    "tokens_s,req_s,goodput_rps,ttft_p50,ttft_p99,tpot_p50,tpot_p99,e2e_p50,e2e_p99," \
    "preemptions,recomputed_tokens,grows,grow_fails,recalls,refusals,shrinks,givebacks," \
    "recalled,lender_waits,lender_wait_p50_ms,lender_wait_p99_ms,lender_wait_max_ms," \
    "local_mean_mib,borrowed_mean_mib,borrowed_max_mib,lent_mean_mib,used_mean_mib," \
    "steps,step_ms_mean,decode_ms_mean,ema_ms_per_s,borrowed_frac_mean,corrupt,wall_s\n"

int kv_stats_finish(kv_stats_t *st, const kv_req_t *rq, size_t nrq, double t_end,
                    uint64_t corrupt, double wall_s)
{
    const kv_params_t *p = st->p;
    const kv_load_t *ld  = st->ld;
    FILE *f;

    if (p->out != NULL) {
        if ((f = kv_open(st, "req")) != NULL) {
            fprintf(f, "uid,rank,phase,hot,arrive,prompt,output,generated,ttft,tpot,e2e,"
                       "preemptions,recomputed,done,done_phase\n");
            for (size_t i = 0; i < nrq; i++) {
                const kv_req_t *r = &rq[i];
                if (r->state == KV_REQ_FUTURE) {
                    continue;
                }
                double ttft = r->gen ? r->t_first - r->arrive : t_end - r->arrive;
                double tpot = (r->state == KV_REQ_DONE && r->output > 1)
                                  ? (r->t_done - r->t_first) / (r->output - 1) : NAN;
                double e2e  = (r->state == KV_REQ_DONE) ? r->t_done - r->arrive
                                                         : t_end - r->arrive;
                fprintf(f, "%u,%d,%d,%d,%.6f,%u,%u,%u,%.6f,%.6f,%.6f,%u,%u,%d,%d\n", r->uid,
                        st->rank, r->phase, kv_load_is_hot(ld, r->phase, st->rank), r->arrive,
                        r->prompt, r->output, r->gen, ttft, tpot, e2e, r->npreempt,
                        r->recomputed, r->state == KV_REQ_DONE,
                        r->state == KV_REQ_DONE ? kv_load_phase(ld, r->t_done) : -2);
            }
            fclose(f);
        }
        if ((f = kv_open(st, "steps")) != NULL) {
            fprintf(f, "t,prefill,batch,tokens,kv_tokens,dt_ms,ema_us,borrowed_frac\n");
            for (size_t i = 0; i < st->nsteps; i++) {
                const kv_step_rec_t *s = &st->steps[i];
                fprintf(f, "%.6f,%d,%u,%u,%llu,%.4f,%.1f,%.4f\n", s->t, s->prefill, s->batch,
                        s->ntok, (unsigned long long)s->kv, s->dt * 1e3, s->ema_us, s->bf);
            }
            fclose(f);
        }
        if ((f = kv_open(st, "timeline")) != NULL) {
            fprintf(f, "t,phase,hot,offered_rps,size,local,borrowed,used,lent,running,waiting\n");
            for (size_t i = 0; i < st->nsamples; i++) {
                const kv_sample_t *s = &st->samples[i];
                int k = kv_load_phase(ld, s->t);
                fprintf(f, "%.4f,%d,%d,%.3f,%zu,%zu,%zu,%zu,%zu,%zu,%zu\n", s->t, k,
                        kv_load_is_hot(ld, k, st->rank), kv_load_rate(ld, k, st->rank),
                        s->size, s->local, s->borrowed, s->used, s->lent, s->running,
                        s->waiting);
            }
            fclose(f);
        }
        if ((f = kv_open(st, "events")) != NULL) {
            fprintf(f, "t,event,bytes,us\n");
            for (size_t i = 0; i < st->nevents; i++) {
                const kv_event_t *e = &st->events[i];
                fprintf(f, "%.6f,%s,%.0f,%.1f\n", e->t, e->what, e->bytes, e->us);
            }
            fclose(f);
        }
    }

    FILE *sf = (p->out != NULL) ? kv_open(st, "summary") : NULL;
    if (sf != NULL) {
        fputs(KV_SUMMARY_HEADER, sf);
    }
    double *v = malloc((nrq + st->nevents + 1) * sizeof(double));
    double *w = malloc((nrq + st->nevents + 1) * sizeof(double));
    for (int cl = 0; cl < KV_NCL; cl++) {
        int nph = 0;
        double offered = 0, tokens = 0;
        for (int k = 0; k < ld->nphases; k++) {
            if (kv_class(ld, k, st->rank, cl)) {
                nph++;
                offered += kv_load_rate(ld, k, st->rank);
                tokens  += st->tokens[k + 1];
            }
        }
        if (nph == 0) {
            continue;
        }
        double dur = nph * ld->phase_s;
        size_t arrived = 0, completed = 0, unfinished = 0, good = 0, nv = 0, nw = 0;
        double preempt = 0, recomp = 0;
        for (size_t i = 0; i < nrq; i++) {
            const kv_req_t *r = &rq[i];
            if (r->state == KV_REQ_DONE && kv_class(ld, kv_load_phase(ld, r->t_done), st->rank, cl)) {
                completed++;
            }
            if (!kv_req_in(ld, r, st->rank, cl)) {
                continue;
            }
            arrived++;
            preempt += r->npreempt;
            recomp  += r->recomputed;
            if (r->state != KV_REQ_DONE) {
                unfinished++;
                continue;
            }
            double ttft = r->t_first - r->arrive;
            double tpot = r->output > 1 ? (r->t_done - r->t_first) / (r->output - 1) : 0;
            good += (ttft <= p->slo_ttft_s && tpot <= p->slo_tpot_s);
        }
        double q[6];
        /* ttft, tpot, e2e: p50, p99 */
        for (int m = 0; m < 3; m++) {
            nv = 0;
            for (size_t i = 0; i < nrq; i++) {
                const kv_req_t *r = &rq[i];
                if (r->state == KV_REQ_FUTURE || !kv_req_in(ld, r, st->rank, cl)) {
                    continue;
                }
                int done = r->state == KV_REQ_DONE;
                if (m == 0) {
                    v[nv++] = r->gen ? r->t_first - r->arrive : t_end - r->arrive;
                } else if (m == 1) {
                    if (done && r->output > 1) {
                        v[nv++] = (r->t_done - r->t_first) / (r->output - 1);
                    }
                } else {
                    v[nv++] = done ? r->t_done - r->arrive : t_end - r->arrive;
                }
            }
            q[2 * m]     = kv_quantile(v, nv, 0.50);
            q[2 * m + 1] = kv_quantile(v, nv, 0.99);
        }
        /* events in the class's phases */
        double ev[9] = {0};
        static const char *names[] = {"grow", "grow_fail", "recall", "refusal", "shrink",
                                      "giveback", "recalled", "lender_wait"};
        nw = 0;
        for (size_t i = 0; i < st->nevents; i++) {
            const kv_event_t *e = &st->events[i];
            if (!kv_class(ld, kv_load_phase(ld, e->t), st->rank, cl)) {
                continue;
            }
            for (int k = 0; k < 8; k++) {
                if (strcmp(e->what, names[k]) == 0) {
                    ev[k] += 1;
                }
            }
            if (strcmp(e->what, "lender_wait") == 0) {
                w[nw++] = e->us * 1e-3;
            }
        }
        double lw50 = kv_quantile(w, nw, 0.5), lw99 = kv_quantile(w, nw, 0.99);
        double lwmax = nw ? w[nw - 1] : NAN;
        /* memory over the class's phases */
        double sl = 0, sb = 0, sbm = 0, slent = 0, su = 0;
        size_t ns = 0;
        for (size_t i = 0; i < st->nsamples; i++) {
            const kv_sample_t *s = &st->samples[i];
            if (!kv_class(ld, kv_load_phase(ld, s->t), st->rank, cl)) {
                continue;
            }
            sl += s->local;
            sb += s->borrowed;
            slent += s->lent;
            su += s->used;
            sbm = fmax(sbm, (double)s->borrowed);
            ns++;
        }
        ns = ns ? ns : 1;
        double sdt = 0, sdec = 0, sema = 0, sbf = 0;
        size_t nst = 0, ndec = 0;
        for (size_t i = 0; i < st->nsteps; i++) {
            const kv_step_rec_t *s = &st->steps[i];
            if (!kv_class(ld, kv_load_phase(ld, s->t), st->rank, cl)) {
                continue;
            }
            sdt += s->dt;
            sema += s->ema_us;
            sbf += s->bf;
            nst++;
            if (!s->prefill) {
                sdec += s->dt;
                ndec++;
            }
        }
        const double mib = 1048576.0;
        char row[2048];
        snprintf(row, sizeof(row),
                 "%s,%s,%llu,%d,%s,%d,%.3f,%zu,%zu,%zu,%.2f,%.3f,%.3f,%.4f,%.4f,%.5f,%.5f,%.4f,"
                 "%.4f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%zu,%.3f,%.3f,%.3f,%.2f,%.2f,"
                 "%.2f,%.2f,%.2f,%zu,%.3f,%.3f,%.3f,%.4f,%llu,%.1f\n",
                 kv_scn_name[p->scn], kv_cfg_name[p->cfg], (unsigned long long)p->seed, st->rank,
                 kv_cl_name[cl], nph, offered / nph, arrived, completed, unfinished,
                 tokens / dur, completed / dur, good / dur, q[0], q[1], q[2], q[3], q[4], q[5],
                 preempt, recomp, ev[0], ev[1], ev[2], ev[3], ev[4], ev[5], ev[6], nw, lw50,
                 lw99, lwmax, sl / ns / mib, sb / ns / mib, sbm / mib, slent / ns / mib,
                 su / ns / mib, nst, nst ? sdt / nst * 1e3 : 0, ndec ? sdec / ndec * 1e3 : 0,
                 sema * 1e-3 / dur, nst ? sbf / nst : 0, (unsigned long long)corrupt, wall_s);
        if (sf != NULL) {
            fputs(row, sf);
        }
        if (!p->quiet && p->out == NULL) {
            printf("%s", row);
        }
    }
    free(v);
    free(w);
    if (sf != NULL) {
        fclose(sf);
    }
    return 0;
}
