"""Tools for development and the demo: sandbox Kafka clusters on loopback, a local Airflow,
and the end-to-end demo."""
