"""The ``rredcot`` command: one subcommand per stage, each taking Hydra overrides.

    rredcot sample run.dir=runs/x experiment=quick
    rredcot attribute run.dir=runs/x method=dr_grpo
    rredcot train run.dir=runs/x method=grpo train.lr=1e-4 --cfg   # print the config, run nothing

Each command composes the config (``rredcot_cli.config.compose.compose``), then imports
``rredcot_cli.stages.<stage>`` and calls ``run(cfg, overrides)``. Mistakes a user can fix
(``RredcotError``) are printed as one ``error: ...`` line on stderr with exit status 2; so
is an ``OSError`` that names a file (disk full, no permission). Model and data paths and empty
inputs are checked before the stage makes its folder (``rredcot_cli.preflight``); a stage that
fails before writing any output leaves no folder behind.
Importing this module is cheap: no torch, transformers, Hydra or pyarrow, so ``rredcot --help``
answers at once; that is why OmegaConf, rich's printing, the preflight and each stage are imported
inside the function that needs them.
"""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, List, Optional

import typer
from typer import core
from typer.core import TyperCommand

from rredcot_cli import catalog
from rredcot_cli.config.compose import compose
from rredcot_cli.config.search import CONFIG_PATH_ENV, default_options, group_options
from rredcot_cli.segmenters import SEGMENTERS
from rredcot_cli.errors import INTERRUPTED_EXIT, ConfigError, Preempted, RredcotError, one_line, os_error_message

app = typer.Typer(
    name="rredcot",
    help="Segment-level credit assignment for RL of reasoning LMs, stage by stage. "
    "Each stage reads and writes Parquet artifacts under run.dir (default runs/<timestamp>).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}

Overrides = Annotated[
    Optional[List[str]],
    typer.Argument(
        help="Hydra overrides: group=option (method=dr_grpo), key=value (train.lr=1e-4), "
        "+key=value, experiment=NAME.",
        show_default=False,
        metavar="OVERRIDES...",
    ),
]
PrintConfig = Annotated[
    bool,
    typer.Option("--cfg", "--print-config", help="Print the resolved config as YAML and exit; run nothing."),
]
ConfigDirs = Annotated[
    Optional[List[Path]],
    typer.Option(
        "--config-dir",
        help=f"A folder of your own configs (experiment/mine.yaml, model/x.yaml, method/, ...), searched "
        f"before the packaged ones; repeatable. Same as prepending it to ${CONFIG_PATH_ENV} (os.pathsep-separated).",
        show_default=False,
        metavar="DIR",
    ),
]


def use_config_dirs(config_dirs: list[Path] | None) -> None:
    """Put ``--config-dir`` folders in front of ``$RREDCOT_CONFIG_PATH`` for this process and the
    processes it starts, so composing, --help and the stages all search them first."""
    if not config_dirs:
        return
    current = [e for e in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if e]
    given = [str(Path(d).expanduser().resolve()) for d in config_dirs]
    os.environ[CONFIG_PATH_ENV] = os.pathsep.join(dict.fromkeys(given + current))


def _config_dirs_in(args: list[str]) -> list[Path]:
    """The ``--config-dir`` values in raw arguments (read before click parses them, for --help)."""
    found = []
    for i, arg in enumerate(args):
        if arg == "--config-dir" and i + 1 < len(args):
            found.append(Path(args[i + 1]))
        elif arg.startswith("--config-dir="):
            found.append(Path(arg.split("=", 1)[1]))
    return found


def groups_help(plain: bool = False) -> str:
    """Help text listing the config groups, their options and the default of each.

    ``plain``: for click's own formatter, which rewraps paragraphs unless they start with a
    ``\\b`` line.
    """
    defaults = default_options()
    groups = []
    for group, options in group_options().items():
        shown = [f"{o} (default)" if o == defaults.get(group) else o for o in options]
        groups.append(f"  {group}: {', '.join(shown)}")
    return "\n\n".join(
        [
            ("\b\n" if plain else "")
            + "Config groups (choose with group=option):\n"
            + "\n".join(groups),
            "Overrides: key=value sets a value (train.steps=5), +key=value adds one, "
            "experiment=NAME applies a preset last. --cfg prints the composed config.",
            f"Your own configs: --config-dir DIR or ${CONFIG_PATH_ENV}, searched before the packaged ones; "
            "your own credit methods and benchmarks: entry points (rredcot.methods, rredcot.benchmarks) "
            "or the plugins list of the config (plugins=...). See docs/extending.md.",
        ]
    )


class StageCommand(TyperCommand):
    """A stage command whose --help ends with the config groups (read when help is shown),
    the user's config folders (``--config-dir``, ``$RREDCOT_CONFIG_PATH``) included."""

    def parse_args(self, ctx, args):  # noqa: ANN001 - click's signature
        use_config_dirs(_config_dirs_in(list(args)))  # --help is eager: it runs before the option
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter):  # noqa: ANN001 - click's signature
        if not self.epilog:
            with _one_line_errors():
                self.epilog = groups_help(plain=not core.HAS_RICH or self.rich_markup_mode is None)
        return super().format_help(ctx, formatter)


