#!/usr/bin/env python3
"""Builds bench/gpu/run.sh's final table from its output folder (python3 stdlib only).

    python3 bench/gpu/summarize.py OUT_DIR

Reads OUT_DIR/runs.jsonl (one record per command run.sh ran or skipped), each thetad run's
metrics.jsonl (rank 0), each DDP run's result.json (or result.json.rank<r>.json when a rank
failed), engine_bw/result.json, and the nvidia-smi memory samples (smi.csv). Prints the runs,
the issue-7 goals, and last ONE table:

  config | thetad step ms | DDP step ms | ratio | bytes/step thetad vs DDP | peak mem thetad vs DDP | loss agreement

Step times are medians over the steps after warm-up. Peak memory: thetad's device_mem_peak_bytes
against DDP's torch.cuda.max_memory_allocated when thetad reports one, else both from
nvidia-smi (marked "smi"). Loss agreement: max |loss_thetad - loss_DDP| over the first 20 steps
of rank 0, only where both ran the same model with average: world and DDP used thetad's exact
initialization. The same table goes to OUT_DIR/summary.md (markdown), with env.txt.
"""
import glob
import json
import os
import statistics
import sys

LOSS_STEPS = 20
LOSS_REL_TOL = 1e-4
# TF32 rounds every matmul input to a 10-bit mantissa (relative error ~5e-4 per product): two
# programs that pick different GEMM kernels agree to ~1e-3, not to float32's 1e-4.
# bf16 rounds to 8 significant bits (2^-9 relative per operation) and thetad and DDP order their
# kernels differently: the same 1e-2 as TF32 (measured on 1 H100: 1.6e-4 over 20 steps).
LOSS_REL_TOL_BY_PRECISION = {"fp32": LOSS_REL_TOL, "tf32": 1e-2, "bf16": 1e-2}


def load_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def params_of(dims):
    """(shared, per task) parameter counts of multitask_mlp from [in, hidden, out, trunk, head, batch]."""
    d_in, hidden, d_out, trunk, head = dims[:5]
    shared, d = 0, d_in
    for _ in range(trunk):
        shared += d * hidden + hidden
        d = hidden
    per_task = 0
    for i in range(head):
        o = d_out if i + 1 == head else hidden
        per_task += d * o + o
        d = o
    return shared, per_task


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def smi_peak(run_dir):
    """Largest memory.used (bytes) any GPU showed while the run ran; None without samples."""
    best = None
    try:
        with open(os.path.join(run_dir, "smi.csv")) as f:
            for line in f:
                parts = [p.strip() for p in line.split(",")]
                if len(parts) >= 2:
                    try:
                        v = float(parts[1]) * (1 << 20)
                    except ValueError:
                        continue
                    best = v if best is None else max(best, v)
    except OSError:
        pass
    return best


def thetad_stats(rec, out):
    d = os.path.join(out, rec["dir"])
    rows = [r for r in load_jsonl(os.path.join(d, "metrics.jsonl")) if r.get("rank", 0) == 0]
    rows.sort(key=lambda r: r.get("step", 0))
    warm = int(rec.get("warmup", 10))
    timed = [r for r in rows if r.get("step", 0) >= warm]
    if not timed:
        timed = rows[1:] or rows
    st = {"steps": len(rows), "timed": len(timed)}
    st["step_ms"] = median([r.get("step_ms") for r in timed])
    st["comm_wait_ms"] = median([r.get("comm_wait_ms") for r in timed])
    st["bytes"] = median([r.get("bytes_allreduced") for r in timed])
    st["bytes_all"] = sorted(set(r.get("bytes_allreduced") for r in rows if r.get("bytes_allreduced") is not None))
    peaks = [r.get("device_mem_peak_bytes") or 0 for r in rows]
    st["peak"] = max(peaks) if peaks and max(peaks) > 0 else None
    st["smi_peak"] = smi_peak(d)
    st["losses"] = {int(r["step"]): r.get("loss") for r in rows if "step" in r}
    st["h2d"] = median([r.get("h2d_bytes") for r in timed])
    for k in ("forward_ms", "backward_ms", "optimizer_ms", "cpu_adam_ms", "acquire_wait_ms"):
        st[k] = median([r.get(k) for r in timed])
    st["swap_misses"] = median([r.get("swap_misses") for r in timed])
    return st


