"""``python -m yolofeed`` is the ``yolofeed`` command."""

from yolofeed.cli import entry

raise SystemExit(entry())
