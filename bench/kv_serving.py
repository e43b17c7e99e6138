#!/usr/bin/env python3
"""Run bench/kv_serving over configurations, scenarios and seeds; tabulate.

    bench/kv_serving.py OUT [--kind host|cuda] [--seeds 5] [--np 4] ...

Each (scenario, configuration, seed) is one mpirun, since each configuration
needs its own EMA_* settings:

    static   EMA_DEVICE_MEMORY=C,  the window fixed at C, lends nothing
    elastic  EMA_DEVICE_MEMORY=C,  the window grows by borrowing, lends
    double   EMA_DEVICE_MEMORY=2C, the window fixed at 2C
    oracle   EMA_DEVICE_MEMORY=3C, a pool of N*C blocks shared through
             memory outside EMA, handed over at no cost

All with EMA_SPILL=none.  The runs go in a random order (fixed by
--order-seed).  Every run writes its CSV files under OUT/runs/...; then this
script writes OUT/summary.csv (every run's per-rank rows), OUT/results.md
(the tables) and OUT/results.json, and draws the plots into OUT/plots
(bench/kv_plots.py, when matplotlib is there).  A run whose summary files
exist is not run again (--force to redo).  Standard library only.
"""
import argparse
import csv
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = ["static", "elastic", "double", "oracle"]
SCENARIOS = ["rotating", "stationary", "allbusy"]