def ddp_stats(rec, out):
    d = os.path.join(out, rec["dir"])
    res = load_json(os.path.join(d, "result.json"))
    ranks = [load_json(p) for p in sorted(glob.glob(os.path.join(d, "result.json.rank*.json")))]
    ranks = [r for r in ranks if r]
    if res is None and ranks:
        res = ranks[0]
    if res is None:
        return None
    res = dict(res)
    for r in ranks:  # a failed rank's report wins over rank 0's (rank 0 may have been killed)
        if r.get("oom"):
            res["oom"] = True
            res["error"] = r.get("error")
            res["peak_mem_bytes"] = max(res.get("peak_mem_bytes") or 0, r.get("peak_mem_bytes") or 0)
            res["phase"] = r.get("phase")
            res["steps_done"] = min(res.get("steps_done") or 0, r.get("steps_done") or 0)
        elif r.get("error") and not res.get("error"):
            res["error"] = r.get("error")
    res["smi_peak"] = smi_peak(d)
    return res


def gib(b):
    return "-" if b is None else "%.1f GiB" % (b / float(1 << 30))


def gb(b):
    if b is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return "%.2f %s" % (b / scale, unit)
    return "%d B" % b


def ms(v):
    return "-" if v is None else ("%.1f" % v if v >= 10 else "%.2f" % v)


def status_text(rec):
    s = rec.get("status")
    if s == "ok":
        return None
    if s == "failed":
        return "failed rc=%s" % rec.get("rc")
    return s or "missing"


def label(rec):
    mode = rec.get("mode", "")
    n = rec.get("np")
    what = "GPU" if rec.get("device", "cuda") == "cuda" else "CPU rank"
    prec = rec.get("precision", "fp32")
    return "T=%s %s, %s %s%s%s" % (rec.get("T"), "all-resident" if mode == "resident" else mode,
                                   n, what, "" if n == 1 else "s", "" if prec == "fp32" else ", " + prec)


