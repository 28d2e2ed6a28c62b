"""Whole-model, GPU-side memory estimates and fits-on tables from bench/memory.py's measurements
(docs/studies/memory.md says how); writes them beside the input as ``<name>_derived.json`` and prints
the tables as markdown.

    python bench/memory_derive.py results/memory/memory.json

Bytes of parameters, gradients and AdamW moments are exact arithmetic from config.json; the rest of
an update's memory comes from the measured per-phase peaks, extrapolated linearly in depth (each
phase's extra memory per decoder layer is constant; checked at 0.5B's full 24 layers).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from memory import MODELS, OPTION_SETS

MIB, GIB = 2**20, 2**30
PHASES = ("prepass", "forward", "backward", "step", "other")
# Usable memory of a representative card of each size (nvidia-smi's total).
ACCELERATORS = {"24 GB": 23_034 * MIB, "40 GB": 40_960 * MIB, "80 GB": 81_559 * MIB, "141 GB": 143_771 * MIB}
ACCELERATOR_CARDS = {"24 GB": "L4", "40 GB": "A100-40GB", "80 GB": "H100-80GB", "141 GB": "H200"}
# GPU-side assumptions (not measured here; docs/studies/memory.md says why these values):
CUDA_CONTEXT = 1.0 * GIB  # CUDA context + cuBLAS workspaces of the one process (vLLM in-process, TP=1)
ENGINE_WORKSPACE = 1.5 * GIB  # vLLM awake, beyond weights and KV cache: activations, CUDA graphs, sampler
ENGINE_ASLEEP = 1.0 * GIB  # what LLM.sleep(level=2) leaves: graph pools, allocator residue
KV_SEQUENCES = 64  # KV cache budget: this many sequences of the full length resident at once
TABLE_OPTIONS = {"all": "full FT, bf16-mixed", "bf16true_all": "full FT, bf16-true", "lora_all": "LoRA r=16"}


@dataclass(frozen=True)
class Arch:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, model: str) -> "Arch":
        c = json.loads((MODELS[model] / "config.json").read_text())
        return cls(c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
                   c["num_key_value_heads"], c["vocab_size"], bool(c.get("tie_word_embeddings", False)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_shapes(self) -> list[tuple[int, int, bool]]:
        """(in, out, bias) of each Linear of one decoder layer."""
        H, q, kv, I = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(H, q, True), (H, kv, True), (H, kv, True), (q, H, False), (H, I, False), (H, I, False), (I, H,
                 False)]

    def counts(self, layers: int, lora_r: int = 0) -> dict:
        linear = sum(i * o + (o if b else 0) for i, o, b in self.linear_shapes())
        layer = linear + 2 * self.hidden  # + two RMSNorms
        embed = self.vocab * self.hidden
        head = 0 if self.tied else embed
        return {"total": embed + head + layers * layer + self.hidden, "layer": layer, "embed": embed, "head": head,
                # weights autocast casts to bf16 (and caches while the autocast context is open): every
                # Linear, the LM head included (tied or not); the embedding lookup is not cast
                "cast": layers * linear + embed,
                "lora": layers * sum(lora_r * (i + o) for i, o, _ in self.linear_shapes())}

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


def state_bytes(model: str, layers: int, options: str) -> dict:
    """Exact bytes of weights (W), gradients (G), AdamW moments (M) and the multi-tensor AdamW's
    step temporary (T: a copy of the second moments; CUDA's optimizer before 1aa4279, now fused
    and without it) for ``layers`` decoder layers."""
    opts = OPTION_SETS[options]
    n = Arch.of(model).counts(layers, opts.lora_r)
    if opts.lora_r:  # frozen base in bf16, adapters in fp32 (bf16-mixed)
        W, trained, width = 2 * n["total"] + 4 * n["lora"], n["lora"], 4
    else:
        width = 2 if opts.precision == "bf16-true" else 4
        W, trained = width * n["total"], n["total"]
    return {"W": W, "G": width * trained, "M": 2 * width * trained, "T": width * trained, "params": n}


def _variant(p: dict) -> str:
    """'' for a default point; else what makes it a variant (foreach, fused, update2). Points
    re-used from the measurement before 1aa4279 carry ``steady: false`` and none of the new fields."""
    return "/".join(filter(None, ["foreach" if p.get("adamw_foreach") else "",
                    "fused" if p.get("adamw_fused") else "",
                                  f"update{p['updates']}" if p.get("updates", 1) > 1 else "",
                                  "steady" if p.get("steady") else ""]))


def _ok(p: dict) -> bool:
    """A default point (no variant) that finished."""
    return p["status"] == "ok" and not _variant(p)


def _grads(p: dict) -> int:
    """G as measured: the gradient bytes allocated when the step begins (recorded since 1aa4279,
    after which policy_update frees them at its end); for re-used points, those left after it."""
    return p["grad_bytes_at_step"] if "grad_bytes_at_step" in p else p["grad_bytes"]


def _residuals(p: dict) -> dict:
    """Extra bytes of each phase above W + M. Since 1aa4279 policy_update frees the gradients at
    its end, so every update of a run starts from W + M, as the points do: these are the steady
    state's residuals as measured (checked by the ``updates=2`` variant). Phases that hold the
    gradients include them: the step and ``other`` all of G, a later micro-batch's forward and
    backward all of G, a single micro-batch's backward those allocated so far."""
    return {k: p["phase_peaks"][k] - p["rss_setup"] for k in PHASES}


