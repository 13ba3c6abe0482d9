"""Entry point: ``python3 -m lobes_sim``."""

from .cli import main

main()
