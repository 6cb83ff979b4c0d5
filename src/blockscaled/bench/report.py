"""Reports: rich tables on the terminal, markdown summaries, json / csv result files, and the
committed-results layout (one append-only ``runs.jsonl`` per GPU plus ``latest/<suite>.md``).

Ratios are ``baseline time / our time``: above 1 means blockscaled is faster.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import statistics
from pathlib import Path

from . import layers as _layers
from . import model_suite as _model
from . import mx as _mx
from .env import gpu_slug

__all__ = [
    "ratio_stats",
    "bar_checks",
    "ab_pairs",
    "summary_rows",
    "print_report",
    "markdown_report",
    "write_results",
    "save_results_dir",
    "load_runs",
]

OURS = "blockscaled"


def _f(v, nd=3, pct=False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if pct:
        return f"{v:.0f}%"
    if isinstance(v, float):
        if v != 0 and abs(v) < 10 ** (-nd):
            return f"{v:.1e}"
        return f"{v:.{nd}f}"
    return str(v)


def ratio_stats(ratios: list[float]) -> dict:
    """min / median / geomean / max of positive finite ratios (empty dict if none)."""
    r = [x for x in ratios if x is not None and math.isfinite(x) and x > 0]
    if not r:
        return {}
    return {
        "n": len(r),
        "min": min(r),
        "median": statistics.median(r),
        "geomean": math.exp(sum(math.log(x) for x in r) / len(r)),
        "max": max(r),
    }


def _ok(row) -> bool:
    """Timed and not wrong: a row whose float64 check failed never enters a ratio (a fast wrong
    answer must not count, ours or a baseline's)."""
    return row.get("status") == "ok" and row.get("median_ms") is not None and row.get("check") != "FAIL"


def ab_pairs(rows: list[dict]) -> dict[str, list[dict]]:
    """{baseline: [{case, format, op, ours_ms, base_ms, ours_tflops, base_tflops, ratio}]}"""
    def key(r):
        return r.get("suite"), r.get("kind"), r["case"], r["format"], r["op"]

    ours = {key(r): r for r in rows if r["impl"] == OURS and _ok(r)}
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r["impl"] == OURS or not _ok(r):
            continue
        o = ours.get(key(r))
        if o is None:
            continue
        out.setdefault(r["impl"], []).append({
            "case": r["case"], "format": r["format"], "op": r["op"],
            "ours_ms": o["median_ms"], "base_ms": r["median_ms"],
            "ours_tflops": o.get("tflops"), "base_tflops": r.get("tflops"),
            "ours_gbps": o.get("gbps"), "base_gbps": r.get("gbps"),
            "ratio": r["median_ms"] / o["median_ms"] if o["median_ms"] > 0 else float("nan"),
        })
    return out


def summary_rows(rows: list[dict]) -> list[dict]:
    """One line per (case, format) of our ops: quant / main op / end-to-end side by side."""
    by: dict[tuple, dict] = {}
    order: list[tuple] = []
    for r in rows:
        if r["impl"] != OURS:
            continue
        key = (r.get("suite"), r.get("kind"), r["case"], r["format"])
        if key not in by:
            by[key] = {"case": r["case"], "format": r["format"], "M": r["M"], "N": r["N"], "K": r["K"],
                       "E": r.get("E", ""), "kind": r["kind"], "notes": []}
            order.append(key)
        s = by[key]
        slot = {"quantize": "quant", "linear": "e2e"}.get(r["op"], "main")
        s[slot] = r
        s["main_op"] = r["op"] if slot == "main" else s.get("main_op")
        if r.get("status") != "ok":
            s["notes"].append(f"{r['op']}: {r.get('note', '')}")
    return [by[k] for k in order]


def _cell(r, key, nd=3, pct=False):
    return _f(r.get(key), nd, pct) if r else "-"


def _check(r):
    if not r:
        return "-"
    if r.get("status") != "ok":
        return r.get("status", "?")
    c = r.get("check")
    if c is None:
        return "-"
    e = r.get("rel_err")
    if r.get("cosine") is not None:  # model rows: worst module error, logits cosine vs the simulated model
        return f"{c} mod {r.get('module_err', float('nan')):.1e} cos {r['cosine']:.5f}"
    return c if c == "bitwise" or e is None else f"{c} {e:.1e}"


def _summary_table_data(rows, timing: bool):
    head = ["case", "format", "quant ms", "op", "GEMM ms", "E2E ms", "GEMM TFLOP/s", "E2E TFLOP/s",
            "% roof", "mem floor %", "first call ms", "check", "E2E check", "tile"]
    body = []
    for s in summary_rows(rows):
        q, mn, e2 = s.get("quant"), s.get("main"), s.get("e2e")
        if s["kind"] == "quantize" or s["kind"] in _OWN_TABLES:  # suites with tables of their own
            continue
        body.append([
            s["case"], s["format"], _cell(q, "median_ms"), s.get("main_op") or "-",
            _cell(mn, "median_ms"), _cell(e2, "median_ms"), _cell(mn, "tflops", 1), _cell(e2, "tflops", 1),
            _cell(mn, "roof_pct", pct=True), _cell(mn, "mem_floor_pct", pct=True), _cell(mn, "first_call_ms", 1), _check(mn), _check(e2),
            (mn or {}).get("config") or "-",
        ])
    if not timing:  # correctness-only run: one line per op of ours, with the shape asked for
        head = ["case (ran)", "requested", "format", "op", "check", "note"]
        body = [[r["case"], _requested(r), r["format"], r["op"], _check(r), r.get("note", "")]
                for r in rows if r["impl"] == OURS and r["op"] != "quantize"]
    return head, body


def _requested(r) -> str:
    """The requested case a CPU row stands in for: 'same' where it ran as requested."""
    req = r.get("requested") or r["case"]
    return "same" if req == r["case"] else req


def _quant_table_data(rows, timing: bool):
    head = ["case", "format", "ms (p20-p80)", "GB/s", "% copy BW", "first call ms", "check"]
    body = []
    for r in rows:
        if r["impl"] != OURS or r["op"] != "quantize":
            continue
        spread = f"{_f(r.get('median_ms'))} ({_f(r.get('p20_ms'))}-{_f(r.get('p80_ms'))})" if r.get("median_ms") else "-"
        body.append([r["case"], r["format"], spread, _f(r.get("gbps"), 0), _f(r.get("mem_floor_pct"), pct=True),
                     _f(r.get("first_call_ms"), 1), _check(r)])
    if not timing:
        head = ["case (ran)", "requested", "format", "check"]
        body = [[r["case"], _requested(r), r["format"], _check(r)]
                for r in rows if r["impl"] == OURS and r["op"] == "quantize"]
    return head, body


def _ab_table_data(pairs: list[dict]):
    head = ["case", "format", "op", "ours ms", "base ms", "ours rate", "base rate", "ratio"]
    body = []
    for p in pairs:
        tp = "tflops" if p["op"] != "quantize" else "gbps"
        body.append([p["case"], p["format"], p["op"], _f(p["ours_ms"]), _f(p["base_ms"]),
                     _f(p[f"ours_{tp}"], 1), _f(p[f"base_{tp}"], 1), f"{p['ratio']:.3g}x"])
    st = ratio_stats([p["ratio"] for p in pairs])
    foot = (f"rate: TFLOP/s (GB/s for quantize); ratio = baseline time / ours (> 1: blockscaled faster); over {st['n']} configs: "
            f"min={st['min']:.2f}x  median={st['median']:.2f}x  geomean={st['geomean']:.2f}x  max={st['max']:.2f}x"
            if st else "no comparable configs")
    return head, body, foot


def bar_checks(rows: list[dict]) -> list[list[str]]:
    """The bar (docs/design.md, "The bar"), checked on whatever this run measured:
    [criterion, measured, target, verdict] (criteria without data are left out)."""
    out = []
    pairs = ab_pairs(rows)
    ours = [r for r in rows if r["impl"] == OURS and _ok(r)]

    def verdict(ok):
        return "PASS" if ok else "MISS"

    def ab(base, pred):
        return [p for p in pairs.get(base, []) if pred(p)]

    def m_of(p):
        return next((r["M"] for r in ours if r["case"] == p["case"] and r["format"] == p["format"]), None)

    big = ab("cublas-fp8-block", lambda p: p["op"] == "gemm" and p["format"] == "fp8_block" and (m_of(p) or 0) >= 4096)
    if big:
        g = ratio_stats([p["ratio"] for p in big])["geomean"]
        out.append(["fp8_block GEMM, M>=4096 vs cuBLAS fp8_block (geomean)", f"{g:.2f}x", ">= 1.25x", verdict(g >= 1.25)])
    dg = ab("deepgemm", lambda p: p["op"] in ("gemm", "grouped"))
    if dg:
        mn = min(p["ratio"] for p in dg)
        out.append(["vs DeepGEMM, every row (min ratio)", f"{mn:.2f}x", ">= 1.00x", verdict(mn >= 1.0)])
    # issue 19's targets on its broad shape set (the ``families`` suite): per M band the geomean against
    # DeepGEMM >= 1.0 and no row below 0.9; at M >= 2048 >= 1.1x cuBLAS fp8_block (geomean)
    fam_m = {(r["case"], r["format"]): r["M"] for r in ours if r.get("suite") == "families" and r["op"] == "gemm"}
    for base, tgt, worst_tgt in (("deepgemm", 1.0, 0.9), ("cublas-fp8-block", 1.1, None)):
        sel = [p for p in pairs.get(base, []) if p["op"] == "gemm" and (p["case"], p["format"]) in fam_m]
        bands = sorted({fam_m[(p["case"], p["format"])] for p in sel})
        for m in bands:
            if worst_tgt is None and m < 2048:
                continue
            rs = [p["ratio"] for p in sel if fam_m[(p["case"], p["format"])] == m]
            st = ratio_stats(rs)
            if not st:
                continue
            ok = st["geomean"] >= tgt and (worst_tgt is None or st["min"] >= worst_tgt)
            target = f">= {tgt:.2f}x" + (f"; >= {worst_tgt:.2f}x" if worst_tgt is not None else "")
            out.append([f"families fp8_block GEMM M={m} vs {base} (geomean; worst of {st['n']})",
                        f"{st['geomean']:.2f}x; {st['min']:.2f}x", target, verdict(ok)])
    small = [r for r in ours if r["op"] == "gemm" and r["kind"] == "gemm" and r["M"] <= 128 and r.get("mem_floor_pct")]
    for fmts, tgt, label in ((("fp8_block",), 85.0, "fp8_block"), (("mxfp8", "mxfp4", "nvfp4"), 80.0, "MX/NV")):
        sel = [r for r in small if r["format"] in fmts]
        if sel:
            lo = min(r["mem_floor_pct"] for r in sel)
            out.append([f"{label} GEMM, M<=128: % of memory floor (worst of {len(sel)})", f"{lo:.0f}%", f">= {tgt:.0f}%", verdict(lo >= tgt)])
    mx = ab("cublas-bf16", lambda p: p["op"] == "gemm" and p["format"] != "fp8_block" and (m_of(p) or 0) >= 4096)
    if mx:
        mn = min(p["ratio"] for p in mx)
        out.append(["MX/NV GEMM, M>=4096 vs cuBLAS bf16 (worst)", f"{mn:.2f}x", ">= 1.00x", verdict(mn >= 1.0)])
    moe = ab("torch-loop", lambda p: p["op"] == "grouped")
    if moe:
        g = ratio_stats([p["ratio"] for p in moe])["geomean"]
        out.append(["MoE grouped vs per-expert cuBLAS loop (geomean)", f"{g:.2f}x", ">= 2.00x", verdict(g >= 2.0)])
    for r in ours:
        if r["op"] == "quantize" and r.get("mem_floor_pct") is not None and "target" in str(r.get("tags", "")):
            gb = r.get("gbps") or 0.0
            out.append([f"quantize {r['format']} {r['case']}: GB/s (bytes read + written)",
                        f"{gb:.0f} GB/s = {r['mem_floor_pct']:.0f}% copy", ">= 2500 GB/s and >= 85%",
                        verdict(gb >= 2500 and r["mem_floor_pct"] >= 85)])
    return out


#: the header of a result without timings (no GPU: the correctness part through the interpreter)
CPU_MODE_LINE = ("CPU run through the Triton interpreter (TRITON_INTERPRET=1): correctness checks only, "
                 "no timings (interpreter speed says nothing about GPU speed; timings need a CUDA GPU)")


def _env_lines(result: dict) -> list[str]:
    env = result.get("env", {})
    if not result.get("timing", True) or env.get("device") == "cpu":
        lines = [
            CPU_MODE_LINE,
            f"CPU: {env.get('cpu', '?')}  torch {env.get('torch')}  triton {env.get('triton')}  "
            f"python {env.get('python', '?')}  git {env.get('git_rev')}",
        ]
        shapes = result.get("shapes") or []
        scaled = [s for s in shapes if s.get("scaled")]
        if scaled:
            lines.append(f"shapes: {len(scaled)} of {len(shapes)} cases ran scaled down (requested -> ran in the "
                         f"tables): {result.get('shapes_reason', '')}".rstrip(": "))
        return lines
    lines = [
        f"GPU: {env.get('gpu')}  (sm {env.get('sm') or '-'}, {env.get('num_sms') or '-'} SMs, L2 {env.get('l2_mb')} MB)  driver {env.get('driver')}",
        f"CUDA {env.get('cuda')}  torch {env.get('torch')}  triton {env.get('triton')}  git {env.get('git_rev')}",
    ]
    rl = result.get("roofline") or {}
    if rl:
        lines.append(
            "roofline (measured this run): copy {} GB/s, cuBLAS bf16 8192^3 {} TFLOP/s, cuBLAS FP8 8192^3 {} TFLOP/s".format(
                _f(rl.get("copy_gbps"), 0), _f(rl.get("bf16_tflops"), 0), _f(rl.get("fp8_tflops"), 0)))
    a = result.get("args", {})
    if a and result.get("timing", True):
        r = a.get("rounds") or 1
        how = (f"median over {r} interleaved rounds (ours and the baselines of a case in turn) of the median of "
               f"~{max(5, -(-a.get('iterations', 0) // r))} samples each" if r > 1
               else f"median of {a.get('iterations')} samples")
        lines.append(f"timing: {how} after {a.get('warmup')} warm-up calls, "
                     "CUDA-graph replay (or events), inputs rotated beyond 2x L2; first call shown apart")
    return lines


def print_report(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    rows = result["rows"]
    timing = result.get("timing", True)
    console.rule("[bold]blockscaled bench")
    for line in _env_lines(result):
        console.print(line)

    def show(title, head, body, caption=None):
        if not body:
            return
        t = Table(title=title, caption=caption, show_lines=False, header_style="bold")
        for i, h in enumerate(head):
            t.add_column(h, justify="left" if i < 2 else "right", overflow="fold")
        for b in body:
            t.add_row(*[str(c) for c in b])
        console.print(t)

    show("Quantize", *_quant_table_data(rows, timing))
    show("Summary (blockscaled)" if timing else "Correctness (blockscaled vs float64 reference)", *_summary_table_data(rows, timing))
    for base, pairs in ab_pairs(rows).items():
        head, body, foot = _ab_table_data(pairs)
        show(f"A/B vs {base}", head, body, caption=foot)
    show("The bar (docs/design.md)", ["criterion", "measured", "target", "verdict"], bar_checks(rows))
    if timing:
        for title, head, body, caption in _own_tables(rows):
            show(title, head, body, caption=caption)
    errs = [r for r in rows if r.get("status") == "error"]
    for r in errs:
        console.print(f"[red]error[/red] {r['impl']} {r['op']} {r['format']} {r['case']}: {r['note']}")
    for n in result.get("notes", []):
        console.print(f"[dim]note: {n}[/dim]")


_MX_TITLES = (("mx", "MX suite: dense (issue 18 targets)"), ("mx-moe", "MX suite: MoE (issue 18 targets)"))
_OWN_TABLES = _mx.KINDS + _layers.KINDS + _model.KINDS


def _tally(c: dict) -> str:
    return f"{c['PASS']} PASS, {c['MISS']} MISS, {c['FAIL']} FAIL"


def _layer_caption(rows) -> str:
    return (f"glue target (T <= {_layers.GLUE_DECODE_T}): {_tally(_layers.verdict_counts(rows))}; ratios: "
            "bf16 layer graph time / ours (> 1: blockscaled faster); glue: 1 - expert work alone / whole layer "
            "(graph times); % floor: the routed experts' quantized weights + router + input + output at the copy "
            "bandwidth measured in this run")


def _model_caption(rows) -> str:
    return (f"decode targets: {_tally(_model.verdict_counts(rows))}; tokens/s from graph replays "
            "(prefill, decode) or generate's eager per-token time; vs bf16: bf16 model time / ours; "
            f"{_model.MODEL_LAYERS} decoder layers, vocabulary cut in proportion (bench/model_suite.py)")


def _own_tables(rows):
    """(title, head, body, caption) of the suites with tables of their own, for timed runs."""
    out = [(title, *_mx.table(rows, kind), _mx_caption(rows)) for kind, title in _MX_TITLES]
    out.append(("MoE layer (issue 20)", *_layers.table(rows), _layer_caption(rows)))
    out.append(("Model tokens/s (issue 20)", *_model.table(rows), _model_caption(rows)))
    return out


def _mx_caption(rows) -> str:
    c = _mx.verdict_counts(rows)
    return (f"targets: {_tally(c)} (check or error), {c['-']} without a "
            "target or a measurement; ratios: baseline graph time / ours (> 1: blockscaled faster); eager: wall "
            "clock per back-to-back call; % floor: quantized weight + activation + output bytes at the copy "
            "bandwidth measured in this run")


def _md_table(head, body) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in b) + " |" for b in body]
    return "\n".join(out)


