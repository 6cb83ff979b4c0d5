"""Programmatic Dependent Launch (PDL) of the portable GEMM kernel (kernels/triton/gemm.py).

On sm_90+ the launcher (ops/gemm.py::_use_pdl) launches ``gemm_kernel`` with ``PDL=True`` and
``launch_pdl=True``: the kernel runs ``griddepcontrol.wait`` before its first global memory
access and ``griddepcontrol.launch_dependents`` right after. Checked here:
  * CPU / interpreter: the switch (``BLOCKSCALED_PDL``, ``ops.gemm.PDL``) changes nothing, the
    interpreter never gets PDL (it cannot run griddepcontrol), the guard logic of ``_use_pdl``;
  * AOT (sm_90, no GPU): the PTX has the two instructions with PDL=True (none without), the wait
    comes before every global memory instruction in the PTX and (cuobjdump) in the SASS;
  * GPU (``gpu``): bitwise-identical outputs with PDL on and off, eager and in CUDA graphs of
    20 back-to-back calls, and in dependency chains (quantize(out_i) -> gemm; gemm -> gemm with
    a dense weight-only A) where every launch consumes its predecessor's output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import blockscaled.ops.gemm as gemm_mod
from blockscaled._checks import INTERPRET
from blockscaled.config import GemmConfig
from blockscaled.ops.gemm import gemm
from blockscaled.reference import gemm as ref_gemm_mod
from blockscaled.reference.quantize import quantize as ref_quantize
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close, assert_no_nan_survivors

from _aot import GEMM_SIG, SRC, run_compile_script


def _weights(n, k, fmt, device, seed=1, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * scale).to(device)
    return ref_quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def _acts(m, k, fmt, device, seed=0):
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device=device, seed=seed)
    return ref_quantize(x, fmt)


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _assert_bitwise(x, y, what=""):
    assert x.shape == y.shape and x.dtype == y.dtype, what
    bad = (_bits(x) != _bits(y)).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} elements differ, first at {bad[0].tolist()}"


class _LaunchSpy:
    """Stands in for ``gemm_mod.gemm_kernel``: records each launch's PDL keywords, then launches."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches: list[tuple[bool, bool]] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((kwargs.get("PDL", False), kwargs.get("launch_pdl", False)))
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.fixture
def spy(monkeypatch):
    s = _LaunchSpy(gemm_mod.gemm_kernel)
    monkeypatch.setattr(gemm_mod, "gemm_kernel", s)
    return s


# --------------------------------------------------------------------------- CPU / interpreter
def _cpu_cases(fmt):
    """(config, what): unsplit, fused split-K, swap-AB + split-K (small interpreter tiles)."""
    bk = 128 if fmt == "fp8_block" else 32
    base = GemmConfig(block_m=16, block_n=64, block_k=bk, num_warps=4, num_stages=2, split_k=1, promote=True)
    return [(base, "split1"), (base.replace(split_k=3), "split3"),
            (base.replace(split_k=3, swap_ab=True), "swap_split3")]


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_switch_does_not_change_results(fmt, device, monkeypatch, spy):
    """PDL switch on / off: bitwise-equal outputs, close to the float64 reference; in the
    interpreter no launch carries PDL (griddepcontrol cannot run there); on sm_90+ all do."""
    m, n, k = 5, 150, 300  # odd M / N, K not a multiple of the 128 block (3 chunks: 3 splits)
    a = _acts(m, k, fmt, device)
    b = _weights(n, k, fmt, device)
    bias = torch.randn(n, device=device)
    ref = ref_gemm_mod.gemm(a, b, bias=bias)
    for cfg, what in _cpu_cases(fmt):
        outs = {}
        for on in (True, False):
            monkeypatch.setattr(gemm_mod, "PDL", on)
            spy.launches.clear()
            out = torch.full((m, n), float("nan"), dtype=torch.float32, device=device)
            gemm(a, b, torch.float32, out=out, config=cfg, bias=bias)
            assert_no_nan_survivors(out)
            assert_gemm_close(out, ref, fmt, torch.float32, what=f"{what} PDL={on}")
            want = on and gemm_mod._use_pdl(out.device)
            assert spy.launches == [(want, want)], (what, on, spy.launches)
            outs[on] = out
        _assert_bitwise(outs[True], outs[False], what)
    if device == "cpu":
        assert not gemm_mod._use_pdl(torch.device("cpu"))


