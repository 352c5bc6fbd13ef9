"""adapterdoc: a doctor and converter for LoRA adapter checkpoints."""

__version__ = "0.1.0"
