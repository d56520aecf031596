"""Mirror jobs on Spark: the job's driver, ``spark-submit`` command lines, Spark sessions, the
JVM artefacts (Maven jars, the copier, the driver's class archive), and the files and
processes through which a running job is found and stopped."""