def test_default_path_unchanged(device, monkeypatch):
    """The planner's path (no forced config), weight-only bf16 A included: same bits with the
    switch on and off."""
    m, n, k = 3, 96, 256
    b = _weights(n, k, "fp8_block", device)
    for a in (_acts(m, k, "fp8_block", device), randn_like_activations(m, k, dtype=torch.bfloat16, device=device)):
        ys = []
        for on in (True, False):
            monkeypatch.setattr(gemm_mod, "PDL", on)
            ys.append(gemm(a, b, torch.float32))
        _assert_bitwise(ys[0], ys[1], type(a).__name__)


def test_use_pdl_guards(monkeypatch):
    """PDL needs the switch, a compiled (not interpreted) kernel, a CUDA device and sm_90+."""
    assert gemm_mod._GEMM_COMPILED == (not INTERPRET)
    assert not gemm_mod._use_pdl(torch.device("cpu"))
    cuda0 = torch.device("cuda", 0)
    seen = []

    def capable(index):
        seen.append(index)
        return index == 0

    monkeypatch.setattr(gemm_mod, "_pdl_capable", capable)
    monkeypatch.setattr(gemm_mod, "_GEMM_COMPILED", True)
    monkeypatch.setattr(gemm_mod, "PDL", True)
    assert gemm_mod._use_pdl(cuda0)
    assert not gemm_mod._use_pdl(torch.device("cuda", 1))  # an older GPU
    assert seen == [0, 1]
    monkeypatch.setattr(gemm_mod, "PDL", False)
    assert not gemm_mod._use_pdl(cuda0)
    monkeypatch.setattr(gemm_mod, "PDL", True)
    monkeypatch.setattr(gemm_mod, "_GEMM_COMPILED", False)  # the interpreter
    assert not gemm_mod._use_pdl(cuda0)
    assert seen == [0, 1]  # no capability query when the switch / interpreter rules it out


def test_capability_query_is_cached():
    assert hasattr(gemm_mod._pdl_capable, "cache_info"), "_pdl_capable must be lru_cached (host overhead)"


@pytest.mark.parametrize("value,want", [(None, False), ("1", True), (" 1 ", True), ("0", False)])
def test_env_switch(value, want):
    """BLOCKSCALED_PDL=1 in the environment (read at import) turns PDL on; default off."""
    env = {k: v for k, v in os.environ.items() if k != "BLOCKSCALED_PDL"}
    if value is not None:
        env["BLOCKSCALED_PDL"] = value
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", "import blockscaled.ops.gemm as g; print(g.PDL)"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == str(want)


