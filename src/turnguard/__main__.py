"""``python -m turnguard``: the ``turnguard`` command.

``hook`` goes straight to the hook (``turnguard.agents.hook``): an agent runs it before every tool
call, so it skips the command line's parser and the modules of the other subcommands."""

import sys

if sys.argv[1:2] == ["hook"]:
    from turnguard.agents.hook import main as hook_main

    raise SystemExit(hook_main(sys.argv[2:]))

from turnguard._cli import main

raise SystemExit(main())
