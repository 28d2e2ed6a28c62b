"""A full disk (ENOSPC) or quota (EDQUOT) at every writer: one line naming the path, what the write
needed and what is left; the old file stays and no temporary is left that a later stage could take as
complete. The disk is filled by fault injection (each library's own low-level write raises what it
raises on a full disk); tests/train/test_survival.py fills a real tmpfs where mounting is allowed."""

import errno
import re

import pytest
import torch
from safetensors import SafetensorError

from rredcot_cli.errors import StorageError
from rredcot_cli.store import atomic
from rredcot_cli.store.artifacts import read_artifact, write_artifact
from rredcot_cli.store.runs import atomic_path, atomic_write_text

ROW = {
    "prompt_id": "p0", "sample_idx": 0, "prompt": "1+1", "prompt_token_ids": [1, 2], "completion": "=2",
    "completion_token_ids": [3, 4], "completion_logprobs": [-0.1, -0.2], "reward": 1.0, "scorable": True,
    "gold_answer": "2", "pred_answer": "2", "benchmark": "chain", "finish_reason": "stop", "num_tokens": 2,
    "meta": "{}",
}
FULL = r"No space left on device \(the disk is full: (about|at least) [\d.]+ [kMGT]?B needed, [\d.]+ [kMGT]?B free there; "


def _only(folder, *names):
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)


def test_manifest_json_full_disk_names_bytes_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = atomic_write_text(tmp_path / "manifest.json", "{}")
    real_open = open

    def fills_the_disk(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "w" in mode and atomic.TMP_MARK in str(file):
            handle.write(b'{"half')
            handle.close()
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return handle

    monkeypatch.setattr("builtins.open", fills_the_disk)
    with pytest.raises(StorageError) as info:
        atomic_write_text(path, '{"status": "complete"}')
    monkeypatch.undo()
    assert re.fullmatch(re.escape(f"cannot write {path}: Disk quota exceeded (the disk quota is exceeded: about 22 B "
                                  "needed, ") + r"[\d.]+ [kMGT]?B free there; free space or point run.dir elsewhere\); "
                        "outputs finished before this were kept", str(info.value)), str(info.value)
    assert info.value.errno == errno.EDQUOT and path.read_text() == "{}"
    _only(tmp_path, "manifest.json")


def test_parquet_artifact_full_disk(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    path = write_artifact("samples", [ROW], tmp_path / "samples.parquet")
    real = pq.write_table

    def half_then_full(table, where, **kwargs):  # pyarrow's own error: an OSError, errno 28, its own text
        real(table.slice(0, 1), where)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq, "write_table", half_then_full)
    with pytest.raises(StorageError, match=re.escape(f"cannot write {path}: ") + FULL):
        write_artifact("samples", [ROW, dict(ROW, sample_idx=1)], path)
    monkeypatch.undo()
    assert read_artifact("samples", path).num_rows == 1
    _only(tmp_path, "samples.parquet")


def test_checkpoint_weights_full_disk_from_safetensors(tmp_path, monkeypatch):
    """safetensors raises its own SafetensorError (not an OSError) on a full disk; a checkpoint
    folder is then not renamed into place and its temporary is gone."""
    import transformers.modeling_utils as modeling_utils
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))

    def full(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"\0" * 1000)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", full)
    target = tmp_path / "checkpoints" / "step-000002"
    with pytest.raises(StorageError, match=re.escape(f"cannot write {target}: ") + FULL) as info:
        with atomic_path(target, needed=12345) as tmp:
            model.save_pretrained(tmp)
    assert "about 12.3 kB needed" in str(info.value)
    _only(tmp_path / "checkpoints")


def test_optimizer_state_full_disk_from_torch_save(tmp_path, monkeypatch):
    """torch.save says only "unexpected pos ..." when the disk fills; with (almost) nothing free on
    the file system that is taken as a full disk. With space left it stays a bug, with its traceback."""
    state = {"exp_avg": torch.zeros(1000)}

    def full(obj, file, *args, **kwargs):
        with open(file, "wb") as f:
            f.write(b"PK" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(torch, "save", full)
    target = tmp_path / "step-000004"
    monkeypatch.setattr(atomic, "_free_bytes", lambda folder: 0)
    with pytest.raises(StorageError, match=re.escape(f"cannot write {target}: No space left on device (the disk "
                                                     "is full: at least 200 B needed, 0 B free there")):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            torch.save(state, tmp / "trainer_state.pt")
    monkeypatch.setattr(atomic, "_free_bytes", lambda folder: 10**10)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            torch.save(state, tmp / "trainer_state.pt")
    _only(tmp_path)


def test_gguf_conversion_full_disk_caches_nothing(tmp_path, monkeypatch):
    from rredcot_cli.policy import model_files

    monkeypatch.setenv("RREDCOT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 100)

    def full(source, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"\0" * 4096)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(model_files, "_write_converted", full)
    with pytest.raises(StorageError) as info:
        model_files.convert_gguf(gguf)
    target = model_files.converted_dir(gguf.resolve())
    assert re.fullmatch(re.escape(f"cannot write {target}: ") + FULL + r"free space or point run.dir at another "
                        r"disk\); nothing was cached, the next run converts again", str(info.value)), str(info.value)
    assert "at least 4.1 kB needed" in str(info.value)
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_tracker_store_full_disk(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    from rredcot_cli.train import tracking

    trackers = tracking.open_trackers(["tensorboard"], tmp_path, config={}, run_id="r", run_name="x")
    trackers.log({"loss": 1.0}, 1)

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "flush", full)
    with pytest.raises(StorageError, match=re.escape(f"cannot write the tensorboard store in {tmp_path}: No space "
                                                     "left on device (the disk is full: ")):
        trackers.log({"loss": 0.5}, 2)
    monkeypatch.undo()
    trackers.close()

