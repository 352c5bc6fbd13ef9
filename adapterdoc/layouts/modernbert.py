"""ModernBERT: the masked-LM model and the bare encoder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from adapterdoc.layouts.common import PLAIN_ACTIVATIONS, tiny_decoder
from adapterdoc.layouts.registry import Layout, Rule, Tiny
from adapterdoc.layouts.trees import Fields, Tree, Unmodeled

# ------------------------------------------------------------------------------------- module trees

_MODERNBERT = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "attention_bias": False,
    "mlp_bias": False,
    "decoder_bias": True,
    "classifier_bias": False,
    "classifier_activation": "gelu",
    "tie_word_embeddings": True,
    "layer_types": None,
    "global_attn_every_n_layers": 3,
}
"""``ModernBertConfig``'s fields that shape the module tree, with its defaults (transformers 5.24,
``models/modernbert/configuration_modernbert.py``)."""


_MODERNBERT_INERT = frozenset(
    {
        "max_position_embeddings",
        "initializer_cutoff_factor",
        "norm_eps",
        "norm_bias",
        "cls_token_id",
        "sep_token_id",
        "attention_dropout",
        "rope_parameters",
        "local_attention",
        "embedding_dropout",
        "mlp_dropout",
        "classifier_pooling",
        "classifier_dropout",
        "deterministic_flash_attn",
        "sparse_prediction",
        "sparse_pred_ignore_index",
        "reference_compile",
        "global_rope_theta",
        "local_rope_theta",
        "gradient_checkpointing",
        "layer_norm_eps",
        "position_embedding_type",
        "repad_logits_with_grad",
    }
)
"""Fields that change no module name, kind or weight shape: ``attention_dropout`` swaps ``attn.out_drop`` between
``Identity`` and ``Dropout`` (both plain modules); the norms' ``norm_bias`` adds a bias no LoRA layer reads; the
hub checkpoints' pre-5 fields (``reference_compile``, ``global_rope_theta``, ...) are read by no module."""


def _activation(f: Fields, key: str) -> None:
    if f[key] not in PLAIN_ACTIVATIONS:
        raise Unmodeled(f"{f.where} `{key}` {f[key]!r} is not modelled")


def _modernbert_model(t: Tree, f: Fields, p: str) -> tuple[int, int]:
    """``ModernBertModel`` under the prefix ``p`` (``""`` or ``model.``): embeddings, encoder layers (layer 0's
    ``attn_norm`` is an ``Identity``), final norm, rotary embedding."""
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers")
    heads, inter = f.int("num_attention_heads"), f.int("intermediate_size")
    if h % heads:
        raise Unmodeled(f"{f.where} `hidden_size` {h} is not a multiple of `num_attention_heads` {heads}")
    _activation(f, "hidden_activation")
    types = f["layer_types"]
    if types is None:
        f.int("global_attn_every_n_layers")
    elif not isinstance(types, list) or len(types) != n:
        raise Unmodeled(f"{f.where} `layer_types` does not list one type per layer ({n})")
    elif any(x not in ("full_attention", "sliding_attention") for x in types):
        raise Unmodeled(f"{f.where} `layer_types` has a type that is not modelled")
    abias, mbias = f.flag("attention_bias"), f.flag("mlp_bias")
    e = p + "embeddings"
    t.add(e)
    t.embedding(e + ".tok_embeddings", v, h, inputs=True)
    t.add(e + ".norm")
    t.add(e + ".drop")
    for q in t.layers(p + "layers", n):
        t.add(q + ".attn_norm")
        t.add(q + ".attn")
        t.linear(q + ".attn.Wqkv", h, 3 * h, abias)
        t.linear(q + ".attn.Wo", h, h, abias)
        t.add(q + ".attn.out_drop")
        t.add(q + ".mlp_norm")
        t.add(q + ".mlp")
        t.linear(q + ".mlp.Wi", h, 2 * inter, mbias)
        t.add(q + ".mlp.act")
        t.add(q + ".mlp.drop")
        t.linear(q + ".mlp.Wo", inter, h, mbias)
    t.add(p + "final_norm")
    t.add(p + "rotary_emb")
    return h, v


