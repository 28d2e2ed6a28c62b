"""Typed config schemas. Hydra validates every composed config against these, so a misspelled
key fails at compose time. Only ``rredcot_cli.config.compose`` turns argv into one of these.

Each option is declared once, here: its type and default, a comment that says what it means, and
on the field itself (``setting``, ``one_of``) its choices, its range and whether it only says how a
run executes; the checks between options of a group sit in that group's ``problems()``. ``RANGES``
and ``EXECUTION_KEYS`` are read off the fields. ``compose`` checks it all once
(``config.ranges.check_ranges``), so a bad value fails in one line before anything loads. Stages turn the composed config into these
dataclasses (``OmegaConf.to_object``: the typed settings) and hand them down, so no function below
a stage sees the ``DictConfig``, the command line or a group it was not given; the wings read the
fields of the settings they get (the training loop, ``TrainConfig``'s).

The ``method`` group is validated separately, against the parameters its registry entry
declares (see ``rredcot_cli.methods``), because every credit method has its own knobs.
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            choices: tuple = (), range: str | None = None, execution: bool = False) -> Any:
    """A field with what else is known about it, declared beside it: its ``choices`` (any other
    value is refused), its meaningful ``range`` (a ``RANGES`` spec: ``">= 1"``, ``"[0, 1)"``, a
    bound may name another option, ``"; note"`` shown in the message), and whether it only says
    how a run ``execution`` goes (``EXECUTION_KEYS``). ``config.ranges.check_ranges`` checks them
    once, at compose time."""
    metadata: dict = {}
    if choices:
        metadata["choices"] = tuple(choices)
    if range is not None:
        metadata["range"] = range
    if execution:
        metadata["execution"] = True
    return field(default=default, default_factory=default_factory, metadata=metadata)


def one_of(default: Any, *valid: Any, range: str | None = None, execution: bool = False) -> Any:
    """A field whose value must be one of ``valid`` (``default`` among them): ``setting`` with choices."""
    return setting(default, choices=valid, range=range, execution=execution)


def choices(group: type, name: str) -> tuple:
    """The valid values of field ``name`` of the schema dataclass ``group`` (declared with ``one_of``)."""
    return next(f for f in dataclasses.fields(group) if f.name == name).metadata["choices"]


@dataclass
class RunConfig:
    # Where every artifact of this run goes; stages read their inputs from here too.
    dir: str = "runs/${now:%Y%m%d-%H%M%S}"
    # Rewrite a stage's outputs even though they were made with other options.
    overwrite: bool = False
    # Suffix for a stage's output folder, to keep a variant beside the default (e.g. sample-t07).
    tag: Optional[str] = None


@dataclass
class LoraConfig:
    # Low-rank adapters through peft (Hu et al., 2021): rank r; 0 trains every weight. With r > 0
    # only the adapters train (base weights frozen in model.dtype), the KL reference is the base
    # with the adapters switched off (no copy), vLLM gets the merged weights after every update,
    # and the final checkpoint is a merged plain HF folder plus the adapter in adapter/.
    r: int = setting(0, range=">= 0; 0 trains every weight")
    # Scale of the adapters' update: it is multiplied by alpha / r (peft's lora_alpha).
    alpha: float = setting(32.0, range="> 0")
    # Dropout on the adapters' input during training (peft's lora_dropout); 0: none.
    dropout: float = setting(0.0, range="[0, 1)")
    # Module names to adapt; ["all-linear"] is every linear layer but the LM head (peft's rule).
    target_modules: List[str] = field(default_factory=lambda: ["all-linear"])


@dataclass
class ModelConfig:
    # The preset's label (conf/model/<name>.yaml); what is loaded is model.path.
    name: str = "tiny"
    # "embedded" is the tiny model shipped inside the package; FILE.gguf, a llama.cpp file converted
    # once into a cached HF folder (rredcot_cli/policy/model_files.py); pkg://DIST/FILE, a file shipped in
    # an installed package; anything else is an HF hub id or a local folder in HF format (a
    # checkpoint written by `rredcot train` is one).
    path: str = "embedded"
    # The dtype the model computes in: the vLLM engine, HF sampling and scoring, and the autocast
    # dtype of training. The trained weights follow train.precision (float32 master weights under
    # the default mixed precision) and checkpoints are written back in this dtype.
    dtype: str = "float32"
    # Let transformers (and vLLM) run the model repository's own Python code; off unless you trust it.
    trust_remote_code: bool = False
    # Wrap prompts in the tokenizer's chat template: auto (on exactly when the tokenizer has one:
    # instruct models yes, base models and the embedded one no) | true (refused in one line when the
    # tokenizer has none) | false (plain-text prompts, e.g. a base model whose tokenizer has one).
    chat_template: Any = "auto"
    # LoRA adapters instead of training every weight (model.lora.r > 0).
    lora: LoraConfig = field(default_factory=LoraConfig)
    # The value estimator RREDCoT uses with this model unless method.value says otherwise (the
    # method's config reads it: conf/method/rredcot.yaml). Chosen per kind of text by the judge
    # (docs/studies/credit-quality.md, issue 37): answer_probe on free text, where other traces' wording gets
    # likelihood ratios near 0 and suffix_is has nothing to weigh; suffix_is on the embedded chain
    # tasks, where group mates write the same steps token for token (the tiny presets set it).
    value_estimator: str = "answer_probe"


@dataclass
class BackendConfig:
    # What samples completions: hf (transformers, a compacting decode loop) | vllm (rredcot_cli/policy/vllm.py).
    name: str = "hf"
    # auto (cuda when available, else cpu) | cpu | cuda.
    device: str = "auto"
    # Prompts x samples per generate() call (HF: also rows per scoring forward); 0: all the
    # prompts of a draw in one call (vLLM, which schedules its batches itself).
    batch_size: int = setting(64, range=">= 0; 0 puts all the prompts of a draw in one call")
    # CPU threads for torch (0 = torch's default). Tiny models run fastest on one thread:
    # their matrices are too small to split, and spinning threads fight over the cores.
    num_threads: int = setting(1, range=">= 0; 0 is torch's default", execution=True)
    # vLLM only. Share of GPU memory the engine takes (weights + KV cache) unless kv_cache_gb is set.
    gpu_memory_utilization: float = setting(0.5, range="(0, 1]")
    # vLLM only. GPUs one engine shards the model over (its tensor_parallel_size).
    tensor_parallel_size: int = setting(1, range=">= 1")
    # vLLM only. Run the model eagerly instead of capturing CUDA graphs (slower, starts faster).
    enforce_eager: bool = False
    # KV cache size in GiB; null: 1 GiB on CPU (vLLM's CPU engine needs a size), the
    # gpu_memory_utilization share on GPU.
    kv_cache_gb: Optional[float] = setting(None, range="> 0; or null", execution=True)
    # Longest prompt + completion in tokens; null: vLLM's choice (the model's context length; on
    # CPU the longest that fits the KV cache).
    max_model_len: Optional[int] = setting(None, range=">= 1; or null", execution=True)
    # Free the engine's weights and KV cache during each policy update and reload them after:
    # auto (on with CUDA; vLLM has no sleep mode on CPU) | true | false.
    sleep_mode: Any = setting("auto", execution=True)
    # vLLM only. After every weight sync, score a fixed completion with the engine and with the
    # policy and stop the run when they differ by more than this in log-prob (on every rank
    # under torchrun; the gaps go to the stage manifest). 0: off. 1e-4 fits fp32 on both sides.
    sync_check_atol: float = setting(0.0, range=">= 0; 0 turns the check off", execution=True)
    # HF only. Dtype of the keys and values a decode keeps, and of its attention: auto (the model's)
    # | bfloat16 | float16. bfloat16 halves the bytes a long decode reads (docs/studies/throughput.md) but
    # changes the sampled numbers, so training then recomputes its old log-probs (train.old_logprobs).
    kv_cache_dtype: str = "auto"


@dataclass
class BenchmarkConfig:
    # Registered benchmark: chain | chain_verbose | chain_tail | search (synthetic), gsm8k | math500 | arith |
    # jsonl (packaged or from path), or a user benchmark (docs/extending.md).
    name: str = "chain"
    # Local JSONL/Parquet file or folder, or an HF hub dataset id (real benchmarks only).
    path: Optional[str] = None
    # The split `rredcot train` draws its prompts from.
    train_split: str = "train"
    # The split of `rredcot train`'s held-out evals (train.eval_problems of it).
    eval_split: str = "test"
    # Synthetic benchmarks: number of computed steps per problem, drawn uniformly.
    min_steps: int = setting(4, range="[1, benchmark.max_steps]")
    # Synthetic benchmarks: the most computed steps a problem has.
    max_steps: int = setting(12, range=">= 1")
    # Synthetic benchmarks: the seed problems are generated from (split seeds derive from it).
    data_seed: int = setting(1234, range=">= 0")
    # Seconds the answer verifier may spend on one completion before it counts as unscorable.
    verify_timeout_s: float = setting(5.0, range="> 0", execution=True)
    # benchmark=jsonl (rredcot_cli/benchmarks/jsonl.py): the row fields holding the question, the
    # gold answer and a unique id (null: the row index); the prompt ({question} is replaced;
    # null: the boxed step-by-step prompt); the answer extractor: boxed | last_number | regex | answer_line (first "Answer:" line) |
    # none (the whole completion); answer_regex: its last match (group 1 if it has a group);
    # the verifier: math_verify | exact | numeric (|a-g| <= tolerance * max(1, |g|)) | a
    # function pkg.mod:fn(answer, gold) -> float | bool | None.
    question_field: str = "question"  # jsonl: the row field holding the question
    answer_field: str = "answer"  # jsonl: the row field holding the gold answer
    id_field: Optional[str] = None  # jsonl: the row field holding a unique id; null: the row index
    prompt_template: Optional[str] = None  # jsonl: the prompt, {question} replaced; null: boxed prompt
    extractor: str = "boxed"  # jsonl: boxed | last_number | regex | answer_line | none (the whole completion)
    answer_regex: Optional[str] = None  # jsonl, extractor=regex: its last match (group 1 if any)
    verifier: str = "math_verify"  # jsonl: math_verify | exact | numeric | pkg.mod:fn(answer, gold)
    tolerance: float = setting(1e-6, range=">= 0")  # jsonl, verifier=numeric: |a-g| <= tolerance * max(1, |g|)
    # gsm8k, and jsonl with extractor=last_number: a completion cut off at the token budget
    # (finish_reason "length") is scored only from an explicit final-answer marker (\boxed{},
    # "####", "The final answer is"); true gives it the last-number fallback too (the old rule).
    truncated_last_number: bool = False
    # Keyword arguments for a user benchmark's constructor (docs/extending.md).
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SegmentConfig:
    # The rule (rredcot_cli.segmenters): fixed | newline | keyword | entropy | hybrid.
    name: str = one_of("newline", "fixed", "newline", "keyword", "entropy", "hybrid")
    # fixed: tokens per segment.
    tokens: int = setting(32, range=">= 1")
    # Segments shorter than this (in tokens) are merged into their neighbour (entropy, hybrid:
    # a boundary that would leave one is skipped).
    min_tokens: int = setting(4, range=">= 0")
    # At most this many segments per completion; extra boundaries are merged away (entropy,
    # hybrid: the lowest-entropy ones).
    max_segments: int = setting(40, range=">= 1")
    # keyword, hybrid: discourse markers that start a new segment (case-sensitive, whole words),
    # where they begin a line or follow a sentence end. Same list as segmenters.DEFAULT_KEYWORDS.
    keywords: List[str] = field(
        default_factory=lambda: [
            "Wait", "Alternatively", "Let me", "So", "Therefore", "Thus", "But", "Hmm", "Now",
            "Next", "First", "Then", "Finally", "Hence", "However", "Actually", "Check", "Answer",
        ]  # fmt: skip
    )
    # keyword, hybrid: also split at a keyword in the middle of a sentence.
    keyword_anywhere: bool = False
    # entropy: split at the tokens in this top quantile of the completion's next-token entropies
    # (0.9 = the top 10% of its tokens).
    entropy_quantile: float = setting(0.9, range="[0, 1]")
    # entropy: if set, split at every token whose entropy (nats) exceeds this instead.
    entropy_threshold: Optional[float] = setting(None,
                                                 range=">= 0; entropies are in nats, or null for entropy_quantile")
    # hybrid: a keyword-free segment longer than this (tokens) is cut at its highest-entropy tokens.
    hybrid_max_span: int = setting(64, range=">= 1")


@dataclass
class SamplingConfig:
    # Completions per prompt (the group size G).
    n: int = setting(8, range=">= 1")
    # Sampling temperature of every stage that samples (sample, train, judge's reference).
    temperature: float = setting(1.0, range=">= 0; 0 is greedy")
    # Nucleus sampling: draw from the smallest set of tokens whose probability reaches top_p; 1: all.
    top_p: float = setting(1.0, range="(0, 1]")
    # Token budget of a completion; one cut there has finish_reason "length".
    max_new_tokens: int = setting(256, range=">= 1")


@dataclass
class SampleConfig:
    # The benchmark split `rredcot sample` draws its prompts from.
    split: str = "test"
    # Prompts `rredcot sample` draws (the first of the split), sampling.n completions each.
    num_prompts: int = setting(32, range=">= 1; nothing to sample otherwise")


def signal_number(name: str) -> signal.Signals:
    """``"SIGUSR1"`` / ``"USR1"`` / ``"10"`` -> the signal; ValueError naming the valid ones. How
    ``train.preempt_signals`` reads, for the compose-time check (``ranges.py``) and the handlers
    (``train/preemption.py``)."""
    text = str(name).strip().upper()
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG")
                                                                             else f"SIG{text}"]
    except (KeyError, ValueError):
        raise ValueError(f"train.preempt_signals: unknown signal {name!r}; use names such as SIGTERM, SIGUSR1, "
                         "SIGUSR2, SIGINT") from None


@dataclass
class TrainConfig:
    # RL steps: each samples, credits, updates and refreshes once.
    steps: int = setting(30, range=">= 1")
    # Prompts drawn per step, each with sampling.n completions (one group).
    prompts_per_step: int = setting(8, range=">= 1")
    # Tuned on the embedded default (seed 0, 30 steps): 1e-4 collapsed, 3e-5 cosine was best.
    lr: float = setting(3e-5, range="> 0")
    # After the warmup: constant, linear decay to 0, or cosine decay to 0 over the optimizer steps.
    lr_schedule: str = one_of("cosine", "constant", "linear", "cosine")
    # Optimizer steps over which the learning rate rises linearly from lr / warmup_steps to lr.
    warmup_steps: int = setting(2, range=">= 0")
    # AdamW's decoupled weight decay.
    weight_decay: float = setting(0.0, range=">= 0")
    # AdamW's moment decay rates (beta1, beta2).
    betas: List[float] = setting(default_factory=lambda: [0.9, 0.99], range="[0, 1)")
    # Largest global gradient norm of an optimizer step (clipped above it).
    grad_clip: float = setting(1.0, range=">= 0; 0 turns it off")
    # Policy updates per sampled batch (mu in GRPO) and completions per update.
    updates_per_batch: int = setting(2, range=">= 1")
    # Completions per optimizer step (the batch is shuffled and cut into minibatches).
    minibatch_size: int = setting(32, range=">= 1")
    # The "cancellation hypothesis" batching (arXiv 2605.08666; rredcot_cli/train/batching.py):
    # every minibatch holds whole prompt groups, and/or the batch's mix of positive and negative
    # rollouts (by the sign of the advantage). Off: shuffled rows. experiment=grpo_cancel sets both.
    query_preserved_minibatches: bool = False
    reward_balanced_minibatches: bool = False  # see query_preserved_minibatches
    # The ratio pi/pi_old is clipped to [1 - clip_low, 1 + clip_high] (clip_high > clip_low: DAPO's clip-higher).
    clip_low: float = setting(0.2, range="[0, 1)")
    clip_high: float = setting(0.2, range=">= 0")  # see clip_low
    # Dual clip (verl's clip_ratio_c, 3.0 there): for a negative advantage A the per-token loss is
    # also capped at -clip_ratio_c * A (bounded, no gradient at large ratios); > 1 when on. 0: off.
    clip_ratio_c: float = setting(0.0, range=">= 0; 0 turns it off, otherwise > 1")
    # How a minibatch's per-token losses are averaged: over its tokens | per sequence, then over
    # sequences | divided by max_new_tokens (constant: Dr. GRPO).
    loss_agg: str = one_of("token-mean", "token-mean", "seq-mean-token-mean", "constant")
    # Weight of the KL penalty to the initial policy (0: no reference model is kept).
    kl_coef: float = setting(0.0, range=">= 0")
    kl_estimator: str = one_of("k3", "k1", "k3")  # Schulman's k1 (log ratio) or k3 estimate
    # k3 estimate clamped to [-kl_clamp, kl_clamp], its log ratio to [-20, 20] (verl's low_var_kl:
    # 10). 0: unclamped (Schulman's k3, which keeps its gradient far from the reference).
    kl_clamp: float = setting(0.0, range=">= 0; 0 turns it off")
    # Every this many steps (and at the last), a held-out eval on benchmark.eval_split; 0: only before and after.
    eval_every: int = setting(10, range=">= 0; 0 evaluates only before and after training")
    # Problems of the held-out evals (the first of benchmark.eval_split).
    eval_problems: int = setting(64, range=">= 1")
    # Samples per held-out problem (pass@1 and pass@eval_samples, at sampling.temperature/top_p).
    eval_samples: int = setting(4, range=">= 1")
    # Every this many steps, write checkpoints/step-N: the weights plus everything resuming needs
    # (optimizer, LR scheduler, RNG states, step, metrics so far). 0: only the final checkpoint.
    save_every: int = setting(10, range=">= 0; 0 turns it off", execution=True)
    # An unfinished attempt in this run dir (killed, preempted, interrupted) with the same options:
    # null (default) continues it from its latest checkpoints/step-N and says so (a requeued job
    # reruns the same command); true: the same; false: start over, deleting its checkpoints. An
    # attempt made with other options is refused unless run.overwrite=true or run.tag=NAME. Not hashed.
    resume: Optional[bool] = setting(None, execution=True)
    # Signals that stop the run gracefully (rredcot_cli/train/preemption.py): finish the step in
    # progress, write checkpoints/step-N, print one line, exit with status 75 (EX_TEMPFAIL); under
    # torchrun every rank stops after the same step. Slurm sends SIGTERM at preemption and the
    # signal of --signal=USR1@90 before the time limit; SIGINT is Ctrl-C (status 130; a second one
    # stops at once).
    # []: the signals keep their default. Not hashed.
    preempt_signals: List[str] = setting(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGINT"], execution=True)
    # Stop the run when this many policy updates in a row had a non-finite (NaN/inf) loss or
    # gradient; each is skipped (weights untouched) and logged. 0: never stop. Not hashed.
    max_nonfinite_updates: int = setting(3, range=">= 0; 0 never stops", execution=True)
    # DAPO's dynamic sampling: drop groups whose completions all got the same reward (no outcome
    # signal) and draw the next prompts_per_step problems until prompts_per_step mixed groups are
    # found, at most max_sampling_rounds draws per step (then train on the mixed groups found).
    dynamic_sampling: bool = False
    max_sampling_rounds: int = setting(4, range=">= 1")  # see dynamic_sampling
    # The order training problems are drawn in. null: the split's own order from its start, the
    # first steps x prompts_per_step problems, wrapping around (every run made before this option).
    # A number: the whole train split, shuffled afresh on each pass over it by (this seed, pass),
    # so seeds vary which problems a run sees and in what order, and a resumed run continues the
    # same order (the data cursor is in the checkpoint). Independent of `seed` (sampling, init)
    # and of benchmark.data_seed (which problems a synthetic split holds).
    data_order_seed: Optional[int] = setting(None, range=">= 0; or null for the split's own order")
    # auto | fp32 | bf16-mixed | fp16-mixed | bf16-true (rredcot_cli/train/precision.py). auto follows
    # model.dtype: float32 -> fp32, bfloat16 -> bf16-mixed (float32 master weights + autocast).
    precision: str = one_of("auto", "auto", "fp32", "bf16-mixed", "fp16-mixed", "bf16-true")
    # Recompute each decoder layer's activations in backward instead of keeping them: the same
    # numbers, less memory, one more forward per pass. auto: on where it saves much next to the
    # weights + gradients + AdamW (rredcot_cli/train/memory.py), saying so in one line; true | false.
    gradient_checkpointing: Any = one_of("auto", "auto", True, False, execution=True)
    # Completions per forward/backward pass, gradients accumulated over the minibatch (same
    # update as one pass); 0: the whole minibatch at once. Not hashed (changes memory, not math).
    micro_batch_size: int = setting(0, range=">= 0; 0 turns it off", execution=True)
    # At most this many padded positions (rows x longest prompt + completion) per forward/backward
    # pass; rows are sorted by length before they are cut, so a pass pads little (same update).
    # -1: auto = 1024 on CPU in one process (measured fastest for the embedded model,
    # docs/studies/throughput.md), no limit on GPU or under torchrun; 0: no limit (and no sorting). Not
    # hashed (changes speed and memory, not math).
    micro_batch_tokens: int = setting(-1, range=">= -1; -1 is auto, 0 turns it off", execution=True)
    # Completion positions per chunk of LM head + log-softmax, so full-vocabulary fp32 logits are
    # never held for a whole micro-batch; 0: one pass. Not hashed.
    logprob_chunk_tokens: int = setting(1024, range=">= 0; 0 turns it off", execution=True)
    # Importance weights on the policy-gradient term for the mismatch between the sampler's
    # recorded log-probs and the trainer's (vLLM kernels, precision), rho = pi_trainer / pi_sampler
    # per token, c = sampler_correction_cap (rredcot_cli/train/loss.py, sampler_correction_weights):
    #   none               weight 1 (default)
    #   token_truncate     min(rho_t, c) per token: truncated IS (TIS; TRL's vllm_importance_sampling)
    #   token_mask         rho_t, 0 where rho_t > c: cap-and-mask, a token past the cap dropped, not
    #                      truncated (token-level masked IS, MIS)
    #   sequence_truncate  min(prod_t rho_t, c) for every token of the row
    #   sequence_mask      prod_t rho_t, 0 for the whole row where it is > c (sequence-level MIS)
    #   geometric_mask     1, 0 for the whole row where its geometric-mean ratio exp(mean_t log rho_t)
    #                      is outside [1/c, c] (Geo-Mask; verl's rollout_rs=geometric); needs c > 1
    # The mismatch itself is in the metrics every step either way (mismatch_* columns).
    sampler_correction: str = one_of("none", "none", "token_truncate", "token_mask", "sequence_truncate",
                                     "sequence_mask", "geometric_mask")
    # The cap c of those weights (truncate: clipped to it; mask: tokens or rows past it dropped;
    # geometric_mask: rows outside [1/c, c] dropped); also the ratio above which a token counts in
    # the mismatch_past_cap metric, whichever correction is on.
    sampler_correction_cap: float = setting(2.0, range="> 0; > 1 with train.sampler_correction=geometric_mask")
    # Old log-probs of the policy update: recompute (a pre-update pass over the batch) | sampler
    # (the log-probs the sampler recorded; right only when it is the trained model in the same
    # precision) | auto (sampler with backend=hf, train.precision fp32 and no sampler_correction,
    # where the two differ by float rounding: max |diff| 6.5e-5 nats, docs/studies/throughput.md; else
    # recompute). Without the pass, the entropy metric comes from the first pass's forwards and
    # sampler_kl is null.
    old_logprobs: str = one_of("auto", "auto", "recompute", "sampler")
    # Under torchrun (world size > 1): ddp (DistributedDataParallel, the default) or fsdp2
    # (fully_shard: weights, gradients and optimizer state sharded over ranks); see
    # rredcot_cli/train/distributed.py. Ignored in one process. Not hashed (the same run either way).
    parallel: str = one_of("ddp", "ddp", "fsdp2", execution=True)
    # How long a collective waits for a rank that does not come before the run fails. Not hashed.
    dist_timeout_s: float = setting(1800.0, range="> 0", execution=True)
    # Every this many steps, write that step's samples, segments, credits and advantages under
    # rollouts/step-N/ (laid out as a run dir: sample/, segment/, attribute/<method>/), so heatmap,
    # attribute and judge read them with train.step=N. 0: never. Not hashed.
    save_rollouts: int = setting(5, range=">= 0; 0 never saves them", execution=True)
    # After writing checkpoints/step-N, delete all but the newest this many step-N checkpoints
    # (checkpoints/final is never deleted); 0: keep all. Not hashed.
    keep_checkpoints: int = setting(0, range=">= 0; 0 keeps all", execution=True)
    # heatmap, attribute, judge: work on the rollouts `rredcot train` saved at this step
    # (train.save_rollouts) instead of the run dir's own stage outputs; null: the run dir's.
    # Not hashed; train itself ignores it.
    step: Optional[int] = setting(None, range=">= 1; or null for the run dir's own outputs", execution=True)

    def problems(self) -> List[str]:
        """The checks between train.* options that a range or a choice cannot say, one line each
        (``config.ranges.check_ranges`` raises the first at compose time)."""
        found = []
        if 0 < self.clip_ratio_c <= 1:
            found.append(f"train.clip_ratio_c={self.clip_ratio_c}: the dual clip needs > 1 (verl: 3.0); 0 turns it off")
        if self.sampler_correction == "geometric_mask" and self.sampler_correction_cap <= 1:
            found.append(f"train.sampler_correction_cap={self.sampler_correction_cap}: geometric_mask keeps rows whose "
                         "geometric-mean ratio is in [1/cap, cap], so the cap must be > 1")
        if self.old_logprobs == "sampler" and self.sampler_correction != "none":
            found.append(f"train.old_logprobs=sampler with train.sampler_correction={self.sampler_correction}: the "
                         "correction compares the sampler's log-probs with recomputed ones; use recompute or auto")
        return found


@dataclass
class CriticConfig:
    # The learned value function of methods that need one (ppo): a copy of the policy's body
    # with a linear value head, trained on the GAE returns after every policy update. Other
    # methods ignore this group (and it is not part of their config hash).
    lr: float = setting(3e-4, range="> 0")  # 10x train.lr, the actor/critic ratio of verl's PPO examples (1e-6 / 1e-5)
    # passes over the batch per policy update
    updates_per_batch: int = setting(2, range=">= 0; 0 never trains the critic")
    minibatch_size: int = setting(32, range=">= 1")  # completions per critic optimizer step
    # PPO's clipped value loss around the old values (verl default); 0: off
    value_clip: float = setting(0.5, range=">= 0; 0 turns it off")
    grad_clip: float = setting(1.0, range=">= 0; 0 turns it off")  # largest gradient norm of a critic step
    weight_decay: float = setting(0.0, range=">= 0")  # AdamW's weight decay for the critic
    # Where its weights start: "policy" (the policy's body and a zero head, so V = 0 at first;
    # VinePPO's PPO baseline also starts the critic from the policy) or a critic.pt written by
    # `rredcot train` (checkpoints/final/critic.pt), e.g. to attribute with a trained critic.
    init: str = "policy"


@dataclass
class EvalConfig:
    # `rredcot eval`: the benchmark split evaluated.
    split: str = "test"
    # Problems evaluated (the first of the split).
    num_problems: int = setting(128, range=">= 1; nothing to evaluate otherwise")
    # Samples per problem.
    n: int = setting(8, range=">= 1")
    # The k of each pass@k reported (unbiased estimator over the n samples; each k <= n).
    k: List[int] = setting(default_factory=lambda: [1, 4, 8],
                           range="[1, eval.n]; pass@k and maj@k take k of the n samples")
    # Sampling temperature and nucleus top_p of the eval's samples.
    temperature: float = setting(1.0, range=">= 0; 0 is greedy")
    top_p: float = setting(1.0, range="(0, 1]")  # see temperature


@dataclass
class SFTConfig:
    # Defaults reproduce the shipped rredcot_cli/assets/tiny-chain (see its training.json).
    steps: int = setting(800, range=">= 1")  # optimizer steps
    batch_size: int = setting(64, range=">= 1")  # examples per step
    lr: float = setting(1e-3, range="> 0")  # AdamW's peak learning rate (cosine decay to 10% of it after the warmup)
    weight_decay: float = setting(0.01, range=">= 0")  # AdamW's weight decay (matrices only)
    grad_clip: float = setting(1.0, range="> 0")  # largest gradient norm of a step
    warmup_steps: int = setting(50, range=">= 0")  # steps of linear learning-rate warmup
    # Chain lengths of the SFT data (RL and eval default to 4-12 steps).
    min_steps: int = setting(2, range="[1, sft.max_steps]")
    max_steps: int = setting(20, range=">= 1")  # see min_steps
    # Each step of an SFT solution is miscomputed with this probability, so the model learns to
    # make occasional errors and sampled accuracy leaves room for RL (greedy stays near 100%).
    solution_error_rate: float = setting(0.08, range="[0, 1]")
    # Continue from this model instead of training from scratch: a model folder written by
    # `rredcot sft`, or a shipped model's name (tiny-chain). The architecture below is then unused.
    init: Optional[str] = None
    # Rehearsal: this fraction of the examples comes from another synthetic benchmark (e.g.
    # mix_benchmark=chain while fine-tuning on chain_verbose keeps the compact `a+b=c` lines, and
    # with them the arithmetic, in practice). Its problems use data_seed + 1, the same lengths.
    mix_benchmark: Optional[str] = None
    mix_fraction: float = setting(0.0, range="[0, 1)")  # see mix_benchmark
    # Batch examples of similar length together (within windows of 32 batches, batch order
    # shuffled): the same examples with less padding, which matters for long lines.
    group_by_length: bool = False
    # Architecture of the model trained from scratch.
    hidden_size: int = setting(128, range=">= 1")  # width of the residual stream
    num_layers: int = setting(6, range=">= 1")  # decoder layers
    num_heads: int = setting(4, range=">= 1")  # attention heads per layer
    intermediate_size: int = setting(512, range=">= 1")  # width of each MLP
    max_position_embeddings: int = setting(2048, range=">= 1")  # longest sequence (tokens) the model takes


@dataclass
class HeatmapConfig:
    # Completions to render (one card / figure row each).
    samples: int = setting(8, range=">= 1")
    # mixed (half correct, half incorrect, prompts with mixed groups first) | incorrect | correct | first
    select: str = "mixed"
    # Only these prompts (in this order); the selection rule then picks among their completions.
    prompt_ids: Optional[List[str]] = None
    # Only this sample index of each prompt.
    sample_idx: Optional[int] = setting(None, range=">= 0; or null for every sample")
    # What colours the HTML tokens: advantage (token advantage) | credit (the segment's credit).
    color_by: str = "advantage"


@dataclass
class JudgeConfig:
    # Credit methods to judge (registered names); null = every registered method. Each runs with
    # its conf/method/<name>.yaml defaults, changed by judge.params.
    methods: Optional[List[str]] = None
    # Per-method parameters over those defaults: +judge.params.rredcot.value=answer_probe
    params: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # Continuations per segment boundary of the Monte Carlo reference values (sampled like
    # sampling.*); standard error <= 0.5 / sqrt(reference_k).
    reference_k: int = setting(16, range=">= 1")
    # Runs of each method with different seeds (torch's and the method's own seed parameters),
    # for the spread of its advantages.
    reruns: int = setting(3, range=">= 1")
    # Independent batches the saved traces are cut into (whole prompt groups, in order): every
    # column is computed per batch and the table shows its mean with a 95% interval over them.
    batches: int = setting(1, range=">= 1")


@dataclass
class Config:
    # The one seed every other seed derives from (rredcot_cli/rng.py).
    seed: int = setting(0, range=">= 0")
    run: RunConfig = field(default_factory=RunConfig)  # the run folder
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy's weights and tokenizer
    backend: BackendConfig = field(default_factory=BackendConfig)  # what samples from it
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)  # the problems and their verifier
    segment: SegmentConfig = field(default_factory=SegmentConfig)  # how completions are cut into segments
    # Checked against the chosen method's declared parameters after composition.
    method: Any = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # group size and decoding
    sample: SampleConfig = field(default_factory=SampleConfig)  # `rredcot sample`
    train: TrainConfig = field(default_factory=TrainConfig)  # `rredcot train`
    critic: CriticConfig = field(default_factory=CriticConfig)  # ppo's learned value function
    eval: EvalConfig = field(default_factory=EvalConfig)  # `rredcot eval`
    sft: SFTConfig = field(default_factory=SFTConfig)  # `rredcot sft`
    heatmap: HeatmapConfig = field(default_factory=HeatmapConfig)  # `rredcot heatmap`
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # `rredcot judge`
    # Explicit input artifacts, overriding the run dir's (e.g. inputs.samples=/path/samples.parquet).
    inputs: Any = field(default_factory=dict)
    # Experiment trackers `rredcot train` logs each step's metrics to, through their own libraries
    # (rredcot_cli/train/tracking.py): tensorboard, wandb, trackio, mlflow; e.g. tracking=[tensorboard].
    # Not part of any config hash.
    tracking: List[str] = field(default_factory=list)
    # Python modules (pkg.mod) or .py files imported when the config is composed, registering
    # credit methods and benchmarks of the user's own (rredcot_cli/plugins.py, docs/extending.md).
    # Installed plugins need not be named: their entry points are found by themselves.
    plugins: List[str] = field(default_factory=list)


# --------------------------------------------------------------------------- run identity

def _declared(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf field of the schema instance ``node`` by dotted key, with its ``dataclasses.Field``."""
    found = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        found += _declared(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [(prefix + f.name, f)]
    return found


# How a run executes, not what it computes (``setting(..., execution=True)`` on each field): the
# one rule for which keys name a run. A training run's identity (its config hash and config.yaml,
# where these sit at their defaults) leaves them out, so a resumed run, or one with smaller
# micro-batches or more threads, is the same run; and `rredcot report` never splits groups by them
# (also for runs written before a key was marked).
EXECUTION_KEYS: frozenset = frozenset(key for key, f in _declared(Config()) if f.metadata.get("execution"))


# --------------------------------------------------------------------------- ranges

# The meaningful range of every numeric option (``setting(..., range=...)`` on each field),
# checked once after composition (``rredcot_cli.config.ranges.check_ranges``), so an out-of-range
# value fails in one line before anything loads or runs. A spec is ``">= 1"``, ``"> 0"``,
# ``"<= 1"``, ``"< 1"`` or an interval ``"[0, 1)"``, optionally followed by ``"; note"`` (shown in
# the message); a bound may be another option (``"[1, eval.n]"``; a method parameter's, another
# parameter's name). A list option's entries are each checked; a null (Optional) value is not.
# tests/test_strict_inputs.py fails when a numeric field has none. Method parameters declare
# theirs with their registry entry (``register(..., ranges=...)`` in ``rredcot_cli.methods``).
RANGES: Dict[str, str] = {key: f.metadata["range"] for key, f in _declared(Config()) if "range" in f.metadata}

# Options that must divide another: (key, divisor key).
DIVISIBLE_BY: List[tuple] = [
    ("sft.hidden_size", "sft.num_heads"),  # attention heads split the hidden size evenly
]
