"""The interface of a verify profile: the rules one loader or server adds on top of verify's own checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapterdoc.adapter import AdapterConfig, LoraKey
    from adapterdoc.report.findings import Finding
    from adapterdoc.report.verify_report import VerifyReport


class Profile:
    """One ``verify --profile NAME``: a name, the options it reads, its findings and its run-level JSON keys.

    Subclass it in a module of its own under :mod:`adapterdoc.verify.profiles`, make one instance and list it in
    that package's registry. Import what the rules need inside the methods: the registry is read when the
    command line starts."""

    name: str = ""
    summary: str = ""
    """What it checks, for ``--profile``'s help (e.g. ``vLLM serving``)."""
    options: tuple[str, ...] = ()
    """The :class:`~adapterdoc.verify.options.VerifyOptions` fields it reads."""

    def check_options(self, options: Any) -> None:
        """Raise ``ValueError`` for a value of one of its options it cannot use. Every profile checks its own
        options whichever profile runs, so that a bad value fails the same way always."""

    def findings(
        self,
        spec: str,
        report: VerifyReport,
        keys: list[LoraKey],
        meta: Any,
        options: Any,
        config: AdapterConfig,
    ) -> list[Finding]:
        """Its findings on one adapter: ``spec`` as given, verify's report so far (layout, candidates; a profile
        may fill ``served_as``), the parsed keys, the expected model (``meta``: registry or meta device), the
        options and the adapter config (``report.config["inferred"]`` says whether it was inferred)."""
        return []

    def run_fields(self, options: Any, *, active: bool) -> dict[str, Any]:
        """The keys it adds to the run's JSON after ``profile``; every run has them, ``None`` when ``active`` is
        false (another profile ran)."""
        return {}

    def label(self, options: Any) -> str:
        """The profile as the text report's header names it."""
        return self.name
