"""Train (and measure) the embedded checkpoint shipped in ``rredcot_cli/assets/tiny-chain``.

    python scripts/train_embedded.py                  # train with the fixed recipe, measure, write README
    python scripts/train_embedded.py --measure-only   # re-measure the shipped checkpoint

Headroom for RL on purpose: the SFT solutions are noisy (each step miscomputed with probability
0.08, the chain carrying on from the wrong value), so the model samples (T=1) a wrong step now and
then and its sampled pass@1 falls with chain length, while greedy decoding stays near 100% on the
lengths it was trained on (2-20 steps). A first recipe with clean 2-8-step data instead gave a
length cliff (100% up to 8 steps, ~7% at 10-12, 0 beyond), which leaves GRPO groups on 9+-step
problems without any reward signal. Measurements: pass@1 per chain length with temperature-1
sampling (problems x samples) and greedy decoding, on the test split, through the same
``HFBackend`` the stages use; plus generation speed.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rredcot_cli.policy.base import SamplingParams  # noqa: E402
from rredcot_cli.policy.hf import HFBackend  # noqa: E402
from rredcot_cli.policy.load import encode_prompt  # noqa: E402
from rredcot_cli.benchmarks.synthetic import ChainBenchmark  # noqa: E402
from rredcot_cli.policy.models import count_parameters, load_model_and_tokenizer  # noqa: E402
from rredcot_cli.train.sft import train_sft  # noqa: E402
from rredcot_cli.config.schema import SFTConfig  # noqa: E402

DEFAULT_OUTPUT = ROOT / "rredcot_cli" / "assets" / "tiny-chain"
LENGTHS = [2, 4, 6, 8, 10, 12, 16, 20, 30, 40]


def max_new_tokens_for(steps: int) -> int:
    """Room for the gold chain of ``steps`` lines (6 chars each + the answer line) plus slack."""
    return 6 * steps + 40


def pass_at_1(model, tokenizer, bench: ChainBenchmark, num_problems: int, samples: int, temperature: float,
              seed: int = 0, batch_size: int = 64) -> dict:
    """Mean verified reward over ``num_problems`` test problems x ``samples`` completions."""
    backend = HFBackend(model, tokenizer, batch_size=batch_size)
    problems = bench.load("test", num_problems)
    params = SamplingParams(n=samples, max_new_tokens=max_new_tokens_for(bench.max_steps), temperature=temperature)
    groups = backend.generate([encode_prompt(tokenizer, bench.prompt(p), False) for p in problems], params, seed=seed)
    rewards = [bench.verify(c.text, p) for p, g in zip(problems, groups) for c in g]
    steps_ok = [bench.first_wrong_step(c.text, p) is None for p, g in zip(problems, groups) for c in g]
    return {"pass@1": sum(rewards) / len(rewards), "all_steps_right": sum(steps_ok) / len(steps_ok),
            "n": len(rewards)}


def make_eval_fn(data_seed: int):
    """Greedy accuracy on 64 test problems at 4-12 steps (the default RL setting), during SFT."""
    bench = ChainBenchmark(4, 12, data_seed=data_seed)

    def eval_fn(model, tokenizer, step):
        r = pass_at_1(model, tokenizer, bench, num_problems=64, samples=1, temperature=0.0)
        print(f"[eval] step {step}: greedy pass@1 (4-12 steps) {r['pass@1']:.3f}", file=sys.stderr, flush=True)
        return {"greedy_4_12": r["pass@1"]}

    return eval_fn


def generation_speed(model, tokenizer, seed: int = 0) -> dict:
    """Completions/s for 64 sampled completions of ~100-token chains (16 steps), batch 64."""
    bench = ChainBenchmark(16, 16)
    backend = HFBackend(model, tokenizer, batch_size=64)
    prompts = [encode_prompt(tokenizer, bench.prompt(p), False) for p in bench.load("test", 64)]
    params = SamplingParams(n=1, max_new_tokens=110, temperature=1.0)
    backend.generate(prompts[:8], params, seed=seed)  # warm-up
    start = time.perf_counter()
    out = backend.generate(prompts, params, seed=seed)
    seconds = time.perf_counter() - start
    tokens = sum(len(g[0].token_ids) for g in out)
    return {"completions_per_s": 64 / seconds, "tokens_per_s": tokens / seconds,
            "mean_completion_tokens": tokens / 64, "seconds": seconds}


def measure(path: Path, num_problems: int, samples: int, data_seed: int) -> dict:
    model, tokenizer = load_model_and_tokenizer(str(path))
    results: dict = {"num_parameters": count_parameters(model), "by_steps": {}}
    settings = [("4-12", ChainBenchmark(4, 12, data_seed))] + [(str(n), ChainBenchmark(n, n, data_seed)) for n in LENGTHS]
    for name, bench in settings:
        t0 = time.perf_counter()
        sampled = pass_at_1(model, tokenizer, bench, num_problems, samples, temperature=1.0)
        greedy = pass_at_1(model, tokenizer, bench, num_problems, 1, temperature=0.0)
        results["by_steps"][name] = {"sampled_T1": sampled["pass@1"], "greedy": greedy["pass@1"],
                                     "sampled_all_steps_right": sampled["all_steps_right"]}
        print(f"steps {name:>5}: pass@1 T=1 {sampled['pass@1']:.3f}  greedy {greedy['pass@1']:.3f}  "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)
    results["speed"] = generation_speed(model, tokenizer)
    print(f"speed: {results['speed']}", flush=True)
    return results


def write_readme(path: Path, command: str, kwargs: dict, train: dict | None, measured: dict,
                 num_problems: int, samples: int, note: str = "") -> None:
    rows = "\n".join(
        f"| {k} | {v['sampled_T1']:.3f} | {v['greedy']:.3f} |" for k, v in measured["by_steps"].items()
    )
    speed = measured["speed"]
    train_part = ""
    if train is not None:
        train_part = (
            f"- SFT wall time: {train['seconds']:.0f} s on {torch.get_num_threads()} CPU threads "
            f"({platform.processor() or platform.machine()}), final completion loss {train['loss']:.4f}\n"
        )
    text = f"""# tiny-chain: the embedded model

