"""The registry's module trees: each layout's modules, kinds and weight shapes from ``config.json`` alone.

This module holds the generic machinery (:class:`Tree`, :class:`Fields`, :func:`build_tree`'s dispatch on
``(model_type, class)``); each family module holds its own builders and sets them as :attr:`Layout.tree`.
Torch-free and transformers-free. Each builder reproduces ``named_modules()`` of the transformers class a
layout describes (read from that class's modeling file in transformers 5.24), with the shapes of the weights a
LoRA layer's shape depends on (Linear, Embedding, fused-expert Parameters). A config the registry cannot describe
exactly (an unknown ``model_type`` or class, a field not listed for its config type, a value outside what the
builder models) raises :class:`Unmodeled`; callers then build the model on the meta device instead.

``tests/verify/test_expected_keys.py`` proves these trees equal transformers' (names, kinds and shapes) and that the
expected LoRA keys built on them equal PEFT's, over generated configs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from adapterdoc.layouts.registry import LAYOUTS, LOAD_CONVERSIONS, PEFT_MOE, TREES, PeftMoeConversion

LINEAR, EMBEDDING, CONV, EXPERTS, OTHER = "linear", "embedding", "conv", "experts", "other"


class Unmodeled(Exception):
    """The registry cannot describe this config (or adapter config) exactly; the reason is the message."""


@dataclass(frozen=True)
class Node:
    """One module of the tree, as ``named_modules()`` names it."""

    name: str
    kind: str = OTHER
    """``linear``, ``embedding``, ``conv``, ``experts`` (fused 3-D expert Parameters) or ``other``."""
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """The module's own Parameters (``recurse=False``), for linear, embedding and experts modules (and a conv
    whose weight is 3-D, which the meta path's leaf census counts like fused experts)."""


@dataclass
class Tree:
    """A base model's module tree, built from its config."""

    layout: str
    model_class: str
    model_type: str
    nodes: list[Node] = field(default_factory=list)
    output_embedding: str | None = None
    """The module ``get_output_embeddings()`` returns (``lm_head``): PEFT's ``all-linear`` leaves it out."""
    input_embedding: str | None = None
    tied: bool = False
    """Whether the output layer shares the input embedding's weight (``tie_word_embeddings``)."""
    load_conversion: bool = False
    """Whether transformers registers load-time renames for this model type, which PEFT's loader also applies to
    adapter keys (``convert_peft_adapter_state_dict_for_transformers``): keys that do not match exactly may then
    be renamed into place, so only the meta device can judge them."""

    peft_moe: PeftMoeConversion | None = None
    """PEFT's per-expert → fused rewrite for this model type (:data:`adapterdoc.layouts.registry.PEFT_MOE`)."""
    other_params: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = field(default_factory=dict)
    """Parameters of ``other`` modules that PEFT's MoE rewrite may target (the router's ``gate.weight``)."""
    own: dict[str, tuple[str, ...]] | None = None
    """The names of every ``other`` / ``conv`` module's own Parameters (norms, routers, convs), where the builder
    lists them all (``None``: not listed); PEFT's regex resolution for MoE rewrites reads parameter names."""

    def add(
        self,
        name: str,
        kind: str = OTHER,
        params: tuple[tuple[str, tuple[int, ...]], ...] = (),
        own: tuple[str, ...] = (),
    ) -> None:
        """One module; ``own``: the names of its own Parameters, listed in :attr:`own` where the tree lists them."""
        self.nodes.append(Node(name, kind, params))
        if own and self.own is not None:
            self.own[name] = own

    def norm(self, name: str, params: tuple[str, ...] = ("weight",)) -> None:
        """A norm (or another parameter-only module) whose own Parameters are ``params``."""
        self.add(name, own=params)

    def layers(self, path: str, n: int) -> Iterator[str]:
        """The ``ModuleList`` at ``path`` and, one at a time, its ``n`` layers: each layer is added just before the
        caller fills it in (``for q in t.layers(p + "layers", n): ...``)."""
        self.add(path)
        for i in range(n):
            q = f"{path}.{i}"
            self.add(q)
            yield q

    def linear(self, name: str, fan_in: int, fan_out: int, bias: bool = False) -> None:
        params: tuple[tuple[str, tuple[int, ...]], ...] = (("weight", (fan_out, fan_in)),)
        if bias:
            params += (("bias", (fan_out,)),)
        self.add(name, LINEAR, params)

    def embedding(self, name: str, num: int, dim: int, *, inputs: bool = False) -> None:
        """An ``nn.Embedding``; ``inputs``: the one ``get_input_embeddings()`` returns."""
        self.add(name, EMBEDDING, (("weight", (num, dim)),))
        if inputs:
            self.input_embedding = name

    def lm_head(self, hidden: int, vocab: int, *configs: Fields) -> Tree:
        """The causal-LM tail every decoder family ends with: ``lm_head`` (the output embedding, left out of
        ``all-linear``), tied when any of ``configs`` (the top config, then the text config) sets
        ``tie_word_embeddings``; returns the tree, so a builder ends with ``return t.lm_head(h, v, f)``."""
        self.linear("lm_head", hidden, vocab)
        self.output_embedding = "lm_head"
        self.tied = any(c.flag("tie_word_embeddings") for c in configs)
        return self

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


_GENERIC = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "id2label",
        "label2id",
        "problem_type",
        "initializer_range",
        "use_cache",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "tokenizer_class",
    }
)
"""Fields every transformers config carries; none changes a module tree."""


