"""Stand-in for the QAIRT SDK's ``WorkflowMode`` (named by qairt-dev's backend base class at import time)."""

import enum


class WorkflowMode(enum.Enum):
    INFERENCE = "inference"
