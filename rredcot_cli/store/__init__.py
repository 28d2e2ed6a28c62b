"""The run store: run folders and their manifests, the Parquet artifacts stages exchange, atomic
writes, and the training rollouts kept on disk. Nothing here imports torch.

- ``rredcot_cli.store.atomic``: a file or folder appears whole under its name or not at all;
- ``rredcot_cli.store.lock``: one writer per stage folder (a ``flock`` the kernel drops when its process dies);
- ``rredcot_cli.store.runs``: run folders, manifests, the stage life cycle, input lookup;
- ``rredcot_cli.store.hashing``: config hashes (``config_hash``) and the settings they leave out;
- ``rredcot_cli.store.artifacts``: the artifact schemas and the only code that reads or writes them;
- ``rredcot_cli.store.train_rollouts``: what the train loop sampled and credited at a step, on disk.
"""
