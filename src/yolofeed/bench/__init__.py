"""``yolofeed bench``: stock Ultralytics vs yolofeed vs the GPU-resident ceiling, side by side."""
