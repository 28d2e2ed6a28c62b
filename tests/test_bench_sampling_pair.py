"""bench/sampling_vs_vllm.py and bench/long_step_pair.py (issue 42): the ratios a round reports (on
vLLM's own samples, and with vLLM decoding HF's per-row lengths), the driver's per-request lengths,
and the step pair's command composing to the shape its docstring names."""

import json
import math
import os
import subprocess
import sys

import pytest
from repo_scripts import REPO, load_script

from rredcot_cli.config.compose import compose

sampling = load_script("bench/sampling_vs_vllm.py")
pair = load_script("bench/long_step_pair.py")
throughput = load_script("bench/throughput.py")


def _run(shape, round_, backend, tok_s, tok_cpu_s, others=0.0):
    return {"shape": shape, "round": round_, "backend": backend, "tokens_per_s": tok_s,
            "tokens_per_cpu_s": tok_cpu_s, "others_cores_mean": others}


def test_ratio_is_vllm_over_hf_per_round_and_its_median_meets_the_goal_or_not():
    runs = [_run("short", 0, "hf", 50.0, 60.0), _run("short", 0, "vllm", 100.0, 90.0, others=0.3),
            _run("short", 1, "hf", 40.0, 60.0), _run("short", 1, "vllm", 60.0, 66.0),
            _run("short", 2, "vllm", 10.0, 10.0),  # its HF call failed: no pair, no ratio
            _run("long", 0, "hf", 1.0, 1.0), _run("long", 0, "vllm", 9.0, 9.0)]
    short = sampling.ratios(runs, "short")
    assert short["by_wall"] == [2.0, 1.5] and short["per_cpu_s"] == [1.5, 1.1]
    assert short["median_by_wall"] == 1.75 and not short["met_by_wall"]
    assert short["others_cores_max"] == 0.3
    assert sampling.ratios(runs, "long")["median_by_wall"] == 9.0
    assert sampling.ratios([_run("long", 0, "hf", 1.0, 1.0)], "long") == {}


def _hf(round_, wall, cpu, lengths, prompts="p"):
    return {"shape": "short", "round": round_, "backend": "hf", "tokens_per_s": sum(lengths) / wall,
            "tokens_per_cpu_s": sum(lengths) / cpu, "wall_s": wall, "cpu_s": cpu, "tokens": sum(lengths),
            "lengths": lengths, "prompts_sha256": prompts, "others_cores_mean": 0.0, "row_lengths_given": False}


def _vllm_at(round_, wall, cpu, lengths, prompts="p", others=0.0):
    return {**_hf(round_, wall, cpu, lengths, prompts), "backend": "vllm", "row_lengths_given": True,
            "others_cores_mean": others}


def test_hf_lengths_become_one_exact_length_request_each_with_eos_ignored():
    assert throughput.fixed_length_requests([3, 128, 1]) == [
        {"max_tokens": 3, "ignore_eos": True}, {"max_tokens": 128, "ignore_eos": True},
        {"max_tokens": 1, "ignore_eos": True}]
    for bad in ([], [4, 0]):
        with pytest.raises(ValueError, match=">= 1 each"):
            throughput.fixed_length_requests(bad)
    assert sampling.row_lengths_args({"lengths": [5, 1, 128]}) == ["--row-lengths", "5,1,128"]


def test_per_request_params_give_the_kth_request_the_kth_length_and_refuse_an_extra_one():
    made = throughput.PerRequestParams(dict, throughput.fixed_length_requests([7, 2]))
    first = made(n=1, temperature=1.0, max_tokens=128, logprobs=0)
    second = made(n=1, temperature=1.0, max_tokens=128, logprobs=0)
    assert first == {"n": 1, "temperature": 1.0, "max_tokens": 7, "logprobs": 0, "ignore_eos": True}
    assert second["max_tokens"] == 2 and made.used == 2
    with pytest.raises(RuntimeError, match="more than the 2 requests"):
        made(max_tokens=128)


def test_same_lengths_ratio_is_hf_seconds_over_vllm_seconds_on_equal_rows_and_prompts():
    runs = [_hf(0, 30.0, 24.0, [3, 9]), _run("short", 0, "vllm", 100.0, 100.0), _vllm_at(0, 20.0, 20.0, [3, 9]),
            _hf(1, 40.0, 40.0, [5, 5]), _vllm_at(1, 10.0, 16.0, [5, 5], others=0.2),
            _hf(2, 10.0, 10.0, [4, 4]), _vllm_at(2, 1.0, 1.0, [4, 5]),  # other lengths: not the same work
            _hf(3, 10.0, 10.0, [4, 4]), _vllm_at(3, 1.0, 1.0, [4, 4], prompts="q")]  # other prompts: neither
    same = sampling.same_lengths_ratios(runs, "short")
    assert same["by_wall"] == [1.5, 4.0] and same["per_cpu_s"] == [1.2, 2.5]
    assert same["median_by_wall"] == 2.75 and not same["met_by_wall"] and same["tokens"] == [12, 10]
    assert same["others_cores_max"] == 0.2
    # the own-samples ratio of round 0 pairs HF with vLLM's own call, not with the call at HF's lengths
    assert sampling.ratios(runs, "short")["by_wall"] == [100.0 / (12 / 30.0)]
    assert sampling.same_lengths_ratios(runs[:2], "short") == {}


