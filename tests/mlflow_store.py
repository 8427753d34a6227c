"""A private MLflow tracking store for tests (sqlite under a temporary folder): a small CNN logged in MLflow 3's
default format (torch.export) and as a pickle, registered, with an alias."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

MODEL_NAME = "tiny_cnn"
ALIAS = "champion"
SIZE = 32  # the exported graph's fixed input size: the crop the signature declares


def tiny_cnn(seed: int = 0) -> torch.nn.Module:
    """Plain torch modules only: its pickle loads wherever torch does."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()


@dataclass(frozen=True)
class Store:
    tracking_uri: str
    run_id: str
    model: torch.nn.Module
    directory: str  # a local MLflow model directory (mlflow.pytorch.save_model)


def make_store(folder: str) -> Store:
    """Log `tiny_cnn` (version 1 of MODEL_NAME, alias ALIAS; artifact `model` in torch.export's format with a
    dynamic batch, `one` exported from a one-image example, `pickled` as a pickle, `scripted` as TorchScript)
    with MLFLOW_TRACKING_URI pointing at a sqlite file in `folder`; the caller sets that variable (returned) for
    the code under test."""
    import mlflow
    import mlflow.pytorch

    uri = f"sqlite:///{os.path.join(folder, 'mlflow.db')}"
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        model = tiny_cnn()
        example = torch.rand(2, 3, SIZE, SIZE).numpy()
        # artifacts next to the database (a sqlite store's default is ./mlruns, in the working directory)
        experiment = mlflow.create_experiment("spark_cnn-tests",
                                              artifact_location=f"file://{os.path.join(folder, 'artifacts')}")
        # Named requirements: MLflow would otherwise infer them by loading the model in a child process.
        quick = {"pip_requirements": ["torch"]}
        with mlflow.start_run(experiment_id=experiment) as run:
            mlflow.pytorch.log_model(model, name="model", input_example=example, registered_model_name=MODEL_NAME,
                                     **quick)
            mlflow.pytorch.log_model(model, name="one", input_example=example[:1], **quick)
            mlflow.pytorch.log_model(model, name="pickled", serialization_format="pickle", **quick)
            mlflow.pytorch.log_model(torch.jit.script(model), name="scripted", serialization_format="pickle", **quick)
        mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, ALIAS, "1")
        directory = os.path.join(folder, "saved_model")
        mlflow.pytorch.save_model(model, directory, input_example=example, **quick)
        return Store(uri, run.info.run_id, model, directory)
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
