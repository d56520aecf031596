"""The operators of the generated DAGs, one module per concept.

The DAG files import them from here (``from mirrorflow.airflow.operators import ...``); each
lives in its own module, which is also where a test patches what it looks up.
"""

from mirrorflow.airflow.operators.mirror import (
    DrillFailoverStepOperator,
    DrillStepOperator,
    DRStepOperator,
    FailbackStepOperator,
    FailoverStepOperator,
    FlowControlOperator,
    GroupSyncOperator,
    MirrorFlowOperator,
    SyncOperator,
)

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