def _fit(points: list[dict], layers: int, values) -> dict:
    """Per-phase values at ``layers`` decoder layers: linear through the two shallowest points."""
    a, b = sorted(points, key=lambda p: p["layers"])[:2]
    va, vb = values(a), values(b)
    return {k: va[k] + (layers - a["layers"]) * (vb[k] - va[k]) / (b["layers"] - a["layers"]) for k in va}


def _groups(points: list[dict]) -> dict:
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        if p["status"] == "ok":
            key = (p["model"], p["seq_len"], p["rows"], p["options"], _variant(p))
            groups.setdefault(key, []).append(p)
    return groups


def _mixed_from_true(R_true: dict, model: str, layers: int, rows_per_pass: int, seq_len: int, several: bool) -> dict:
    """bf16-mixed residuals from bf16-true ones (7B, where bf16-mixed does not fit this machine).
    Without autocast's weight cache (1aa4279) the pre-pass is the same. Otherwise bf16-mixed has
    fp32 gradients (+2 bytes per parameter, dG, wherever the gradients are held: the step,
    ``other``, and with several micro-batches a later one's forward and backward), fp32
    checkpointed layer inputs (+2 bytes per hidden value, per layer and one more), and in the
    backward an extra 2 bytes per LM-head weight (its cast, recomputed per chunk). With one
    micro-batch per minibatch the backward holds only part of G at its peak; adding all of dG is
    an upper bound there (``mixed_from_true_checks``)."""
    arch = Arch.of(model)
    n = arch.counts(layers)
    dG = 2 * n["total"]
    ck = (layers + 1) * rows_per_pass * seq_len * arch.hidden * 2
    head = 2 * arch.vocab * arch.hidden
    extra = {"prepass": 0, "forward": ck + (dG if several else 0), "backward": ck + dG + head,
             # CPU's for-loop AdamW step: G plus two temporaries of the largest parameter, twice as
             # wide in fp32; the GPU estimate replaces the step anyway
             "step": R_true["step"], "other": dG}
    return {k: R_true[k] + extra[k] for k in R_true}


def _checkpoint_input_bytes(p: dict) -> int:
    """Bytes per decoder layer that gradient checkpointing keeps for one pass of ``p``: the
    layer's input, float32 under autocast (the residual stream stays in the weights' dtype),
    bf16 with bf16 weights (bf16-true; LoRA's frozen base)."""
    opts = OPTION_SETS[p["options"]]
    width = 4 if opts.precision == "bf16-mixed" and not opts.lora_r else 2
    return p["rows_per_pass"] * p["seq_len"] * Arch.of(p["model"]).hidden * width


