"""The config: the typed schema every option is declared in (with what it means), and the
composition of command-line overrides into one validated config.

- ``rredcot_cli.config.schema``: the dataclasses Hydra validates against, ranges, execution keys;
- ``rredcot_cli.config.compose``: argv -> one resolved config, one-line errors, config hashes.

Importing this package imports nothing: ``rredcot --help`` reads only ``compose``'s option lists.
"""
