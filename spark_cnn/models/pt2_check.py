"""The pickle-free check of a `.pt2` archive, which reads exactly what torch.export.load will read.

torch.export.load (torch/export/pt2_archive/_package.py, `load_pt2`) unpickles with weights_only=False, so an
archive is refused unless every record it reads is JSON, one of its short text records, a torch file that loads
with weights_only=True, or raw tensor bytes. What it reads, under the archive's one root folder: for each
`models/<m>.json`, the configs `data/weights/<m>_weights_config.json` and
`data/constants/<m>_constants_config.json` (unless a legacy `data/weights/<m>.pt` / `data/constants/<m>.pt`, a
torch file, replaces one); each config entry names a record in its folder, read raw only when its `use_pickle`
is false and, for a constant, its name starts `tensor_` (`custom_obj_` / `opaque_obj_` constants are unpickled
whatever use_pickle says); `data/aotinductor/` holds compiled code it runs. Records are found by name
case-insensitively. An archive that is not one root folder is read as torch's pre-2.8 layout: no configs.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile

import torch
from torch.export.pt2_archive import constants as pt2

from spark_cnn.errors import ModelError

# Records torch reads as text (never unpickled): format, version, byte order, ids.
_TEXT_RECORDS = ("archive_format", "archive_version", "byteorder", "version", "serialization_id")
_TEXT = re.compile(r"^[A-Za-z0-9_.\-]*\n?$")
# The only raw record names torch.export.save writes, per folder: a name outside them could be a record torch
# also reads another way (a legacy `<m>.pt`), or leave its folder.
_RAW_NAMES = {pt2.WEIGHTS_DIR: re.compile(rf"^{pt2.WEIGHT_FILENAME_PREFIX}[0-9]+$"),
              pt2.CONSTANTS_DIR: re.compile(rf"^{pt2.TENSOR_CONSTANT_FILENAME_PREFIX}[0-9]+$")}
_OBJECT_PREFIXES = (pt2.CUSTOM_OBJ_FILENAME_PREFIX, pt2.OPAQUE_OBJ_FILENAME_PREFIX)
_CONFIGS = ((pt2.WEIGHTS_DIR, pt2.WEIGHTS_CONFIG_FILENAME_FORMAT),
            (pt2.CONSTANTS_DIR, pt2.CONSTANTS_CONFIG_FILENAME_FORMAT))


def check_pickle_free(path: str, source: str) -> None:
    """Refuse (ModelError, one line) a .pt2 archive holding anything torch.export.load would unpickle freely."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise ModelError(f"--model {source}: {os.path.basename(path)} is not a .pt2 archive ({e})") from e
    with archive:
        names = [info.filename for info in archive.infolist()]
        seen: set[str] = set()
        for name in names:
            if name.lower() in seen:
                raise _refused(source, f"holds two records named {name} (torch finds names case-insensitively)")
            seen.add(name.lower())
        raw = _raw_records(archive, names, source)
        for name in names:
            if name.endswith("/") or name.lower() in raw:
                continue
            _check_record(name, archive.read(name), source)


def _raw_records(archive: zipfile.ZipFile, names: list[str], source: str) -> set[str]:
    """The archive names (lower case) torch reads as raw tensor bytes; refuses any config entry it would
    unpickle, a config it needs that is missing, and compiled code."""
    root = names[0].partition("/")[0] if names and "/" in names[0] else None
    if root is None or not all(name.startswith(f"{root}/") for name in names):
        return set()  # torch's pt2 reader refuses it and falls back to the pre-2.8 layout, which reads no configs
    records = {name[len(root) + 1:]: name for name in names}
    if any(record.startswith(pt2.AOTINDUCTOR_DIR) for record in records):
        raise _refused(source, f"holds AOTInductor code under {pt2.AOTINDUCTOR_DIR}, which torch.export.load runs")
    prefix, suffix = pt2.MODELS_FILENAME_FORMAT.split("{}")
    claimed: dict[str, str] = {}  # archive name (lower case) -> the config that names it
    for record in records:
        if not record.startswith(prefix):
            continue
        model = record[len(prefix):-len(suffix)]  # as load_pt2 slices it
        for folder, config_format in _CONFIGS:
            if f"{folder}{model}.pt" in records:
                continue  # legacy: torch reads this torch file, checked as one, instead of a config
            config = config_format.format(model)
            if config not in records:
                raise _refused(source, f"lacks {config}, which torch.export.load reads for {record}")
            for target in _config_records(archive.read(records[config]), folder, config, source):
                owner = claimed.setdefault(f"{root}/{target}".lower(), config)
                if owner != config:
                    raise _refused(source, f"{config} and {owner} both name {target}")
    return set(claimed)


def _config_records(data: bytes, folder: str, config: str, source: str) -> list[str]:
    """The records (`<folder><name>`) a payload config's entries name, each one torch reads raw."""
    try:
        entries = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)["config"]
        items = entries.items()
    except _DuplicateKey as e:
        raise _refused(source, f"{config} names {e} twice") from e
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise _refused(source, f"{config} is not a payload config ({type(e).__name__}: {e})") from e
    targets = []
    for fqn, entry in items:
        name = entry.get("path_name") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise _refused(source, f"{config} gives {fqn} no path_name")
        if folder == pt2.CONSTANTS_DIR and name.startswith(_OBJECT_PREFIXES):
            raise _refused(source, f"{config} holds object constant {fqn} ({folder}{name}), unpickled "
                                   "whatever its use_pickle says")
        if entry.get("use_pickle") is not False:
            raise _refused(source, f"{config} marks {fqn} ({folder}{name}) use_pickle")
        if not _RAW_NAMES[folder].match(name):
            raise _refused(source, f"{config} names record {name!r} for {fqn}, not one torch.export.save writes")
        targets.append(f"{folder}{name}")  # several entries may share one: tied weights, which torch aliases
    return targets


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, refusing a key given twice (json keeps the last silently)."""
    result = dict(pairs)
    if len(result) != len(pairs):
        keys = [key for key, _ in pairs]
        raise _DuplicateKey(next(key for key in keys if keys.count(key) > 1))
    return result


def _check_record(name: str, data: bytes, source: str) -> None:
    """A record torch does not read raw: JSON, short text, or a torch file that loads with weights_only=True."""
    if _json(data) is not None:
        return
    if name.rpartition("/")[2] in _TEXT_RECORDS and _TEXT.match(data.decode("ascii", errors="replace")):
        return
    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelError(f"--model {source}: record {name} of its .pt2 archive needs a free unpickle (it can run "
                         f"code; {type(e).__name__}), refused; export the model with tensors and plain values "
                         "only") from e


def _refused(source: str, what: str) -> ModelError:
    return ModelError(f"--model {source}: its .pt2 archive: {what}; refused, as torch.export.load unpickles with "
                      "weights_only=False; export the model with tensors only")


def _json(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return None
