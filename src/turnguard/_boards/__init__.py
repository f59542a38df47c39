"""turnguard's Grafana dashboards: built by ``build.py`` (grafana-foundation-sdk, the ``[dashboards]`` extra),
read back by ``queries.py``; proven with the fleet in ``tests/fleet.py``."""
