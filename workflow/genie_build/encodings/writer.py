"""The canonical writer of AIMET encodings: entries sorted by name, one per line, in the version they were read in
(or AIMET 1.0.0 for encodings made in memory), so equal encodings give equal bytes."""

from __future__ import annotations

import json
import os
from typing import Any

from genie_build.encodings.model import (KIND_TO_ENC_TYPE, V1_SECTIONS, V2_SECTION, WRITTEN_VERSION, Encodings,
                                         TensorEncoding)
from genie_build.fileio import write_text

__all__ = ["format_encodings", "write_encodings"]


def write_encodings(path: str | os.PathLike[str], enc: Encodings) -> None:
    """Write ``enc`` atomically in the canonical form of :func:`format_encodings`."""
    write_text(path, format_encodings(enc))


def format_encodings(enc: Encodings) -> str:
    """The canonical text of ``enc``: entries sorted by name, one per line.

    Encodings read from a file are written in that file's version, each entry and top-level key as read
    (the SDK converter reads what AIMET wrote). Encodings made or changed in memory are written as AIMET
    1.0.0. Equal inputs give equal bytes, whatever order the entries were read in.
    """
    as_read = _entries_as_read(enc)
    if as_read is not None:
        return _format_file({**enc.header, "version": enc.version}, as_read, as_dicts=enc.version == "0.6.1")
    producer = {"producer": enc.header["producer"]} if "producer" in enc.header else {}
    return _format_file({"version": WRITTEN_VERSION, "quantizer_args": enc.quantizer_args, **producer},
                        {key: {name: _entry_v100(encodings[name]) for name in encodings}
                         for key, encodings in (("activation_encodings", enc.activations),
                                                ("param_encodings", enc.params))},
                        as_dicts=False)


def _entries_as_read(enc: Encodings) -> dict[str, dict[str, Any]] | None:
    """Each section's entries as read, when every encoding of ``enc`` is still the one read; else None."""
    if enc.version == "2.0.0":
        wanted = {(V2_SECTION, name): e for name, e in (*enc.activations.items(), *enc.params.items())}
    else:
        wanted = {(key, name): e for key, encodings in (("activation_encodings", enc.activations),
                                                         ("param_encodings", enc.params))
                  for name, e in encodings.items()}
    if not enc.entries or any(enc.entries.get(key, (None, None))[1] != e for key, e in wanted.items()):
        return None
    sections: dict[str, dict[str, Any]] = {key: {} for key in
                                           ((V2_SECTION,) if enc.version == "2.0.0" else
                                            tuple(key for key, _ in V1_SECTIONS))}
    for key, name in wanted:
        sections[key][name] = enc.entries[key, name][0]
    return sections


def _format_file(header: dict, sections: dict[str, dict[str, Any]], as_dicts: bool) -> str:
    """``header``'s keys, then each section: an object keyed by name (0.6.1) or a list of entries with a
    ``name`` first; entries sorted by name, one per line."""
    lines = [f'  "version": {json.dumps(header["version"])}']
    for key, entries in sections.items():
        items = []
        for name in sorted(entries):
            entry = entries[name]
            text = (json.dumps(entry) if as_dicts
                    else json.dumps({"name": name, **{k: v for k, v in entry.items() if k != "name"}}))
            items.append(f"    {json.dumps(name)}: {text}" if as_dicts else f"    {text}")
        brackets = "{}" if as_dicts else "[]"
        body = f"{brackets[0]}\n" + ",\n".join(items) + f"\n  {brackets[1]}" if items else brackets
        lines.append(f'  "{key}": {body}')
    lines += [f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}"
              for key, value in sorted(header.items()) if key != "version"]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _entry_v100(encoding: TensorEncoding) -> dict[str, Any]:
    if encoding.dtype == "float":
        return {"dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": encoding.bitwidth}
    entry: dict[str, Any] = {
        "dtype": "INT", "enc_type": KIND_TO_ENC_TYPE[encoding.kind],
        "bw": encoding.bitwidth, "is_sym": encoding.is_symmetric,
        "scale": encoding.scale, "offset": encoding.offset,
    }
    if encoding.block_size is not None:
        entry["block_size"] = encoding.block_size
    if encoding.compressed_bitwidth is not None:
        entry["compressed_bw"] = encoding.compressed_bitwidth
    if encoding.per_block_int_scale is not None:
        entry["per_block_int_scale"] = encoding.per_block_int_scale
    return entry
