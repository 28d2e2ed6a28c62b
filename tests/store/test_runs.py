"""Run folders: skip when up to date, refuse other options, overwrite and tags; manifests; inputs."""

import json
import re
import sys

import pytest
from omegaconf import OmegaConf

from rredcot_cli.errors import ArtifactError, RunError
from rredcot_cli.rng import derive_seed
from rredcot_cli.store import runs
from rredcot_cli.store.runs import begin_stage, find_input, sha256_file

KEYS = ["seed", "sampling"]


def make_cfg(run_dir, **changes):
    """A small config with the fields begin_stage and find_input read."""
    cfg = OmegaConf.create({
        "seed": 0,
        "run": {"dir": str(run_dir), "overwrite": False, "tag": None},
        "sampling": {"n": 8, "temperature": 1.0},
        "train": {"lr": 3e-4},
        "method": {"name": "grpo"},
        "inputs": {"samples": None, "segments": None, "credits": None},
    })
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def start(cfg, stage="sample", inputs=None, subdir=None, overrides=("x=1",)):
    return begin_stage(cfg, stage, list(overrides), inputs or {}, KEYS, subdir=subdir)


def finish(out):
    (out.dir / "samples.parquet").write_bytes(b"rows")
    out.finish({"samples": out.dir / "samples.parquet"}, extra={"completions": 2})


