"""The default profile: what PEFT itself loads. Verify's own checks are PEFT's rules, so it adds nothing."""

from __future__ import annotations

from adapterdoc.engines.base import Profile


class PeftProfile(Profile):
    name = "peft"
    summary = "PEFT loading (default)"


PROFILE = PeftProfile()
