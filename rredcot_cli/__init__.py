"""rredcot: segment-level credit assignment for RL of reasoning language models.

Importing this package is cheap on purpose: torch, transformers and vllm are imported only by
the stages that need them.
"""

__version__ = "0.1.0"