def _driver(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "bench" / "throughput.py"), "--decode-driver", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_an_hf_driver_run_records_the_per_row_lengths_that_a_vllm_call_would_be_given():
    done = _driver("--backend", "hf", "--prompts", "2", "--n", "3", "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(next(line for line in done.stdout.splitlines()
                             if line.startswith("DECODE_RESULT ")).removeprefix("DECODE_RESULT "))
    assert len(result["lengths"]) == result["completions"] == 6 and sum(result["lengths"]) == result["tokens"]
    assert all(1 <= n <= 6 for n in result["lengths"]) and max(result["lengths"]) == result["max_tokens"]
    assert len(result["prompts_sha256"]) == 64 and result["row_lengths_given"] is False
    assert sampling.row_lengths_args(result) == ["--row-lengths", ",".join(map(str, result["lengths"]))]


def test_row_lengths_on_the_hf_backend_is_refused_in_one_line_with_exit_2():
    done = _driver("--backend", "hf", "--row-lengths", "3,4")
    assert done.returncode == 2
    assert "use it with --decode-driver --backend vllm" in done.stderr.strip().splitlines()[-1]


def test_the_step_pair_composes_to_the_long_arith_shape():
    cfg = compose(["method=grpo", *pair.SHAPE, "run.dir=/tmp/unused"])
    assert cfg.benchmark.name == "arith" and cfg.sampling.max_new_tokens == 1024
    assert cfg.train.prompts_per_step == 4 and cfg.sampling.n == 4 and cfg.seed == 0
    assert cfg.benchmark.prompt_template == (
        "{question} Explain your reasoning step by step in detail, then give the final answer.")


@pytest.mark.parametrize("same_lengths, hf_result, third", [
    (True, {"lengths": [3, 5]}, ("vllm", ["--row-lengths", "3,5"])),
    (False, {"lengths": [3, 5]}, None),
    (True, {"returncode": 1}, None)])  # HF's call failed: no lengths to give vLLM
def test_a_round_runs_hf_then_vllm_then_vllm_at_hf_lengths(same_lengths, hf_result, third):
    calls = []

    def measure(backend, extra):
        calls.append((backend, extra))
        return hf_result if backend == "hf" else {}

    sampling.run_round(measure, same_lengths)
    assert calls == [("hf", []), ("vllm", [])] + ([third] if third else [])


def test_pooled_rounds_are_renumbered_and_get_a_geometric_interval(tmp_path):
    """--pool: two invocations' rounds become rounds 0..3 (a round number reused by the second file
    must not pair its calls with the first file's), and each ratio gets the geometric mean and
    Student-t interval of its logs, computed here by hand."""
    first = {"commit": "a", "runs": [_hf(0, 20.0, 20.0, [4, 6]), _vllm_at(0, 10.0, 10.0, [4, 6]),
                                     _hf(1, 30.0, 30.0, [4, 6]), _vllm_at(1, 15.0, 15.0, [4, 6])]}
    second = {"commit": "b", "runs": [_hf(0, 40.0, 40.0, [4, 6]), _vllm_at(0, 10.0, 10.0, [4, 6]),
                                      _hf(1, 10.0, 10.0, [4, 6]), _vllm_at(1, 10.0, 10.0, [4, 6])]}
    same = sampling.pooled([first, second], "short")["same_lengths"]
    assert same["by_wall"] == [2.0, 2.0, 4.0, 1.0]
    interval = same["by_wall_interval"]
    logs = [math.log(2.0), math.log(2.0), math.log(4.0), math.log(1.0)]  # mean log 2, sd sqrt(2/3) log 2
    half = 3.182446305284263 * math.sqrt(2 / 3) * math.log(2.0) / 2  # t(0.975, 3) * sd / sqrt(4)
    assert interval["rounds"] == 4 and interval["geometric_mean"] == pytest.approx(2.0)
    assert sum(logs) / 4 == pytest.approx(math.log(2.0))
    assert interval["low"] == pytest.approx(2.0 * math.exp(-half)) and interval["high"] == pytest.approx(2.0 * math.exp(half))
    assert sampling.pooled([first, second], "short")["own_samples"] == {}  # no own-samples calls here
    one_round = sampling.pooled([{"runs": first["runs"][:2]}], "short")["same_lengths"]
    assert one_round["by_wall"] == [2.0] and "by_wall_interval" not in one_round  # an interval needs two rounds
    assert sampling.summary_line("short", "same_lengths", same) == (
        "short, same_lengths: vLLM / HF = 2.00x by wall (median), 2.00x per CPU s (goal <= 1.5x; others' cores up "
        "to 0.00); geometric mean 2.00x [0.81, 4.92] by wall over 4 rounds (95% t-interval)")

    paths = []
    for name, record in (("one.json", first), ("two.json", second)):
        (tmp_path / name).write_text(json.dumps(record))
        paths.append(str(tmp_path / name))
    done = subprocess.run([sys.executable, "bench/sampling_vs_vllm.py", "--pool", *paths, "--shapes", "short",
                           "--out", str(tmp_path / "pooled.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "pooled.json").read_text())
    assert written["commits"] == ["a", "b"] and written["ratios"]["same_lengths"]["by_wall"] == [2.0, 2.0, 4.0, 1.0]
    refused = subprocess.run([sys.executable, "bench/sampling_vs_vllm.py", "--pool", *paths, "--shapes", "short,long"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].endswith(
        "--pool takes one shape in --shapes: pick from short, long")
