#!/usr/bin/env bash
# Setting A's credit, drawn after the verdicts (exploratory): RREDCoT's saved rollouts of its first seed at
# its last step (runs/rredcot-lr3e-05-seed0, step 60), rendered by `rredcot heatmap` from a copy under the
# ignored runs/ (the stage writes into its run.dir, and the committed run folder stays as it was; the
# figure's title names that folder). Run from the repository root. The stage's HTML page (each token's
# advantage) is generated output and stays in the copy, not committed.
set -euo pipefail
here=results/where-credit-pays/A/heatmap
work=runs/where-credit-pays-heatmap/A-rredcot-seed0-step60
rm -rf "$work" && mkdir -p "$(dirname "$work")"
cp -r results/where-credit-pays/A/runs/rredcot-lr3e-05-seed0/train/rollouts/step-000060 "$work"
python -m rredcot_cli heatmap run.dir="$work" method=rredcot model=tiny benchmark=chain \
  benchmark.min_steps=14 benchmark.max_steps=20 segment=newline
cp "$work/heatmap/rredcot/heatmap.png" "$here/rredcot-seed0-step60.png"
