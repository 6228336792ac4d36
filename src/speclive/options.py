"""One declaration per command-line option: an options dataclass field carries its flag.

A benchmark's options are a dataclass whose fields are declared with ``option(default, flag,
help=...)``. ``OptionSet(cls)`` derives everything else from those declarations:

- ``add_to(parser)``: the argparse arguments (flag, type, default, choices, help);
- ``build(args)``: the options object from the parsed arguments;
- ``preset(**values)``: an options object without a parser (a preset command's settings);
- ``command(words, opts)``: the canonical command line that reproduces a run of ``opts``,
  written into the result's header.

Conventions: a bool field is a switch; its flag turns it on, or off when the flag starts with
``--no-`` (or is declared ``off=True``). A field with a list or tuple default (or ``many=True``)
takes comma-separated values; ``repeat=True`` also lets the flag be given several times.
``always`` options are written into the reproducing command even at their default (the ones that
define a result: model, prompts, lengths, methods); the others only when they differ from it;
options that cannot change a result (output folder, plots, progress) never are.

The options many commands share are declared once in ``speclive.common_options``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


def csv(text: str) -> list[str]:
    """Comma-separated words (blank items dropped)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_margin(text: str) -> float | None:
    """An audio margin option's value: seconds >= 0, or 'none' (no margin: the full window)."""
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'none', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an audio margin must be >= 0 seconds, got {text}")
    return value


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one options field appears on the command line."""

    flag: str
    help: str | None = None
    #: text -> value (for a list option: of one item); None: the text itself
    parse: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    #: a list option: comma-separated values
    many: bool = False
    #: written into the reproducing command even at its default
    always: bool = False
    #: False: the option cannot change a result (never written into the reproducing command)
    result: bool = True
    #: command-line value -> field value, and back (a flag whose value the field stores in
    #: another shape; ``to_flag`` also gets None when that is the field's value or default)
    to_field: Callable[[Any], Any] | None = None
    to_flag: Callable[[Any], Any] | None = None
    #: a switch whose flag turns the field off (implied by a ``--no-`` flag)
    off: bool = False
    #: a list option whose flag may be given several times (the values add up)
    repeat: bool = False
    metavar: str | None = None

    @property
    def turns_off(self) -> bool:
        return self.off or self.flag.startswith("--no-")


def add_stream_draft_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-stream-draft``: streaming transcription passes decode from scratch (the baseline)."""
    parser.add_argument(
        "--no-stream-draft",
        dest="stream_draft",
        action="store_false",
        help="decode every streaming transcription pass from scratch instead of drafting it with "
        "the previous passes' hypotheses (the baseline; the transcripts are the same)",
    )
    parser.add_argument(
        "--stream-partials",
        choices=("target", "draft"),
        default="target",
        help="the model of the streaming partial passes: the Whisper target, or the draft "
        "(tiny.en: less CPU per pass, rougher partials; the final pass stays on the target)",
    )


def option(
    default: Any,
    flag: str,
    *,
    help: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Sequence[Any] | None = None,
    many: bool | None = None,
    always: bool = False,
    result: bool = True,
    to_field: Callable[[Any], Any] | None = None,
    to_flag: Callable[[Any], Any] | None = None,
    off: bool = False,
    repeat: bool = False,
    metavar: str | None = None,
) -> Any:
    """A dataclass field with its command-line flag (see the module doc)."""
    if many is None:
        many = repeat or isinstance(default, list | tuple)
    spec = Flag(flag, help, parse, choices, many, always, result, to_field, to_flag, off, repeat, metavar)
    meta = {"cli": spec}
    if isinstance(default, list | dict | set):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _many(parse: Callable[[str], Any] | None, flag: str) -> Callable[[str], list[Any]]:
    def read(text: str) -> list[Any]:
        try:
            return [parse(x) if parse else x for x in csv(text)]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag}: cannot read {text!r}: {e}") from e

    return read


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    return str(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) == list(b)
    return a == b


