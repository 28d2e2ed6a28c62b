"""`rredcot judge`: correlation, localisation and spread helpers on hand-computed tensors, the
first wrong step of constructed chain completions, then the command end to end on a real tiny
run dir (sample -> segment -> judge) and `rredcot report` picking its table up."""

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from rredcot_cli.store import artifacts
from rredcot_cli.cli import app
from rredcot_cli.report.judge import (
    advantage_spread,
    agreement,
    average_ranks,
    constant_within_completions,
    first_error_segments,
    localisation,
    pearson,
    problem_of,
    spearman,
    token_at_char,
    token_at_completion_char,
    control_values,
)

runner = CliRunner()
NAN = float("nan")
SMALL = ["benchmark.min_steps=2", "benchmark.max_steps=4", "sample.num_prompts=2", "sampling.n=4",
         "sampling.max_new_tokens=48"]
JUDGE = ["judge.methods=[grpo,rredcot,loo,mc]", "+judge.params.rredcot.value=answer_probe",
         "+judge.params.mc.k=2", "+judge.params.mc.max_new_tokens=48", "judge.reference_k=2", "judge.reruns=2"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# --------------------------------------------------------------------------- correlation


def test_average_ranks_share_ties():
    assert average_ranks(torch.tensor([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert average_ranks(torch.tensor([1.0, 1.0, 1.0])).tolist() == [2.0, 2.0, 2.0]
    assert average_ranks(torch.tensor([3.0, -1.0, 2.0])).tolist() == [3.0, 1.0, 2.0]


def test_pearson_and_spearman_hand_computed():
    # x = 1 2 3, y = 2 4 7: sxy = 5, sxx = 2, syy = 114/9 -> r = 15 / sqrt(228).
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0])) == pytest.approx(15 / math.sqrt(228))
    # No ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)) = 1 - 12/60.
    assert spearman(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)
    # Ties: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): sxy = 4.5, sxx = 4.5, syy = 5 -> sqrt(0.9).
    assert spearman(torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])) == pytest.approx(math.sqrt(0.9))
    # A monotone transform keeps Spearman at 1 (-1 when reversed) but not Pearson.
    x = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert spearman(x, x**3) == pytest.approx(1.0) and pearson(x, x**3) < 0.99
    assert spearman(x, -x**3) == pytest.approx(-1.0)
    # Undefined: a constant side, or fewer than two pairs.
    assert pearson(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 2.0, 3.0])) is None
    assert spearman(torch.tensor([0.5]), torch.tensor([0.5])) is None
    with pytest.raises(ValueError):
        pearson(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0]))


def test_correlations_match_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (40,), generator=g).to(torch.float32)  # many ties
    y = x + torch.randn(40, generator=g)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x.numpy(), y.numpy()).statistic, abs=1e-6)


REFERENCE = torch.tensor([[0.5, 0.25, 0.75, 1.0], [0.5, 0.125, 0.0, NAN]])  # V(S_0..S_K), K = 3 and 2
NUM_SEGMENTS = torch.tensor([3, 2])
REFERENCE_CREDITS = torch.tensor([[-0.25, 0.5, 0.25], [-0.375, -0.125, NAN]])


def test_agreement_of_the_reference_with_itself_is_one():
    values = torch.tensor([[0.25, 0.75, 1.0], [0.125, 0.0, NAN]])
    result = agreement(values, REFERENCE_CREDITS, REFERENCE, NUM_SEGMENTS)
    assert result == pytest.approx({k: 0.0 if k == "value_mse_inner" else 1.0 for k in result})


