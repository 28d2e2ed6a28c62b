"""Hooks that put rredcot's credit into other trainers (``trl``: TRL's ``GRPOTrainer``); each
imports its trainer, so import the one you use (``rredcot_cli.integrations.trl``)."""
