"""The training core: reference LoRA runs on tiny models of every layout, and ``train-smoke`` around them.

Everything here needs the ML extra (torch, transformers, peft, accelerate, tokenizers); import the submodules
(``adapterdoc.train.loop``, ``adapterdoc.train.smoke``) only where that is available.
"""
