"""A setting's verdicts as the Markdown of section 3 of docs/studies/where-credit-pays.md (issue 39),
from the files its driver wrote and the committed runs, with every figure checked against them.

    python scripts/study_verdicts.py results/where-credit-pays A           # the Markdown, on stdout
    python scripts/study_verdicts.py results/where-credit-pays A --check   # and refuse unless it all recomputes

The driver (scripts/where_credit_pays.sh, at the setting's pinned commit) writes
``<setting>/verdict_mean_eval.json`` (the primary endpoint) and ``verdict_final.json`` (the
secondary) with bench/paired_seeds.py once every registered main run has finished. This script
writes nothing: it prints
- the primary comparison's one-line verdict, with its interval, sign-flip p, TOST p and the
  detectable effect the design achieved;
- every comparison of the two files (the secondary endpoint and any further arm exploratory, with no
  verdict of their own, as registered);
- per arm: its rate, runs, the held-out pass@1 before training, the mean-eval and final pass@1
  (mean and 95 % t interval over seeds) and its mean wall minutes per run;
- the runs listed in ``failed_runs.txt``, if any.

``--check`` first recomputes both verdict files with this checkout's bench/paired_seeds.py from the
committed run folders and refuses (one line, exit status 1) if a difference, interval, p-value or
verdict differs from the committed file, so the page's numbers are the committed runs' numbers.
Run it only once a setting's verdict files exist: before that, looking at its main runs is an
interim look the protocol forbids (section 1.7), and the script refuses to run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as scripts/train_embedded.py: rredcot_cli from this checkout

from rredcot_cli.metrics import mean_ci  # noqa: E402 - after the path above

ENDPOINT_FILES = {"mean-eval": "verdict_mean_eval.json", "final": "verdict_final.json"}
ENDPOINT_WORDS = {"mean-eval": "mean held-out pass@1 over the eval steps", "final": "final held-out pass@1"}
RUN = re.compile(r"^(?P<arm>.+?)-lr(?P<lr>[^-]+(?:-\d+)?)-seed(?P<seed>\d+)$")
# The statistics the check compares (rounded as bench/paired_seeds.py writes them).
CHECKED = ("pairs", "mean", "low", "high", "sd", "sign_flip_p", "tost_p", "mde", "verdict")


class VerdictError(ValueError):
    """A setting whose verdicts cannot be shown or do not recompute; the message names the fix."""


def paired_seeds():
    """bench/paired_seeds.py of this checkout as a module: the registered statistics, in one place."""
    path = ROOT / "bench" / "paired_seeds.py"
    spec = importlib.util.spec_from_file_location("paired_seeds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verdict_files(setting_dir: Path) -> dict[str, dict]:
    """Endpoint -> the driver's verdict JSON; both must exist (no interim looks)."""
    missing = [name for name in ENDPOINT_FILES.values() if not (setting_dir / name).is_file()]
    if missing:
        raise VerdictError(f"{setting_dir}: no {' or '.join(missing)} yet; its driver writes them once every "
                           "registered main run has finished (no interim looks): finish the runs first")
    return {endpoint: json.loads((setting_dir / name).read_text()) for endpoint, name in ENDPOINT_FILES.items()}


def check(setting_dir: Path, verdicts: dict[str, dict]) -> None:
    """Recompute each verdict file from the committed runs; a VerdictError names the first difference."""
    stats = paired_seeds()
    for endpoint, committed in verdicts.items():
        # The driver's command: the setting's runs folder, its methods, baseline and margin.
        argv = [str(setting_dir / "runs"), "--methods", *committed["methods"], "--baseline", committed["baseline"],
                "--endpoint", endpoint, "--margin", str(_margin(committed))]
        with contextlib.redirect_stdout(io.StringIO()):  # main() prints its JSON line; only the comparison matters
            again = stats.main(argv)
        for method, report in committed["methods"].items():
            recomputed = again["methods"][method]
            for key in CHECKED:
                if report["pooled"].get(key) != recomputed["pooled"].get(key):
                    raise VerdictError(f"{setting_dir / ENDPOINT_FILES[endpoint]}: {method} {key} is "
                                       f"{report['pooled'].get(key)!r} but the committed runs give "
                                       f"{recomputed['pooled'].get(key)!r}; recompute it with the driver's "
                                       "bench/paired_seeds.py command (scripts/where_credit_pays.sh)")
            diffs = [d for f in report["folders"].values() for d in f["diffs"].items()]
            diffs_again = [(str(s), d) for f in recomputed["folders"].values() for s, d in f["diffs"].items()]
            if sorted(diffs) != sorted(diffs_again):
                raise VerdictError(f"{setting_dir / ENDPOINT_FILES[endpoint]}: the per-seed differences of {method} "
                                   "differ from the committed runs'; recompute it with the driver's command")


def _margin(report: dict) -> float:
    margins = {m["pooled"].get("margin") for m in report["methods"].values()}
    if len(margins) != 1 or None in margins:
        raise VerdictError(f"the verdict file's comparisons name no single margin ({margins}); rewrite it with "
                           "bench/paired_seeds.py --margin")
    return margins.pop()


