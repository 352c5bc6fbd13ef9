"""An offline chat tokenizer for tiny bases: byte-level BPE trained on given texts, wrapped as a transformers
``PreTrainedTokenizerFast`` with a Jinja chat template that marks assistant turns with ``{% generation %}``.

The fixture model folders (``fixtures/make_models.py``) save one beside their weights; ``train --base tiny:LAYOUT``
builds one from the training rows. Special-token ids are the positions in :data:`SPECIALS` (pad 0, bos 1, eos 2,
mask 3), which is what the tiny configs name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from adapterdoc.train.data import SPECIALS, TOKENIZER_VOCAB, train_bpe

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

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


def chat_tokenizer(texts: Iterable[str], vocab_size: int = TOKENIZER_VOCAB) -> PreTrainedTokenizerFast:
    """A deterministic byte-level BPE chat tokenizer trained on ``texts`` (no hub, no files)."""
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(sorted(set(texts)), vocab_size, CHAT_SPECIALS)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
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