def markdown_report(result: dict, title: str = "blockscaled bench") -> str:
    rows = result["rows"]
    timing = result.get("timing", True)
    parts = [f"# {title}", "", f"Date: {result.get('date', '')}  "]
    if result.get("id"):  # a record of runs.jsonl: name it, so the summary leads back to its rows
        parts.append(f"Run: `{result['id']}` (one line of runs.jsonl)  ")
    parts += [f"Command: `{result.get('command', '')}`", ""]
    parts += [f"- {l}" for l in _env_lines(result)] + [""]
    h, b = _quant_table_data(rows, timing)
    if b:
        parts += ["## Quantize", "", _md_table(h, b), ""]
    h, b = _summary_table_data(rows, timing)
    if b:
        title = "Summary (blockscaled)" if timing else "Correctness (blockscaled vs float64 reference)"
        parts += [f"## {title}", "", _md_table(h, b), ""]
    for base, pairs in ab_pairs(rows).items():
        h, b, foot = _ab_table_data(pairs)
        parts += [f"## A/B vs {base}", "", _md_table(h, b), "", f"**{foot}**", ""]
    bar = bar_checks(rows)
    if bar:
        parts += ["## The bar (docs/design.md)", "", _md_table(["criterion", "measured", "target", "verdict"], bar), ""]
    if timing:
        for title, h, b, caption in _own_tables(rows):
            if b:
                parts += [f"## {title}", "", _md_table(h, b), "", f"**{caption}**", ""]
    errs = [r for r in rows if r.get("status") == "error"]
    if errs:
        parts += ["## Errors", ""] + [f"- {r['impl']} {r['op']} {r['format']} {r['case']}: {r['note']}" for r in errs] + [""]
    if result.get("notes"):
        parts += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(parts)


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_results(result: dict, path: str) -> None:
    """``.json``: the whole result (env, roofline, args, notes, rows); ``.csv``: the rows."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".csv":
        keys: list[str] = []
        for r in result["rows"]:
            keys += [k for k in r if k not in keys]
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in result["rows"]:
                w.writerow({k: _jsonable(r.get(k)) for k in keys})
    elif p.suffix == ".md":
        p.write_text(markdown_report(result))
    else:
        clean = dict(result)
        clean["rows"] = [{k: _jsonable(v) for k, v in r.items()} for r in result["rows"]]
        p.write_text(json.dumps(clean, indent=1, default=str))


def _clean(v):
    """``v`` with non-finite floats as None (strict JSON has no NaN / inf), at any depth."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


