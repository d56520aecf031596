"""Spark entry point run once at set-up (``mirrorflow jars``): starts the driver as a mirror job
does, so that the JVM can archive the classes it loaded.
See :mod:`mirrorflow.runtime.driver_archive`.

    spark-submit spark_jobs/driver_archive.py WORKDIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from mirrorflow.runtime import driver_archive

if __name__ == "__main__":
    sys.exit(driver_archive.exercise(Path(sys.argv[1])))