def arm_table(runs_dir: Path) -> list[dict]:
    """Per arm (its runs under ``runs_dir``): rate, runs, pass@1 before training, the two endpoints'
    means with 95 % t intervals over seeds, and the mean wall minutes per run."""
    stats = paired_seeds()
    endpoints = {name: fn(runs_dir) for name, fn in stats.ENDPOINTS.items()}
    arms: dict[str, dict] = {}
    for summary_path in sorted(runs_dir.glob("*/train/summary.json")):
        match = RUN.match(summary_path.parent.parent.name)
        if not match:
            continue
        summary = json.loads(summary_path.read_text())
        arm = arms.setdefault(match["arm"], {"arm": match["arm"], "lrs": set(), "seeds": [], "before": [],
                                             "minutes": []})
        arm["lrs"].add(match["lr"])
        arm["seeds"].append(int(match["seed"]))
        arm["before"].append(summary["eval_before"]["pass@1"])
        arm["minutes"].append(summary["seconds"] / 60)
    rows = []
    for name, arm in sorted(arms.items()):
        row = {"arm": name, "lr": ", ".join(sorted(arm["lrs"])), "runs": len(arm["seeds"]),
               "before": mean_ci(arm["before"])[0], "minutes": sum(arm["minutes"]) / len(arm["minutes"])}
        for endpoint, values in endpoints.items():
            row[endpoint] = mean_ci([values[(name, s)] for s in arm["seeds"]])
        rows.append(row)
    return rows


def _ci(mean: float, low: float, high: float) -> str:
    if math.isnan(low):
        return f"{mean:.3f}"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-4 else "< 0.0001"


def markdown(setting: str, setting_dir: Path, verdicts: dict[str, dict], primary: str) -> str:
    """Section 3's part for one setting."""
    lines = [f"### Setting {setting}", ""]
    head = verdicts["mean-eval"]
    baseline = head["baseline"]
    if primary not in head["methods"]:
        raise VerdictError(f"{setting_dir / ENDPOINT_FILES['mean-eval']} has no {primary} comparison; the "
                           "protocol's primary_comparison must be among its --methods")
    p = head["methods"][primary]["pooled"]
    lines += [f"**Verdict ({primary} - {baseline}, {ENDPOINT_WORDS['mean-eval']}): {p['verdict']}.** "
              f"{p['pairs']} pairs, mean difference {_signed(p['mean'])}, 95 % interval "
              f"[{_signed(p['low'])}, {_signed(p['high'])}], exact sign-flip p = {_p(p['sign_flip_p'])}, "
              f"TOST p = {_p(p['tost_p'])} at +-{p['margin']:g}; the design detects "
              f"{p['mde']:.3f} with 80 % power (SD of the differences {p['sd']:.3f}).", ""]
    lines += ["| comparison | endpoint | role | pairs | mean difference [95 % CI] | SD | sign-flip p | TOST p | "
              "detectable effect | verdict |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for endpoint in ("mean-eval", "final"):
        for method, report in verdicts[endpoint]["methods"].items():
            q = report["pooled"]
            role = "primary" if (endpoint, method) == ("mean-eval", primary) else "exploratory"
            lines.append(f"| {method} - {baseline} | {endpoint} | {role} | {q['pairs']} | "
                         f"{_signed(q['mean'])} [{_signed(q['low'])}, {_signed(q['high'])}] | {q['sd']:.3f} | "
                         f"{_p(q['sign_flip_p'])} | {_p(q['tost_p'])} | {q['mde']:.3f} | "
                         f"{q['verdict'] if role == 'primary' else 'none (exploratory)'} |")
    lines += ["", "Only the primary comparison carries a verdict (section 1.6); the per-seed differences are in "
              f"`{setting_dir}/{ENDPOINT_FILES['mean-eval']}` and `{ENDPOINT_FILES['final']}`.", "",
              f"Per arm (mean over its runs; 95 % t interval over seeds), from `{setting_dir}/runs`:", "",
              "| arm | rate | runs | pass@1 before training | mean-eval pass@1 | final pass@1 | wall minutes per run |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in arm_table(setting_dir / "runs"):
        lines.append(f"| {row['arm']} | {row['lr']} | {row['runs']} | {row['before']:.3f} | {_ci(*row['mean-eval'])} | "
                     f"{_ci(*row['final'])} | {row['minutes']:.1f} |")
    failed = setting_dir / "failed_runs.txt"
    if failed.is_file() and failed.read_text().strip():
        lines += ["", "Runs that failed (`failed_runs.txt`):", ""]
        lines += [f"- {line}" for line in failed.read_text().splitlines() if line.strip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="the study's results folder, e.g. results/where-credit-pays")
    parser.add_argument("setting", help="a setting of its protocol.json, e.g. A")
    parser.add_argument("--check", action="store_true",
                        help="recompute both verdict files from the committed runs and refuse on any difference")
    args = parser.parse_args(argv)
    protocol = json.loads((args.study / "protocol.json").read_text())
    setting_dir = args.study / args.setting
    try:
        if args.setting not in protocol.get("settings", {}):
            raise VerdictError(f"{args.study / 'protocol.json'} registers no setting {args.setting!r}; pick from "
                               f"{', '.join(protocol.get('settings', {}))}")
        verdicts = verdict_files(setting_dir)
        if args.check:
            check(setting_dir, verdicts)
        text = markdown(args.setting, setting_dir, verdicts, protocol["statistics"]["primary_comparison"])
    except VerdictError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
