"""``python -m turnguard.agents serve SOCKET``: the hooks' long-lived local server (``server``),
as ``client.py`` starts it."""

import sys

from turnguard.agents.server import main

raise SystemExit(main(sys.argv[2:]) if sys.argv[1:2] == ["serve"] else main([]))
