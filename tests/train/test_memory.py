"""The train stage's resident memory (rredcot_cli/train/memory.py): glibc is told once, at the start
of the stage, to return what torch frees, and only on glibc; ``train.gradient_checkpointing=auto``
turns checkpointing on, saying so in one line, where it would save much memory, and changes nothing
else (the same numbers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from rredcot_cli.train import memory

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536)
SMOLLM2_PARAMETERS = 134_515_008
TINY = json.loads((REPO / "rredcot_cli/assets/tiny-chain/config.json").read_text())

# Frees 100 MiB of 1 MiB blocks below a live one, after a freed 4 MiB block has raised glibc's
# dynamic mmap threshold (as torch's tensors do within a step), and prints how much of it left the
# resident set. The argument says how the allocator is set up first: "default" or "mallopt"
# (what the train stage does).
FRAGMENTED_FREE = textwrap.dedent("""
    import ctypes, os, sys
    if sys.argv[1] == "mallopt":
        from rredcot_cli.train import memory
        assert memory.return_freed_memory_to_os()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
    libc.free(libc.malloc(4 << 20))
    blocks = [libc.malloc(1 << 20) for _ in range(100)]
    for b in blocks:
        libc.memset(b, 1, 1 << 20)
    live = libc.malloc(64)
    before = rss()
    for b in blocks:
        libc.free(b)
    print((before - rss()) / 2**20)
""")


def _freed_mib(how: str, **env) -> float:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", FRAGMENTED_FREE, how], env={**clean, **env}, cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])


glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                                reason="glibc's allocator")


@glibc_only
def test_the_train_stage_returns_freed_memory_as_the_environment_variable_does():
    kept = _freed_mib("default")
    assert kept < 10, "the scenario no longer holds freed memory by default: it checks nothing"
    by_variable = _freed_mib("default", MALLOC_MMAP_THRESHOLD_="131072")
    assert by_variable > 90
    assert _freed_mib("mallopt") > 90      # set after start-up, the same as the variable


def test_the_train_stage_sets_the_allocator_before_anything_else(monkeypatch):
    from rredcot_cli.stages import train

    calls = []

    class Stop(Exception):
        pass

    def first_step(_cfg):
        calls.append("method")
        raise Stop

    monkeypatch.setattr(memory, "return_freed_memory_to_os", lambda: calls.append("allocator"))
    monkeypatch.setattr(train, "method_and_params", first_step)
    with pytest.raises(Stop):
        train.run(None, [])
    assert calls == ["allocator", "method"]


class FakeLibc:
    """Records mallopt calls; ``glibc`` says whether it has glibc's version function."""

    def __init__(self, glibc: bool):
        self.calls = []
        if glibc:
            self.gnu_get_libc_version = lambda: b"2.35"

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return 1


@pytest.fixture
def fake_libc(monkeypatch):
    """memory.return_freed_memory_to_os with ctypes.CDLL replaced (the real one would change this
    process's allocator) and its once-per-process cache cleared around the test."""
    libs = []

    def load(name, glibc=True):
        libs.append(FakeLibc(glibc))
        return libs[-1]

    memory.return_freed_memory_to_os.cache_clear()
    for variable in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"):
        monkeypatch.delenv(variable, raising=False)
    yield libs, monkeypatch, load
    memory.return_freed_memory_to_os.cache_clear()


def test_mallopt_is_called_once_per_process_on_glibc(fake_libc):
    libs, monkeypatch, load = fake_libc
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", load)
    assert memory.return_freed_memory_to_os() and memory.return_freed_memory_to_os()
    assert len(libs) == 1
    assert libs[0].calls == [(memory.M_MMAP_THRESHOLD, 131072), (memory.M_TRIM_THRESHOLD, 131072),
                             (memory.M_ARENA_MAX, 2)]


def test_a_malloc_variable_the_user_set_wins(fake_libc):
    libs, monkeypatch, load = fake_libc
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", load)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert memory.return_freed_memory_to_os()
    assert [p for p, _ in libs[0].calls] == [memory.M_MMAP_THRESHOLD, memory.M_TRIM_THRESHOLD]


def test_other_systems_and_c_libraries_are_left_alone(fake_libc):
    libs, monkeypatch, load = fake_libc
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: load(name, glibc=False))
    monkeypatch.setattr(sys, "platform", "linux")  # musl: no gnu_get_libc_version
    assert memory.return_freed_memory_to_os() is False
    assert libs[0].calls == []
    memory.return_freed_memory_to_os.cache_clear()
    for system in ("darwin", "win32"):
        monkeypatch.setattr(sys, "platform", system)
        assert memory.return_freed_memory_to_os() is False
        memory.return_freed_memory_to_os.cache_clear()
    assert len(libs) == 1  # no library loaded off Linux


