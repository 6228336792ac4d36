"""``python -m speclive.cli``: the ``speclive`` command."""

import sys

from speclive.cli import main

sys.exit(main())
