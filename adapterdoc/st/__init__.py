"""safetensors without tensors: header reading and validation, header rewrites, atomic writes."""
