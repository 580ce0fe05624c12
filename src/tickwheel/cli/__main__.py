"""``python -m tickwheel.cli``."""

from tickwheel.cli import main

main()
