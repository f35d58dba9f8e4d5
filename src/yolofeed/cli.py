"""The ``yolofeed`` command: parse Ultralytics-style ``key=value`` arguments and dispatch.

Nothing here does work; each command lives in its stage's module and is imported only when run,
so ``yolofeed help`` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import logging
import shlex
import sys
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path

from yolofeed import __version__, processes
from yolofeed.config import (
    PACK_FORMATS,
    BenchConfig,
    DoctorConfig,
    PackConfig,
    ParityConfig,
    SynthConfig,
    TrainConfig,
    fields_of,
)
from yolofeed.errors import ConfigError, DatasetError, YolofeedError, caller_says_stops, stop_line


@dataclass(frozen=True)
class Command:
    target: str  # "module:function", called with the config instance
    config: type
    summary: str
    example: str


COMMANDS: dict[str, Command] = {
    "synth": Command("yolofeed.synth:run", SynthConfig, "write a synthetic COCO-like YOLO dataset",
                     "yolofeed synth out=datasets/synth n_train=10000 n_val=1000"),
    "pack": Command("yolofeed.pack.command:run", PackConfig, "pack a YOLO dataset into one memory-mappable store",
                    "yolofeed pack data=datasets/synth/data.yaml imgsz=640"),
    "train": Command("yolofeed.train.run:run", TrainConfig,
                     "Ultralytics training fed from the GPU (any yolo train key)",
                     "yolofeed train model=yolo11n.yaml data=datasets/synth/data.yaml epochs=100 batch=128"),
    "doctor": Command("yolofeed.doctor.run:run", DoctorConfig,
                      "profile a training setup: where the time goes, what to change",
                      "yolofeed doctor model=yolo11n.yaml data=datasets/synth/data.yaml batch=64 workers=8"),
    "bench": Command("yolofeed.bench.run:run", BenchConfig, "stock vs yolofeed vs GPU-resident ceiling, side by side",
                     "yolofeed bench model=yolo11n.yaml data=datasets/synth/data.yaml batch=128 imgsz=640"),
    "parity": Command("yolofeed.bench.parity:run", ParityConfig, "stock vs yolofeed model quality over several seeds",
                      "yolofeed parity model=yolo11n.yaml data=datasets/synth/data.yaml epochs=40 seeds=4 device=0,1"),
}


def smart_value(text: str) -> typing.Any:
    """Ultralytics' reading of a free ``key=value`` (``ultralytics.cfg.smart_value``): None, bools, Python
    literals (numbers, lists such as ``[0,1]``), else the string."""
    from yolofeed.ultralytics_seam import smart_value as ultralytics_smart_value

    return ultralytics_smart_value(text)


def parse_value(text: str, annotation: str) -> typing.Any:
    """Turn ``text`` into the field's type, the way Ultralytics reads ``key=value``."""
    low = text.lower()
    if low in ("none", "null", ""):
        if "None" in annotation:
            return None
        raise ValueError("this key needs a value")
    base = annotation.replace("| None", "").strip()
    if base == "bool":
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError("expected True, False or None (the default)" if "None" in annotation
                         else "expected True or False")
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
    except ValueError:
        raise ValueError("expected a whole number" if base == "int" else "expected a number") from None
    return text


BARE_TRUE = ("resume",)  # own keys that a bare word sets, besides bool keys: 'yolofeed train model=last.pt resume'


def _passthrough_value(name: str, text: str) -> typing.Any:
    """A value for Ultralytics, read as ``ultralytics.cfg.parse_key_value_pair`` reads it (name and project verbatim).

    Raises:
        ConfigError: an empty value.
    """
    from yolofeed.ultralytics_seam import DEFAULT_CFG_DICT, parse_key_value_pair

    if not text.strip():
        example = f", e.g. {name}={DEFAULT_CFG_DICT[name]}" if DEFAULT_CFG_DICT.get(name) is not None else ""
        raise ConfigError(f"{name}= needs a value{example}")
    return parse_key_value_pair(f"{name}={text}")[1]


def _bare_word(name: str, fields: dict, passthrough: str | None) -> str | bool | None:
    """What a word without '=' means, as in Ultralytics' CLI: True for a bool key (and 'resume'), else None."""
    if name in fields:
        return "True" if str(fields[name].type) in ("bool", "bool | None") or name in BARE_TRUE else None
    if passthrough:
        from yolofeed.ultralytics_seam import DEFAULT_CFG_DICT

        if isinstance(DEFAULT_CFG_DICT.get(name), bool) or name in ("half", "int8", "end2end", "nms"):
            return True
    return None


def choices_of(f: typing.Any) -> tuple[str, ...] | None:
    """The values a config field allows: its ``choices``, the pack codecs' names for ``PACK_FORMATS``, or None."""
    choices = f.metadata.get("choices")
    if choices == PACK_FORMATS:
        from yolofeed.pack.codecs import choices as pack_choices

        return pack_choices()
    return choices


