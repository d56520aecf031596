"""What a flow does to its clusters, with Kafka's clients and without Spark: remote topics,
positions, heartbeats, offsets, the plan of a batch, a flow's specification, the online plan,
and the scheduler of periodic work."""
