"""Extending without forking (issue 15): a plugin package from a temp dir registers a credit method
and a benchmark through entry points and trains with them; ``plugins=`` loads code by path; a user
config dir composes and shows in --help; ``benchmark=jsonl`` scores a custom file's answers.

The plugin's code is the worked example of docs/extending.md, cut out of its code blocks, so the
document's example is what these tests run. Its entry points are a ``*.dist-info`` folder beside
the package, found through PYTHONPATH (as an installed distribution would be), so nothing is
installed into the test environment and a clean clone runs the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rredcot_cli.config.compose import compose
from rredcot_cli.config.search import CONFIG_PATH_ENV, group_options
from rredcot_cli.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "extending.md"
SMALL = [
    "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=2", "sampling.max_new_tokens=40",
    "train.steps=2", "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=1",
    "train.eval_problems=2", "train.eval_samples=2",
]


def doc_files() -> dict[str, str]:
    """The files docs/extending.md shows: a line holding only `` `path`: `` right before a code
    block; path -> the block's text."""
    found = re.findall(r"^`([^`\s]+)`:\n```\w*\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    return dict(found)


def entry_points_txt(pyproject: str) -> str:
    """The ``entry_points.txt`` an installer writes for the ``[project.entry-points."group"]``
    tables of ``pyproject``."""
    lines = []
    for line in pyproject.splitlines():
        header = re.fullmatch(r'\[project\.entry-points\."([^"]+)"\]', line.strip())
        pair = re.fullmatch(r'(\S+)\s*=\s*"([^"]+)"', line.strip())
        if header:
            lines += ["", f"[{header.group(1)}]"]
        elif pair and lines:
            lines.append(f"{pair.group(1)} = {pair.group(2)}")
    return "\n".join(lines).strip() + "\n"


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    """The example plugin, as if installed: its package and a dist-info with its entry points."""
    root = tmp_path_factory.mktemp("site")
    files = doc_files()
    for path, text in files.items():
        if path.startswith("my-rredcot-plugin/my_rredcot_plugin/"):
            target = root / path.split("/", 1)[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    (root / "my_rredcot_plugin" / "__init__.py").touch()
    dist = root / "my_rredcot_plugin-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-rredcot-plugin\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(entry_points_txt(files["my-rredcot-plugin/pyproject.toml"]))
    return root


def rredcot(*args, cwd, pythonpath=(), env=None, check=True):
    path = os.pathsep.join([*map(str, pythonpath), str(REPO), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **(env or {})},
                            timeout=600)
    if check:
        assert result.returncode == 0, f"rredcot {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_the_doc_example_is_small_and_complete():
    files = doc_files()
    credit = files["my-rredcot-plugin/my_rredcot_plugin/credit.py"]
    assert len(credit.strip().splitlines()) < 50  # "a credit method in under 50 lines"
    assert {"my-rredcot-plugin/my_rredcot_plugin/bench.py", "my-rredcot-plugin/pyproject.toml",
            "conf/experiment/mine.yaml", "conf/benchmark/mod10.yaml"} <= set(files)
    entry_points = entry_points_txt(files["my-rredcot-plugin/pyproject.toml"])
    assert "[rredcot.methods]\nrecency = my_rredcot_plugin.credit:recency" in entry_points
    assert "[rredcot.benchmarks]\nadd_chain = my_rredcot_plugin.bench:AddChainBenchmark" in entry_points


def test_train_with_an_entry_point_method_and_benchmark(plugin_dir, tmp_path):
    run = tmp_path / "runs" / "plugin"
    rredcot("train", "method=recency", "benchmark=add_chain", "+benchmark.options.terms=3", "method.gamma=0.5",
            "train.save_rollouts=1",
            f"run.dir={run}", *SMALL, cwd=tmp_path, pythonpath=[plugin_dir])
    metrics = pq.read_table(run / "train" / "metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1, 2]
    config = (run / "train" / "config.yaml").read_text()
    assert "name: recency" in config and "gamma: 0.5" in config and "name: add_chain" in config
    samples = pq.read_table(next((run / "train" / "rollouts").glob("step-*/sample/samples.parquet"))).to_pylist()
    assert {s["benchmark"] for s in samples} == {"add_chain"}
    assert all(re.fullmatch(r"Compute mod 10: \d \+\d \+\d\n", s["prompt"]) for s in samples)
    assert all(s["reward"] in (0.0, 1.0) for s in samples)
    assert (run / "train" / "rollouts" / "step-000001" / "attribute" / "recency" / "advantages.parquet").is_file()


def test_plugin_method_runs_in_attribute_with_the_registry_contract(plugin_dir, tmp_path):
    """Saved samples -> segments -> the plugin's credit: one advantage per completion token, and
    (mean-one weights) the mean over a completion's tokens is its GRPO advantage."""
    import statistics

    run = tmp_path / "runs" / "credit"
    common = [f"run.dir={run}", "benchmark.min_steps=2", "benchmark.max_steps=4", "sampling.n=4",
              "sampling.max_new_tokens=48", "sample.num_prompts=3"]
    rredcot("sample", *common, cwd=tmp_path)
    rredcot("segment", *common, cwd=tmp_path)
    rredcot("attribute", *common, "method=recency", cwd=tmp_path, pythonpath=[plugin_dir])
    samples = {(r["prompt_id"], r["sample_idx"]): r for r in pq.read_table(run / "sample/samples.parquet").to_pylist()}
    groups: dict[str, list[float]] = {}
    for (prompt_id, _), sample in samples.items():
        groups.setdefault(prompt_id, []).append(sample["reward"])
    rows = pq.read_table(run / "attribute/recency/advantages.parquet").to_pylist()
    assert len(rows) == len(samples) == 12
    for row in rows:
        sample = samples[(row["prompt_id"], row["sample_idx"])]
        rewards = groups[row["prompt_id"]]
        grpo = (sample["reward"] - statistics.mean(rewards)) / (statistics.stdev(rewards) + 1e-6)
        adv = row["token_advantages"]
        assert len(adv) == len(sample["completion_token_ids"])
        assert statistics.mean(adv) == pytest.approx(grpo, abs=1e-4)
        assert all(a * grpo >= 0 for a in adv)  # positive weights keep the outcome's sign


def test_help_lists_plugin_and_user_options(plugin_dir, tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\ntrain:\n  steps: 2\n")
    result = rredcot("train", "--config-dir", str(tmp_path / "conf"), "--help", cwd=tmp_path,
                     pythonpath=[plugin_dir], env={"COLUMNS": "400"})
    lines = {line.strip().split(":")[0]: line for line in result.stdout.splitlines() if ":" in line}
    assert "recency" in lines["method"] and "grpo (default)" in lines["method"]
    assert "add_chain" in lines["benchmark"] and "jsonl" in lines["benchmark"]
    assert "mine" in lines["experiment"] and "quick" in lines["experiment"]


def test_plugins_by_path_register_a_method(tmp_path):
    """No packaging: ``plugins=[file.py]`` imports the doc's credit method from its path."""
    credit = tmp_path / "credit.py"
    credit.write_text(doc_files()["my-rredcot-plugin/my_rredcot_plugin/credit.py"])
    result = rredcot("train", f"plugins=[{credit}]", "method=recency", "method.gamma=0.25", "--cfg", cwd=tmp_path)
    assert "name: recency" in result.stdout and "gamma: 0.25" in result.stdout
    out_of_range = rredcot("train", f"plugins=[{credit}]", "method=recency", "method.gamma=2", "--cfg",
                           cwd=tmp_path, check=False)
    assert out_of_range.returncode == 2
    assert out_of_range.stderr.strip() == "error: method.gamma=2.0: must be in (0, 1]"


def test_a_plugin_that_fails_to_import_fails_in_one_line(tmp_path):
    result = rredcot("train", "plugins=[no_such_plugin_module]", "--cfg", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: plugin 'no_such_plugin_module': cannot import it: "
                                     "ModuleNotFoundError: No module named 'no_such_plugin_module'")
    site = tmp_path / "site"
    (site / "broken_plugin").mkdir(parents=True)
    (site / "broken_plugin" / "__init__.py").write_text("import not_installed_dependency\n")
    (site / "broken_plugin-0.1.dist-info").mkdir()
    (site / "broken_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (site / "broken_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[rredcot.methods]\nbroken = broken_plugin:credit\n")
    result = rredcot("train", "method=broken", "--cfg", cwd=tmp_path, pythonpath=[site], check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: cannot load entry point 'broken = broken_plugin:credit' (rredcot.methods of broken-plugin 0.1): "
        "ModuleNotFoundError: No module named 'not_installed_dependency'")


# --------------------------------------------------------------------------- user config dirs


@pytest.fixture
def user_conf(tmp_path, monkeypatch):
    monkeypatch.delenv(CONFIG_PATH_ENV, raising=False)
    conf = tmp_path / "conf"
    for path, text in doc_files().items():
        if path.startswith("conf/"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "tiny-fast.yaml").write_text("name: tiny-fast\npath: embedded\ndtype: float32\n")
    return conf


def test_user_config_dir_experiment_composes(user_conf, monkeypatch):
    cfg = compose(["experiment=mine", "model=tiny-fast"], config_dirs=[user_conf])
    assert cfg.train.steps == 2 and cfg.sampling.max_new_tokens == 48 and cfg.model.name == "tiny-fast"
    assert "mine" in group_options([user_conf])["experiment"]
    monkeypatch.setenv(CONFIG_PATH_ENV, str(user_conf))  # the environment variable does the same
    assert compose(["experiment=mine"]).sampling.n == 4
    assert "tiny-fast" in group_options()["model"]


def test_user_config_dir_is_searched_before_the_packaged_tree(user_conf):
    (user_conf / "benchmark").mkdir(exist_ok=True)
    (user_conf / "benchmark" / "chain.yaml").write_text("name: chain\nmin_steps: 3\nmax_steps: 3\n")
    assert compose([]).benchmark.max_steps == 12
    assert compose([], config_dirs=[user_conf]).benchmark.max_steps == 3


def test_a_broken_user_yaml_fails_in_one_line_naming_the_file(user_conf):
    bad = user_conf / "experiment" / "bad.yaml"
    bad.write_text("# @package _global_\ntrain:\n  steps: [2\n")
    with pytest.raises(ConfigError) as info:
        compose(["experiment=bad"], config_dirs=[user_conf])
    message = str(info.value)
    assert message.startswith(f"{bad}: line ") and "not valid YAML" in message and "\n" not in message
    bad.write_text("# @package _global_\ntrain:\n  stepz: 2\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: unknown key 'train.stepz'"):
        compose(["experiment=bad"], config_dirs=[user_conf])
    with pytest.raises(ConfigError, match="config dir .*nowhere: no such folder"):
        compose([], config_dirs=[user_conf / "nowhere"])


def test_config_dir_option_on_the_command_line(user_conf, tmp_path):
    result = rredcot("train", "--config-dir", str(user_conf), "experiment=mine", "--cfg", cwd=tmp_path)
    assert "max_new_tokens: 48" in result.stdout
    result = rredcot("train", "experiment=mine", "--cfg", cwd=tmp_path, env={CONFIG_PATH_ENV: str(user_conf)})
    assert "max_new_tokens: 48" in result.stdout
    result = rredcot("train", "experiment=mine", "--cfg", cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stderr.startswith("error: unknown option 'experiment=mine'")


# --------------------------------------------------------------------------- benchmark=jsonl


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_custom_jsonl_with_a_regex_extractor_scores_as_expected(tmp_path):
    from rredcot_cli.stages.common import make_benchmark

    data = write_jsonl(tmp_path / "qa.jsonl", [
        {"uid": "a", "query": "Capital of France?", "label": "Paris"},
        {"uid": "b", "query": "2 + 2?", "label": 4},
    ])
    cfg = compose(["benchmark=jsonl", f"benchmark.path={data}", "benchmark.question_field=query",
                   "benchmark.answer_field=label", "benchmark.id_field=uid", "benchmark.extractor=regex",
                   "benchmark.answer_regex='FINAL: *(\\w+)'", "benchmark.verifier=exact",
                   "benchmark.prompt_template='Q: {question}'"])
    bench = make_benchmark(cfg)
    paris, four = bench.load("test")
    assert (paris.prompt_id, paris.gold_answer, four.gold_answer) == ("jsonl/test/a", "Paris", "4")
    assert bench.prompt(paris) == "Q: Capital of France?"
    assert bench.verify("I think FINAL: Lyon... no, FINAL: Paris", paris) == 1.0  # the last match
    assert bench.verify("FINAL: Paris", four) == 0.0
    assert bench.verify("FINAL:4", four) == 1.0
    assert bench.verify("Paris", paris) == 0.0  # nothing extracted


def test_jsonl_extractors_and_verifiers(tmp_path, monkeypatch):
    from rredcot_cli.benchmarks import make_benchmark

    data = write_jsonl(tmp_path / "n.jsonl", [{"question": "pi?", "answer": "3.14159"}])
    problem = make_benchmark("jsonl", path=str(data)).load("train")[0]
    numeric = make_benchmark("jsonl", path=str(data), extractor="last_number", verifier="numeric", tolerance=1e-3)
    assert numeric.verify("about 3.1416", problem) == 1.0
    assert numeric.verify("about 3.15, then 3", problem) == 0.0
    boxed = make_benchmark("jsonl", path=str(data))  # boxed + math-verify
    assert boxed.verify("so \\boxed{3.14159}", problem) == 1.0
    assert boxed.verify("3.14159", problem) == 0.0
    (tmp_path / "my_checks.py").write_text("def close(answer, gold):\n    return answer.startswith(gold[:4])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    user = make_benchmark("jsonl", path=str(data), extractor="none", verifier="my_checks:close")
    assert user.verify("3.14 or so", problem) == 1.0 and user.verify("3", problem) == 0.0
    pq.write_table(__import__("pyarrow").table({"question": ["pi?"], "answer": ["3.14159"]}), tmp_path / "n.parquet")
    assert make_benchmark("jsonl", path=str(tmp_path / "n.parquet")).load("test")[0].gold_answer == "3.14159"


@pytest.mark.parametrize(("settings", "message"), [
    ({"extractor": "regex"}, "benchmark.extractor=regex needs benchmark.answer_regex=PATTERN"),
    ({"extractor": "regex", "answer_regex": "("}, "benchmark.answer_regex='(': not a regular expression"),
    ({"extractor": "xml"}, "benchmark.extractor=xml: expected one of boxed, last_number, regex, answer_line, none"),
    ({"verifier": "fuzzy"}, "benchmark.verifier=fuzzy: expected one of math_verify, exact, numeric or a function"),
    ({"verifier": "no_such_mod:f"}, "benchmark.verifier=no_such_mod:f: cannot import no_such_mod: ModuleNotFoundError"),
    ({"options": {"colour": 1}}, "benchmark jsonl takes no option 'colour'"),
])
def test_jsonl_settings_fail_in_one_line(settings, message):
    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.errors import RredcotError

    with pytest.raises(RredcotError) as info:
        make_benchmark("jsonl", **settings)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
