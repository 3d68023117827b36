"""``python -m dcnkit``: the dcnkit command line (see dcnkit.cli)."""
import sys

from dcnkit.cli.parser import main

sys.exit(main())
