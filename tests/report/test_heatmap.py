"""`rredcot heatmap`: selection, the self-contained HTML page, the PNG, and the stage end to end.

Everything runs on hand-made rows (a character-level "tokenizer": token id = code point), so no
model or tokenizer is loaded.
"""

import html
import json

import pytest
from typer.testing import CliRunner

from rredcot_cli.store import artifacts
from rredcot_cli.benchmarks.synthetic import ChainBenchmark
from rredcot_cli.cli import app
from rredcot_cli.report.heatmap_cards import SelectionError, align_token_spans, build_cards, select_samples
from rredcot_cli.report.heatmap_colors import diverging_color
from rredcot_cli.report.heatmap_html import render_html
from rredcot_cli.report.heatmap_png import render_png

BENCH = ChainBenchmark(min_steps=3, max_steps=3, data_seed=7)
PROBLEMS = BENCH.load("test", limit=2)


def _wrong_completion(problem, wrong_at):
    """The gold chain with step ``wrong_at`` replaced by a wrong line holding HTML specials."""
    lines = BENCH.gold_lines(problem)
    lines[wrong_at] = "9<b>&\"x'=?"
    return "".join(line + "\n" for line in lines) + "Answer: <none>"


def _rows(with_values=False):
    """samples / segments / credits / advantages / token_texts for 2 prompts x 3 completions:
    prompt 0 has a mixed group (correct, wrong at step 1, correct), prompt 1 is all incorrect."""
    samples, segments, credits, advantages, texts = [], [], [], [], {}
    plans = [[None, 1, None], [0, 2, 1]]
    for problem, plan in zip(PROBLEMS, plans):
        for idx, wrong_at in enumerate(plan):
            completion = BENCH.solution(problem) if wrong_at is None else _wrong_completion(problem, wrong_at)
            reward = BENCH.verify(completion, problem)
            tokens = list(completion)  # one token per character
            key = {"prompt_id": problem.prompt_id, "sample_idx": idx}
            samples.append({
                **key,
                "prompt": BENCH.prompt(problem),
                "prompt_token_ids": [ord(c) for c in BENCH.prompt(problem)],
                "completion": completion,
                "completion_token_ids": [ord(c) for c in tokens],
                "completion_logprobs": [-0.5] * len(tokens),
                "reward": reward,
                "scorable": True,
                "gold_answer": problem.gold_answer,
                "pred_answer": BENCH.extract_answer(completion),
                "benchmark": "chain",
                "finish_reason": "stop",
                "num_tokens": len(tokens),
                "meta": json.dumps(problem.meta, sort_keys=True),
            })
            texts[(problem.prompt_id, idx)] = tokens
            # segments: one per line, the newline kept at the end of its line
            start, bounds = 0, []
            for i, c in enumerate(tokens):
                if c == "\n":
                    bounds.append((start, i + 1))
                    start = i + 1
            bounds.append((start, len(tokens)))
            token_adv = []
            for k, (a, b) in enumerate(bounds):
                credit = (0.5 if reward else -0.5) * (1 + 0.25 * k)
                segments.append({**key, "segment_idx": k, "token_start": a, "token_end": b,
                                 "text": "".join(tokens[a:b]), "strategy": "newline"})
                credits.append({**key, "segment_idx": k, "method": "fake",
                                "value": (0.2 + 0.1 * k) if with_values else None, "credit": credit})
                token_adv += [credit] * (b - a)
            advantages.append({**key, "method": "fake", "token_advantages": token_adv})
    return samples, segments, credits, advantages, texts


def _cards(with_values=False, **kwargs):
    samples, segments, credits, advantages, texts = _rows(with_values)
    kwargs.setdefault("benchmark", BENCH)
    kwargs.setdefault("token_texts", texts)
    return build_cards(samples, segments, credits, advantages, **kwargs)


# --------------------------------------------------------------------------- selection


