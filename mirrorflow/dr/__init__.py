"""Disaster recovery: failover, failback and DR drills over a pair of flows, with Kafka's clients
and the mirror job's files; the Airflow DAGs that run them step by step stay thin."""