def _modernbert_tree(layout: str, cls: str, mlm: bool) -> Callable[[Mapping[str, object]], Tree]:
    """``ModernBertModel`` / ``ModernBertForMaskedLM`` (transformers 5.24,
    ``models/modernbert/modeling_modernbert.py``). The MLM class adds ``head`` (dense, act, norm) and ``decoder``,
    its output embedding (``get_output_embeddings``, left out of ``all-linear``), tied to
    ``model.embeddings.tok_embeddings`` when ``tie_word_embeddings`` (``_tied_weights_keys``). The bare encoder has
    no output embedding and nothing tied."""

    def build(raw: Mapping[str, object]) -> Tree:
        f = Fields(raw, "modernbert", _MODERNBERT, _MODERNBERT_INERT)
        tie = f.flag("tie_word_embeddings")
        t = Tree(layout, cls, "modernbert")
        if not mlm:
            _modernbert_model(t, f, "")
            return t
        t.add("model")
        h, v = _modernbert_model(t, f, "model.")
        _activation(f, "classifier_activation")
        t.add("head")
        t.linear("head.dense", h, h, f.flag("classifier_bias"))
        t.add("head.act")
        t.add("head.norm")
        t.linear("decoder", h, v, f.flag("decoder_bias"))
        t.output_embedding = "decoder"
        t.tied = tie
        return t

    return build


# ------------------------------------------------------------------------------------- tiny configs


_TINY_TOKEN_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
"""The special tokens at their ids in the tiny tokenizer (:data:`adapterdoc.train.data.SPECIALS`: pad, bos, eos):
``[CLS]`` is its ``<bos>``, ``[SEP]`` its ``<eos>``."""


def _modernbert() -> dict[str, object]:
    return tiny_decoder(
        drop=("num_key_value_heads", "head_dim", "tie_word_embeddings"),
        num_hidden_layers=2,
        global_attn_every_n_layers=2,
        local_attention=32,
        **_TINY_TOKEN_IDS,
    )


_MODERNBERT_LAYOUT = partial(
    Layout,
    family="modernbert",
    model_module="transformers.models.modernbert.modeling_modernbert",
    model_type="modernbert",
    lora_leaves=("Wqkv", "Wo", "Wi"),
    is_encoder=True,
    hint=r"modernbert",
    tiny=Tiny("ModernBertConfig", _modernbert),
)
"""Both classes read one config and share the encoder's LoRA leaves."""

ENTRIES: tuple[Layout, ...] = (
    _MODERNBERT_LAYOUT(
        name="modernbert_mlm",
        model_class="ModernBertForMaskedLM",
        description="ModernBERT with the masked-LM head (model.layers.*.attn.Wqkv)",
        requires=(r"^model\.layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"^(head\.dense|decoder)$", "masked-LM head modules"),),
        remaps={"modernbert": (Rule(r"^model\.", ""),)},
        text_counterpart="modernbert",
        counterpart_module="model",
        move_words={"modernbert": "MLM adapter on the bare encoder"},
        tree=_modernbert_tree("modernbert_mlm", "ModernBertForMaskedLM", mlm=True),
    ),
    _MODERNBERT_LAYOUT(
        name="modernbert",
        model_class="ModernBertModel",
        description="ModernBERT encoder without a head (layers.*.attn.Wqkv)",
        requires=(r"^layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        remaps={"modernbert_mlm": (Rule(r"^(?=(?:layers|embeddings|final_norm)\.)", "model."),)},
        move_words={"modernbert_mlm": "bare-encoder adapter on the MLM model"},
        tree=_modernbert_tree("modernbert", "ModernBertModel", mlm=False),
    ),
)

SMOKE: tuple[str, ...] = ("modernbert_mlm",)
"""This family's layouts in ``train-smoke --layout all``, in run order."""
