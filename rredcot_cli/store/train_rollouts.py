"""Training rollouts as artifacts: what the loop sampled and credited at a step, kept on disk.

Every ``train.save_rollouts`` steps ``rredcot train`` writes the step's samples, segments and
the training method's credits and advantages, with the schemas the stages write, laid out as a
run dir of their own::

    <train dir>/rollouts/step-000020/
      sample/samples.parquet
      segment/segments.parquet
      attribute/<method>/credits.parquet, advantages.parquet

each folder with a ``manifest.json`` saying which training step made it. ``train.step=20`` on
``heatmap``, ``attribute`` or ``judge`` makes that folder the stage's run dir
(``step_view``), so ``rredcot heatmap run.dir=R train.step=20 method=rredcot`` draws where the
credit went at step 20, and their outputs (``heatmap/``, ``attribute/<other method>/``,
``judge/``) land beside the step's artifacts. The step folder appears whole (one atomic rename)
or not at all. Under dynamic sampling the samples are the groups trained on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING
import json
import copy

from omegaconf import read_write

from rredcot_cli.store import artifacts, runs
from rredcot_cli.errors import RunError

if TYPE_CHECKING:
    from omegaconf import DictConfig

FOLDER = "rollouts"
# Stages that read a saved step with train.step=N; every other stage refuses the option.
READING_STAGES = ("heatmap", "attribute", "judge")


def step_dir(train_dir: str | Path, step: int) -> Path:
    return Path(train_dir) / FOLDER / f"step-{step:06d}"


def is_due(step: int, every: int) -> bool:
    """Whether step ``step`` (1-based) is one ``train.save_rollouts=every`` saves."""
    return every > 0 and step % every == 0


def save(train_dir: str | Path, step: int, *, samples: list[dict], segments: list[dict], credits: list[dict],
         advantages: list[dict], method: str, config_hash: str) -> Path:
    """Write step ``step``'s rollouts (``samples`` and their ``segments``, the ``credits`` and
    ``advantages`` rows of the update's credit, ``pipeline.credit_rows``) under ``train_dir``;
    returns the step folder."""
    target = step_dir(train_dir, step)
    with runs.atomic_path(target) as tmp:
        made: dict[str, dict] = {}

        def write(stage: str, kinds: dict[str, list[dict]], inputs: tuple[str, ...]) -> None:
            folder = tmp / stage
            outputs = {}
            for kind, rows in kinds.items():
                path = artifacts.write_artifact(kind, rows, folder / artifacts.get_spec(kind).file_name)
                outputs[kind] = {"path": path.name, "sha256": runs.sha256_file(path)}
                made[kind] = {"path": str(target / stage / path.name), "sha256": outputs[kind]["sha256"]}
            runs.atomic_write_text(folder / runs.MANIFEST, _manifest(stage.split("/")[0], step, config_hash, outputs,
                                                                    {k: made[k] for k in inputs}))

        write("sample", {"samples": samples}, ())
        write("segment", {"segments": segments}, ("samples",))
        write(f"attribute/{method}", {"credits": credits, "advantages": advantages}, ("samples", "segments"))
    return target


def _manifest(stage: str, step: int, config_hash: str, outputs: dict, inputs: dict) -> str:
    return json.dumps({"stage": stage, "status": "complete", "made_by": "rredcot train", "train_step": step,
                       "config_hash": config_hash, "config_keys": [], "inputs": inputs, "outputs": outputs},
                      indent=2) + "\n"


def saved_steps(train_dir: str | Path) -> list[int]:
    folder = Path(train_dir) / FOLDER
    found = [re.fullmatch(r"step-(\d+)", p.name) for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(m.group(1)) for m in found if m)


def step_view(cfg: DictConfig, stage: str) -> DictConfig:
    """``cfg`` itself without ``train.step``; with it, for a reading stage, a copy whose run dir is
    the saved step's folder in ``train-<run.tag>/`` if that exists, else in ``train/``; in the
    step folder ``run.tag`` names the stage's outputs as in any run dir. Other stages refuse the
    option in one line."""
    step = cfg.train.step
    if step is None or stage == "train":
        return cfg
    if stage not in READING_STAGES:
        raise RunError(f"train.step={step}: only {', '.join(READING_STAGES)} read a saved training step; "
                       f"`rredcot {stage}` does not")
    train_dir = runs.stage_folder(cfg, "train")
    if cfg.run.tag and not train_dir.is_dir():
        train_dir = Path(cfg.run.dir) / "train"
    folder = step_dir(train_dir, step)
    if not folder.is_dir():
        steps = saved_steps(train_dir)
        saved = f"saved steps: {', '.join(map(str, steps))}" if steps else "none saved there"
        raise RunError(f"train.step={step}: {train_dir} holds no rollouts of step {step} ({saved}); "
                       f"`rredcot train train.save_rollouts=N` saves every N-th step")

    view = copy.deepcopy(cfg)
    with read_write(view):
        view.run.dir = str(folder)
    return view
