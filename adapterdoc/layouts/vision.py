"""Qwen-VL-style vision towers, which several families build (module trees, :mod:`adapterdoc.layouts.trees`): the
size fields of a Qwen3.5-style vision config, the patch and position embeddings with the ``blocks``, and the patch
merger."""

from __future__ import annotations

from adapterdoc.layouts.trees import CONV, Fields, Tree


def vision_sizes(f: Fields) -> tuple[int, int, int, int, int, int]:
    """A Qwen3.5-style vision config's sizes: (hidden, MLP, depth, spatial merge, output width, position
    embeddings); the head count, channels and patch sizes are checked (no module's weight shape reads them)."""
    d, inter, depth = f.int("hidden_size"), f.int("intermediate_size"), f.int("depth", 0)
    for key in ("num_heads", "in_channels", "patch_size", "temporal_patch_size"):
        f.int(key)
    s, out, npos = f.int("spatial_merge_size"), f.int("out_hidden_size"), f.int("num_position_embeddings")
    return d, inter, depth, s, out, npos


def vision_blocks(
    t: Tree, p: str, d: int, inter: int, depth: int, npos: int | None, *, gated: bool = False
) -> None:
    """The patch embedding (and, with ``npos``, the position embedding), rotary and ``blocks`` of a Qwen-VL-style
    vision tower under ``p`` (``attn.qkv`` / ``attn.proj``; ``mlp.linear_fc1`` / ``linear_fc2``, or with ``gated``
    ``mlp.{gate,up,down}_proj``, all with a bias: hidden ``d``, MLP ``inter``). Where the tree lists other modules'
    own Parameters (:attr:`Tree.own`), the convolution's and the norms' are listed."""
    t.add(p + ".patch_embed")
    t.add(p + ".patch_embed.proj", CONV, own=("weight", "bias"))
    if npos is not None:
        t.embedding(p + ".pos_embed", npos, d)
    t.add(p + ".rotary_pos_emb")
    for b in t.layers(p + ".blocks", depth):
        t.norm(b + ".norm1", ("weight", "bias"))
        t.norm(b + ".norm2", ("weight", "bias"))
        t.add(b + ".attn")
        t.linear(b + ".attn.qkv", d, 3 * d, True)
        t.linear(b + ".attn.proj", d, d, True)
        t.add(b + ".mlp")
        if gated:
            t.linear(b + ".mlp.gate_proj", d, inter, True)
            t.linear(b + ".mlp.up_proj", d, inter, True)
            t.linear(b + ".mlp.down_proj", inter, d, True)
        else:
            t.linear(b + ".mlp.linear_fc1", d, inter, True)
            t.linear(b + ".mlp.linear_fc2", inter, d, True)
        t.add(b + ".mlp.act_fn")


def patch_merger(t: Tree, m: str, wide: int, out: int) -> None:
    """A Qwen2.5-VL-style patch merger under ``m``: ``ln_q`` and ``mlp.0`` / ``mlp.2`` (``wide`` -> ``wide`` ->
    ``out``, with a bias) around the activation ``mlp.1``."""
    t.add(m)
    t.norm(m + ".ln_q", ("weight", "bias"))
    t.add(m + ".mlp")
    t.linear(m + ".mlp.0", wide, wide, True)
    t.add(m + ".mlp.1")
    t.linear(m + ".mlp.2", wide, out, True)


__all__ = ["patch_merger", "vision_blocks", "vision_sizes"]
