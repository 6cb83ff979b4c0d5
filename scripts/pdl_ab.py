"""A/B of programmatic dependent launch for the small-M GEMMs on the GPU (one command).

    python scripts/pdl_ab.py --out DIR [--formats fp8_block] [--ms 1,16,64,128]

Runs ``blockscaled bench`` on the DeepSeek-V3 (N, K) shapes at the given M, op gemm, no
baselines (the copy-bandwidth roofline is still measured, for the memory-floor column), once per
variant of the environment switch of ops/gemm.py:
  off       BLOCKSCALED_PDL=0   (the default)
  pdl       BLOCKSCALED_PDL=1
and prints microseconds and % of the memory floor side by side (DIR/pdl_ab.md, one JSON per
variant). Each variant is a separate process: the switches are read at import.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
VARIANTS = {"off": {"BLOCKSCALED_PDL": "0"}, "pdl": {"BLOCKSCALED_PDL": "1"}}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--formats", default="fp8_block")
    p.add_argument("--ms", default="1,16,64,128")
    p.add_argument("--iterations", type=int, default=30)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ms = [int(x) for x in args.ms.split(",")]
    res = {}
    for name, env_add in VARIANTS.items():
        path = os.path.join(args.out, f"pdl_ab_{name}.json")
        cmd = [sys.executable, "-m", "blockscaled.bench", "--ops", "gemm", "--formats", args.formats,
               "--baselines", "none", "--iterations", str(args.iterations), "--warmup", "5", "--output", path]
        for m in ms:
            for n, k in NK:
                cmd += ["--custom", f"{m},{n},{k}"]
        env = dict(os.environ, **env_add)
        env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: bench exit {r.returncode}\n{r.stderr[-2000:]}")
            continue
        rows = json.load(open(path))
        rows = rows["rows"] if isinstance(rows, dict) else rows
        for row in rows:
            if row.get("op") == "gemm" and row.get("impl") == "blockscaled" and row.get("median_ms"):
                res.setdefault((row["format"], row["M"], row["N"], row["K"]), {})[name] = (
                    row["median_ms"] * 1e3, row.get("mem_floor_pct"), row.get("method"))
    names = list(VARIANTS)
    lines = ["| format | M | N | K | " + " | ".join(f"{n} us (% floor)" for n in names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for (fmt, m, n, k), v in sorted(res.items()):
        cells = []
        for name in names:
            if name in v:
                us, pct, meth = v[name]
                cells.append(f"{us:.1f} ({pct:.0f}%){'' if meth == 'graph' else ' ' + str(meth)}")
            else:
                cells.append("-")
        lines.append(f"| {fmt} | {m} | {n} | {k} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "pdl_ab.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
