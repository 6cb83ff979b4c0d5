"""Every argument error names the argument, what was expected and what came.

One table of bad inputs to the public API -> (exception type, message fragments). Each row
names the argument it is about; the fragments must all appear in the message (case-sensitive),
so a bare ``'int' object is not iterable`` or ``AttributeError`` fails the row. Rows marked
``# patch:`` need the lead's patches to files this helper does not own
(/tmp/team/patch_C_linear.diff, patch_C_grouped.diff).

Plus: the spellings that are accepted (format names in any case like rounding names, block
lists), and TRITON_INTERPRET read at call time (changing it after import raises, naming the
import-time rule).
"""

from __future__ import annotations

import os

import pytest
import torch

import blockscaled as bs
from blockscaled import _checks
from blockscaled import layouts as L
from blockscaled.config import GemmConfig
from blockscaled.formats import ScaleRounding


@pytest.fixture(scope="module")
def t():
    """Small valid operands (CPU: argument checks run before any kernel)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    w = torch.randn(64, 256, generator=g)
    ns = type("T", (), {})()
    ns.x, ns.w = x, w
    ns.q = bs.quantize(x, "fp8_block")
    ns.wq = bs.quantize(w, "fp8_block", block=(128, 128))
    ns.wq3 = bs.quantize(torch.randn(2, 64, 256, generator=g), "fp8_block", block=(128, 128))
    ns.qn = bs.quantize(x, "nvfp4")
    ns.qm = bs.quantize(x, "mxfp8")
    ns.offs = torch.tensor([0, 2, 4], dtype=torch.int32)
    ns.wn3 = bs.quantize(torch.randn(2, 64, 256, generator=g), "nvfp4")
    ns.x3 = bs.quantize(torch.randn(2, 3, 256, generator=g), "fp8_block")
    return ns


def _st(q, **kw):
    """ScaledTensor(...) with q's fields, some replaced."""
    args = dict(data=q.data, scale=q.scale, format=q.format, shape=q.shape, block=q.block, rounding=q.rounding,
                global_scale=q.global_scale)
    args.update(kw)
    return bs.ScaledTensor(**args)


FP8_BLOCKS = "[(1, 128), (128, 128)]"

