/*
 * vmm_costs: what a migration of the cuda kind costs the CUDA driver, call
 * by call, against a plain copy of the same bytes.  It needs no EMA and no
 * second rank: one process, the driver API, memory of the GPU only.
 *
 *   bench/vmm_costs [--total BYTES] [--reps N] [--seg BYTES[,BYTES...]]
 *
 * For each segment size S it creates total/S segments twice (the "old" and
 * the "new" memory of a migration), maps the old ones at a window range W
 * and an alias V, and the new ones at an alias D, then times (CPU clock for
 * driver calls, CUDA events for copies; medians of --reps):
 *   copy       cuMemcpyAsync of the total, W to D (the reference);
 *   unmap/map/access  cuMemUnmap, cuMemMap, cuMemSetAccess of one segment
 *              of W, GPU idle, and unmap again while a copy of the total
 *              runs on another stream (does the unmap wait for it?);
 *   run        one cuMemUnmap over all of W, a cuMemMap per segment, one
 *              cuMemSetAccess over all of W;
 *   import     cuMemExportToShareableHandle + cuMemImportFromShareableHandle
 *              of one segment (what mapping a peer's segment adds);
 *   serial     the copy, then every segment's remap (W to the new memory);
 *   pipelined  a copy and an event per segment; each segment remapped as
 *              its event completes (EMA's migration before 2026-12-03);
 *   handover   the time at which every copy has completed when the remaps
 *              wait for it: what a lender waits for when the give-back goes
 *              before the remaps;
 *   alias      the copies read V, so W is remapped (one run) while they run;
 *              done when both are.
 * Each row prints its time and copy/time, the figure DESIGN's migration
 * goal is stated in (>= 0.9).  Every migrated byte is verified afterwards
 * through W (the pattern is written through W before each repetition).
 */
#include <cuda.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define CK(call)                                                                           \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS) {                                                          \
            const char *s_ = NULL;                                                         \
            cuGetErrorName(r_, &s_);                                                       \
            fprintf(stderr, "vmm_costs: %s failed: %s (line %d)\n", #call, s_ ? s_ : "?",  \
                    __LINE__);                                                             \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double median(std::vector<double> v)
{
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

/* pattern: word i of the window holds i ^ salt */
__global__ void fill_k(uint64_t *p, size_t n, uint64_t salt)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        p[i] = i ^ salt;
    }
}

__global__ void check_k(const uint64_t *p, size_t n, uint64_t salt, unsigned long long *bad)
{
    unsigned long long b = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        b += (p[i] != (i ^ salt));
    }
    if (b) {
        atomicAdd(bad, b);
    }
}

struct ctx_t {
    CUdevice dev;
    CUstream s, s2;
    CUmemAccessDesc acc;
    CUmemAllocationProp prop;
    size_t total, seg;
    int n;
    std::vector<CUmemGenericAllocationHandle> oldh, newh;
    CUdeviceptr W, V, D, X, Y;
    unsigned long long *bad;
};

/* One cuMemUnmap over a run of mappings; should the driver refuse one
 * that spans several, one per segment (EMA's cuda_unmap does the same). */
static int unmap_run_split; /* the driver refused a run: counted */
static void unmap_run(ctx_t *c, CUdeviceptr at, size_t len)
{
    if (cuMemUnmap(at, len) == CUDA_SUCCESS) {
        return;
    }
    unmap_run_split++;
    for (size_t o = 0; o < len; o += c->seg) {
        CK(cuMemUnmap(at + o, c->seg));
    }
}

static void map1(ctx_t *c, CUdeviceptr at, CUmemGenericAllocationHandle h)
{
    CK(cuMemMap(at, c->seg, 0, h, 0));
    CK(cuMemSetAccess(at, c->seg, &c->acc, 1));
}

/* W back to the old memory, the pattern written through it */
static void reset(ctx_t *c, uint64_t salt)
{
    CK(cuCtxSynchronize());
    unmap_run(c, c->W, c->total);
    for (int i = 0; i < c->n; i++) {
        CK(cuMemMap(c->W + (size_t)i * c->seg, c->seg, 0, c->oldh[i], 0));
    }
    CK(cuMemSetAccess(c->W, c->total, &c->acc, 1));
    fill_k<<<1024, 512, 0, c->s>>>((uint64_t *)c->W, c->total / 8, salt);
    CK(cuMemsetD8Async(c->D, 0, c->total, c->s));
    CK(cuStreamSynchronize(c->s));
}

