"""The training core: settings, models and heads, objectives, the accelerate loop and its records, the rows and
their encoding, and the runs on a user's own base (`adapterdoc train`, `adapterdoc eval`).

Everything here needs the ML extra (torch, transformers, peft, accelerate, tokenizers) when it runs; import the
submodules (``adapterdoc.train.loop``, ``adapterdoc.train.session``, ...) only where that is available.
`adapterdoc train-smoke`, the doctor around the reference runs, is :mod:`adapterdoc.smoke`.
"""