# (id, call(t), exception type, fragments: the argument, what was expected, what came)
CASES = [
    # --- quantize
    ("quantize.block=int", lambda t: bs.quantize(t.x, "fp8_block", block=128), TypeError,
     ["block:", "(rows, cols) tuple", FP8_BLOCKS, "got 128 (int)"]),
    ("quantize.block=str", lambda t: bs.quantize(t.x, "fp8_block", block="1x128"), TypeError,
     ["block:", FP8_BLOCKS, "got '1x128' (str)"]),
    ("quantize.block=float", lambda t: bs.quantize(t.x, "fp8_block", block=(1.5, 128)), TypeError,
     ["block:", "tuple of ints", "got (1.5, 128)"]),
    ("quantize.block=(1,)", lambda t: bs.quantize(t.x, "fp8_block", block=(1,)), TypeError,
     ["block:", FP8_BLOCKS, "got (1,)"]),
    ("quantize.block=other", lambda t: bs.quantize(t.x, "mxfp8", block=(1, 128)), ValueError,
     ["block:", "mxfp8 allows [(1, 32)]", "got (1, 128)"]),
    ("quantize.rounding=int", lambda t: bs.quantize(t.x, "fp8_block", rounding=7), TypeError,
     ["rounding:", "ScaleRounding", "['exact', 'rceil']", "got 7 (int)"]),
    ("quantize.rounding=name", lambda t: bs.quantize(t.x, "mxfp8", rounding="nearest"), ValueError,
     ["rounding:", "['rceil', 'floor']", "got 'nearest'"]),
    ("quantize.rounding=other", lambda t: bs.quantize(t.x, "fp8_block", rounding="floor"), ValueError,
     ["rounding:", "fp8_block allows ['EXACT', 'RCEIL']", "got FLOOR"]),
    ("quantize.fmt=name", lambda t: bs.quantize(t.x, "int4"), ValueError,
     ["fmt:", "['fp8_block', 'mxfp4', 'mxfp8', 'nvfp4']", "got 'int4'"]),
    ("quantize.fmt=int", lambda t: bs.quantize(t.x, 3), ValueError, ["fmt:", "blockscaled.Format", "got 3 (int)"]),
    ("quantize.x=list", lambda t: bs.quantize([1.0], "mxfp8"), TypeError, ["x:", "torch.Tensor", "got list"]),
    ("quantize.x=int", lambda t: bs.quantize(t.x.int(), "mxfp8"), TypeError,
     ["x:", "torch.bfloat16", "got torch.int32"]),
    ("quantize.global_scale=str", lambda t: bs.quantize(t.x, "nvfp4", global_scale="1"), TypeError,
     ["global_scale:", "float or a 1-element fp32 tensor", "got str"]),
    ("quantize.global_scale=-1", lambda t: bs.quantize(t.x, "nvfp4", global_scale=-1.0), ValueError,
     ["global_scale:", "finite value > 0", "got -1.0"]),
    ("quantize.global_scale=mx", lambda t: bs.quantize(t.x, "mxfp8", global_scale=1.0), ValueError,
     ["global_scale:", "mxfp8 has no global scale", "got 1.0"]),
    ("quantize.check_range=str", lambda t: bs.quantize(t.x, "nvfp4", check_range="yes"), TypeError,
     ["check_range:", "True, False or None", "got 'yes'"]),
    # --- dequantize / silu_mul_quantize
    ("dequantize.q", lambda t: bs.dequantize(t.x), TypeError, ["q:", "ScaledTensor", "got Tensor"]),
    ("dequantize.dtype", lambda t: bs.dequantize(t.q, "bf16"), TypeError, ["dtype:", "torch.bfloat16", "got bf16"]),
    ("silu_mul_quantize.gate_up", lambda t: bs.silu_mul_quantize(torch.randn(4, 255)), ValueError,
     ["gate_up:", "even", "got (4, 255)"]),
    ("silu_mul_quantize.fmt", lambda t: bs.silu_mul_quantize(torch.randn(4, 256), "NVFP4"), ValueError,
     ["fmt:", "without a global scale", "got nvfp4"]),
    ("silu_mul_quantize.rounding", lambda t: bs.silu_mul_quantize(torch.randn(4, 256), rounding=7), TypeError,
     ["rounding:", "ScaleRounding", "got 7 (int)"]),
    ("silu_mul_quantize.intermediate_dtype",
     lambda t: bs.silu_mul_quantize(torch.randn(4, 256), intermediate_dtype="bf16"), TypeError,
     ["intermediate_dtype:", "torch.bfloat16", "got bf16"]),
    # --- gemm / linear
    ("gemm.out_dtype", lambda t: bs.gemm(t.q, t.wq, "bf16"), TypeError, ["out_dtype:", "torch.bfloat16", "got bf16"]),
    ("gemm.b", lambda t: bs.gemm(t.q, t.w), TypeError, ["b:", "ScaledTensor", "got Tensor"]),
    ("gemm.a", lambda t: bs.gemm([1], t.wq), TypeError, ["a:", "ScaledTensor or a bf16/fp16", "got list"]),
    ("gemm.a.format", lambda t: bs.gemm(t.qn, t.wq), ValueError, ["a.format:", "fp8_block", "got nvfp4"]),
    ("gemm.config", lambda t: bs.gemm(t.q, t.wq, config={"block_m": 16}), TypeError,
     ["config:", "GemmConfig", "got dict"]),
    ("gemm.bias", lambda t: bs.gemm(t.q, t.wq, bias=torch.zeros(3)), ValueError, ["bias:", "(64,)", "got (3,)"]),
    ("gemm.out", lambda t: bs.gemm(t.q, t.wq, out=torch.empty(3, 3)), ValueError, ["out:", "(4, 64)", "got (3, 3)"]),
    ("linear.x", lambda t: bs.linear(t.q, t.wq), TypeError, ["x:", "torch.Tensor", "got ScaledTensor"]),
    ("linear.w", lambda t: bs.linear(t.x, t.w), TypeError, ["w:", "ScaledTensor", "got Tensor"]),
    ("linear.out_dtype", lambda t: bs.linear(t.x, t.wq, out_dtype=torch.int8), TypeError,
     ["out_dtype:", "torch.bfloat16", "got torch.int8"]),
    # patch: ops/linear.py (weight_only="yes" was accepted as True)
    ("linear.weight_only", lambda t: bs.linear(t.x, t.wq, weight_only="yes"), TypeError,
     ["weight_only:", "True or False", "got 'yes'"]),
    # --- grouped_gemm / grouped_gemm_list / swiglu
    ("grouped_gemm.offsets=list", lambda t: bs.grouped_gemm(t.q, t.wq3, offsets=[0, 2, 4]), TypeError,
     ["offsets:", "torch.Tensor", "got list"]),
    ("grouped_gemm.offsets=int64", lambda t: bs.grouped_gemm(t.q, t.wq3, offsets=t.offs.long()), TypeError,
     ["offsets:", "torch.int32", "got torch.int64"]),
    ("grouped_gemm.no_grouping", lambda t: bs.grouped_gemm(t.q, t.wq3), ValueError,
     ["offsets/masked_m:", "exactly one", "got offsets=None, masked_m=None"]),
    ("grouped_gemm.b", lambda t: bs.grouped_gemm(t.q, t.wq, offsets=t.offs), ValueError,
     ["b:", "3-D ScaledTensor", "got shape (64, 256)"]),
    ("grouped_gemm.expected_m=str", lambda t: bs.grouped_gemm(t.x3, t.wq3, masked_m=torch.tensor([1, 2], dtype=torch.int32),
                                                                expected_m="3"), TypeError,
     ["expected_m:", "positive int", "got str '3'"]),
    ("grouped_gemm.b_global_scale=0", lambda t: bs.grouped_gemm(t.qn, t.wn3, offsets=t.offs,
                                                                b_global_scale=torch.tensor([1.0, 0.0])), ValueError,
     ["b_global_scale:", "finite values > 0", "got 0.0 at index 1"]),
    ("grouped_gemm.config", lambda t: bs.grouped_gemm(t.q, t.wq3, offsets=t.offs, config=5), TypeError,
     ["config:", "GemmConfig", "got int"]),
    # patch: ops/grouped.py (validate="yes" was accepted as True)
    ("grouped_gemm.validate", lambda t: bs.grouped_gemm(t.q, t.wq3, offsets=t.offs, validate="yes"), TypeError,
     ["validate:", "True, False or None", "got 'yes'"]),
    ("grouped_gemm_list.a_list", lambda t: bs.grouped_gemm_list(t.q, t.wq), TypeError,
     ["a_list/b_list:", "lists of ScaledTensors", "got ScaledTensor"]),
    ("grouped_gemm_list.b_list", lambda t: bs.grouped_gemm_list([t.q], [t.wq, t.wq]), ValueError,
     ["b_list:", "1 groups", "got 2"]),
    # patch: ops/grouped.py (was AttributeError: 'Tensor' object has no attribute 'format')
    ("grouped_gemm_list.a_list[0]", lambda t: bs.grouped_gemm_list([t.x], [t.wq]), TypeError,
     ["a_list[0]:", "ScaledTensor", "got Tensor"]),
    ("swiglu.b_up", lambda t: bs.swiglu(t.q, t.wq, t.w), TypeError, ["b_up:", "ScaledTensor", "got Tensor"]),
    ("swiglu.out_dtype", lambda t: bs.swiglu(t.q, t.wq, t.wq, out_dtype=torch.int8), TypeError,
     ["out_dtype:", "torch.bfloat16", "got torch.int8"]),
    ("swiglu.offsets/masked_m", lambda t: bs.swiglu(t.q, t.wq3, t.wq3, offsets=t.offs, masked_m=t.offs), ValueError,
     ["offsets/masked_m:", "at most one"]),
    # --- ScaledTensor constructor
    ("ScaledTensor.format", lambda t: _st(t.q, format="fp9"), ValueError,
     ["ScaledTensor.format:", "['fp8_block', 'mxfp4', 'mxfp8', 'nvfp4']", "got 'fp9'"]),
    ("ScaledTensor.data", lambda t: _st(t.q, data=[1]), TypeError, ["ScaledTensor.data:", "torch.Tensor", "got list"]),
    ("ScaledTensor.scale", lambda t: _st(t.q, scale=None), TypeError,
     ["ScaledTensor.scale:", "torch.Tensor", "got NoneType"]),
    ("ScaledTensor.shape", lambda t: _st(t.q, shape=256), TypeError,
     ["ScaledTensor.shape:", "tuple of ints", "got 256 (int)"]),
    ("ScaledTensor.block", lambda t: _st(t.q, block=128), TypeError,
     ["ScaledTensor.block:", FP8_BLOCKS, "got 128 (int)"]),
    ("ScaledTensor.rounding=int", lambda t: _st(t.q, rounding=1), TypeError,
     ["ScaledTensor.rounding:", "ScaleRounding", "got 1 (int)"]),
    ("ScaledTensor.rounding=other", lambda t: _st(t.q, rounding=ScaleRounding.FLOOR), ValueError,
     ["ScaledTensor.rounding:", "fp8_block allows ['EXACT', 'RCEIL']", "got FLOOR"]),
    ("ScaledTensor.global_scale", lambda t: _st(t.qn, global_scale=1.0), TypeError,
     ["ScaledTensor.global_scale:", "1-element fp32 torch.Tensor", "got float"]),
    # --- layouts
    ("layouts.to_deepgemm.q", lambda t: L.to_deepgemm(t.x), TypeError, ["q:", "ScaledTensor", "got Tensor"]),
    ("layouts.to_deepgemm.packed_ue8m0", lambda t: L.to_deepgemm(t.q, packed_ue8m0="yes"), TypeError,
     ["packed_ue8m0:", "True or False", "got 'yes'"]),
    ("layouts.from_deepgemm.block", lambda t: L.from_deepgemm(t.q.data, L.to_deepgemm(t.q)[1], block=128), TypeError,
     ["block:", FP8_BLOCKS, "got 128 (int)"]),
    ("layouts.from_deepgemm.rounding", lambda t: L.from_deepgemm(t.q.data, L.to_deepgemm(t.q)[1], rounding="up"),
     ValueError, ["rounding:", "['exact', 'rceil']", "got 'up'"]),
    ("layouts.from_deepgemm.fmt", lambda t: L.from_deepgemm(t.q.data, t.q.scale, "fp7"), ValueError,
     ["fmt:", "'fp8_block'", "got 'fp7'"]),
    ("layouts.to_deepgemm_fp32.sf", lambda t: L.to_deepgemm_fp32(torch.zeros(4)), ValueError,
     ["sf:", "2-D [M, sk] or 3-D", "got shape (4,)"]),
    ("layouts.to_deepgemm_ue8m0.check", lambda t: L.to_deepgemm_ue8m0(torch.ones(4, 4), check="yes"), TypeError,
     ["check:", "True or False", "got 'yes'"]),
    ("layouts.from_deepgemm_ue8m0.sf_k", lambda t: L.from_deepgemm_ue8m0(torch.ones(4, 1, dtype=torch.int32), "4"),
     TypeError, ["sf_k:", "non-negative int", "got '4' (str)"]),
    ("layouts.to_blocked.scale", lambda t: L.to_blocked(torch.ones(4, 4)), TypeError,
     ["scale:", "torch.uint8", "got torch.float32"]),
    ("layouts.from_blocked.rows", lambda t: L.from_blocked(torch.zeros(512, dtype=torch.uint8), "4", 4), TypeError,
     ["rows:", "non-negative int", "got '4' (str)"]),
    ("layouts.from_blocked.cols", lambda t: L.from_blocked(torch.zeros(512, dtype=torch.uint8), 4, -1), ValueError,
     ["cols:", "non-negative int", "got -1"]),
    ("layouts.gpumode_view.rows", lambda t: L.gpumode_view(torch.zeros(512, dtype=torch.uint8), 4.0, 4), TypeError,
     ["rows:", "non-negative int", "got 4.0 (float)"]),
    ("layouts.from_gpumode.cols", lambda t: L.from_gpumode(torch.zeros(32, 4, 1, 4, 1, 1, dtype=torch.uint8), 4, "4"),
     TypeError, ["cols:", "non-negative int", "got '4' (str)"]),
    ("layouts.to_cublas.q", lambda t: L.to_cublas(t.q), ValueError, ["q:", "no 32_4_4 blocked layout"]),
    ("layouts.from_cublas.shape", lambda t: L.from_cublas(*L.to_cublas(t.qm), "mxfp8", 256), TypeError,
     ["shape:", "tuple of ints", "got 256"]),
    ("layouts.from_cublas.global_scale", lambda t: L.from_cublas(*L.to_cublas(t.qn), "nvfp4", (4, 256),
                                                                  global_scale="1"), TypeError,
     ["global_scale:", "float or a 1-element fp32 tensor", "got str"]),
    ("layouts.from_cublas.rounding", lambda t: L.from_cublas(*L.to_cublas(t.qm), "mxfp8", (4, 256), rounding=3),
     TypeError, ["rounding:", "ScaleRounding", "got 3 (int)"]),
    ("layouts.tma_aligned_size.mn", lambda t: L.tma_aligned_size("4", 4), TypeError,
     ["mn:", "non-negative int", "got '4' (str)"]),
    ("layouts.tma_aligned_size.element_size", lambda t: L.tma_aligned_size(4, 0), ValueError,
     ["element_size:", "an int >= 1", "got 0"]),
]


