"""An offline chat tokenizer for tiny bases: byte-level BPE trained on given texts, wrapped as a transformers
``PreTrainedTokenizerFast`` with a Jinja chat template that marks assistant turns with ``{% generation %}``.

The fixture model folders (``fixtures/make_models.py``) save one beside their weights; ``train --base tiny:LAYOUT``
builds one from the training rows. Special-token ids are the positions in :data:`SPECIALS` (pad 0, bos 1, eos 2,
mask 3), which is what the tiny configs name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adapterdoc.train.data import SPECIALS, TOKENIZER_VOCAB

SYSTEM = "<|system|>"
CHAT_SPECIALS = (*SPECIALS, SYSTEM)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{- message['content'] + '<|end|>' -}}{% endgeneration %}{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)
"""Roles as ``<|role|>`` tokens, turns closed by ``<|end|>``; the assistant's content and closing token are
inside the generation markers, so ``return_assistant_tokens_mask`` supervises exactly those."""


def chat_tokenizer(texts: Iterable[str], vocab_size: int = TOKENIZER_VOCAB) -> Any:
    """A deterministic byte-level BPE chat tokenizer trained on ``texts`` (no hub, no files)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sorted(set(texts)), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIALS[0],
        bos_token=SPECIALS[1],
        eos_token=SPECIALS[2],
        mask_token=SPECIALS[3],
        additional_special_tokens=list(CHAT_SPECIALS[4:]),
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
