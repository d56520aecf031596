"""A minimal PySpark application: proves that spark-submit runs a Python job end to end."""

import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("sum-squares").getOrCreate()
n = int(sys.argv[1])
total = spark.sparkContext.parallelize(range(1, n + 1), 4).map(lambda x: x * x).sum()
print(f"SUM_OF_SQUARES={total}")
spark.stop()
