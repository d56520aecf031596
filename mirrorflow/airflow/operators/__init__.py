"""The operators of the generated DAGs, one module per concept.

* :mod:`.mirror`: ``MirrorFlowOperator``, a site's Spark mirror job (the mirror DAG);
* :mod:`.flow_control`: ``FlowControlOperator``, a flow's own DAG (pause, restart, progress);
* :mod:`.config_sync`: ``SyncOperator``, the topic-config, partition and ACL sync (the sync DAG's
  ``sync`` task);
* :mod:`.group_sync`: ``GroupSyncOperator``, the consumer-group checkpoints and offset sync (the
  sync DAG's ``groups`` task);
* :mod:`.dr`: ``DRStepOperator`` and the failover, failback and drill steps (the DR DAGs);
* :mod:`.flow_files`: what they share.

The DAG files import the operators from here (``from mirrorflow.airflow.operators import ...``);
a test patches a name in the module that looks it up.
"""

from mirrorflow.airflow.operators.config_sync import SyncOperator
from mirrorflow.airflow.operators.dr import (
    DrillFailoverStepOperator,
    DrillStepOperator,
    DRStepOperator,
    FailbackStepOperator,
    FailoverStepOperator,
)
from mirrorflow.airflow.operators.flow_control import FlowControlOperator
from mirrorflow.airflow.operators.group_sync import GroupSyncOperator
from mirrorflow.airflow.operators.mirror import MirrorFlowOperator

__all__ = [
    "DRStepOperator",
    "DrillFailoverStepOperator",
    "DrillStepOperator",
    "FailbackStepOperator",
    "FailoverStepOperator",
    "FlowControlOperator",
    "GroupSyncOperator",
    "MirrorFlowOperator",
    "SyncOperator",
]
