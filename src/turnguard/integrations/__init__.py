"""Adapters that bound a host agent framework's runs with turnguard, one module per framework.

``pydantic_ai`` (a capability), ``openai_agents`` (run hooks), ``langchain`` (a ``create_agent``
middleware) and ``llm_plugin`` (simonw's llm: a plugin and chain callbacks). Each needs its extra
(``pip install "turnguard[pydantic-ai]"`` ...); importing this package imports no framework.
"""
