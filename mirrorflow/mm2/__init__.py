"""MirrorMaker 2's own concepts, as its ``connect-mirror`` and ``mirror-client`` define them:
configuration definitions, replication policies, topic/group/config filters, wire formats, the
offset-sync rule and store. Pure Python: no Spark, Airflow or Kafka client is imported here."""