@pytest.mark.parametrize("call,exc,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_message(t, call, exc, fragments):
    with pytest.raises(Exception) as info:
        call(t)
    msg = str(info.value)
    assert info.type is exc, f"{info.type.__name__} instead of {exc.__name__}: {msg}"
    missing = [f for f in fragments if f not in msg]
    assert not missing, f"message lacks {missing}: {msg}"


def test_case_ids_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


# --------------------------------------------------------------------------- accepted spellings
def test_format_and_rounding_names_in_any_case(t):
    """Format names are case-insensitive, like rounding names (they were case-sensitive)."""
    for name in ("FP8_BLOCK", "Fp8_Block", " fp8_block "):
        q = bs.quantize(t.x, name, rounding="RCEIL")
        assert q.format is bs.FP8_BLOCK and q.rounding is ScaleRounding.RCEIL
    assert bs.quantize(t.x, "NVFP4", rounding="NvFp4").format is bs.NVFP4
    assert L.from_deepgemm(t.q.data, t.q.scale, "FP8_BLOCK").format is bs.FP8_BLOCK
    assert bs.silu_mul_quantize(torch.randn(2, 256), "MXFP8").format is bs.MXFP8


def test_scaled_tensor_normalises_spellings(t):
    q = _st(t.q, format="FP8_BLOCK", block=[1, 128], rounding="exact", shape=[4, 256])
    assert q.format is bs.FP8_BLOCK and q.block == (1, 128) and isinstance(q.block, tuple)
    assert q.rounding is ScaleRounding.EXACT and q.shape == torch.Size((4, 256))
    assert q == t.q  # the same fields after normalisation
    assert bs.quantize(t.w, "fp8_block", block=[128, 128]).block == (128, 128)


# --------------------------------------------------------------------------- TRITON_INTERPRET
def test_triton_interpret_changed_after_import_raises(t, monkeypatch):
    """The kernels' mode was fixed when they were defined (at import); flipping the variable
    afterwards used to be ignored silently. Now every op raises, stating the rule."""
    if _checks._KERNELS_INTERPRETED:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        want = "unset TRITON_INTERPRET before importing"
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        want = "set TRITON_INTERPRET=1 in the environment before blockscaled"
    for call in (lambda: bs.quantize(t.x, "mxfp8"), lambda: bs.dequantize(t.q), lambda: bs.gemm(t.q, t.wq),
                 lambda: bs.linear(t.x, t.wq), lambda: bs.grouped_gemm(t.q, t.wq3, offsets=t.offs),
                 lambda: bs.swiglu(t.q, t.wq, t.wq), lambda: bs.tensor_amax(t.x)):
        with pytest.raises(RuntimeError) as info:
            call()
        msg = str(info.value)
        for frag in ("TRITON_INTERPRET", "import blockscaled", "when a kernel is defined", want):
            assert frag in msg, (frag, msg)
    monkeypatch.undo()
    bs.quantize(t.x, "mxfp8")  # back to the import-time value: fine again


@pytest.mark.skipif(not _checks._KERNELS_INTERPRETED, reason="needs the interpreter (TRITON_INTERPRET=1 at import)")
def test_equivalent_interpret_spelling_is_accepted(t, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "true")  # what Triton reads as on, like "1"
    bs.quantize(t.x, "mxfp8")
    assert os.environ["TRITON_INTERPRET"] == "true"