def main(argv):
    if len(argv) != 2:
        print("usage: summarize.py OUT_DIR", file=sys.stderr)
        return 2
    out = argv[1]
    runs = load_jsonl(os.path.join(out, "runs.jsonl"))
    by_name = {r["name"]: r for r in runs if "name" in r}
    lines = []  # printed text
    table = []  # rows of cells
    goals = []
    notes = []
    header = ["config", "thetad step ms", "DDP step ms", "ratio", "bytes/step thetad vs DDP",
              "peak mem thetad vs DDP", "loss agreement"]

    lines.append("runs:")
    for r in runs:
        extra = ""
        if r.get("reason"):
            extra = " (%s)" % r["reason"]
        lines.append("  %-22s %-8s %7ss%s" % (r.get("name"), r.get("status"), r.get("wall_s"), extra))

    thetad_rows = {}
    ordered = sorted((r for r in runs if r.get("kind") == "thetad"),
                     key=lambda r: (r.get("mode") != "resident", int(r.get("T") or 0)))
    for rec in ordered:
        st = thetad_stats(rec, out)
        thetad_rows[rec["name"]] = (rec, st)
        peer = by_name.get(rec.get("peer", ""))
        dd = ddp_stats(peer, out) if peer else None
        cells = [label(rec)]
        # thetad step time
        s = status_text(rec)
        if st["step_ms"] is not None:
            t_cell = ms(st["step_ms"])
            if s:
                t_cell += " (%s, %d steps)" % (s, st["steps"])
        else:
            t_cell = s or "no metrics"
        cells.append(t_cell)
        # DDP step time
        d_ms = None
        if dd is None:
            cells.append(status_text(peer) if peer else "n/a")
        elif dd.get("oom"):
            cells.append("OOM (%s, step %s)" % (dd.get("phase"), dd.get("steps_done")))
        elif dd.get("error"):
            cells.append("error: %s" % str(dd["error"])[:60])
        else:
            d_ms = dd.get("step_ms_median")
            cells.append(ms(d_ms) + ("" if peer.get("status") == "ok" else " (%s)" % status_text(peer)))
        # ratio
        if st["step_ms"] is not None and d_ms:
            cells.append("%.2fx" % (st["step_ms"] / d_ms))
        elif dd is not None and dd.get("oom"):
            cells.append("DDP OOM")
        else:
            cells.append("-")
        # bytes
        d_bytes = dd.get("bytes_allreduced_per_step") if dd else None
        if d_bytes is None and rec.get("dims"):
            sh, pt = params_of(rec["dims"])
            d_bytes = 4 * (sh + int(rec["T"]) * pt)
        b_cell = "%s vs %s" % (gb(st["bytes"]), gb(d_bytes))
        if st["bytes"] and d_bytes:
            b_cell += " (%.2fx)" % (st["bytes"] / d_bytes)
        cells.append(b_cell)
        # peak memory
        if st["peak"] is not None:
            tp, dp, src = st["peak"], (dd.get("peak_mem_bytes") if dd else None), ""
        else:
            tp, dp, src = st["smi_peak"], (dd.get("smi_peak") if dd else None), " (smi)"
        if dd is not None and dd.get("oom"):
            at = dd.get("peak_mem_bytes") or dd.get("smi_peak")
            p_cell = "%s vs OOM%s%s" % (gib(tp), " (at %s)" % gib(at) if at else "", src)
        else:
            p_cell = "%s vs %s" % (gib(tp), gib(dp))
            if tp and dp:
                p_cell += " (%.2fx%s)" % (tp / dp, src.strip(" ()") and ", smi")
            elif src:
                p_cell += src
        cells.append(p_cell)
        # loss agreement
        loss_cell = "n/a"
        if (dd is not None and rec.get("average") == "world" and peer.get("init") == "exact"
                and not dd.get("error") and dd.get("losses")):
            n = min(LOSS_STEPS, len(dd["losses"]))
            diffs, rels = [], []
            for s_ in range(n):
                a = st["losses"].get(s_)
                b = dd["losses"][s_]
                if a is None or b is None:
                    continue
                diffs.append(abs(a - b))
                rels.append(abs(a - b) / max(abs(b), 1e-30))
            if diffs:
                loss_cell = "max|d| %.1e, rel %.1e (%d steps)" % (max(diffs), max(rels), len(diffs))
                st["loss_rel"] = max(rels)
                # Leading steps within the precision's tolerance: a wrong schedule, divisor or
                # initialization differs from the first steps; summation-order rounding that
                # Adam amplifies shows up later.
                tol = LOSS_REL_TOL_BY_PRECISION.get(rec.get("precision", "fp32"), LOSS_REL_TOL)
                st["loss_lead"] = next((i for i, r in enumerate(rels) if r > tol), len(rels))
        cells.append(loss_cell)
        st["ddp"] = dd
        table.append(cells)

    # DDP runs no thetad run compares with (the extra points that look for DDP's out-of-memory)
    peers = set(rec.get("peer") for rec in runs if rec.get("kind") == "thetad")
    for rec in runs:
        if rec.get("kind") != "ddp" or rec.get("name") in peers:
            continue
        dd = ddp_stats(rec, out)
        n = rec.get("np")
        cells = ["T=%s DDP only, %s %s%s" % (rec.get("T"), n, "GPU" if rec.get("device", "cuda") == "cuda" else "CPU rank",
                                              "" if n == 1 else "s"), "-"]
        if dd is None:
            cells.append(status_text(rec) or "no result")
        elif dd.get("oom"):
            cells.append("OOM (%s, step %s)" % (dd.get("phase"), dd.get("steps_done")))
        elif dd.get("error"):
            cells.append("error: %s" % str(dd["error"])[:60])
        else:
            cells.append(ms(dd.get("step_ms_median")))
        at = (dd.get("peak_mem_bytes") or dd.get("smi_peak")) if dd else None
        cells += ["-", "- vs %s" % gb(dd.get("bytes_allreduced_per_step")) if dd else "-",
                  "- vs %s%s" % ("OOM at " if dd and dd.get("oom") else "", gib(at)), "n/a"]
        table.append(cells)

    # engine bandwidth row
    eb = by_name.get("engine_bw")
    if eb is not None:
        res = load_json(os.path.join(out, "engine_bw", "result.json"))
        if res and res.get("methods"):
            m = res["methods"]
            e, r1, rc = m.get("engine", {}), m.get("raw_single", {}), m.get("raw_chunked", {})
            table.append([
                "engine bw: %.0f MiB, %d buckets of %g MiB, %d GPUs" % (
                    res["bytes"] / (1 << 20), res["buckets"], res["bucket_mb"], res["ranks"]),
                "%.2f (busbw %.0f GB/s)" % (e.get("ms", 0), e.get("busbw_GBps", 0)),
                "raw NCCL %.2f/%.2f (%.0f/%.0f GB/s)" % (
                    r1.get("ms", 0), rc.get("ms", 0), r1.get("busbw_GBps", 0), rc.get("busbw_GBps", 0)),
                "%.2fx/%.2fx" % (1.0 / res["ratio_single"] if res.get("ratio_single") else 0,
                                 1.0 / res["ratio_chunked"] if res.get("ratio_chunked") else 0),
                "-", "-", "busbw %.2fx/%.2fx, gate %s" % (res.get("ratio_single", 0), res.get("ratio_chunked", 0),
                                                         res.get("status", "").upper())])
            notes.append("engine bw row: raw NCCL = one call of all bytes / calls of the engine's bucket sizes; "
                         "ratio = time engine/raw; busbw ratios engine/raw (gate: %s >= %g)" % (
                             res.get("gate"), res.get("min_ratio", 0.9)))
            goals.append(("engine busbw >= 0.9x raw NCCL",
                          "n/a (1 GPU: nothing crosses a link)" if res.get("ranks", 2) < 2 else
                          "PASS" if res.get("status") == "pass" else "FAIL",
                          "%.2fx vs bucket-size calls, %.2fx vs one call (gated: %s)" % (
                              res.get("ratio_chunked", 0), res.get("ratio_single", 0), res.get("gate"))))
        elif res and res.get("status") == "skip":
            table.append(["engine allreduce", "skipped: %s" % str(res.get("reason")).split(" (")[0],
                          "-", "-", "-", "-", "-"])
        else:
            table.append(["engine allreduce", status_text(eb) or "no result", "-", "-", "-", "-", "-"])

    # ---- goals ----
    def row(name):
        return thetad_rows.get(name, (None, None))

    ref_T = None
    for name, (rec, st) in thetad_rows.items():
        if rec.get("mode") == "resident":
            ref_T = rec.get("T")
    res_rec, res_st = row("thetad_T%s_resident" % ref_T)
    off_rec, off_st = row("thetad_T%s_offload" % ref_T)
    if res_st and res_st["step_ms"] and res_st["ddp"] and res_st["ddp"].get("step_ms_median"):
        r = res_st["step_ms"] / res_st["ddp"]["step_ms_median"]
        goals.append(("step time <= 0.5x DDP (reference, all-resident)", "PASS" if r <= 0.5 else "FAIL", "%.2fx" % r))
    for name, (rec, st) in thetad_rows.items():
        if not rec.get("dims") or not st["bytes_all"]:
            continue
        sh, pt = params_of(rec["dims"])
        T, W = int(rec["T"]), int(rec.get("np") or 1)
        # comm.grad_dtype bf16 puts 2 bytes per gradient element on the wire
        width = 2 if rec.get("grad_dtype") == "bf16" else 4
        expect = width * (sh + min(T, W) * pt)
        ok = st["bytes_all"] == [expect]
        goals.append(("bytes/step = Θ + active θ exactly, %d B per element (%s)" % (width, name), "PASS" if ok else "FAIL",
                      "expected %d, got %s" % (expect, ", ".join(str(b) for b in st["bytes_all"][:4]))))
    if res_st and res_st["step_ms"] and res_st["comm_wait_ms"] is not None:
        f = res_st["comm_wait_ms"] / res_st["step_ms"]
        goals.append(("comm_wait <= 10% of the step (reference)", "PASS" if f <= 0.1 else "FAIL",
                      "%.1f%% (%.2f of %.2f ms)" % (100 * f, res_st["comm_wait_ms"], res_st["step_ms"])))
    if off_st and off_st["ddp"]:
        dd = off_st["ddp"]
        if off_st["peak"] is not None and dd.get("peak_mem_bytes"):
            tp, dp, src = off_st["peak"], dd["peak_mem_bytes"], ""
        else:
            tp, dp, src = off_st["smi_peak"], dd.get("smi_peak"), " (smi)"
        if tp and dp:
            goals.append(("offload peak memory <= 0.4x DDP", "PASS" if tp / dp <= 0.4 else "FAIL",
                          "%.2fx%s" % (tp / dp, src)))
    if off_st and res_st and off_st["step_ms"] and res_st["step_ms"]:
        r = off_st["step_ms"] / res_st["step_ms"]
        goals.append(("offload step <= 1.1x all-resident", "PASS" if r <= 1.1 else "FAIL", "%.2fx" % r))
    big = [(int(rec["T"]), rec, st) for name, (rec, st) in thetad_rows.items()
           if rec.get("mode") == "offload" and rec.get("T") != ref_T]
    for T, rec, st in sorted(big, key=lambda x: x[0]):
        if st["step_ms"] and off_st and off_st["step_ms"]:
            thr = off_st["step_ms"] / st["step_ms"]
            dd = st["ddp"]
            goals.append(("T=%d offload throughput >= 0.9x T=%s" % (T, ref_T), "PASS" if thr >= 0.9 else "FAIL",
                          "%.2fx; DDP at T=%d: %s" % (thr, T, "OOM" if dd and dd.get("oom") else
                                                      ("%s ms" % ms(dd.get("step_ms_median")) if dd else "not run"))))
        elif st["step_ms"] is None:
            goals.append(("T=%d offload trains" % T, "FAIL" if rec.get("status") != "skipped" else "n/a",
                          status_text(rec) or "no metrics"))
    for name, (rec, st) in thetad_rows.items():
        if "loss_rel" in st:
            tol = LOSS_REL_TOL_BY_PRECISION.get(rec.get("precision", "fp32"), LOSS_REL_TOL)
            goals.append(("loss curve matches DDP (%s, first %d steps, rel <= %g)" % (name, LOSS_STEPS, tol),
                          "PASS" if st["loss_rel"] <= tol else "FAIL",
                          "max rel %.1e; the first %d steps within it" % (st["loss_rel"], st["loss_lead"])))

    sh = load_json(os.path.join(out, "store_h2d", "result.json"))
    if sh:
        goals.append(("store H2D >= 0.9x pinned cudaMemcpyAsync",
                      "PASS" if sh["ratio_min"] >= 0.9 else "FAIL",
                      "%.2fx (store %.1f GB/s, pinned %.1f GB/s, %d rank(s) at once)" %
                      (sh["ratio_min"], sh["store_gbs"], sh["pinned_gbs"], sh["ranks"])))
    if sh and sh.get("floor_step_ms") and off_st and res_st and off_st["step_ms"] and res_st["step_ms"]:
        # The store's per-step work alone (bench_store_h2d --floor-steps): no offloaded step can
        # beat max(all-resident step, floor) on this host; how close the offload step gets to it.
        fl = sh["floor_step_ms"]
        bound = max(res_st["step_ms"], fl)
        r = off_st["step_ms"] / bound
        goals.append(("offload step <= 1.1x max(all-resident, host floor)", "PASS" if r <= 1.1 else "FAIL",
                      "%.2fx; host floor %.2f ms (CPU AdamW %.2f ms, %.0f GB/s of host memory traffic), so "
                      "offload can reach at most %.2fx all-resident throughput on this host" %
                      (r, fl, sh.get("floor_adam_ms", 0), sh.get("floor_host_gbs", 0),
                       min(1.0, res_st["step_ms"] / fl))))

    ct = by_name.get("ctest_gpu")
    if ct is not None and ct.get("status") != "skipped":
        summary = ""
        try:
            with open(os.path.join(out, "ctest_gpu", "log.txt")) as f:
                for line in f:
                    if "tests passed" in line or "tests failed" in line:
                        summary = line.strip()
        except OSError:
            pass
        goals.insert(0, ("GPU tests (ctest -L gpu)", "PASS" if ct.get("status") == "ok" else "FAIL",
                         summary or status_text(ct) or "ok"))
    lines.append("goals:")
    for g, verdict, detail in goals:
        lines.append("  %-4s %s: %s" % (verdict, g, detail))
    if not goals:
        lines.append("  (nothing measured)")

    # ---- the table ----
    widths = [max(len(header[i]), max((len(r[i]) for r in table), default=0)) for i in range(len(header))]

    def fmt(cells):
        return " | ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip()

    text_table = [fmt(header), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in table]

    # Where a thetad step goes (rank 0, medians after warm-up; device times on GPUs).
    bd_head = ["config", "step", "forward", "backward", "comm_wait", "optimizer", "cpu_adam", "acquire_wait"]
    bd = []
    for name, (rec, st) in thetad_rows.items():
        if st.get("step_ms") is None:
            continue
        bd.append([label(rec)] + [ms(st.get(k)) for k in ("step_ms", "forward_ms", "backward_ms", "comm_wait_ms",
                                                          "optimizer_ms", "cpu_adam_ms", "acquire_wait_ms")])
    bd_md = []
    if bd:
        bd_md = ["", "Step breakdown (thetad rank 0, median ms after warm-up):", "",
                 "| " + " | ".join(bd_head) + " |", "|" + "|".join("---" for _ in bd_head) + "|"]
        bd_md += ["| " + " | ".join(r) + " |" for r in bd]
        notes.append("\n".join(bd_md[1:]))
    print("\n".join(lines))
    print()
    print("\n".join(text_table))
    for n in notes:
        print(n)

    md = ["# thetad vs PyTorch DDP (bench/gpu/run.sh)", ""]
    try:
        with open(os.path.join(out, "env.txt")) as f:
            md += ["```", f.read().rstrip(), "```", ""]
    except OSError:
        pass
    md.append("| " + " | ".join(header) + " |")
    md.append("|" + "|".join("---" for _ in header) + "|")
    for r in table:
        md.append("| " + " | ".join(c.replace("|", "/") for c in r) + " |")
    md += [""] + notes + ["", "Goals:", ""]
    md += ["- **%s** %s: %s" % (v, g, d) for g, v, d in goals] or ["- nothing measured"]
    md += ["", "Runs:", "", "```"] + lines[1:1 + len(runs)] + ["```", ""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
