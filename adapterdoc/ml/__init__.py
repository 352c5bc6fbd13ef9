"""torch-side helpers: tiny reference models, meta-device bases, PEFT injection, real loads. Imports torch."""