# The presets: what a run of each kind looks like.  cuda: 4 ranks share one
# GPU, each limited to C of KV memory; short requests so that phases of a
# few seconds reach their steady state (see doc/kv_serving.md).
PRESETS = {
    "host": dict(kv_mem="1M", seg="64K", tok_bytes=64, args=[]),
    # cuda: decode-heavy requests (prompts of 128, outputs of 256 tokens at
    # the median), so that K/V memory, not prefill, bounds a hot rank; phases
    # of 6 s, about two request lifetimes.  The first H200 run, with 1.5 s
    # phases and 48-token outputs, was prefill-bound (doc/kv_serving.md).
    # C = 256 MiB in 8 segments of 32 MiB: a step streams 8 GB of weights
    # (8.8 ms on an H200 shared by 4 ranks), and the K/V it reads must cost
    # little beside that, or more memory buys slower steps instead of more
    # requests.  At C = 1 GiB (the preset until session 17) a hot rank at
    # 1.8 C stepped 15% slower than at C, and even double memory gained only
    # 1.44x static; at 256 MiB the host model gives double 1.53x.
    "cuda": dict(kv_mem="256M", seg="32M", tok_bytes=131072,
                 args=["--phase", "6", "--warmup", "2", "--drain", "3",
                       "--prompt", "128,0.6,16,512", "--output", "256,0.6,32,768",
                       "--weights-gb", "8"]),
}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().rstrip("B")
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def fmt_size(n):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % m == 0:
            return "%d%s" % (n // m, unit)
    return str(n)


def find_binary(build):
    for cand in ([os.path.join(build, "bench", "kv_serving")] if build else []) + [
            os.path.join(HERE, "..", "build", "bench", "kv_serving"),
            os.path.join(HERE, "kv_serving")]:
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    sys.exit("kv_serving.py: bench/kv_serving not found; build it, or give --build DIR")


def run_env(a, cfg):
    c = parse_size(a.kv_mem)
    mem = {"static": c, "elastic": c, "double": 2 * c,
           "oracle": int(a.oracle_mult * c)}[cfg]
    env = {
        "EMA_MEMORY_KIND": a.kind,
        "EMA_DEVICE_MEMORY": fmt_size(mem),
        "EMA_SPILL": "none",
        # elastic lends all but --lend-reserve; the others lend nothing
        "EMA_LEND_RESERVE": a.lend_reserve if cfg == "elastic" else fmt_size(mem),
    }
    if a.seg:
        env["EMA_SEGMENT_SIZE"] = a.seg
    if a.kind == "cuda":
        env["EMA_GPU_MAP"] = ",".join(["0"] * a.np) if a.gpu_map is None else a.gpu_map
        env["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] = "y"
    return env


def mpirun_cmd(a, env, argv):
    cmd = a.mpirun.split() + ["--oversubscribe", "--timeout", str(a.timeout)]
    for k in sorted(env):
        cmd += ["-x", k]
    for k in sorted(os.environ):
        if (k.startswith("UCX_") or k == "LD_LIBRARY_PATH") and k not in env:
            cmd += ["-x", k]
    return cmd + ["-n", str(a.np)] + argv


def launch(a, cmd, env, log):
    full = dict(os.environ)
    full.update(env)
    if os.geteuid() == 0:
        full.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        full.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    t0 = time.time()
    with open(log, "w") as f:
        f.write("# " + " ".join("%s=%s" % kv for kv in sorted(env.items())) + "\n# " +
                " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, env=full, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.time() - t0


def calibrate(a, binary):
    """cuda: time the kernels on this machine; returns the --model value."""
    path = os.path.join(a.out, "calibration.txt")
    if os.path.exists(path) and not a.force:
        return open(path).read().strip()
    env = run_env(a, "static")
    argv = [binary, "--calibrate", "--kv-mem", a.kv_mem, "--tok-bytes", str(a.tok_bytes),
            "--out", a.out] + a.preset_args + a.extra
    rc, dt = launch(a, mpirun_cmd(a, env, argv), env, os.path.join(a.out, "calibration.log"))
    if rc != 0 or not os.path.exists(path):
        sys.exit("kv_serving.py: calibration failed, see %s/calibration.log" % a.out)
    model = open(path).read().strip()
    print("calibration (%.0f s): --model %s" % (dt, model), flush=True)
    return model


HOT = 1.8   # kv_serving's default hot demand, in C


def demand_of(a, d):
    """The hot ranks' KV in use during their hot phases, in C, from one run's
    timelines: the mean over the samples of each hot phase's last 3/4 (the
    first quarter is the ramp)."""
    c = parse_size(a.kv_mem)
    used = []
    for path in glob.glob(os.path.join(d, "timeline_r*.csv")):
        rows = list(csv.DictReader(open(path)))
        phases = {}
        for r in rows:
            if r["hot"] == "1":
                phases.setdefault(r["phase"], []).append(r)
        for ph in phases.values():
            used += [num(r["used"]) for r in ph[len(ph) // 4:]]
    return statistics.mean(used) / c if used else float("nan")


def calibrate_demand(a, binary, model):
    """cuda: scale the offered load until the hot ranks' measured KV demand is
    HOT x C.  The rates come from the step model (kv_load.c, by Little's law),
    but on a GPU shared by 4 ranks a step's real time depends on what the
    other ranks run at the same moment, which the model fits only on average;
    a demand that ends up below C would test nothing.  So: pilot runs of the
    oracle (memory never limits it) on seed 1 of the rotating load, measure
    the hot ranks' KV in use, scale the hot demand by HOT / measured, at
    most 4 times.  Returns the scale."""
    path = os.path.join(a.out, "load_scale.txt")
    if os.path.exists(path) and not a.force:
        return float(open(path).read().split()[0])
    scale, log = 1.0, []
    for it in range(4):
        d = os.path.join(a.out, "pilot", "p%d" % it)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        env = run_env(a, "oracle")
        argv = [binary, "--config", "oracle", "--scenario", "rotating", "--seed", "1",
                "--kv-mem", a.kv_mem, "--tok-bytes", str(a.tok_bytes), "--out", d, "--quiet",
                "--oracle-mult", str(a.oracle_mult)] + a.preset_args + demand_args(scale)
        if model:
            argv += ["--model", model]
        argv += a.extra
        rc, dt = launch(a, mpirun_cmd(a, env, argv), env, os.path.join(d, "run.log"))
        got = demand_of(a, d) if rc == 0 else float("nan")
        log.append("pilot %d: scale %.3f: hot demand %.2f C (%.0f s, rc %d)" % (it, scale, got, dt, rc))
        print(log[-1], flush=True)
        if not got > 0:
            break
        if abs(got - HOT) <= 0.1 * HOT:
            break
        new = min(4.0, max(0.25, scale * HOT / got))
        if new == scale:
            break  # at a bound already: another pilot would measure the same
        scale = new
    with open(path, "w") as f:
        f.write("%.4f\n" % scale)
        f.write("\n".join(log) + "\n")
    return scale


def demand_args(scale, hot=None):
    """Only the hot demand is scaled: the cold ranks must stay cold, or there
    is nothing to lend (a first H200 run that scaled every demand by 4 left
    every rank at about 1 C)."""
    return ["--hot", "%.4g" % ((HOT if hot is None else hot) * scale)]


def plan(a):
    runs = []
    for scn in a.scenarios:
        cfgs = a.configs if scn != "allbusy" else [c for c in a.configs
                                                   if c in ("static", "elastic")]
        seeds = a.seeds if scn == "rotating" else a.other_seeds
        for cfg in cfgs:
            for seed in range(1, seeds + 1):
                runs.append((scn, cfg, seed, None))
    for hot in a.sweep:
        for cfg in a.configs:
            for seed in range(1, a.sweep_seeds + 1):
                runs.append(("rotating", cfg, seed, hot))
    random.Random(a.order_seed).shuffle(runs)
    return runs


def run_dir(a, scn, cfg, seed, hot):
    if hot is None:
        return os.path.join(a.out, "runs", scn, cfg, "s%d" % seed)
    return os.path.join(a.out, "runs", "sweep", "hot%g" % hot, cfg, "s%d" % seed)


def run_all(a, binary, model):
    done = lambda r: (not a.force and
                      len(glob.glob(os.path.join(run_dir(a, *r), "summary_r*.csv"))) == a.np)
    runs = [r for r in plan(a) if not done(r)]  # what is on disk stays
    t_start = time.time()
    failed = []
    longest = 0.0
    for i, (scn, cfg, seed, hot) in enumerate(runs):
        d = run_dir(a, scn, cfg, seed, hot)
        # --deadline: start a run only if one as long as the longest so far
        # ends in time; a run cut off would be lost, and rerunning the same
        # command goes on from the runs on disk.
        if a.deadline and time.time() - a.t0 + longest > a.deadline:
            a.left = len(runs) - i
            print("deadline (%g s): %d of %d runs left; the same command goes on from here"
                  % (a.deadline, a.left, len(runs)), flush=True)
            break
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        env = run_env(a, cfg)
        argv = [binary, "--config", cfg, "--scenario", scn, "--seed", str(seed),
                "--kv-mem", a.kv_mem, "--tok-bytes", str(a.tok_bytes), "--out", d, "--quiet",
                "--oracle-mult", str(a.oracle_mult)] + a.preset_args
        if model:
            argv += ["--model", model]
        if a.slo:
            argv += ["--slo", a.slo]
        if a.load_scale != 1.0 or hot is not None:
            argv += demand_args(a.load_scale, hot)
        argv += a.extra
        rc, dt = launch(a, mpirun_cmd(a, env, argv), env, os.path.join(d, "run.log"))
        longest = max(longest, dt)
        tag = "%s %s seed %d%s" % (scn, cfg, seed, "" if hot is None else " hot %g" % hot)
        print("[%d/%d] %-34s %5.1f s%s" % (i + 1, len(runs), tag, dt,
                                           "" if rc == 0 else "  FAILED (rc %d, %s/run.log)"
                                           % (rc, d)), flush=True)
        if rc != 0:
            failed.append(tag)
    print("runs: %.0f s" % (time.time() - t_start), flush=True)
    return failed


# --- aggregation -------------------------------------------------------------

def num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def quantile(v, q):
    v = sorted(x for x in v if x == x)
    if not v:
        return float("nan")
    x = q * (len(v) - 1)
    i = int(x)
    return v[i] + (x - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def load_run(d):
    """The rows of one run's summaries, and its requests classified."""
    summ = []
    for p in sorted(glob.glob(os.path.join(d, "summary_r*.csv"))):
        summ += read_csv(p)
    reqs = []
    for p in sorted(glob.glob(os.path.join(d, "req_r*.csv"))):
        reqs += [r for r in classify(read_csv(p)) if r["class"] != "warmup"]
    return summ, reqs


def classify(rows):
    """A rank's requests by the class of their arrival phase (as kv_stats.c):
    hot, after (the phase after a hot one), cold; "cold" only if the request
    also finished in a cold phase, else "cold-out"."""
    hot = {int(r["phase"]) for r in rows if r["hot"] == "1"}
    last = max([int(r["phase"]) for r in rows] + [0])

    def cls(k):
        if k < 0:
            return "warmup"
        if k in hot:
            return "hot"
        if k - 1 in hot:
            return "after"
        if k > last:
            return "drain"
        return "cold"

    for r in rows:
        c = cls(int(r["phase"]))
        if c == "cold" and r["done"] == "1" and cls(int(r.get("done_phase", r["phase"]))) != "cold":
            c = "cold-out"
        r["class"] = c
    return rows


def collect(a):
    """{(scn, cfg, hot): {seed: {...}}} from the runs on disk."""
    out = {}
    for scn_dir in glob.glob(os.path.join(a.out, "runs", "*")):
        scn = os.path.basename(scn_dir)
        dirs = []
        if scn == "sweep":
            for hd in glob.glob(os.path.join(scn_dir, "hot*")):
                hot = float(os.path.basename(hd)[3:])
                dirs += [("rotating", hot, d) for d in glob.glob(os.path.join(hd, "*", "s*"))]
        else:
            dirs += [(scn, None, d) for d in glob.glob(os.path.join(scn_dir, "*", "s*"))]
        for s, hot, d in dirs:
            cfg = os.path.basename(os.path.dirname(d))
            seed = int(os.path.basename(d)[1:])
            summ, reqs = load_run(d)
            if not summ:
                continue
            out.setdefault((s, cfg, hot), {})[seed] = dict(summ=summ, reqs=reqs, dir=d)
    return out


def run_metrics(run, scn):
    """One run's headline figures."""
    summ = run["summ"]
    hot_rows = [r for r in summ if r["class"] == "hot"]
    cold_rows = [r for r in summ if r["class"] == "cold"]
    all_rows = [r for r in summ if r["class"] == "all"]
    m = {}
    mean = lambda rows, k: statistics.mean(num(r[k]) for r in rows) if rows else float("nan")
    total = lambda rows, k: sum(num(r[k]) for r in rows) if rows else float("nan")
    m["hot_tps"] = mean(hot_rows, "tokens_s")          # per hot rank
    m["hot_rps"] = mean(hot_rows, "req_s")
    m["hot_goodput"] = mean(hot_rows, "goodput_rps")
    m["all_tps"] = total(all_rows, "tokens_s")          # the whole node
    m["cold_tps"] = mean(cold_rows, "tokens_s")
    for cl in ("hot", "cold", "after"):
        rq = [r for r in run["reqs"] if r["class"] == cl]
        m[cl + "_n"] = len(rq)
        for met in ("ttft", "tpot", "e2e"):
            v = [num(r[met]) for r in rq]
            m["%s_%s_p50" % (cl, met)] = quantile(v, 0.5)
            m["%s_%s_p99" % (cl, met)] = quantile(v, 0.99)
    for k in ("preemptions", "recomputed_tokens", "grows", "grow_fails", "recalls", "refusals",
              "givebacks"):
        m[k] = total(all_rows, k)
    waits, m["recalled"] = [], 0
    for p in glob.glob(os.path.join(run["dir"], "events_r*.csv")):
        ev = read_csv(p)
        waits += [num(e["us"]) / 1e3 for e in ev
                  if e["event"] == "lender_wait" and num(e["us"]) > 0]
        m["recalled"] += sum(1 for e in ev if e["event"] == "recalled")
    m["lender_waits"] = len(waits)  # the whole run, as the quantiles
    m["lender_wait_p50_ms"] = quantile(waits, 0.5)
    m["lender_wait_p99_ms"] = quantile(waits, 0.99)
    m["lender_wait_max_ms"] = max(waits) if waits else float("nan")
    m["ema_ms_per_s"] = mean(all_rows, "ema_ms_per_s")
    m["borrowed_max_mib"] = max((num(r["borrowed_max_mib"]) for r in all_rows), default=0)
    m["corrupt"] = max((num(r["corrupt"]) for r in all_rows), default=float("nan"))
    m["wall_s"] = max((num(r["wall_s"]) for r in all_rows), default=float("nan"))
    return m


def med_range(v):
    v = [x for x in v if x == x]
    if not v:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(v), min(v), max(v)


def fmt(x, nd=1):
    if x != x:
        return "-"
    if abs(x) >= 1000:
        return "%.0f" % x
    return ("%%.%df" % nd) % x


def fmt_mr(v, nd=1):
    m, lo, hi = med_range(v)
    if m != m:
        return "-"
    if len([x for x in v if x == x]) == 1:
        return fmt(m, nd)
    return "%s [%s–%s]" % (fmt(m, nd), fmt(lo, nd), fmt(hi, nd))


def ratios(data, scn, num_cfg, den_cfg, key, hot=None):
    a = data.get((scn, num_cfg, hot), {})
    b = data.get((scn, den_cfg, hot), {})
    out = []
    for seed in sorted(set(a) & set(b)):
        x, y = a[seed]["m"][key], b[seed]["m"][key]
        if y and y == y and x == x:
            out.append(x / y)
    return out


def run_setting(data, opt, default):
    """The value of kv_serving's option @opt in a run's command line (the
    second line of its run.log), else @default."""
    for runs in data.values():
        for run in runs.values():
            try:
                with open(os.path.join(run["dir"], "run.log")) as f:
                    f.readline()
                    argv = f.readline().split()
            except OSError:
                continue
            if opt in argv[:-1]:
                # the last one: the binary takes the last (the driver's, then
                # any given after "--")
                return argv[len(argv) - 1 - argv[::-1].index(opt) + 1]
    return default


def seed_list(seeds):
    """1-5, or 1,3-4."""
    out, i = [], 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        out.append("%d" % seeds[i] if i == j else "%d-%d" % (seeds[i], seeds[j]))
        i = j + 1
    return ",".join(out) or "none"


def tabulate(a, data):
    for runs in data.values():
        for seed, run in runs.items():
            run["m"] = run_metrics(run, None)
    lines = []
    title = "host kind, %s" % a.kind_note if a.kind == "host" else "cuda kind"
    lines.append("# kv_serving results (%s)\n" % title)
    # what the runs on disk were, not this command line (--no-run, or a
    # directory that holds more seeds than asked for now)
    # per scenario (rotating has --seeds, the others --other-seeds), and
    # the sweep's loads apart
    seeds = []
    for scn in SCENARIOS:
        sds = sorted({sd for key, runs in data.items() if key[0] == scn and key[2] is None
                      for sd in runs})
        if sds:
            seeds.append("%s %s" % (scn, seed_list(sds)))
    sds = sorted({sd for key, runs in data.items() if key[2] is not None for sd in runs})
    if sds:
        seeds.append("load sweep %s" % seed_list(sds))
    nranks = max((int(num(r["rank"])) + 1 for runs in data.values() for run in runs.values()
                  for r in run["summ"] if num(r.get("rank")) == num(r.get("rank"))),
                 default=a.np)
    c_mem, tok = run_setting(data, "--kv-mem", a.kv_mem), run_setting(data, "--tok-bytes",
                                                                       str(a.tok_bytes))
    lines.append("%d ranks, C = %s of KV memory per rank, %s B of K/V per token; "
                 "seeds: %s; values are medians over seeds [min–max].\n"
                 % (nranks, c_mem, tok, "; ".join(seeds) or "none"))
    for name in ("calibration.txt", "load_scale.txt"):
        path = os.path.join(a.out, name)
        if os.path.exists(path):
            lines.append("%s: %s\n" % (name, "; ".join(open(path).read().split("\n")).strip("; ")))
    json_out = {}
    for scn in SCENARIOS:
        cfgs = [c for c in CONFIGS if (scn, c, None) in data]
        if not cfgs:
            continue
        lines.append("\n## %s\n" % scn)
        lines.append("| config | seeds | hot tokens/s per rank | hot req/s | hot goodput req/s | "
                     "hot TTFT p50 / p99 s | hot TPOT p99 ms | cold TTFT p99 s | "
                     "cold TPOT p99 ms | node tokens/s | preemptions | recomputed tokens | "
                     "corrupt |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for cfg in cfgs:
            runs = data[(scn, cfg, None)]
            seeds_of = sorted(runs)
            M = [runs[sd]["m"] for sd in seeds_of]
            g = lambda k: [m[k] for m in M]
            lines.append("| %s | %d | %s | %s | %s | %s / %s | %s | %s | %s | %s | %s | %s | %s |" % (
                cfg, len(M), fmt_mr(g("hot_tps"), 0), fmt_mr(g("hot_rps")),
                fmt_mr(g("hot_goodput")), fmt_mr(g("hot_ttft_p50"), 3),
                fmt_mr(g("hot_ttft_p99"), 2), fmt_mr([x * 1e3 for x in g("hot_tpot_p99")], 1),
                fmt_mr(g("cold_ttft_p99"), 3), fmt_mr([x * 1e3 for x in g("cold_tpot_p99")], 1),
                fmt_mr(g("all_tps"), 0), fmt_mr(g("preemptions"), 0),
                fmt_mr(g("recomputed_tokens"), 0), fmt(max(g("corrupt")), 0)))
            # per seed, in the order of "seeds" (the ratios' order too)
            json_out.setdefault(scn, {})[cfg] = dict({k: [m[k] for m in M] for k in M[0]},
                                                     seeds=seeds_of)
        # ratios, paired by seed
        key = "all_tps" if scn == "allbusy" else "hot_tps"
        rows = []
        for num_cfg, den_cfg, goal in (("elastic", "static", ">= 1.5 (GPU)"),
                                       ("elastic", "double", ">= 0.98 (GPU)"),
                                       ("elastic", "oracle", ">= 0.95 (GPU)")):
            r = ratios(data, scn, num_cfg, den_cfg, key)
            if r:
                paired = sorted(set(data.get((scn, num_cfg, None), {})) &
                                set(data.get((scn, den_cfg, None), {})))
                json_out.setdefault(scn, {}).setdefault("ratio_seeds", {})[
                    "%s / %s" % (num_cfg, den_cfg)] = paired
                if scn == "allbusy":
                    goal = ">= 0.97 (GPU); CI: within 5%"
                rows.append(("%s / %s, %s throughput" % (num_cfg, den_cfg,
                             "node" if scn == "allbusy" else "hot-phase"), r, goal))
        if scn != "allbusy":
            for met, label in (("cold_ttft_p99", "cold ranks' TTFT p99"),
                               ("cold_tpot_p99", "cold ranks' TPOT p99")):
                r = ratios(data, scn, "elastic", "static", met)
                if r:
                    rows.append(("elastic / static, %s" % label, r, "<= 1.05 (GPU)"))
        if rows:
            lines.append("\n| ratio (paired by seed) | median | range | goal |")
            lines.append("|---|---|---|---|")
            for label, r, goal in rows:
                m, lo, hi = med_range(r)
                lines.append("| %s | %.3f | %.3f–%.3f | %s |" % (label, m, lo, hi, goal))
                json_out.setdefault(scn, {}).setdefault("ratios", {})[label] = r
        if scn != "allbusy":
            # A run has few cold requests (about 80 on the H200), so its
            # p99 is close to its slowest request: pooled over the seeds too
            cells, pooled = [], {}
            for cfg in cfgs:
                runs = data[(scn, cfg, None)]
                rq = [r for run in runs.values() for r in run["reqs"] if r["class"] == "cold"]
                if rq:
                    pooled[cfg] = (quantile([num(r["ttft"]) for r in rq], 0.99),
                                   quantile([num(r["tpot"]) for r in rq], 0.99))
                    cells.append("%s %d requests, TTFT p99 %s s, TPOT p99 %s ms" % (
                        cfg, len(rq), fmt(pooled[cfg][0], 3), fmt(pooled[cfg][1] * 1e3, 1)))
            if cells:
                ratio = ""
                if "elastic" in pooled and "static" in pooled:
                    e, st = pooled["elastic"], pooled["static"]
                    ratio = " Elastic / static, pooled: TTFT p99 %.3f, TPOT p99 %.3f." % (
                        e[0] / st[0], e[1] / st[1])
                    json_out.setdefault(scn, {})["cold_pooled"] = {
                        "ttft_p99_ratio": e[0] / st[0], "tpot_p99_ratio": e[1] / st[1]}
                lines.append("\nCold ranks' requests pooled over the seeds (a run has about %d, "
                             "so its own p99 is near its slowest request): %s.%s" % (
                                 statistics.median(r["m"]["cold_n"] for c in cfgs
                                                   for r in data[(scn, c, None)].values()),
                                 "; ".join(cells), ratio))
        if (scn, "elastic", None) in data:
            M = [r["m"] for r in data[(scn, "elastic", None)].values()]
            g = lambda k: [m[k] for m in M]
            lines.append("\nWhere elastic's time went (per run, all ranks): grows %s, failed grows "
                         "%s, grows that recalled lent memory %s, refused %s, give-backs %s, "
                         "recalls seen by the borrowers' callbacks %s; lender waits %s, p50 %s "
                         "ms, p99 %s ms, max %s ms; EMA calls %s ms per second of a rank; most "
                         "borrowed by one rank %s MiB." % (
                             fmt_mr(g("grows"), 0), fmt_mr(g("grow_fails"), 0),
                             fmt_mr(g("recalls"), 0), fmt_mr(g("refusals"), 0),
                             fmt_mr(g("givebacks"), 0), fmt_mr(g("recalled"), 0),
                             fmt_mr(g("lender_waits"), 0), fmt_mr(g("lender_wait_p50_ms"), 2),
                             fmt_mr(g("lender_wait_p99_ms"), 2),
                             fmt_mr(g("lender_wait_max_ms"), 2), fmt_mr(g("ema_ms_per_s"), 2),
                             fmt_mr(g("borrowed_max_mib"), 2)))
    sweep = sorted({h for (s, c, h) in data if h is not None})
    if sweep:
        lines.append("\n## throughput against offered load (rotating, hot-phase tokens/s per rank)\n")
        lines.append("| hot demand (x C) | " + " | ".join(CONFIGS) + " |")
        lines.append("|---|" + "---|" * len(CONFIGS))
        for h in sweep:
            cells = []
            for cfg in CONFIGS:
                runs = data.get(("rotating", cfg, h), {})
                cells.append(fmt_mr([r["m"]["hot_tps"] for r in runs.values()], 0))
            lines.append("| %g | %s |" % (h, " | ".join(cells)))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(json_out, f, indent=1, default=float)
    # every run's per-rank rows in one file
    allrows, header = [], None
    for (scn, cfg, hot), runs in sorted(data.items(), key=lambda x: (x[0][0], x[0][1],
                                                                      x[0][2] or 0)):
        for seed, run in sorted(runs.items()):
            for r in run["summ"]:
                r = dict(r)
                r["hot_mult"] = "" if hot is None else hot
                header = header or list(r.keys())
                allrows.append(r)
    if allrows:
        with open(os.path.join(a.out, "summary.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            w.writeheader()
            w.writerows(allrows)
    return text


def plots(out):
    """bench/kv_plots.py with the first python3 that has matplotlib (Debian's
    python3-matplotlib serves /usr/bin/python3, not a pyenv or venv one)."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.call(
                [py, "-c", "import matplotlib"], stderr=subprocess.DEVNULL) == 0:
            return subprocess.call([py, os.path.join(HERE, "kv_plots.py"), out])
    print("no plots: no python3 with matplotlib here (Debian: apt-get install "
          "python3-matplotlib); run `python3 %s %s` with a python3 that has it"
          % (os.path.join(HERE, "kv_plots.py"), out))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Arguments after -- go to every kv_serving run.")
    ap.add_argument("out", help="output directory")
    ap.add_argument("--kind", choices=["host", "cuda"], default="host")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=5, help="seeds 1..N of each run")
    ap.add_argument("--other-seeds", type=int,
                    help="seeds of the stationary and allbusy scenarios (default --seeds)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--sweep", default="", help="hot demands for the load sweep, e.g. 1,1.4,2.2")
    ap.add_argument("--sweep-seeds", type=int, default=2)
    ap.add_argument("--kv-mem", help="C per rank (host 1M, cuda 256M)")
    ap.add_argument("--seg", help="EMA_SEGMENT_SIZE (host 64K; cuda 32M)")
    ap.add_argument("--tok-bytes", type=int)
    ap.add_argument("--oracle-mult", type=float, default=3)
    ap.add_argument("--lend-reserve", default="0", help="elastic's EMA_LEND_RESERVE")
    ap.add_argument("--gpu-map", help="EMA_GPU_MAP (cuda; default all ranks on GPU 0)")
    ap.add_argument("--model", help="step model B,D,K,P (cuda: calibrated unless given)")
    ap.add_argument("--slo", help="TTFT,TPOT targets in seconds")
    ap.add_argument("--demand-cal", choices=["auto", "on", "off"], default="auto",
                    help="pilot oracle runs that scale the load until the hot ranks' measured "
                    "KV demand is 1.8 C (auto: on for cuda)")
    ap.add_argument("--build", help="the build directory (default ../build)")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--timeout", type=int, default=300, help="mpirun --timeout of each run")
    ap.add_argument("--order-seed", type=int, default=12345)
    ap.add_argument("--force", action="store_true", help="run again what is on disk")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds: start no run that would end after this (0: none); "
                    "exit 3 with runs left, which the same command runs next time")
    ap.add_argument("--no-run", action="store_true", help="only tabulate and plot")
    ap.add_argument("--no-plots", action="store_true")
    # What follows "--" goes to kv_serving as it is, wherever OUT and the
    # options stand before it (argparse's own "--" handling wants OUT
    # right before it).
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    a = ap.parse_args(argv)
    a.extra = extra
    a.t0 = time.time()
    a.left = 0
    if a.deadline < 0:
        ap.error("--deadline must be 0 (none) or a number of seconds")
    if a.deadline and a.force:
        # each call would redo the runs the last one made: it never ends
        ap.error("--deadline goes on from the runs on disk; --force redoes them: not both")
    preset = PRESETS[a.kind]
    a.kv_mem = a.kv_mem or preset["kv_mem"]
    a.seg = a.seg if a.seg is not None else preset["seg"]
    a.tok_bytes = a.tok_bytes or preset["tok_bytes"]
    a.preset_args = preset["args"]
    a.configs = [c for c in a.configs.split(",") if c]
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    try:
        a.sweep = [float(x) for x in a.sweep.split(",") if x]
    except ValueError:
        ap.error("--sweep takes hot demands in C, such as 1,1.4,2.2: not %s" % a.sweep)
    a.other_seeds = a.other_seeds or a.seeds
    a.kind_note = "a 2-core VM, virtual clock"
    for c in a.configs:
        if c not in CONFIGS:
            ap.error("unknown config %s (%s)" % (c, ", ".join(CONFIGS)))
    for scn in a.scenarios:
        if scn not in SCENARIOS:
            ap.error("unknown scenario %s (%s)" % (scn, ", ".join(SCENARIOS)))
    for opt, v in (("--kv-mem", a.kv_mem), ("--seg", a.seg or "0")):
        try:
            parse_size(v)
        except ValueError:
            ap.error("%s: not a size: %s (4096, 64K, 256M, 1G)" % (opt, v))
    # --model and --slo go to every run: a typo would fail each of them
    # (after the calibration and the pilots), so refuse it here.
    for opt, v, n in (("--model", a.model, 4), ("--slo", a.slo, 2)):
        try:
            ok = v is None or (len(v.split(",")) == n and
                               all(float(x) >= 0 for x in v.split(",")))
        except ValueError:
            ok = False
        if not ok:
            ap.error("%s takes %d numbers of 0 or more, comma-separated (%s): not %s"
                     % (opt, n, "B,D,K,P" if n == 4 else "TTFT,TPOT", v))
    if a.no_run and not os.path.isdir(a.out):
        ap.error("--no-run: no directory %s" % a.out)
    os.makedirs(a.out, exist_ok=True)
    a.out = os.path.abspath(a.out)
    failed = []
    if not a.no_run:
        binary = find_binary(a.build)
        model = a.model
        if a.kind == "cuda" and not model:
            model = calibrate(a, binary)
        if a.kind == "cuda" and not a.slo and model:
            b, d, k, p = (float(x) for x in model.split(","))
            step = (b + k * 1e-3 * parse_size(a.kv_mem) / a.tok_bytes) * 1e-3
            a.slo = "%.3f,%.4f" % (max(1.0, 50 * step), 4 * step)
        a.load_scale = 1.0
        if a.demand_cal == "on" or (a.demand_cal == "auto" and a.kind == "cuda"):
            a.load_scale = calibrate_demand(a, binary, model)
            print("offered load scaled by %.3f (hot %.2f C by the model)"
                  % (a.load_scale, HOT * a.load_scale), flush=True)
        failed = run_all(a, binary, model)
    data = collect(a)
    if not data:
        sys.exit("kv_serving.py: no runs under %s/runs" % a.out)
    print(tabulate(a, data))
    if not a.no_plots:
        plots(a.out)
    if failed:
        print("FAILED runs: %s" % ", ".join(failed))
        return 1
    if a.left:
        print("%d runs left (--deadline): run the same command again" % a.left)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
