"""``adapterdoc probe``: ask a running server whether it applies the adapter as PEFT does, from canaries (prompts and
the logprobs PEFT expects on them at several adapter scales) and the user's own request convention."""
