"""Replication health: each flow's state (RUNNING, LAGGING, STALLED, FAILED, PAUSED) derived from
its progress, heartbeats and lag, for the metrics, the alerts and the Airflow UI page."""
