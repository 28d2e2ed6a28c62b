"""The config: the typed schema every option is declared in (with what it means), and the
composition of command-line overrides into one validated config.

- ``rredcot_cli.config.schema``: the dataclasses Hydra validates against, ranges, execution keys;
- ``rredcot_cli.config.compose``: argv -> one resolved config, config hashes;
- ``rredcot_cli.config.search``: where config files are found, each group's options and defaults;
- ``rredcot_cli.config.messages``: Hydra's and OmegaConf's errors as one-line ``ConfigError`` messages;
- ``rredcot_cli.config.ranges``: the numeric ranges of options and method parameters, checked.

Importing this package imports nothing: ``rredcot --help`` reads only ``search``'s option lists.
"""
