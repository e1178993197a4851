"""``python -m neuronetes.gpuvalidate``: the runner (see `runner`)."""

import sys

from .runner import main

sys.exit(main())
