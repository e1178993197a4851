"""``python -m neuronetes.cli``."""

from neuronetes.cli import main

raise SystemExit(main())
