"""The batching lab: sim.py (one replica, pure), metrics.py, fleet.py (the spike, pure), plot.py, cli.py."""
