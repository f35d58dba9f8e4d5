"""Train a setup for a few steps and measure it: the engine of ``yolofeed bench`` and ``yolofeed doctor``."""
