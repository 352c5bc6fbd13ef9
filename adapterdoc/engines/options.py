"""The ``verify`` options that serving profiles read (``--max-lora-rank``, ``--lora-target-modules``,
``--served-as``), each declared once here, in :data:`OPTIONS`: the command line (its flags, types and help), the
``[tool.adapterdoc]`` keys and their checks, and the values of
:class:`~adapterdoc.verify.options.VerifyOptions` are built from these declarations, so that verify names no engine
option.

A profile names the options it reads (:attr:`~adapterdoc.engines.base.Profile.options`), reads their values with
:meth:`EngineOption.of`, checks them (:meth:`~adapterdoc.engines.base.Profile.check_options`), may give one another
default when it runs (:attr:`~adapterdoc.engines.base.Profile.option_defaults`) and adds its clause to an option's
help (:attr:`~adapterdoc.engines.base.Profile.option_help`). A new option is one more entry in :data:`OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from adapterdoc.engines import served

if TYPE_CHECKING:
    from adapterdoc.engines.base import Profile, ProfileOptions

T = TypeVar("T")

KINDS = ("rank", "choice", "names")
"""``rank``: a positive integer; ``choice``: one of the option's choices; ``names``: module names (the flag repeated
or a comma or space list; the table takes a list or a string)."""


@dataclass(frozen=True)
class EngineOption(Generic[T]):
    """One engine option: its name (the value's key in a run's options; the flag ``--max-lora-rank`` and the
    table key ``max-lora-rank`` are spelled from it), its help, its kind and its default."""

    name: str
    help: str
    """The help text; where profiles add their clause (:attr:`Profile.option_help`), its opening:
    ``OPENING: CLAUSE; CLAUSE.``"""
    kind: str
    """One of :data:`KINDS`."""
    default: T
    """The value when neither the command line nor the table gives one (the running profile may have its own)."""
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key

    @property
    def key(self) -> str:
        """The ``[tool.adapterdoc]`` key (underscores are accepted there too)."""
        return self.name.replace("_", "-")

    def of(self, options: ProfileOptions) -> T:
        """Its value in a run's options."""
        return cast(T, options.engine_options[self.name])

    def must_be(self) -> str:
        """What a value must be, for the messages (``a positive integer``, ``text or vl``)."""
        if self.kind == "rank":
            return "a positive integer"
        if self.kind == "choice":
            return ", ".join(self.choices[:-1]) + " or " + self.choices[-1]
        return "a list of names or a string"

    def checked(self, value: object) -> object:
        """A given value as a run holds it (names as a tuple); ``ValueError`` (``max_lora_rank must be a positive
        integer, got 0``) for one of the wrong kind. ``None``: not given."""
        if value is None:
            return None
        if self.kind == "names":
            return tuple(cast(Iterable[str], value))
        ok = value in self.choices if self.kind == "choice" else _positive_int(value)
        if not ok:
            raise ValueError(f"{self.name} must be {self.must_be()}, got {value!r}")
        return value

    def from_command_line(self, value: object) -> object:
        """The command line's value (``None`` when the flag was not given; names: the repeated flag's values,
        each a comma or space list, as one tuple)."""
        if self.kind == "names":
            return split_names(list(cast(Iterable[str], value))) if value else None
        return value

    def from_table(self, value: object) -> object:
        """A ``[tool.adapterdoc]`` value as the option holds it; ``ValueError`` (``must be a positive integer``)
        for one of the wrong kind."""
        if self.kind == "names":
            if isinstance(value, str) or (isinstance(value, list) and all(isinstance(m, str) for m in value)):
                return split_names(value)
        elif value in self.choices if self.kind == "choice" else _positive_int(value):
            return value
        raise ValueError(f"must be {self.must_be()}")

    def help_text(self, profiles: Iterable[Profile]) -> str:
        """Its ``--help``: :attr:`help`, then each profile's clause (``OPENING: CLAUSE; CLAUSE.``)."""
        clauses = [p.option_help[self.name] for p in profiles if self.name in p.option_help]
        return f"{self.help}: {'; '.join(clauses)}." if clauses else self.help


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def split_names(values: str | Iterable[object] | None) -> tuple[str, ...] | None:
    """Names given as one string or several (each space- or comma-separated) as one tuple; ``None`` if none."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out = tuple(p for v in values for p in str(v).replace(",", " ").split())
    return out or None


MAX_LORA_RANK: EngineOption[int | None] = EngineOption(
    "max_lora_rank", "The server's --max-lora-rank", "rank", default=16, metavar="N"
)
"""Read by vLLM and SGLang (each adds its rule to the help); 16 is vLLM's default."""
LORA_TARGET_MODULES: EngineOption[tuple[str, ...] | None] = EngineOption(
    "lora_target_modules",
    "The SGLang server's --lora-target-modules (repeat it or give a comma list; `all`). Default: inferred from the "
    "adapter, as SGLang does for a startup adapter.",
    "names",
    default=None,
    metavar="MODULES",
)
SERVED_AS: EngineOption[str | None] = EngineOption(
    "served_as",
    "How vLLM serves the base (default: inferred).",
    "choice",
    default=None,
    choices=served.SERVED_AS,
)
"""``text`` or ``vl``; ``None`` infers it from the base."""

OPTIONS: tuple[EngineOption[Any], ...] = (MAX_LORA_RANK, LORA_TARGET_MODULES, SERVED_AS)
"""Every engine option, in the order ``verify --help`` lists them."""
