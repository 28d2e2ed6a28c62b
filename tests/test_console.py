"""Outside a terminal (``> log 2>&1``, nohup, a Slurm log) every long-running command prints a plain
line per step, and its lines and tables stay whole instead of being cut or wrapped at 80 columns."""

import io
import os
import subprocess
import sys

from rich.console import Console
from rich.table import Table

from rredcot_cli import console as terminal
from rredcot_cli.benchmarks.synthetic import ChainBenchmark
from rredcot_cli.config.schema import SFTConfig
from rredcot_cli.train.sft import train_sft

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["benchmark.min_steps=2", "benchmark.max_steps=4", "sampling.n=2", "sampling.max_new_tokens=32",
         "train.steps=2", "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=1",
         "train.eval_problems=2", "train.eval_samples=2", "train.save_every=0"]


def a_log(monkeypatch) -> io.StringIO:
    """The shared console replaced by one that writes into a file, as under ``> log 2>&1``."""
    log = io.StringIO()
    monkeypatch.setattr(terminal, "console", Console(file=log, width=terminal.LOG_WIDTH, soft_wrap=True))
    return log


def test_the_console_outside_a_terminal_is_wide():
    code = "from rredcot_cli.console import console, make_console; print(console.width, make_console(False).width)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": ""})
    assert result.stdout.split() == [str(terminal.LOG_WIDTH)] * 2, result.stderr


def test_progress_in_a_log_is_a_line_per_result_and_per_tenth(monkeypatch):
    log = a_log(monkeypatch)
    with terminal.progress_bar("train grpo", total=20, unit="step") as advance:
        advance(1, info="reward 0.41  loss 0.012")
        advance(1, info="reward 0.50  loss 0.010  eval 0.562")
    with terminal.progress_bar("sample arith/test", total=100, unit="problems") as advance:
        for _ in range(50):
            advance(2)  # a generate call of 2 prompts: a line per tenth, not per call
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("train grpo  step 1/20  reward 0.41  loss 0.012  ") and lines[0].endswith(" s")
    assert lines[1].startswith("train grpo  step 2/20  reward 0.50  loss 0.010  eval 0.562  ")
    assert [line.split("  ")[1] for line in lines[2:]] == [f"problems {10 * k}/100" for k in range(1, 11)]


def test_a_long_title_over_a_narrow_table_stays_on_one_line():
    out = io.StringIO()
    table = Table(title="rredcot_cli/assets/tiny-chain on arith/test (64 problems x 4 samples)")
    table.add_column("metric")
    table.add_column("value")
    table.add_row("pass@1", "0.500")
    terminal.print_table(table, Console(file=out, width=80))
    assert out.getvalue().splitlines()[0].strip() == table.title


def test_sft_in_a_log_prints_a_line_per_step_with_its_eval(monkeypatch, tmp_path):
    log = a_log(monkeypatch)
    settings = SFTConfig(steps=3, batch_size=2, lr=1e-3, weight_decay=0.0, grad_clip=1.0, warmup_steps=1,
                         hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=256,
                         solution_error_rate=0.0)
    train_sft(settings, benchmark=ChainBenchmark(1, 2), output_dir=tmp_path / "m", seed=0,
              eval_fn=lambda model, tokenizer, step: {"pass@1": 0.25}, eval_every=2)
    lines = log.getvalue().splitlines()
    assert [line.split("  ")[:2] for line in lines] == [["sft", f"step {k}/3"] for k in (1, 2, 3)]
    assert "  loss " in lines[0] and "eval" not in lines[0] and "  eval pass@1 0.250  " in lines[1]


def test_train_under_a_redirect_prints_a_line_per_step_and_whole_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", "method=grpo", f"run.dir={tmp_path}/r",
                             *SMALL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stderr.splitlines() if line.startswith("train grpo  step ")]
    assert [line.split("  ")[1] for line in steps] == ["step 1/2", "step 2/2"], result.stderr
    assert all("  reward " in line and "  loss " in line and "  eval " in line for line in steps), steps
    assert "rredcot train · grpo" in result.stderr.splitlines()
    assert "━━━" not in "".join(steps)  # no progress bar drawn into the log
