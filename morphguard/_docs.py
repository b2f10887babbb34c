"""The generated pages of the documentation site: the configuration and CLI references.

Both are rendered from the code each time the site is built (`docs/hooks.py`), so they cannot drift from it.
A configuration key's description is taken from the first of: its pydantic `Field(description=...)`, the comment
beside it in the documented `config.yaml`, the comment beside or above it in its settings class.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import re
import tokenize
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

Path_ = tuple[str, ...]
ANY = "*"  # a path part that stands for any key of a mapping (a profile's or topic's name)


# --- comments of config.yaml -------------------------------------------------------------------------------------

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w-]*):(?:\s|$)(?P<rest>.*)$")


def _split_comment(rest: str) -> tuple[str, str]:
    """(value, comment) of what follows `key:`; a # inside quotes is part of the value."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].strip(), rest[i + 1:].strip()
    return rest.strip(), ""


def yaml_comments(text: str) -> tuple[dict[Path_, str], dict[str, str]]:
    """Comments of a documented YAML file: by key path, the comment beside the key with its indented continuation
    lines and the comment lines just above it; and by top-level section, the comment block above the section."""
    by_key: dict[Path_, list[str]] = {}
    sections: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []  # comment lines waiting for the next key
    last: tuple[Path_, int] | None = None  # the last key with a comment beside it, and that comment's column
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending, last = [], None
            continue
        if stripped.startswith("#"):
            column = len(line) - len(line.lstrip())
            words = stripped.lstrip("#").strip()
            if last is not None and column >= last[1] - 2:  # aligned under the comment beside a key: its next line
                by_key[last[0]][-1] += " " + words
            else:
                pending.append(words)
                last = None
            continue
        match = _KEY.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path = tuple(key for _, key in stack)
        _, comment = _split_comment(match["rest"])
        if len(path) == 1 and pending:
            sections[path[0]] = sentences_of([" ".join(" ".join(pending).split())])
            pending = []
        by_key[path] = [*([" ".join(pending)] if pending else []), *([comment] if comment else [])]
        pending = []
        last = (path, line.index("#", len(line) - len(match["rest"]))) if comment else None
    return {path: sentences_of(words) for path, words in by_key.items() if words}, sections


def sentences_of(parts: list[str]) -> str:
    """Comment fragments as sentences: each begun with a capital and ended with a full stop."""
    out = []
    for part in (p.strip() for p in parts):
        if part:
            first = part.split(maxsplit=1)[0]
            if len(first) > 1 and first.isalpha() and first.islower():
                part = part[0].upper() + part[1:]
            out.append(part if part[-1] in ".!?:)" or part.endswith("`") else part + ".")
    return " ".join(out)


def _lookup(comments: dict[Path_, str], path: Path_) -> str:
    if ANY not in path:
        return comments.get(path, "")
    for key, comment in comments.items():
        if len(key) == len(path) and all(p in (k, ANY) for k, p in zip(key, path, strict=True)):
            return comment
    return ""


# --- comments of the settings classes ----------------------------------------------------------------------------

def class_comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in the class source: the comment lines just above it, then the one beside it."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    beside: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            beside[token.start[0]] = token.string.lstrip("#").strip()
    body = re.compile(r"^    (?P<name>[a-z_][a-z0-9_]*)\s*:")
    found: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        match = body.match(line)
        if match is None or match["name"] not in model.model_fields:
            continue
        above: list[str] = []
        previous = number - 1
        while previous >= 1 and lines[previous - 1].strip().startswith("#"):
            above.insert(0, beside.get(previous, ""))
            previous -= 1
        words = [" ".join(above), beside.get(number, "")]
        found[match["name"]] = sentences_of(words)
    return found


# --- types and defaults ------------------------------------------------------------------------------------------