def test_agreement_hand_computed_all_and_inner_segments():
    # Method values (existing segments) 0.75 0.25 1.0 | 0.5 0.0 against the reference's
    # 0.25 0.75 1.0 | 0.125 0.0: ranks (4 2 5 3 1) vs (3 4 5 2 1), sum d^2 = 6 -> rho = 1 - 36/120.
    values = torch.tensor([[0.75, 0.25, 1.0], [0.5, 0.0, NAN]])
    credits = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, NAN]])  # constant per completion
    result = agreement(values, credits, REFERENCE, NUM_SEGMENTS)
    assert result["value_spearman"] == pytest.approx(0.7)
    # Without each last segment (the reward): pairs (0.75, 0.25), (0.25, 0.75), (0.5, 0.125):
    # ranks (3 1 2) vs (2 3 1) -> -1 / 2.
    assert result["value_spearman_inner"] == pytest.approx(-0.5)
    # Squared differences there: 0.5^2, 0.5^2, 0.375^2 -> (0.25 + 0.25 + 0.140625) / 3.
    assert result["value_mse_inner"] == pytest.approx(0.640625 / 3)
    # Credits 0.5 0.5 0.5 -1 -1 vs -0.25 0.5 0.25 -0.375 -0.125: ranks (4 4 4 1.5 1.5) vs (2 5 4 1 3),
    # both with mean 3: dx = (1 1 1 -1.5 -1.5), dy = (-1 2 1 -2 0): sxy = 5, sxx = 7.5, syy = 10.
    assert result["credit_spearman"] == pytest.approx(5 / math.sqrt(75))
    # An outcome-only method has no values: those correlations are undefined, not 0.
    none = agreement(torch.full((2, 3), NAN), credits, REFERENCE, NUM_SEGMENTS)
    assert none["value_spearman"] is None and none["value_pearson_inner"] is None and none["value_mse_inner"] is None
    assert none["credit_spearman"] == pytest.approx(result["credit_spearman"])


def test_agreement_within_one_reward_hand_computed():
    """Completion 0 (reward 1) holds the inner pairs (0.75, 0.25), (0.25, 0.75); completion 1 (reward
    0) one pair (0.5, 0.125). Within reward 1: ranks (2 1) vs (1 2) -> -1, 2 pairs; reward 0 has a
    single pair and drops out: -1. Credits within reward 1: 0.5 0.5 0.5 (constant) vs -0.25 0.5 0.25
    -> counts 0; within reward 0: -1 -1 (constant) -> 0; so 0."""
    values = torch.tensor([[0.75, 0.25, 1.0], [0.5, 0.0, NAN]])
    credits = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, NAN]])
    result = agreement(values, credits, REFERENCE, NUM_SEGMENTS, torch.tensor([1.0, 0.0]))
    assert result["value_spearman_within"] == pytest.approx(-1.0)
    assert result["credit_spearman_within"] == 0.0
    # Segment advantages 1 2 3 | -1 -2 against the reference credits -0.25 0.5 0.25 | -0.375 -0.125:
    # ranks (3 4 5 2 1) vs (2 5 4 1 3) over all (sum d^2 = 1+1+1+1+4 = 8 -> 1 - 48/120 = 0.6); within
    # reward 1: (1 2 3) vs (1 3 2) -> 0.5, 3 pairs; reward 0: (2 1) vs (1 2) -> -1, 2 pairs:
    # (3 * 0.5 - 2) / 5 = -0.1.
    advantages = torch.tensor([[1.0, 2.0, 3.0], [-1.0, -2.0, NAN]])
    pushed = agreement(values, credits, REFERENCE, NUM_SEGMENTS, torch.tensor([1.0, 0.0]), advantages)
    assert pushed["advantage_spearman"] == pytest.approx(0.6)
    assert pushed["advantage_spearman_within"] == pytest.approx(-0.1)
    # The same reward everywhere: one stratum, so the inner correlation (-1/2) again.
    same = agreement(values, credits, REFERENCE, NUM_SEGMENTS, torch.tensor([1.0, 1.0]))
    assert same["value_spearman_within"] == pytest.approx(-0.5)


