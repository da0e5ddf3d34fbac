"""``python -m damptune``."""

import sys

from damptune.cli import main

sys.exit(main())
