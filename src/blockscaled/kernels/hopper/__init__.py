"""Private kernel bodies (@triton.jit); no host logic. See docs/design.md, "Layers"."""
