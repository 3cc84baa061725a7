"""`python -m hpcrl` is what job scripts run when no image is configured."""

from hpcrl.cli import main

raise SystemExit(main())
