"""The report as text: ``report.md`` and the CSV files of ``rredcot report``.

- ``summary_rows(report)``: the main table as text cells (report.md and the terminal table);
- ``render_markdown(report)``: ``report.md`` (summary, paired section, curve, accuracy by chain
  length, advantages, credit quality, cost, the runs), linking the figures of
  ``rredcot_cli.report.plots``;
- ``render_csv(report)``: ``report.csv``, one row per group; ``render_credit_quality_csv(report)``:
  ``credit_quality.csv``, one row per group, source, key and measure.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any, Sequence

from rredcot_cli.report.compare import (CONFIDENCE, GroupSummary, PairedRow, Report, Stat, cross_commit_text,
                                        short_commit)
from rredcot_cli.report.load import machines_text


# --------------------------------------------------------------------------- markdown


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _seeds_text(group: GroupSummary) -> str:
    return f"{len(group.runs)} ({', '.join(str(s) for s in group.seeds)})"


def _signed(stat: Stat) -> str:
    text = stat.text()
    return text if text.startswith("-") else "+" + text


def summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The main table as text cells (shared by report.md and the terminal table). With one k
    for every group the header names it (pass@8); otherwise each cell does."""
    ks = {g.k for g in report.groups}
    k_header = str(ks.pop()) if len(ks) == 1 else "k"
    header = ["method", "seeds", "pass@1", "Δ pass@1", f"pass@{k_header}", f"maj@{k_header}", "wall s",
              "generated tokens"]
    rows = []
    for g in report.groups:
        k_cell = "" if k_header != "k" else f" (k={g.k})"
        rows.append([g.label, _seeds_text(g), g.pass1.text(), _signed(g.delta_pass1),
                     g.pass_k.text() + k_cell, g.maj_k.text() + k_cell, g.seconds.text(0), g.generated_tokens.text(0)])
    return header, rows


def render_markdown(report: Report) -> str:
    b = report.benchmark
    first = report.runs[0].summary["eval_after"]
    steps_range = f", chain length {b['min_steps']}–{b['max_steps']}" if b.get("min_steps") is not None else ""
    parts = [
        "# rredcot comparison report",
        f"{len(report.runs)} training runs in {len(report.groups)} groups on benchmark `{b.get('name')}` "
        f"(held-out split `{b.get('eval_split')}`{steps_range}; final eval of the first run: "
        f"{first.get('num_problems')} problems × {first.get('n')} samples). "
        "Runs are grouped by method and by every option that differs between them; seeds vary within a "
        "group (`seed`, and `train.data_order_seed`, which groups only by whether it is set). "
        f"`±` is the half-width of a {CONFIDENCE:.0%} Student-t interval over seeds "
        "(none with one seed).",
        "## Final held-out accuracy",
        "![final held-out pass@1](final_accuracy.png)",
        _md_table(*summary_rows(report)),
        "pass@1 is the mean over problems of the fraction of correct samples; pass@k is unbiased; "
        "maj@k is majority voting over the first k samples. Δ pass@1 is after minus before training, per run. "
        "Wall seconds and generated tokens cover the whole `rredcot train` run (held-out evals included "
        "in the seconds, training rollouts only in the tokens).",
    ]
    if report.paired or report.refused:
        parts += [f"## Paired against {report.baseline}", _paired_markdown(report)]
    parts += [
        "## Held-out accuracy vs policy updates",
        "![held-out pass@1 vs step](accuracy_vs_step.png)",
    ]
    steps = sorted({s for g in report.groups for s in g.curve})
    parts.append(_md_table(["step"] + [g.label for g in report.groups],
                           [[s] + [g.curve[s].text() if s in g.curve else "" for g in report.groups] for s in steps]))
    parts.append("Step 0 is the held-out eval before training; a step is one batch of rollouts and its "
                 "policy updates.")
    parts += ["## Final accuracy by chain length", "![accuracy by chain length](accuracy_by_length.png)"]
    lengths = sorted({n for g in report.groups for n in g.by_length})
    if lengths:
        parts.append(_md_table(["chain length"] + [g.label for g in report.groups],
                               [[n] + [g.by_length[n].text() if n in g.by_length else "" for g in report.groups]
                                for n in lengths]))
        parts.append("Per run, the fraction of correct samples among the final eval's problems of that length; "
                     "then mean and interval over seeds.")
    else:
        parts.append("The eval rows have no chain length (`steps`), so there is no breakdown by length.")
    if any(r.advantage_std is not None for r in report.runs):
        parts += ["## Advantages", _advantages_markdown(report)]
    parts += ["## Credit quality", _credit_quality_markdown(report)]
    parts += ["## Cost", _cost_markdown(report)]
    parts += ["## Runs", _md_table(
        ["run dir", "group", "seed", "steps", "pass@1 before", "pass@1 after", "wall s", "generated tokens", "commit",
         "machine"],
        [[str(r.path), r.label, r.seed, r.summary.get("steps", ""), f"{r.summary['eval_before']['pass@1']:.3f}",
          f"{r.summary['eval_after']['pass@1']:.3f}", f"{float(r.summary.get('seconds', math.nan)):.0f}",
          r.summary.get("generated_tokens", ""), short_commit(r.commit) + (" (dirty)" if r.dirty else ""),
          machines_text(r.machines)]
         for g in report.groups for r in g.runs])]
    if report.skipped:
        parts.append(f"Left out (`--skip-unfinished`; their train stage did not finish): "
                     f"{', '.join(f'`{p}`' for p in report.skipped)}.")
    return "\n\n".join(parts) + "\n"


