"""Bad input: each mistake or accident ends in one clear `error:` line (exit 2) that names the file,
line or key, or is absorbed (a hanging verifier, a huge or non-UTF-8 completion, one NaN loss)
without losing what was finished."""

import errno
import re
import json
import math
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from rredcot_cli.store import artifacts
from rredcot_cli.store.artifacts import read_artifact, write_artifact
from rredcot_cli.policy.base import Completion
from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.cli import app
from rredcot_cli.config.search import group_options
from rredcot_cli.errors import ArtifactError, RredcotError, StorageError, TrainingError

runner = CliRunner()


def rredcot(*args):
    """The CLI in this process; returns (exit code, stderr)."""
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stderr


def one_error_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) >= 1 and lines[-1].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[-1]


# --------------------------------------------------------------------------- benchmark data files


GSM8K_ROW = {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}


def _gsm8k_file(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b'{"question": "2+2?", "answer": "#### 4"', ":3: invalid JSON"),
        (b'["not", "an", "object"]', ":3: expected a JSON object, got list"),
        (b'{"question": "2+2?"}', ":3: a GSM8K row needs string fields 'question' and 'answer'"),
        (b'{"question": "2+2?", "answer": "no marker"}', ":3: malformed GSM8K answer: no '####'"),
        (b'{"question": "caf\xe9", "answer": "#### 4"}', ":3: not UTF-8 text (byte 18 of the line)"),
    ],
)
def test_malformed_jsonl_row_names_file_and_line(tmp_path, line, fragment):
    good = json.dumps(GSM8K_ROW).encode()
    path = _gsm8k_file(tmp_path, [good, good, line, good])
    code, stderr = rredcot("sample", f"run.dir={tmp_path / 'run'}", "benchmark=gsm8k", f"benchmark.path={path}",
                           "sample.num_prompts=4")
    assert code == 2
    assert one_error_line(stderr).startswith(f"error: {path}{fragment}")
    assert not (tmp_path / "run" / "sample" / "samples.parquet").exists()


def test_malformed_parquet_benchmark_row_names_the_row(tmp_path):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"question": ["a?", "b?"], "answer": ["#### 1", "oops"]}), path)
    with pytest.raises(RredcotError, match=rf"^{path} row 1: malformed GSM8K answer"):
        make_benchmark("gsm8k", path=str(path)).load("train")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(RredcotError, match=r"broken.parquet: cannot read Parquet"):
        make_benchmark("gsm8k", path=str(tmp_path / "broken.parquet")).load("train")


def test_empty_split(tmp_path):
    path = _gsm8k_file(tmp_path, [b"", b"   "])
    code, stderr = rredcot("train", f"run.dir={tmp_path / 'run'}", "benchmark=gsm8k", f"benchmark.path={path}")
    assert code == 2
    assert one_error_line(stderr) == f"error: benchmark gsm8k: split 'train' ({path}) has no rows"


def test_unknown_split_of_a_synthetic_benchmark(tmp_path):
    code, stderr = rredcot("sample", f"run.dir={tmp_path}", "sample.split=dev")
    assert code == 2
    assert one_error_line(stderr) == "error: benchmark chain has no split 'dev'; valid splits: test, train, validation"


# --------------------------------------------------------------------------- overrides and names


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.steps=abc", "error: train.steps=abc: expected an int"),
        ("train.resume=maybe", "error: train.resume=maybe: expected a bool (true/false)"),
        ("sampling.temperature=hot", "error: sampling.temperature=hot: expected a float"),
        ("method=nope", "error: unknown option 'method=nope'; valid methods: "
                        + ", ".join(group_options()["method"])),
        ("segment=newlin", "error: unknown option 'segment=newlin'; did you mean newline? Valid segments: "
                           "entropy, fixed, hybrid, keyword, newline"),
        ("train.resum=true", "error: unknown key 'train.resum'; did you mean train.resume?"),
        ("inputs.sample=x", "error: unknown key 'inputs.sample'; did you mean inputs.samples?"),
    ],
)
def test_wrong_types_and_unknown_names(tmp_path, override, expected):
    code, stderr = rredcot("train", f"run.dir={tmp_path}", override)
    assert code == 2
    assert one_error_line(stderr).startswith(expected)
    assert not (tmp_path / "train").exists()


