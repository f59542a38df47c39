"""``turnguard calibrate``: replay recorded turns through turnguard's own policies under a grid of
thresholds, and report what each policy would have done (docs/calibration.md).

Modules: ``inputs`` (readers), ``grid`` (policies), ``replay`` (one turn under one policy through
the live ledger and hooks), ``equivalence`` (which policies share a replay), ``engine`` (the loop),
``stats`` (figures and merging), ``run`` (files, workers, progress), ``report``/``html`` (output),
``cli`` (the commands).
"""
