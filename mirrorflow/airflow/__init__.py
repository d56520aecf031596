"""Airflow glue: the operators of the generated DAGs and the rendering of those DAGs.

This is the only part of mirrorflow that imports Airflow, and only in
:mod:`mirrorflow.airflow.operators`: importing this package (or :mod:`.rendering`) imports
nothing of Airflow, so ``mirrorflow render`` works without Airflow's start-up cost.
"""