def test_unknown_benchmark_lists_the_valid_ones():
    from rredcot_cli.benchmarks import benchmark_names

    with pytest.raises(RredcotError) as info:
        make_benchmark("gsm9k")
    assert str(info.value) == f"unknown benchmark 'gsm9k'; valid: {', '.join(benchmark_names())}"


# --------------------------------------------------------------------------- artifacts


SAMPLE = {
    "prompt_id": "p0", "sample_idx": 0, "prompt": "1+1", "prompt_token_ids": [1, 2], "completion": "=2",
    "completion_token_ids": [3, 4], "completion_logprobs": [-0.1, -0.2], "reward": 1.0, "scorable": True,
    "gold_answer": "2", "pred_answer": "2", "benchmark": "chain", "finish_reason": "stop", "num_tokens": 2,
    "meta": "{}",
}


def _samples(tmp_path, *changes):
    """A samples file of 3 rows; ``changes[i]`` updates row i."""
    rows = [dict(SAMPLE, sample_idx=i) for i in range(3)]
    for i, change in enumerate(changes):
        rows[i].update(change)
    table = pa.Table.from_pylist(rows, schema=artifacts.SAMPLES)
    path = tmp_path / "samples.parquet"
    pq.write_table(table, path)  # as another tool would write it: no validation on the way in
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (({}, {"completion_logprobs": [-0.1]}), "row 1: 1 completion_logprobs for 2 completion_token_ids"),
        (({}, {}, {"num_tokens": 7}), "row 2: num_tokens is 7 but there are 2 completion_token_ids"),
        (({}, {"reward": float("nan")}), "row 1: reward is nan, not a finite number"),
        (({}, {"sample_idx": 0}), "row 1: duplicate key (prompt_id='p0', sample_idx=0), first at row 0"),
    ],
)
def test_malformed_artifact_rows_name_file_and_row(tmp_path, changes, message):
    path = _samples(tmp_path, *changes)
    with pytest.raises(ArtifactError) as info:
        read_artifact("samples", path)
    assert str(info.value) == f"{path} {message}"


def test_malformed_artifact_row_through_the_cli(tmp_path):
    path = _samples(tmp_path, {}, {"completion_logprobs": []})
    code, stderr = rredcot("segment", f"run.dir={tmp_path / 'run'}", f"inputs.samples={path}")
    assert code == 2
    assert one_error_line(stderr) == f"error: {path} row 1: 0 completion_logprobs for 2 completion_token_ids"


def test_invalid_utf8_in_an_artifact_names_the_row(tmp_path):
    good = pa.array([b"ok", b"fine", b"caf\xe9"], pa.binary())
    text = pa.Array.from_buffers(pa.string(), 3, good.buffers())  # bytes that are not UTF-8
    table = pa.Table.from_pylist([dict(SAMPLE, sample_idx=i) for i in range(3)], schema=artifacts.SAMPLES)
    table = table.set_column(table.schema.get_field_index("completion"), "completion", text)
    pq.write_table(table, tmp_path / "samples.parquet")
    with pytest.raises(ArtifactError, match=r"samples.parquet row 2: column completion is not valid UTF-8 text$"):
        read_artifact("samples", tmp_path / "samples.parquet")


def test_other_artifact_row_checks(tmp_path):
    segments = pa.Table.from_pylist(
        [{"prompt_id": "p", "sample_idx": 0, "segment_idx": 0, "token_start": 3, "token_end": 1, "text": "",
          "strategy": "fixed"}], schema=artifacts.SEGMENTS)
    pq.write_table(segments, tmp_path / "segments.parquet")
    with pytest.raises(ArtifactError, match=r"row 0: segment \[3, 1\) is not a token range"):
        read_artifact("segments", tmp_path / "segments.parquet")
    advantages = pa.Table.from_pylist(
        [{"prompt_id": "p", "sample_idx": i, "method": "grpo", "token_advantages": values}
         for i, values in enumerate([[0.5], [0.1, float("inf")]])], schema=artifacts.ADVANTAGES)
    pq.write_table(advantages, tmp_path / "advantages.parquet")
    with pytest.raises(ArtifactError, match=r"row 1: token_advantages holds inf, not a finite number"):
        read_artifact("advantages", tmp_path / "advantages.parquet")


