"""AD1xx: file-format findings (non-fatal ones; unusable files are errors with exit code 3)."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD100",
        "input-unusable",
        "error",
        "An input cannot be used: missing, unreadable, corrupt, unsupported, or the operation was refused to "
        "protect data. The command exits with code 3 and changes nothing.",
        "A gate that crashes or half-writes on bad input is worse than none; exit 3 tells CI that the input, "
        "not the adapter's quality, is the problem.",
        "adapterdoc: error: adapter_model.safetensors: header too large: 4294967296 bytes announced",
        "Fix or replace the input named in the message; with --json the same text is in `error`.",
    ),
    Code(
        "AD101",
        "mixed-dtypes",
        "info",
        "The file holds tensors of more than one dtype.",
        "Adapters are normally saved in one dtype. A mix (say F32 lora_A with BF16 lora_B) usually means part of the "
        "state was cast by a trainer callback or a hand edit, and merged results will round differently per module.",
        "lora_A tensors F32, lora_B tensors BF16",
        "Re-save the adapter from the trained model in one dtype, or accept the mix knowingly.",
    ),
    Code(
        "AD102",
        "metadata-format-not-pt",
        "warning",
        "`__metadata__` has no `format` entry, or one that is not pt/tf/flax/mlx.",
        "Older transformers readers refuse a safetensors file whose `format` metadata is missing or unknown; PEFT "
        'always writes `{"format": "pt"}`.',
        '__metadata__ = {"source": "my-script"}',
        'Write the file with `safetensors.torch.save_file(..., metadata={"format": "pt"})`.',
    ),
    Code(
        "AD103",
        "pickle-weights",
        "warning",
        "The adapter weights are a pickle (`adapter_model.bin`), not safetensors.",
        "Pickles can run code when loaded by tools that do not use `weights_only=True`; several servers and "
        "hubs refuse or flag them. adapterdoc only reads them with `torch.load(weights_only=True)`.",
        "adapter_model.bin without adapter_model.safetensors",
        "Convert: `adapterdoc remap ADAPTER --rule '^$=>' --out NEW_DIR` writes adapter_model.safetensors.",
    ),
    Code(
        "AD104",
        "shard-index-mismatch",
        "warning",
        "A shard holds tensors that its index does not list.",
        "Loaders follow the index: tensors missing from it are silently ignored, so the checkpoint is not what "
        "its files suggest.",
        "model-00002.safetensors has `lm_head.weight`, weight_map does not name it",
        "Regenerate the index from the shards' headers.",
    ),
    Code(
        "AD105",
        "empty-file",
        "warning",
        "The safetensors file holds no tensors.",
        "An empty adapter file loads without error and changes nothing.",
        "adapter_model.safetensors with header `{}`",
        "Check that the trainer saved the adapter state (ZeRO-3 needs a gathered state dict).",
    ),
]
