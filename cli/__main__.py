"""``python -m cli`` is ``noniid-fl``."""

from cli.main import main

raise SystemExit(main())
