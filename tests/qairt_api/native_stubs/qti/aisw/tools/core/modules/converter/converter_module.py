"""Stand-in for the QAIRT SDK converter module's ``QuantParam``, the one name qairt-dev's ConverterConfig imports."""

import pydantic


class QuantParam(pydantic.BaseModel):
    scale: float
    offset: int
