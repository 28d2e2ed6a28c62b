"""Reruns across stages: inputs must be the finished, unchanged outputs of their producing stage,
made from each other and under the same model/benchmark; otherwise the stage refuses and the
message names both sides. (Skip / refuse / tag / overwrite of one stage: tests/store/test_runs.py.)"""

import json

import pytest
from omegaconf import OmegaConf

from rredcot_cli.errors import RunError
from rredcot_cli.store.runs import begin_stage


def make_cfg(run_dir, **changes):
    cfg = OmegaConf.create({
        "seed": 0,
        "run": {"dir": str(run_dir), "overwrite": False, "tag": None},
        "model": {"path": "embedded", "dtype": "float32"},
        "benchmark": {"name": "chain"},
        "sampling": {"n": 8},
        "segment": {"name": "newline"},
        "method": {"name": "rredcot"},
    })
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


SAMPLE_KEYS = ["seed", "model", "benchmark", "sampling"]
SEGMENT_KEYS = ["segment", "model"]
ATTRIBUTE_KEYS = ["method", "seed", "model", "benchmark"]


def produce(cfg, stage, keys, file_name, inputs=None, content=b"rows"):
    out = begin_stage(cfg, stage, [], inputs or {}, keys)
    (out.dir / file_name).write_bytes(content)
    out.finish({stage: out.dir / file_name})
    return out.dir / file_name


@pytest.fixture
def run(tmp_path):
    """sample -> segment in one run dir; returns (cfg, samples path, segments path)."""
    cfg = make_cfg(tmp_path)
    samples = produce(cfg, "sample", SAMPLE_KEYS, "samples.parquet")
    segments = produce(cfg, "segment", SEGMENT_KEYS, "segments.parquet", inputs={"samples": samples})
    return cfg, samples, segments


def test_matching_inputs_are_accepted(run):
    cfg, samples, segments = run
    assert begin_stage(cfg, "attribute", [], {"samples": samples, "segments": segments}, ATTRIBUTE_KEYS) is not None


def test_segments_of_other_samples_are_refused_naming_both(run, tmp_path):
    cfg, samples, segments = run
    # The samples were remade (run.overwrite=true) after the segments were cut from the old ones.
    produce(make_cfg(tmp_path, sampling__n=4, run__overwrite=True), "sample", SAMPLE_KEYS, "samples.parquet",
            content=b"other rows")
    with pytest.raises(RunError) as info:
        begin_stage(cfg, "attribute", [], {"samples": samples, "segments": segments}, ATTRIBUTE_KEYS)
    message = str(info.value)
    assert message.startswith(f"input segments {segments} was made from samples {samples} (sha256 ")
    assert f"but this attribute run reads samples {samples} (sha256 " in message
    assert "rerun `rredcot segment` on these samples" in message and "\n" not in message


def test_input_from_another_model_is_refused_naming_both_configs(run, tmp_path):
    cfg, samples, _ = run
    with pytest.raises(RunError) as info:
        begin_stage(make_cfg(tmp_path, model__path="runs/x/train/checkpoints/final", run__tag="ckpt"),
                    "segment", [], {"samples": samples}, SEGMENT_KEYS)
    assert str(info.value) == (
        f"input samples {samples} was made by `rredcot sample` under another config than this segment run: "
        f"model.path=embedded vs model.path=runs/x/train/checkpoints/final ({samples.parent / 'config.yaml'} "
        "vs this command); pass the same model options, or remake the samples")
    # A seed or sampling change is not a mismatch: attribution may use its own seed.
    assert begin_stage(make_cfg(tmp_path, seed=5, run__tag="s5"), "segment", [], {"samples": samples},
                       SEGMENT_KEYS) is not None


def test_input_changed_after_its_stage_wrote_it(run):
    cfg, samples, _ = run
    samples.write_bytes(b"edited by hand")
    with pytest.raises(RunError, match=rf"^input samples {samples} changed after `rredcot sample` wrote it "
                                       r"\(manifest sha256 [0-9a-f]{12}, file sha256 [0-9a-f]{12}\)"):
        begin_stage(make_cfg(cfg.run.dir, run__tag="t"), "segment", [], {"samples": samples}, SEGMENT_KEYS)


def test_input_of_an_unfinished_attempt_is_refused(run, tmp_path):
    cfg, samples, _ = run
    # A rerun with other options started (and died) before writing its samples: the file there
    # is the previous config's, while config.yaml already describes the new one.
    begin_stage(make_cfg(tmp_path, sampling__n=2, run__overwrite=True), "sample", [], {}, SAMPLE_KEYS)
    with pytest.raises(RunError) as info:
        begin_stage(make_cfg(tmp_path, run__tag="t"), "segment", [], {"samples": samples}, SEGMENT_KEYS)
    assert str(info.value) == (
        f"input samples {samples} belongs to an unfinished `rredcot sample` attempt "
        f"({samples.parent / 'manifest.json'} says status 'running'); finish that stage first, "
        "or pass inputs.samples=PATH")


def test_files_from_elsewhere_are_taken_as_they_are(tmp_path):
    foreign = tmp_path / "elsewhere" / "samples.parquet"
    foreign.parent.mkdir()
    foreign.write_bytes(b"rows")  # no manifest beside it
    out = begin_stage(make_cfg(tmp_path / "run"), "segment", [], {"samples": foreign}, SEGMENT_KEYS)
    assert json.loads((out.dir / "manifest.json").read_text())["inputs"]["samples"]["path"] == str(foreign)
