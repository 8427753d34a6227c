"""detect and segment refuse what does not fit them before any Spark work, in one line naming the fix."""

from __future__ import annotations

import pytest

from spark_cnn.cli import EXIT_ERROR, main
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.tiny_dense import TINY_DETECTOR, TINY_SEGMENTER


@pytest.mark.parametrize("command, model, fits", [
    ("detect", DIGITS_FACTORY, "spark-cnn classify"),
    ("segment", TINY_DETECTOR, "spark-cnn detect"),
    ("classify", TINY_DETECTOR, "spark-cnn detect"),
    ("classify", TINY_SEGMENTER, "spark-cnn segment"),
    ("embed", TINY_SEGMENTER, "spark-cnn segment"),
])
def test_a_model_of_another_task_names_the_command_that_fits(command, model, fits, tmp_path, capsys):
    (tmp_path / "in").mkdir()
    assert main([command, str(tmp_path / "in"), str(tmp_path / "out"), "--model", model]) == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"run it with {fits}"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, says", [
    (["--decode", "sidecar"], "use --decode auto or task"),
    (["--min-score", "1.5"], "between 0 and 1"),
    (["--max-detections", "0"], "positive integer"),
])
def test_bad_detect_options_stop_before_the_model_loads(flags, says, tmp_path, capsys):
    (tmp_path / "in").mkdir()
    assert main(["detect", str(tmp_path / "in"), str(tmp_path / "out"), "--model", TINY_DETECTOR, *flags]) == \
        EXIT_ERROR
    assert says in capsys.readouterr().err


def test_a_detect_preset_resolves_to_a_detect_config(tmp_path):
    from spark_cnn.cli import detect
    from spark_cnn.cli.run import resolve_preset

    preset = tmp_path / "boxes.yaml"
    preset.write_text(f"job: detect\ninput: in/\noutput: out/\nmodel: {TINY_DETECTOR}\nmin-score: 0.3\n")
    job, values = resolve_preset(str(preset), ["--max-detections", "4"], spark_conf={"spark.cnn.batchSize": "2"})
    config = detect.classify.config_from({**values, "task": job})
    assert job == "detect"
    assert (config.inference.task, config.inference.min_score, config.inference.max_detections,
            config.inference.batch_size) == ("detect", 0.3, 4, 2)
