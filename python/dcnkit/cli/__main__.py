"""``python -m dcnkit.cli``: the dcnkit command line."""
import sys

from dcnkit.cli.parser import main

sys.exit(main())
