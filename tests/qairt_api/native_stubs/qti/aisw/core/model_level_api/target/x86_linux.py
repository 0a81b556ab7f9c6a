"""Stand-in for the QAIRT SDK's ``X86LinuxTarget`` (named by qairt-dev's AIC backend at import time)."""

from qti.aisw.core.model_level_api.target.target import Target


class X86LinuxTarget(Target):
    pass