def _advantages_markdown(report: Report) -> str:
    rows = []
    for g in report.groups:
        values = [r.advantage_std for r in g.runs if r.advantage_std is not None]
        rows.append([g.label, Stat.of(values).text() if len(values) == len(g.runs) else "—"])
    return "\n\n".join([
        _md_table(["method", "token advantage std"], rows),
        "Per step, the standard deviation of the token advantages over the batch's completion tokens; "
        "its mean over the run's steps, then over seeds (— where a run predates the column). How "
        "spread the update's signal is, not how right it is (credit quality measures that).",
    ])


def _paired_markdown(report: Report) -> str:
    target = (report.paired or report.refused)[0].target
    rows = []
    for row in report.paired:
        is_base = row.label == report.baseline
        diff = "—" if is_base else (f"{row.difference.mean:+.3f} [{row.difference.low:+.3f}, {row.difference.high:+.3f}]"
                                    if not math.isnan(row.difference.low) else
                                    (f"{row.difference.mean:+.3f}" if row.difference.n else "no common seed"))
        resolves = "—" if is_base or math.isnan(row.difference.low) else f"± {row.difference.half_width():.3f}"
        label = f"{row.label} ⚠ MIXED COMMITS" if row.cross_commit else row.label
        rows.append([label, ", ".join(map(str, row.seeds)), diff, resolves, f"{row.reached}/{row.runs}",
                     row.steps_to_target.text(1) if row.steps_to_target else "—",
                     row.tokens_to_target.text(0) if row.tokens_to_target else "—"])
    return "\n\n".join([
        _md_table(["method", "seeds", f"Δ final pass@1 vs {report.baseline} (same seed)", "resolves",
                   f"reached {target:.3f}", "policy updates to reach it", "generated tokens to reach it"], rows),
        f"Δ is the mean of the per-seed differences with its {CONFIDENCE:.0%} Student-t interval; \"resolves\" is "
        "that interval's half-width, the smallest difference this many paired seeds can tell from zero. "
        f"Sample efficiency: the first held-out eval at which a run's pass@1 reached {report.baseline}'s mean "
        f"final pass@1 ({target:.3f}), in policy updates (steps) and generated training tokens up to that step, "
        "over the runs that reached it; its resolution is the eval interval (`train.eval_every`). "
        f"The {report.baseline} row is the baseline measured against its own mean.",
        *[_mixed_commits_note(row, report.baseline, refused=False) for row in report.paired if row.cross_commit],
        *[_mixed_commits_note(row, report.baseline, refused=True) for row in report.refused],
        *[_machines_note(row, report.baseline) for row in report.paired if row.cross_machine],
    ])


def _machines_note(row: PairedRow, baseline: str) -> str:
    pairs = "; ".join(f"seed {seed}: {machines_text(mine)} vs {machines_text(base)}"
                      for seed, mine, base in row.cross_machine)
    return (f"**Machines:** {row.label} vs {baseline}: {len(row.cross_machine)} of {len(row.seeds)} pairs ran on "
            f"different CPUs ({pairs}). A run is bit-identical only on one kind of CPU "
            "(docs/failure-modes.md, Determinism), so these pairs share the design (model, problems, their order, "
            "the eval set), not their numbers: their differences stay unbiased, the pairing may remove less noise.")


def mixed_commits_line(row: PairedRow, baseline: str, refused: bool) -> str:
    """One line on a paired comparison whose arms ran on different or unknown commits."""
    what = (f"left out of the paired section; rerun both arms at one commit, or pass --allow-mixed-commits "
            f"to show it flagged" if refused else "shown flagged (--allow-mixed-commits)")
    return (f"{row.label} vs {baseline}: pairs ran on different or unknown commits ({cross_commit_text(row)}), "
            f"so they are not common-random-number pairs; {what}")


