"""Training: the RL loop of ``rredcot train`` and the supervised fine-tuning of ``rredcot sft``.

- ``rredcot_cli.train.loop``: ``Trainer``, the loop (its docstring says what the algorithm is);
- ``rredcot_cli.train.checkpoint``: the resumable state (``TrainState``) and checkpoints on disk;
- ``rredcot_cli.train.update``, ``loss``: one policy update and its clipped-ratio loss;
- ``rredcot_cli.train.critic``: PPO's learned value function;
- ``rredcot_cli.train.precision``, ``trainable``, ``distributed``: dtypes and optimizer steps, the
  trained weights (LoRA, reference), data parallelism;
- ``rredcot_cli.train.steptime``, ``tracking``: where a step's time goes, experiment trackers;
- ``rredcot_cli.train.preemption``: a signal stops the run after its step, with a checkpoint;
- ``rredcot_cli.train.sft``: supervised fine-tuning of the tiny model.
"""
