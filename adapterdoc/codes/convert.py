"""AD8xx: format-conversion findings (`adapterdoc convert`, and inspect/verify of MLX and GGUF adapters).

AD800-AD849 belong to PEFT ⇄ MLX (``convert_mlx``), AD850-AD899 to PEFT ⇄ GGUF (``convert_gguf``): two lists so the
two formats' codes are written side by side without touching each other.
"""

from adapterdoc.codes.convert_gguf import CODES as GGUF_CODES
from adapterdoc.codes.convert_mlx import CODES as MLX_CODES

CODES = [*MLX_CODES, *GGUF_CODES]
