"""``python -m cli`` is ``noniid-fl``."""

from cli.main import console

console()
