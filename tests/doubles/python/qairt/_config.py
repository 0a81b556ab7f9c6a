"""A pydantic-free stand-in for qairt's config models: documented fields only, defaults as qairt's."""

from __future__ import annotations


class Config:
    """Fields are declared in ``FIELDS`` (name -> default; ``REQUIRED`` for none); unknown fields raise
    ``TypeError`` like pydantic's ``extra="forbid"``. ``explicitly_set`` lists the fields given, which is what
    qairt's ``model_dump(exclude_unset=True)`` keeps when it writes the backend-extension JSON."""

    REQUIRED = object()
    FIELDS: dict[str, object] = {}

    def __init__(self, **values: object) -> None:
        unknown = sorted(set(values) - set(self.FIELDS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unexpected fields {unknown}")
        for name, default in self.FIELDS.items():
            if default is Config.REQUIRED and name not in values:
                raise TypeError(f"{type(self).__name__}: field {name!r} is required")
            setattr(self, name, values.get(name, default))
        self.explicitly_set = sorted(values)
        self.validate()

    def validate(self) -> None:
        """Checks qairt's validators would make; none by default."""

    def to_record(self) -> dict:
        record = {name: _record(getattr(self, name)) for name in self.FIELDS}
        record["explicitly_set"] = self.explicitly_set
        return record


def _record(value: object) -> object:
    if isinstance(value, Config):
        return value.to_record()
    if isinstance(value, list):
        return [_record(item) for item in value]
    return value
