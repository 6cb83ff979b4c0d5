"""Reading an sm_90 disassembly (``nvdisasm -c`` of a compiled kernel's cubin) in the AOT checks: the
opcodes of a kernel's main loop, where a layout conversion (shared memory), a spill (local memory) or a
narrower load shows up without a GPU. Used by tests/test_aot_mx_gemv.py and
tests/test_aot_mx_gemv_gluon.py."""

from __future__ import annotations

import re

__all__ = ["loop_ops"]


def loop_ops(sass: str, innermost_with: str | None = None) -> dict[str, int]:
    """Opcode counts of the largest loop of ``sass`` (the K loop): the instructions from a label to the
    backward branch to it, predicates stripped. Empty when the code has no loop. ``innermost_with``: the
    smallest loop holding an opcode that starts with it instead (e.g. "LDG": a K loop nested in a loop
    over rows).

    >>> loop_ops(".L_x_1:\\n /*0010*/ LDG.E.128 R4, [R2.64] ;\\n /*0020*/ @P0 BRA `(.L_x_1) ;\\n")
    {'LDG.E.128': 1, 'BRA': 1}
    """
    instr, labels, best = [], {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*\.(L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(instr)
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            instr.append(m.group(1))

    def holds(lo, hi):
        return any(re.sub(r"^@!?U?P\w+\s+", "", ins).startswith(innermost_with) for ins in instr[lo:hi + 1])

    for i, ins in enumerate(instr):
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", ins)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            size = i - labels[m.group(1)]
            if innermost_with is not None:
                if holds(labels[m.group(1)], i) and (best is None or size < best[1] - best[0]):
                    best = (labels[m.group(1)], i)
            elif best is None or size > best[1] - best[0]:
                best = (labels[m.group(1)], i)
    ops: dict[str, int] = {}
    for ins in instr[best[0]:best[1] + 1] if best else []:
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]
        ops[op] = ops.get(op, 0) + 1
    return ops
