"""Private kernel bodies (@triton.jit); no host logic. See design.md section 2."""
