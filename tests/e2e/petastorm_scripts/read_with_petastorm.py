"""Run in the pinned petastorm environment: read DATASET with make_reader and make_batch_reader, save to OUT.npz.

OUT.npz holds, per reader, the rows' scalar fields as JSON and every decoded image as an array.
"""

import json
import os
import sys
import warnings

import numpy as np
from petastorm import make_batch_reader, make_reader

warnings.simplefilter("ignore")  # petastorm's own deprecation noise about pyarrow's legacy dataset API
dataset_url, out = sys.argv[1], sys.argv[2]
arrays, rows = {}, {"reader": [], "batch_reader": []}
with make_reader(dataset_url, reader_pool_type="dummy", num_epochs=1) as reader:
    fields = list(reader.schema.fields)
    for i, row in enumerate(reader):
        record = row._asdict()
        image = record.pop("image")
        if image is not None:
            arrays[f"reader_{i}"] = image
        rows["reader"].append({k: (None if v is None else str(v)) for k, v in record.items()} | {"i": i})
with make_batch_reader(dataset_url, reader_pool_type="dummy", num_epochs=1) as reader:
    i = 0
    for batch in reader:
        columns = batch._asdict()
        for j in range(len(columns["path"])):
            image = columns["image"][j]
            if image is not None:
                arrays[f"batch_{i}"] = np.frombuffer(image, dtype=np.uint8)  # the stored PNG bytes
            rows["batch_reader"].append({k: (None if v[j] is None else str(v[j]))
                                         for k, v in columns.items() if k != "image"} | {"i": i})
            i += 1
np.savez(out, rows=np.array(json.dumps({"fields": fields, **rows})), **arrays)
sys.stdout.flush()
# The pinned stack (pyarrow 14 and petastorm's threads) sometimes aborts in C++ during interpreter teardown
# ("terminate called without an active exception", exit -6) after all the work is done and saved: skip it.
os._exit(0)
