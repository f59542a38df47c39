"""End-to-end harness: the real coding-agent CLIs run offline against a scripted model server.

Not named ``agents``: the tests put ``tests/`` first on ``sys.path``, where such a package would
hide the openai-agents SDK's own ``agents``."""