def _merged(args: list[str], example: str) -> list[str]:
    """The words as Ultralytics' CLI reads them (``seam.merge_equals_args``) where one is split: around a lone ``=``
    (``epochs = 1``), or a list cut at its spaces (``imgsz=[3,`` ``640]``). A word that only holds a bracket
    (``data=set[old/data.yaml``, a legal folder name) is left as it is.

    Raises:
        ConfigError: a list's bracket is never closed.
    """
    split_at_equals = any(word.startswith("=") or word.endswith("=") for word in args)
    open_list = any(("=[" in word or word.startswith("[")) and word.count("[") > word.count("]") for word in args)
    if not (split_at_equals or open_list):
        return args
    from yolofeed.ultralytics_seam import merge_equals_args

    try:
        return merge_equals_args(list(args))
    except SyntaxError as e:  # a bracket never closed: the words after it would be fused into it
        raise ConfigError(f"{str(e.msg or e).rstrip('.')}: close the list (imgsz=[640,480]). Example: "
                          f"{example}") from None


def build_config(command: str, args: list[str]) -> typing.Any:
    """Parse ``key=value`` words into the command's config dataclass.

    Keys the command does not own go to Ultralytics (``passthrough``): read with Ultralytics' own parser and
    checked against its keys and types here, so a typo is one line. A bare word sets a bool key to True. A key typed
    twice takes its last value, unchecked before it, as Ultralytics' CLI does; words around a lone ``=`` and a list
    split at its spaces are one word, as there (``seam.merge_equals_args``).

    Raises:
        ConfigError: an argument is not ``key=value``, the key is unknown, the value has the wrong
            type, range or is not one of the allowed choices, or a required key is missing.
    """
    spec = COMMANDS[command]
    args = _merged(args, spec.example)
    fields = {f.name: f for f in fields_of(spec.config) if not f.metadata.get("passthrough")}
    passthrough = next((f.name for f in fields_of(spec.config) if f.metadata.get("passthrough")), None)
    values: dict[str, typing.Any] = {}
    extra: dict[str, typing.Any] = {}
    names = [word.partition("=")[0].strip().lstrip("-").replace("-", "_") for word in args]
    for k, word in enumerate(args):
        name, eq, text = names[k], *word.partition("=")[1:]
        if name in names[k + 1:]:  # a key typed twice: the last one counts, as in Ultralytics' CLI
            continue
        if not eq:
            bare = _bare_word(name, fields, passthrough)
            if bare is None:
                raise ConfigError(f"'{word}' is not key=value. Example: {spec.example}")
            if name not in fields:
                extra[name] = bare
                continue
            text = bare
        if name not in fields and passthrough:
            extra[name] = _passthrough_value(name, text)
            continue
        if name not in fields:
            near = difflib.get_close_matches(name, fields, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            raise ConfigError(f"'{name}' is not a key of 'yolofeed {command}'.{hint} "
                              f"Valid keys: {', '.join(fields)}.")
        f = fields[name]
        try:
            value = parse_value(text.strip(), str(f.type))
        except ValueError as e:
            raise ConfigError(f"{name}={text}: {e}") from None
        choices = choices_of(f)
        if choices and value not in choices:
            raise ConfigError(f"{name}={text}: expected one of {', '.join(choices)}")
        minimum = f.metadata.get("minimum")
        if minimum is not None and value is not None and value < minimum:
            raise ConfigError(f"{name}={text}: expected at least {minimum} (default {f.default})")
        values[name] = value
    for f in fields.values():
        if f.default is None and f.name not in values and "None" not in str(f.type) and f.default_factory is MISSING:
            raise ConfigError(f"'yolofeed {command}' needs {f.name}=... Example: {spec.example}")
    if any(f.metadata.get("internal") for f in dataclasses.fields(spec.config)):
        values["given"] = frozenset(values)  # config.typed: the keys typed, whatever their value
    if passthrough:
        if extra:  # Ultralytics' keys and types, checked as its get_cfg would (which prints its help and raises)
            from yolofeed.train.keys import check_overrides

            check_overrides(extra, own=fields, command=f"yolofeed {command}")
        values[passthrough] = extra
    return spec.config(**values)


def check_paths(config: typing.Any) -> None:
    """The files and folders a command names, checked before any work starts.

    Raises:
        DatasetError: ``data=`` names no file.
        ConfigError: a folder key (``pack_dir=``, pack's ``out=``) names an existing file.
    """
    data = getattr(config, "data", None)
    if isinstance(data, str) and data.strip().startswith("[") and data.strip().endswith("]"):
        from yolofeed.pack.source import DATA_LIST

        raise ConfigError(f"data={data}: {DATA_LIST}")
    if isinstance(data, str) and Path(data).expanduser().is_dir():
        inside = sorted(p.name for p in Path(data).expanduser().glob("*.y*ml"))
        hint = f": pass the data yaml inside it, e.g. {shlex.quote(f'data={Path(data) / inside[0]}')}" if inside else (
            " with no data yaml in it: pass data=path/to/data.yaml")
        raise DatasetError(f"data={data} is a folder{hint}")
    if isinstance(data, str):
        from yolofeed.pack.source import check_downloaded
        from yolofeed.ultralytics_seam import find_dataset_yaml

        if find_dataset_yaml(Path(data).expanduser()) is None:  # a file, or a yaml Ultralytics ships (coco8.yaml)
            raise DatasetError(f"data={data}: file not found, nor a dataset yaml Ultralytics ships (such as "
                               "coco8.yaml). Pass data=path/to/data.yaml ('yolofeed synth' makes one to try)")
        check_downloaded(data)  # before a stock trainer (doctor, bench, parity) would download it
    folders = ["pack_dir"] + (["out"] if isinstance(config, PackConfig) else [])
    for name in folders:
        folder = getattr(config, name, None)
        if folder and Path(folder).expanduser().exists() and not Path(folder).expanduser().is_dir():
            raise ConfigError(f"{name}={folder} is a file; {name}= names the folder packs go to (made if missing)")


def help_text(command: str | None = None) -> str:
    """Every command and key, or one command's keys."""
    lines = [f"yolofeed {__version__}: keep the GPU busy while training YOLO with Ultralytics", "",
             "Usage: yolofeed COMMAND key=value ...", ""]
    names = [command] if command else list(COMMANDS)
    for name in names:
        spec = COMMANDS[name]
        lines.append(f"  {name:<6} {spec.summary}   e.g. {spec.example}")
        for f in fields_of(spec.config):
            if f.metadata.get("passthrough"):
                lines.append(f"      {'...':<10} {f.metadata['help']}")
                continue
            default = "required" if f.default is None and "None" not in str(f.type) else f"default {f.default!r}"
            choices = choices_of(f)
            extra = f" [{'|'.join(choices)}]" if choices else ""
            what = f.metadata["help"]
            if f.metadata.get("choices") == PACK_FORMATS:  # each format's line, from the codec registry
                from yolofeed.pack import codecs

                what += (f": {codecs.AUTO}: {codecs.DEFAULT} where the packs fit in half the memory, else "
                         f"{codecs.COMPACT}; " + "; ".join(f"{n}: {line}" for n, line in codecs.summaries().items()))
            lines.append(f"      {f.name + '=':<13} {what}{extra} ({default})")
        lines.append("")
    lines.append("  help     this text; 'yolofeed COMMAND help' shows one command")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the ``yolofeed`` command line; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not argv or argv[0] in ("help", "-h", "--help"):
        print(help_text())
        return 0
    if argv[0] in ("version", "--version"):
        print(__version__)
        return 0
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        near = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        print(f"yolofeed: unknown command '{command}'.{hint} Run 'yolofeed help'.", file=sys.stderr)
        return 2
    if any(a in ("help", "-h", "--help") for a in args):
        print(help_text(command))
        return 0
    code = 0
    try:
        config = build_config(command, args)
        check_paths(config)
        module, func = COMMANDS[command].target.split(":")
        # yolofeed train's stop line (what stopped it, the command that resumes it) is its error line; another
        # command's training (bench isolate=False) says its own, whose resume is not that command's
        with caller_says_stops() if command == "train" else contextlib.nullcontext():
            getattr(importlib.import_module(module), func)(config)
    except YolofeedError as e:
        print(f"yolofeed {command}: error: {_stop_line(command, e) or e}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt as e:  # a command may say what was kept and how to go on, in the exception's words
        said = _say_stop_line(command, e)  # which then said it already
        print(f"yolofeed {command}: interrupted" + (f"; {e}" if str(e) and not said else ""), file=sys.stderr)
        code = 130
    except processes.Terminated as e:  # SIGTERM where the command stops as Ctrl-C does (sigterm_exits): exit 143
        said = _say_stop_line(command, e)
        print(f"yolofeed {command}: {(not said and e.said) or 'stopped by SIGTERM'}", file=sys.stderr)
        code = e.code
    return code


def _stop_line(command: str, e: BaseException) -> str | None:
    """The stop line a training kept on ``e`` (``errors.stop_line``: the cause, and the checkpoint that resumes), for
    yolofeed train only: another command's training (bench's, the doctor's) names no resume of that command's."""
    return stop_line(e) if command == "train" else None


def _say_stop_line(command: str, e: BaseException) -> bool:
    """A Ctrl-C or SIGTERM that came while a training stopped by an error cleaned up replaced that error: its stop line
    (``_stop_line``), said first; whether there was one."""
    line = _stop_line(command, e)
    if line:
        print(f"yolofeed {command}: error: {line}", file=sys.stderr)
    return bool(line)


def entry() -> int:
    """The ``yolofeed`` console script (also ``python -m yolofeed``): ``main`` as the whole process, which ends at once
    where the command's teardown gave up on a thread (``processes.own_process``)."""
    return processes.own_process(main)
