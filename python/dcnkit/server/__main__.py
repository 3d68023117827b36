"""``python -m dcnkit.server serve MODEL ...`` (the same commands as ``dcnkit serve`` / ``dcnkit triton-repo``)."""
import sys

from dcnkit.server.cli import main

sys.exit(main())
