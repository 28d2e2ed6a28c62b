"""bench/measure.py, the bench scripts' shared measurement helpers, on hand-computed values."""

import math
import mmap
import sys
from pathlib import Path

import pytest
from repo_scripts import load_script

from rredcot_cli.store import artifacts


@pytest.fixture(scope="module")
def measure():
    return load_script("bench/measure.py")


def _metrics(root: Path, seconds, tokens, sampling, update) -> Path:
    """A train folder whose metrics (the other columns 0 or empty) have these per-step values."""
    schema = artifacts.get_spec("train_metrics").schema
    rows = [{**{f.name: None if f.nullable else 0 for f in schema}, "step": i + 1, "seconds": seconds[i],
             "tokens": tokens[i], "seconds_sampling": sampling[i], "seconds_update": update[i],
             "credit_forward_tokens": None}
            for i in range(len(seconds))]
    artifacts.write_artifact("train_metrics", rows, root / "metrics.parquet")
    return root


def test_train_steps_count_each_steps_tokens_and_phases(measure, tmp_path):
    train = _metrics(tmp_path, seconds=[10.0, 4.0, 6.0], tokens=[100, 160, 250], sampling=[3.0, 2.0, 4.0],
                     update=[1.0, None, 0.5])
    steps = measure.train_steps(train)
    assert [s["tokens"] for s in steps] == [100, 60, 90]  # the column counts from the run's start
    assert [s["phases"]["sampling"] for s in steps] == [3.0, 2.0, 4.0]
    assert [s["phases"]["update"] for s in steps] == [1.0, 0.0, 0.5]  # a phase that did not run: 0 s
    assert set(steps[0]["phases"]) == set(artifacts.PHASES)
    later = [{"step": s["row"]["step"], "seconds": s["row"]["seconds"], "tokens": s["tokens"],
              "credit_forward_tokens": None, "phases": s["phases"]} for s in steps[1:]]
    mean = measure.mean_step(later)
    assert mean["steps_averaged"] == [2, 3] and mean["s_per_step"] == 5.0 and mean["tokens_per_step"] == 75.0
    assert mean["phases"]["sampling"] == 3.0 and mean["phases"]["update"] == 0.25
    assert mean["credit_forward_tokens"] is None and mean["phases"]["eval"] == 0.0


def test_mean_defined_and_finite(measure):
    assert measure.mean_defined([1.0, None, 4.0]) == 2.5
    assert measure.mean_defined([None]) is None and measure.mean_defined([]) is None
    assert measure.finite({"a": math.nan, "b": [1.5, math.inf, -math.inf], "c": "x", "d": 2}) == {
        "a": None, "b": [1.5, None, None], "c": "x", "d": 2}


def test_result_line_and_the_command(measure, monkeypatch):
    out = 'loading...\nDECODE_RESULT {"tokens": 12, "wall_s": 0.5}\ndone\n'
    assert measure.result_line(out, "DECODE_RESULT") == {"tokens": 12, "wall_s": 0.5}
    assert measure.result_line(out, "TRL_RESULT") is None
    monkeypatch.setattr(sys, "argv", ["bench/scaling.py", "--steps", "4", "method=a b"])
    assert measure.bench_command("scaling.py") == "python bench/scaling.py --steps 4 'method=a b'"


def test_busy_and_the_watchers_summary(measure):
    assert measure.busy(None) == "quiet" and measure.busy(0.15) == "quiet" and measure.busy(0.2) == "busy"
    watcher = measure.LoadWatcher()
    assert watcher.others_cores() == {"others_cores_mean": None, "others_cores_max": None}
    watcher.samples = [{"others_cores": 0.25}, {"others_cores": 0.75}]
    assert watcher.others_cores() == {"others_cores_mean": 0.5, "others_cores_max": 0.75}


def test_write_json_makes_the_folder(measure, tmp_path):
    path = tmp_path / "a" / "b" / "out.json"
    measure.write_json(path, {"x": [1, 2]})
    assert path.read_text() == '{\n "x": [\n  1,\n  2\n ]\n}\n'


def _touch_fresh_pages(size: int) -> None:
    """Map ``size`` bytes of new anonymous memory, write every page, unmap it: resident while it
    lives whatever malloc already holds (a ``bytes`` of that size may reuse freed, still-resident
    heap and leave the RSS where it was)."""
    megabyte = b"\x01" * 2**20
    with mmap.mmap(-1, size) as block:
        for offset in range(0, size, len(megabyte)):
            block[offset:offset + len(megabyte)] = megabyte


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_phase_meter_sees_a_freed_spike_in_its_phase_only(measure):
    """A 256 MiB block allocated and freed inside one phase shows in that phase's peak, not in
    the next phase's (the high-water mark is reset at every mark), also in a process whose malloc
    holds freed, resident memory (as the suite's does by the time it gets here)."""
    with pytest.raises(KeyError):
        measure.proc_status("VmNoSuchField")
    if not measure.reset_peak_rss():
        pytest.skip("this kernel does not let /proc/self/clear_refs reset the peak")
    size = 256 * 2**20
    freed_heap = [b"\x02" * 100_000 for _ in range(3000)]  # ~300 MB below the mmap threshold
    top = b"\x03" * 100_000  # keeps malloc from trimming the hole below it
    del freed_heap
    meter = measure.PhaseMeter()
    start = measure.proc_status("VmRSS")
    _touch_fresh_pages(size)
    meter.mark("spike")
    meter.mark("quiet")
    del top
    assert meter.peaks["spike"] >= start + 0.9 * size
    assert meter.peaks["quiet"] < meter.peaks["spike"] - 0.5 * size


def test_state_bytes_counts_a_shared_weight_once(measure):
    import torch  # here: the other tests of this file need no torch

    layer = torch.nn.Linear(3, 2)  # 6 weights + 2 biases, float32: 32 bytes
    model = torch.nn.ModuleDict({"encoder": layer, "head": layer})  # one layer, tied: held twice
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert measure.state_bytes(model, optimizer) == (32, 0)  # no state before a step
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert measure.state_bytes(model, optimizer) == (32, 32)  # one momentum buffer per parameter