def _fit_other_length(points: list[dict], p: dict, layers: int) -> tuple[dict, str]:
    """Residuals at ``layers`` for a configuration measured at one depth only: the slope per layer
    of the same model and options at another length (the same minibatch rows where measured), plus
    the difference in what checkpointing keeps per layer (forward and backward; the pre-pass keeps
    nothing per layer). Only for gradient-checkpointed configurations, where that is the whole
    token-dependent part of the slope (checked on 0.5B and 1.5B in ``length_checks``)."""
    assert OPTION_SETS[p["options"]].gradient_checkpointing
    same = [q for q in points if _ok(q) and q["model"] == p["model"] and q["options"] == p["options"]
            and q["seq_len"] != p["seq_len"]]
    by_rows: dict[int, dict] = {}
    for q in same:
        by_rows.setdefault(q["rows"], {})[q["layers"]] = q
    other = by_rows.get(p["rows"]) if len(by_rows.get(p["rows"], {})) >= 2 else next(
        (v for _, v in sorted(by_rows.items()) if len(v) >= 2), None)
    if not other:
        raise LookupError(f"{p['key']}: no other length measured at two depths")
    a, b = (other[d] for d in sorted(other)[:2])

    def without_grads(q: dict) -> dict:
        # With several micro-batches a later one's forward and backward hold all of G, which grows
        # by G per layer: taken out here and put back at the target depth, so that a slope can
        # move between a minibatch of one micro-batch and one of several.
        R = _residuals(q)
        if q["rows_per_pass"] < q["rows"]:
            R = {k: v - (_grads(q) if k in ("forward", "backward") else 0) for k, v in R.items()}
        return R

    ra, rb = without_grads(a), without_grads(b)
    extra = _checkpoint_input_bytes(p) - _checkpoint_input_bytes(a)
    slope = {k: (rb[k] - ra[k]) / (b["layers"] - a["layers"]) + (extra if k in ("forward", "backward") else 0)
             for k in PHASES}
    base = without_grads(p)
    G = state_bytes(p["model"], layers, p["options"])["G"] if p["rows_per_pass"] < p["rows"] else 0
    return ({k: base[k] + (layers - p["layers"]) * slope[k] + (G if k in ("forward", "backward") else 0)
             for k in PHASES},
            f"slope from {a['seq_len']} tokens, {a['rows']} row(s) + checkpointed layer inputs")


def _length_checks(points: list[dict]) -> list[dict]:
    """``_fit_other_length`` where both lengths are measured at two depths: predicted vs measured
    residuals at the deeper point."""
    checks = []
    groups = _groups(points)
    for (model, T, rows, options, variant), ps in sorted(groups.items()):
        if variant or not OPTION_SETS[options].gradient_checkpointing or len(ps) < 2:
            continue
        if not any(k[0] == model and k[3] == options and k[1] != T and len(v) >= 2 and not k[4]
                   for k, v in groups.items()):
            continue
        a, b = sorted(ps, key=lambda p: p["layers"])[:2]
        pred, how = _fit_other_length(points, a, b["layers"])
        checks.append({"key": b["key"], "from": a["key"], "how": how, "predicted": pred, "measured": _residuals(b)})
    return checks


# The minibatch of the GPU tables: 2 rows at 1k (two micro-batches of one row) and 1 row at 4k.
# Where a model was measured only with another row count (7B LoRA at 1k: 1 row) that is used
# and the row says so.
TABLE_ROWS = {1024: 2, 4096: 1}