def test_controls_hand_computed():
    """Two groups: rewards (1, 0) with 3 and 2 segments, and (1,) with 1 segment. ``outcome``
    copies the reward into every inner value, ``baseline`` keeps the group mean (0.5 and 1)."""
    rewards, groups, K = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), torch.tensor([3, 2, 1])
    values, credits = control_values("outcome", rewards, groups, K)
    assert values.tolist()[0] == [1.0, 1.0, 1.0] and values[1, :2].tolist() == [0.0, 0.0]
    assert credits.tolist()[0] == [0.5, 0.0, 0.0] and credits[1, :2].tolist() == [-0.5, 0.0]
    assert credits[2, 0].item() == 0.0 and math.isnan(values[2, 1].item())
    values, credits = control_values("baseline", rewards, groups, K)
    assert values.tolist()[0] == [0.5, 0.5, 1.0] and values[1, :2].tolist() == [0.5, 0.0]
    assert credits.tolist()[0] == [0.0, 0.0, 0.5] and credits[1, :2].tolist() == [0.0, -0.5]
    # The outcome copy ranks nothing within a reward: every inner value of a stratum is the reward.
    result = agreement(*control_values("outcome", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), NUM_SEGMENTS),
                       REFERENCE, NUM_SEGMENTS, torch.tensor([1.0, 0.0]))
    assert result["value_spearman_within"] == 0.0
    # Its inner MSE: (1 - 0.25)^2, (1 - 0.75)^2, (0 - 0.125)^2 over 3 boundaries.
    assert result["value_mse_inner"] == pytest.approx((0.5625 + 0.0625 + 0.015625) / 3)
    with pytest.raises(ValueError, match="unknown control"):
        control_values("oracle", rewards, groups, K)


def test_constant_credit_is_detected():
    assert constant_within_completions(torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, NAN]]), NUM_SEGMENTS)
    assert not constant_within_completions(REFERENCE_CREDITS, NUM_SEGMENTS)


def test_advantage_spread_hand_computed():
    mask = torch.tensor([[True, True, False]])
    runs = [torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[3.0, 3.0, 0.0]])]
    # Token 0: std of (1, 3) = sqrt(2); token 1: 0; padding ignored.
    assert advantage_spread(runs, mask) == pytest.approx(math.sqrt(2) / 2)
    assert advantage_spread(runs[:1], mask) is None
    assert advantage_spread([runs[0], runs[0].clone()], mask) == 0.0


# --------------------------------------------------------------------------- localisation


def test_localisation_hand_computed():
    credits = torch.tensor([
        [0.1, -0.5, 0.2, NAN],  # lowest at the target: hit
        [-0.3, -0.3, 0.0, NAN],  # tied lowest: no hit
        [0.0, 0.0, NAN, NAN],  # nothing negative: no hit
        [0.2, -0.1, -0.4, NAN],  # lowest elsewhere: miss
        [-1.0, 0.0, NAN, NAN],  # correct completion (no target): not counted
    ])
    num_segments = torch.tensor([3, 3, 2, 3, 2])
    hits, total, chance = localisation(credits, num_segments, [1, 0, 0, 1, None])
    assert (hits, total) == (1, 4)
    assert chance == pytest.approx(1 / 3 + 1 / 3 + 1 / 2 + 1 / 3)


def test_grpo_like_credit_never_localises():
    from rredcot_cli.methods.base import CreditBatch, broadcast_sequence_advantage

    ids = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, -1, -1]])
    batch = CreditBatch(rewards=torch.tensor([0.0, 0.0]), group_ids=torch.tensor([0, 0]), segment_ids=ids,
                        num_segments=torch.tensor([3, 2]))
    credit = broadcast_sequence_advantage(torch.tensor([-1.0, -2.0]), batch)
    assert localisation(credit.segment_credits, batch.num_segments, [0, 1]) == (0, 2, pytest.approx(1 / 3 + 1 / 2))


def test_token_at_char():
    texts = ["ab", "c", "", "de"]
    assert [token_at_char(texts, c) for c in range(6)] == [0, 0, 1, 3, 3, 3]


