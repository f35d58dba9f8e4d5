"""``yolofeed doctor``: profile a training setup, say where the time goes and what to change."""
