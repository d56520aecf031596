"""Airflow plugin: mirrorflow's Replication page, for a checkout whose ``mirrorflow`` package is
not installed (its logic: :mod:`mirrorflow.airflow.ui`). Where mirrorflow is installed, Airflow
loads the same plugin through mirrorflow's ``airflow.plugins`` entry point, and this file adds
nothing (Airflow would report the second copy as an import error)."""

from __future__ import annotations

from mirrorflow.airflow.ui.plugin import MirrorflowUiPlugin, registered_by_entry_point

if registered_by_entry_point():
    del MirrorflowUiPlugin
