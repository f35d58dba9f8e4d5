"""Tools for the GPU machines: benchmarks and diagnostics of training steps (``python -m tools.device.<name>``)."""
