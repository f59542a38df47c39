"""turnguard's Grafana dashboards: built by ``build.py``, proven with the fleet in ``fleet.py``."""
