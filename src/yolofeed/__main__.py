"""``python -m yolofeed`` is the ``yolofeed`` command."""

from yolofeed.cli import main

raise SystemExit(main())
