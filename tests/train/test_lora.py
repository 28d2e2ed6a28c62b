"""LoRA through peft on the embedded model: only the adapters train, merged weights equal the
adapter model, the reference is the base with adapters off, checkpoints round-trip, and
`rredcot train model.lora.r=...` writes a plain merged HF folder plus the adapter."""

from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("peft")

from rredcot_cli.train import trainable  # noqa: E402
from rredcot_cli.policy.logprobs import completion_logprobs  # noqa: E402
from rredcot_cli.policy.models import load_model_and_tokenizer  # noqa: E402
from rredcot_cli.train.precision import GradientStepper, resolve_precision  # noqa: E402
from rredcot_cli.train.loss import LossSettings  # noqa: E402
from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update  # noqa: E402
from rredcot_cli.policy.logprobs import ForwardPass  # noqa: E402
from rredcot_cli.policy.weights import hf_weights  # noqa: E402
from tests.test_smoke import rredcot  # noqa: E402  (the CLI in a subprocess)

LORA = trainable.LoraSettings(r=4, alpha=8.0, dropout=0.0, target_modules=("all-linear",))


@pytest.fixture(scope="module")
def embedded():
    return load_model_and_tokenizer("embedded")


@pytest.fixture(scope="module")
def batch(embedded):
    _, tok = embedded
    prompts = [tok(t)["input_ids"] for t in ["Compute mod 10: 3 +4 *2\n", "Compute mod 10: 9 -1\n"]] * 2
    completions = [tok(t)["input_ids"] + [tok.eos_token_id] for t in
                   ["3+4=7\n7*2=4\nAnswer: 4", "9-1=8\nAnswer: 8", "3+4=7\n7*2=5\nAnswer: 5", "9-1=7\nAnswer: 7"]]
    advantages = torch.zeros(4, max(len(c) for c in completions))
    for i, (c, a) in enumerate(zip(completions, [1.0, 1.0, -1.0, -1.0])):
        advantages[i, : len(c)] = a
    return prompts, completions, advantages


def _lora_model(embedded, precision="fp32"):
    torch.manual_seed(0)  # LoRA's A matrices start random
    model = copy.deepcopy(embedded[0])
    return trainable.prepare(model, resolve_precision(precision, "float32"), gradient_checkpointing=False, lora=LORA)


def _train(model, batch, steps=2):
    prompts, completions, advantages = batch
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    policy_update(
        model, opt, sched,
        UpdateBatch(prompt_ids=prompts, completion_ids=completions, advantages=advantages, pad_id=0),
        UpdateHyper(updates_per_batch=steps, minibatch_size=4, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                    loss_agg="token-mean", max_tokens=32)),
        UpdateEngine(generator=torch.Generator().manual_seed(0), forward=ForwardPass(chunk_tokens=16),
                     stepper=GradientStepper(resolve_precision("fp32", "float32"))))


def _logprobs(model, batch):
    with torch.no_grad():
        return completion_logprobs(model, batch[0], batch[1], 0, False)[0]


def test_only_the_adapters_train(embedded, batch):
    model = _lora_model(embedded, "bf16-mixed")
    trainable_params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable_params and all(".lora_" in n for n in trainable_params)
    assert {p.dtype for p in trainable_params.values()} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if not p.requires_grad} == {torch.bfloat16}

    model = _lora_model(embedded)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train(model, batch)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)  # B starts at zero: moving it changes the function


def test_merged_weights_equal_the_adapter_model_and_leave_it_untouched(embedded, batch):
    model = _lora_model(embedded)
    _train(model, batch)
    live = {n: p.detach().clone() for n, p in model.named_parameters()}
    with hf_weights(model) as weights:
        merged = dict(weights)
    assert set(merged) == set(embedded[0].state_dict())  # plain HF names, no lora_ / base_layer
    assert all(torch.equal(p, live[n]) for n, p in model.named_parameters())  # merging was out of place
    plain = copy.deepcopy(embedded[0])
    plain.load_state_dict(merged)
    assert torch.allclose(_logprobs(plain, batch), _logprobs(model, batch), atol=1e-4)
    assert not torch.allclose(_logprobs(embedded[0], batch), _logprobs(model, batch), atol=1e-3)