def type_name(annotation: Any) -> str:
    """A reader's name for a field's type, without `|` (it would split a table cell)."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        names = [json.dumps(a) for a in args]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    if origin in (Union, types.UnionType):
        kinds = [type_name(a) for a in args if a is not type(None)]
        kinds += ["null"] if type(None) in args else []
        return " or ".join(kinds)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if origin is tuple:
        return "list of " + ", ".join(type_name(a) for a in args if a is not Ellipsis)
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        if issubclass(annotation, SecretStr):
            return "secret string"
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation)


def default_of(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return None if field.default is PydanticUndefined else field.default


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, SecretStr):
        return "********"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def render_default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = default_of(field)
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
        return "`" + "`, `".join(value) + "` (below)"
    text = json.dumps(_plain(value), ensure_ascii=False)
    if len(text) > 80:
        text = text[:77] + "..."
    return "`" + text + "`"


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The settings model a field holds, and whether it holds it per name (a map of sections)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin in (Union, types.UnionType):
        for arg in args:
            model, named = _model_of(arg)
            if model is not None:
                return model, named
    if origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], True
    if origin is list and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], True
    return None, False


# --- the configuration reference ---------------------------------------------------------------------------------

class Row(BaseModel):
    key: str
    type: str
    default: str
    description: str


def rows(model: type[BaseModel], prefix: Path_, comments: dict[Path_, str],
         seen: dict[tuple[type[BaseModel], str], str] | None = None) -> Iterator[Row]:
    """One row per field of `model` and of the sections below it, depth first. A field of a settings class used in
    two places (`proxy.upstream`, `proxy.anthropic`) takes the description of the first where it has none."""
    seen = {} if seen is None else seen
    in_class = class_comments(model)
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        sub, named = _model_of(field.annotation)
        description = (field.description or _lookup(comments, path) or seen.get((model, name))
                       or in_class.get(name, ""))
        seen.setdefault((model, name), description)
        if sub is not None and not description:
            description = inspect.cleandoc(sub.__doc__ or "")
        yield Row(key=".".join(path), type=type_name(field.annotation), default=render_default(field),
                  description=" ".join(description.split()))
        if sub is not None:
            yield from rows(sub, (*path, ANY) if named else path, comments, seen)


def sections(config_yaml: Path) -> list[tuple[str, type[BaseModel], str]]:
    """(name, model, intro) of each top-level section, in the order config.yaml documents them."""
    import morphguard  # noqa: F401  (registers every detector's section)
    from morphguard.config import DETECTOR_SECTIONS, Config

    _, intros = yaml_comments(config_yaml.read_text(encoding="utf-8"))
    models: dict[str, type[BaseModel]] = {}
    for name, field in Config.model_fields.items():
        model, _ = _model_of(field.annotation)
        if model is not None:
            models[name] = model
    models.update(DETECTOR_SECTIONS)
    seen: list[str] = []
    for name in [*_top_level_keys(config_yaml), *models]:
        if name in models and name not in seen:
            seen.append(name)
    return [(name, models[name], intros.get(name, inspect.cleandoc(models[name].__doc__ or ""))) for name in seen]


def _top_level_keys(config_yaml: Path) -> list[str]:
    return [m["key"] for line in config_yaml.read_text(encoding="utf-8").splitlines()
            if (m := _KEY.match(line)) and not m["indent"]]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_reference(config_yaml: Path) -> str:
    comments, _ = yaml_comments(config_yaml.read_text(encoding="utf-8"))
    out = [
        "# Configuration reference",
        "",
        "Every key morphguard reads from its YAML file, with its type, default and meaning. This page is generated "
        "from the configuration models (`morphguard/config.py` and each detector's settings) and the comments of "
        "the documented `config.yaml` each time the site is built.",
        "",
        "- A file is read with `--config FILE`, else `./config.yaml` when there is one, else the built-in defaults "
        "(which the shipped `config.yaml` writes out in full).",
        "- Unknown keys are errors that name the key and its line; every value is validated at start.",
        "- Any string may use `${ENV_VAR}` or `${ENV_VAR:-fallback}`.",
        "- `secret string` values are never logged, traced or sent to a webhook.",
        "- `*` in a key stands for a name you choose (a profile, a topic).",
        "",
    ]
    for name, model, intro in sections(config_yaml):
        out += [f"## `{name}`", ""]
        if intro:
            out += [intro, ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        for row in rows(model, (name,), comments):
            out.append(f"| `{row.key}` | {_cell(row.type)} | {_cell(row.default)} | {_cell(row.description)} |")
        out.append("")
    return "\n".join(out)


# --- the CLI reference -------------------------------------------------------------------------------------------

def _commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name, ""), sub
                yield from _commands(sub, f"{prefix} {name}")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or action.dest.upper()
                name += f" `{metavar}`"
        else:
            name = f"`{action.metavar or action.dest}`"
        if action.choices and not isinstance(action.choices, dict):
            name += " (" + ", ".join(f"`{c}`" for c in action.choices) + ")"
        default = "" if action.default in (None, False, argparse.SUPPRESS) or action.required else (
            f"`{action.default}`")
        required = "yes" if action.required else ""
        out.append(f"| {_cell(name)} | {required} | {_cell(default)} | {_cell(action.help or '')} |")
    return out


def cli_reference() -> str:
    from morphguard.cli import _parser

    parser = _parser()
    out = [
        "# CLI reference",
        "",
        "The `morphguard` command and each of its subcommands, with every option as `--help` gives it. This page is "
        "generated from the argument parser in `morphguard/cli.py` each time the site is built.",
        "",
        "Exit codes: 0 success (for `check`: not flagged), 1 flagged (`check`), 2 an error (a bad config, an "
        "unreachable judge, unreadable input).",
        "",
        "## `morphguard`",
        "",
        parser.description or "",
        "",
        "| option | required | default | help |",
        "|---|---|---|---|",
        *_option_rows(parser),
        "",
    ]
    for name, help_text, sub in _commands(parser, "morphguard"):
        # what `morphguard COMMAND --help` opens with; the one-line help of the command list when there is none
        about = sub.description or help_text[:1].upper() + help_text[1:] + "."
        if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            out += [f"## `{name}`", "", about, ""]
            continue
        usage = " ".join(sub.format_usage().split())
        out += [f"## `{name}`", "", about, "", "```", usage, "```", "",
                "| option | required | default | help |", "|---|---|---|---|", *_option_rows(sub), ""]
    return "\n".join(out)
