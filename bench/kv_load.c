/*
 * The offered load: request lengths, the phase schedule and Poisson
 * arrivals.  Everything here depends on the parameters, the seed and the
 * rank only, so every configuration of one seed replays the same requests.
 *
 * Time runs: warm-up [0, W), phases k = 0..n-1 of P seconds each, then the
 * drain (no arrivals).  Scenarios:
 *   rotating    in phase k rank k mod N is hot, the others cold; the
 *               warm-up is cold everywhere;
 *   stationary  rank 0 hot throughout (warm-up included), the others busy
 *               (half loaded by default), the old benchmark's shape;
 *   allbusy     every rank hot throughout: nothing to borrow.
 * A rank's "hot" rate is the one at which its requests need hot_mult times
 * its KV memory C, by Little's law over the step model:
 *   KV needed = rate * t_step / f * E[O*P + O^2/2]
 * (a request of prompt P and output O holds P + i tokens in decode step i;
 * f is the share of time left to decode steps by prefill steps), solved for
 * the rate by a fixed point since t_step grows with the batch.
 */
#include "kv_serving.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

uint64_t kv_rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double kv_urand(uint64_t *s)
{
    return (double)(kv_rnd(s) >> 11) / 9007199254740992.0;
}

double kv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int kv_mkdirs(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            buf[i] = c;
        }
    }
    return 0;
}

static double kv_normal(uint64_t *s)
{
    double u = kv_urand(s), v = kv_urand(s);
    return sqrt(-2.0 * log(1.0 - u)) * cos(2 * M_PI * v);
}

static uint32_t kv_lognormal(uint64_t *s, double median, double sigma, uint32_t lo, uint32_t hi)
{
    double x = median * exp(sigma * kv_normal(s));
    if (x < lo) {
        return lo;
    }
    if (x > hi) {
        return hi;
    }
    return (uint32_t)(x + 0.5);
}

/* (prompt, output) pairs of the lengths file, read once */
static uint32_t (*kv_pairs)[2];
static size_t kv_npairs;

static int kv_pairs_read(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[256];
    size_t cap = 0;

    if (f == NULL) {
        fprintf(stderr, "kv_serving: cannot open the lengths file %s\n", path);
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long pr, ou;
        char *s = line;
        while (*s == ' ' || *s == '\t') {
            s++;
        }
        if (*s == '#' || *s == '\n' || *s == '\0') {
            continue;
        }
        for (char *c = s; *c; c++) {
            if (*c == ',') {
                *c = ' '; /* CSV too */
            }
        }
        if (sscanf(s, "%lu %lu", &pr, &ou) != 2 || pr == 0 || ou == 0) {
            continue; /* a header line, or a pair with nothing to serve */
        }
        if (kv_npairs == cap) {
            cap = cap ? 2 * cap : 1024;
            kv_pairs = realloc(kv_pairs, cap * sizeof(*kv_pairs));
        }
        kv_pairs[kv_npairs][0] = (uint32_t)pr;
        kv_pairs[kv_npairs][1] = (uint32_t)ou;
        kv_npairs++;
    }
    fclose(f);
    if (kv_npairs == 0) {
        fprintf(stderr, "kv_serving: no (prompt, output) pairs in %s\n", path);
        return -1;
    }
    return 0;
}

static void kv_draw(const kv_params_t *p, uint64_t *s, uint32_t *prompt, uint32_t *output)
{
    if (kv_npairs > 0) {
        size_t i = kv_rnd(s) % kv_npairs;
        *prompt  = kv_pairs[i][0];
        *output  = kv_pairs[i][1];
    } else {
        *prompt = kv_lognormal(s, p->p_median, p->p_sigma, p->p_min, p->p_max);
        *output = kv_lognormal(s, p->o_median, p->o_sigma, p->o_min, p->o_max);
    }
}

double kv_model_step(const kv_params_t *p, int prefill, uint32_t ntok, uint64_t kv_tokens)
{
    double us = p->m_base_ms * 1e3 + (double)kv_tokens * p->m_kv_us;
    us += (double)ntok * (prefill ? p->m_pf_us : p->m_dec_us);
    return us * 1e-6;
}

/* The rate at which one rank's requests need @mult * C of KV memory. */
static double kv_rate_for(const kv_params_t *p, const kv_load_t *ld, double mult)
{
    double kv = mult * ld->c_tokens, rate = 1;
    for (int it = 0; it < 50; it++) {
        /* decode batch by Little's law: rate * (O steps of t_step) */
        double t_step = kv_model_step(p, 0, 0, (uint64_t)kv);
        double batch  = rate * ld->mean_o * t_step;
        t_step = kv_model_step(p, 0, (uint32_t)batch, (uint64_t)kv);
        /* prefill steps: about one per max_prefill_tokens of prompts */
        double pf_steps = rate * ld->mean_p / (double)p->max_prefill_tokens + rate * 0.25;
        double pf_time  = pf_steps * p->m_base_ms * 1e-3 + rate * ld->mean_p * p->m_pf_us * 1e-6;
        double f = 1.0 - pf_time;
        if (f < 0.2) {
            f = 0.2;
        }
        double next = kv * f / (t_step * ld->mem_time);
        rate = 0.5 * rate + 0.5 * next;
    }
    return rate;
}

