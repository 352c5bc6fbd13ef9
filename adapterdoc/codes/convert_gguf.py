"""AD8xx codes of the GGUF format (see :mod:`adapterdoc.codes.convert`).

AD850-AD869: ``verify ADAPTER.gguf --base MODEL.gguf``, one per way llama.cpp's ``llama_adapter_lora_init`` fails
("failed to apply lora adapter: ...", ``src/llama-adapter.cpp``; AD863-AD865: ggml's ``gguf_init``,
``ggml/src/gguf.cpp``, refuses the file), silently does less than asked, or loads what cannot work.
AD870-AD889: what ``convert --to gguf`` refuses (exit 3), because llama.cpp's LoRA cannot hold it.
"""

from adapterdoc.codes import Code

_LOAD = (
    "llama.cpp refuses the whole adapter at load ('failed to apply lora adapter: {}'), so nothing is served."
)

CODES: list[Code] = [
    Code(
        "AD850",
        "gguf-not-an-adapter",
        "error",
        "The GGUF file's `general.type` is not `adapter`: llama.cpp does not read it as a LoRA adapter.",
        _LOAD.format("expect general.type to be 'adapter', but got: model"),
        "passing a base model GGUF (or a merged model) as --lora",
        "Pass the LoRA GGUF (`adapterdoc convert ADAPTER --to gguf --base BASE` writes one); a merged model is "
        "loaded as the model, not as an adapter.",
    ),
    Code(
        "AD851",
        "gguf-adapter-type-not-lora",
        "error",
        "`adapter.type` is missing or not `lora` (a control vector or another adapter kind).",
        _LOAD.format("expect adapter.type to be 'lora', but got: ..."),
        "adapter.type = control_vector",
        "Use a LoRA GGUF; control vectors load with --control-vector, not --lora.",
    ),
    Code(
        "AD852",
        "gguf-architecture-mismatch",
        "error",
        "The adapter's `general.architecture` differs from the base GGUF's.",
        _LOAD.format("model arch and LoRA arch mismatch"),
        "adapter general.architecture = llama, base = qwen3 (converted against the wrong config.json)",
        "Convert the adapter again with --base the config.json of the model the base GGUF was made from.",
    ),
    Code(
        "AD853",
        "gguf-unexpected-tensor",
        "error",
        "A tensor's name ends in neither `.lora_a`, `.lora_b` nor `_norm.weight`.",
        _LOAD.format("LoRA tensor 'rope_freqs.weight' has unexpected suffix"),
        "rope_freqs.weight written into the adapter by an old convert_lora_to_gguf.py (llama.cpp#9114)",
        "Convert the PEFT adapter again with `adapterdoc convert ADAPTER --to gguf`, which writes only LoRA pairs.",
    ),
    Code(
        "AD854",
        "gguf-pair-incomplete",
        "error",
        "A `.lora_a` has no `.lora_b` of the same base tensor (or the reverse).",
        _LOAD.format("LoRA tensor pair for 'blk.0.attn_q.weight' is missing one component"),
        "blk.0.attn_q.weight.lora_a without blk.0.attn_q.weight.lora_b",
        "The file was cut or edited; convert the PEFT adapter again.",
    ),
    Code(
        "AD855",
        "gguf-target-missing",
        "error",
        "A LoRA pair's base tensor does not exist in the base GGUF.",
        _LOAD.format(
            "LoRA tensor 'output.weight' does not exist in base model (hint: maybe wrong base model?)"
        ),
        "output.weight.lora_a on a base whose output is tied to token_embd; blk.0.attn_q.weight on a base "
        "converted with --fuse-qkv (it has blk.0.attn_qkv.weight)",
        "Use the base GGUF of the model the adapter was trained on; reconvert a --fuse-qkv base without it; "
        "drop an lm_head LoRA on a tied base.",
    ),
    Code(
        "AD856",
        "gguf-shape-mismatch",
        "error",
        "`lora_a`'s input size or `lora_b`'s output size differs from the base tensor's; or a stacked expert "
        "pair (`ffn_*_exps`) holds another number of experts than the base.",
        _LOAD.format("tensor 'blk.0.attn_q.weight' has incorrect shape (hint: maybe wrong base model?)")
        + " Another expert count is not refused (llama.cpp checks ne[0] and ne[1] only): fewer experts are read "
        "past the LoRA tensors at the first token routed there, extra ones are ignored.",
        "lora_a ne [64, 8] on a base tensor of ne [128, 128] (a different model size); lora_a ne [64, 8, 64] "
        "on ffn_gate_exps of ne [64, 32, 128]",
        "Use the base GGUF of the model size the adapter was trained on.",
    ),
    Code(
        "AD857",
        "gguf-lora-a-not-transposed",
        "error",
        "`lora_a`'s rank dimension does not match `lora_b`'s (`a.ne[1] != b.ne[0]`).",
        _LOAD.format(
            'lora_a tensor is not transposed (hint: adapter from "finetune" example is no longer supported)'
        ),
        "an adapter from llama.cpp's removed finetune example, or a hand-written file with lora_a as [r, in] in ne",
        "Convert the PEFT adapter with `adapterdoc convert --to gguf` (lora_a holds PEFT's lora_A bytes: ne [in, r]).",
    ),
    Code(
        "AD858",
        "gguf-alpha-missing",
        "warning",
        "`adapter.lora.alpha` is missing or 0: llama.cpp then scales each pair by 1, not by alpha / rank. "
        "Stored as another GGUF type than FLOAT32 (an integer alpha) it is an error: llama.cpp's "
        "gguf_get_val_f32 asserts and the process aborts at load.",
        "A PEFT adapter scaled by lora_alpha / r = 2 runs at half strength (or a zero-alpha adapter at full "
        "strength): outputs differ from PEFT's with no error; an integer alpha kills the server at load "
        "('GGML_ASSERT(type_to_gguf_type<T>::value == type) failed').",
        "no adapter.lora.alpha key; lora_alpha 16, r 8 in PEFT; adapter.lora.alpha written as UINT32 16",
        "Convert again with `adapterdoc convert ADAPTER --to gguf`, which writes the alpha (a float32) that "
        "reproduces PEFT's scaling.",
    ),
    Code(
        "AD859",
        "gguf-data-out-of-bounds",
        "error",
        "A tensor's data would end past the end of the file (the file is truncated).",
        _LOAD.format("LoRA tensor '...' data is not within the file bounds, file is corrupted or incomplete"),
        "a download cut short",
        "Download or convert the adapter again.",
    ),
    Code(
        "AD860",
        "gguf-norm-ignored",
        "warning",
        "The adapter carries `*_norm.weight` vectors, which llama.cpp skips at load.",
        "mergekit-extract-lora writes trained norms into the adapter; llama.cpp loads the adapter without them, so "
        "the served model differs from the trained one.",
        "blk.0.attn_norm.weight in the adapter",
        "Merge the adapter into the base (`adapterdoc merge`) and convert the merged model, if the norms matter.",
    ),
    Code(
        "AD861",
        "gguf-base-not-a-model",
        "error",
        "The --base GGUF is itself an adapter (or not a GGUF model).",
        "llama.cpp needs the model file as -m and the adapter as --lora; two adapters load nothing.",
        "verify a.gguf --base b-lora.gguf",
        "Pass the base model's GGUF (convert_hf_to_gguf.py's output) as --base.",
    ),
    Code(
        "AD862",
        "gguf-scale",
        "info",
        "The scale llama.cpp applies to each pair: alpha / rank (rank from lora_b).",
        "llama.cpp has one alpha per adapter; pairs of different ranks get different scales, which is PEFT's "
        "alpha / r with a rank_pattern, but not an alpha_pattern.",
        "alpha 16: r=8 pairs ×2.0, r=16 pairs ×1.0",
        "Nothing to do; compare with the PEFT adapter's scaling if outputs differ.",
    ),
    Code(
        "AD870",
        "gguf-architecture-unsupported",
        "error",
        "`convert --to gguf` has no llama.cpp architecture for the base's `architectures[0]`.",
        "llama.cpp's tensor names and its per-architecture permutations depend on the architecture; guessing one "
        "writes an adapter that loads and computes the wrong thing, or fails at load.",
        "ModernBertForMaskedLM (an encoder; no LoRA path in llama.cpp)",
        "Use a supported family (see docs/runtimes.md) or merge the adapter and convert the merged model.",
    ),
    Code(
        "AD871",
        "gguf-dora",
        "error",
        "The adapter is DoRA (`use_dora` or `lora_magnitude_vector` tensors); llama.cpp's LoRA has no magnitude.",
        "Dropping the magnitude serves a different model without an error.",
        "use_dora: true",
        "Merge the adapter into the base (`adapterdoc merge`) and convert the merged model with convert_hf_to_gguf.py.",
    ),
    Code(
        "AD872",
        "gguf-whole-weights",
        "error",
        "The adapter holds whole weights (modules_to_save, a resized or saved embedding, trainable tokens) that "
        "differ from the base's, or that cannot be compared without the base's weights.",
        "llama.cpp's LoRA holds only lora_a/lora_b pairs; convert_lora_to_gguf.py stops at them ('Unexpected name "
        "base_model.model.lm_head.weight: Not a lora_A or lora_B tensor', llama.cpp#11554).",
        "base_model.model.lm_head.weight after a vocabulary resize",
        "Copies equal to the base are dropped when --base has the weights; otherwise merge the adapter "
        "(`adapterdoc merge`) and convert the merged model.",
    ),
    Code(
        "AD873",
        "gguf-bias",
        "error",
        "The adapter has bias tensors (`bias: all|lora_only`, `lora_bias`), which llama.cpp's LoRA cannot hold.",
        "Dropping them changes outputs silently.",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias",
        "Merge the adapter and convert the merged model, or train with bias='none' and lora_bias=False.",
    ),
    Code(
        "AD874",
        "gguf-fused-experts",
        "error",
        "The expert LoRA is PEFT's fused form (`target_parameters`), not one LoRA per expert.",
        "llama.cpp stacks one lora_a/lora_b per expert into `ffn_*_exps` tensors; the fused form's shared rank "
        "layout has no GGUF spelling.",
        "target_parameters: [mlp.experts.gate_up_proj, mlp.experts.down_proj]",
        "`adapterdoc remap ADAPTER --experts per-expert --out DIR`, then convert DIR.",
    ),
    Code(
        "AD875",
        "gguf-scaling-not-expressible",
        "error",
        "PEFT's per-module scalings cannot all be written as one `adapter.lora.alpha` over each pair's rank "
        "(a pair whose own alpha is a power of two times the common one is folded into its `lora_B`, exactly).",
        "llama.cpp scales every pair by alpha / rank with one alpha: an alpha_pattern, or rsLoRA with several "
        "ranks, would be served at the wrong strength (convert_lora_to_gguf.py ignores both); alpha 0 reads as "
        "scale 1.",
        "alpha_pattern {'q_proj': 24} with lora_alpha 16 (ratio 1.5)",
        "Use one lora_alpha (with rsLoRA: one rank), or merge the adapter and convert the merged model.",
    ),
    Code(
        "AD876",
        "gguf-tied-lm-head",
        "error",
        "The adapter has a LoRA on `lm_head` but the base ties its output to the embedding.",
        "The GGUF base then has no output.weight, and llama.cpp fails at load ('does not exist in base model'); "
        "convert_lora_to_gguf.py stops with 'lm_head is present in adapter, but is ignored in base model'.",
        "tie_word_embeddings: true and lm_head in target_modules",
        "Drop the lm_head LoRA, or merge the adapter and convert the merged model.",
    ),
    Code(
        "AD877",
        "gguf-tower-modules",
        "error",
        "The adapter adapts a vision or audio tower, which a GGUF LoRA cannot reach.",
        "llama.cpp converts a VL model's tower into a separate mmproj file and applies LoRA to the text model only.",
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight",
        "Train the text part only (exclude the tower), or merge the adapter and convert the merged model.",
    ),
    Code(
        "AD878",
        "gguf-partial-experts",
        "error",
        "Expert LoRA covers only some experts of a layer (or with different ranks).",
        "llama.cpp stacks every expert's lora_a/lora_b into one [E, ...] tensor; convert_lora_to_gguf.py stops "
        "with 'Unprocessed experts'.",
        "LoRA on experts 0-3 of 8",
        "Target every expert with one rank, or merge the adapter.",
    ),
    Code(
        "AD879",
        "gguf-module-unmapped",
        "error",
        "A LoRA module has no tensor in llama.cpp's name map for the architecture.",
        "llama.cpp would not find the tensor at load ('Can not map tensor' in its converter).",
        "a LoRA on a module llama.cpp fuses or drops (rotary, router of an unsupported kind)",
        "Drop that module from the adapter, or merge the adapter and convert the merged model.",
    ),
    Code(
        "AD863",
        "gguf-metadata-invalid",
        "error",
        "The GGUF metadata breaks a rule of ggml's `gguf_init`: an empty key, a key twice, or a "
        "`general.alignment` that is not a UINT32 power of two.",
        "llama.cpp does not open the file at all ('gguf_init_from_file_impl: duplicate key ...', 'failed to load "
        "lora adapter from file'); nothing is served.",
        "adapter.type written twice; general.alignment stored as UINT64",
        "Convert the PEFT adapter again with `adapterdoc convert ADAPTER --to gguf`, or fix the tool that edited "
        "the file.",
    ),
    Code(
        "AD864",
        "gguf-tensor-info-invalid",
        "error",
        "A tensor info breaks a rule of ggml's `gguf_init`: a name of 64 bytes or more, a name twice, a negative "
        "dimension, more elements than INT64_MAX, a ggml type that does not exist (or was removed), or a row that "
        "is not a whole number of the type's blocks.",
        "llama.cpp does not open the file at all ('tensor ... has invalid ggml type 999', 'failed to load lora "
        "adapter from file').",
        "a tensor of ggml type 999; Q8_0 rows of 48 elements",
        "Convert the PEFT adapter again with `adapterdoc convert ADAPTER --to gguf`.",
    ),
    Code(
        "AD865",
        "gguf-tensor-offset-invalid",
        "error",
        "A tensor's data offset is not where ggml's `gguf_init` requires it: the first tensor at 0, each next one "
        "where the one before ends, padded to `general.alignment`.",
        "llama.cpp does not open the file at all ('tensor ... has offset 4, expected 0').",
        "offsets 4 and 516 instead of 0 and 512; two tensors' data swapped",
        "Write the tensors back to back in the order of the tensor table, each padded to the alignment "
        "(`adapterdoc convert ADAPTER --to gguf` does).",
    ),
    Code(
        "AD866",
        "gguf-alpha-not-finite",
        "error",
        "`adapter.lora.alpha` is NaN or infinite.",
        "llama.cpp loads the adapter without a word, but every pair's scale alpha / rank is NaN or infinite: the "
        "adapted layers output NaN.",
        "adapter.lora.alpha = nan",
        "Convert the PEFT adapter again (its lora_alpha is finite) or write the intended alpha as a float32.",
    ),
    Code(
        "AD867",
        "gguf-alora-tokens-invalid",
        "error",
        "`adapter.alora.invocation_tokens` is not an array of UINT32.",
        "llama.cpp refuses the adapter ('invalid gguf type for adapter.alora.invocation_tokens' or 'invalid gguf "
        "element type ...').",
        "adapter.alora.invocation_tokens written as one UINT32, or as an array of INT32",
        "Write the activated LoRA's invocation tokens as an array of UINT32 token ids.",
    ),
    Code(
        "AD868",
        "gguf-rank-zero",
        "error",
        "A LoRA pair has rank 0 (`lora_b` ne[0] = 0), or every LoRA tensor holds 0 bytes.",
        "llama.cpp loads a rank-0 pair, and its scale alpha / 0 is infinite: 0 × inf makes every output of the "
        "layer NaN (with alpha 0 the pair only adds nothing, a warning). With nothing to allocate it refuses the "
        "adapter ('failed to allocate buffer for lora adapter').",
        "blk.1.attn_k.weight.lora_a ne [64, 0], lora_b ne [0, 32]",
        "Drop the empty pair, or convert the PEFT adapter again.",
    ),
]
