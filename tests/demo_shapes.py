"""The demo shapes the tests share, by name (the smallest shape that exercises each property)."""

from __future__ import annotations

from genie_build.demo import DemoShape

# 2 layers, 4 query / 2 KV heads: calibration and the demo's own numerics
TINY = DemoShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=300, context=48, ar=8)
# 4 layers: enough for a 3-part split with layers on both sides of a cut (split, verify)
SMALL = DemoShape(layers=4, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256, context=64, ar=8)
