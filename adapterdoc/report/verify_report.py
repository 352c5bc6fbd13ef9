"""The reports ``adapterdoc verify`` returns: one verdict per adapter (:class:`VerifyReport`) and the run
(:class:`VerifyRun`), with their JSON forms. The renderers in this package read them; nothing here imports verify."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from adapterdoc.report.base import FrozenReport, envelope, unusable_finding
from adapterdoc.report.findings import Finding, has_errors

OWN_BASE = "(each adapter's base_model_name_or_path)"
"""The run's ``base`` when each adapter was checked against the base its own config names."""


class RunOptions(Protocol):
    """What a run's JSON reads from verify's options (:class:`adapterdoc.verify.VerifyOptions`)."""

    @property
    def profile(self) -> str: ...

    @property
    def served_as(self) -> str | None: ...

    def profile_fields(self) -> dict[str, object]:
        """The run-level JSON keys the serving profiles add (after ``profile``)."""
        ...

    def profile_label(self) -> str:
        """The profile as the text report names it (``peft``; ``vllm 0.33.0, max LoRA rank 16``)."""
        ...


@dataclass(frozen=True)
class VerifySubject:
    """What verify knows of one adapter when the checks that read it run (a serving profile's rules, the layout
    move): the report itself is built once, from every check's result, after them."""

    adapter: str
    """The adapter as given."""
    path: str | None
    layout: str
    layout_candidates: tuple[str, ...]
    config: Mapping[str, object]
    """The report's ``config`` summary (``inferred``: whether there was no adapter_config.json)."""
    keys_against: Mapping[str, object] | None = None
    """The engine's view of the base the keys are checked against (the report's ``keys_against``)."""


@dataclass(frozen=True)
class VerifyReport(FrozenReport):
    """The verdict on one adapter, built once from the checks' results (:func:`adapterdoc.verify.run.verify_one`).

    Frozen: nothing changes a report once it is made (``dataclasses.replace`` makes a changed copy)."""

    adapter: str
    path: str | None = None
    layout: str = "unknown"
    """The adapter's layout, detected from its keys (``ambiguous`` or ``unknown`` when detection cannot tell)."""
    layout_candidates: list[str] = field(default_factory=list)
    """Other layouts the keys fit (all of them when ``layout`` is ``ambiguous``)."""
    base_layout: str | None = None
    expected_keys_from: str | None = None
    """``registry`` (the layout registry's module tree and PEFT's rules, torch-free) or ``meta-device`` (PEFT
    injected into the base built on the meta device)."""
    expected_keys_note: str | None = None
    """Why the registry did not decide, when the meta-device path did."""
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    shape_details: list[dict[str, Any]] = field(default_factory=list)
    lora_b: dict[str, int] = field(default_factory=lambda: {"nonzero": 0, "total": 0})
    """How many lora_B tensors hold a non-zero element, of how many."""
    nonfinite: dict[str, int] = field(default_factory=dict)
    """Tensor → NaN/Inf count, for tensors that have any."""
    dtypes: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    move: dict[str, Any] | None = None
    """The diagnosed layout move, when the mismatch is one."""
    served_as: str | None = None
    keys_against: dict[str, Any] | None = None
    """Set when the profile checks the keys against a view of the base, not the model PEFT builds (``view``
    ``text``, the registry ``layout`` or ``None``, the ``model_class`` words): TGI/LoRAX on a VL base."""
    load: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    """The weights audit's summary (modules, inert, inert_share, total_delta_norm), when it ran."""
    error: str | None = None
    """Set when the adapter could not be examined at all (exit code 3)."""

    @property
    def ok(self) -> bool:
        return self.error is None and not has_errors(self.findings)

    def body(self) -> dict[str, Any]:
        d = {
            "adapter": self.adapter,
            "error": self.error,
            "path": self.path,
            "layout": self.layout,
            "layout_candidates": self.layout_candidates,
            "base_layout": self.base_layout,
            "expected_keys_from": self.expected_keys_from,
            "expected_keys_note": self.expected_keys_note,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "shape_mismatch": self.shape_mismatch,
            "shape_details": self.shape_details,
            "lora_b": dict(self.lora_b),
            "nonfinite": dict(self.nonfinite),
            "dtypes": dict(self.dtypes),
            "config": self.config,
            "move": self.move,
            "served_as": self.served_as,
            "keys_against": self.keys_against,
            "load": self.load,
        }
        if self.weights is not None:
            d["weights"] = self.weights
        return d

    def to_dict(self) -> dict[str, Any]:
        """The envelope's ``ok`` and ``findings`` where this JSON has always had them: ``ok`` after ``adapter``,
        ``findings`` after ``load`` (and before ``weights``)."""
        body = self.body()
        weights = body.pop("weights", None)
        env = envelope(self.ok, self.findings, {})
        d = {"adapter": self.adapter, "ok": env["ok"], **body, "findings": env["findings"]}
        if weights is not None:
            d["weights"] = weights
        return d


def build_report(subject: VerifySubject, findings: list[Finding], **results: object) -> VerifyReport:
    """The verdict on one adapter, made once: what verify knew of it (``subject``), its findings and the other
    fields the checks' results give (``results``: ``base_layout``, ``missing``, ``lora_b``, ...)."""
    against = subject.keys_against
    return VerifyReport(
        adapter=subject.adapter,
        path=subject.path,
        layout=subject.layout,
        layout_candidates=list(subject.layout_candidates),
        config=dict(subject.config),
        keys_against=None if against is None else dict(against),
        findings=findings,
        **results,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class VerifyRun(FrozenReport):
    """One ``verify`` call: the base, the options and a report per adapter.

    ``findings`` are the adapters' findings in order, gathered once when the run is made."""

    base: str
    options: RunOptions
    adapters: list[VerifyReport]
    base_info: dict[str, Any] = field(default_factory=dict)
    exit_zero: bool = False
    """``--exit-zero``: error findings do not fail the run (exit 0, JSON ``ok`` true, ``passed`` false)."""

    def __post_init__(self) -> None:
        # derived once, as a frozen dataclass would set it
        object.__setattr__(self, "findings", [f for a in self.adapters for f in a.findings])

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.adapters)

    @property
    def exit_code(self) -> int:
        if any(a.error for a in self.adapters):
            return 3
        return 0 if self.ok or self.exit_zero else 1

    def body(self) -> dict[str, Any]:
        o = self.options
        return {
            "base": {"spec": self.base, **self.base_info},
            "profile": o.profile,
            **o.profile_fields(),
            "served_as": o.served_as,
            "adapters": [a.to_dict() for a in self.adapters],
        }

    def to_dict(self) -> dict[str, Any]:
        """The envelope with ``ok`` from the exit code, ``passed`` right after it, and an unusable adapter (exit 3)
        as finding AD100, as in every command's JSON."""
        rows: list[dict[str, Any]] = [f.to_dict() for f in self.findings]
        rows += [unusable_finding(a.error, path=a.adapter) for a in self.adapters if a.error]
        passed = self.ok and not any(a.error for a in self.adapters)
        env = envelope(self.exit_code == 0, rows, self.body())
        return {"ok": env["ok"], "passed": passed, **env}  # ``ok`` keeps its first place
