"""The demo shapes the tests share, by name (the smallest shape that exercises each property), and the one way to
make another: ``dataclasses.replace`` of a named shape, or :func:`demo_shape` of a config's ``demo`` section."""

from __future__ import annotations

from collections.abc import Mapping

from genie_build.demo.demo import DemoShape

# 2 layers, 4 query / 2 KV heads: calibration and the demo's own numerics
TINY = DemoShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=300, context=48, ar=8)
# 4 layers: enough for a 3-part split with layers on both sides of a cut (split, verify)
SMALL = DemoShape(layers=4, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256, context=64, ar=8)
# 1 layer of the narrowest sizes: what a graph's IO or a refusal needs, no numerics
ONE_LAYER = DemoShape(layers=1, hidden=16, heads=2, kv_heads=1, intermediate=32, vocab=300, context=8, ar=2)
# 3 layers, 1 KV head: a 2- to 4-part plan, with and without the embedding alone
THREE_LAYERS = DemoShape(layers=3, hidden=32, heads=2, kv_heads=1, intermediate=64, vocab=320, context=16, ar=4)
# 5 layers, no size a power of two: the estimate against compiled containers
WIDE = DemoShape(layers=5, hidden=160, heads=4, kv_heads=2, intermediate=448, vocab=1200, context=96, ar=16)
# the default config's demo (config/config.yaml)
DEFAULT = DemoShape()


def demo_shape(section: Mapping[str, object], **changes: object) -> DemoShape:
    """The shape a config's ``demo`` section (a test config's, e.g. ``SMALL_DEMO["demo"]``) asks for, with
    ``changes``."""
    return DemoShape(**{**section, **changes})