/* W must now map the new memory and hold the pattern */
static unsigned long long verify(ctx_t *c, uint64_t salt, const char *what)
{
    unsigned long long bad = 0;
    CK(cuCtxSynchronize());
    CK(cuMemsetD8((CUdeviceptr)c->bad, 0, sizeof(bad)));
    check_k<<<1024, 512>>>((const uint64_t *)c->W, c->total / 8, salt, c->bad);
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(&bad, (CUdeviceptr)c->bad, sizeof(bad)));
    /* and W maps the new memory: a write through D shows through W */
    uint64_t probe = 0x5a5a5a5a5a5a5a5aull, back = 0;
    CK(cuMemcpyHtoD(c->D + c->total - 8, &probe, 8));
    CK(cuMemcpyDtoH(&back, c->W + c->total - 8, 8));
    if (back != probe) {
        fprintf(stderr, "vmm_costs: %s: the window does not map the new memory\n", what);
        bad++;
    }
    if (bad) {
        fprintf(stderr, "vmm_costs: %s: %llu bad words\n", what, bad);
    }
    return bad;
}

static void remap_seg(ctx_t *c, int i)
{
    CUdeviceptr at = c->W + (size_t)i * c->seg;
    CK(cuMemUnmap(at, c->seg));
    map1(c, at, c->newh[i]);
}

static void remap_all(ctx_t *c)
{
    unmap_run(c, c->W, c->total);
    for (int i = 0; i < c->n; i++) {
        CK(cuMemMap(c->W + (size_t)i * c->seg, c->seg, 0, c->newh[i], 0));
    }
    CK(cuMemSetAccess(c->W, c->total, &c->acc, 1));
}

/* One copy per segment, src to D, each followed by its event in @evs. */
static void queue_seg_copies(ctx_t *c, CUdeviceptr src, std::vector<CUevent> &evs)
{
    for (int i = 0; i < c->n; i++) {
        CK(cuMemcpyAsync(c->D + (size_t)i * c->seg, src + (size_t)i * c->seg, c->seg, c->s));
        CK(cuEventRecord(evs[i], c->s));
    }
}

static double copy_ref(ctx_t *c)
{
    CUevent a, b;
    float ms;
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));
    CK(cuEventRecord(a, c->s));
    CK(cuMemcpyAsync(c->D, c->W, c->total, c->s));
    CK(cuEventRecord(b, c->s));
    CK(cuEventSynchronize(b));
    CK(cuEventElapsedTime(&ms, a, b));
    cuEventDestroy(a);
    cuEventDestroy(b);
    return ms * 1e3;
}