def _mixed_commits_note(row: PairedRow, baseline: str, refused: bool) -> str:
    return f"**⚠ {'Refused' if refused else 'Mixed commits'}:** {mixed_commits_line(row, baseline, refused)}."


def _credit_quality_markdown(report: Report) -> str:
    if not report.credit_quality:
        return ("No credit-quality results in these run dirs (looked for `credit_quality.parquet` and "
                "`judge/**/*.parquet`).")
    parts = []
    for source, (keys, measures) in report.credit_quality_columns.items():
        rows = [row for row in report.credit_quality if row["source"] == source]
        parts.append(f"From `{source}` (mean per run, then over the group's runs):")
        parts.append(_md_table(["method (run group)"] + keys + measures,
                               [[row["group"]] + [row.get(k, "") for k in keys]
                                + [row[m].text() if m in row else "" for m in measures] for row in rows]))
    return "\n\n".join(parts)


def _cost_markdown(report: Report) -> str:
    rows = []
    for g in report.groups:
        steps = [float(r.summary.get("steps") or math.nan) for r in g.runs]
        per_step = Stat.of([float(r.summary.get("seconds", math.nan)) / s for r, s in zip(g.runs, steps)])
        tokens_per_s = Stat.of([float(r.summary.get("generated_tokens", math.nan)) / float(r.summary.get("seconds", math.nan))
                                for r in g.runs])
        cpu = [float(r.summary["cpu_seconds"]) for r in g.runs if "cpu_seconds" in r.summary]
        cpu_text = Stat.of(cpu).text(0) if len(cpu) == len(g.runs) else "—"
        rows.append([g.label, g.seconds.text(0), cpu_text, per_step.text(2), g.generated_tokens.text(0),
                     tokens_per_s.text(0)])
    parts = [_md_table(["method", "wall s", "CPU s", "s per step", "generated tokens", "generated tokens per wall s"],
                       rows)]
    parts.append("CPU s: the train process's CPU time, every thread (an in-process vLLM engine included); "
                 "— for runs written before it was recorded.")
    if report.attribute_costs:
        parts.append("`rredcot attribute` on the saved traces of these run dirs:")
        parts.append(_md_table(["method (run group)", "attribute folder", "seconds", "× sample stage seconds"],
                               [[row["group"], row["attribute"], row["seconds"].text(2),
                                 row["relative_to_sampling"].text(2) if row["relative_to_sampling"] else "no sample stage"]
                                for row in report.attribute_costs]))
    return "\n\n".join(parts)



# --------------------------------------------------------------------------- CSV


def _num(x: float) -> str:
    return "" if x is None or math.isnan(x) else repr(float(x))


CSV_HEADER = [
    "group", "method", "n_seeds", "seeds", "k",
    "pass@1_mean", "pass@1_ci_low", "pass@1_ci_high", "pass@1_before_mean",
    "delta_pass@1_mean", "delta_pass@1_ci_low", "delta_pass@1_ci_high",
    "pass@k_mean", "pass@k_ci_low", "pass@k_ci_high", "maj@k_mean", "maj@k_ci_low", "maj@k_ci_high",
    "seconds_mean", "generated_tokens_mean", "run_dirs",
]


def render_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for g in report.groups:
        writer.writerow([
            g.label, g.method, len(g.runs), " ".join(str(s) for s in g.seeds), g.k,
            _num(g.pass1.mean), _num(g.pass1.low), _num(g.pass1.high), _num(g.pass1_before.mean),
            _num(g.delta_pass1.mean), _num(g.delta_pass1.low), _num(g.delta_pass1.high),
            _num(g.pass_k.mean), _num(g.pass_k.low), _num(g.pass_k.high),
            _num(g.maj_k.mean), _num(g.maj_k.low), _num(g.maj_k.high),
            _num(g.seconds.mean), _num(g.generated_tokens.mean), " ".join(str(r.path) for r in g.runs),
        ])
    return buffer.getvalue()


def render_credit_quality_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["group", "source", "keys", "measure", "n_runs", "mean", "ci_low", "ci_high"])
    for row in report.credit_quality:
        keys, measures = report.credit_quality_columns[row["source"]]
        key_text = " ".join(f"{k}={row[k]}" for k in keys if k in row)
        for m in measures:
            if m in row:
                s = row[m]
                writer.writerow([row["group"], row["source"], key_text, m, s.n, _num(s.mean), _num(s.low), _num(s.high)])
    return buffer.getvalue()
