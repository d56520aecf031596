"""Airflow glue: the operator that runs a flow's mirror job, and its process bookkeeping.

This is the only part of mirrorflow that imports Airflow, and only in
:mod:`mirrorflow.airflow.operators`; importing this package itself imports nothing, so
:mod:`mirrorflow.airflow.jobs` (stop files, pid files, stopping a job) is usable without Airflow.
"""