def derive(path: Path) -> dict:
    data = json.loads(path.read_text())
    points = data["points"]
    groups = _groups(points)
    out: dict = {"source": str(path), "assumptions": {
        "accelerators_bytes": ACCELERATORS, "cards": ACCELERATOR_CARDS, "cuda_context": CUDA_CONTEXT,
        "engine_workspace": ENGINE_WORKSPACE, "engine_asleep": ENGINE_ASLEEP, "kv_sequences": KV_SEQUENCES,
        "table_rows": TABLE_ROWS}}

    # 1. Static state: arithmetic against what the model and AdamW hold, and against RSS.
    static = []
    for p in points:
        if p["status"] != "ok":
            continue
        st = state_bytes(p["model"], p["layers"], p["options"])
        static.append({"key": p["key"], "params": p["params_total"], "params_arith": st["params"]["total"]
                       + (st["params"]["lora"] if OPTION_SETS[p["options"]].lora_r else 0),
                       "W_M_arith": st["W"] + st["M"], "W_M_tensors": p["param_bytes"] + p["optimizer_state_bytes"],
                       "rss_setup_above_imports": p["rss_setup"] - p["rss_imports"],
                       "G_arith": st["G"], "G_tensors": _grads(p),
                       "G_after_update": p["grad_bytes"], "reused_from": p.get("reused_from")})
    out["static"] = static

    # 2. Depth: the two shallowest depths predict every deeper measured one.
    checks = []
    for key, ps in groups.items():
        if len(ps) < 3:
            continue
        for q in sorted(ps, key=lambda p: p["layers"])[2:]:
            pred = _fit(ps, q["layers"], _residuals)
            meas = _residuals(q)
            checks.append({"key": q["key"], "predicted": pred, "measured": meas,
                           "peak_predicted": max(pred.values()), "peak_measured": max(meas.values())})
    out["depth_checks"] = checks

    # 3. Full depth on this CPU (what the points measure): W + M + max phase extra.
    full = []
    for (model, T, rows, options, variant), ps in sorted(groups.items()):
        if variant:
            continue
        L = Arch.of(model).layers
        byd = {p["layers"]: p for p in ps}
        st = state_bytes(model, L, options)
        row = {"model": model, "seq_len": T, "rows": rows, "options": options,
               "rows_per_pass": ps[0]["rows_per_pass"], "measured_depths": sorted(byd),
               "measured_peak_above_imports": {d: byd[d]["peak_update"] - byd[d]["rss_imports"] for d in sorted(byd)},
               "reused_from": sorted({p["reused_from"] for p in ps if p.get("reused_from")})}
        if L in byd:
            row["full_depth_peak"] = byd[L]["peak_update"] - byd[L]["rss_imports"]
            row["full_depth_source"] = "measured"
        elif len(byd) >= 2:
            E = _fit(ps, L, _residuals)
            row["full_depth_peak"] = st["W"] + st["M"] + max(E.values())
            row["full_depth_source"] = "extrapolated"
        full.append(row)
    out["full_depth_cpu"] = full

    # 4. Checks of the arithmetic the GPU estimates add to the measurements.
    # The optimizers: the step's extra with the fused AdamW (CUDA's since 1aa4279) and the
    # multi-tensor one (CUDA's before), against the for-loop default of the same point.
    optimizers = []
    for p in points:
        if p["status"] == "ok" and (p.get("adamw_foreach") or p.get("adamw_fused")) and p.get("updates", 1) == 1:
            st = state_bytes(p["model"], p["layers"], p["options"])
            twin = next(q for q in points if _ok(q) and q["key"] == p["key"].rsplit("/", 1)[0])
            optimizers.append({"key": p["key"], "optimizer": "fused" if p.get("adamw_fused") else "foreach",
                               "step_extra": p["phase_peaks"]["step"] - p["rss_setup"],
                               "step_extra_forloop": twin["phase_peaks"]["step"] - twin["rss_setup"],
                               "G": _grads(p), "T_arith": st["T"],
                               "beyond_G": p["phase_peaks"]["step"] - p["rss_setup"] - _grads(p),
                               "beyond_G_plus_T": p["phase_peaks"]["step"] - p["rss_setup"] - _grads(p) - st["T"]})
    out["optimizer_checks"] = optimizers
    # The steady state: the second of two consecutive updates against the first (same point).
    second = []
    for p in points:
        if p["status"] == "ok" and p.get("updates", 1) > 1 and not (p.get("adamw_foreach") or p.get("adamw_fused")):
            twin = next(q for q in points if _ok(q) and q["key"] == p["key"].rsplit("/", 1)[0])
            second.append({"key": p["key"], "from": twin["key"], "first_update": _residuals(twin),
                           "later_update": _residuals(p), "rss_before_update_above_setup":
                           p.get("rss_before_update", p["rss_setup"]) - p["rss_setup"],
                           "grads_after_update": p["grad_bytes"]})
    out["steady_checks"] = second
    # A second micro-batch: the same minibatch size per pass (one row), two rows against one.
    micro = []
    for (model, T, rows, options, variant), ps in sorted(groups.items()):
        if variant or rows < 2 or ps[0]["rows_per_pass"] != 1:
            continue
        for p in ps:
            q = next((q for q in groups.get((model, T, 1, options, ""), []) if q["layers"] == p["layers"]), None)
            if q is not None:
                micro.append({"key": p["key"], "vs": q["key"], "G": _grads(p), "two_micro_batches": _residuals(p),
                              "one": _residuals(q)})
    out["micro_batch_checks"] = micro
    mixed = []
    for (model, T, rows, options, variant), ps in groups.items():
        if options != "all" or variant:
            continue
        for p in ps:
            t = next((q for q in groups.get((model, T, rows, "bf16true_all", ""), []) if q["layers"] == p["layers"]),
                     None)
            if t is not None:
                several = p["rows_per_pass"] < p["rows"]
                mixed.append({"key": p["key"], "several_micro_batches": several, "measured": _residuals(p),
                              "predicted": _mixed_from_true(_residuals(t), model, p["layers"], p["rows_per_pass"], T,
                                                            several)})
    out["mixed_from_true_checks"] = mixed
    out["length_checks"] = _length_checks(points)
    # What a second row per pass costs: ckpt_chunk (the minibatch in one pass) against all (one
    # row per pass), same model, length and depth.
    rows_ = []
    for p in points:
        if _ok(p) and p["options"] == "ckpt_chunk" and p["rows_per_pass"] == 2:
            q = next((q for q in points if _ok(q) and q["options"] == "all" and q["rows_per_pass"] == 1 and
                      (q["model"], q["seq_len"], q["layers"]) == (p["model"], p["seq_len"], p["layers"])), None)
            if q is not None:
                rp, rq = _residuals(p), _residuals(q)
                rows_.append({"key": p["key"], "vs": q["key"], "two_rows": rp, "one_row": rq,
                              "peak_difference": max(rp.values()) - max(rq.values())})
    out["row_checks"] = rows_
    # The GPU step: G plus what the optimizer adds beyond it (measured on this CPU: fused AdamW,
    # CUDA's now; the multi-tensor one, before 1aa4279, beyond G + T).
    eps_fused = max((o["beyond_G"] for o in optimizers if o["optimizer"] == "fused"), default=0)
    eps_foreach = max((o["beyond_G_plus_T"] for o in optimizers if o["optimizer"] == "foreach"), default=0)
    out["step_beyond_G"] = {"fused": eps_fused, "foreach_beyond_T": eps_foreach}

    # 5. GPU estimates at full depth, steady state, with vLLM colocated.
    gpu = []
    for model in MODELS:
        arch = Arch.of(model)
        L = arch.layers
        for T in sorted({p["seq_len"] for p in points}):
            for options, label in TABLE_OPTIONS.items():
                source, from_true = options, False

                def measured(opts: str, length: int | None = T) -> list[dict]:
                    return [p for p in points if _ok(p) and p["model"] == model and p["options"] == opts
                            and length in (None, p["seq_len"])]

                ps = measured(options)
                if options == "all" and not measured("all", None):  # 7B: bf16-mixed does not fit this machine
                    ps = measured("bf16true_all")
                    source, from_true = "bf16true_all + bf16-mixed arithmetic", True
                if not ps:
                    continue
                want = TABLE_ROWS.get(T, 1)
                rows = want if any(p["rows"] == want for p in ps) else max(p["rows"] for p in ps)
                if rows != want:
                    source += f"; {rows}-row minibatch (no {want}-row point)"
                by_layers = {p["layers"]: p for p in ps if p["rows"] == rows}
                pair = [by_layers[d] for d in sorted(by_layers)[:2]]
                if len(pair) == 2:
                    R = _fit(pair, L, _residuals)
                else:  # one depth at this length (7B at 4k): the per-layer slope from another length
                    try:
                        R, how = _fit_other_length(points, pair[0], L)
                    except LookupError:
                        continue
                    source += f"; {how}"
                several = pair[0]["rows_per_pass"] < pair[0]["rows"]
                if from_true:
                    R = _mixed_from_true(R, model, L, pair[0]["rows_per_pass"], T, several)
                st = state_bytes(model, L, options)
                R_gpu = dict(R, step=st["G"] + eps_fused)  # the fused AdamW make_optimizer builds on CUDA
                phase = max(R_gpu, key=R_gpu.get)
                runner_up = max((k for k in R_gpu if k != phase), key=R_gpu.get)
                resting = st["W"] + st["M"]  # gradients freed after each update (1aa4279)
                peak = resting + R_gpu[phase]
                n_total = arch.counts(L)["total"]
                kv = KV_SEQUENCES * T * arch.kv_bytes_per_token()
                awake = 2 * n_total + kv + ENGINE_WORKSPACE
                need_sleep = max(CUDA_CONTEXT + peak + ENGINE_ASLEEP, CUDA_CONTEXT + resting + awake)
                need_awake = CUDA_CONTEXT + peak + awake
                # Were the step still torch's multi-tensor AdamW (CUDA's default, the optimizer
                # before 1aa4279): that finding's share of the change, the other two fixes kept.
                R_fe = dict(R, step=st["G"] + st["T"] + eps_foreach)
                peak_fe = resting + max(R_fe.values())
                need_fe = max(CUDA_CONTEXT + peak_fe + ENGINE_ASLEEP, CUDA_CONTEXT + resting + awake)
                gpu.append({"model": model, "seq_len": T, "options": options, "label": label, "source": source,
                            "rows": rows, "rows_per_pass": pair[0]["rows_per_pass"],
                            "depths_used": [p["layers"] for p in pair], "several_micro_batches": several,
                            "W": st["W"], "G": st["G"], "M": st["M"], "T": st["T"], "residual": R_gpu,
                            "peak_phase": phase, "runner_up_phase": runner_up,
                            "backward_upper_bound": from_true and not several,
                            "trainer_resting": resting, "trainer_peak": peak,
                            "engine_weights": 2 * n_total, "engine_kv": kv, "engine_awake": awake,
                            "need_sleep_mode": need_sleep, "need_no_sleep": need_awake,
                            "what_if_foreach_adamw": {"trainer_peak": peak_fe, "need_sleep_mode": need_fe,
                                                      "fits": {g: _verdict(need_fe, c) for g,
                                                                           c in ACCELERATORS.items()}},
                            "fits_sleep_mode": {g: _verdict(need_sleep, c) for g, c in ACCELERATORS.items()},
                            "fits_no_sleep": {g: _verdict(need_awake, c) for g, c in ACCELERATORS.items()}})
    out["gpu"] = gpu
    target = path.with_name(path.stem + "_derived.json")
    target.write_text(json.dumps(out, indent=1) + "\n")
    print(report(out))
    print(f"\nwrote {target}")
    return out


