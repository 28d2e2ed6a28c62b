"""The policy: the model being sampled and trained, and everything that runs it.

- ``rredcot_cli.policy.load``: the model, its tokenizer and a sampling backend (``Policy``);
- ``rredcot_cli.policy.base``: the backend protocol; ``hf`` and ``vllm`` implement it;
- ``rredcot_cli.policy.continuations``: the MC/judge continuation sampler of the HF backend;
- ``rredcot_cli.policy.logprobs``, ``kvcache``, ``shared_prompt``: teacher-forced log-probs and the
  decode caches;
- ``rredcot_cli.policy.models``, ``model_files``, ``weights``: the embedded tiny model, GGUF and
  packaged model files, and the weights as a plain HF checkpoint names them.
"""
