"""The vLLM backend (GPU): fast sampling with per-token log-probs, prompt-logprob scoring, and
in-place weight updates from the policy being trained.

Importing this module does not import vLLM; the constructor does. The contract is the one in
``backends/base.py`` and matches ``HFBackend``:

* prompts are tokenized here with the HF tokenizer exactly as ``HFBackend.encode_prompts`` does
  and sent as token ids, so both backends see the same prompt tokens;
* each of the ``n`` samples of a prompt is its own request with its own seed, derived from
  ``(seed, prompt index, sample index)``, so results do not depend on vLLM's fan-out of ``n``;
* log-probs of generated tokens are those of the sampling distribution (temperature and top-p
  applied: ``logprobs_mode="processed_logprobs"``, vLLM >= 0.10.2; older versions return raw
  temperature-1 log-probs and a warning says so);
* ``score`` returns teacher-forced temperature-1 log-probs from ``prompt_logprobs``; entropies are
  not available (vLLM only returns top-k log-probs), use the HF model for those;
* ``sync_weights`` calls the vLLM model's ``load_weights`` with the policy's HF ``state_dict``:
  directly on the in-process model when there is one (tensor_parallel_size=1, where this backend
  runs the V1 engine in-process via ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set otherwise), else
  through ``LLM.apply_model`` on every worker; then the prefix cache is reset.

NOT RUN HERE: this module was written and reviewed without a GPU or vLLM installed; its test
(tests/test_vllm_backend.py) skips without CUDA and vLLM. The attribute paths used to reach the
model follow vLLM's V0 layout (``driver_worker.model_runner.model``), the V1 in-process layout
(``driver_worker.worker.model_runner.model``, as TRL's colocate mode) and ``LLM.apply_model``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from rredcot_cli.backends.base import Completion, SamplingParams

_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "fp16": "float16", "float16": "float16", "auto": "auto"}


def request_seed(seed: int, prompt_index: int, sample_index: int, n: int) -> int:
    """The vLLM seed of sample ``sample_index`` of prompt ``prompt_index`` (fits in 31 bits)."""
    return (seed * 1_000_003 + prompt_index * n + sample_index) % (2**31 - 1)


class _LoadWeights:
    """Picklable callable for ``LLM.apply_model``: loads HF-named CPU tensors into a vLLM model."""

    def __init__(self, weights: list[tuple[str, Any]]):
        self.weights = weights

    def __call__(self, model) -> None:
        model.load_weights(self.weights)


class VLLMBackend:
    """Backend on a ``vllm.LLM`` engine (see ``backends/base.py`` for the contract)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        seed: int = 0,
        trust_remote_code: bool = False,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
        if tensor_parallel_size == 1:
            # Keep the engine core in this process so sync_weights can reach the model directly.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        else:
            # sync_weights sends a callable (with the weights) to the worker processes.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("backend=vllm needs vLLM on a CUDA machine: pip install 'rredcot[vllm]'") from exc
        from transformers import AutoTokenizer

        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=_DTYPES[dtype],
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            seed=seed,
            trust_remote_code=trust_remote_code,
            logprobs_mode="processed_logprobs",
        )
        self.processed_logprobs = True
        try:
            self.llm = vllm.LLM(**kwargs)
        except TypeError as exc:
            if "logprobs_mode" not in str(exc):
                raise
            kwargs.pop("logprobs_mode")
            self.processed_logprobs = False
            self.llm = vllm.LLM(**kwargs)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.model_path = model_path

    # -- helpers -------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        """Prompt token ids exactly as ``HFBackend.encode_prompts`` makes them."""
        return [self.tokenizer(p)["input_ids"] for p in prompts]

    # -- generate ------------------------------------------------------------------------
    def generate(self, prompts: list[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        """``params.n`` completions per prompt (temperature 0: greedy).

        Log-probs are those of the sampling distribution (see the module docstring).
        """
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        sampling = params.temperature > 0
        if sampling and not self.processed_logprobs and (params.temperature != 1.0 or params.top_p < 1.0):
            warnings.warn(
                "this vLLM has no logprobs_mode: sampled-token log-probs are raw (temperature 1, "
                "no top-p), not those of the sampling distribution",
                stacklevel=2,
            )
        requests, request_params = [], []
        for i, ids in enumerate(self.encode_prompts(prompts)):
            for j in range(params.n):
                requests.append(TokensPrompt(prompt_token_ids=list(ids)))
                request_params.append(
                    VllmSamplingParams(
                        n=1,
                        temperature=params.temperature if sampling else 0.0,
                        top_p=params.top_p if sampling else 1.0,
                        max_tokens=params.max_new_tokens,
                        logprobs=0,  # the sampled token's log-prob only
                        seed=request_seed(seed, i, j, params.n) if sampling else None,
                        detokenize=False,  # text is decoded below with the HF tokenizer
                    )
                )
        outputs = self.llm.generate(requests, request_params, use_tqdm=False)
        flat = [self._completion(out.outputs[0]) for out in outputs]
        return [flat[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _completion(self, out) -> Completion:
        ids = [int(t) for t in out.token_ids]
        if out.logprobs is None or len(out.logprobs) != len(ids):
            raise RuntimeError("vLLM returned no per-token log-probs for a completion")
        logprobs = [float(out.logprobs[k][tok].logprob) for k, tok in enumerate(ids)]
        reason = "stop" if out.finish_reason == "stop" else "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(token_ids=ids, logprobs=logprobs, text=text, finish_reason=reason)

    # -- score ---------------------------------------------------------------------------
    def score(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        with_entropy: bool = False,
    ):
        """Teacher-forced temperature-1 log-probs of each completion token, from vLLM's
        ``prompt_logprobs`` on ``prompt + completion``. Returns ``(list of float32 CPU tensors, None)``.
        """
        import torch
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        if with_entropy:
            raise NotImplementedError(
                "VLLMBackend.score(with_entropy=True): vLLM returns only top-k prompt log-probs, so "
                "full-distribution entropies are not available; score with the HF model instead"
            )
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
        todo = [i for i, c in enumerate(completion_ids) if len(c) > 0]
        for i in todo:
            if len(prompt_ids[i]) == 0:
                raise ValueError(f"row {i}: an empty prompt gives no context for the first completion token")
        params = VllmSamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        requests = [TokensPrompt(prompt_token_ids=list(prompt_ids[i]) + list(completion_ids[i])) for i in todo]
        outputs = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        result = [torch.zeros(0, dtype=torch.float32) for _ in completion_ids]
        for i, out in zip(todo, outputs):
            start = len(prompt_ids[i])
            plp = out.prompt_logprobs  # one entry per token of prompt+completion; [0] is None
            values = [plp[start + k][tok].logprob for k, tok in enumerate(completion_ids[i])]
            result[i] = torch.tensor(values, dtype=torch.float32)
        return result, None

    # -- weights -------------------------------------------------------------------------
    def _local_model(self):
        """The vLLM model object when it lives in this process (V1 in-process or V0), else None."""
        executor = getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)
        driver = getattr(executor, "driver_worker", None)
        for worker in (getattr(driver, "worker", None), driver):  # V1 wraps the worker; V0 does not
            runner = getattr(worker, "model_runner", None)
            if runner is None:
                continue
            # get_model() unwraps CUDA-graph wrappers where the runner has it (V1).
            model = runner.get_model() if hasattr(runner, "get_model") else getattr(runner, "model", None)
            if model is not None and hasattr(model, "load_weights"):
                return model
        return None

    def sync_weights(self, model) -> None:
        """Copy the weights of ``model`` (an HF causal LM, the policy) into the vLLM engine."""
        import torch

        model = getattr(model, "module", model)  # unwrap DDP-style wrappers
        with torch.no_grad():
            weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
            local = self._local_model()
            if local is not None:
                local.load_weights(weights)
            elif hasattr(self.llm, "apply_model"):
                self.llm.apply_model(_LoadWeights([(name, t.to("cpu")) for name, t in weights]))
            else:
                raise RuntimeError(
                    "cannot reach the vLLM model to update its weights: this vLLM has neither an "
                    "in-process driver worker nor LLM.apply_model"
                )
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