def test_mixed_selection_picks_correct_and_incorrect_from_mixed_groups_first():
    samples = _rows()[0]
    picked = select_samples(samples, count=2, select="mixed")
    assert {r["reward"] for r in picked} == {0.0, 1.0}
    assert {r["prompt_id"] for r in picked} == {PROBLEMS[0].prompt_id}  # the mixed group

    cards = _cards(count=4, select="mixed")
    assert len(cards) == 4
    assert sum(c.correct for c in cards) == 2 and sum(not c.correct for c in cards) == 2


def test_other_selection_modes_and_filters():
    samples = _rows()[0]
    assert all(r["reward"] == 0.0 for r in select_samples(samples, 3, "incorrect"))
    assert all(r["reward"] == 1.0 for r in select_samples(samples, 3, "correct"))
    assert len(select_samples(samples, 10, "correct")) == 2
    assert [(r["prompt_id"], r["sample_idx"]) for r in select_samples(samples, 2, "first")] == [
        (PROBLEMS[0].prompt_id, 0), (PROBLEMS[0].prompt_id, 1)]
    only = select_samples(samples, 8, "first", prompt_ids=[PROBLEMS[1].prompt_id], sample_idx=2)
    assert [(r["prompt_id"], r["sample_idx"]) for r in only] == [(PROBLEMS[1].prompt_id, 2)]
    # mixed with too few correct ones fills with incorrect ones
    assert len(select_samples(samples, 6, "mixed")) == 6
    with pytest.raises(SelectionError):
        select_samples(samples, 2, "best")
    with pytest.raises(SelectionError):
        select_samples(samples, 2, prompt_ids=["chain/test/999"])


# --------------------------------------------------------------------------- cards and HTML


def test_html_is_self_contained_with_every_token_escaped_and_one_card_each():
    cards = _cards(count=4)
    page = render_html(cards)
    assert page.count('<section class="card') == 4
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page
    assert 'class="legend"' in page
    assert "<svg" not in page  # no values in these credits
    flat = page.replace('<span class="nl"></span>', "")
    for card in cards:
        assert html.escape(card.prompt_id) in page
        for token in card.tokens:
            assert html.escape(token.text, quote=True) in flat
        assert html.escape(card.gold_answer) in page
    # the raw HTML specials of the wrong lines never appear unescaped
    assert "<b>" not in page.replace("<b>token advantage</b>", "")
    assert "&lt;none&gt;" in page  # the predicted answer


def test_first_wrong_step_is_marked_on_the_right_characters():
    cards = {c.key: c for c in _cards(count=6, select="first")}
    card = cards[(PROBLEMS[0].prompt_id, 1)]
    assert card.first_wrong_step == 1
    start, end = card.first_wrong_chars
    assert card.completion[start:end] == "9<b>&\"x'=?"
    flagged = "".join(t.text for t in card.tokens if t.first_wrong)
    assert flagged == "9<b>&\"x'=?"
    assert card.first_wrong_segment == 1
    assert cards[(PROBLEMS[0].prompt_id, 0)].first_wrong_step is None
    page = render_html([card])
    assert 'class="t fw fws' in page and "fwe" in page
    assert "first wrong step: 2" in page
    # without a step-checking benchmark nothing is marked
    plain = _cards(count=6, select="first", benchmark=None)
    assert all(c.first_wrong_step is None for c in plain)
    assert 'class="t fw' not in render_html(plain)


def test_value_curve_svg_only_when_values_exist():
    with_values = render_html(_cards(with_values=True, count=2))
    assert with_values.count("<svg") == 2 and "<polyline" in with_values
    assert "http://" not in with_values  # inline SVG needs no xmlns
    assert "<svg" not in render_html(_cards(with_values=False, count=2))


