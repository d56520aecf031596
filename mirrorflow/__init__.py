"""mirrorflow: Kafka replication with MirrorMaker 2 semantics on Airflow and Spark."""