def _verdict(need: float, capacity: float) -> str:
    return "yes" if need <= 0.9 * capacity else "tight" if need <= capacity else "no"


def _phase_cell(r: dict) -> str:
    """The peak phase and its residual, with the runner-up; a 7B bf16-mixed backward derived from a
    one-micro-batch minibatch is an upper bound, marked <=."""
    ph, R, ru = r["peak_phase"], r["residual"], r["runner_up_phase"]
    mark = "<=" if ph == "backward" and r["backward_upper_bound"] else "+"
    return f"{ph} {mark}{_g(R[ph])} ({ru} +{_g(R[ru])})"


def _g(x: float) -> str:
    return f"{x / GIB:.1f}"


def report(d: dict) -> str:
    """The derived tables as markdown (docs/studies/memory.md quotes them)."""
    lines = ["### Static state: arithmetic vs measured (MiB; one row per model, depth and options)", "",
             "| model/depth/options | params | W+M arithmetic | W+M tensors | RSS setup - imports | G arithmetic | G tensors |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    seen = set()
    for s in d["static"]:
        model, depth, _, _, options = s["key"].split("/")[:5]
        if (model, depth, options) in seen:
            continue
        seen.add((model, depth, options))
        lines.append(f"| {model}/{depth}/{options} | {s['params']:,} | {s['W_M_arith'] / MIB:,.0f} | "
                     f"{s['W_M_tensors'] / MIB:,.0f} | {s['rss_setup_above_imports'] / MIB:,.0f} | "
                     f"{s['G_arith'] / MIB:,.0f} | {s['G_tensors'] / MIB:,.0f} |")
    worst = max(d["static"], key=lambda s: abs(s["rss_setup_above_imports"] - s["W_M_arith"]))
    lines += ["", f"Largest gap between RSS and the arithmetic over all {len(d['static'])} points: "
              f"{(worst['rss_setup_above_imports'] - worst['W_M_arith']) / MIB:+,.0f} MiB ({worst['key']}); "
              f"params arithmetic = counted in every point: {all(s['params'] == s['params_arith'] for s in d['static'])}."]
    lines += ["", "### Depth extrapolation checks (extra above W+M per phase, MiB: predicted from the two "
              "shallowest depths / measured)", "", "| point | " + " | ".join(PHASES) + " | peak |",
              "| --- |" + " ---: |" * (len(PHASES) + 1)]
    for c in d["depth_checks"]:
        cells = [f"{c['predicted'][k] / MIB:,.0f} / {c['measured'][k] / MIB:,.0f}" for k in PHASES]
        lines.append(f"| {c['key']} | " + " | ".join(cells)
                     + f" | {c['peak_predicted'] / MIB:,.0f} / {c['peak_measured'] / MIB:,.0f} |")
    lines += ["", "### Full depth on this CPU, one update from W+M (GiB above the process floor)", "",
              "| model | tokens | options | rows/pass | measured (depth: GiB) | full depth |",
              "| --- | ---: | --- | ---: | --- | ---: |"]
    for r in d["full_depth_cpu"]:
        meas = ", ".join(f"{k}: {_g(v)}" for k, v in r["measured_peak_above_imports"].items())
        fd = f"{_g(r['full_depth_peak'])} ({r['full_depth_source']})" if "full_depth_peak" in r else "-"
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['options']} (B={r['rows']}) | {r['rows_per_pass']} | {meas} | {fd} |")
    lines += ["", "### Arithmetic checks (MiB)", ""]
    for f in d["optimizer_checks"]:
        lines.append(f"- {f['key']}: step extra {f['step_extra'] / MIB:,.0f} with the {f['optimizer']} AdamW, "
                     f"{f['step_extra_forloop'] / MIB:,.0f} with the for-loop one; G {f['G'] / MIB:,.0f}, "
                     f"T arithmetic {f['T_arith'] / MIB:,.0f}; beyond G {f['beyond_G'] / MIB:,.0f}, "
                     f"beyond G + T {f['beyond_G_plus_T'] / MIB:,.0f}")
    for c in d["steady_checks"]:
        cells = ", ".join(f"{k} {c['first_update'][k] / MIB:,.0f} / {c['later_update'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- steady state: {c['key']} (first update / last update, extra above W+M): {cells}; "
                     f"RSS before the last update {c['rss_before_update_above_setup'] / MIB:+,.0f} above setup, "
                     f"gradients after it {c['grads_after_update'] / MIB:,.0f}")
    for c in d["micro_batch_checks"]:
        cells = ", ".join(f"{k} {c['one'][k] / MIB:,.0f} -> {c['two_micro_batches'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- a second micro-batch, {c['key']} vs {c['vs']} (G {c['G'] / MIB:,.0f}): {cells}")
    for c in d["row_checks"]:
        cells = ", ".join(f"{k} {c['one_row'][k] / MIB:,.0f} -> {c['two_rows'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- two rows per pass instead of one, {c['key']} vs {c['vs']}: {cells} "
                     f"(peak +{c['peak_difference'] / MIB:,.0f})")
    for c in d["length_checks"]:
        cells = ", ".join(f"{k} {c['predicted'][k] / MIB:,.0f} / {c['measured'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- per-layer slope from the other length {c['key']} (from {c['from']}) predicted / measured: {cells}")
    for c in d["mixed_from_true_checks"]:
        cells = ", ".join(f"{k} {c['predicted'][k] / MIB:,.0f} / {c['measured'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- bf16-mixed from bf16-true {c['key']} predicted / measured: {cells}")
    lines += ["", "### GPU estimate, full depth, steady state (GiB)", "",
              "| model | tokens | training | trainer resting W+M | + peak phase (runner-up) | = trainer peak | vLLM awake "
              "(weights + KV + workspace) | need, sleep mode | need, no sleep |",
              "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in d["gpu"]:
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['label']} | {_g(r['trainer_resting'])} | "
                     f"{_phase_cell(r)} | {_g(r['trainer_peak'])} | "
                     f"{_g(r['engine_awake'])} ({_g(r['engine_weights'])} + {_g(r['engine_kv'])} + "
                     f"{_g(ENGINE_WORKSPACE)}) | {_g(r['need_sleep_mode'])} | {_g(r['need_no_sleep'])} |")
    for regime, key in (("vLLM sleep mode (the CUDA default)", "fits_sleep_mode"), ("no sleep mode",
                        "fits_no_sleep")):
        lines += ["", f"### Fits on one GPU, {regime}", "",
                  "| model | tokens | training | " + " | ".join(f"{g} ({ACCELERATOR_CARDS[g]})" for g in ACCELERATORS) + " |",
                  "| --- | ---: | --- |" + " :---: |" * len(ACCELERATORS)]
        for r in d["gpu"]:
            need = r["need_sleep_mode" if key == "fits_sleep_mode" else "need_no_sleep"]
            lines.append(f"| {r['model']} | {r['seq_len']} | {r['label']} ({_g(need)} GiB) | "
                         + " | ".join(r[key][g] for g in ACCELERATORS) + " |")
    lines += ["", "### What-if: torch's multi-tensor AdamW on CUDA (the optimizer before 1aa4279; sleep mode)", "",
              "| model | tokens | training | trainer peak | need | " + " | ".join(ACCELERATORS) + " |",
              "| --- | ---: | --- | ---: | ---: |" + " :---: |" * len(ACCELERATORS)]
    for r in d["gpu"]:
        w = r["what_if_foreach_adamw"]
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['label']} | {_g(w['trainer_peak'])} | {_g(w['need_sleep_mode'])} | "
                     + " | ".join(w["fits"][g] for g in ACCELERATORS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("memory_json", type=Path, help="a measurement file of bench/memory.py (--out)")
    derive(parser.parse_args().memory_json)


if __name__ == "__main__":
    main()
