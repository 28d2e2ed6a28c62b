"""bench/tail_credit.py and bench/headroom.py (issue 39, item 5): the tail is found after the
graded Answer line, an outcome-level advantage puts its token share there, a tail-blind one none;
headroom counts pass@1, pass@n, mixed groups and the tail format."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.repo_scripts import load_script


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def _traces(tmp_path):
    """Two prompts x 2 samples; each completion: one step line (3 tokens), the Answer line
    (2 tokens), two Note lines (4 tokens each)."""
    segments, keys = [], []
    for prompt in ("p0", "p1"):
        for sample in (0, 1):
            keys.append((prompt, sample))
            spans = [("1+2=3\n", 0, 3), ("Answer: 3\n", 3, 5), ("Note: red 1 cat dog\n", 5, 9), ("Note: sun 2 sun sun", 9, 13)]
            for index, (text, start, end) in enumerate(spans):
                segments.append({"prompt_id": prompt, "sample_idx": sample, "segment_idx": index,
                                 "token_start": start, "token_end": end, "text": text})
    _write(tmp_path / "segments.parquet", segments)
    return keys


def _attribute(folder, keys, tail_value):
    folder.mkdir()
    _write(folder / "advantages.parquet", [{"prompt_id": p, "sample_idx": s, "method": "m",
                                            "token_advantages": [0.5] * 5 + [tail_value] * 8} for p, s in keys])
    _write(folder / "credits.parquet", [{"prompt_id": p, "sample_idx": s, "segment_idx": k, "method": "m", "value": 0.0,
                                         "credit": 0.5 if k < 2 else tail_value} for p, s in keys for k in range(4)])


def test_tail_credit_separates_an_outcome_advantage_from_a_tail_blind_one(tmp_path, monkeypatch, capsys):
    tail_credit = load_script("bench/tail_credit.py")
    keys = _traces(tmp_path)
    _attribute(tmp_path / "outcome", keys, 0.5)
    _attribute(tmp_path / "blind", keys, 0.0)
    out = tmp_path / "tail.json"
    monkeypatch.setattr("sys.argv", ["tail_credit.py", str(tmp_path / "segments.parquet"), f"outcome={tmp_path / 'outcome'}",
                                     f"blind={tmp_path / 'blind'}", "--batches", "2", "--out", str(out)])
    tail_credit.main()
    result = json.loads(out.read_text())
    assert result["with_tail"] == 4
    outcome, blind = result["methods"]["outcome"]["pooled"], result["methods"]["blind"]["pooled"]
    assert outcome["tail_token_share"] == pytest.approx(8 / 13)
    assert outcome["tail_advantage_share"] == pytest.approx(8 / 13)
    assert outcome["tail_abs_credit"] == pytest.approx(0.5) and outcome["step_abs_credit"] == pytest.approx(0.5)
    assert blind["tail_advantage_share"] == 0 and blind["tail_abs_advantage"] == 0 and blind["tail_abs_credit"] == 0
    assert blind["step_abs_advantage"] == pytest.approx(0.5)
    assert len(result["methods"]["blind"]["per_batch"]) == 2


def test_headroom_counts_groups_and_the_tail_format():
    headroom = load_script("bench/headroom.py").headroom
    good = "1+2=3\nAnswer: 3\nNote: red 1 cat dog\nNote: sun 2 sun sun"
    rows = [{"prompt_id": "a", "correct": True, "completion": good, "num_tokens": 40},
            {"prompt_id": "a", "correct": False, "completion": "1+2=4\nAnswer: 4\nNote: red", "num_tokens": 20},
            {"prompt_id": "b", "correct": False, "completion": "1+2=4\nAnswe", "num_tokens": 10},
            {"prompt_id": "b", "correct": False, "completion": good, "num_tokens": 40}]
    result = headroom(rows, tail_lines=2)
    assert result["pass@1"] == 0.25 and result["pass@n"] == 0.5 and result["mixed_group_share"] == 0.5
    assert result["tail_format_share"] == 0.5 and result["answer_line_share"] == 0.75
    assert result["mean_newline_segments"] == (4 + 3 + 2 + 4) / 4
    assert result["mean_lines_after_answer"] == (2 + 1 + 2) / 3


def test_headroom_of_a_samples_parquet_counts_groups_segments_and_truncation():
    """bench/headroom.py on a `rredcot sample` folder's rows (what bench/sample_headroom.py was)."""
    sample_headroom = load_script("bench/headroom.py").sample_headroom
    row = {"completion": "Work: 1+2\nAnswer: 3", "pred_answer": "3", "finish_reason": "stop", "num_tokens": 10}
    samples = [{**row, "prompt_id": "a", "reward": 1.0},
               {**row, "prompt_id": "a", "reward": 0.0, "completion": "Work\n\nCheck\nAnswer: 4\nNote: x"},
               {**row, "prompt_id": "a", "reward": 0.0, "pred_answer": None, "finish_reason": "length",
                "num_tokens": 40},
               {**row, "prompt_id": "b", "reward": None}, {**row, "prompt_id": "b", "reward": 0.0},
               {**row, "prompt_id": "b", "reward": 0.0}]
    result = sample_headroom(samples, segment_counts=[2, 4, 2, 3, 2, 2])
    assert result["prompts"] == 2 and result["completions"] == 6
    assert result["pass@1"] == 1 / 6 and result["pass@3"] == 0.5 and result["mixed_group_share"] == 0.5
    assert result["mean_nonempty_lines"] == (2 + 4 + 2 + 2 + 2 + 2) / 6
    assert result["share_with_answer_line"] == 5 / 6 and result["share_truncated"] == 1 / 6
    assert result["mean_tokens"] == (10 * 5 + 40) / 6
    assert result["mean_segments (segment stage)"] == 15 / 6 and result["share_with_>=3_segments"] == 2 / 6
