"""``yolofeed bench``: stock Ultralytics vs yolofeed vs the GPU-resident ceiling, in one process."""
