"""The training core: settings, models and heads, objectives, the accelerate loop and its records, the rows and
their encoding, and opening a user's own base. The runs of `adapterdoc train` and `adapterdoc eval` (training,
then the doctor on the output) are :mod:`adapterdoc.fit`.

Everything here needs the ML extra (torch, transformers, peft, accelerate, tokenizers) when it runs; import the
submodules (``adapterdoc.train.loop``, ...) only where that is available.
`adapterdoc train-smoke`, the doctor around the reference runs, is :mod:`adapterdoc.smoke`.
"""
