#!/usr/bin/env bash
# Setting A's credit, drawn after the verdicts (exploratory): RREDCoT's saved rollouts of its first seed at
# its last step (runs/rredcot-lr3e-05-seed0, step 60), rendered by `rredcot heatmap` from a copy (the stage
# writes into its run.dir, and the committed run folder stays as it was). Run from the repository root.
set -euo pipefail
here=results/where-credit-pays/A/heatmap
work=$(mktemp -d)
cp -r results/where-credit-pays/A/runs/rredcot-lr3e-05-seed0/train/rollouts/step-000060 "$work/step"
python -m rredcot_cli heatmap run.dir="$work/step" method=rredcot model=tiny benchmark=chain \
  benchmark.min_steps=14 benchmark.max_steps=20 segment=newline
cp "$work/step/heatmap/rredcot/heatmap.png" "$here/rredcot-seed0-step60.png"
cp "$work/step/heatmap/rredcot/heatmap.html" "$here/rredcot-seed0-step60.html"
rm -rf "$work"
