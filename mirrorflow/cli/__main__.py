"""``python -m mirrorflow.cli``: the same as the ``mirrorflow`` command."""

import sys

from mirrorflow.cli import main

sys.exit(main())
