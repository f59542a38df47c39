"""``turnguard calibrate``: replay recorded turns through turnguard's own policies under a grid of
thresholds, and report what each policy would have done (docs/calibration.md).

Modules, from the input to the report:

- ``inputs``: the files a calibration reads, in stream order, and each line sent to its format's reader
- ``records``: what the readers give (``RecordedTurn``) and the bounded line reading both formats share
- ``corpus``: the recorder's format (corpus-format JSONL), one turn per line
- ``collector``: the Collector's format (OTLP JSON spans), turns rebuilt from their spans
- ``duplicates``: the same turn read twice (two copies of a file, both formats of one fleet) counted once
- ``results``: late task results (result records, ``turnguard.turn.result`` logs) joined to their turns
- ``bounds``: the memory bound every input limit derives from, and the checked counts of a result
- ``grid``: the policies a run compares (the configurations of the grid)
- ``equivalence``: which policies share one replay of a turn, and which cannot fire on it
- ``replay``: one turn under one policy, through the live ledger and policy hooks; the calls' ledger keys
- ``engine``: the loop: key each turn, skip what cannot fire, replay the rest, count
- ``run``: files, progress and the choice of one process or many
- ``parallel``: worker processes reading byte ranges, joined as one reader would have read them
- ``stats``: the figures a run accumulates, and how partial runs merge
- ``recording``: what the recording says about the policies in force and the traffic
- ``evidence``: what probe turns did past the main configuration's thresholds, how far past (ladders),
  and the value to set for each probed threshold, what it buys and what it costs (the frontier)
- ``advice``: a probe row's decision against the tolerance, the advice, and both shown
- ``survival``: how many calls turns need (Kaplan-Meier), in words
- ``report``: the terminal table (first, its legend after) and the ``--json`` result
- ``html``: the self-contained HTML report and its SVG charts
- ``cli``: the ``calibrate`` and ``calibrate merge`` commands
"""