# --------------------------------------------------------------------------- AOT (sm_90)
AOT_SCRIPT = GEMM_SIG + r'''
import json, re, shutil, subprocess, tempfile, os
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.gemm import gemm_kernel

TGT = GPUTarget("cuda", 90, 32)
DIV16 = ("K", "N", "stride_am", "stride_bn", "stride_cm", "stride_cs", "k_per_split")
SDT = {0: "*fp32", 1: "*u8"}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
CUOBJDUMP = os.path.join(BIN, "cuobjdump")
# global memory instructions (PTX): loads, stores, atomics / reductions, async copies, prefetches
PTX_MEM = re.compile(r"(?<![\w.])(ld\.global|st\.global|atom\.|red\.|cp\.async\.(ca|cg|bulk)|prefetch\.global"
                     r"|prefetchu?\.L2|ld\.volatile\.global|ld\.relaxed|ld\.acquire)")
SASS_MEM = re.compile(r"\b(LDG|STG|LDGSTS|ATOMG|ATOM|RED|UBLKCP|UTMALDG|CCTL)\b")

def comp(fmt, pdl, split, swap, bm, bn, bk, promote, stages=4):
    sig = gemm_sig("*fp8e4nv", SDT[fmt], "*fp8e4nv", "*bf16", split, ("SWAP_AB", "PDL"))
    const = {"stride_ak": 1, "stride_ask": 1, "stride_bk": 1, "stride_bsk": 1, "stride_cn": 1,
             "A_FMT": fmt, "B_FMT": fmt, "B_SCALE_ROWS": 128 if fmt == 0 else 1, "PROMOTE": promote,
             "DOT_DTYPE": tl.float8e4nv if promote else tl.bfloat16, "EVEN_K": True, "HAS_BIAS": True,
             "SPLIT_K": split, "GROUP_M": 8, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
             "SWAP_AB": swap, "PDL": pdl}
    if split == 1:
        const.update(ws_ptr=None, cnt_ptr=None)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t != "constexpr" and (t.startswith("*") or n in DIV16)}
    k = triton.compile(triton.compiler.ASTSource(fn=gemm_kernel, signature=sig, constexprs=const, attrs=attrs),
                       target=TGT, options={"num_warps": 4, "num_stages": stages, "launch_pdl": pdl})
    ptx = k.asm["ptx"]
    lines = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    idx = lambda pat: [i for i, ln in enumerate(lines) if re.search(pat, ln)]
    mem = [i for i, ln in enumerate(lines) if PTX_MEM.search(ln)]
    res = {"name": k.name, "launch_pdl": bool(k.metadata.launch_pdl),
           "wait": idx(r"\bgriddepcontrol\.wait\b"), "dependents": idx(r"\bgriddepcontrol\.launch_dependents\b"),
           "first_mem": mem[:1], "n_mem": len(mem),
           "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", ptx)))}
    res["wait_line"] = lines[res["wait"][0]] if res["wait"] else None
    res["dependents_line"] = lines[res["dependents"][0]] if res["dependents"] else None
    res["first_mem_line"] = lines[mem[0]] if mem else None
    if os.path.exists(CUOBJDUMP):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "k.cubin")
            open(p, "wb").write(k.asm["cubin"])
            sass = subprocess.run([CUOBJDUMP, "-sass", p], capture_output=True, text=True).stdout
        ins = [ln.split("*/", 1)[1].split(";")[0].strip() for ln in sass.splitlines()
               if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
        res["sass_acqbulk"] = [i for i, s in enumerate(ins) if s.split()[:1] == ["ACQBULK"]]
        res["sass_preexit"] = [i for i, s in enumerate(ins) if s.split()[:1] == ["PREEXIT"]]
        smem = [i for i, s in enumerate(ins) if SASS_MEM.search(s.split()[0] if s.split() else "")
                or (s.split()[:1] and s.split()[0].split(".")[0] in ("LDG", "STG", "LDGSTS", "ATOMG", "RED"))]
        res["sass_first_mem"] = smem[:1]
        res["sass_first_mem_ins"] = ins[smem[0]] if smem else None
        res["sass_n"] = len(ins)
    return res

out = {}
# fp8_block decode (the portable M <= 32 tile: swap-AB 16x64, split-K 8), a 64x64 split-K
# tile, an unsplit tile; mxfp8 promote (FP8 wgmma) and dequantizing (bf16 wgmma) tiles
CASES = {"fp8_swap_sk8": (0, 8, True, 16, 64, 128, True), "fp8_64x64_sk4": (0, 4, False, 64, 64, 128, True),
         "fp8_64x64_sk1": (0, 1, False, 64, 64, 128, True), "mx8_swap_sk16": (1, 16, True, 16, 128, 32, True),
         "mx8_dequant_sk1": (1, 1, False, 64, 128, 128, False)}
for name, (fmt, split, swap, bm, bn, bk, promote) in CASES.items():
    for pdl in (True, False):
        out[f"{name}_pdl{int(pdl)}"] = comp(fmt, pdl, split, swap, bm, bn, bk, promote,
                                            stages=6 if bk == 32 else 4 if promote else 3)
print("JSON" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def aot():
    return run_compile_script(AOT_SCRIPT)


AOT_CASES = ["fp8_swap_sk8", "fp8_64x64_sk4", "fp8_64x64_sk1", "mx8_swap_sk16", "mx8_dequant_sk1"]


@pytest.mark.parametrize("case", AOT_CASES)
def test_aot_ptx_has_griddepcontrol(aot, case):
    """sm_90 PTX of gemm_kernel: PDL=True has exactly one ``griddepcontrol.wait`` and one
    ``griddepcontrol.launch_dependents``, the wait before the launch trigger and before every
    global memory instruction; the launch metadata carries launch_pdl. PDL=False has neither."""
    on, off = aot[f"{case}_pdl1"], aot[f"{case}_pdl0"]
    assert on["launch_pdl"] and not off["launch_pdl"]
    assert on["name"].endswith("_pdl") and not off["name"].endswith("_pdl")
    assert len(on["wait"]) == 1 and len(on["dependents"]) == 1, on
    # triton 3.9 prints "griddepcontrol.wait ;" (a space before the semicolon)
    assert re.match(r"griddepcontrol\.wait\s*;", on["wait_line"]), on["wait_line"]
    assert re.match(r"griddepcontrol\.launch_dependents\s*;", on["dependents_line"]), on["dependents_line"]
    assert on["n_mem"] > 0 and on["first_mem"], on
    assert on["wait"][0] < on["dependents"][0] < on["first_mem"][0], (on["wait_line"], on["first_mem_line"])
    assert off["wait"] == [] and off["dependents"] == [], off
    assert off["wait_line"] is None and off["n_mem"] == on["n_mem"]
    assert on["wgmma"] == off["wgmma"] and on["wgmma"], on["wgmma"]  # same MMA code otherwise
    if case.startswith("fp8") or "swap" in case:
        assert any("e4m3" in w for w in on["wgmma"]), on["wgmma"]


@pytest.mark.parametrize("case", AOT_CASES)
def test_aot_sass_waits_before_global_memory(aot, case):
    """ptxas keeps the order: SASS ``ACQBULK`` (griddepcontrol.wait) precedes the first global
    memory instruction (LDG / LDGSTS / STG / ATOMG / RED); ``PREEXIT`` (launch_dependents) is
    present; neither appears without PDL."""
    on, off = aot[f"{case}_pdl1"], aot[f"{case}_pdl0"]
    if "sass_acqbulk" not in on:
        pytest.skip("cuobjdump not shipped with this triton")
    assert len(on["sass_acqbulk"]) == 1 and len(on["sass_preexit"]) == 1, on
    assert on["sass_first_mem"], on
    assert on["sass_acqbulk"][0] < on["sass_first_mem"][0], on["sass_first_mem_ins"]
    assert on["sass_preexit"][0] < on["sass_first_mem"][0], on["sass_first_mem_ins"]
    assert off["sass_acqbulk"] == [] and off["sass_preexit"] == []


# --------------------------------------------------------------------------- GPU
#: (fmt, N, K) for the GPU tests: the DeepSeek-V3 q_a/kv_a projection (15 MB of fp8 weights,
#: ~5 us memory floor on the H100) and one mxfp8 shape
GPU_SHAPES = [("fp8_block", 2112, 7168), ("mxfp8", 4096, 7168)]


def _gpu_weights(fmt, n, k, seed=1):
    # std 1/sqrt(K): outputs keep the inputs' magnitude along a chain
    return _weights(n, k, fmt, "cuda", seed=seed, scale=k ** -0.5)


def _forced_configs(fmt, m):
    """The planner's portable plan (None) plus a forced fused split-K tile and a forced swap-AB split-K tile."""
    bk = 128 if fmt == "fp8_block" else 32
    st = 4 if bk == 128 else 6
    split = GemmConfig(block_m=64, block_n=64, block_k=bk, num_warps=4, num_stages=st, split_k=4, promote=True)
    swap = split.replace(block_m=16, split_k=8, swap_ab=True)
    return [None, split, swap] if m <= 64 else [None, split]


def _need_pdl(monkeypatch):
    # the tests switch gemm_mod.PDL themselves (it is off by default)
    if not (gemm_mod._GEMM_COMPILED and gemm_mod._pdl_capable(torch.cuda.current_device())):
        pytest.skip("PDL needs a compiled kernel on sm_90+")
    # PDL is a property of the portable kernel: keep the planner's default plans (config None) on
    # it, so every call below launches gemm_kernel whatever kernel the cost model prefers
    from blockscaled.plan import mx_gemv
    from blockscaled.plan.dense import plan_fp8

    # nor the MX / NV decode GEMV (on by default at M <= MX_GEMV_ROWS); the planner is asked
    # uncached (__wrapped__) so that no plan made with it off stays in its cache
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ENABLED", False)
    real = gemm_mod.plan_gemm.__wrapped__

    def portable_plan(p, dev, forced=None, *, gluon_ok=True):
        if forced is None and dev.is_hopper and p.fmt == "fp8_block" and not p.weight_only:
            return plan_fp8(p, dev, hopper=False, forced_strategy="triton")
        return real(p, dev, forced, gluon_ok=False)

    monkeypatch.setattr(gemm_mod, "plan_gemm", portable_plan)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 64, 128))
@pytest.mark.parametrize("fmt,n,k", GPU_SHAPES, ids=lambda v: str(v))
def test_gpu_pdl_bitwise_eager_and_graph(fmt, n, k, m, monkeypatch, spy):
    """PDL on vs off: bitwise-identical outputs, eagerly and in a CUDA graph of 20 back-to-back
    independent calls (planner + forced split-K / swap-AB configs in turn, 20 different
    activations, 20 outputs; the split-K counter buffer and the allocator's workspace blocks
    are shared between consecutive launches). Every launch really uses PDL when on."""
    _need_pdl(monkeypatch)
    b = _gpu_weights(fmt, n, k)
    acts = [_acts(m, k, fmt, "cuda", seed=s) for s in range(20)]
    cfgs = _forced_configs(fmt, m)
    plan = [cfgs[i % len(cfgs)] for i in range(20)]

    def run_all(outs):
        for i, (a, c) in enumerate(zip(acts, plan)):
            gemm(a, b, out=outs[i], config=c)

    results = {}
    for on in (False, True):
        monkeypatch.setattr(gemm_mod, "PDL", on)
        spy.launches.clear()
        eager = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(20)]
        run_all(eager)  # also compiles and creates the graph counter buffer (split-K)
        torch.cuda.synchronize()
        assert spy.launches == [(on, on)] * 20, spy.launches[:3]
        outs = [torch.full_like(e, float("nan")) for e in eager]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run_all(outs)
        graph_runs = []
        for rep in range(3):
            for o in outs:
                o.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            graph_runs.append([o.clone() for o in outs])
        results[on] = (eager, graph_runs)
    ref_eager = results[False][0]
    y = ref_eager[0]
    assert_no_nan_survivors(y)
    assert_gemm_close(y, ref_gemm_mod.gemm(acts[0], b), fmt, torch.bfloat16, what="call 0")
    for on in (False, True):
        eager, graph_runs = results[on]
        for i in range(20):
            _assert_bitwise(eager[i], ref_eager[i], f"eager PDL={on} call {i} cfg {plan[i]}")
            for rep, run in enumerate(graph_runs):
                _assert_bitwise(run[i], ref_eager[i], f"graph PDL={on} replay {rep} call {i} cfg {plan[i]}")
    from blockscaled.ops import _splitk

    for buf in [*_splitk._COUNTERS.values(), *_splitk._GRAPH_COUNTERS.values()]:
        assert int((buf != 0).sum()) == 0, "split-K counters not reset"


def _run_chain_both_ways(chain, x0, monkeypatch, steps=20):
    """Eager with a device sync after every step (ground truth, PDL off), then eager and one
    CUDA graph (3 replays) with PDL off and on: all bitwise equal to the ground truth."""
    monkeypatch.setattr(gemm_mod, "PDL", False)
    truth = []
    x = x0
    for i in range(steps):
        x = chain(x, i)
        torch.cuda.synchronize()
        truth.append(x.clone())
    for t in truth:
        assert torch.isfinite(t.float()).all(), "chain diverged: rescale the weights"
    for on in (False, True):
        monkeypatch.setattr(gemm_mod, "PDL", on)
        x = x0
        eager = []
        for i in range(steps):
            x = chain(x, i)
            eager.append(x)
        torch.cuda.synchronize()
        for i in range(steps):
            _assert_bitwise(eager[i], truth[i], f"eager PDL={on} step {i}")
        static_x = x0.clone()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x = static_x
            outs = []
            for i in range(steps):
                x = chain(x, i)
                outs.append(x)
        for rep in range(3):
            for o in outs:
                o.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            for i in range(steps):
                _assert_bitwise(outs[i], truth[i], f"graph PDL={on} replay {rep} step {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 64, 128))
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_gpu_pdl_chain_quantize_gemm(fmt, m, monkeypatch, spy):
    """quantize(out_i) -> gemm, 20 steps alternating W1 [2112, 7168] and W2 [7168, 2112]
    (planner, forced split-K and swap-AB configs in turn): with PDL every GEMM is launched
    while the quantize kernel before it may still run, so only its griddepcontrol.wait orders
    the reads of the fresh A. Bitwise equal to a step-by-step synchronised run."""
    _need_pdl(monkeypatch)
    from blockscaled.ops.quantize import quantize

    ws = [_gpu_weights(fmt, 2112, 7168, seed=1), _gpu_weights(fmt, 7168, 2112, seed=2)]
    cfgs = _forced_configs(fmt, m)
    x0 = randn_like_activations(m, 7168, dtype=torch.bfloat16, device="cuda", seed=3, outliers=False)

    def step(x, i):
        return gemm(quantize(x, fmt), ws[i % 2], config=cfgs[(i // 2) % len(cfgs)])

    _run_chain_both_ways(step, x0, monkeypatch)
    assert spy.launches[-20:] == [(True, True)] * 20  # the PDL=True capture


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 64, 128))
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_gpu_pdl_chain_gemm_gemm(fmt, m, monkeypatch, spy):
    """gemm -> gemm (weight-only: the bf16 output is the next call's A), 20 steps alternating
    W1 [2112, 7168] / W2 [7168, 2112], planner configs (fused split-K at these M): PDL
    launches back to back with a true read-after-write dependency through global memory, and
    consecutive launches sharing the split-K counters and workspace blocks. Bitwise equal to
    a synchronised run."""
    _need_pdl(monkeypatch)
    ws = [_gpu_weights(fmt, 2112, 7168, seed=1), _gpu_weights(fmt, 7168, 2112, seed=2)]
    x0 = randn_like_activations(m, 7168, dtype=torch.bfloat16, device="cuda", seed=3, outliers=False)
    forced = GemmConfig(block_m=16 if m <= 16 else 64, block_n=64, block_k=128, num_warps=4, num_stages=4,
                        split_k=4, promote=fmt == "fp8_block")
    cfgs = [None, forced]

    def step(x, i):
        return gemm(x, ws[i % 2], config=cfgs[(i // 2) % 2])

    _run_chain_both_ways(step, x0, monkeypatch)
    assert spy.launches[-20:] == [(True, True)] * 20  # the PDL=True capture