RUNS_FILE = "runs.jsonl"
LATEST_DIR = "latest"


def _first_gpu(runs: Path) -> str | None:
    """The GPU named by the first record of a runs file (None when unreadable or empty)."""
    try:
        with open(runs) as f:
            line = f.readline()
        return json.loads(line).get("env", {}).get("gpu") if line.strip() else None
    except (OSError, ValueError, AttributeError):
        return None


def _gpu_dir(root: Path, gpu: str | None) -> Path:
    """The folder of ``root`` that holds this GPU's runs: an existing one whose runs.jsonl starts
    with a run on the same GPU (committed folders carry short names such as ``h100``), else
    ``root/<gpu_slug>``."""
    if gpu and root.is_dir():
        for d in sorted(root.iterdir()):
            if (d / RUNS_FILE).is_file() and _first_gpu(d / RUNS_FILE) == gpu:
                return d
    return root / gpu_slug(gpu)


def _unique_id(runs: Path, rid: str) -> str:
    """``rid``, or ``rid-2``, ``rid-3``, ... when ``runs`` already holds it: a suite run in parts
    (``--skip`` / ``--limit``) starts several runs within one minute, and their ids named the same
    minute (two moe-layer parts of 2026-11-29 15:26 did)."""
    if not runs.is_file():
        return rid
    taken = set()
    with open(runs) as f:
        for line in f:
            if line.startswith('{"id":"'):
                taken.add(line[7:line.index('"', 7)])
    n, out = 1, rid
    while out in taken:
        n += 1
        out = f"{rid}-{n}"
    return out