def test_reference_is_the_base_with_adapters_off(embedded, batch):
    model = _lora_model(embedded)
    _train(model, batch)
    ref, ref_forward = trainable.reference(model, resolve_precision("fp32", "float32"), ForwardPass())
    assert ref is model  # no copy
    with torch.no_grad():
        off, _, _ = ref_forward.logprobs(ref, batch[0], batch[1], 0, False)
    assert torch.allclose(off, _logprobs(embedded[0], batch), atol=1e-6)
    assert not torch.allclose(_logprobs(model, batch), off, atol=1e-3)  # and the adapters are back on


def test_adapter_checkpoint_round_trip_and_merged_export(embedded, batch, tmp_path):
    from transformers import AutoModelForCausalLM

    model = _lora_model(embedded)
    _train(model, batch)
    trainable.save_trained_weights(model, tmp_path / "step")
    assert (tmp_path / "step" / "adapter_model.safetensors").is_file()
    fresh = _lora_model(embedded)
    trainable.load_trained_weights(fresh, tmp_path / "step")
    assert torch.equal(_logprobs(fresh, batch), _logprobs(model, batch))
    with pytest.raises(ValueError, match="no LoRA adapter"):
        trainable.load_trained_weights(fresh, tmp_path)

    (tmp_path / "final").mkdir()
    trainable.export_checkpoint(model, embedded[1], tmp_path / "final", torch.float32)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "final")  # plain transformers, no peft
    assert torch.allclose(_logprobs(exported, batch), _logprobs(model, batch), atol=1e-4)
    assert json.loads((tmp_path / "final" / "adapter" / "adapter_config.json").read_text())["r"] == 4


def test_train_with_lora_end_to_end(tmp_path):
    run = tmp_path / "run"
    rredcot("train", f"run.dir={run}", "experiment=quick", "model.lora.r=4", "train.kl_coef=0.05",
            "train.save_every=1", "train.lr=1e-3", cwd=tmp_path)
    final = run / "train" / "checkpoints" / "final"
    assert (final / "model.safetensors").is_file() and (final / "adapter" / "adapter_model.safetensors").is_file()
    config = json.loads((final / "config.json").read_text())
    assert "lora" not in json.dumps(config).lower()
    from safetensors.torch import load_file

    names = set(load_file(final / "model.safetensors"))
    assert not any("lora_" in n or "base_layer" in n for n in names)
    step = run / "train" / "checkpoints" / "step-000001"
    assert (step / "adapter_model.safetensors").is_file() and (step / "trainer_state.pt").is_file()


def test_the_trainer_keeps_the_stage_policy_as_built_and_trains_its_own(tmp_path, monkeypatch):
    """The loop's weights go by one name per role: ``trainer.policy.model`` is the prepared (here
    LoRA-wrapped) model the loop samples, scores and saves; the Policy the stage loaded still holds
    the model it loaded (the loop used to overwrite its ``model``), and both share one backend."""
    from rredcot_cli.config.compose import compose
    from rredcot_cli.stages import train as stage

    seen = {}
    real_init = stage.Trainer.__init__

    def init(self, settings, *, policy, **kwargs):
        seen["built"], seen["loaded"] = policy, policy.model
        real_init(self, settings, policy=policy, **kwargs)

    class Built(Exception):
        pass

    def fit(self, preempt):
        seen["trainer"] = self
        raise Built

    monkeypatch.setattr(stage.Trainer, "__init__", init)
    monkeypatch.setattr(stage.Trainer, "fit", fit)
    with pytest.raises(Built):
        stage.run(compose([f"run.dir={tmp_path / 'run'}", "experiment=quick", "model.lora.r=4"]), [])
    trainer, built = seen["trainer"], seen["built"]
    assert built.model is seen["loaded"]
    assert trainer.policy is not built and trainer.policy.backend is built.backend
    assert trainer.policy.model is not seen["loaded"] and trainer.policy.model.peft_config
