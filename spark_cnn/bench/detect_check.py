"""The detection bench's row check: do spark_cnn and predict_batch_udf find the same boxes in the same images?

Both variants write Parquet in their own layout: spark_cnn's `detect` job `path, detections
array<struct<label, label_name, score, box>>, error`, the predict_batch_udf variant (pyspark's struct return
types hold arrays of scalars, not arrays of structs) `path, labels, scores, boxes` with boxes flattened to 4k
floats. Each is read into {path: detections} and every spark_cnn detection is matched to an unused one of the
other side's in the same image: same label, score and box within tolerance. Order is not compared: random
weights score many boxes alike, and ties may fall either way.
"""

from __future__ import annotations

import os

import numpy as np

# Both sides run the same float32 model on the same pixels; only batch composition and thread count differ,
# which moves a score or a box coordinate by float rounding (~1e-6 relative), far inside these.
SCORE_TOLERANCE = 1e-4
BOX_TOLERANCE_PX = 0.05
# Share of spark_cnn's detections that must find their twin: a box whose IoU with a neighbour sits on the
# detector's NMS threshold may be kept by one side's rounding and dropped by the other's.
MIN_MATCHED = 0.99


def _key(path: str) -> str:
    """One spelling of a local file's path (Spark writes `file:/a`, `file:///a`)."""
    if path.startswith("file:"):
        path = "/" + path[len("file:"):].lstrip("/")
    return os.path.normpath(path)


def spark_cnn_rows(table) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{path: (labels (k,), scores (k,), boxes (k, 4))} from the detect job's Parquet (a pyarrow Table)."""
    rows = {}
    for row in table.select(["path", "detections"]).to_pylist():
        found = row["detections"] or []
        rows[_key(row["path"])] = (np.array([d["label"] for d in found], dtype=np.int64),
                                   np.array([d["score"] for d in found], dtype=np.float64),
                                   np.array([d["box"] for d in found], dtype=np.float64).reshape(-1, 4))
    return rows


def flat_rows(table) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The same from `path, labels, scores, boxes` (boxes flattened: x1, y1, x2, y2 per detection)."""
    rows = {}
    for row in table.select(["path", "labels", "scores", "boxes"]).to_pylist():
        rows[_key(row["path"])] = (np.array(row["labels"] or [], dtype=np.int64),
                                   np.array(row["scores"] or [], dtype=np.float64),
                                   np.array(row["boxes"] or [], dtype=np.float64).reshape(-1, 4))
    return rows


def _matched(ours, theirs) -> tuple[int, float, float]:
    """(detections of `ours` with a twin in `theirs`, largest score and box difference among the twins)."""
    labels, scores, boxes = theirs
    free = np.ones(len(labels), dtype=bool)
    matched, score_diff, box_diff = 0, 0.0, 0.0
    for label, score, box in zip(*ours, strict=True):
        score_gap = np.abs(scores - score)
        box_gap = np.abs(boxes - box).max(axis=1) if len(boxes) else np.zeros(0)
        hits = np.flatnonzero(free & (labels == label) & (score_gap <= SCORE_TOLERANCE)
                              & (box_gap <= BOX_TOLERANCE_PX))
        if len(hits):
            twin = hits[np.argmin(box_gap[hits])]
            free[twin] = False
            matched += 1
            score_diff, box_diff = max(score_diff, score_gap[twin]), max(box_diff, box_gap[twin])
    return matched, score_diff, box_diff


def compare_detections(ours: dict, theirs: dict) -> dict:
    """How far spark_cnn's rows (`ours`) agree with predict_batch_udf's (`theirs`); `passed` when both hold the
    same images with the same number of detections each and at least MIN_MATCHED of ours find a twin."""
    common = sorted(set(ours) & set(theirs))
    same_count = sum(len(ours[p][0]) == len(theirs[p][0]) for p in common)
    detections = sum(len(ours[p][0]) for p in common)
    matched, score_diff, box_diff = 0, 0.0, 0.0
    for path in common:
        m, s, b = _matched(ours[path], theirs[path])
        matched, score_diff, box_diff = matched + m, max(score_diff, s), max(box_diff, b)
    fraction = matched / detections if detections else 1.0
    return {"images": len(common), "only_spark_cnn": len(set(ours) - set(theirs)),
            "only_predict_batch_udf": len(set(theirs) - set(ours)), "same_count": same_count,
            "detections": detections, "matched": matched, "matched_fraction": round(fraction, 5),
            "max_score_diff": float(score_diff), "max_box_diff_px": float(box_diff),
            "passed": bool(common) and len(common) == len(ours) == len(theirs) and same_count == len(common)
            and fraction >= MIN_MATCHED}


def check_outputs(spark_cnn_dir: str, pbu_dir: str) -> dict:
    """compare_detections over the two variants' Parquet folders."""
    import pyarrow.parquet as pq

    return compare_detections(spark_cnn_rows(pq.read_table(spark_cnn_dir)), flat_rows(pq.read_table(pbu_dir)))


def summary_line(check: dict) -> str:
    """The row check in one line, for the bench's table."""
    verdict = "passed" if check["passed"] else "FAILED"
    return (f"  row check spark_cnn vs predict_batch_udf: {verdict}: {check['images']} images in both "
            f"(+{check['only_spark_cnn']} / +{check['only_predict_batch_udf']} in one only), same box count in "
            f"{check['same_count']}, {check['matched']} of {check['detections']} detections matched (label, "
            f"score within {SCORE_TOLERANCE}, box within {BOX_TOLERANCE_PX} px; max diffs "
            f"{check['max_score_diff']:.2g}, {check['max_box_diff_px']:.2g} px)")
