"""Tools that measure yolofeed (run from the repository root: ``python -m tools.<name>``); see tools/README.md."""
