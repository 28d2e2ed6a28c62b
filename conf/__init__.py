"""Hydra config tree of rredcot: the repository's ``conf/``, installed as the package
``rredcot_cli.conf`` (pyproject's package-dir) and found by ``rredcot_cli.config.compose.CONF_DIR``.

``config.yaml`` is the primary config; each folder is a config group. The typed schema
``rredcot_cli.config.schema.Config`` is stored in Hydra's ConfigStore as ``rredcot_schema`` and is the
first entry of the defaults list, so a misspelled key in any YAML file or override fails at
compose time.
"""