def save_results_dir(result: dict, root: str, suite: str) -> tuple[str, str]:
    """Record a bench run in the committed-results layout and return ``(summary, runs)`` paths.

    Appends the run as one JSON line to ``root/<gpu>/runs.jsonl`` (its ``id`` is
    ``<suite>-<YYYYmmdd-HHMM>`` of the run's date, with ``-2``, ``-3`` ... where that id is taken; ``suite`` the label given here, then the
    result's own fields: date, command, args, env, roofline, notes, rows) and rewrites
    ``root/<gpu>/latest/<suite>.md`` with the markdown report of this run. Earlier lines are
    never rewritten: the file is the history, ``latest/`` the newest run of each suite.
    """
    when = result.get("date")
    try:
        stamp = _dt.datetime.fromisoformat(when) if when else None
    except (TypeError, ValueError):
        stamp = None
    stamp = stamp or _dt.datetime.now(_dt.timezone.utc)
    d = _gpu_dir(Path(root), result.get("env", {}).get("gpu"))
    (d / LATEST_DIR).mkdir(parents=True, exist_ok=True)
    runs = d / RUNS_FILE
    rid = _unique_id(runs, result.get("id") or f"{suite}-{stamp.strftime('%Y%m%d-%H%M')}")
    record = {"id": rid, "suite": suite}
    record.update(_clean({k: v for k, v in result.items() if k not in ("id", "suite")}))
    line = json.dumps(record, separators=(",", ":"), default=str, allow_nan=False)
    with open(runs, "a") as f:
        f.write(line + "\n")
    md = d / LATEST_DIR / f"{suite}.md"
    md.write_text(markdown_report(record, title=f"blockscaled bench: {suite}"))
    return str(md), str(runs)


def load_runs(path: str | Path, suite: str | None = None) -> list[dict]:
    """The bench runs recorded in a ``runs.jsonl`` file, in the order they were saved.

    ``path`` is the file or the GPU folder that holds it (e.g. ``benchmarks/results/h100``).
    Each run is a dict as the bench's ``--output FILE.json`` writes it (date, command, args, env,
    roofline, notes, rows) plus ``id`` and ``suite``; ``suite`` keeps only the runs saved under
    that label (``"deepseek"``, ``"moe"``, ...). Blank lines are skipped.
    """
    p = Path(path)
    if p.is_dir():
        p = p / RUNS_FILE
    runs = []
    with open(p) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if suite is None or rec.get("suite") == suite:
                    runs.append(rec)
    return runs