def test_colours_are_diverging_and_symmetric():
    assert diverging_color(0.0, 1.0) == "#ffffff"
    assert diverging_color(-1.0, 1.0) == "#b2182b"
    assert diverging_color(1.0, 1.0) == "#2166ac"
    assert diverging_color(5.0, 1.0) == "#2166ac"  # clipped
    cards = _cards(count=4)
    page = render_html(cards)
    assert "#b2182b" in page and "#2166ac" in page  # the largest |value| gets the darkest colour
    assert "scale ±0.875" in page  # 0.5 * (1 + 0.25 * 3): the answer line of a 3-step chain
    assert render_html(cards, color_by="credit").count('<section class="card') == 4
    with pytest.raises(ValueError):
        render_html(cards, color_by="nope")


def test_without_token_texts_segments_are_the_pieces():
    cards = _cards(count=2, token_texts=None)
    for card in cards:
        assert not card.token_level
        assert [t.text for t in card.tokens] == [s.text for s in card.segments]
    page = render_html(cards)
    assert "token texts unavailable" in page
    wrong = next(c for c in cards if c.first_wrong_step is not None)
    assert sum(t.first_wrong for t in wrong.tokens) == 1


def test_mismatched_artifacts_are_reported():
    samples, segments, credits, advantages, texts = _rows()
    advantages[0]["token_advantages"] = advantages[0]["token_advantages"][:-1]
    with pytest.raises(ValueError, match="token advantages"):
        build_cards(samples, segments, credits, advantages, select="first", count=1)


def test_align_token_spans_handles_partial_characters_and_special_tokens():
    completion = "a\u00e9b"
    spans = align_token_spans(completion, ["a", "\ufffd", "\ufffd", "b", "<|eos|>"])
    assert spans == [(0, 1, False), (1, 2, False), (2, 2, False), (2, 3, False), (3, 3, True)]
    assert align_token_spans("xy", ["x", "y"]) == [(0, 1, False), (1, 2, False)]


# --------------------------------------------------------------------------- PNG


def test_png_is_written_and_valid(tmp_path):
    path = render_png(_cards(with_values=True, count=4), tmp_path / "out" / "h.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    empty = render_png([], tmp_path / "empty.png")
    assert empty.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- stage


def write_inputs(run, monkeypatch):
    """``run`` with the artifacts heatmap reads for method grpo, and the stage's tokenizer replaced by a
    character-level one (instead of loading model.path); returns ``run``."""
    import rredcot_cli.stages.heatmap as stage

    samples, segments, credits, advantages, texts = _rows(with_values=True)
    for rows in (credits, advantages):
        for r in rows:
            r["method"] = "grpo"
    artifacts.write_artifact("samples", samples, run / "sample" / "samples.parquet")
    artifacts.write_artifact("segments", segments, run / "segment" / "segments.parquet")
    artifacts.write_artifact("credits", credits, run / "attribute" / "grpo" / "credits.parquet")
    artifacts.write_artifact("advantages", advantages, run / "attribute" / "grpo" / "advantages.parquet")
    monkeypatch.setattr(stage, "_token_text_source",
                        lambda cfg, segs: lambda row: [chr(i) for i in row["completion_token_ids"]])
    return run


def test_stage_writes_page_and_figure(tmp_path, monkeypatch):
    run = write_inputs(tmp_path / "run", monkeypatch)
    result = CliRunner().invoke(app, ["heatmap", f"run.dir={run}", "method=grpo", "heatmap.samples=2",
                                      "benchmark.min_steps=3", "benchmark.max_steps=3", "benchmark.data_seed=7"])
    assert result.exit_code == 0, result.output
    out = run / "heatmap" / "grpo"
    page = (out / "heatmap.html").read_text()
    assert page.count('<section class="card') == 2 and "<svg" in page and 'class="t fw fws' in page
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out / "heatmap.html") in result.output and str(out / "heatmap.png") in result.output

    bad = CliRunner().invoke(app, ["heatmap", f"run.dir={run}", "heatmap.select=best"])
    assert bad.exit_code == 2 and "heatmap.select" in bad.output
    missing = CliRunner().invoke(app, ["heatmap", f"run.dir={run}", "method=dr_grpo"])
    assert missing.exit_code == 2 and "credits.parquet" in missing.output