def test_first_error_token_is_exact_on_byte_level_bpe():
    """A byte-level BPE that never saw '÷' or '×' splits each over two byte tokens, and each of
    those decodes on its own to a replacement character: summing per-token lengths counts every
    such character twice and shifts the later offsets (the old mapping blamed the wrong token,
    then the wrong segment). Offsets decoded cumulatively land on the token that holds the step."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["12 - 3 = 9\n", "4 + 5 = 9\n", "Answer: 9"], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
    text = "12 ÷ 3 = 4\n4 × 5 = 20\n20 - 3 = 17\nAnswer: 17"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    pieces = [tokenizer.decode([t]) for t in ids]
    assert sum("\ufffd" in p for p in pieces) >= 4  # ÷ and × each split over two byte tokens
    third_step = text.index("20 - 3")
    token = token_at_completion_char(tokenizer, ids, third_step)
    assert tokenizer.decode(ids[token:]).startswith("20 - 3")
    assert tokenizer.decode(ids[:token]) == text[:third_step]
    # Per-token texts put the step earlier: two replacement characters per split symbol.
    assert token_at_char(pieces, third_step) < token

    class ThirdStepWrong:  # a step-checked benchmark whose chains go wrong at step index 2
        def first_wrong_step(self, completion, problem):
            return 2

        def step_char_spans(self, completion):
            starts = [0] + [i + 1 for i, c in enumerate(completion) if c == "\n"]
            return [(a, completion.find("\n", a) if "\n" in completion[a:] else len(completion)) for a in starts][:3]

    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    segment_ids, k = [], 0
    for t in ids:  # one segment per line, the newline closing its line
        segment_ids.append(k)
        k += t == newline
    sample = {"completion": text, "completion_token_ids": ids, "reward": 0.0}
    targets = first_error_segments([sample], torch.tensor([segment_ids]), ThirdStepWrong(), [None], tokenizer)
    assert targets == [2]  # per-token offsets named segment 1


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rredcot_cli.policy.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


def test_first_error_segment_of_constructed_chains(tokenizer):
    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.pipeline import credit_batch, segment_rows
    from rredcot_cli.config.schema import SegmentConfig

    bench = make_benchmark("chain", min_steps=4, max_steps=4)
    problem = bench.load("test", 1)[0]
    gold = bench.solution(problem)
    lines = gold.split("\n")  # 4 step lines, then "Answer: x"
    head, result = lines[1].rsplit("=", 1)
    wrong_line = f"{head}={(int(result) + 1) % 10}"
    completions = {
        "correct": (gold, 1.0),
        "third line wrong": ("\n".join(lines[:1] + [wrong_line] + lines[2:]), 0.0),  # error in step 2 (index 1)
        "first line wrong": ("\n".join([lines[0][:-1] + str((int(lines[0][-1]) + 1) % 10)] + lines[1:]), 0.0),
        "steps right, answer missing": ("\n".join(lines[:4]), 0.0),
    }
    samples = []
    for i, (text, reward) in enumerate(completions.values()):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        samples.append({"prompt_id": problem.prompt_id, "sample_idx": i, "prompt": bench.prompt(problem),
                        "prompt_token_ids": [1], "completion": text, "completion_token_ids": ids,
                        "completion_logprobs": [0.0] * len(ids), "reward": reward, "gold_answer": problem.gold_answer,
                        "pred_answer": bench.extract_answer(text), "benchmark": "chain",
                        "meta": json.dumps(problem.meta)})
    segments = segment_rows(samples, tokenizer, SegmentConfig(name="newline", tokens=32, min_tokens=1,
                            max_segments=40))
    batch = credit_batch(samples, segments)
    assert batch.num_segments.tolist() == [5, 5, 5, 4]  # one segment per line
    assert problem_of(samples[0]).meta == problem.meta
    targets = first_error_segments(samples, batch.segment_ids, bench, [problem_of(s) for s in samples], tokenizer)
    assert targets == [None, 1, 0, None]


# --------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    run = tmp_path_factory.mktemp("judge") / "run"
    for stage in ["sample", "segment"]:
        result = invoke(stage, f"run.dir={run}", *SMALL)
        assert result.exit_code == 0, result.output
    result = invoke("judge", f"run.dir={run}", *SMALL, *JUDGE)
    assert result.exit_code == 0, result.output
    return run, result


MEASURES_THAT_ARE_NOT_TIMES = ["method", "credit_constant", "value_spearman", "value_pearson", "value_spearman_inner",
                               "value_pearson_inner", "credit_spearman", "credit_pearson", "value_spearman_within",
                               "credit_spearman_within", "advantage_spearman", "advantage_spearman_within",
                               "value_coverage", "value_mse_inner", "first_error_rate",
                               "first_error_chance", "first_error_completions", "advantage_std", "forward_tokens",
                               "generated_tokens", "backward_tokens"]


def test_judge_writes_one_row_per_method(judged):
    run, result = judged
    table = artifacts.read_artifact("credit_quality", run / "judge" / "credit_quality.parquet")
    assert table.schema.equals(artifacts.ARTIFACTS["credit_quality"].schema)
    rows = {r["method"]: r for r in table.to_pylist()}
    assert list(rows) == ["grpo", "rredcot", "loo", "mc", "control:outcome", "control:baseline"]
    controls = {name: rows.pop(f"control:{name}") for name in ("outcome", "baseline")}
    samples = artifacts.read_artifact("samples", run / "sample" / "samples.parquet").to_pylist()
    # The controls: the outcome copy ranks nothing within one reward; both cost nothing.
    assert controls["outcome"]["value_spearman_within"] == 0.0
    for control in controls.values():
        assert control["seconds"] == 0.0 and control["forward_tokens"] == 0 and control["value_spearman"] is not None
    assert rows["rredcot"]["value_coverage"] is not None and 0 <= rows["rredcot"]["value_coverage"] <= 1
    incorrect = sum(s["reward"] <= 0.5 for s in samples)

    grpo = rows["grpo"]
    assert grpo["credit_constant"] and grpo["value_spearman"] is None and grpo["value_pearson_inner"] is None
    assert grpo["forward_tokens"] == grpo["generated_tokens"] == 0
    for name in ["rredcot", "mc"]:
        assert rows[name]["value_spearman"] is not None and -1 <= rows[name]["value_spearman"] <= 1
        assert not rows[name]["credit_constant"]
    assert rows["loo"]["value_spearman"] is None and rows["loo"]["forward_tokens"] > 0
    assert rows["mc"]["generated_tokens"] > 0 and rows["rredcot"]["generated_tokens"] == 0
    for row in rows.values():
        assert 0 <= row["first_error_completions"] <= incorrect
        if row["first_error_completions"]:
            assert 0 < row["first_error_chance"] <= 1 and 0 <= row["first_error_rate"] <= 1
        assert row["seconds"] >= 0 and row["seconds_vs_sample"] is not None
    assert grpo["first_error_completions"] > 0  # this seed samples incorrect chains with a wrong step
    assert grpo["first_error_rate"] == 0.0  # constant credit cannot localise
    # Deterministic methods give the same advantages on every rerun; mc samples anew per seed.
    for name in ["grpo", "rredcot", "loo"]:
        assert rows[name]["advantage_std"] == 0.0
    assert rows["mc"]["advantage_std"] > 0

    manifest = json.loads((run / "judge" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["extra"]["reference"]["k"] == 2
    assert manifest["extra"]["methods"]["rredcot"]["value"] == "answer_probe"
    assert manifest["extra"]["methods"]["mc"]["k"] == 2
    assert len(set(manifest["extra"]["rerun_seeds"])) == 2
    assert "rredcot judge" in result.output and "mc" in result.output  # the rich table


def test_judge_is_deterministic_and_skips_when_up_to_date(judged, tmp_path):
    run, _ = judged
    again = invoke("judge", f"run.dir={run}", *SMALL, *JUDGE)
    assert again.exit_code == 0 and "up to date" in again.output

    copy = tmp_path / "copy"
    for stage in ["sample", "segment"]:
        shutil.copytree(run / stage, copy / stage)
    result = invoke("judge", f"run.dir={copy}", *SMALL, *JUDGE)
    assert result.exit_code == 0, result.output
    read = lambda r: artifacts.read_artifact("credit_quality", r / "judge" / "credit_quality.parquet").select(
        MEASURES_THAT_ARE_NOT_TIMES).to_pylist()
    assert read(copy) == read(run)

    other = tmp_path / "other-seed"
    for stage in ["sample", "segment"]:
        shutil.copytree(run / stage, other / stage)
    result = invoke("judge", f"run.dir={other}", "seed=1", *SMALL, *JUDGE)
    assert result.exit_code == 0, result.output
    # Another seed: another reference and other mc continuations, so mc's numbers move.
    mc = lambda r: [row for row in read(r) if row["method"] == "mc"][0]
    assert mc(other) != mc(run)


def test_judge_keeps_the_reference_and_reuses_it(judged, tmp_path):
    """Judging other methods on the same traces (another tag, another batch split) reads the kept
    MC reference instead of sampling it again, and gives the same agreement numbers."""
    run, _ = judged
    kept = list((run / "mc-reference").glob("*.parquet"))
    assert len(kept) == 1 and kept[0].with_suffix(".json").is_file()
    first = json.loads((run / "judge" / "manifest.json").read_text())["extra"]["reference"]
    assert first["reused"] is False and first["path"] == str(kept[0]) and first["generated_tokens"] > 0
    values = artifacts.read_artifact("reference_values", kept[0]).to_pylist()
    assert len(values) == 8 and all(0.0 <= v <= 1.0 for row in values for v in row["values"])

    result = invoke("judge", f"run.dir={run}", *SMALL, "judge.methods=[grpo]", "judge.reference_k=2",
                    "judge.reruns=2", "run.tag=more")
    assert result.exit_code == 0, result.output
    again = json.loads((run / "judge-more" / "manifest.json").read_text())["extra"]["reference"]
    assert again["reused"] is True and again["generated_tokens"] == first["generated_tokens"]
    grpo = lambda folder: [r for r in artifacts.read_artifact("credit_quality", run / folder / "credit_quality.parquet")
                           .select(MEASURES_THAT_ARE_NOT_TIMES).to_pylist() if r["method"] == "grpo"]
    assert grpo("judge-more") == grpo("judge")

    # A kept reference that does not fit the segments is refused with the way out, not used.
    broken = tmp_path / "broken"
    for stage in ["sample", "segment", "mc-reference"]:
        shutil.copytree(run / stage, broken / stage)
    path = next((broken / "mc-reference").glob("*.parquet"))
    artifacts.write_artifact("reference_values", [{**values[0], "values": values[0]["values"][:-1]}, *values[1:]], path)
    result = invoke("judge", f"run.dir={broken}", *SMALL, "judge.methods=[grpo]", "judge.reference_k=2", "judge.reruns=2")
    assert result.exit_code != 0 and "delete it to sample the reference again" in result.output


def test_report_picks_up_the_judge_table(judged, tmp_path):
    import csv

    from test_report import EVAL_ROWS, write_run

    run, _ = judged
    report_run = tmp_path / "run"
    shutil.copytree(run, report_run)
    write_run(report_run, "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS)  # `report` groups finished train stages
    out = tmp_path / "out"
    result = invoke("report", report_run, "--out", out)
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    assert "From `judge/credit_quality.parquet`" in md
    table = artifacts.read_artifact("credit_quality", run / "judge" / "credit_quality.parquet").to_pylist()
    rows = {(r["keys"], r["measure"]): r for r in csv.DictReader((out / "credit_quality.csv").open())}
    for row in table:
        shown = rows[(f"method={row['method']}", "credit_spearman")]
        assert float(shown["mean"]) == pytest.approx(row["credit_spearman"])
    assert ("method=grpo", "value_spearman") not in rows  # null, not averaged into a number


def test_judge_batches_give_one_row_per_method_and_batch_and_intervals(judged, tmp_path):
    """judge.batches=2 on the 2 saved prompts: batch b is judged exactly as a run holding only
    prompt b would be (same reference and rerun seeds), and the table shows mean ± interval."""
    from rredcot_cli.stages.judge import batch_summary

    run, _ = judged
    copy = tmp_path / "copy"
    for stage in ["sample", "segment"]:
        shutil.copytree(run / stage, copy / stage)
    result = invoke("judge", f"run.dir={copy}", *SMALL, *JUDGE, "judge.batches=2")
    assert result.exit_code == 0, result.output
    rows = artifacts.read_artifact("credit_quality", copy / "judge" / "credit_quality.parquet").to_pylist()
    judged_and_controls = ["grpo", "rredcot", "loo", "mc", "control:outcome", "control:baseline"]
    assert [(r["method"], r["batch"]) for r in rows] == [(m, b) for b in (0, 1) for m in judged_and_controls]
    assert "± " in result.output and "over batches" in result.output
    summary = batch_summary(rows)
    for method in ["rredcot", "mc"]:
        values = [r["credit_spearman"] for r in rows if r["method"] == method]
        mean, low, high, n = summary[method]["credit_spearman"]
        assert n == 2 and mean == pytest.approx(sum(values) / 2) and low <= mean <= high
    manifest = json.loads((copy / "judge" / "manifest.json").read_text())
    assert manifest["extra"]["batches"] == 2 and sum(manifest["extra"]["batch_completions"]) == 8

    # Batch 1 equals judging a run dir that holds only its prompt.
    alone = tmp_path / "alone"
    samples = artifacts.read_artifact("samples", run / "sample" / "samples.parquet").to_pylist()
    second = samples[-1]["prompt_id"]
    for stage, kind, name in [("sample", "samples", "samples.parquet"), ("segment", "segments", "segments.parquet")]:
        table = artifacts.read_artifact(kind, run / stage / name).to_pylist()
        artifacts.write_artifact(kind, [r for r in table if r["prompt_id"] == second], alone / stage / name)
    result = invoke("judge", f"run.dir={alone}", *SMALL, *JUDGE)
    assert result.exit_code == 0, result.output
    single = artifacts.read_artifact("credit_quality", alone / "judge" / "credit_quality.parquet").to_pylist()
    keep = [c for c in MEASURES_THAT_ARE_NOT_TIMES if c != "method"]
    for row in single:
        batched = next(r for r in rows if r["method"] == row["method"] and r["batch"] == 1)
        assert {c: batched[c] for c in keep} == {c: row[c] for c in keep}, row["method"]


def test_more_batches_than_prompts_is_one_line(judged, tmp_path):
    run, _ = judged
    for stage in ["sample", "segment"]:
        shutil.copytree(run / stage, tmp_path / stage)
    result = invoke("judge", f"run.dir={tmp_path}", *SMALL, *JUDGE, "judge.batches=3")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "judge.batches=3: the saved samples hold 2 prompts" in result.stderr


# --------------------------------------------------------------------------- errors


def test_run_dir_without_samples_is_one_line(tmp_path):
    result = invoke("judge", f"run.dir={tmp_path}")
    assert result.exit_code == 2
    assert result.stderr == (f"error: no samples.parquet in {tmp_path}/sample: run `rredcot sample "
                             f"run.dir={tmp_path}` first, or pass inputs.samples=PATH\n")


def test_run_dir_without_segments_names_the_segment_command(judged, tmp_path):
    run, _ = judged
    shutil.copytree(run / "sample", tmp_path / "sample")
    result = invoke("judge", f"run.dir={tmp_path}", *SMALL)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"no segments.parquet in {tmp_path}/segment" in result.stderr
    assert f"rredcot segment run.dir={tmp_path}" in result.stderr


@pytest.mark.parametrize("overrides, message", [
    (["judge.methods=[grpo,nonesuch]"], "unknown method(s) in judge.methods: nonesuch; valid: cort, cscr, dapo"),
    (["method=rredcot"], "'method=rredcot': rredcot judge does not use method=; choose methods with judge.methods"),
    (["judge.methods=[grpo]", "+judge.params.rredcot.value=answer_probe"],
     "judge.params names method(s) not being judged: rredcot"),
    (["judge.methods=[rredcot]", "+judge.params.rredcot.valu=answer_probe"],
     "unknown key 'judge.params.rredcot.valu' for method 'rredcot'; valid keys: value, advantage"),
    (["judge.methods=[mc]", "+judge.params.mc.k=many"], "judge.params.mc.k=many: "),
    (["judge.reruns=0"], "judge.reruns=0: must be >= 1"),
    (["judge.batches=0"], "judge.batches=0: must be >= 1"),
    (["judge.methods=[mc]", "+judge.params.mc.k=0"], "judge.params.mc.k=0: must be >= 1"),
])
def test_option_mistakes_are_one_line(tmp_path, overrides, message):
    result = invoke("judge", f"run.dir={tmp_path}", *overrides)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "judge").exists()
