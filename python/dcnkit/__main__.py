"""``python -m dcnkit``: the dcnkit command line (see dcnkit.cli)."""
import sys

from dcnkit.cli import main

sys.exit(main())
