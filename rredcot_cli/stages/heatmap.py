"""`rredcot heatmap`: which segments helped and which were detours, as a page and a figure.

Reads samples, segments and one method's credits and advantages, picks ``heatmap.samples``
completions (``heatmap.select``), and writes a self-contained ``heatmap.html`` and a
``heatmap.png`` under ``<run.dir>/heatmap[-<tag>]/<method>/``. These are views, not artifacts:
they are rewritten on every call (atomically) and carry no manifest; the folder's writer lock
(``store/lock.py``) keeps a second heatmap from mixing its page with this one's figure.

Tokens are decoded with the tokenizer of ``model.path``; if it cannot be loaded, or does not give
the texts the segments were made from, each segment is shown as one piece. On synthetic
benchmarks the first wrong step of each chain is marked.
"""

from __future__ import annotations

from collections import defaultdict
from omegaconf import DictConfig
from transformers import AutoTokenizer

from rredcot_cli.store import artifacts, lock, runs
from rredcot_cli.errors import ArtifactError, ConfigError
from rredcot_cli.console import console
from rredcot_cli.stages.common import table_rows
from rredcot_cli.report.heatmap_cards import SELECT_MODES, SelectionError, build_cards
from rredcot_cli.report.heatmap_colors import COLOR_BY
from rredcot_cli.report.heatmap_html import render_html
from rredcot_cli.report.heatmap_png import render_png
from rredcot_cli.benchmarks import SYNTHETIC_BENCHMARKS, make_benchmark
from rredcot_cli.policy.models import resolve_model_path
from rredcot_cli.pipeline import token_texts


def run(cfg: DictConfig, overrides: list[str]) -> None:
    h = cfg.heatmap
    if h.select not in SELECT_MODES:
        raise ConfigError(f"heatmap.select={h.select}: expected one of {', '.join(SELECT_MODES)}")
    if h.color_by not in COLOR_BY:
        raise ConfigError(f"heatmap.color_by={h.color_by}: expected one of {', '.join(COLOR_BY)}")
    if h.samples < 1:
        raise ConfigError(f"heatmap.samples={h.samples}: expected at least 1")
    method = cfg.method.name

    paths = {kind: runs.find_input(cfg, kind) for kind in ("samples", "segments", "credits", "advantages")}
    tables = {kind: artifacts.read_artifact(kind, path) for kind, path in paths.items()}
    artifacts.validate_segments_tile(tables["segments"], tables["samples"])
    rows = {kind: table_rows(table) for kind, table in tables.items()}

    token_texts = _token_text_source(cfg, rows["segments"])
    benchmark = _step_checker(cfg, rows["samples"])
    try:
        cards = build_cards(
            rows["samples"], rows["segments"], rows["credits"], rows["advantages"],
            benchmark=benchmark, select=h.select, count=h.samples,
            prompt_ids=list(h.prompt_ids) if h.prompt_ids else None, sample_idx=h.sample_idx,
            token_texts=token_texts, method=method,
        )
    except SelectionError as e:
        raise ConfigError(str(e)) from e
    except ValueError as e:
        raise ArtifactError(f"{paths['credits'].parent}: the artifacts do not fit together ({e})") from e

    out_dir = lock.lock_output_folder(runs.stage_folder(cfg, "heatmap", method))
    subtitle = f"run {cfg.run.dir} · method {method} · selection {h.select}"
    title = f"rredcot heatmap · {method}"
    html_path = runs.atomic_write_text(out_dir / "heatmap.html",
                                       render_html(cards, title=title, subtitle=subtitle, color_by=h.color_by))
    png_path = out_dir / "heatmap.png"
    with runs.atomic_path(png_path) as tmp:
        render_png(cards, tmp, title=f"{title} · {cfg.run.dir}")

    correct = sum(c.correct for c in cards)
    marked = sum(c.first_wrong_step is not None for c in cards)
    console.print(f"{method}: rendered {len(cards)} completions ({correct} correct, {len(cards) - correct} incorrect"
                  + (f", {marked} with a first wrong step" if benchmark is not None else "") + ")")
    print(html_path)
    print(png_path)


def _token_text_source(cfg: DictConfig, segments: list[dict]):
    """A function ``samples row -> token texts`` (None for a row whose texts do not match its
    segments' texts), or None when the tokenizer of ``model.path`` cannot be loaded."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path),
                                                  trust_remote_code=cfg.model.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any failure only costs token detail
        console.print(f"[yellow]heatmap: cannot load the tokenizer of model.path={cfg.model.path} "
                      f"({type(e).__name__}); showing whole segments[/yellow]")
        return None

    by_key: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for seg in segments:
        by_key[(seg["prompt_id"], int(seg["sample_idx"]))].append(seg)

    def texts(row: dict) -> list[str] | None:
        decoded = token_texts(tokenizer, list(row["completion_token_ids"]))
        for seg in by_key[(row["prompt_id"], int(row["sample_idx"]))]:
            if "".join(decoded[seg["token_start"]:seg["token_end"]]) != seg["text"]:
                console.print(f"[yellow]heatmap: the tokenizer of model.path does not reproduce the segment texts "
                              f"of {row['prompt_id']} #{row['sample_idx']}; showing whole segments[/yellow]")
                return None
        return decoded

    return texts


def _step_checker(cfg: DictConfig, samples: list[dict]):
    """The synthetic benchmark of the samples (it knows each chain's first wrong step), or None."""
    names = {row["benchmark"] for row in samples}
    if len(names) != 1 or not names <= SYNTHETIC_BENCHMARKS:
        return None
    name = names.pop()
    b = cfg.benchmark
    if name == b.name:  # the step checks read only each problem's meta; these options are just valid ones
        return make_benchmark(name, min_steps=b.min_steps, max_steps=b.max_steps, data_seed=b.data_seed)
    return make_benchmark(name)

