"""bench/sampling_vs_vllm.py and bench/long_step_pair.py (issue 42): the ratio a round reports, and
the step pair's command composing to the shape its docstring names."""

from repo_scripts import load_script

from rredcot_cli.config.compose import compose

sampling = load_script("bench/sampling_vs_vllm.py")
pair = load_script("bench/long_step_pair.py")


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


def test_the_step_pair_composes_to_the_long_arith_shape():
    cfg = compose(["method=grpo", *pair.SHAPE, "run.dir=/tmp/unused"])
    assert cfg.benchmark.name == "arith" and cfg.sampling.max_new_tokens == 1024
    assert cfg.train.prompts_per_step == 4 and cfg.sampling.n == 4 and cfg.seed == 0
    assert cfg.benchmark.prompt_template == (
        "{question} Explain your reasoning step by step in detail, then give the final answer.")