def test_truncated_artifact_is_refused(tmp_path):
    path = write_artifact("samples", [SAMPLE], tmp_path / "samples.parquet")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArtifactError, match=rf"^{path} is not a readable Parquet file"):
        read_artifact("samples", path)


def test_non_utf8_completion_text_is_kept_with_replacement_characters(tmp_path, caplog):
    row = dict(SAMPLE, completion="caf\udce9 =2")  # a lone surrogate, as surrogateescape decoding makes
    path = write_artifact("samples", [row], tmp_path / "samples.parquet")
    assert read_artifact("samples", path).column("completion").to_pylist() == ["caf\ufffd =2"]
    assert "not valid Unicode" in caplog.text


# --------------------------------------------------------------------------- completions


class _FixedBackend:
    """A backend whose completions are given texts (char tokenizer ids, so segmenters see them)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, texts

    def generate(self, prompts, params, seed):
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in self.texts]
        return [[Completion(token_ids=i, logprobs=[-1.0] * len(i), text=t, finish_reason="length")
                 for i, t in zip(ids, self.texts)] for _ in prompts]


def test_hanging_verifier_counts_as_unscorable_and_huge_completions_pass(tmp_path):
    from rredcot_cli.policy.models import build_char_tokenizer
    from rredcot_cli.policy.load import Policy
    from rredcot_cli.pipeline import sample_rows, segment_rows
    from rredcot_cli.config.schema import SegmentConfig

    tokenizer = build_char_tokenizer()
    latex = "We have $x^{2}+\\frac{a}{b}$ and " * 1600  # 51 kB of LaTeX in the answer
    texts = [
        "so \\boxed{10^{10^{10}}}",  # sympy would evaluate this for minutes
        "2+3=5 so \\boxed{5}",
        latex + "\\boxed{5}",
        "1+2=3\n" * 9000,  # 54 kB, one step per line
    ]
    benchmark = make_benchmark("gsm8k", verify_timeout_s=1.0)
    problem = benchmark.load("test", limit=1)[0]
    problem = type(problem)(prompt_id=problem.prompt_id, question=problem.question, gold_answer="5")
    policy = Policy(model=None, tokenizer=tokenizer, backend=_FixedBackend(tokenizer, texts), device="cpu",
                    chat_template=False)
    rows = sample_rows(policy, benchmark, [problem], n=len(texts), max_new_tokens=60000, temperature=1.0,
                       top_p=1.0, seed=0, prompts_per_call=1)
    assert [(r["scorable"], r["reward"]) for r in rows] == [(False, 0.0), (True, 1.0), (True, 1.0), (True, 0.0)]
    assert len(rows[3]["completion"]) == 54_000

    path = write_artifact("samples", rows, tmp_path / "samples.parquet")
    back = read_artifact("samples", path).to_pylist()
    assert [r["completion"] for r in back] == texts
    segments = segment_rows(back, tokenizer, SegmentConfig(name="newline", min_tokens=4, max_segments=40))
    artifacts.validate_segments_tile(artifacts.build_table("segments", segments), read_artifact("samples", path))


# --------------------------------------------------------------------------- non-finite losses


@pytest.fixture(scope="module")
def tiny():
    from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path

    return load_model_and_tokenizer(resolve_model_path("embedded"), dtype="float32", device="cpu",
                                    trust_remote_code=False)


def _nan_gradient_loss(logprobs, *args, **kwargs):
    """A finite loss (0) whose gradient is NaN, like an overflow inside the backward pass."""
    from rredcot_cli.train.loss import policy_loss

    loss, stats = policy_loss(logprobs, *args, **kwargs)
    zero = (logprobs * 0).sum()
    return loss * 0 + torch.sqrt(zero - zero), stats


@pytest.mark.parametrize("kind", ["nan loss", "inf loss", "nan gradient"])
def test_non_finite_updates_are_skipped_and_leave_the_weights(tiny, monkeypatch, kind):
    from rredcot_cli.train import update
    from rredcot_cli.train.loss import LossSettings, policy_loss

    model, tokenizer = tiny

    def broken(*args, **kwargs):
        if kind == "nan gradient":
            return _nan_gradient_loss(*args, **kwargs)
        loss, stats = policy_loss(*args, **kwargs)
        return loss * (math.nan if kind == "nan loss" else math.inf), stats

    monkeypatch.setattr(update, "policy_loss", broken)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    stats = update.policy_update(
        model, optimizer, scheduler,
        update.UpdateBatch(
            prompt_ids=[[5, 6, 7]] * 4, completion_ids=[[8, 9], [10, 11, 12], [8], [9, 9]],
            advantages=torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [1.0, 0.0, 0.0], [-1.0, -1.0, 0.0]]),
            pad_id=tokenizer.pad_token_id),
        update.UpdateHyper(updates_per_batch=2, minibatch_size=2, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                           loss_agg="token-mean", max_tokens=3)),
        update.UpdateEngine(generator=torch.Generator().manual_seed(0)))
    assert (stats.skipped, stats.updates, stats.trailing_skipped) == (4, 0, 4)
    assert math.isnan(stats.loss)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert scheduler.last_epoch == 0 and not optimizer.state


TRAIN = ["benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=2", "sampling.max_new_tokens=24",
         "train.steps=3", "train.prompts_per_step=2", "train.minibatch_size=2", "train.updates_per_batch=1",
         "train.eval_every=0", "train.eval_problems=1", "train.eval_samples=1", "train.save_every=0"]


def _losses_nan_on(monkeypatch, calls):
    """policy_loss returns NaN on the given 1-based calls."""
    from rredcot_cli.train import update
    from rredcot_cli.train.loss import policy_loss

    count = {"n": 0}

    def loss_fn(*args, **kwargs):
        count["n"] += 1
        loss, stats = policy_loss(*args, **kwargs)
        return (loss * math.nan if count["n"] in calls else loss), stats

    monkeypatch.setattr(update, "policy_loss", loss_fn)
    # Every update runs its passes, also a batch without signal (all rewards equal), which would
    # otherwise take its zero-gradient steps without calling the loss and shift the count.
    monkeypatch.setattr(update, "carries_no_signal", lambda *args: False)


def test_run_stops_after_several_non_finite_updates_in_a_row(tmp_path, monkeypatch):
    # Two updates per step: step 1 fine, then NaN from step 2 on; the limit (3) is passed in step 3.
    _losses_nan_on(monkeypatch, calls=range(3, 100))
    code, stderr = rredcot("train", f"run.dir={tmp_path}", *TRAIN)
    assert code == 2
    assert one_error_line(stderr) == (
        "error: step 3: 4 policy updates in a row had a non-finite (NaN/inf) loss or gradient "
        "(train.max_nonfinite_updates=3); they were skipped, so the weights are the last finite ones; "
        f"metrics so far are in {tmp_path / 'train' / 'metrics.parquet'}; try a lower train.lr or a smaller "
        "train.grad_clip")
    assert "step 2: skipped 2 of 2 policy updates with a non-finite loss or gradient" in " ".join(stderr.split())
    metrics = read_artifact("train_metrics", tmp_path / "train" / "metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert math.isfinite(metrics[0]["loss"]) and math.isnan(metrics[1]["loss"]) and math.isnan(metrics[2]["loss"])
    assert json.loads((tmp_path / "train" / "manifest.json").read_text())["status"] == "running"


def test_an_isolated_non_finite_update_is_skipped_and_the_run_finishes(tmp_path, monkeypatch):
    _losses_nan_on(monkeypatch, calls={2})
    code, stderr = rredcot("train", f"run.dir={tmp_path}", *TRAIN)
    assert code == 0, stderr
    assert "step 1: skipped 1 of 2 policy updates" in " ".join(stderr.split())
    assert json.loads((tmp_path / "train" / "summary.json").read_text())["skipped_updates"] == 1


# --------------------------------------------------------------------------- run directory


def test_unwritable_run_dir(tmp_path, monkeypatch):
    from pathlib import Path

    real_mkdir = Path.mkdir
    run = tmp_path / "readonly"

    def mkdir(self, *args, **kwargs):
        if self == run or run in self.parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    code, stderr = rredcot("sample", f"run.dir={run}")
    assert code == 2
    assert one_error_line(stderr) == (
        f"error: cannot write {run / 'sample'}: Permission denied (no permission; choose a writable run.dir); "
        "outputs finished before this were kept")


def test_full_disk_keeps_the_old_artifact_and_names_the_path(tmp_path, monkeypatch):
    path = write_artifact("samples", [SAMPLE], tmp_path / "samples.parquet")

    def no_space(table, where, **kwargs):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", no_space)
    with pytest.raises(StorageError) as info:
        write_artifact("samples", [SAMPLE, dict(SAMPLE, sample_idx=1)], path)
    # The table's size in memory (an upper bound of the Parquet file) and what the file system has left.
    assert re.fullmatch(
        re.escape(f"cannot write {path}: No space left on device (the disk is full: about ") + r"\d+ B needed, "
        r"[\d.]+ [kMGT]?B free there; free space or point run.dir at another disk\); outputs finished before this "
        r"were kept", str(info.value)), str(info.value)
    monkeypatch.undo()
    assert read_artifact("samples", path).num_rows == 1
    assert [p.name for p in tmp_path.iterdir()] == ["samples.parquet"]


def test_os_error_in_a_stage_is_one_line(monkeypatch, tmp_path):
    module = types.ModuleType("rredcot_cli.stages.eval")

    def run(cfg, overrides):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "eval" / "metrics.json"))

    module.run = run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    code, stderr = rredcot("eval", f"run.dir={tmp_path}")
    assert code == 2
    assert one_error_line(stderr).startswith(f"error: cannot write {tmp_path / 'eval' / 'metrics.json'}: No space")


def test_an_unknown_segmenter_is_one_line_before_any_folder(tmp_path):
    """segment.name is checked with the config (it was a KeyError traceback after the stage's
    folder was made)."""
    code, stderr = rredcot("segment", f"run.dir={tmp_path / 'run'}", "segment.name=sentence")
    assert code == 2
    assert one_error_line(stderr) == ("error: segment.name=sentence: not a valid choice; valid: fixed, newline, "
                                      "keyword, entropy, hybrid")
    assert not (tmp_path / "run").exists()


def test_error_kinds():
    # Both print as one `error:` line; a StorageError is still caught by `except OSError`.
    assert issubclass(TrainingError, RredcotError) and issubclass(StorageError, (RredcotError, OSError))


@pytest.mark.parametrize("option,expected", [
    ("train.precision=fp8", "train.precision=fp8: not a valid choice; valid: auto, fp32, bf16-mixed, fp16-mixed, bf16-true"),
    ("train.sampler_correction=tis", "train.sampler_correction=tis: not a valid choice; valid: none, token_truncate"),
    ("train.loss_agg=mean", "train.loss_agg=mean: not a valid choice; valid: token-mean"),
    ("train.lr_schedule=cosin", "train.lr_schedule=cosin: not a valid choice; did you mean cosine? Valid: constant"),
    ("train.clip_ratio_c=0.5", "train.clip_ratio_c=0.5: the dual clip needs > 1 (verl: 3.0); 0 turns it off"),
    ("train.dynamic_sampling=true train.max_sampling_rounds=0", "train.max_sampling_rounds=0: must be >= 1"),
    ("train.micro_batch_size=-2", "train.micro_batch_size=-2: must be >= 0"),
    ("train.gradient_checkpointing=maybe",
     "train.gradient_checkpointing=maybe: not a valid choice; valid: auto, true, false"),
    ("train.sampler_correction_cap=0", "train.sampler_correction_cap=0.0: must be > 0"),
])
def test_bad_training_choices_fail_before_anything_is_written(tmp_path, option, expected):
    code, stderr = rredcot("train", f"run.dir={tmp_path / 'run'}", "experiment=quick", *option.split())
    assert code == 2
    assert expected in one_error_line(stderr)
    assert not (tmp_path / "run").exists()