def _print_config(cfg) -> None:  # noqa: ANN001 - a DictConfig
    from omegaconf import OmegaConf  # deferred: --help (see the module docstring)

    text = OmegaConf.to_yaml(cfg, resolve=True)
    if sys.stdout.isatty():
        # deferred: --help (see the module docstring)
        from rich.console import Console
        from rich.syntax import Syntax

        Console().print(Syntax(text, "yaml", background_color="default", word_wrap=True))
    else:  # piped: plain YAML that can be saved and diffed
        sys.stdout.write(text)


def run_stage(stage: str, overrides: list[str] | None, print_config: bool = False,
              config_dirs: list[Path] | None = None) -> None:
    """Compose the config for ``overrides`` and run ``stage`` (or only print the config).

    ``config_dirs`` (``--config-dir``) are searched before ``$RREDCOT_CONFIG_PATH`` and the
    packaged configs. A ``RredcotError`` becomes ``error: <message>`` on stderr and exit status 2.
    """
    overrides = list(overrides or [])
    use_config_dirs(config_dirs)
    if "rredcot_cli.store.runs" in sys.modules:  # a stage run earlier in this process keeps its folders
        sys.modules["rredcot_cli.store.runs"]._FRESH_STAGES.clear()
        sys.modules["rredcot_cli.store.runs"]._BEGUN.clear()
    with _one_line_errors():
        cfg = compose(overrides)
        if print_config:
            _print_config(cfg)
            return
        if cfg.train.step is not None:  # heatmap/attribute/judge on a step saved by `rredcot train`
            from rredcot_cli.store.train_rollouts import step_view  # deferred: --help (see the module docstring)

            cfg = step_view(cfg, stage)
        from rredcot_cli.preflight import check  # deferred: --help (see the module docstring)

        check(stage, cfg)  # model and data paths, empty inputs: refused before a folder is made
        module_name = f"rredcot_cli.stages.{stage}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            raise ConfigError(f"stage '{stage}' is not available in this installation") from e
        module.run(cfg, overrides)


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """A ``RredcotError`` becomes ``error: <message>`` on stderr and exit status 2; so does an
    ``OSError`` naming a file the stage wrote or read outside the atomic writers (which name their
    own path): the machine's problem (disk full, permissions), not a bug, so no traceback."""
    try:
        yield
    except Preempted as e:  # a resumable state was kept; the job script requeues on 75 (not on Ctrl-C's 130)
        if str(e):
            typer.echo(one_line(e), err=True)
        raise typer.Exit(code=e.exit_status) from None
    except KeyboardInterrupt:  # Ctrl-C that no handler of the stage took (train takes its own)
        typer.echo(_interrupted(), err=True)
        raise typer.Exit(code=INTERRUPTED_EXIT) from None
    except RredcotError as e:
        _discard_unstarted_stages()
        typer.echo(f"error: {one_line(e)}", err=True)
        raise typer.Exit(code=2) from None
    except OSError as e:
        if e.filename is None:
            raise
        _discard_unstarted_stages()
        typer.echo(f"error: {os_error_message(e)}", err=True)
        raise typer.Exit(code=2) from None


def _interrupted() -> str:
    """One line for a stage stopped by Ctrl-C, after its manifest was marked "interrupted" (``runs``)."""
    runs = sys.modules.get("rredcot_cli.store.runs")
    marked = runs.stop_begun_stages("interrupted", signal="SIGINT") if runs else []
    kept = (f"{', '.join(map(str, marked))} marked interrupted; rerun the same command to run it again" if marked
            else "no stage output had been written")
    return f"interrupted by SIGINT: stopped at once; {kept} (exit status {INTERRUPTED_EXIT})"


def _discard_unstarted_stages() -> None:
    """A stage that failed before writing any output leaves no folder behind (``runs``)."""
    if "rredcot_cli.store.runs" in sys.modules:
        sys.modules["rredcot_cli.store.runs"].discard_unstarted_stages()