A {measured['num_parameters'] / 1e6:.2f}M-parameter Llama-architecture causal LM (hidden 128, 6 layers,
4 heads) with a character-level tokenizer, trained from scratch by `rredcot_cli.train.sft.train_sft` on
solutions of the synthetic `chain` benchmark (chained `+ - *` arithmetic mod 10, one `a<op>b=c`
line per step, then `Answer: x`). Loaded with `model.path=embedded` through the ordinary
`AutoModelForCausalLM` / `AutoTokenizer` path. Llama, not Qwen2: transformers 5 forces its
byte-level `Qwen2Tokenizer` on any `model_type: qwen2` folder.

Headroom for RL on purpose: in the SFT data each step is miscomputed with probability
`solution_error_rate` (the chain then carries on from the wrong value), so at temperature 1 the
model slips now and then, anywhere in the chain, and sampled pass@1 falls with chain length;
greedy decoding stays near 100% on the trained lengths (2-20 steps) and collapses beyond them.

## How it was made

```
{command}
```

then copied here (the script's defaults are this recipe, so `python scripts/train_embedded.py`
retrains it in place). `train_sft` keyword arguments:

```json
{json.dumps(kwargs, indent=2)}
```

{train_part}{note}
## Measured accuracy (test split)

pass@1 = mean verified reward; "T=1": {num_problems} problems x {samples} samples at temperature 1,
top-p 1; "greedy": the same {num_problems} problems, greedy. `max_new_tokens = 6 * steps + 40`.
"4-12" is the default benchmark setting (steps drawn uniformly in 4..12).

| chain steps | pass@1 (T=1) | greedy |
|---|---|---|
{rows}

Generation speed (HFBackend, batch 64, sampled T=1, 16-step chains, {speed['mean_completion_tokens']:.0f}
tokens per completion on average): {speed['completions_per_s']:.1f} completions/s,
{speed['tokens_per_s']:.0f} tokens/s.

Re-measure with `python scripts/train_embedded.py --measure-only` (results also in
`measurements.json`; the SFT loss curve is in `training.json`).
"""
    (path / "README.md").write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--min-steps", type=int, default=2, help="chain length of the SFT data (min)")
    ap.add_argument("--max-steps", type=int, default=20, help="chain length of the SFT data (max)")
    ap.add_argument("--error-rate", type=float, default=0.08,
                    help="probability that a step of an SFT solution is miscomputed (headroom for RL)")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--num-layers", type=int, default=6)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--intermediate-size", type=int, default=512)
    ap.add_argument("--max-position-embeddings", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--measure-problems", type=int, default=64)
    ap.add_argument("--measure-samples", type=int, default=8)
    ap.add_argument("--note", default="", help="a line for the README (e.g. about the machine)")
    args = ap.parse_args()

    command = "python " + " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    kwargs = dict(
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
        grad_clip=args.grad_clip, warmup_steps=args.warmup_steps, hidden_size=args.hidden_size,
        num_layers=args.num_layers, num_heads=args.num_heads, intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings, seed=args.seed,
        solution_error_rate=args.error_rate,
    )
    readme_kwargs = {"benchmark": f"ChainBenchmark(min_steps={args.min_steps}, max_steps={args.max_steps}, "
                                  f"data_seed={args.data_seed})", **kwargs}
    meta_path = args.output / "training.json"
    train = None
    if not args.measure_only:
        train = train_sft(
            SFTConfig(**{k: v for k, v in kwargs.items() if k != "seed"}),
            benchmark=ChainBenchmark(args.min_steps, args.max_steps, data_seed=args.data_seed),
            output_dir=args.output, seed=args.seed, eval_fn=make_eval_fn(args.data_seed), eval_every=args.eval_every,
        )
        for rec in train["history"]:
            if "greedy_4_12" in rec:
                print(f"step {rec['step']}: loss {rec['loss']:.4f} greedy(4-12) {rec['greedy_4_12']:.3f}")
        print(f"trained in {train['seconds']:.0f}s, loss {train['loss']:.4f}")
        meta_path.write_text(json.dumps({"command": command, "kwargs": readme_kwargs, "train": train}, indent=1))
    elif meta_path.exists():
        saved = json.loads(meta_path.read_text())
        command, readme_kwargs, train = saved["command"], saved["kwargs"], saved["train"]
    measured = measure(args.output, args.measure_problems, args.measure_samples, args.data_seed)
    (args.output / "measurements.json").write_text(json.dumps(measured, indent=1))
    note = f"- {args.note}\n" if args.note else ""
    write_readme(args.output, command, readme_kwargs, train, measured, args.measure_problems,
                 args.measure_samples, note)


if __name__ == "__main__":
    main()