class Fields:
    """A config dict read against the fields the registry models: defaults filled in, unknown fields refused."""

    def __init__(
        self, raw: Mapping[str, object], where: str, defaults: Mapping[str, object], inert: frozenset[str]
    ):
        unknown = sorted(k for k in raw if k not in defaults and k not in inert and k not in _GENERIC)
        if unknown:
            raise Unmodeled(f"{where} field(s) the registry does not model: {', '.join(unknown)}")
        self.raw, self.where, self.defaults = raw, where, defaults

    def __getitem__(self, key: str) -> object:
        v = self.raw.get(key, self.defaults.get(key))
        return self.defaults.get(key) if v is None and key in self.defaults else v

    def int(self, key: str, minimum: int = 1) -> int:
        v = self[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise Unmodeled(f"{self.where} `{key}` is {v!r}, not an integer >= {minimum}")
        return v

    def flag(self, key: str) -> bool:
        v = self[key]
        if not isinstance(v, bool):
            raise Unmodeled(f"{self.where} `{key}` is {v!r}, not a boolean")
        return v


def mlp(t: Tree, m: str, h: int, inter: int, own: bool = True, act: str = "act_fn") -> None:
    """A gated MLP (``gate_proj``, ``up_proj``, ``down_proj`` and its activation) under ``m``."""
    if own:
        t.add(m)
    t.linear(m + ".gate_proj", h, inter)
    t.linear(m + ".up_proj", h, inter)
    t.linear(m + ".down_proj", inter, h)
    t.add(f"{m}.{act}")


def attention(
    t: Tree,
    a: str,
    h: int,
    heads: int,
    kv: int,
    hd: int,
    bias: bool = False,
    *,
    o_bias: bool | None = None,
    q_factor: int = 1,
    norms: tuple[str, ...] = (),
) -> None:
    """The attention module ``a`` with ``q_proj`` (``heads * hd * q_factor`` wide: 2 for a gated query),
    ``k_proj`` / ``v_proj`` (``kv * hd``) and ``o_proj``, a bias where ``bias`` (on ``o_proj`` where ``o_bias``,
    by default as the others), then the norms named in ``norms`` (``q_norm``, ...)."""
    t.add(a)
    t.linear(a + ".q_proj", h, heads * hd * q_factor, bias)
    t.linear(a + ".k_proj", h, kv * hd, bias)
    t.linear(a + ".v_proj", h, kv * hd, bias)
    t.linear(a + ".o_proj", heads * hd, h, bias if o_bias is None else o_bias)
    for norm in norms:
        t.norm(f"{a}.{norm}")


def decoder_stack(
    t: Tree, p: str, n: int, h: int, v: int, heads: int, kv: int, hd: int, inter: int, qkv_bias: bool = False
) -> tuple[int, int]:
    """The plain attention decoder most text models share, under the prefix ``p``: ``embed_tokens``, ``n`` layers of
    ``self_attn.{q,k,v,o}_proj`` (q/k/v with a bias where ``qkv_bias``), a gated MLP and two norms, then ``norm`` and
    ``rotary_emb``; returns ``(hidden, vocab)`` for :meth:`Tree.lm_head`."""
    t.embedding(p + "embed_tokens", v, h, inputs=True)
    for q in t.layers(p + "layers", n):
        attention(t, q + ".self_attn", h, heads, kv, hd, qkv_bias, o_bias=False)
        mlp(t, q + ".mlp", h, inter)
        t.add(q + ".input_layernorm")
        t.add(q + ".post_attention_layernorm")
    t.add(p + "norm")
    t.add(p + "rotary_emb")
    return h, v


def sub_config(raw: Mapping[str, object], key: str, model_type: str, where: str) -> Mapping[str, object]:
    """The sub-config ``raw[key]`` (``text_config``, ...), which must be present and of ``model_type``."""
    sub = raw.get(key)
    if sub is None:
        raise Unmodeled(f"{where} has no `{key}` (the registry does not fill in a default sub-config)")
    if not isinstance(sub, dict):
        raise Unmodeled(f"{where} `{key}` is not an object")
    if sub.get("model_type", model_type) != model_type:
        raise Unmodeled(f"{where} `{key}.model_type` is {sub.get('model_type')!r}, not {model_type!r}")
    return sub


def model_class_name(raw: Mapping[str, object]) -> str:
    """The class the meta-device path builds for this config: ``architectures[0]``, else the registry's class for
    the ``model_type`` (the first layout that names it, as :func:`adapterdoc.ml.meta.model_class_for` picks)."""

    archs = raw.get("architectures")
    if archs:
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise Unmodeled("`architectures` is not a list of class names")
        return archs[0]
    for layout in LAYOUTS.values():
        if layout.model_type == raw.get("model_type"):
            return layout.model_class
    raise Unmodeled(f"no registry layout has model_type {raw.get('model_type')!r}")


def build_tree(raw: Mapping[str, object]) -> Tree:
    """The module tree of the model a ``config.json`` dict describes; :class:`Unmodeled` when the registry cannot
    describe it exactly."""
    mt = raw.get("model_type")
    cls = model_class_name(raw)
    builder = TREES.get((str(mt), cls))
    if builder is None:
        raise Unmodeled(f"the registry has no module tree for {cls} with model_type {mt!r}")
    tree: Tree = builder(raw)
    tree.load_conversion = tree.model_type in LOAD_CONVERSIONS
    tree.peft_moe = PEFT_MOE.get(tree.model_type)
    return tree


__all__ = [
    "CONV",
    "EMBEDDING",
    "EXPERTS",
    "LINEAR",
    "LOAD_CONVERSIONS",
    "OTHER",
    "PEFT_MOE",
    "TREES",
    "Fields",
    "Node",
    "Tree",
    "Unmodeled",
    "attention",
    "build_tree",
    "decoder_stack",
    "mlp",
    "model_class_name",
    "sub_config",
]