int kv_load_init(kv_load_t *ld, const kv_params_t *p, int nranks, double c_tokens)
{
    memset(ld, 0, sizeof(*ld));
    if (p->lengths_file != NULL && kv_npairs == 0 && kv_pairs_read(p->lengths_file) != 0) {
        return -1;
    }
    ld->nranks   = nranks;
    ld->nphases  = p->nphases > 0 ? p->nphases : nranks;
    ld->warmup_s = p->warmup_s;
    ld->phase_s  = p->phase_s;
    ld->end_s    = p->warmup_s + p->phase_s * ld->nphases;
    ld->c_tokens = c_tokens;
    /* the moments of the length distribution, from a fixed sample */
    uint64_t s = 0x5eed5eedull;
    double sp = 0, so = 0, sm = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        uint32_t pr, ou;
        kv_draw(p, &s, &pr, &ou);
        sp += pr;
        so += ou;
        sm += (double)ou * pr + 0.5 * (double)ou * ou;
    }
    ld->mean_p    = sp / n;
    ld->mean_o    = so / n;
    ld->mem_time  = sm / n;
    ld->rate_hot  = kv_rate_for(p, ld, p->hot_mult);
    ld->rate_cold = kv_rate_for(p, ld, p->cold_mult);
    ld->rate_busy = kv_rate_for(p, ld, p->busy_mult);
    ld->rate = calloc((size_t)(ld->nphases + 1) * nranks, sizeof(double));
    for (int k = -1; k < ld->nphases; k++) {
        for (int r = 0; r < nranks; r++) {
            double v = ld->rate_cold;
            switch (p->scn) {
            case KV_SCN_ROTATING:
                v = (k >= 0 && r == k % nranks) ? ld->rate_hot : ld->rate_cold;
                break;
            case KV_SCN_STATIONARY:
                v = (r == 0) ? ld->rate_hot : ld->rate_busy;
                break;
            case KV_SCN_ALLBUSY:
                v = ld->rate_hot;
                break;
            default:
                break;
            }
            ld->rate[(size_t)(k + 1) * nranks + r] = v;
        }
    }
    return 0;
}

void kv_load_free(kv_load_t *ld)
{
    free(ld->rate);
    ld->rate = NULL;
}

int kv_load_phase(const kv_load_t *ld, double t)
{
    if (t < ld->warmup_s) {
        return -1;
    }
    int k = (int)((t - ld->warmup_s) / ld->phase_s);
    return k < ld->nphases ? k : ld->nphases;
}

double kv_load_rate(const kv_load_t *ld, int phase, int rank)
{
    if (phase >= ld->nphases) {
        return 0;
    }
    return ld->rate[(size_t)(phase + 1) * ld->nranks + rank];
}

int kv_load_is_hot(const kv_load_t *ld, int phase, int rank)
{
    return phase >= 0 && phase < ld->nphases &&
           kv_load_rate(ld, phase, rank) >= ld->rate_hot * 0.999;
}

kv_req_t *kv_load_arrivals(const kv_load_t *ld, const kv_params_t *p, int rank, size_t *n_p)
{
    uint64_t sa = p->seed * 0x100000001b3ull + (uint64_t)rank * 7919 + 1;
    uint64_t sl = p->seed * 0x9e3779b97f4a7c15ull + (uint64_t)rank * 104729 + 2;
    size_t n = 0, cap = 1024;
    kv_req_t *rq = calloc(cap, sizeof(*rq));

    /* one Poisson process per phase: memoryless, so restarting at each
     * boundary gives the piecewise-constant rate exactly */
    for (int k = -1; k < ld->nphases; k++) {
        double a = (k < 0) ? 0 : ld->warmup_s + k * ld->phase_s;
        double b = (k < 0) ? ld->warmup_s : a + ld->phase_s;
        double rate = kv_load_rate(ld, k, rank);
        if (rate <= 0) {
            continue;
        }
        for (double t = a;;) {
            t += -log(1.0 - kv_urand(&sa)) / rate;
            if (t >= b) {
                break;
            }
            if (n == cap) {
                cap *= 2;
                rq = realloc(rq, cap * sizeof(*rq));
                memset(rq + n, 0, (cap - n) * sizeof(*rq));
            }
            kv_req_t *r = &rq[n];
            r->uid    = ((uint32_t)rank << 24) | (uint32_t)n;
            r->arrive = t;
            r->phase  = k;
            kv_draw(p, &sl, &r->prompt, &r->output);
            r->state  = KV_REQ_FUTURE;
            n++;
        }
    }
    *n_p = n;
    return rq;
}
