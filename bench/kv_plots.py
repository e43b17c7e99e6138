#!/usr/bin/env python3
"""Draw kv_serving's six plots from the CSV files of bench/kv_serving.py.

    bench/kv_plots.py OUT        (OUT as given to kv_serving.py)

writes OUT/plots/:
  1_memory.png            KV memory of each rank over time, local and borrowed,
                          with the offered load (rotating, elastic, seed 1)
  2_hot_throughput.png    hot-phase tokens/s per configuration, median and range
                          over seeds, per scenario
  3_latency_cdf.png       TTFT and TPOT CDFs of hot and cold ranks (rotating)
  4_load_sweep.png        hot-phase throughput against offered load (the sweep,
                          or the main runs' single point)
  5_lender_wait.png       how long lenders waited for reclaimed memory (elastic)
  6_step_vs_borrowed.png  decode step time against the borrowed fraction
                          (elastic)
Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import csv
import glob
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_serving import classify  # noqa: E402  (one definition of the classes)

CONFIGS = ["static", "elastic", "double", "oracle"]
COLORS = {"static": "tab:gray", "elastic": "tab:blue", "double": "tab:green",
          "oracle": "tab:purple"}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def save(fig, dst):
    """Lay out, write and close a finished figure; True (it was drawn)."""
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    plt.close(fig)
    return True


def first_seed(out, scn, cfg):
    runs = sorted(glob.glob(os.path.join(out, "runs", scn, cfg, "s*")),
                  key=lambda d: int(os.path.basename(d)[1:]))
    return runs[0] if runs else None


def kind_label(out):
    for p in glob.glob(os.path.join(out, "runs", "*", "*", "s*", "run.log")):
        with open(p) as f:
            head = f.read(2000)
        return "cuda kind" if "EMA_MEMORY_KIND=cuda" in head else "host kind, virtual clock"
    return ""


def plot_memory(out, dst, label):
    d = first_seed(out, "rotating", "elastic")
    if d is None:
        return False
    files = sorted(glob.glob(os.path.join(d, "timeline_r*.csv")),
                   key=lambda p: int(p.rsplit("_r", 1)[1].split(".")[0]))
    fig, axes = plt.subplots(len(files), 1, figsize=(10, 2.2 * len(files)), sharex=True)
    if len(files) == 1:
        axes = [axes]
    mib = 1048576.0
    for ax, p in zip(axes, files):
        rows = read_csv(p)
        t = [fnum(r["t"]) for r in rows]
        loc = [fnum(r["local"]) / mib for r in rows]
        bor = [fnum(r["borrowed"]) / mib for r in rows]
        used = [fnum(r["used"]) / mib for r in rows]
        ax.stackplot(t, loc, bor, labels=["local", "borrowed"],
                     colors=["tab:blue", "tab:orange"], alpha=0.7)
        ax.plot(t, used, color="black", lw=0.8, label="KV in use")
        ax.set_ylabel("rank %s\nMiB" % p.rsplit("_r", 1)[1].split(".")[0])
        ax2 = ax.twinx()
        ax2.step(t, [fnum(r["offered_rps"]) for r in rows], where="post", color="tab:red",
                 lw=1, label="offered req/s")
        ax2.set_ylabel("req/s", color="tab:red")
    axes[0].legend(loc="upper right", fontsize=8, ncol=3)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle("KV memory held by each rank, elastic, rotating load (%s, %s)"
                 % (os.path.basename(d), label))
    return save(fig, dst)


def run_rows(out, scn, cfg, hot=None):
    """{seed: summary rows} of one scenario and configuration."""
    if hot is None:
        base = os.path.join(out, "runs", scn, cfg, "s*")
    else:
        base = os.path.join(out, "runs", "sweep", "hot%g" % hot, cfg, "s*")
    res = {}
    for d in glob.glob(base):
        rows = []
        for p in glob.glob(os.path.join(d, "summary_r*.csv")):
            rows += read_csv(p)
        if rows:
            res[int(os.path.basename(d)[1:])] = rows
    return res


def hot_tps(rows, scn):
    cl = "all" if scn == "allbusy" else "hot"
    v = [fnum(r["tokens_s"]) for r in rows if r["class"] == cl]
    return statistics.mean(v) if v else float("nan")


def plot_hot_throughput(out, dst, label):
    scns = [s for s in ("rotating", "stationary", "allbusy")
            if glob.glob(os.path.join(out, "runs", s, "*", "s*"))]
    if not scns:
        return False
    fig, axes = plt.subplots(1, len(scns), figsize=(4.2 * len(scns), 4), squeeze=False)
    for ax, scn in zip(axes[0], scns):
        xs, meds, los, his, cols = [], [], [], [], []
        for cfg in CONFIGS:
            runs = run_rows(out, scn, cfg)
            if not runs:
                continue
            v = [hot_tps(r, scn) for r in runs.values()]
            m = statistics.median(v)
            xs.append("%s\n(%d)" % (cfg, len(v)))
            meds.append(m)
            los.append(m - min(v))
            his.append(max(v) - m)
            cols.append(COLORS[cfg])
        ax.bar(xs, meds, yerr=[los, his], color=cols, capsize=4)
        ax.set_title(scn + (" (all ranks hot)" if scn == "allbusy" else ""))
        ax.set_ylabel("tokens/s per hot rank")
    fig.suptitle("Hot-phase throughput, median and range over seeds (%s)" % label)
    return save(fig, dst)


def plot_cdf(out, dst, label):
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    any_data = False
    for cfg in CONFIGS:
        reqs = []
        for p in glob.glob(os.path.join(out, "runs", "rotating", cfg, "s*", "req_r*.csv")):
            reqs += classify(read_csv(p))
        if not reqs:
            continue
        any_data = True
        for i, cl in enumerate(("hot", "cold")):
            for j, met in enumerate(("ttft", "tpot")):
                v = sorted(fnum(r[met]) for r in reqs if r["class"] == cl and r["done"] == "1"
                           and fnum(r[met]) == fnum(r[met]))
                if not v:
                    continue
                y = [(k + 1) / len(v) for k in range(len(v))]
                axes[i][j].plot([x * (1 if met == "ttft" else 1e3) for x in v], y,
                                color=COLORS[cfg], label=cfg)
    if not any_data:
        plt.close(fig)
        return False
    for i, cl in enumerate(("hot", "cold")):
        for j, met in enumerate(("TTFT (s)", "TPOT (ms)")):
            ax = axes[i][j]
            ax.set_xscale("log")
            # plain numbers, at 1, 2 and 5 of each decade on a short axis: the
            # default labels every minor tick of one as "2 x 10^1", overlapping
            lo, hi = ax.get_xlim()
            subs = (1.0,) if hi > 300 * lo else (1.0, 2.0, 5.0)
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: "%g" % x))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title("%s ranks: %s" % (cl, met.split()[0]))
            ax.set_xlabel(met)
            ax.set_ylabel("fraction of requests")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("Latency CDFs, rotating load, all seeds (%s)" % label)
    return save(fig, dst)


def sweep_point(runs, hot):
    """(offered load, median, min and max of the hot-phase tokens/s, hot) of
    the rotating runs {seed: summary rows} at one load (hot None: the main
    runs)."""
    v = [hot_tps(r, "rotating") for r in runs.values()]
    offered = statistics.mean(fnum(r["offered_rps"]) for rr in runs.values()
                              for r in rr if r["class"] == "hot")
    return (offered, statistics.median(v), min(v), max(v), hot)


def plot_sweep(out, dst, label):
    hots = sorted(float(os.path.basename(d)[3:])
                  for d in glob.glob(os.path.join(out, "runs", "sweep", "hot*")))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for cfg in CONFIGS:
        pts = []
        for h in hots:
            runs = run_rows(out, "rotating", cfg, h)
            if runs:
                pts.append(sweep_point(runs, h))
        main = run_rows(out, "rotating", cfg)
        if main:
            pts.append(sweep_point(main, None))
        if not pts:
            continue
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                    yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    marker="o", capsize=3, color=COLORS[cfg], label=cfg)
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xlabel("offered load of the hot rank (requests/s)")
    ax.set_ylabel("hot-phase tokens/s per rank")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Throughput against offered load, rotating (%s)" % label)
    return save(fig, dst)


def plot_lender_wait(out, dst, label):
    waits = {}
    for scn in ("rotating", "stationary", "allbusy"):
        for p in glob.glob(os.path.join(out, "runs", scn, "elastic", "s*", "events_r*.csv")):
            waits.setdefault(scn, []).extend(fnum(e["us"]) / 1e3 for e in read_csv(p)
                                             if e["event"] == "lender_wait" and fnum(e["us"]) > 0)
    waits = {k: v for k, v in waits.items() if v}
    if not waits:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lo = max(min(min(v) for v in waits.values()), 1e-3)
    hi = max(max(v) for v in waits.values())
    nb = 30
    edges = [lo * (hi / lo) ** (i / nb) for i in range(nb + 1)] if hi > lo else [lo, lo * 2]
    for scn, v in waits.items():
        ax.hist([max(x, lo) for x in v], bins=edges, histtype="step", lw=1.5,
                label="%s (%d waits)" % (scn, len(v)))
    ax.set_xscale("log")
    ax.set_xlabel("lender's wait for its memory (ms): first grow that needed it to success")
    ax.set_ylabel("count")
    ax.legend()
    ax.set_title("How long lenders waited for reclaimed memory, elastic (%s)" % label)
    return save(fig, dst)


def plot_step_vs_borrowed(out, dst, label):
    """Left: decode step time against the borrowed fraction (a bigger batch
    borrows more and reads more, so this mixes two effects).  Right: the
    same steps' time over what a step of the same batch and K/V size takes
    with nothing borrowed (a least-squares fit, time = a + b * K/V tokens +
    c * batch, over the steps that borrowed nothing, static's and elastic's):
    what borrowing itself costs."""
    import numpy as np

    steps = {}
    for cfg in ("elastic", "static"):
        for d in glob.glob(os.path.join(out, "runs", "rotating", cfg, "s*")):
            for p in glob.glob(os.path.join(d, "steps_r*.csv")):
                for r in read_csv(p):
                    if r["prefill"] == "0" and fnum(r["kv_tokens"]) > 0:
                        steps.setdefault(cfg, []).append(
                            (fnum(r["borrowed_frac"]), fnum(r["dt_ms"]), fnum(r["kv_tokens"]),
                             fnum(r["batch"])))
    if "elastic" not in steps:
        return False
    base = [s for v in steps.values() for s in v if s[0] == 0]
    A = np.array([[1, s[2], s[3]] for s in base])
    coef = np.linalg.lstsq(A, np.array([s[1] for s in base]), rcond=None)[0]
    el = steps["elastic"]
    bf = np.array([s[0] for s in el])
    dt = np.array([s[1] for s in el])
    pred = coef[0] + coef[1] * np.array([s[2] for s in el]) + coef[2] * np.array([s[3] for s in el])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    sc = ax1.scatter(bf, dt, c=[s[2] for s in el], s=2, cmap="viridis", alpha=0.4)
    fig.colorbar(sc, ax=ax1, label="K/V tokens read in the step")
    ax1.set_xlabel("borrowed fraction of the rank's KV window")
    ax1.set_ylabel("decode step time (ms)")
    ax1.set_title("elastic decode steps")
    ratio = dt / pred
    ax2.scatter(bf, ratio, s=2, alpha=0.3, color="tab:blue", label="elastic decode steps")
    bins = {}
    for x, y in zip(bf, ratio):
        bins.setdefault(min(int(x * 10), 9), []).append(y)
    bx = sorted(bins)
    ax2.plot([(b + 0.5) / 10 for b in bx], [statistics.median(bins[b]) for b in bx], color="red",
             lw=2, label="median per 0.1")
    ax2.axhline(1, color="gray", lw=0.8)
    ax2.set_ylim(0.8, 1.5)
    ax2.set_xlabel("borrowed fraction of the rank's KV window")
    ax2.set_ylabel("step time / same step with nothing borrowed")
    ax2.set_title("what borrowing costs a step")
    ax2.legend(fontsize=8)
    fig.suptitle("Step time against borrowed fraction, rotating, all seeds (%s)" % label)
    return save(fig, dst)


PLOTS = [("1_memory.png", plot_memory), ("2_hot_throughput.png", plot_hot_throughput),
         ("3_latency_cdf.png", plot_cdf), ("4_load_sweep.png", plot_sweep),
         ("5_lender_wait.png", plot_lender_wait), ("6_step_vs_borrowed.png", plot_step_vs_borrowed)]


def plot_all(out):
    pdir = os.path.join(out, "plots")
    os.makedirs(pdir, exist_ok=True)
    label = kind_label(out)
    for name, fn in PLOTS:
        ok = fn(out, os.path.join(pdir, name), label)
        print("%s %s" % (os.path.join(pdir, name), "" if ok else "(no data: skipped)"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    plot_all(sys.argv[1])
