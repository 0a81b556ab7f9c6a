"""Stand-in for the QAIRT SDK's native ``Target``: qairt-dev's HTP backend only names it at import time."""


class Target:
    pass