def test_manifest_config_and_overrides(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rredcot", "sample", "x=1"])
    source = tmp_path / "in.parquet"
    source.write_bytes(b"input")
    cfg = make_cfg(tmp_path / "run", seed=7)
    out = start(cfg, inputs={"prompts": source})
    assert out.dir == tmp_path / "run" / "sample"
    manifest = json.loads((out.dir / "manifest.json").read_text())
    assert manifest["status"] == "running" and manifest["stage"] == "sample" and manifest["seed"] == 7
    assert re.fullmatch(r"[0-9a-f]{12}", manifest["config_hash"])
    assert manifest["inputs"] == {"prompts": {"path": str(source), "sha256": sha256_file(source)}}
    assert manifest["command"] == ["rredcot", "sample", "x=1"] and manifest["hostname"]
    assert set(manifest["versions"]) == {"python", "rredcot", "torch", "transformers", "vllm"}
    assert manifest["versions"]["rredcot"]
    # the CPU, because the same seed gives the same numbers only on the same kind of CPU
    assert set(manifest["machine"]) == {"cpu", "cpu_count", "torch_cpu_capability"}
    assert manifest["machine"]["cpu_count"] >= 1 and manifest["machine"]["torch_cpu_capability"]
    assert set(manifest["git"]) == {"sha", "dirty"} and "created" in manifest
    assert OmegaConf.load(out.dir / "config.yaml").sampling.n == 8
    assert OmegaConf.to_container(OmegaConf.load(out.dir / "overrides.yaml")) == ["x=1"]

    finish(out)
    manifest = json.loads((out.dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["extra"] == {"completions": 2}
    assert manifest["outputs"]["samples"] == {"path": "samples.parquet", "sha256": sha256_file(out.dir / "samples.parquet")}


def test_skip_when_up_to_date(tmp_path, capsys):
    finish(start(make_cfg(tmp_path)))
    assert start(make_cfg(tmp_path, train__lr=1.0)) is None  # train is not among the stage's keys
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sample'} is up to date (same config); skipping. Pass run.overwrite=true to redo." in err


def test_unfinished_attempt_is_redone_saying_so(tmp_path, capsys):
    start(make_cfg(tmp_path))  # never finished
    again = start(make_cfg(tmp_path))
    assert again is not None and not again.continuing
    assert capsys.readouterr().err == (f"{tmp_path / 'sample'}: found an unfinished sample attempt with the same "
                                       "config (status 'running'); starting it over\n")


def test_unfinished_attempt_of_a_stage_that_resumes_is_continued(tmp_path, capsys, monkeypatch):
    first = start(make_cfg(tmp_path), stage="train")
    first.stopped("preempted", step=4)
    monkeypatch.setattr(runs, "_machine", lambda: {"cpu": "another CPU"})  # resumed elsewhere
    # train.resume's default (None) and true continue it; the train stage says from which step.
    again = begin_stage(make_cfg(tmp_path), "train", [], {}, KEYS, resume=None)
    assert again.continuing and capsys.readouterr().err == ""
    manifest = json.loads((again.dir / "manifest.json").read_text())
    assert manifest["created"] == first.manifest["created"] and manifest["resumed"][0]["found"] == "preempted"
    # each attempt's machine: the first one's stays on top, a resume's goes with it
    assert manifest["machine"] == first.manifest["machine"] != {"cpu": "another CPU"}
    assert manifest["resumed"][0]["machine"] == {"cpu": "another CPU"}
    # train.resume=false starts over, saying so.
    assert not begin_stage(make_cfg(tmp_path), "train", [], {}, KEYS, resume=False).continuing
    assert "found an unfinished train attempt with the same config (status 'running'); starting it over" in \
        capsys.readouterr().err


def test_unfinished_attempt_with_other_options_is_refused_not_replaced(tmp_path):
    out = start(make_cfg(tmp_path))  # never finished
    (out.dir / "partial.bin").write_bytes(b"work")
    with pytest.raises(RunError) as info:
        start(make_cfg(tmp_path, sampling__n=4))
    assert str(info.value) == (
        f"{tmp_path / 'sample'} holds an unfinished sample attempt (status 'running') made with other options "
        "(differs in: sampling); rerun with its options to continue it, pass run.tag=NAME to keep it and run "
        "beside it, or run.overwrite=true to replace it")
    assert (out.dir / "partial.bin").exists()
    assert json.loads((out.dir / "manifest.json").read_text())["config_hash"] == out.manifest["config_hash"]


def test_overwrite_says_what_it_replaces(tmp_path, capsys):
    start(make_cfg(tmp_path))  # never finished
    assert start(make_cfg(tmp_path, sampling__n=4, run__overwrite=True)) is not None
    assert capsys.readouterr().err == (f"{tmp_path / 'sample'}: run.overwrite=true: replacing the running sample "
                                       "attempt there\n")


def test_refuse_other_options(tmp_path):
    finish(start(make_cfg(tmp_path)))
    with pytest.raises(RunError) as info:
        start(make_cfg(tmp_path, sampling__n=4))
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "sample") in message and "differs in: sampling" in message
    assert "run.tag=NAME" in message and "run.overwrite=true" in message


def test_refuse_other_inputs(tmp_path):
    source = tmp_path / "in.parquet"
    source.write_bytes(b"v1")
    finish(start(make_cfg(tmp_path / "run"), inputs={"samples": source}))
    source.write_bytes(b"v2")
    with pytest.raises(RunError, match="differs in: inputs"):
        start(make_cfg(tmp_path / "run"), inputs={"samples": source})


def test_overwrite_and_tag(tmp_path):
    finish(start(make_cfg(tmp_path)))
    redo = start(make_cfg(tmp_path, sampling__n=4, run__overwrite=True))
    assert redo is not None and redo.dir == tmp_path / "sample"
    assert json.loads((redo.dir / "manifest.json").read_text())["status"] == "running"
    tagged = start(make_cfg(tmp_path, sampling__n=2, run__tag="n2"))
    assert tagged.dir == tmp_path / "sample-n2"
    attribute = start(make_cfg(tmp_path, run__tag="n2"), stage="attribute", subdir="grpo")
    assert attribute.dir == tmp_path / "attribute-n2" / "grpo"


def test_find_input_default_explicit_and_missing(tmp_path):
    run = tmp_path / "runs" / "x"
    cfg = make_cfg(run)
    with pytest.raises(ArtifactError) as info:
        find_input(cfg, "samples")
    assert str(info.value) == (
        f"no samples.parquet in {run / 'sample'}: run `rredcot sample run.dir={run}` first, "
        "or pass inputs.samples=PATH"
    )
    (run / "sample").mkdir(parents=True)
    (run / "sample" / "samples.parquet").write_bytes(b"x")
    assert find_input(cfg, "samples") == run / "sample" / "samples.parquet"

    # A tagged variant reads its own upstream folder if there is one, else the untagged one.
    tagged = make_cfg(run, run__tag="t")
    assert find_input(tagged, "samples") == run / "sample" / "samples.parquet"
    (run / "sample-t").mkdir()
    (run / "sample-t" / "samples.parquet").write_bytes(b"y")
    assert find_input(tagged, "samples") == run / "sample-t" / "samples.parquet"

    explicit = tmp_path / "elsewhere.parquet"
    with pytest.raises(ArtifactError, match="inputs.samples=.*no such file"):
        find_input(make_cfg(run, inputs__samples=str(explicit)), "samples")
    explicit.write_bytes(b"z")
    assert find_input(make_cfg(run, inputs__samples=str(explicit)), "samples") == explicit


def test_find_input_attribute_outputs_are_per_method(tmp_path):
    cfg = make_cfg(tmp_path, method__name="dr_grpo")
    with pytest.raises(ArtifactError) as info:
        find_input(cfg, "credits")
    assert f"no credits.parquet in {tmp_path / 'attribute' / 'dr_grpo'}" in str(info.value)
    assert "method=dr_grpo" in str(info.value)


def test_derive_seed_is_stable():
    assert derive_seed(0, "sample", "p1", 3) == 872753850
    assert derive_seed(1234) == 297192162
    assert derive_seed(0, "sample", 1) != derive_seed(0, "sample", "1")
    assert derive_seed(0, "a") != derive_seed(1, "a")
    seeds = {derive_seed(0, "k", i) for i in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2**31 for s in seeds)
