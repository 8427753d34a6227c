"""Model files are shipped content-addressed (spark/planning.py): a file changed in place within one session is
shipped again under a new name, and the endpoint's fingerprint is that of the bytes shipped."""

from __future__ import annotations

import os
from types import SimpleNamespace

from pyspark.sql.connect.session import SparkSession as ConnectSession

from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.resolve import ResolvedModel
from spark_cnn.models.spec import Endpoint
from spark_cnn.spark.planning import CheckedModel, ship_model_files
from spark_cnn.spark.session import is_connect


class FakeContext:
    """SparkContext's addFile and listFiles as in local mode: a path is registered once, as a file: URI."""

    def __init__(self):
        self.listFiles: list[str] = []
        self.added: list[str] = []

    def addFile(self, path: str) -> None:  # noqa: N802 (Spark's name)
        self.added.append(path)
        self.listFiles.append("file:" + path)


def _checked(weights: str) -> CheckedModel:
    """A model check's result as the driver made it from `weights` at that moment."""
    endpoint = Endpoint(source="pkg.module:factory", weights=weights, preprocessing=Preprocessing(), top_k=1,
                        files={weights: os.path.basename(weights)}).with_fingerprint()
    return CheckedModel(ResolvedModel(endpoint, num_classes=2, embedding_dim=None), labels=None)


def _shipped_bytes(context: FakeContext, name: str) -> bytes:
    path = next(p for p in context.added if os.path.basename(p) == name)
    with open(path, "rb") as f:
        return f.read()


def test_a_file_changed_in_place_is_shipped_again_and_fingerprinted_from_what_is_shipped(tmp_path):
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"first weights")
    spark = SimpleNamespace(sparkContext=FakeContext())
    model = _checked(str(weights))
    first = ship_model_files(spark, model).endpoint
    assert first.fingerprint == model.endpoint.fingerprint  # unchanged file: the checked fingerprint
    assert _shipped_bytes(spark.sparkContext, first.files[str(weights)]) == b"first weights"

    weights.write_bytes(b"other weights")  # in place, same size, same session
    second = ship_model_files(spark, _checked(str(weights))).endpoint
    assert second.files[str(weights)] != first.files[str(weights)]
    assert _shipped_bytes(spark.sparkContext, second.files[str(weights)]) == b"other weights"
    assert second.fingerprint != first.fingerprint

    # A stale check (the file changed after it): the fingerprint still follows the shipped bytes.
    stale = ship_model_files(spark, model).endpoint
    assert stale.files == second.files and stale.fingerprint == second.fingerprint


def test_the_same_bytes_are_shipped_once_per_session(tmp_path):
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"weights")
    spark = SimpleNamespace(sparkContext=FakeContext())
    for _ in range(3):
        ship_model_files(spark, _checked(str(weights)))
    assert len(spark.sparkContext.added) == 1


def test_two_files_with_one_name_in_different_folders_both_ship(tmp_path):
    # Spark refuses a second file of the same name from another path; content-addressed names differ.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "w.pth").write_bytes(b"a")
    (tmp_path / "b" / "w.pth").write_bytes(b"b")
    spark = SimpleNamespace(sparkContext=FakeContext())
    names = {ship_model_files(spark, _checked(str(tmp_path / d / "w.pth"))).endpoint.files[str(tmp_path / d / "w.pth")]
             for d in ("a", "b")}
    assert len(names) == 2 and len(set(map(os.path.basename, spark.sparkContext.added))) == 2


class RecordingConnectSession(ConnectSession):
    """A Spark Connect session that records what addArtifacts would upload (and has no sparkContext)."""

    def __init__(self, session_id: str):  # no server: nothing of the real __init__ runs
        self._session_id = session_id
        self.uploaded: list[tuple[tuple[str, ...], bool]] = []

    def addArtifacts(self, *path: str, pyfile: bool = False, archive: bool = False, file: bool = False) -> None:  # noqa: N802
        self.uploaded.append((path, file))


def test_a_connect_session_gets_the_files_as_artifacts_once_per_session(tmp_path):
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"weights for connect")
    first, second = RecordingConnectSession("session-1"), RecordingConnectSession("session-2")
    assert is_connect(first) and not is_connect(SimpleNamespace(sparkContext=FakeContext()))
    for spark in (first, first, second):
        shipped = ship_model_files(spark, _checked(str(weights))).endpoint
    name = shipped.files[str(weights)]
    for spark in (first, second):
        ((paths, as_file),) = spark.uploaded  # once each, as a plain file (SparkFiles.get(name) in the tasks)
        assert as_file and [os.path.basename(p) for p in paths] == [name]
        with open(paths[0], "rb") as f:
            assert f.read() == b"weights for connect"
