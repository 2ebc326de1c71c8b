"""`python -m drmas_train` = `drmas-train`."""

import sys

from drmas_train.cli import main

sys.exit(main())