class OptionSet:
    """The command-line view of an options dataclass (or of some of its fields).

    ``only``: the fields this command offers (default: every declared one, minus ``skip``);
    ``defaults``: defaults of this command that differ from the dataclass's.
    """

    def __init__(
        self,
        cls: type,
        *,
        only: Iterable[str] | None = None,
        skip: Iterable[str] = (),
        defaults: Mapping[str, Any] | None = None,
    ):
        declared = {f.name: f for f in dataclasses.fields(cls) if "cli" in f.metadata}
        names = list(only) if only is not None else [n for n in declared if n not in set(skip)]
        unknown = [n for n in [*names, *(defaults or {})] if n not in declared]
        if unknown:
            raise TypeError(f"{cls.__name__} declares no option {unknown}")
        self.cls = cls
        self.fields = [declared[n] for n in names]
        self.defaults = dict(defaults or {})

    def default(self, f: dataclasses.Field) -> Any:
        """The field's default for this command."""
        if f.name in self.defaults:
            return self.defaults[f.name]
        if f.default is not dataclasses.MISSING:
            return f.default
        return f.default_factory()  # type: ignore[misc]

    @staticmethod
    def spec(f: dataclasses.Field) -> Flag:
        return f.metadata["cli"]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Declare every option on ``parser`` (destination: the field's name)."""
        for f in self.fields:
            s, default = self.spec(f), self.default(f)
            if isinstance(default, bool):
                if s.turns_off != default:
                    raise TypeError(
                        f"{s.flag}: a --no- (or off=True) switch needs default True, another False"
                    )
                action = "store_false" if s.turns_off else "store_true"
                parser.add_argument(s.flag, dest=f.name, action=action, default=default, help=s.help)
                continue
            shown = s.to_flag(default) if s.to_flag and default is not None else default
            kind = _many(s.parse, s.flag) if s.many else s.parse
            if s.many and shown is not None:
                shown = list(shown)
            metavar = s.metavar or (None if s.choices else s.flag.lstrip("-").replace("-", "_").upper())
            text = s.help
            if text is not None and shown not in (None, [], ""):
                text = f"{text} (default: {_text(shown)})"
            if s.repeat:  # appended lists are joined in build(); None: the flag was not given
                parser.add_argument(
                    s.flag, dest=f.name, type=kind, action="append", metavar=metavar, help=text
                )
                continue
            parser.add_argument(
                s.flag, dest=f.name, type=kind, default=shown, choices=s.choices, metavar=metavar, help=text
            )

    def _field_value(self, f: dataclasses.Field, parsed: Any) -> Any:
        s, default = self.spec(f), self.default(f)
        if isinstance(default, bool):
            return bool(parsed)
        if s.repeat:
            if parsed is None:
                return default
            joined = [v for values in parsed for v in values]
            return type(default)(joined) if isinstance(default, tuple | list) else joined
        if s.to_field and parsed is not None:
            return s.to_field(parsed)
        return parsed

    def build(self, args: argparse.Namespace, **extra: Any) -> Any:
        """The options object of parsed ``args`` (``extra``: fields no flag sets)."""
        values = {f.name: self._field_value(f, getattr(args, f.name)) for f in self.fields}
        return self.cls(**values, **extra)

    def preset(self, **values: Any) -> Any:
        """The options object of this command's defaults, with ``values`` (field names) set."""
        unset = {f.name: self.default(f) for f in self.fields if f.name not in values}
        return self.cls(**unset, **values)

    def command(self, words: Sequence[str], opts: Any) -> str:
        """The quoted command line that reproduces a run of ``opts``: ``words`` (the program
        and its sub-commands), then every option that defines the result."""
        return " ".join(shlex.quote(p) for p in self.argv(words, opts))

    def argv(self, words: Sequence[str], opts: Any) -> list[str]:
        """``command`` as an argument list (to start the command as a subprocess)."""
        parts = list(words)
        for f in self.fields:
            s, default = self.spec(f), self.default(f)
            value = getattr(opts, f.name)
            if not s.result:
                continue
            if isinstance(default, bool):
                if bool(value) != default:
                    parts.append(s.flag)
                continue
            if s.to_flag:  # compared and written in the flag's shape (it may spell None)
                value, default = s.to_flag(value), s.to_flag(default)
            if value is not None and (s.always or not _same(value, default)):
                parts += [s.flag, _text(value)]
        return parts
