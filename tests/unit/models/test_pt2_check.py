"""The pickle-free check of a `.pt2` archive reads exactly what torch.export.load reads: crafted archives whose
payload would touch a sentinel file when unpickled are refused with one line before torch sees them (the
sentinel stays absent), and a genuine archive still loads."""

from __future__ import annotations

import json
import pickle
import zipfile

import pytest
import torch

from spark_cnn.errors import ModelError
from spark_cnn.models.mlflow_models import ExportedModel, load_mlflow_file

SOURCE = "models:/crafted/1"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
# Raw tensor metadata torch accepts for a 1-D float32 payload of 4 elements (what the crafted raw entries claim).
TENSOR_META = {"dtype": 7, "sizes": [{"as_int": 4}], "requires_grad": False, "device": {"type": "cpu", "index": None},
               "strides": [{"as_int": 1}], "storage_offset": {"as_int": 0}, "layout": 7}


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


class _Touch:
    """Unpickling it creates `marker`: proof that something unpickled it freely."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """(path of a real torch.export.save archive, its model)."""
    model = _Tiny().eval()
    path = str(tmp_path_factory.mktemp("pt2") / "model.pt2")
    torch.export.save(torch.export.export(model, (torch.rand(2, 3, 4, 4),)), path)
    return path, model


def _evil(marker) -> bytes:
    """A pickle that touches `marker`, padded to whole float32 elements (16 bytes at least) so that torch's raw
    reader accepts the same record for an aliasing raw entry; pickle ignores bytes after its STOP."""
    data = pickle.dumps(_Touch(str(marker)))
    return data + b"\0" * (-len(data) % 4 + 16)


def _rewrite(source: str, target: str, edit) -> None:
    """Copy an archive record by record under its root folder, `edit(records)` changing the {record: bytes} map."""
    with zipfile.ZipFile(source) as archive:
        root = archive.namelist()[0].split("/")[0]
        records = {name[len(root) + 1:]: archive.read(name) for name in archive.namelist()}
    edit(records)
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in records.items():
            archive.writestr(f"{root}/{name}", data)


def _config(records, name) -> dict:
    return json.loads(records[name])["config"]


def _set_config(records, name, entries: dict) -> None:
    records[name] = json.dumps({"config": entries}).encode()


def _decoy(marker):
    """The real weights config marks weight_0 use_pickle; a decoy *_config.json says it is raw."""
    pickled = _pickled_weight(marker)

    def edit(records):
        pickled(records)
        first = next(iter(_config(records, WEIGHTS_CONFIG).values()))
        _set_config(records, "data/weights/x_config.json", {"decoy": {**first, "use_pickle": False}})
    return edit


def _two_entries_for_one_path(marker):
    """weight_0 listed twice in the real config: raw for one weight, pickled for a second name."""
    def edit(records):
        entries = _config(records, WEIGHTS_CONFIG)
        fqn, first = next(iter(entries.items()))
        entries = {fqn: first, "fc.extra": {**first, "use_pickle": True}}  # the raw one first, as torch reads
        records[f"data/weights/{first['path_name']}"] = _evil(marker)
        _set_config(records, WEIGHTS_CONFIG, {**_config(records, WEIGHTS_CONFIG), **entries})
    return edit


def _object_constant(prefix):
    """A constant whose record torch unpickles by its name's prefix, whatever its use_pickle says."""
    def variant(marker):
        def edit(records):
            path_name = f"{prefix}0"
            records[f"data/constants/{path_name}"] = _evil(marker)
            _set_config(records, CONSTANTS_CONFIG, {"obj": {"path_name": path_name, "is_param": False,
                                                            "use_pickle": False, "tensor_meta": TENSOR_META}})
        return edit
    return variant


def _pickled_weight(marker):
    """The real config marks weight_0 use_pickle, with no decoy."""
    def edit(records):
        entries = _config(records, WEIGHTS_CONFIG)
        first = next(iter(entries.values()))
        first["use_pickle"] = True
        records[f"data/weights/{first['path_name']}"] = _evil(marker)
        _set_config(records, WEIGHTS_CONFIG, entries)
    return edit


# variant: (how it is crafted, what the refusal says after "its .pt2 archive: ")
VARIANTS = {
    "decoy config": (_decoy, rf"{WEIGHTS_CONFIG} marks \S+ \(data/weights/weight_0\) use_pickle"),
    "two entries for one path": (_two_entries_for_one_path,
                                 rf"{WEIGHTS_CONFIG} marks fc\.extra \(data/weights/weight_0\) use_pickle"),
    "opaque_obj_ constant": (_object_constant("opaque_obj_"),
                             rf"{CONSTANTS_CONFIG} holds object constant obj \(data/constants/opaque_obj_0\)"),
    "custom_obj_ constant": (_object_constant("custom_obj_"),
                             rf"{CONSTANTS_CONFIG} holds object constant obj \(data/constants/custom_obj_0\)"),
    "use_pickle in the real config": (_pickled_weight, rf"{WEIGHTS_CONFIG} marks \S+ \(data/weights/weight_0\) "
                                                       "use_pickle"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_crafted_pt2_is_refused_before_anything_unpickles(genuine, tmp_path, variant):
    craft, reason = VARIANTS[variant]
    marker, path = tmp_path / "sentinel", str(tmp_path / "model.pt2")
    _rewrite(genuine[0], path, craft(marker))
    with pytest.raises(ModelError, match=f"^--model {SOURCE}: its .pt2 archive: {reason}") as caught:
        load_mlflow_file(path, SOURCE)
    message = str(caught.value)
    assert "\n" not in message and message.endswith("weights_only=False; export the model with tensors only")
    assert not marker.exists()


def test_a_pt2_whose_config_torch_would_need_is_refused(genuine, tmp_path):
    path = str(tmp_path / "model.pt2")
    _rewrite(genuine[0], path, lambda records: records.pop(WEIGHTS_CONFIG))
    with pytest.raises(ModelError, match=f"its .pt2 archive: lacks {WEIGHTS_CONFIG}, which torch.export.load "
                                         "reads for models/model.json"):
        load_mlflow_file(path, SOURCE)


def test_records_torch_would_read_as_one_or_as_code_are_refused(genuine, tmp_path):
    twins, compiled = str(tmp_path / "twins.pt2"), str(tmp_path / "compiled.pt2")
    # torch finds records case-insensitively: two names that differ in case are one record to it
    _rewrite(genuine[0], twins, lambda records: records.update({"DATA/weights/weight_0": b"\0" * 16}))
    with pytest.raises(ModelError, match=r"its .pt2 archive: holds two records named model/DATA/weights/weight_0 "):
        load_mlflow_file(twins, SOURCE)
    _rewrite(genuine[0], compiled, lambda records: records.update({"data/aotinductor/model/a.json": b"{}"}))
    with pytest.raises(ModelError, match="its .pt2 archive: holds AOTInductor code under data/aotinductor/"):
        load_mlflow_file(compiled, SOURCE)


def test_a_genuine_pt2_still_loads(genuine, tmp_path):
    path, model = genuine
    copy = str(tmp_path / "model.pt2")
    _rewrite(path, copy, lambda records: None)  # rewritten by zipfile as the crafted ones are
    images = torch.rand(3, 3, 4, 4)
    for candidate in (path, copy):
        loaded = load_mlflow_file(candidate, SOURCE)
        assert isinstance(loaded, ExportedModel)
        with torch.inference_mode():
            torch.testing.assert_close(loaded(images), model(images))
