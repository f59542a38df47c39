"""``python -m turnguard``: the ``turnguard`` command."""

from turnguard.cli import main

raise SystemExit(main())