int main(int argc, char **argv)
{
    size_t total = (size_t)1 << 30;
    int reps = 7;
    std::vector<size_t> segs = {(size_t)64 << 20, (size_t)128 << 20, (size_t)256 << 20,
                                (size_t)512 << 20};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--total") && i + 1 < argc) {
            total = parse_size(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--seg") && i + 1 < argc) {
            segs.clear();
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) {
                segs.push_back(parse_size(t));
            }
        } else {
            fprintf(stderr, "usage: %s [--total BYTES] [--reps N] [--seg BYTES[,BYTES...]]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1) {
        reps = 1;
    }

    ctx_t c;
    CUcontext cx;
    CK(cuInit(0));
    CK(cuDeviceGet(&c.dev, 0));
    CK(cuDevicePrimaryCtxRetain(&cx, c.dev));
    CK(cuCtxSetCurrent(cx));
    CK(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&c.s2, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc((CUdeviceptr *)&c.bad, sizeof(unsigned long long)));
    memset(&c.acc, 0, sizeof(c.acc));
    c.acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    c.acc.location.id   = c.dev;
    c.acc.flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    memset(&c.prop, 0, sizeof(c.prop));
    c.prop.type                 = CU_MEM_ALLOCATION_TYPE_PINNED;
    c.prop.location.type        = CU_MEM_LOCATION_TYPE_DEVICE;
    c.prop.location.id          = c.dev;
    c.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    c.total = total;

    char name[128] = "";
    cuDeviceGetName(name, sizeof(name), c.dev);
    int drv = 0;
    cuDriverGetVersion(&drv);
    printf("# vmm_costs: %s, driver %d, total %zu MiB, %d repetitions (medians, us)\n", name,
           drv, total >> 20, reps);
    printf("%-6s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "seg_MiB", "copy",
           "unmap1", "map1", "access1", "unmap_bsy", "run_remap", "import", "serial",
           "pipelined", "handover", "alias", "alias_ratio", "pipe_ratio");

    /* background copy buffers, for the busy unmap */
    CUdeviceptr X, Y;
    CK(cuMemAlloc(&X, total));
    CK(cuMemAlloc(&Y, total));
    unsigned long long bad_total = 0;

    for (size_t seg : segs) {
        size_t gran = 0;
        CK(cuMemGetAllocationGranularity(&gran, &c.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        if (seg % gran || total % seg) {
            fprintf(stderr, "vmm_costs: segment %zu: not a multiple of %zu or of the total\n",
                    seg, gran);
            continue;
        }
        c.seg = seg;
        c.n   = (int)(total / seg);
        c.oldh.resize(c.n);
        c.newh.resize(c.n);
        for (int i = 0; i < c.n; i++) {
            CK(cuMemCreate(&c.oldh[i], seg, &c.prop, 0));
            CK(cuMemCreate(&c.newh[i], seg, &c.prop, 0));
        }
        CK(cuMemAddressReserve(&c.W, total, seg, 0, 0));
        CK(cuMemAddressReserve(&c.V, total, seg, 0, 0));
        CK(cuMemAddressReserve(&c.D, total, seg, 0, 0));
        for (int i = 0; i < c.n; i++) {
            CK(cuMemMap(c.W + (size_t)i * seg, seg, 0, c.oldh[i], 0));
            CK(cuMemMap(c.V + (size_t)i * seg, seg, 0, c.oldh[i], 0));
            CK(cuMemMap(c.D + (size_t)i * seg, seg, 0, c.newh[i], 0));
        }
        CK(cuMemSetAccess(c.W, total, &c.acc, 1));
        CK(cuMemSetAccess(c.V, total, &c.acc, 1));
        CK(cuMemSetAccess(c.D, total, &c.acc, 1));

        std::vector<double> vcopy, vun, vmap, vacc, vbusy, vrun, vimp, vser, vpipe, vhand,
            valias;
        for (int r = 0; r < reps + 1; r++) { /* the first repetition warms up */
            uint64_t salt = 0x9e3779b97f4a7c15ull * (r + 1) + seg;
            double t0, t1, t2, t3;

            reset(&c, salt);
            double cp = copy_ref(&c);

            /* one segment, GPU idle */
            CK(cuCtxSynchronize());
            t0 = now_us();
            CK(cuMemUnmap(c.W, seg));
            t1 = now_us();
            CK(cuMemMap(c.W, seg, 0, c.newh[0], 0));
            t2 = now_us();
            CK(cuMemSetAccess(c.W, seg, &c.acc, 1));
            t3 = now_us();
            double un = t1 - t0, mp = t2 - t1, ac = t3 - t2;

            /* one segment while a copy of the total runs on s2 */
            CUevent ev;
            CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
            CK(cuMemcpyAsync(Y, X, total, c.s2));
            CK(cuEventRecord(ev, c.s2));
            t0 = now_us();
            CK(cuMemUnmap(c.W, seg));
            t1 = now_us();
            int busy_done = (cuEventQuery(ev) == CUDA_SUCCESS);
            CK(cuEventSynchronize(ev));
            cuEventDestroy(ev);
            map1(&c, c.W, c.oldh[0]);
            double bu = t1 - t0;
            if (r == 1 && busy_done) {
                printf("# seg %zu MiB: the background copy had completed when cuMemUnmap "
                       "returned (%.0f us): the unmap waited for it\n", seg >> 20, bu);
            }

            /* the whole window as one run */
            CK(cuCtxSynchronize());
            t0 = now_us();
            remap_all(&c);
            t1 = now_us();
            double rr = t1 - t0;

            /* import of one segment through a file descriptor */
            int fd = -1;
            CUmemGenericAllocationHandle ih;
            t0 = now_us();
            CK(cuMemExportToShareableHandle(&fd, c.newh[0],
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
            CK(cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
            t1 = now_us();
            close(fd);
            cuMemRelease(ih);
            double im = t1 - t0;

            /* serial: copy everything, then remap segment by segment */
            reset(&c, salt);
            t0 = now_us();
            CK(cuMemcpyAsync(c.D, c.W, total, c.s));
            CK(cuStreamSynchronize(c.s));
            for (int i = 0; i < c.n; i++) {
                remap_seg(&c, i);
            }
            t1 = now_us();
            bad_total += verify(&c, salt, "serial");
            double se = t1 - t0;

            /* pipelined: event per segment, remap as each completes;
             * handover: when the last copy completed, seen between remaps */
            reset(&c, salt);
            std::vector<CUevent> evs(c.n);
            for (int i = 0; i < c.n; i++) {
                CK(cuEventCreate(&evs[i], CU_EVENT_DISABLE_TIMING));
            }
            t0 = now_us();
            queue_seg_copies(&c, c.W, evs);
            for (int i = 0; i < c.n; i++) {
                CK(cuEventSynchronize(evs[i]));
                remap_seg(&c, i);
            }
            t1 = now_us();
            bad_total += verify(&c, salt, "pipelined");
            double pi = t1 - t0;

            /* handover first: wait for every copy, then remap */
            reset(&c, salt);
            t0 = now_us();
            queue_seg_copies(&c, c.W, evs);
            CK(cuEventSynchronize(evs[c.n - 1]));
            t1 = now_us();
            remap_all(&c);
            bad_total += verify(&c, salt, "handover");
            double ho = t1 - t0;

            /* alias: the copies read V; W remapped meanwhile */
            reset(&c, salt);
            t0 = now_us();
            for (int i = 0; i < c.n; i++) {
                CK(cuMemcpyAsync(c.D + (size_t)i * seg, c.V + (size_t)i * seg, seg, c.s));
            }
            CK(cuEventRecord(evs[c.n - 1], c.s));
            remap_all(&c);
            CK(cuEventSynchronize(evs[c.n - 1]));
            t1 = now_us();
            bad_total += verify(&c, salt, "alias");
            double al = t1 - t0;
            for (int i = 0; i < c.n; i++) {
                cuEventDestroy(evs[i]);
            }

            if (r == 0) {
                continue;
            }
            vcopy.push_back(cp);
            vun.push_back(un);
            vmap.push_back(mp);
            vacc.push_back(ac);
            vbusy.push_back(bu);
            vrun.push_back(rr);
            vimp.push_back(im);
            vser.push_back(se);
            vpipe.push_back(pi);
            vhand.push_back(ho);
            valias.push_back(al);
        }
        double cp = median(vcopy);
        printf("%-6zu %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.3f "
               "%9.3f\n",
               seg >> 20, cp, median(vun), median(vmap), median(vacc), median(vbusy),
               median(vrun), median(vimp), median(vser), median(vpipe), median(vhand),
               median(valias), cp / median(valias), cp / median(vpipe));
        printf("# seg %zu MiB ranges: copy %.0f-%.0f, pipelined %.0f-%.0f, handover %.0f-%.0f, "
               "alias %.0f-%.0f us\n",
               seg >> 20, *std::min_element(vcopy.begin(), vcopy.end()),
               *std::max_element(vcopy.begin(), vcopy.end()),
               *std::min_element(vpipe.begin(), vpipe.end()),
               *std::max_element(vpipe.begin(), vpipe.end()),
               *std::min_element(vhand.begin(), vhand.end()),
               *std::max_element(vhand.begin(), vhand.end()),
               *std::min_element(valias.begin(), valias.end()),
               *std::max_element(valias.begin(), valias.end()));
        fflush(stdout);

        CK(cuCtxSynchronize());
        unmap_run(&c, c.W, total);
        unmap_run(&c, c.V, total);
        unmap_run(&c, c.D, total);
        CK(cuMemAddressFree(c.W, total));
        CK(cuMemAddressFree(c.V, total));
        CK(cuMemAddressFree(c.D, total));
        for (int i = 0; i < c.n; i++) {
            CK(cuMemRelease(c.oldh[i]));
            CK(cuMemRelease(c.newh[i]));
        }
    }
    printf("# cuMemUnmap over a run of several mappings: %s\n",
           unmap_run_split ? "refused, one call per segment" : "one call");
    printf("# verified: %llu bad words\n", bad_total);
    return bad_total ? 1 : 0;
}
