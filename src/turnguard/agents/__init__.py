"""Coding-agent CLIs guarded through their own command hooks.

Claude Code, Codex and Gemini CLI run a command at their own events (JSON on stdin, JSON on
stdout, exit codes). ``turnguard hook AGENT`` answers one event (``hook``): each agent's events
and answers are in its own module (``claude_code``, ``codex``, ``gemini``), read into the neutral
``events.AgentEvent``; a turn's state lives between the hook processes in a per-session store
(``store``) as a durable snapshot; telemetry and the recorder's line are produced once the turn
has ended, by a detached process that replays the turn's journal (``export``), so no tool call
waits for an exporter. ``turnguard install AGENT`` edits the agent's settings (``install``).
"""