def test_auto_turns_checkpointing_on_where_it_saves_much_and_says_so_in_one_line():
    positions = memory.positions_per_pass(1024, 32, 128)  # CPU's auto micro-batch budget
    on, line = memory.choose_checkpointing("auto", SMOLLM2, SMOLLM2_PARAMETERS, positions)
    assert on and line and "\n" not in line
    assert "gradient checkpointing on" in line and "1,024 positions" in line
    assert "train.gradient_checkpointing=false turns it off" in line
    # the long-chain shape: one row of 1,024 new tokens is a pass alone
    on, line = memory.choose_checkpointing("auto", SMOLLM2, SMOLLM2_PARAMETERS, memory.positions_per_pass(1024, 32, 1024))
    assert on and "1,024 positions" in line


def test_auto_leaves_checkpointing_off_where_it_saves_little_and_says_nothing():
    positions = memory.positions_per_pass(1024, 32, 128)
    tiny = SimpleNamespace(**{k: TINY[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size")})
    off = (False, None)
    assert memory.choose_checkpointing("auto", tiny, 1_000_000, memory.positions_per_pass(1024, 32, 1264)) == off
    assert memory.choose_checkpointing("auto", SMOLLM2, SMOLLM2_PARAMETERS, 128) == off      # short passes
    assert memory.choose_checkpointing("auto", SimpleNamespace(), SMOLLM2_PARAMETERS, positions) == off  # unknown shape
    assert memory.choose_checkpointing("auto", SMOLLM2, SMOLLM2_PARAMETERS, positions, supported=False) == off


def test_true_and_false_are_the_users_choice_kept_silently():
    positions = memory.positions_per_pass(1024, 32, 128)
    assert memory.choose_checkpointing(False, SMOLLM2, SMOLLM2_PARAMETERS, positions) == (False, None)
    assert memory.choose_checkpointing(True, SMOLLM2, SMOLLM2_PARAMETERS, 128) == (True, None)
    with pytest.raises(ValueError, match="train.gradient_checkpointing=maybe: expected auto, true or false"):
        memory.choose_checkpointing("maybe", SMOLLM2, SMOLLM2_PARAMETERS, positions)


def test_positions_per_pass():
    assert memory.positions_per_pass(1024, 32, 128) == 1024
    assert memory.positions_per_pass(1024, 32, 2048) == 2048   # a longer row is a pass alone
    assert memory.positions_per_pass(0, 4, 512) == 2048         # no budget (GPU): the rows at full length


# `rredcot train` in its own process (the allocator setting would otherwise stay in the test's),
# with what the loop hands the update watched: ON_WHEN_SMALL makes any saving count as large, so
# that `auto` turns checkpointing on for the tiny model.
WATCHED_TRAIN = textwrap.dedent("""
    import sys
    from rredcot_cli.train import loop, memory, trainable
    if sys.argv.pop(1) == "on_when_small":
        memory.MIN_SAVING_BYTES = memory.MIN_SAVING_OF_FLOOR = 0
    update = loop.policy_update
    def watched(model, *args, **kwargs):
        print("checkpointing active:", trainable.checkpointing_active(model))
        return update(model, *args, **kwargs)
    loop.policy_update = watched
    sys.argv[0] = "rredcot"
    from rredcot_cli.cli import main
    main()
""")


def _train_watched(run: Path, how: str) -> str:
    """What the run printed (the watcher on stdout, the stage's lines on stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", WATCHED_TRAIN, how, "train", "experiment=quick", "method=grpo",
                          "seed=0", f"run.dir={run}"], cwd=run.parent, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def test_auto_checkpoints_where_the_saving_is_large_with_the_same_numbers(tmp_path):
    """The default (`auto`) leaves the tiny model alone and says nothing; where the saving counts
    as large it turns checkpointing on in the update, says so in one line, and the run's metrics,
    evals and final weights are the same, bit for bit (scripts/same_run.py)."""
    from repo_scripts import load_script

    plain = _train_watched(tmp_path / "plain", "default")
    assert "checkpointing active: False" in plain and "checkpointing active: True" not in plain
    assert "gradient checkpointing" not in plain
    checkpointed = _train_watched(tmp_path / "checkpointed", "on_when_small")
    assert "checkpointing active: True" in checkpointed and "checkpointing active: False" not in checkpointed
    lines = [line for line in checkpointed.splitlines() if "gradient checkpointing on" in line]
    assert len(lines) == 1 and "train.gradient_checkpointing=false turns it off" in lines[0]
    found, compared = load_script("scripts/same_run.py").differences(tmp_path / "plain", tmp_path / "checkpointed")
    assert compared > 100 and found == []