def _version() -> str:
    """The installed distribution's version (pyproject.toml), or the package's own in a source
    checkout used without installing."""
    from importlib.metadata import PackageNotFoundError, version  # deferred: --help (slow to import)

    try:
        return version("rredcot")
    except PackageNotFoundError:
        from rredcot_cli import __version__  # deferred: only without an installed distribution

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rredcot {_version()}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """Segment-level credit assignment for RL of reasoning LMs, stage by stage."""


def _choices(names: list[str]) -> str:
    return "|".join(names)


@app.command(cls=StageCommand, context_settings=_CONTEXT)
def sample(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """Sample sampling.n completions for each of sample.num_prompts prompts and verify them -> sample/samples.parquet."""
    run_stage("sample", overrides, print_config, config_dir)


@app.command(cls=StageCommand, context_settings=_CONTEXT,
             help=f"Split each completion into segments (segment={_choices(sorted(SEGMENTERS))}) -> "
             "segment/segments.parquet.")
def segment(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    run_stage("segment", overrides, print_config, config_dir)


@app.command(cls=StageCommand, context_settings=_CONTEXT)
def attribute(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """Assign credit to segments with a method -> attribute/<method>/credits.parquet, advantages.parquet."""
    run_stage("attribute", overrides, print_config, config_dir)


@app.command(cls=StageCommand, context_settings=_CONTEXT)
def train(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """RL-train the policy (sample -> segment -> attribute -> update each step) -> train/."""
    run_stage("train", overrides, print_config, config_dir)


@app.command("eval", cls=StageCommand, context_settings=_CONTEXT)
def eval_(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """Evaluate model.path on the benchmark (pass@k, accuracy by chain length) -> eval/eval.parquet."""
    run_stage("eval", overrides, print_config, config_dir)


@app.command(cls=StageCommand, context_settings=_CONTEXT)
def sft(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """Supervised-train the tiny model from scratch on synthetic chains -> sft/."""
    run_stage("sft", overrides, print_config, config_dir)


@app.command(cls=StageCommand, context_settings=_CONTEXT)
def heatmap(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """Render chosen completions coloured by credit (HTML page + PNG) -> heatmap/<method>/."""
    run_stage("heatmap", overrides, print_config, config_dir)


@app.command(cls=StageCommand, context_settings=_CONTEXT)
def judge(overrides: Overrides = None, print_config: PrintConfig = False, config_dir: ConfigDirs = None) -> None:
    """Judge each credit method's credit on saved traces against Monte Carlo values -> judge/credit_quality.parquet."""
    run_stage("judge", overrides, print_config, config_dir)


@app.command()
def report(
    run_dirs: Annotated[
        List[Path],
        typer.Argument(help="Run dirs holding a finished train/ stage (or train[-TAG] folders).",
                       show_default=False, metavar="RUN_DIR"),
    ],
    out: Annotated[Path, typer.Option("--out", help="Folder for report.md, report.csv and the PNG plots.")] = Path(
        "runs/report"),
    skip_unfinished: Annotated[bool, typer.Option(
        "--skip-unfinished", help="Leave out run dirs whose train stage did not finish (named in one line) "
        "instead of failing, e.g. over a sweep with cells still running or failed.")] = False,
    baseline: Annotated[Optional[str], typer.Option(
        "--baseline", help="Group label to pair every other group against, seed by seed (default: grpo "
        "when a group has that label).", show_default=False)] = None,
    allow_mixed_commits: Annotated[bool, typer.Option(
        "--allow-mixed-commits", help="Keep paired comparisons whose arms ran on different (or unrecorded) git "
        "commits in the paired section, flagged; by default they are left out with a warning.")] = False,
) -> None:
    """Compare finished training runs: accuracy vs step and by chain length over seeds -> report.md, .csv, .png."""
    with _one_line_errors():
        from rredcot_cli.stages import report as report_stage  # deferred: --help (see the module docstring)

        report_stage.run(run_dirs, out, skip_unfinished=skip_unfinished, baseline=baseline,
                         allow_mixed_commits=allow_mixed_commits)


@app.command("list", help=f"List what exists, one line each: {', '.join(catalog.KINDS)}; with a NAME, "
             "that one in full (a method's options with their types, defaults and meaning).")
def list_(
    kind: Annotated[str, typer.Argument(help=_choices(list(catalog.KINDS)), show_default=False, metavar="KIND")],
    name: Annotated[Optional[str], typer.Argument(help="One of them, shown in full.", show_default=False)] = None,
    config_dir: ConfigDirs = None,
) -> None:
    use_config_dirs(config_dir)
    with _one_line_errors():
        kind = catalog.kind_of(kind)
        lines = catalog.details(kind, name) if name else catalog.table(catalog.entries(kind))
    typer.echo("\n".join(lines))


def main() -> None:
    """Entry point of the ``rredcot`` script."""
    app()
